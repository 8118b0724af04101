#include <catch2/catch.hpp>

#include <cstring>
#include <optional>

#include "walrelay/route/outbox_mapper.hpp"

using namespace walrelay;

namespace {

// Builds pgoutput messages byte by byte, as the walsender writes them.
struct Writer {
  std::vector<std::byte> b;
  Writer& u8(std::uint8_t v) { b.push_back(std::byte{v}); return *this; }
  Writer& u16(std::uint16_t v) { return u8(v >> 8).u8(v & 0xff); }
  Writer& u32(std::uint32_t v) { return u16(v >> 16).u16(v & 0xffff); }
  Writer& str(std::string_view s) {
    for (char c : s) u8(static_cast<std::uint8_t>(c));
    return u8(0);
  }
  Writer& raw(std::string_view s) {
    for (char c : s) u8(static_cast<std::uint8_t>(c));
    return *this;
  }
};

struct Col { std::string name; std::uint32_t type; };
using Val = std::optional<std::string>;

std::vector<std::byte> relation(std::uint32_t oid, std::string ns, std::string rel, const std::vector<Col>& cols) {
  Writer w;
  w.u8('R').u32(oid).str(ns).str(rel).u8('d').u16(static_cast<std::uint16_t>(cols.size()));
  for (auto& c : cols) w.u8(0).str(c.name).u32(c.type).u32(0xffffffff);
  return w.b;
}

std::vector<std::byte> insert(std::uint32_t oid, const std::vector<Val>& vals, char kind = 't') {
  Writer w;
  w.u8('I').u32(oid).u8('N').u16(static_cast<std::uint16_t>(vals.size()));
  for (auto& v : vals) {
    if (!v) { w.u8('n'); continue; }
    w.u8(static_cast<std::uint8_t>(kind)).u32(static_cast<std::uint32_t>(v->size())).raw(*v);
  }
  return w.b;
}

template <class T>
T decode_as(const std::vector<std::byte>& bytes) {
  auto r = pgoutput::decode(bytes, pgoutput::DecodeContext{});
  REQUIRE(r.has_value());
  return std::get<T>(r.value());
}

const std::vector<Col> outbox_cols = {{"id", pgtype::uuid},          {"aggregatetype", pgtype::text},
                                      {"aggregateid", pgtype::text}, {"type", pgtype::text},
                                      {"payload", pgtype::jsonb},    {"created_at", pgtype::timestamptz}};

Config base_config() {
  return parse_config("kafka.bootstrap.servers=x:1\n", "t", {});
}

}  // namespace

TEST_CASE("mapper: Debezium's routing and key from a default outbox row", "[mapper]") {
  Config cfg = base_config();
  OutboxMapper m(cfg);
  auto rel_bytes = relation(1234, "public", "outbox", outbox_cols);
  CHECK(m.on_relation(decode_as<pgoutput::Relation>(rel_bytes)));
  CHECK(m.is_outbox(1234));
  auto ins_bytes = insert(1234, {"6f1c0b4e-1c7e-4b7e-9a3e-2d9b1f6d0a11", "Order", "order-42", "OrderCreated",
                                 R"({"total": 12})", "2026-11-30 04:51:07.123456+00"});
  OutboxRecord rec;
  auto err = m.map(decode_as<pgoutput::Insert>(ins_bytes), 0, rec);
  REQUIRE_FALSE(err);
  CHECK(rec.topic == "outbox.event.Order");
  CHECK(rec.key == std::optional<std::string_view>("order-42"));
  CHECK(rec.value == std::optional<std::string_view>(R"({"total": 12})"));
  REQUIRE(rec.headers.size() == 1);
  CHECK(rec.headers[0].name == "id");
  CHECK(rec.headers[0].value == std::optional<std::string_view>("6f1c0b4e-1c7e-4b7e-9a3e-2d9b1f6d0a11"));
  CHECK(rec.timestamp_ms == 946684800000LL);  // commit time 0 = 2000-01-01
}

