// The schema-registry codecs, byte for byte against the formats' specs:
// Avro's binary encoding, Confluent's framing, Protobuf's wire format.
#include <catch2/catch.hpp>

#include "walrelay/route/schema_registry.hpp"

using namespace walrelay;

namespace {

RegisteredSchema schema(std::string type, std::string text, int id = 7) {
  RegisteredSchema s;
  s.id = id;
  s.version = 1;
  s.subject = "orders-value";
  s.type = std::move(type);
  s.text = std::move(text);
  return s;
}

std::string hex(std::string_view bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string encode_ok(SchemaCodec& codec, std::string_view json) {
  std::string out;
  auto error = codec.encode(json, out);
  INFO((error ? error->message : std::string()));
  REQUIRE_FALSE(error);
  return out;
}

const char* order_avsc = R"({
  "type": "record", "name": "Order", "namespace": "com.acme",
  "fields": [
    {"name": "id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}, "default": "NEW"},
    {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line",
        "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}, "default": []},
    {"name": "tags", "type": {"type": "map", "values": "string"}, "default": {}}
  ]})";

}  // namespace

TEST_CASE("Confluent's frame is magic byte 0 and the schema id big-endian, Protobuf adds the index path [0]",
          "[schema_registry]") {
  CHECK(hex(wire_prefix(RegistryFormat::avro, 0x01020304)) == "0001020304");
  CHECK(hex(wire_prefix(RegistryFormat::json_schema, 5)) == "0000000005");
  CHECK(hex(wire_prefix(RegistryFormat::protobuf, 5)) == "000000000500");
}

TEST_CASE("Avro: an application's JSON becomes Avro's binary encoding, defaults filled", "[schema_registry]") {
  auto codec = make_schema_codec(RegistryFormat::avro, schema("AVRO", order_avsc));
  // id 1 -> zigzag 02; "ab" -> 04 61 62; 1.5 -> little-endian double;
  // note absent -> union branch 0 (null) -> 00; status default NEW -> 00;
  // lines absent -> empty array 00; tags absent -> empty map 00.
  CHECK(hex(encode_ok(*codec, R"({"id": 1, "customer": "ab", "amount": 1.5})")) ==
        "02" "046162" "000000000000f83f" "00" "00" "00" "00");
  // The union's string branch (index 1), an enum symbol, an array block of
  // one record, a map block of one entry.
  CHECK(hex(encode_ok(*codec, R"({"id": -1, "customer": "", "amount": 0, "note": "x", "status": "PAID",
                                  "lines": [{"sku": "s", "qty": 3}], "tags": {"k": "v"}})")) ==
        "01" "00" "0000000000000000" "02" "0278" "02" "02" "0273" "06" "00" "02" "026b" "0276" "00");
  // Avro's own JSON form of a union is taken too.
  CHECK(hex(encode_ok(*codec, R"({"id": 1, "customer": "ab", "amount": 1.5, "note": {"string": "x"}})")) ==
        "02" "046162" "000000000000f83f" "020278" "00" "00" "00");
}

TEST_CASE("Avro: a payload that does not fit names the field and why", "[schema_registry]") {
  auto codec = make_schema_codec(RegistryFormat::avro, schema("AVRO", order_avsc));
  auto error_of = [&](std::string_view json) {
    std::string out;
    auto e = codec->encode(json, out);
    REQUIRE(e);
    return *e;
  };
  auto e = error_of(R"({"id": "one", "customer": "a", "amount": 1})");
  CHECK(e.reason == "schema_mismatch");
  CHECK_THAT(e.message, Catch::Contains("/id") && Catch::Contains("expected an integer (long), got a string"));
  CHECK_THAT(error_of(R"({"customer": "a", "amount": 1})").message,
             Catch::Contains("/id") && Catch::Contains("missing and the schema gives it no default"));
  CHECK_THAT(error_of(R"({"id": 1, "customer": "a", "amount": 1, "colour": "red"})").message,
             Catch::Contains("/colour") && Catch::Contains("no such field"));
  CHECK_THAT(error_of(R"({"id": 1, "customer": "a", "amount": 1, "status": "LOST"})").message,
             Catch::Contains("/status") && Catch::Contains("not a symbol of enum com.acme.Status"));
  CHECK_THAT(error_of(R"({"id": 1, "customer": "a", "amount": 1, "lines": [{"sku": "s", "qty": 9999999999}]})").message,
             Catch::Contains("/lines/0/qty") && Catch::Contains("does not fit an int"));
  CHECK_THAT(error_of(R"({"id": 1, "customer": "a", "amount": 1, "note": 5})").message,
             Catch::Contains("/note") && Catch::Contains("fits none of the union's types (null, string)"));
  CHECK(error_of("not json").reason == "bad_content");
}

TEST_CASE("Avro: a schema avro-c cannot read, or of another format, is the registry's problem, not a record's",
          "[schema_registry]") {
  CHECK_THROWS_WITH(make_schema_codec(RegistryFormat::avro, schema("AVRO", R"({"type": "recrd"})")),
                    Catch::Contains("not an Avro schema"));
  CHECK_THROWS_WITH(make_schema_codec(RegistryFormat::avro, schema("JSON", R"({"type": "object"})")),
                    Catch::Contains("holds a JSON schema") && Catch::Contains("AvroConverter encodes AVRO"));
  auto with_refs = schema("AVRO", order_avsc);
  with_refs.references = 1;
  CHECK_THROWS_WITH(make_schema_codec(RegistryFormat::avro, with_refs), Catch::Contains("refers to other schemas"));
}

TEST_CASE("JSON Schema: a valid payload goes as written, an invalid one names where", "[schema_registry]") {
  auto codec = make_schema_codec(RegistryFormat::json_schema, schema("JSON", R"({
    "type": "object", "required": ["id", "amount"], "additionalProperties": false,
    "properties": {"id": {"type": "integer"}, "amount": {"type": "number", "minimum": 0},
                   "lines": {"type": "array", "items": {"type": "object", "properties": {"qty": {"type": "integer"}}}}}
  })"));
  CHECK(encode_ok(*codec, R"({"id":1,"amount":2.5})") == R"({"id":1,"amount":2.5})");
  std::string out;
  auto e = codec->encode(R"({"id":1,"amount":-1})", out);
  REQUIRE(e);
  CHECK(e->reason == "schema_mismatch");
  CHECK_THAT(e->message, Catch::Contains("/amount") && Catch::Contains("greater than or equal to 0"));
  e = codec->encode(R"({"id":1,"amount":1,"lines":[{"qty":"x"}]})", out);
  REQUIRE(e);
  CHECK_THAT(e->message, Catch::Contains("/lines/0/qty") && Catch::Contains("type"));
  e = codec->encode(R"({"id":1})", out);
  REQUIRE(e);
  CHECK_THAT(e->message, Catch::Contains("required"));
}

TEST_CASE("Protobuf: JSON becomes the first message's wire format, and unknown fields are errors", "[schema_registry]") {
  auto codec = make_schema_codec(RegistryFormat::protobuf, schema("PROTOBUF", R"(
    syntax = "proto3";
    package acme;
    import "google/protobuf/timestamp.proto";
    message Order { int64 id = 1; string customer = 2; repeated Line lines = 3; google.protobuf.Timestamp at = 4; }
    message Line { string sku = 1; }
  )"));
  // field 1 varint 150 -> 08 96 01; field 2 "ab" -> 12 02 61 62; field 3 {sku:"s"} -> 1a 03 0a 01 73
  CHECK(hex(encode_ok(*codec, R"({"id": "150", "customer": "ab", "lines": [{"sku": "s"}]})")) ==
        "089601" "12026162" "1a030a0173");
  // A well-known type from the import: seconds 1 -> 22 02 08 01.
  CHECK(hex(encode_ok(*codec, R"({"at": "1970-01-01T00:00:01Z"})")) == "22020801");
  std::string out;
  auto e = codec->encode(R"({"id": 1, "colour": "red"})", out);
  REQUIRE(e);
  CHECK(e->reason == "schema_mismatch");
  CHECK_THAT(e->message, Catch::Contains("acme.Order") && Catch::Contains("colour"));
  CHECK_THROWS_WITH(make_schema_codec(RegistryFormat::protobuf, schema("PROTOBUF", "message {")),
                    Catch::Contains("not a .proto"));
}

// ---------------------------------------------------------------- Avro logical types

namespace {

// Avro's long (and int): zigzag, then a varint, as hex.
std::string zigzag(int64_t n) {
  auto z = (static_cast<uint64_t>(n) << 1) ^ static_cast<uint64_t>(n >> 63);
  std::string bytes;
  do {
    unsigned char b = z & 0x7f;
    z >>= 7;
    if (z) b |= 0x80;
    bytes += static_cast<char>(b);
  } while (z);
  return hex(bytes);
}

// A record of one field of type `type`, as its encoding's hex.
struct OneField {
  std::unique_ptr<SchemaCodec> codec;
  explicit OneField(const std::string& type, const std::string& extra = "")
      : codec(make_schema_codec(RegistryFormat::avro,
                                schema("AVRO", R"({"type": "record", "name": "R", "fields": [{"name": "v", "type": )" +
                                                   type + extra + "}]}"))) {}
  std::string operator()(const std::string& value) {
    return hex(encode_ok(*codec, R"({"v": )" + value + "}"));
  }
  MapError error(const std::string& value) {
    std::string out;
    auto e = codec->encode(R"({"v": )" + value + "}", out);
    INFO("value " << value << " encoded as " << hex(out));
    REQUIRE(e);
    return *e;
  }
};

const std::string money = R"({"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2})";

}  // namespace

