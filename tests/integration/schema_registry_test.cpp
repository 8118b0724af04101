// Schema-registry encoding against a real registry (Apicurio, through its
// Confluent-compatible API, started by scripts/services.sh), read back by
// confluent-kafka's own deserializers (tests/integration/registry/read.py),
// never by walrelay's code.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "test_util.hpp"

using namespace it;
using nlohmann::json;

namespace {

// The registry's base URL. `start registry` once per test process (it
// returns at once when the registry runs, and starts one when an earlier
// process left it stopped); `services.sh stop` ends it.
std::string registry() {
  static const bool started = [] {
    Services::control("start registry");
    return true;
  }();
  (void)started;
  auto url = Services::current("WALRELAY_TEST_REGISTRY");
  REQUIRE_FALSE(url.empty());
  return url;
}

std::string ccompat() { return registry() + "/apis/ccompat/v7"; }

// walrelay's keys for Avro through the registry at `url` (the test registry's by default).
std::string avro_config(const std::string& url = ccompat()) {
  return "value.converter=io.confluent.connect.avro.AvroConverter\nvalue.converter.schema.registry.url=" + url + "\n";
}

// Registers `schema` under `subject`; returns its id.
int register_schema(const std::string& subject, const std::string& type, const std::string& schema) {
  json body = {{"schema", schema}};
  if (type != "AVRO") body["schemaType"] = type;
  const std::string file = "/tmp/" + unique_name("schema") + ".json";
  {
    std::ofstream out(file);
    out << body.dump();
  }
  auto r = run_command("curl -s -X POST -H 'Content-Type: application/vnd.schemaregistry.v1+json' --data @" + file +
                       " '" + ccompat() + "/subjects/" + subject + "/versions'");
  std::remove(file.c_str());
  INFO(r.output);
  REQUIRE(r.status == 0);
  auto answer = json::parse(r.output, nullptr, false);
  REQUIRE(answer.contains("id"));
  return answer["id"].get<int>();
}

// What confluent-kafka's deserializers make of `count` records of `topic`:
// one JSON object per record ({"key", "value", "schema_id", "headers"}).
std::vector<json> read_registry(const std::string& topic, const std::string& format, std::size_t count) {
  auto r = run_command(test_python() + " " + WALRELAY_SOURCE_DIR + "/tests/integration/registry/read.py --bootstrap " +
                       Services::get().kafka + " --registry " + ccompat() + " --topic '" + topic + "' --format " +
                       format + " --count " + std::to_string(count) + " --timeout 60 --from-beginning 2>&1");
  INFO(r.output);
  REQUIRE(r.status == 0);
  std::vector<json> out;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("value")) out.push_back(j);
  }
  REQUIRE(out.size() == count);
  return out;
}

std::map<std::string, json> by_key(const std::vector<json>& records) {
  std::map<std::string, json> out;
  for (auto& r : records) out[r["key"].is_string() ? r["key"].get<std::string>() : "?"] = r;
  return out;
}

const char* order_avsc = R"({"type": "record", "name": "Order", "namespace": "com.acme", "fields": [
  {"name": "id", "type": "long"}, {"name": "customer", "type": "string"},
  {"name": "note", "type": ["null", "string"], "default": null},
  {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line",
     "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}, "default": []}]})";

}  // namespace

