// A Debezium connector configuration handed to walrelay as it is, and the
// router keys it brings that change what reaches Kafka.
#include <algorithm>
#include <catch2/catch.hpp>

#include <csignal>

#include "harness.hpp"
#include "test_util.hpp"

using namespace it;

namespace {

// Only where to find the test's services comes from the environment, as an
// operator's deployment gives a pasted file its hosts and secrets.
std::map<std::string, std::string> services_env(const std::string& slot) {
  const auto& s = Services::get();
  return {{"WALRELAY_DATABASE_HOSTNAME", s.pg_host},  {"WALRELAY_DATABASE_PORT", s.pg_port},
          {"WALRELAY_DATABASE_USER", s.pg_user},      {"WALRELAY_DATABASE_PASSWORD", ""},
          {"WALRELAY_DATABASE_DBNAME", s.pg_database}, {"WALRELAY_KAFKA_BOOTSTRAP_SERVERS", s.kafka},
          {"WALRELAY_SLOT_NAME", slot},               {"WALRELAY_PUBLICATION_NAME", slot},
          {"WALRELAY_ADMIN_LISTEN", "127.0.0.1:0"},   {"WALRELAY_LOG_LEVEL", "debug"}};
}

}  // namespace

// The keys of Debezium's own outbox example (debezium-examples, outbox/
// register-postgres.json: Debezium 1.x list names, the router under
// transforms.outbox), as Kafka Connect's REST body.
TEST_CASE("debezium config: the outbox example's Kafka Connect JSON, as it is, relays its outbox table",
          "[relay][debezium]") {
  Fixture f;
  f.db().exec("CREATE SCHEMA IF NOT EXISTS inventory");
  f.db().exec("DROP TABLE IF EXISTS inventory.outboxevent");
  f.db().exec(
      "CREATE TABLE inventory.outboxevent (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, "
      "aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, timestamp timestamp NOT NULL, "
      "payload varchar(8000))");
  const std::string connector = R"({
    "name": "order-outbox-connector",
    "config": {
      "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
      "tasks.max": "1",
      "database.hostname": "order-db",
      "database.port": "5432",
      "database.user": "postgresuser",
      "database.password": "postgrespw",
      "database.dbname": "orderdb",
      "database.server.name": "dbserver1",
      "schema.whitelist": "inventory",
      "table.whitelist": "inventory.outboxevent",
      "tombstones.on.delete": "false",
      "transforms": "outbox",
      "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
      "transforms.outbox.route.topic.replacement": "${routedByValue}.events",
      "transforms.outbox.table.field.event.timestamp": "timestamp"
    }
  })";
  Walrelay relay(connector, services_env(f.slot));
  relay.start();
  relay.wait_streaming();
  const std::string type = f.slot + "_order";  // the topic <aggregatetype>.events, this test's own
  const std::string id = f.db().scalar("SELECT gen_random_uuid()");
  f.db().exec("INSERT INTO inventory.outboxevent VALUES ('" + id + "', '" + type +
              "', '123', 'OrderCreated', '2019-01-31 12:13:01.484', '{\"id\": 1, \"customerId\": 123}')");
  auto recs = read_topic(type + ".events", 1);
  REQUIRE(recs.size() == 1);
  CHECK(recs[0].key == std::optional<std::string>("123"));
  CHECK(recs[0].value == std::optional<std::string>("{\"id\": 1, \"customerId\": 123}"));
  CHECK(recs[0].header("id") == std::optional<std::string>(id));
  CHECK(recs[0].timestamp_ms == 1548936781484);
  // What the file says that walrelay does not use is said once, and why;
  // its secret is not.
  auto log = relay.log();
  CHECK(log.find("database.server.name=dbserver1") != std::string::npos);
  CHECK(log.find("tasks.max=1") != std::string::npos);
  CHECK(log.find("postgrespw") == std::string::npos);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);

  // --print-config turns it into walrelay's own file, what it dropped as comments.
  Walrelay print(connector, services_env(f.slot));
  print.start({"--print-config", "--config", print.config_path()});
  CHECK(print.wait_exit() == 0);
  auto printed = print.log();
  CHECK(printed.find("# connector.class=io.debezium.connector.postgresql.PostgresConnector") != std::string::npos);
  CHECK(printed.find("\ntable.include.list=inventory.outboxevent\n") != std::string::npos);
  CHECK(printed.find("\nroute.topic.replacement=${routedByValue}.events\n") != std::string::npos);
  CHECK(printed.find("postgrespw") == std::string::npos);
  f.db().exec("DROP TABLE inventory.outboxevent");
}