TEST_CASE("Avro decimal (bytes): a JSON number or a decimal string, exactly at the schema's scale, as the unscaled "
          "two's-complement big-endian bytes",
          "[schema_registry][avro_logical]") {
  OneField f(money);
  // 52.50 at scale 2 is 5250 = 0x1482: bytes of length 2 (zigzag 04).
  CHECK(f("52.50") == "041482");
  CHECK(f(R"("52.50")") == "041482");
  CHECK(f("52.5") == "041482");
  CHECK(f(R"("52.5")") == "041482");
  CHECK(f("5.25e1") == "041482");
  CHECK(f("52") == "041450");
  CHECK(f("-52.50") == "04eb7e");
  CHECK(f(R"("-52.50")") == "04eb7e");
  CHECK(f("0") == "0200");
  CHECK(f("-0.00") == "0200");
  CHECK(f("1.27") == "027f");   // 127: one byte
  CHECK(f("1.28") == "040080"); // 128: a sign byte before it
  CHECK(f("-1.28") == "0280");  // -128: one byte
  // The largest decimal(10,2), exactly (a double has it too, but not every neighbour).
  CHECK(f("99999999.99") == "0a02540be3ff");
  CHECK(f("-99999999.99") == "0afdabf41c01");
  // More digits than a double holds, all zeros past the scale: exact.
  CHECK(f("52.50000000000000000000000") == "041482");
  // A key written twice: the first, as for every other field (simdjson's at_key).
  CHECK(f(R"(1.50, "v": 52.505)") == "040096");
  // A union with null takes the number for the decimal branch.
  OneField nullable(R"(["null", )" + money + "]", R"(, "default": null)");
  CHECK(nullable("52.50") == "02041482");
  CHECK(nullable(R"("52.50")") == "02041482");
  CHECK(nullable("null") == "00");
}

