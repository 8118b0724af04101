// The tableless outbox: a logical message's JSON content mapped with the
// same table.field.event.* names and rules as an outbox row.
#include <catch2/catch.hpp>

#include <cstring>
#include <optional>

#include "walrelay/config.hpp"
#include "walrelay/route/outbox_mapper.hpp"

using namespace walrelay;

namespace {

// A transactional message as the decoder hands it over; the content's
// bytes live in `content`.
struct Message {
  std::string content;
  pgoutput::LogicalMessage msg{};
  explicit Message(std::string text, bool transactional = true) : content(std::move(text)) {
    msg.flags = transactional ? 1 : 0;
    msg.lsn = pgoutput::Lsn{0x16B374D848ULL};
    msg.prefix = "outbox";
    msg.content = pgoutput::Bytes(reinterpret_cast<const std::byte*>(content.data()), content.size());
  }
};

Config messages_config(const std::string& extra = "") {
  return parse_config("kafka.bootstrap.servers=x:1\nmessage.prefix.include.list=outbox\n" + extra, "t", {});
}

std::optional<std::string> header(const OutboxRecord& r, std::string_view name) {
  for (auto& h : r.headers)
    if (h.name == name) return h.value ? std::optional<std::string>(*h.value) : std::nullopt;
  return std::nullopt;
}

}  // namespace

TEST_CASE("messages: the content's members are the outbox row's columns, routed and keyed as Debezium routes rows",
          "[mapper][message]") {
  Config cfg = messages_config();
  CHECK(cfg.table_include_list.empty());  // messages only unless a table is named
  OutboxMapper m(cfg);
  Message in(R"({"id":"6f1c0b4e-1c7e-4b7e-9a3e-2d9b1f6d0a11","aggregatetype":"Order","aggregateid":"order-42",)"
             R"("type":"OrderCreated","payload":{"total": 12, "items":[1,2]}})");
  OutboxRecord rec;
  REQUIRE_FALSE(m.map_message(in.msg, 0, 3, rec));
  CHECK(rec.topic == "outbox.event.Order");
  CHECK(rec.key == std::optional<std::string_view>("order-42"));
  // An object payload is its JSON text as written, byte for byte.
  CHECK(rec.value == std::optional<std::string_view>(R"({"total": 12, "items":[1,2]})"));
  CHECK(rec.table_index == 3);
  CHECK(rec.timestamp_ms == 946684800000LL);  // commit time 0 = 2000-01-01
  REQUIRE(rec.headers.size() == 1);
  CHECK(header(rec, "id") == "6f1c0b4e-1c7e-4b7e-9a3e-2d9b1f6d0a11");
}

TEST_CASE("messages: strings are their characters, numbers their JSON text, null a tombstone", "[mapper][message]") {
  Config cfg = messages_config(
      "table.field.event.timestamp=ts\ntable.fields.additional.placement=type:header:eventType,tenant:header,"
      "version:header\n");
  OutboxMapper m(cfg);
  OutboxRecord rec;
  SECTION("a string payload with escapes, numeric id and key, ISO timestamp with Z") {
    Message in(R"({"id":17,"aggregatetype":"Order","aggregateid":42,"type":"Shipped",)"
               R"("payload":"line\none \"quoted\" \u00e9","ts":"2026-11-30T04:51:07.500Z","version":3})");
    REQUIRE_FALSE(m.map_message(in.msg, 0, 0, rec));
    CHECK(rec.value == std::optional<std::string_view>("line\none \"quoted\" \xc3\xa9"));
    CHECK(rec.key == std::optional<std::string_view>("42"));
    CHECK(header(rec, "id") == "17");
    CHECK(rec.timestamp_ms == 1796014267500LL);
    CHECK(header(rec, "eventType") == "Shipped");
    CHECK(header(rec, "version") == "3");
    // A placed member that is absent is a null header, as a NULL column is.
    bool tenant_present = false;
    for (auto& h : rec.headers)
      if (h.name == "tenant") tenant_present = !h.value.has_value();
    CHECK(tenant_present);
  }
  SECTION("epoch milliseconds and a null payload") {
    Message in(R"({"id":"a","aggregatetype":"Order","aggregateid":"k","payload":null,"ts":1796014267500})");
    REQUIRE_FALSE(m.map_message(in.msg, 0, 0, rec));
    CHECK_FALSE(rec.value.has_value());
    CHECK(rec.timestamp_ms == 1796014267500LL);
  }
}

TEST_CASE("messages: content that cannot be mapped says what and why", "[mapper][message]") {
  Config cfg = messages_config("table.field.event.timestamp=ts\n");
  OutboxMapper m(cfg);
  OutboxRecord rec;
  auto error_of = [&](const std::string& content) {
    Message in(content);
    auto e = m.map_message(in.msg, 0, 0, rec);
    REQUIRE(e);
    return *e;
  };
  auto e = error_of("not json");
  CHECK(e.reason == "bad_content");
  e = error_of(R"(["an","array"])");
  CHECK(e.reason == "bad_content");
  CHECK_THAT(e.message, Catch::Contains("not a JSON object"));
  e = error_of(R"({"aggregatetype":"Order","aggregateid":"k","payload":{},"ts":1})");
  CHECK(e.reason == "missing_column");
  CHECK_THAT(e.message, Catch::Contains("\"id\""));
  e = error_of(R"({"id":"1","aggregatetype":"Order","aggregateid":null,"payload":{},"ts":1})");
  CHECK(e.reason == "null_value");
  CHECK_THAT(e.message, Catch::Contains("\"aggregateid\""));
  e = error_of(R"({"id":"1","aggregatetype":"Order","aggregateid":"k","ts":1})");
  CHECK(e.reason == "missing_column");
  CHECK_THAT(e.message, Catch::Contains("payload"));
  e = error_of(R"({"id":"1","aggregatetype":"bad topic!","aggregateid":"k","payload":{},"ts":1})");
  CHECK(e.reason == "invalid_topic");
  e = error_of(R"({"id":"1","aggregatetype":"","aggregateid":"k","payload":{},"ts":1})");
  CHECK(e.reason == "empty_route");
  e = error_of(R"({"id":"1","aggregatetype":"Order","aggregateid":"k","payload":{},"ts":"yesterday"})");
  CHECK(e.reason == "bad_timestamp");
  e = error_of(R"({"id":"1","aggregatetype":"Order","aggregateid":"k","payload":{"open":)");
  CHECK(e.reason == "bad_content");
}

TEST_CASE("messages: message.prefix.include.list takes regular expressions, and no table then unless named",
          "[config][message]") {
  auto cfg = parse_config("kafka.bootstrap.servers=x:1\nmessage.prefix.include.list=outbox,orders\\..*\n", "t", {});
  CHECK(cfg.message_prefix_include_list == std::vector<std::string>{"outbox", "orders\\..*"});
  CHECK(cfg.table_include_list.empty());
  auto both = parse_config(
      "kafka.bootstrap.servers=x:1\nmessage.prefix.include.list=outbox\ntable.include.list=public.outbox\n", "t", {});
  CHECK(both.table_include_list.size() == 1);
  CHECK_THROWS_WITH(parse_config("kafka.bootstrap.servers=x:1\nmessage.prefix.include.list=(unclosed\n", "t", {}),
                    Catch::Contains("message.prefix.include.list") && Catch::Contains("regular expression"));
  CHECK_THROWS_WITH(parse_config("kafka.bootstrap.servers=x:1\ntable.include.list=\n", "t", {}),
                    Catch::Contains("table.include.list"));
}
