// The command line: --check, --help, configuration errors before any connection.
#include <catch2/catch.hpp>

#include <csignal>
#include <string>
#include <vector>

#include "test_util.hpp"

using namespace it;

namespace {

struct CliResult {
  int exit_code = -1;
  std::string output;
};

// Runs walrelay with arguments ("CONFIG" stands for the configuration file's
// path) and waits for it: --check and configuration errors must not hang.
CliResult run_cli(std::vector<std::string> args, const std::string& config) {
  Walrelay w(config);
  for (auto& a : args)
    if (a == "CONFIG") a = w.config_path();
  CliResult r;
  r.exit_code = w.run(args, 60s);
  if (r.exit_code < 0) FAIL("walrelay did not exit");
  r.output = w.this_run_log();
  return r;
}

}  // namespace

TEST_CASE("cli: --help and --version", "[cli]") {
  auto help = run_cli({"--help"}, "");
  CHECK(help.exit_code == 0);
  CHECK(help.output.find("--check") != std::string::npos);
  auto version = run_cli({"--version"}, "");
  CHECK(version.exit_code == 0);
  CHECK(version.output.find("walrelay ") != std::string::npos);
}

TEST_CASE("cli: configuration errors exit 2 naming the key, before any connection", "[cli]") {
  // The database port is closed: a connection attempt would take the
  // connect timeout and say so; a configuration error must not get there.
  std::string base = "database.hostname=127.0.0.1\ndatabase.port=1\nkafka.bootstrap.servers=127.0.0.1:1\n";
  struct Case { std::string text, key; };
  std::vector<Case> cases = {
      {"slot.name=Not-Valid\n", "slot.name"},
      {"no.such.key=1\n", "no.such.key"},
      {"max.inflight.records=-5\n", "max.inflight.records"},
      {"errors.tolerance=all\n", "errors.deadletterqueue.topic.name"},
      {"kafka.acks=0\n", "kafka.acks"},
      {"kafka.no.such.librdkafka.property=1\n", "kafka.no.such.librdkafka.property"},
      {"database.port=5432\ndatabase.port=5433\n", "database.port"},
  };
  for (auto& c : cases) {
    INFO(c.text);
    auto start = std::chrono::steady_clock::now();
    auto r = run_cli({"--config", "CONFIG"}, base + c.text);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(c.key) != std::string::npos);
    CHECK(r.output.find("connecting") == std::string::npos);
    CHECK(std::chrono::steady_clock::now() - start < 5s);
  }
  auto missing = run_cli({"--config", "/nonexistent/walrelay.properties"}, "");
  CHECK(missing.exit_code == 2);
  CHECK(missing.output.find("/nonexistent/walrelay.properties") != std::string::npos);
}

TEST_CASE("cli: --check validates server, tables and broker without creating anything", "[cli]") {
  Fixture f;
  Db& db = f.db();
  const std::string& slot = f.slot;
  const std::string& table = f.table;
  create_outbox(db, table);
  auto ok = run_cli({"--check", "--config", "CONFIG"}, base_config(slot) + "table.include.list=" + table + "\n");
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  CHECK(db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + slot + "'") == "0");
  CHECK(db.scalar("SELECT count(*) FROM pg_publication WHERE pubname = '" + slot + "'") == "0");

  auto no_table = run_cli({"--check", "--config", "CONFIG"},
                          base_config(slot) + "table.include.list=public.no_such_outbox_table\n");
  CHECK(no_table.exit_code == 1);
  CHECK(no_table.output.find("no_such_outbox_table does not exist") != std::string::npos);

  auto no_column = run_cli({"--check", "--config", "CONFIG"},
                           base_config(slot) + "table.include.list=" + table + "\ntable.field.event.key=tenant\n");
  CHECK(no_column.exit_code == 1);
  CHECK(no_column.output.find("table.field.event.key") != std::string::npos);

  auto no_pub = run_cli({"--check", "--config", "CONFIG"},
                        base_config(slot) + "table.include.list=" + table + "\npublication.autocreate.mode=disabled\n");
  CHECK(no_pub.exit_code == 1);
  CHECK(no_pub.output.find("publication.name") != std::string::npos);

  std::string no_broker = base_config(slot);
  auto at = no_broker.find("kafka.bootstrap.servers=");
  no_broker.replace(at, no_broker.find('\n', at) - at, "kafka.bootstrap.servers=127.0.0.1:1");
  auto bad_broker = run_cli({"--check", "--config", "CONFIG"},
                            no_broker + "table.include.list=" + table + "\ndatabase.connect.timeout.ms=2000\n");
  CHECK(bad_broker.exit_code == 1);
  CHECK(bad_broker.output.find("kafka.bootstrap.servers") != std::string::npos);
}

TEST_CASE("cli: publication.autocreate.mode=disabled without the publication halts with a clear error", "[cli]") {
  Fixture f;
  Db& db = f.db();
  const std::string& slot = f.slot;
  const std::string& table = f.table;
  create_outbox(db, table);
  Walrelay relay(f.config("publication.autocreate.mode=disabled\n"));
  relay.start();
  CHECK(relay.wait_exit(30s) == 3);
  CHECK(relay.log().find("publication.autocreate.mode=disabled") != std::string::npos);
  // and with the publication made by the user, it streams
  db.exec("CREATE PUBLICATION " + slot + " FOR TABLE " + table + " WITH (publish = 'insert')");
  relay.start();
  relay.wait_streaming();
  db.exec("INSERT INTO " + table + " (aggregatetype, aggregateid, type, payload) VALUES ('P', 'k', 't', '{}')");
  auto recs = read_topic(f.topic("P"), 1);
  REQUIRE(recs.size() == 1);
  CHECK(recs[0].key == std::optional<std::string>("k"));
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}

TEST_CASE("cli: --print-config shows no secret - the database password and the admin tokens masked, a registry URL's "
          "user info too",
          "[cli][secrets]") {
  const std::string password = "Pw-print-s3cret", token = "Tok-print-s3cret", url_password = "Url-print-s3cret";
  auto printed = run_cli({"--print-config", "--config", "CONFIG"},
                         "database.hostname=127.0.0.1\nkafka.bootstrap.servers=127.0.0.1:1\ndatabase.password=" + password + "\nadmin.token=" + token +
                             "\nvalue.converter=io.confluent.connect.avro.AvroConverter\n"
                             "value.converter.schema.registry.url=http://reader:" + url_password + "@127.0.0.1:1\n");
  INFO(printed.output);
  REQUIRE(printed.exit_code == 0);
  CHECK(printed.output.find("database.password=********") != std::string::npos);
  CHECK(printed.output.find(password) == std::string::npos);
  CHECK(printed.output.find(token) == std::string::npos);
  CHECK(printed.output.find(url_password) == std::string::npos);
}