TEST_CASE("mapper: timestamp column, additional headers, constant topic, tombstones", "[mapper]") {
  Config cfg = parse_config(
      "kafka.bootstrap.servers=x:1\ntable.field.event.timestamp=created_at\n"
      "table.fields.additional.placement=type:header:eventType,aggregatetype:header\n"
      "route.topic.replacement=all-events\nroute.tombstone.on.empty.payload=true\n",
      "t", {});
  OutboxMapper m(cfg);
  auto rel_bytes = relation(7, "public", "outbox", outbox_cols);
  m.on_relation(decode_as<pgoutput::Relation>(rel_bytes));
  OutboxRecord rec;
  auto ins = insert(7, {"id-1", "Order", "k", "Shipped", "", "2026-11-30 04:51:07.5+05:30"});
  REQUIRE_FALSE(m.map(decode_as<pgoutput::Insert>(ins), 0, rec));
  CHECK(rec.topic == "all-events");
  CHECK_FALSE(rec.value.has_value());  // empty payload -> tombstone
  // 2026-11-30 04:51:07.5 at +05:30 = 2026-11-29 23:21:07.5 UTC
  CHECK(rec.timestamp_ms == 1795994467500LL);
  REQUIRE(rec.headers.size() == 3);
  CHECK(rec.headers[1].name == "eventType");
  CHECK(rec.headers[1].value == std::optional<std::string_view>("Shipped"));
  CHECK(rec.headers[2].name == "aggregatetype");
}

TEST_CASE("mapper: bytea payloads are relayed as raw bytes", "[mapper]") {
  Config cfg = base_config();
  OutboxMapper m(cfg);
  auto cols = outbox_cols;
  cols[4].type = pgtype::bytea;
  auto rel_bytes = relation(8, "public", "outbox", cols);
  m.on_relation(decode_as<pgoutput::Relation>(rel_bytes));
  OutboxRecord rec;
  auto ins = insert(8, {"1", "A", "k", "t", "\\x00ff41", "2026-01-01 00:00:00+00"});
  REQUIRE_FALSE(m.map(decode_as<pgoutput::Insert>(ins), 0, rec));
  REQUIRE(rec.value);
  CHECK(rec.value->size() == 3);
  CHECK(std::memcmp(rec.value->data(), "\x00\xff" "A", 3) == 0);

  // Upper-case digits are hex too; anything else, a sign or a space, is not.
  auto upper = insert(8, {"1", "A", "k", "t", "\\xFFaB", "2026-01-01 00:00:00+00"});
  REQUIRE_FALSE(m.map(decode_as<pgoutput::Insert>(upper), 0, rec));
  CHECK(rec.value == std::optional<std::string_view>("\xff\xab"));
  for (const char* bad : {"\\x0g", "\\x+1", "\\x-1", "\\x 1", "\\x1", "x00", "\\X00"}) {
    INFO(bad);
    auto row = insert(8, {"1", "A", "k", "t", bad, "2026-01-01 00:00:00+00"});
    auto e = m.map(decode_as<pgoutput::Insert>(row), 0, rec);
    REQUIRE(e);
    CHECK(e->reason == "bad_value");
  }
}

TEST_CASE("mapper: a bytea payload under JsonConverter or in an envelope is base64, as Connect writes bytes",
          "[mapper][router]") {
  auto cols = outbox_cols;
  cols[4].type = pgtype::bytea;
  auto rel_bytes = relation(8, "public", "outbox", cols);
  auto ins = insert(8, {"1", "A", "k", "Created", "\\x00ff41", "2026-01-01 00:00:00+00"});
  SECTION("JsonConverter") {
    Config cfg = parse_config("kafka.bootstrap.servers=x:1\nvalue.converter=org.apache.kafka.connect.json.JsonConverter\n"
                              "value.converter.schemas.enable=false\ntable.expand.json.payload=true\n",
                              "t", {});
    OutboxMapper m(cfg);
    m.on_relation(decode_as<pgoutput::Relation>(rel_bytes));
    OutboxRecord rec;
    REQUIRE_FALSE(m.map(decode_as<pgoutput::Insert>(ins), 0, rec));
    CHECK(rec.value == std::optional<std::string_view>("\"AP9B\""));  // base64 of 00 ff 41
  }
  SECTION("an envelope") {
    Config cfg = parse_config("kafka.bootstrap.servers=x:1\ntable.fields.additional.placement=type:envelope\n", "t", {});
    OutboxMapper m(cfg);
    m.on_relation(decode_as<pgoutput::Relation>(rel_bytes));
    OutboxRecord rec;
    REQUIRE_FALSE(m.map(decode_as<pgoutput::Insert>(ins), 0, rec));
    CHECK(rec.value == std::optional<std::string_view>(R"({"payload":"AP9B","type":"Created"})"));
  }
  SECTION("StringConverter: the bytes as they are") {
    Config cfg = base_config();
    OutboxMapper m(cfg);
    m.on_relation(decode_as<pgoutput::Relation>(rel_bytes));
    OutboxRecord rec;
    REQUIRE_FALSE(m.map(decode_as<pgoutput::Insert>(ins), 0, rec));
    CHECK(rec.value == std::optional<std::string_view>(std::string_view("\x00\xff" "A", 3)));
  }
}

