// The schema-registry codecs, byte for byte against the formats' specs:
// Avro's binary encoding, Confluent's framing, Protobuf's wire format.
#include <catch2/catch.hpp>

#include "walrelay/schema_registry.hpp"

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
  CHECK_THAT(e->message, Catch::Contains("/amount") && Catch::Contains("minimum"));
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