TEST_CASE("Avro decimal: a value that would need rounding or does not fit the precision is the row's error, naming "
          "the field, never rounded",
          "[schema_registry][avro_logical]") {
  OneField f(money);
  auto e = f.error("52.505");
  CHECK(e.reason == "schema_mismatch");
  CHECK_THAT(e.message, Catch::Contains("/v") && Catch::Contains("52.505") && Catch::Contains("scale 2"));
  CHECK_THAT(f.error(R"("52.505")").message, Catch::Contains("/v") && Catch::Contains("scale 2"));
  // A double would make these 52.5: the text is what counts.
  CHECK_THAT(f.error("52.50000000000000000001").message, Catch::Contains("scale 2"));
  CHECK_THAT(f.error("123456789.01").message, Catch::Contains("/v") && Catch::Contains("precision 10"));
  CHECK_THAT(f.error("1e10").message, Catch::Contains("precision 10"));
  CHECK_THAT(f.error("1e-3").message, Catch::Contains("scale 2"));
  CHECK_THAT(f.error(R"("52,50")").message, Catch::Contains("/v") && Catch::Contains("not a decimal number"));
  CHECK_THAT(f.error(R"("")").message, Catch::Contains("not a decimal number"));
  CHECK_THAT(f.error(R"(" 52.50")").message, Catch::Contains("not a decimal number"));
  CHECK_THAT(f.error("true").message, Catch::Contains("/v") && Catch::Contains("a decimal"));
  OneField nullable(R"(["null", )" + money + "]", R"(, "default": null)");
  CHECK_THAT(nullable.error("52.505").message, Catch::Contains("/v"));
}