TEST_CASE("schema registry: Avro records from JSON rows decode with confluent-kafka's AvroDeserializer, and a row "
          "that does not fit goes to the dead-letter topic naming the field",
          "[relay][registry]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  const std::string topic = f.topic("Order");
  const int id = register_schema(topic + "-value", "AVRO", order_avsc);
  const std::string dlq = unique_name("dlq");
  Walrelay relay(f.config(avro_config() +
                          "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" + dlq + "\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES "
              "('Order', 'o-1', 'OrderCreated', '{\"id\": 1, \"customer\": \"ann\", \"lines\": [{\"sku\": \"s-1\", \"qty\": 2}]}'),"
              "('Order', 'o-2', 'OrderCreated', '{\"id\": 2, \"customer\": \"bob\", \"note\": \"gift\"}'),"
              "('Order', 'o-3', 'OrderCreated', '{\"id\": 3, \"customer\": \"cy\", \"lines\": [{\"sku\": \"s-2\", \"qty\": \"two\"}]}')");
  auto records = by_key(read_registry(topic, "avro", 2));
  CHECK(records["o-1"]["schema_id"] == id);
  CHECK(records["o-1"]["value"] ==
        json::parse(R"({"id": 1, "customer": "ann", "note": null, "lines": [{"sku": "s-1", "qty": 2}]})"));
  CHECK(records["o-2"]["value"] == json::parse(R"({"id": 2, "customer": "bob", "note": "gift", "lines": []})"));
  CHECK(records["o-2"]["headers"].contains("id"));
  auto dead = read_topic(dlq, 1);
  REQUIRE(dead.size() == 1);
  // The row's image, as for any row that cannot be mapped.
  CHECK_THAT(dead[0].value.value_or(""), Catch::Contains("\"aggregateid\":\"o-3\""));
  const auto why = dead[0].header("__connect.errors.exception.message").value_or("");
  CHECK_THAT(why, Catch::Contains("/lines/0/qty") && Catch::Contains("expected an integer (int), got a string"));
  CHECK(relay.metric("walrelay_mapping_errors_total{reason=\"schema_mismatch\"}") == std::optional<double>(1));
  CHECK(relay.metric("walrelay_schema_registry_requests_total{outcome=\"ok\"}") == std::optional<double>(1));
}

TEST_CASE("schema registry: Avro logical types are taken by what they mean: a decimal from a number or a string at "
          "its scale, a timestamp, a date and a uuid from their ISO forms, read back by confluent-kafka's "
          "AvroDeserializer, and an amount that would need rounding is dead-lettered naming the field",
          "[relay][registry]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  const std::string topic = f.topic("Order");
  register_schema(topic + "-value", "AVRO", R"({"type": "record", "name": "Order", "namespace": "com.acme", "fields": [
    {"name": "total", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "fee", "type": ["null", {"type": "fixed", "name": "Fee", "size": 4, "logicalType": "decimal",
                                      "precision": 9, "scale": 3}], "default": null},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}}]})");
  const std::string dlq = unique_name("dlq");
  Walrelay relay(f.config(avro_config() + "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" + dlq + "\n"));
  relay.start();
  relay.wait_streaming();
  const std::string ref = "0f8fad5b-d9cb-469f-a165-70867728950e";
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES "
              "('Order', 'o-1', 'E', '{\"total\": 52.50, \"fee\": -0.125, \"at\": \"2024-05-01T14:00:00.123+02:00\", "
              "\"day\": \"2024-05-01\", \"ref\": \"" + ref + "\"}'),"
              "('Order', 'o-2', 'E', '{\"total\": \"52.50\", \"at\": 1714564800123, \"day\": 19844, \"ref\": \"" +
              ref + "\"}'),"
              "('Order', 'o-3', 'E', '{\"total\": 52.505, \"at\": 0, \"day\": 0, \"ref\": \"" + ref + "\"}'),"
              "('Order', 'o-4', 'E', '{\"total\": 99999999.99, \"at\": 0, \"day\": 0, \"ref\": \"" + ref + "\"}')");
  auto records = by_key(read_registry(topic, "avro", 3));
  // read.py prints a Decimal as its text, times in ISO 8601.
  CHECK(records["o-1"]["value"] == json::parse(R"({"total": "52.50", "fee": "-0.125",
      "at": "2024-05-01T12:00:00.123000+00:00", "day": "2024-05-01", "ref": ")" + ref + R"("})"));
  CHECK(records["o-2"]["value"] == json::parse(R"({"total": "52.50", "fee": null,
      "at": "2024-05-01T12:00:00.123000+00:00", "day": "2024-05-01", "ref": ")" + ref + R"("})"));
  CHECK(records["o-4"]["value"]["total"] == "99999999.99");
  auto dead = read_topic(dlq, 1);
  REQUIRE(dead.size() == 1);
  CHECK_THAT(dead[0].value.value_or(""), Catch::Contains("\"aggregateid\":\"o-3\""));
  const auto why = dead[0].header("__connect.errors.exception.message").value_or("");
  CHECK_THAT(why, Catch::Contains("/total") && Catch::Contains("52.505") && Catch::Contains("scale 2"));
  CHECK(relay.metric("walrelay_mapping_errors_total{reason=\"schema_mismatch\"}") == std::optional<double>(1));
}

