// CloudEvents 1.0 in both of Kafka's content modes, from rows and from
// logical messages, read back with kcat and checked against the
// specification's attributes by tests/integration/cloudevents/check.py.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <csignal>

#include "test_util.hpp"

using namespace it;

namespace {

// kcat's records of `topic`, checked in `mode` against the 1.0 schema: the
// checker's exit status and what it printed. kcat stops after the `expected`
// records (its -e alone can wait on a partition's end for good) and is tried
// again when it read fewer; how its last run went comes first in the output.
CommandResult check_topic(const std::string& topic, const std::string& mode, std::size_t expected) {
  const std::string dir = std::string(WALRELAY_SOURCE_DIR) + "/tests/integration/cloudevents";
  KcatRun k;
  std::size_t read = 0;
  for (int attempt = 0; attempt < 3 && read < expected; ++attempt) {
    k = kcat("-C -t '" + topic + "' -o beginning -c " + std::to_string(expected) + " -e -q -J", 30);
    read = count_of("\n" + k.out, "\n{");
  }
  char records[] = "/tmp/walrelay-ce-XXXXXX";
  const int fd = mkstemp(records);
  if (fd < 0) throw std::runtime_error("mkstemp failed");
  (void)!::write(fd, k.out.data(), k.out.size());
  ::close(fd);
  auto checked = run_command("python3 " + dir + "/check.py " + mode + " " + dir + "/spec-1.0.schema.json < " +
                             records + " 2>&1");
  ::unlink(records);
  checked.output = "kcat read " + std::to_string(read) + " records" + (k.ok() ? "" : "; " + k.failure()) + "\n" +
                   checked.output;
  return checked;
}

}  // namespace

TEST_CASE("cloudevents: binary and structured records of JSON, text and message payloads validate against the "
          "CloudEvents 1.0 schema, their attributes taken from the outbox columns",
          "[relay][cloudevents]") {
  for (std::string mode : {"binary", "structured"}) {
    DYNAMIC_SECTION(mode) {
      Fixture f;
      create_outbox(f.db(), f.table);
      const std::string text_table = f.table + "_text";
      create_outbox(f.db(), text_table, "uuid", "text");
      const std::string ce = mode == "structured" ? "value.converter=io.debezium.converters.CloudEventsConverter\n"
                                                   : "cloudevents.mode=binary\n";
      Walrelay relay(with_key(f.config(ce + "cloudevents.source=/orders-service\ntable.field.event.timestamp=created_at\n"
                                       "message.prefix.include.list=" + f.slot + "\n"),
                              "table.include.list", f.table + "," + text_table));
      relay.start();
      relay.wait_streaming();
      f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload, created_at) VALUES "
                  "('Order', 'o-1', 'OrderCreated', '{\"total\": 42}', '2026-12-02 10:00:00.123+00')");
      f.db().exec("INSERT INTO " + text_table + " (aggregatetype, aggregateid, type, payload) VALUES "
                  "('Order', 'o-2', 'OrderNoted', 'plain \"words\"')");
      f.db().exec("SELECT pg_logical_emit_message(true, '" + f.slot +
                  R"(', '{"id":"m-1","aggregatetype":"Order","aggregateid":"o-3","type":"OrderPaid","payload":{"paid":true},"created_at":"2026-12-02T10:00:01Z"}');)");
      auto recs = read_topic(f.topic("Order"), 3);
      REQUIRE(recs.size() == 3);
      auto checked = check_topic(f.topic("Order"), mode, 3);
      INFO(checked.output);
      CHECK(checked.status == 0);
      CHECK(checked.output.find("FAIL") == std::string::npos);
      CHECK(count_of(checked.output, "\nok offset") == 3);
      std::map<std::string, KafkaRecord> by_key;
      for (auto& r : recs) by_key[r.key.value_or("?")] = r;
      auto& row = by_key["o-1"];
      if (mode == "binary") {
        CHECK(row.header("ce_specversion") == std::optional<std::string>("1.0"));
        CHECK(row.header("ce_id") == row.header("id"));
        CHECK(row.header("ce_type") == std::optional<std::string>("OrderCreated"));
        CHECK(row.header("ce_source") == std::optional<std::string>("/orders-service"));
        CHECK(row.header("ce_subject") == std::optional<std::string>("o-1"));
        CHECK(row.header("ce_time") == std::optional<std::string>("2026-12-02T10:00:00.123Z"));
        CHECK(row.header("content-type") == std::optional<std::string>("application/json"));
        CHECK(row.value == std::optional<std::string>("{\"total\": 42}"));
        CHECK(by_key["o-2"].header("content-type") == std::optional<std::string>("text/plain; charset=utf-8"));
        CHECK(by_key["o-3"].header("ce_type") == std::optional<std::string>("OrderPaid"));
        CHECK(by_key["o-3"].header("ce_id") == std::optional<std::string>("m-1"));
      } else {
        CHECK(row.header("content-type") == std::optional<std::string>("application/cloudevents+json; charset=UTF-8"));
        const std::string id = row.header("id").value_or("?");
        CHECK(row.value == std::optional<std::string>(
                               "{\"specversion\":\"1.0\",\"id\":\"" + id +
                               "\",\"source\":\"/orders-service\",\"type\":\"OrderCreated\",\"subject\":\"o-1\","
                               "\"time\":\"2026-12-02T10:00:00.123Z\",\"datacontenttype\":\"application/json\","
                               "\"data\":{\"total\": 42}}"));
        CHECK(by_key["o-2"].value.value_or("").find("\"datacontenttype\":\"text/plain; charset=utf-8\","
                                                    "\"data\":\"plain \\\"words\\\"\"}") != std::string::npos);
        CHECK(by_key["o-3"].value.value_or("").find("\"data\":{\"paid\":true}") != std::string::npos);
      }
    }
  }
}

TEST_CASE("cloudevents: a NULL type is the row's mapping error, and a configuration without a type column is refused",
          "[relay][cloudevents]") {
  Fixture f;
  f.db().exec("CREATE TABLE " + f.table + " (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text, "
              "aggregateid text, type text, payload jsonb)");
  Walrelay relay(f.config("cloudevents.mode=binary\nerrors.tolerance=all\nerrors.deadletterqueue.topic.name=" + f.slot +
                          ".dlq\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES "
              "('Order', 'k', NULL, '{}'), ('Order', 'k', 'OrderCreated', '{}')");
  CHECK(read_topic(f.topic("Order"), 1).size() == 1);
  CHECK(read_topic(f.slot + ".dlq", 1).size() == 1);
  CHECK(relay.metric("walrelay_mapping_errors_total{reason=\"null_value\"}") == 1);
  relay.signal(SIGTERM);
  REQUIRE(relay.wait_exit() == 0);

  Walrelay refused(f.config("cloudevents.mode=structured\ntable.field.event.type=\n"));
  refused.start();
  CHECK(refused.wait_exit() == 2);
  CHECK(refused.log().find("table.field.event.type") != std::string::npos);
}