TEST_CASE("Avro decimal (fixed): sign-extended to the fixed size", "[schema_registry][avro_logical]") {
  OneField f(R"({"type": "fixed", "name": "Amount", "size": 4, "logicalType": "decimal", "precision": 9, "scale": 2})");
  CHECK(f("52.50") == "00001482");
  CHECK(f(R"("-1")") == "ffffff9c");
  CHECK(f("9999999.99") == "3b9ac9ff");
  CHECK_THAT(f.error("10000000.00").message, Catch::Contains("/v") && Catch::Contains("precision 9"));
  CHECK_THAT(f.error("0.001").message, Catch::Contains("scale 2"));
}

TEST_CASE("Avro decimal: a field's default is in Avro's JSON form of bytes, as the spec has it",
          "[schema_registry][avro_logical]") {
  auto codec = make_schema_codec(RegistryFormat::avro, schema("AVRO", R"({"type": "record", "name": "R", "fields": [
      {"name": "fee", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2},
       "default": "\u0001"}]})"));
  CHECK(hex(encode_ok(*codec, "{}")) == "0201");  // 0.01
  CHECK(hex(encode_ok(*codec, R"({"fee": 0.5})")) == "0232");
}

TEST_CASE("Avro timestamps: epoch numbers as they are, ISO-8601 strings by their meaning", "[schema_registry][avro_logical]") {
  OneField millis(R"({"type": "long", "logicalType": "timestamp-millis"})");
  CHECK(millis("1714564800123") == zigzag(1714564800123));
  CHECK(millis(R"("2024-05-01T12:00:00.123Z")") == zigzag(1714564800123));
  CHECK(millis(R"("2024-05-01T14:00:00.123+02:00")") == zigzag(1714564800123));
  CHECK(millis(R"("2024-05-01 09:30:00.123-02:30")") == zigzag(1714564800123));
  CHECK(millis(R"("2024-05-01T12:00:00Z")") == zigzag(1714564800000));
  // Sub-millisecond digits are cut toward the past, as Java's Instant.toEpochMilli does.
  CHECK(millis(R"("2024-05-01T12:00:00.123999+00:00")") == zigzag(1714564800123));
  CHECK(millis(R"("1969-12-31T23:59:59.9995Z")") == zigzag(-1));
  CHECK(millis(R"("1970-01-01T00:00:00Z")") == zigzag(0));
  OneField micros(R"({"type": "long", "logicalType": "timestamp-micros"})");
  CHECK(micros(R"("2024-05-01T12:00:00.123456Z")") == zigzag(1714564800123456));
  CHECK(micros("1714564800123456") == zigzag(1714564800123456));
  // A leap day, the year 2000 and a date before the epoch.
  CHECK(micros(R"("2000-02-29T00:00:00Z")") == zigzag(951782400000000));
  CHECK(micros(R"("1900-01-01T00:00:00Z")") == zigzag(-2208988800000000));
  OneField local_millis(R"({"type": "long", "logicalType": "local-timestamp-millis"})");
  CHECK(local_millis(R"("2024-05-01T12:00:00.5")") == zigzag(1714564800500));
  CHECK(local_millis("1714564800500") == zigzag(1714564800500));
  OneField local_micros(R"({"type": "long", "logicalType": "local-timestamp-micros"})");
  CHECK(local_micros(R"("2024-05-01T12:00:00.000001")") == zigzag(1714564800000001));
}