TEST_CASE("schema registry: JSON Schema and Protobuf records decode with confluent-kafka's JSONDeserializer and "
          "ProtobufDeserializer",
          "[relay][registry]") {
  struct Format {
    std::string converter, type, reader, schema;
  };
  const std::vector<Format> formats = {
      {"io.confluent.connect.json.JsonSchemaConverter", "JSON", "json",
       R"({"type": "object", "required": ["id"], "additionalProperties": false,
           "properties": {"id": {"type": "integer"}, "customer": {"type": "string"}}})"},
      {"io.confluent.connect.protobuf.ProtobufConverter", "PROTOBUF", "protobuf",
       "syntax = \"proto3\";\npackage acme;\nmessage Order { int64 id = 1; string customer = 2; }\n"},
  };
  for (auto& format : formats) {
    DYNAMIC_SECTION(format.reader) {
      Fixture f;
      create_outbox(f.db(), f.table);
      const std::string topic = f.topic("Order");
      const int id = register_schema(topic + "-value", format.type, format.schema);
      Walrelay relay(f.config("value.converter=" + format.converter + "\nvalue.converter.schema.registry.url=" +
                              ccompat() + "\n"));
      relay.start();
      relay.wait_streaming();
      f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES "
                  "('Order', 'o-1', 'OrderCreated', '{\"id\": 1, \"customer\": \"ann\"}'),"
                  "('Order', 'o-2', 'OrderCreated', '{\"id\": 2}')");
      auto records = by_key(read_registry(topic, format.reader, 2));
      CHECK(records["o-1"]["schema_id"] == id);
      if (format.reader == "json") {
        CHECK(records["o-1"]["value"] == json::parse(R"({"id": 1, "customer": "ann"})"));
        CHECK(records["o-2"]["value"] == json::parse(R"({"id": 2})"));
      } else {
        // Protobuf's JSON mapping: int64 as a string, proto3 defaults left out.
        CHECK(records["o-1"]["value"]["customer"] == "ann");
        CHECK(records["o-1"]["value"]["id"].dump() == "\"1\"");
        CHECK(records["o-2"]["value"]["id"].dump() == "\"2\"");
      }
    }
  }
}

