// The Outbox Event Router's remaining options: route.topic.regex,
// envelope and partition placements, table.expand.json.payload and the
// converters (the bytes a Kafka Connect converter would write).
#include <catch2/catch.hpp>

#include <optional>
#include <string>

#include "walrelay/config.hpp"
#include "walrelay/route/outbox_mapper.hpp"

using namespace walrelay;

namespace {

Config config_with(const std::string& extra) {
  return parse_config("kafka.bootstrap.servers=x:1\nmessage.prefix.include.list=outbox\n" + extra, "t", {});
}

// Maps a message's JSON content; the record's views stay valid until the next call.
struct Router {
  Config cfg;
  OutboxMapper mapper;
  std::string content;
  OutboxRecord rec;
  explicit Router(const std::string& extra) : cfg(config_with(extra)), mapper(cfg) {}
  std::optional<MapError> map(std::string json) {
    content = std::move(json);
    pgoutput::LogicalMessage msg{};
    msg.flags = 1;
    msg.prefix = "outbox";
    msg.content = pgoutput::Bytes(reinterpret_cast<const std::byte*>(content.data()), content.size());
    return mapper.map_message(msg, 0, 0, rec);
  }
  std::string event(const std::string& route, const std::string& extra_members = "",
                    const std::string& payload = R"({"total": 12, "items": [1, 2]})") {
    return R"({"id":"1","aggregatetype":")" + route + R"(","aggregateid":"order-42","type":"OrderCreated",)" +
           R"("payload":)" + payload + extra_members + "}";
  }
  std::string value() const { return rec.value ? std::string(*rec.value) : "<tombstone>"; }
};

}  // namespace

TEST_CASE("router: route.topic.regex - named and numbered groups, Java's replacement syntax, no match routes by the "
          "value itself",
          "[mapper][router]") {
  Router r("route.topic.regex=(?<domain>[a-z]+)\\.(?<entity>[A-Za-z]+)\n"
           "route.topic.replacement=events.${domain}.$2\n");
  REQUIRE_FALSE(r.map(r.event("shop.Order")));
  CHECK(r.rec.topic == "events.shop.Order");
  REQUIRE_FALSE(r.map(r.event("shop.Order")));  // the cached topic
  CHECK(r.rec.topic == "events.shop.Order");
  REQUIRE_FALSE(r.map(r.event("Customer")));  // no match: the value is the topic (Debezium)
  CHECK(r.rec.topic == "Customer");
  auto e = r.map(r.event("shop.Bad!"));  // no match, and not a legal topic
  REQUIRE(e);
  CHECK(e->reason == "invalid_topic");

  Router plain("route.topic.replacement=x.${routedByValue}.$0\n");  // the default regex: every group is the value
  REQUIRE_FALSE(plain.map(plain.event("Order")));
  CHECK(plain.rec.topic == "x.Order.Order");

  Router missing("route.topic.regex=(?<a>.*)\nroute.topic.replacement=t.${b}\n");
  e = missing.map(missing.event("Order"));
  REQUIRE(e);
  CHECK_THAT(e->message, Catch::Contains("\"b\""));

  CHECK_THROWS_WITH(config_with("route.topic.regex=(unclosed\n"), Catch::Contains("route.topic.regex"));
  CHECK_THROWS_WITH(config_with("route.topic.replacement=a.${x\n"), Catch::Contains("route.topic.replacement"));
}

TEST_CASE("router: a partition placement chooses the partition, and a value that is not one is the event's error",
          "[mapper][router]") {
  Router r("table.fields.additional.placement=shard:partition,type:header:eventType\n");
  REQUIRE_FALSE(r.map(r.event("Order", R"(,"shard":3)")));
  CHECK(r.rec.partition == 3);
  REQUIRE(r.rec.headers.size() == 2);  // the partition is no header
  REQUIRE_FALSE(r.map(r.event("Order", R"(,"shard":null)")));
  CHECK(r.rec.partition == -1);  // NULL: by key
  auto e = r.map(r.event("Order", R"(,"shard":-1)"));
  REQUIRE(e);
  CHECK(e->reason == "bad_partition");
  e = r.map(r.event("Order", R"(,"shard":"two")"));
  REQUIRE(e);
  CHECK(e->reason == "bad_partition");
  CHECK_THROWS_WITH(config_with("table.fields.additional.placement=a:partition,b:partition\n"),
                    Catch::Contains("one partition"));
  CHECK_THROWS_WITH(config_with("table.fields.additional.placement=a:value\n"), Catch::Contains("not one of"));
}