TEST_CASE("Avro timestamps: a string that is not such a time is the row's error, naming the field",
          "[schema_registry][avro_logical]") {
  OneField millis(R"({"type": "long", "logicalType": "timestamp-millis"})");
  CHECK_THAT(millis.error(R"("2024-05-01T12:00:00")").message,
             Catch::Contains("/v") && Catch::Contains("Z or an offset"));
  CHECK_THAT(millis.error(R"("2024-02-30T12:00:00Z")").message, Catch::Contains("/v") && Catch::Contains("2024-02-30"));
  CHECK_THAT(millis.error(R"("2023-02-29T12:00:00Z")").message, Catch::Contains("/v"));
  CHECK_THAT(millis.error(R"("2024-05-01T24:00:00Z")").message, Catch::Contains("/v"));
  CHECK_THAT(millis.error(R"("yesterday")").message, Catch::Contains("/v") && Catch::Contains("ISO-8601"));
  CHECK_THAT(millis.error(R"("2024-05-01T12:00:00Zjunk")").message, Catch::Contains("/v"));
  CHECK_THAT(millis.error("1.5").message, Catch::Contains("/v"));
  OneField local(R"({"type": "long", "logicalType": "local-timestamp-millis"})");
  CHECK_THAT(local.error(R"("2024-05-01T12:00:00Z")").message, Catch::Contains("/v") && Catch::Contains("no zone"));
}

TEST_CASE("Avro date and time-of-day: numbers as they are, ISO strings by their meaning, and what is not one refused",
          "[schema_registry][avro_logical]") {
  OneField date(R"({"type": "int", "logicalType": "date"})");
  CHECK(date(R"("2024-05-01")") == zigzag(19844));
  CHECK(date("19844") == zigzag(19844));
  CHECK(date(R"("1969-12-31")") == zigzag(-1));
  CHECK_THAT(date.error(R"("2024-13-01")").message, Catch::Contains("/v") && Catch::Contains("2024-13-01"));
  CHECK_THAT(date.error(R"("2024-05-01T00:00:00Z")").message, Catch::Contains("/v"));
  OneField time_millis(R"({"type": "int", "logicalType": "time-millis"})");
  CHECK(time_millis(R"("12:34:56.789")") == zigzag(45296789));
  CHECK(time_millis(R"("12:34:56")") == zigzag(45296000));
  CHECK(time_millis("45296789") == zigzag(45296789));
  CHECK_THAT(time_millis.error(R"("24:00:00")").message, Catch::Contains("/v"));
  CHECK_THAT(time_millis.error(R"("12:34")").message, Catch::Contains("/v") && Catch::Contains("HH:MM:SS"));
  CHECK_THAT(time_millis.error("86400000").message, Catch::Contains("/v") && Catch::Contains("day"));
  CHECK_THAT(time_millis.error("-1").message, Catch::Contains("/v"));
  OneField time_micros(R"({"type": "long", "logicalType": "time-micros"})");
  CHECK(time_micros(R"("12:34:56.789012")") == zigzag(45296789012));
  CHECK(time_micros(R"("00:00:00.000001")") == zigzag(1));
}