TEST_CASE("schema registry: Protobuf's well-known types (Timestamp, Duration, the wrappers), int64 and enums by name "
          "from JSON decode with confluent-kafka's ProtobufDeserializer, and an unknown enum name is dead-lettered",
          "[relay][registry]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  const std::string topic = f.topic("Order");
  register_schema(topic + "-value", "PROTOBUF", R"(syntax = "proto3";
package acme;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
message Order {
  google.protobuf.Timestamp at = 1;
  google.protobuf.Duration wait = 2;
  google.protobuf.Int32Value qty = 3;
  google.protobuf.StringValue label = 4;
  int64 big = 5;
  Status status = 6;
}
enum Status { NEW = 0; PAID = 1; }
)");
  const std::string dlq = unique_name("dlq");
  Walrelay relay(f.config("value.converter=io.confluent.connect.protobuf.ProtobufConverter\n"
                          "value.converter.schema.registry.url=" + ccompat() +
                          "\nerrors.tolerance=all\nerrors.deadletterqueue.topic.name=" + dlq + "\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES "
              "('Order', 'o-1', 'E', '{\"at\": \"2024-05-01T14:00:00.123+02:00\", \"wait\": \"1.5s\", \"qty\": 3, "
              "\"label\": \"x\", \"big\": \"9007199254740993\", \"status\": \"PAID\"}'),"
              "('Order', 'o-2', 'E', '{\"big\": 9007199254740993, \"qty\": 0}'),"
              "('Order', 'o-3', 'E', '{\"status\": \"LOST\"}')");
  auto records = by_key(read_registry(topic, "protobuf", 2));
  auto& one = records["o-1"]["value"];
  CHECK(one["at"] == "2024-05-01T12:00:00.123Z");
  CHECK(one["wait"] == "1.500s");
  CHECK(one["qty"] == 3);
  CHECK(one["label"] == "x");
  CHECK(one["big"] == "9007199254740993");
  CHECK(one["status"] == "PAID");
  auto& two = records["o-2"]["value"];
  CHECK(two["big"] == "9007199254740993");
  CHECK(two["qty"] == 0);  // a wrapper holding 0 is there, unlike a plain int32 at 0
  CHECK_FALSE(two.contains("label"));
  CHECK(two["status"] == "NEW");
  auto dead = read_topic(dlq, 1);
  REQUIRE(dead.size() == 1);
  CHECK_THAT(dead[0].value.value_or(""), Catch::Contains("\"aggregateid\":\"o-3\""));
  CHECK_THAT(dead[0].header("__connect.errors.exception.message").value_or(""), Catch::Contains("LOST"));
}

TEST_CASE("schema registry: a draft-07 JSON Schema is checked by its own draft: payloads that break exclusiveMinimum, "
          "const, if/then or propertyNames are dead-lettered, not sent for confluent-kafka's JSONDeserializer to refuse",
          "[relay][registry]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  const std::string topic = f.topic("Order");
  register_schema(topic + "-value", "JSON", R"({"$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {"amount": {"type": "number", "exclusiveMinimum": 0}, "kind": {"const": "order"},
                   "extra": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}},
    "if": {"properties": {"kind": {"const": "order"}}, "required": ["kind"]},
    "then": {"required": ["amount"]}})");
  const std::string dlq = unique_name("dlq");
  Walrelay relay(f.config("value.converter=io.confluent.connect.json.JsonSchemaConverter\n"
                          "value.converter.schema.registry.url=" + ccompat() +
                          "\nerrors.tolerance=all\nerrors.deadletterqueue.topic.name=" + dlq + "\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES "
              "('Order', 'bad-exclusive', 'E', '{\"kind\": \"order\", \"amount\": 0}'),"
              "('Order', 'bad-const', 'E', '{\"kind\": \"invoice\"}'),"
              "('Order', 'bad-then', 'E', '{\"kind\": \"order\"}'),"
              "('Order', 'bad-names', 'E', '{\"kind\": \"order\", \"amount\": 1, \"extra\": {\"A1\": 1}}'),"
              "('Order', 'good', 'E', '{\"kind\": \"order\", \"amount\": 1, \"extra\": {\"ab\": 1}}')");
  auto records = read_registry(topic, "json", 1);
  CHECK(records[0]["key"] == "good");
  CHECK(records[0]["value"] == json::parse(R"({"kind": "order", "amount": 1, "extra": {"ab": 1}})"));
  auto dead = read_topic(dlq, 4);
  REQUIRE(dead.size() == 4);
  std::set<std::string> keys;
  for (auto& d : dead)
    for (auto key : {"bad-exclusive", "bad-const", "bad-then", "bad-names"})
      if (d.value.value_or("").find(std::string("\"aggregateid\":\"") + key + "\"") != std::string::npos) keys.insert(key);
  CHECK(keys.size() == 4);
  // Nothing more reached the topic.
  CHECK(count_records(topic) == 1);
}

TEST_CASE("schema registry: a JSON Schema of draft 2020-12, which walrelay cannot check, holds the subject's records "
          "with the reason in /readyz, and nothing is sent or dead-lettered",
          "[relay][registry]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  const std::string topic = f.topic("Order");
  register_schema(topic + "-value", "JSON", R"({"$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object", "prefixItems": [{"type": "string"}]})");
  const std::string dlq = unique_name("dlq");
  Walrelay relay(f.config("value.converter=io.confluent.connect.json.JsonSchemaConverter\n"
                          "value.converter.schema.registry.url=" + ccompat() +
                          "\nerrors.tolerance=all\nerrors.deadletterqueue.topic.name=" + dlq + "\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES "
              "('Order', 'o-1', 'E', '{\"id\": 1}')");
  const auto written = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return relay.metric("walrelay_schema_registry_requests_total{outcome=\"bad_schema\"}")
                                      .value_or(0) >= 1; },
                     30s));
  auto ready = relay.get("/readyz");
  CHECK(ready.status == 503);
  CHECK_THAT(ready.body, Catch::Contains("2020-12") && Catch::Contains("drafts 4, 6 and 7"));
  CHECK(f.db().confirmed_flush(f.slot) < written);
  CHECK(count_records(topic) == 0);
  CHECK(relay.metric("walrelay_dead_lettered_total").value_or(0) == 0);
}