TEST_CASE("mapper: rows that cannot be mapped say why", "[mapper]") {
  Config cfg = base_config();
  OutboxMapper m(cfg);
  auto rel_bytes = relation(9, "public", "outbox", outbox_cols);
  m.on_relation(decode_as<pgoutput::Relation>(rel_bytes));
  OutboxRecord rec;
  auto null_key = insert(9, {"1", "A", std::nullopt, "t", "{}", "2026-01-01 00:00:00+00"});
  auto e = m.map(decode_as<pgoutput::Insert>(null_key), 0, rec);
  REQUIRE(e);
  CHECK(e->reason == "null_value");
  CHECK(e->message.find("aggregateid") != std::string::npos);

  auto null_route = insert(9, {"1", std::nullopt, "k", "t", "{}", "2026-01-01 00:00:00+00"});
  e = m.map(decode_as<pgoutput::Insert>(null_route), 0, rec);
  REQUIRE(e);
  CHECK(e->message.find("aggregatetype") != std::string::npos);

  // A table without the payload column.
  auto other = relation(10, "public", "outbox", {{"id", pgtype::int8}, {"aggregatetype", pgtype::text},
                                                 {"aggregateid", pgtype::text}});
  m.on_relation(decode_as<pgoutput::Relation>(other));
  auto row = insert(10, {"1", "A", "k"});
  e = m.map(decode_as<pgoutput::Insert>(row), 0, rec);
  REQUIRE(e);
  CHECK(e->reason == "missing_column");
  CHECK(e->message.find("payload") != std::string::npos);
  CHECK(m.row_json(decode_as<pgoutput::Insert>(row)) == R"({"id":"1","aggregatetype":"A","aggregateid":"k"})");
}

TEST_CASE("mapper: a route value that makes an illegal Kafka topic is the row's mapping error", "[mapper]") {
  Config cfg = base_config();
  OutboxMapper m(cfg);
  m.on_relation(decode_as<pgoutput::Relation>(relation(9, "public", "outbox", outbox_cols)));
  OutboxRecord rec;
  auto map_route = [&](const std::string& route) {
    auto row = insert(9, {"1", route, "k", "t", "{}", "2026-01-01 00:00:00+00"});
    return m.map(decode_as<pgoutput::Insert>(row), 0, rec);
  };
  CHECK_FALSE(map_route("Order_v2.eu-west"));
  CHECK(rec.topic == "outbox.event.Order_v2.eu-west");
  for (std::string bad : {std::string("bad topic"), std::string("a/b"), std::string("Ordér"), std::string(240, 'x'),
                          std::string("line\nbreak")}) {
    INFO(bad);
    auto e = map_route(bad);
    REQUIRE(e);
    CHECK(e->reason == "invalid_topic");
    CHECK(e->message.find("illegal Kafka topic name") != std::string::npos);
    CHECK(e->message.find('\n') == std::string::npos);  // row data never breaks a log line
  }
  CHECK(illegal_topic_reason(".."));
  CHECK(illegal_topic_reason(""));
  CHECK(illegal_topic_reason("a\x7f") == std::optional<std::string>("it contains the byte 0x7f"));
  CHECK(illegal_topic_reason("a\nb") == std::optional<std::string>("it contains the byte 0x0a"));
  CHECK_FALSE(illegal_topic_reason(std::string(249, 'a')));
  CHECK(illegal_topic_reason(std::string(250, 'a')));
}

TEST_CASE("mapper: ALTER TABLE mid-stream: a new Relation message remaps columns", "[mapper]") {
  Config cfg = base_config();
  OutboxMapper m(cfg);
  auto r1 = relation(11, "public", "outbox", outbox_cols);
  m.on_relation(decode_as<pgoutput::Relation>(r1));
  auto cols = outbox_cols;
  cols.insert(cols.begin(), Col{"tenant", pgtype::text});  // position shifts
  auto r2 = relation(11, "public", "outbox", cols);
  m.on_relation(decode_as<pgoutput::Relation>(r2));
  OutboxRecord rec;
  auto ins = insert(11, {"t1", "id-9", "Cart", "c-1", "x", "{}", "2026-01-01 00:00:00+00"});
  REQUIRE_FALSE(m.map(decode_as<pgoutput::Insert>(ins), 0, rec));
  CHECK(rec.topic == "outbox.event.Cart");
  CHECK(rec.key == std::optional<std::string_view>("c-1"));
}