TEST_CASE("Avro uuid: a string checked as a UUID", "[schema_registry][avro_logical]") {
  OneField f(R"({"type": "string", "logicalType": "uuid"})");
  CHECK(f(R"("0f8fad5b-d9cb-469f-a165-70867728950e")") == "48" + hex("0f8fad5b-d9cb-469f-a165-70867728950e"));
  CHECK(f(R"("0F8FAD5B-D9CB-469F-A165-70867728950E")") == "48" + hex("0F8FAD5B-D9CB-469F-A165-70867728950E"));
  CHECK_THAT(f.error(R"("not-a-uuid")").message, Catch::Contains("/v") && Catch::Contains("not a UUID"));
  CHECK_THAT(f.error(R"("0f8fad5bd9cb469fa16570867728950e")").message, Catch::Contains("not a UUID"));
  CHECK_THAT(f.error(R"("0f8fad5b-d9cb-469f-a165-70867728950g")").message, Catch::Contains("not a UUID"));
}

TEST_CASE("Avro: a logical type on a type it does not annotate is ignored, as the spec says", "[schema_registry][avro_logical]") {
  // date on a string, decimal with its scale above its precision: the underlying type.
  OneField s(R"({"type": "string", "logicalType": "date"})");
  CHECK(s(R"("soon")") == "08" + hex("soon"));
  OneField b(R"({"type": "bytes", "logicalType": "decimal", "precision": 2, "scale": 3})");
  CHECK(b(R"("ab")") == "046162");
}

TEST_CASE("Protobuf: Timestamp, Duration, the wrappers, int64 as a string or an exact number, and enums by name, as "
          "Protobuf's JSON mapping has them",
          "[schema_registry]") {
  auto codec = make_schema_codec(RegistryFormat::protobuf, schema("PROTOBUF", R"(
    syntax = "proto3";
    package acme;
    import "google/protobuf/timestamp.proto";
    import "google/protobuf/duration.proto";
    import "google/protobuf/wrappers.proto";
    message Order {
      google.protobuf.Timestamp at = 1; google.protobuf.Duration wait = 2; google.protobuf.Int32Value qty = 3;
      google.protobuf.StringValue label = 4; int64 big = 5; Status status = 6;
    }
    enum Status { NEW = 0; PAID = 1; }
  )"));
  CHECK(hex(encode_ok(*codec, R"({"at": "2024-05-01T14:00:00.123+02:00", "wait": "1.5s", "qty": 3, "label": "x",
                                  "big": "9007199254740993", "status": "PAID"})")) ==
        "0a0b08c0ddc8b10610c0a9d33a" "120808011080cab5ee01" "1a020803" "2203" "0a0178" "288180808080808010" "3001");
  // 2^53 + 1 as a JSON number: exact, not through a double.
  CHECK(hex(encode_ok(*codec, R"({"big": 9007199254740993})")) == "288180808080808010");
  std::string out;
  for (auto bad : {R"({"status": "LOST"})", R"({"at": "2024-05-01T12:00:00"})", R"({"wait": "soon"})",
                   R"({"qty": 2147483648})", R"({"big": 1.5})"}) {
    INFO(bad);
    auto e = codec->encode(bad, out);
    REQUIRE(e);
    CHECK(e->reason == "schema_mismatch");
  }
}

TEST_CASE("JSON Schema: a draft-07 schema's keywords are checked (exclusiveMinimum as a number, const, if/then, "
          "propertyNames, contains), as confluent-kafka's JSONDeserializer checks them",
          "[schema_registry][json_schema_drafts]") {
  auto codec = make_schema_codec(RegistryFormat::json_schema, schema("JSON", R"({
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
      "amount": {"type": "number", "exclusiveMinimum": 0},
      "kind": {"const": "order"},
      "tags": {"type": "array", "contains": {"const": "x"}},
      "extra": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}
    },
    "if": {"properties": {"kind": {"const": "order"}}, "required": ["kind"]},
    "then": {"required": ["amount"]}
  })"));
  CHECK(encode_ok(*codec, R"({"kind":"order","amount":1,"tags":["x"],"extra":{"ab":1}})") ==
        R"({"kind":"order","amount":1,"tags":["x"],"extra":{"ab":1}})");
  struct Bad {
    const char* payload;
    const char* where;
  };
  for (auto bad : {Bad{R"({"kind":"order","amount":0})", "/amount"}, Bad{R"({"kind":"invoice"})", "/kind"},
                   Bad{R"({"kind":"order"})", "amount"}, Bad{R"({"kind":"order","amount":1,"extra":{"A1":1}})", "extra"},
                   Bad{R"({"kind":"order","amount":1,"tags":["y"]})", "/tags"}}) {
    INFO(bad.payload);
    std::string out;
    auto e = codec->encode(bad.payload, out);
    REQUIRE(e);
    CHECK(e->reason == "schema_mismatch");
    CHECK_THAT(e->message, Catch::Contains(bad.where));
  }
}