TEST_CASE("schema registry: a subject with no schema holds the stream (the slot stays behind, /readyz says why) "
          "until the schema is registered, and nothing is dead-lettered",
          "[relay][registry]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  const std::string topic = f.topic("Order");
  const std::string dlq = unique_name("dlq");
  Walrelay relay(f.config(avro_config() +
                          "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" + dlq + "\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES "
              "('Order', 'o-1', 'OrderCreated', '{\"id\": 1, \"customer\": \"ann\"}')");
  const auto written = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return relay.metric("walrelay_schema_registry_requests_total{outcome=\"not_found\"}").value_or(0) >= 2; },
                     std::chrono::seconds(30)));
  auto ready = relay.get("/readyz");
  CHECK(ready.status == 503);
  CHECK_THAT(ready.body, Catch::Contains("schema registry") && Catch::Contains(topic + "-value"));
  // Status updates go on, but the slot is not confirmed past the held row.
  CHECK(f.db().confirmed_flush(f.slot) < written);
  CHECK(relay.metric("walrelay_dead_lettered_total").value_or(0) == 0);
  register_schema(topic + "-value", "AVRO", order_avsc);
  auto records = read_registry(topic, "avro", 1);
  CHECK(records[0]["value"]["customer"] == "ann");
  REQUIRE(eventually([&] { return relay.get("/readyz").status == 200; }, std::chrono::seconds(30)));
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= written; }, std::chrono::seconds(30)));
}

TEST_CASE("schema registry: table.field.event.schema.version picks the version per row, and the record name "
          "strategy takes the subject from the event type",
          "[relay][registry]") {
  SECTION("version column") {
    Fixture f;
    f.db().exec("CREATE TABLE " + f.table + " (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text, "
                "aggregateid text, type text, payload jsonb, schema_version int)");
    const std::string topic = f.topic("Order");
    const std::string subject = topic + "-value";
    const int v1 = register_schema(subject, "AVRO",
                                   R"({"type":"record","name":"Order","fields":[{"name":"id","type":"long"}]})");
    const int v2 = register_schema(subject, "AVRO",
                                   R"({"type":"record","name":"Order","fields":[{"name":"id","type":"long"},
                                      {"name":"customer","type":"string","default":"?"}]})");
    REQUIRE(v1 != v2);
    Walrelay relay(f.config(avro_config() +
                            "table.field.event.schema.version=schema_version\n"));
    relay.start();
    relay.wait_streaming();
    f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload, schema_version) VALUES "
                "('Order', 'o-1', 'T', '{\"id\": 1}', 1), ('Order', 'o-2', 'T', '{\"id\": 2}', NULL)");
    auto records = by_key(read_registry(topic, "avro", 2));
    CHECK(records["o-1"]["schema_id"] == v1);
    CHECK(records["o-1"]["value"] == json::parse(R"({"id": 1})"));
    CHECK(records["o-2"]["schema_id"] == v2);
    CHECK(records["o-2"]["value"] == json::parse(R"({"id": 2, "customer": "?"})"));
  }
  SECTION("record name strategy") {
    Fixture f;
    create_outbox(f.db(), f.table);
    const std::string topic = f.topic("Order");
    const std::string name = "com.acme." + unique_name("Created");
    const int id = register_schema(name, "AVRO",
                                   R"({"type":"record","name":")" + name + R"(","fields":[{"name":"id","type":"long"}]})");
    Walrelay relay(f.config(avro_config() +
                            "value.converter.value.subject.name.strategy="
                            "io.confluent.kafka.serializers.subject.RecordNameStrategy\n"));
    relay.start();
    relay.wait_streaming();
    f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES "
                "('Order', 'o-1', '" + name + "', '{\"id\": 7}')");
    auto records = read_registry(topic, "avro", 1);
    CHECK(records[0]["schema_id"] == id);
    CHECK(records[0]["value"] == json::parse(R"({"id": 7})"));
  }
}