TEST_CASE("mapper: binary mode gives PostgreSQL's text forms", "[mapper]") {
  Config cfg = base_config();
  OutboxMapper m(cfg);
  std::vector<Col> cols = {{"id", pgtype::int8}, {"aggregatetype", pgtype::text}, {"aggregateid", pgtype::uuid},
                           {"type", pgtype::text}, {"payload", pgtype::jsonb}};
  auto r = relation(12, "public", "outbox", cols);
  m.on_relation(decode_as<pgoutput::Relation>(r));
  std::string id("\x00\x00\x00\x00\x00\x00\x01\x02", 8);
  std::string uuid("\x6f\x1c\x0b\x4e\x1c\x7e\x4b\x7e\x9a\x3e\x2d\x9b\x1f\x6d\x0a\x11", 16);
  std::string jsonb = std::string("\x01", 1) + R"({"a": 1})";
  auto ins = insert(12, {id, "Order", uuid, "t", jsonb}, 'b');
  OutboxRecord rec;
  REQUIRE_FALSE(m.map(decode_as<pgoutput::Insert>(ins), 0, rec));
  CHECK(rec.headers[0].value == std::optional<std::string_view>("258"));
  CHECK(rec.key == std::optional<std::string_view>("6f1c0b4e-1c7e-4b7e-9a3e-2d9b1f6d0a11"));
  CHECK(rec.value == std::optional<std::string_view>(R"({"a": 1})"));
}

TEST_CASE("mapper: tables outside table.include.list are not outbox tables", "[mapper]") {
  Config cfg = base_config();
  OutboxMapper m(cfg);
  auto r = relation(13, "public", "orders", outbox_cols);
  CHECK_FALSE(m.on_relation(decode_as<pgoutput::Relation>(r)));
  CHECK_FALSE(m.is_outbox(13));
  auto other_schema = relation(14, "app", "outbox", outbox_cols);
  CHECK_FALSE(m.on_relation(decode_as<pgoutput::Relation>(other_schema)));
}

TEST_CASE("mapper: binary mode integers, bool, oid and timestamps", "[mapper]") {
  Config cfg = parse_config(
      "kafka.bootstrap.servers=x:1\ntable.field.event.timestamp=created_at\n"
      "table.fields.additional.placement=flag:header,o:header,small:header\n",
      "t", {});
  OutboxMapper m(cfg);
  std::vector<Col> cols = {{"id", pgtype::int4},         {"aggregatetype", pgtype::text},
                           {"aggregateid", pgtype::int8}, {"type", pgtype::text},
                           {"payload", pgtype::jsonb},    {"created_at", pgtype::timestamptz},
                           {"flag", pgtype::bool_},       {"o", pgtype::oid},
                           {"small", pgtype::int2}};
  m.on_relation(decode_as<pgoutput::Relation>(relation(15, "public", "outbox", cols)));
  auto row = [](std::string id, std::string created_at) -> std::vector<Val> {
    return {id, "Order", std::string("\xff\xff\xff\xff\xff\xff\xff\xfe", 8), "t", std::string("\x01{}", 3), created_at,
            std::string("\x02", 1), std::string("\xff\xff\xff\xff", 4), std::string("\x80\x00", 2)};
  };
  // 2024-01-02 03:04:05.123456+00 as sent: microseconds since 2000-01-01.
  const std::string created_at("\x00\x02\xb0\xec\x85\x17\xd5\x80", 8);
  OutboxRecord rec;
  REQUIRE_FALSE(m.map(decode_as<pgoutput::Insert>(insert(15, row(std::string("\xff\xff\xff\xfd", 4), created_at), 'b')),
                      0, rec));
  CHECK(rec.headers[0].value == std::optional<std::string_view>("-3"));  // the id header
  CHECK(rec.key == std::optional<std::string_view>("-2"));
  CHECK(rec.timestamp_ms == 1704164645123LL);
  REQUIRE(rec.headers.size() == 4);
  CHECK(rec.headers[1].value == std::optional<std::string_view>("t"));
  CHECK(rec.headers[2].value == std::optional<std::string_view>("4294967295"));
  CHECK(rec.headers[3].value == std::optional<std::string_view>("-32768"));

  // A value of the wrong length for its type is refused, not read past.
  auto e = m.map(decode_as<pgoutput::Insert>(insert(15, row(std::string("\x00\x01", 2), created_at), 'b')), 0, rec);
  REQUIRE(e);
  CHECK(e->reason == "unsupported_type");
  e = m.map(decode_as<pgoutput::Insert>(insert(15, row(std::string("\x00\x00\x00\x01", 4), "short"), 'b')), 0, rec);
  REQUIRE(e);
  CHECK(e->reason == "bad_timestamp");
}