TEST_CASE("debezium config: another transform in the chain is refused at start naming it, before any connection",
          "[relay][debezium]") {
  Fixture f;
  Walrelay relay(
      "transforms=unwrap,outbox\n"
      "transforms.unwrap.type=io.debezium.transforms.ExtractNewRecordState\n"
      "transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n",
      services_env(f.slot));
  relay.start();
  CHECK(relay.wait_exit() == 2);
  CHECK(relay.log().find("transforms.unwrap.type") != std::string::npos);
  CHECK(relay.log().find("ExtractNewRecordState") != std::string::npos);
  CHECK(f.db().scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'") == "0");
}

TEST_CASE("debezium config: table.op.invalid.behavior - an UPDATE the publication sends is skipped with a warning "
          "and counted, or with fatal halts before it",
          "[relay][debezium]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  // A publication made by hand that sends updates too (the one walrelay makes sends inserts only).
  f.db().exec("CREATE PUBLICATION " + f.slot + " FOR TABLE " + f.table + " WITH (publish_via_partition_root = true)");
  Walrelay relay(f.config("publication.autocreate.mode=disabled\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Inv", "a", "'{}'"));
  f.db().exec("UPDATE " + f.table + " SET payload = '{\"u\": 1}' WHERE aggregateid = 'a'");
  f.db().exec(insert_event(f.table, "Inv", "b", "'{}'"));
  auto recs = read_topic(f.topic("Inv"), 2);
  REQUIRE(recs.size() == 2);
  CHECK(relay.metric("walrelay_invalid_operations_total") == 1);
  CHECK(relay.log().find("an UPDATE of a row of outbox table " + f.table) != std::string::npos);
  CHECK(relay.log().find("table.op.invalid.behavior=warn") != std::string::npos);
  relay.signal(SIGTERM);
  REQUIRE(relay.wait_exit() == 0);

  Walrelay fatal(f.config("publication.autocreate.mode=disabled\ntable.op.invalid.behavior=fatal\n"));
  fatal.start();
  fatal.wait_streaming();
  f.db().exec("UPDATE " + f.table + " SET payload = '{\"u\": 2}' WHERE aggregateid = 'b'");
  f.db().exec(insert_event(f.table, "Inv", "c", "'{}'"));
  CHECK(fatal.wait_exit(60s) == 3);
  CHECK(fatal.log().find("table.op.invalid.behavior=fatal") != std::string::npos);
  CHECK(count_records(f.topic("Inv")) == 2);
  // Halted before the UPDATE's transaction: the slot gives it again (other
  // WAL, other tests' too, may lie between the confirmed position and it), and
  // with warn it is skipped and the event after it sent.
  Walrelay again(f.config("publication.autocreate.mode=disabled\n"));
  again.start();
  auto after = read_topic(f.topic("Inv"), 3);
  REQUIRE(after.size() == 3);
  CHECK(std::count_if(after.begin(), after.end(), [](const KafkaRecord& r) { return r.key == "c"; }) == 1);
  CHECK(again.metric("walrelay_invalid_operations_total") == 1);
  CHECK(again.log().find("an UPDATE of a row of outbox table " + f.table) != std::string::npos);
}

TEST_CASE("debezium config: table.fields.additional.error.on.missing=false leaves out a placed column the table "
          "lacks, true (the default) makes it the row's error",
          "[relay][debezium]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  Walrelay relay(f.config("table.fields.additional.placement=type:header:eventType,tenant:header\n"
                          "table.fields.additional.error.on.missing=false\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Add", "k", "'{}'"));
  auto recs = read_topic(f.topic("Add"), 1);
  REQUIRE(recs.size() == 1);
  CHECK(recs[0].header("eventType") == std::optional<std::string>("Created"));
  CHECK_FALSE(recs[0].header("tenant"));
  relay.signal(SIGTERM);
  REQUIRE(relay.wait_exit() == 0);

  Walrelay strict(f.config("table.fields.additional.placement=type:header:eventType,tenant:header\n"));
  strict.start();
  f.db().exec(insert_event(f.table, "Add", "k2", "'{}'"));
  CHECK(strict.wait_exit(60s) == 3);
  CHECK(strict.log().find("has no column \"tenant\"") != std::string::npos);
}