TEST_CASE("schema registry: an outage holds the stream at the first record whose schema is not cached, loses "
          "nothing and dead-letters nothing, and with the registry back, every record arrives in order",
          "[fault][registry][solo]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  const std::string orders = f.topic("Order"), invoices = f.topic("Invoice");
  const char* invoice_avsc = R"({"type":"record","name":"Invoice","fields":[{"name":"n","type":"int"}]})";
  register_schema(orders + "-value", "AVRO", order_avsc);
  const std::string dlq = unique_name("dlq");
  Walrelay relay(f.config(avro_config() +
                          "value.converter.schema.registry.request.timeout.ms=2000\n"
                          "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" + dlq + "\n"));
  relay.start();
  relay.wait_streaming();
  auto insert = [&](const std::string& type, const std::string& key, const std::string& payload) {
    f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES ('" + type + "', '" +
                key + "', 'E', '" + payload + "')");
  };
  insert("Order", "o-1", R"({"id": 1, "customer": "ann"})");
  REQUIRE(read_registry(orders, "avro", 1).size() == 1);  // Order's schema is cached now

  Services::control("registry-stop");
  // Back on its port whatever happens below, for the tests after this one.
  struct RestartRegistry {
    ~RestartRegistry() {
      try {
        Services::control("registry-start");
      } catch (...) {
      }
    }
  } restart_registry;
  insert("Invoice", "i-1", R"({"n": 1})");  // its schema was never fetched: the stream waits here
  insert("Order", "o-2", R"({"id": 2, "customer": "bob"})");
  const auto written = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return relay.metric("walrelay_schema_registry_requests_total{outcome=\"unreachable\"}")
                                      .value_or(0) >= 2; },
                     60s));
  auto ready = relay.get("/readyz");
  CHECK(ready.status == 503);
  CHECK_THAT(ready.body, Catch::Contains("schema registry") && Catch::Contains("did not answer"));
  CHECK(f.db().confirmed_flush(f.slot) < written);
  CHECK(count_records(orders) == 1);  // o-2 waits behind i-1

  Services::control("registry-start");  // on its port, its schemas gone
  register_schema(orders + "-value", "AVRO", order_avsc);
  register_schema(invoices + "-value", "AVRO", invoice_avsc);
  auto order_records = by_key(read_registry(orders, "avro", 2));
  CHECK(order_records["o-2"]["value"]["customer"] == "bob");
  auto invoice_records = read_registry(invoices, "avro", 1);
  CHECK(invoice_records[0]["value"] == json::parse(R"({"n": 1})"));
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= written; }, 60s));
  CHECK(relay.metric("walrelay_dead_lettered_total").value_or(0) == 0);
  CHECK(relay.running());
}