TEST_CASE("mapper: text timestamps, with and without zone, and impossible dates", "[mapper]") {
  Config cfg = parse_config("kafka.bootstrap.servers=x:1\ntable.field.event.timestamp=created_at\n", "t", {});
  OutboxMapper m(cfg);
  m.on_relation(decode_as<pgoutput::Relation>(relation(16, "public", "outbox", outbox_cols)));
  auto map_at = [&](const std::string& created_at, OutboxRecord& rec) {
    return m.map(decode_as<pgoutput::Insert>(insert(16, {"1", "A", "k", "t", "{}", created_at})), 0, rec);
  };
  OutboxRecord rec;
  REQUIRE_FALSE(map_at("2024-02-29 23:59:59.9995+00", rec));
  CHECK(rec.timestamp_ms == 1709251199999LL);
  REQUIRE_FALSE(map_at("2024-03-01T05:30:00-05:30:15", rec));
  CHECK(rec.timestamp_ms == 1709290815000LL);
  REQUIRE_FALSE(map_at("1969-12-31 23:59:59.9995", rec));
  CHECK(rec.timestamp_ms == -1);
  REQUIRE_FALSE(map_at("2000-01-01 00:00:00+00", rec));
  CHECK(rec.timestamp_ms == 946684800000LL);
  for (const char* bad : {"2023-02-29 00:00:00+00", "2024-13-01 00:00:00+00", "2024-04-31 00:00:00+00",
                          "2024-01-01 00:00:00 BC", "2024-01-01", "infinity"}) {
    INFO(bad);
    auto e = map_at(bad, rec);
    REQUIRE(e);
    CHECK(e->reason == "bad_timestamp");
  }
}

TEST_CASE("mapper: row_json keeps its shape and always makes valid JSON", "[mapper]") {
  Config cfg = base_config();
  OutboxMapper m(cfg);
  std::vector<Col> cols = {{"id", pgtype::text}, {"say \"hi\"", pgtype::text}, {"n", pgtype::text}};
  m.on_relation(decode_as<pgoutput::Relation>(relation(17, "public", "outbox", cols)));
  // Escapes as JSON needs, '/' and valid UTF-8 (é, an emoji) as they are.
  auto row = insert(17, {"a/b", "q\"b\\s\n\r\t\x01\x1f caf\xC3\xA9 \xF0\x9F\x98\x80", std::nullopt});
  CHECK(m.row_json(decode_as<pgoutput::Insert>(row)) ==
        "{\"id\":\"a/b\",\"say \\\"hi\\\"\":\"q\\\"b\\\\s\\n\\r\\t\\u0001\\u001f caf\xC3\xA9 \xF0\x9F\x98\x80\","
        "\"n\":null}");
  // Invalid UTF-8 (a lone byte, a truncated sequence) becomes U+FFFD.
  auto bad = insert(17, {"bad \xFF byte", "cut \xE2\x82", "ok"});
  CHECK(m.row_json(decode_as<pgoutput::Insert>(bad)) ==
        "{\"id\":\"bad \xEF\xBF\xBD byte\",\"say \\\"hi\\\"\":\"cut \xEF\xBF\xBD\",\"n\":\"ok\"}");
  // Binary columns as bytea's hex text form.
  auto bin = insert(17, {std::string("\x00\xff", 2), "", std::nullopt}, 'b');
  CHECK(m.row_json(decode_as<pgoutput::Insert>(bin)) == R"({"id":"\\x00ff","say \"hi\"":"\\x","n":null})");
  // A relation never described: columns by position.
  auto unknown = insert(99, {"1", std::nullopt});
  CHECK(m.row_json(decode_as<pgoutput::Insert>(unknown)) == R"({"column0":"1","column1":null})");
  // More columns than the Relation named: the extra one's made-up name does
  // not overwrite a real column of that name.
  std::vector<Col> named = {{"column1", pgtype::text}};
  m.on_relation(decode_as<pgoutput::Relation>(relation(18, "public", "outbox", named)));
  auto longer = insert(18, {"a", "b"});
  CHECK(m.row_json(decode_as<pgoutput::Insert>(longer)) == R"({"column1":"a","_column1":"b"})");
}