TEST_CASE("JSON Schema: draft 4 and draft 6 by their own rules, and a draft walrelay cannot check is refused with the "
          "schema, not guessed at",
          "[schema_registry][json_schema_drafts]") {
  // Draft 4: exclusiveMinimum is a boolean beside minimum.
  auto draft4 = make_schema_codec(RegistryFormat::json_schema, schema("JSON", R"({
    "$schema": "http://json-schema.org/draft-04/schema#",
    "properties": {"amount": {"type": "number", "minimum": 0, "exclusiveMinimum": true}}})"));
  CHECK(encode_ok(*draft4, R"({"amount":1})") == R"({"amount":1})");
  std::string out;
  CHECK(draft4->encode(R"({"amount":0})", out));
  // Draft 6: exclusiveMinimum a number, const.
  auto draft6 = make_schema_codec(RegistryFormat::json_schema, schema("JSON", R"({
    "$schema": "http://json-schema.org/draft-06/schema#",
    "properties": {"amount": {"exclusiveMinimum": 0}, "kind": {"const": "order"}}})"));
  CHECK(draft6->encode(R"({"amount":0})", out));
  CHECK(draft6->encode(R"({"kind":"x"})", out));
  CHECK_FALSE(draft6->encode(R"({"amount":1,"kind":"order"})", out));
  for (auto draft : {"https://json-schema.org/draft/2019-09/schema", "https://json-schema.org/draft/2020-12/schema",
                     "http://json-schema.org/draft-03/schema#", "http://example.com/my-meta-schema"}) {
    INFO(draft);
    CHECK_THROWS_WITH(make_schema_codec(RegistryFormat::json_schema,
                                        schema("JSON", std::string(R"({"$schema": ")") + draft + R"(", "type": "object"})")),
                      Catch::Contains("drafts 4, 6 and 7") && Catch::Contains(draft));
  }
  // A keyword of 2019-09 or 2020-12 that a draft-07 validator would skip, in a schema that does
  // not name its draft (confluent-kafka's reader takes that as 2020-12 and checks it).
  CHECK_THROWS_WITH(make_schema_codec(RegistryFormat::json_schema, schema("JSON", R"({"type": "object",
                      "properties": {"a": {"type": "object", "dependentRequired": {"x": ["y"]}}}})")),
                    Catch::Contains("dependentRequired") && Catch::Contains("/properties/a"));
  // A property named like such a keyword is only a name.
  CHECK_NOTHROW(make_schema_codec(RegistryFormat::json_schema, schema("JSON", R"({"type": "object",
                  "properties": {"prefixItems": {"type": "string"}}})")));
  // A $ref within the schema is followed.
  auto with_ref = make_schema_codec(RegistryFormat::json_schema, schema("JSON", R"({
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {"positive": {"type": "number", "exclusiveMinimum": 0}},
    "properties": {"a": {"$ref": "#/definitions/positive"}}})"));
  CHECK_FALSE(with_ref->encode(R"({"a":1})", out));
  CHECK(with_ref->encode(R"({"a":0})", out));
  // A $ref to another document would need fetching, which walrelay does not do.
  CHECK_THROWS_WITH(make_schema_codec(RegistryFormat::json_schema, schema("JSON", R"({
                      "$schema": "http://json-schema.org/draft-07/schema#",
                      "properties": {"a": {"$ref": "http://example.com/other.json"}}})")),
                    Catch::Contains("bad") || Catch::Contains("$ref"));
}