TEST_CASE("schema registry: Apicurio's AvroConverter with Apicurio's own URL writes Apicurio 3's framing (the content "
          "id), which confluent-kafka's AvroDeserializer reads",
          "[relay][registry]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  const std::string topic = f.topic("Order");
  const int id = register_schema(topic + "-value", "AVRO", order_avsc);
  Walrelay relay(f.config("value.converter=io.apicurio.registry.utils.converter.AvroConverter\n"
                          "value.converter.apicurio.registry.url=" + registry() + "/apis/registry/v3\n"
                          "value.converter.apicurio.registry.auto-register=true\n"
                          "value.converter.apicurio.registry.find-latest=true\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES "
              "('Order', 'o-1', 'OrderCreated', '{\"id\": 1, \"customer\": \"ann\"}')");
  auto records = read_registry(topic, "avro", 1);
  CHECK(records[0]["schema_id"] == id);
  CHECK(records[0]["value"] == json::parse(R"({"id": 1, "customer": "ann", "note": null, "lines": []})"));
}

namespace {

// tests/integration/registry/proxy.py in front of the registry: HTTPS with a
// certificate made here for 127.0.0.1, and 401 unless the request carries
// `auth` (--basic user:password or --bearer TOKEN).
struct SecureRegistry {
  std::string dir = "/tmp/" + unique_name("regtls");
  std::string port;
  explicit SecureRegistry(const std::string& auth) {
    REQUIRE(run_command("mkdir -p " + dir + " && openssl req -x509 -newkey rsa:2048 -nodes -keyout " + dir +
                        "/key.pem -out " + dir + "/cert.pem -days 1 -subj /CN=127.0.0.1 -addext "
                        "subjectAltName=IP:127.0.0.1 >/dev/null 2>&1")
                .status == 0);
    REQUIRE(run_command("nohup python3 " + std::string(WALRELAY_SOURCE_DIR) +
                        "/tests/integration/registry/proxy.py --upstream " + registry() + " --cert " + dir +
                        "/cert.pem --key " + dir + "/key.pem " + auth + " --port-file " + dir + "/port </dev/null >" +
                        dir + "/log 2>&1 & echo $! > " + dir + "/pid")
                .status == 0);
    REQUIRE(eventually([&] { return run_command("test -s " + dir + "/port").status == 0; }, 20s));
    port = run_command("cat " + dir + "/port").output;
  }
  ~SecureRegistry() { run_command("kill $(cat " + dir + "/pid) 2>/dev/null; rm -rf " + dir); }
  std::string url() const { return "https://127.0.0.1:" + port + "/apis/ccompat/v7"; }
  std::string ca() const { return dir + "/cert.pem"; }
};

}  // namespace

TEST_CASE("schema registry: HTTPS with a CA file and basic or bearer credentials reaches the registry, while a "
          "wrong password or an unknown certificate holds the stream with the reason",
          "[relay][registry]") {
  struct Case {
    std::string name, proxy_auth, walrelay_auth;
    bool with_ca, works;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"basic", "--basic svc:s3cret",
       "value.converter.basic.auth.credentials.source=USER_INFO\nvalue.converter.basic.auth.user.info=svc:s3cret\n", true,
       true, ""},
      {"bearer", "--bearer tok-123",
       "value.converter.bearer.auth.credentials.source=STATIC_TOKEN\nvalue.converter.bearer.auth.token=tok-123\n", true,
       true, ""},
      {"wrong password", "--basic svc:s3cret",
       "value.converter.basic.auth.credentials.source=USER_INFO\nvalue.converter.basic.auth.user.info=svc:wrong\n", true,
       false, "unauthorized"},
      {"unknown certificate", "--basic svc:s3cret",
       "value.converter.basic.auth.credentials.source=USER_INFO\nvalue.converter.basic.auth.user.info=svc:s3cret\n",
       false, false, "unreachable"},
  };
  for (auto& c : cases) {
    DYNAMIC_SECTION(c.name) {
      SecureRegistry secure(c.proxy_auth);
      Fixture f;
      create_outbox(f.db(), f.table);
      const std::string topic = f.topic("Order");
      register_schema(topic + "-value", "AVRO", order_avsc);
      Walrelay relay(f.config(avro_config(secure.url()) + c.walrelay_auth +
                              (c.with_ca ? "value.converter.schema.registry.ssl.ca.location=" + secure.ca() + "\n"
                                         : std::string())));
      relay.start();
      relay.wait_streaming();
      f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES "
                  "('Order', 'o-1', 'E', '{\"id\": 1, \"customer\": \"ann\"}')");
      if (c.works) {
        auto records = read_registry(topic, "avro", 1);
        CHECK(records[0]["value"]["customer"] == "ann");
      } else {
        REQUIRE(eventually([&] { return relay.metric("walrelay_schema_registry_requests_total{outcome=\"" + c.reason +
                                                     "\"}").value_or(0) >= 1; },
                           30s));
        auto ready = relay.get("/readyz");
        CHECK(ready.status == 503);
        CHECK_THAT(ready.body, Catch::Contains(c.reason == "unauthorized" ? "credentials" : "certificate"));
        CHECK(count_records(topic) == 0);
        CHECK(relay.metric("walrelay_dead_lettered_total").value_or(0) == 0);
      }
      // The credentials never reach the log.
      CHECK(relay.log().find("s3cret") == std::string::npos);
      CHECK(relay.log().find("tok-123") == std::string::npos);
    }
  }
}