TEST_CASE("router: envelope placements, table.expand.json.payload and the converters write what Kafka Connect's "
          "converters would",
          "[mapper][router]") {
  SECTION("StringConverter: the payload as stored (the default)") {
    Router r("");
    REQUIRE_FALSE(r.map(r.event("Order")));
    CHECK(r.value() == R"({"total": 12, "items": [1, 2]})");
    CHECK(r.rec.key == std::optional<std::string_view>("order-42"));
  }
  SECTION("table.expand.json.payload: compact JSON, as JsonConverter writes an expanded payload") {
    Router r("table.expand.json.payload=true\n");
    REQUIRE_FALSE(r.map(r.event("Order")));
    CHECK(r.value() == R"({"total":12,"items":[1,2]})");
    REQUIRE_FALSE(r.map(r.event("Order", "", R"("not json")")));
    CHECK(r.value() == "not json");  // not JSON: stays the string
  }
  SECTION("JsonConverter, schemas.enable=false: a string payload is a JSON string, the key too") {
    Router r("value.converter=org.apache.kafka.connect.json.JsonConverter\nvalue.converter.schemas.enable=false\n"
             "key.converter=org.apache.kafka.connect.json.JsonConverter\nkey.converter.schemas.enable=false\n");
    REQUIRE_FALSE(r.map(r.event("Order")));
    CHECK(r.value() == R"("{\"total\": 12, \"items\": [1, 2]}")");
    CHECK(r.rec.key == std::optional<std::string_view>(R"("order-42")"));
    REQUIRE_FALSE(r.map(r.event("Order", "", "null")));
    CHECK(r.value() == "<tombstone>");
  }
  SECTION("JsonConverter with an expanded payload: the JSON itself") {
    Router r("value.converter=org.apache.kafka.connect.json.JsonConverter\nvalue.converter.schemas.enable=false\n"
             "table.expand.json.payload=true\n");
    REQUIRE_FALSE(r.map(r.event("Order")));
    CHECK(r.value() == R"({"total":12,"items":[1,2]})");
  }
  SECTION("envelope placements: {\"payload\": ..., alias: ...}") {
    Router r("table.fields.additional.placement=type:envelope:eventType,version:envelope,tenant:envelope\n"
             "table.expand.json.payload=true\n");
    REQUIRE_FALSE(r.map(r.event("Order", R"(,"version":3)")));
    CHECK(r.value() == R"({"payload":{"total":12,"items":[1,2]},"eventType":"OrderCreated","version":3,"tenant":null})");
    Router s("table.fields.additional.placement=type:envelope:eventType\n");
    REQUIRE_FALSE(s.map(s.event("Order", "", R"("text \"payload\"")")));
    CHECK(s.value() == R"({"payload":"text \"payload\"","eventType":"OrderCreated"})");
  }
  SECTION("converters Connect names that walrelay does not write are refused, and so is a schema envelope") {
    CHECK_THROWS_WITH(config_with("value.converter=io.confluent.connect.avro.AvroConverter\n"),
                      Catch::Contains("value.converter"));
    CHECK_THROWS_WITH(config_with("value.converter=org.apache.kafka.connect.json.JsonConverter\n"),
                      Catch::Contains("value.converter.schemas.enable"));
    CHECK_THROWS_WITH(config_with("value.converter=org.apache.kafka.connect.json.JsonConverter\n"
                                  "value.converter.schemas.enable=true\n"),
                      Catch::Contains("only false"));
    CHECK_NOTHROW(config_with("value.converter=org.apache.kafka.connect.converters.ByteArrayConverter\n"));
  }
}
