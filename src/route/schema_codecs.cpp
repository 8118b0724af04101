// JSON payloads encoded by registered schemas: Avro (avro-c), JSON Schema
// (RapidJSON's validator), Protobuf (libprotobuf's DynamicMessage and JSON
// parser). Each codec is compiled once per schema and reused for every
// record of it.
#include <avro.h>

// valijson reports a schema it cannot use by an exception, not abort(); its
// RapidJSON adapter comes before any RapidJSON header (it sets RapidJSON's
// assertions).
#define VALIJSON_USE_EXCEPTIONS 1
#include <valijson/adapters/rapidjson_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>
#include <valijson/validator.hpp>

#include <google/protobuf/compiler/parser.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor_database.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/json_util.h>
#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/stringbuffer.h>
#include <simdjson.h>

#include <cctype>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "walrelay/mutation.hpp"
#include "walrelay/route/schema_registry.hpp"

namespace walrelay {

std::string wire_prefix(RegistryFormat format, int schema_id) {
  std::string p(5, '\0');
  const auto id = static_cast<std::uint32_t>(schema_id);
  p[1] = static_cast<char>(id >> 24);
  p[2] = static_cast<char>(id >> 16);
  p[3] = static_cast<char>(id >> 8);
  p[4] = static_cast<char>(id);
  // Protobuf: the path of message indexes to the message type; the first
  // top-level message, [0], is written as a single 0.
  if (format == RegistryFormat::protobuf) p += '\0';
  return p;
}

namespace {

MapError mismatch(const std::string& path, const std::string& why) {
  return MapError{"schema_mismatch", "the payload does not fit the schema at " + (path.empty() ? "/" : path) + ": " + why};
}

// ---------------------------------------------------------------- Avro logical types

// What an Avro logical type means, and so which JSON it takes. avro-c knows
// none: the schema's JSON is read for them beside avro-c's schema.
enum class AvroLogical {
  none,
  decimal,  // bytes or fixed: the unscaled value, two's complement, big-endian
  uuid,     // string
  date,     // int: days since 1970-01-01
  time_millis,
  time_micros,  // int, long: after midnight
  timestamp_millis,
  timestamp_micros,  // long: since 1970-01-01T00:00Z
  local_timestamp_millis,
  local_timestamp_micros,  // long: since 1970-01-01T00:00, no zone
};

// A schema's node beside avro-c's: its logical type, and its children in
// avro-c's order (record fields, union branches, the array's items, the
// map's values). avro-c shares one object among all uses of a primitive
// type, so a logical type cannot be keyed by avro-c's node.
struct AvroNode {
  AvroLogical logical = AvroLogical::none;
  int precision = 0, scale = 0;
  std::vector<const AvroNode*> children;
  const AvroNode* child(std::size_t i) const {
    static const AvroNode plain;
    return i < children.size() ? children[i] : &plain;
  }
};

// A cursor over ISO-8601 text.
struct IsoText {
  std::string_view s;
  std::size_t i = 0;
  bool done() const { return i == s.size(); }
  bool eat(char c) {
    if (i < s.size() && s[i] == c) return ++i, true;
    return false;
  }
  bool number(int width, int& out) {
    if (s.size() - i < static_cast<std::size_t>(width)) return false;
    out = 0;
    for (int k = 0; k < width; ++k, ++i) {
      if (s[i] < '0' || s[i] > '9') return false;
      out = out * 10 + (s[i] - '0');
    }
    return true;
  }
};

// Days from 1970-01-01 to a proleptic Gregorian date (H. Hinnant's algorithm).
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

// YYYY-MM-DD, a date that exists.
bool iso_date(IsoText& t, std::int64_t& days) {
  int y, m, d;
  if (!t.number(4, y) || !t.eat('-') || !t.number(2, m) || !t.eat('-') || !t.number(2, d)) return false;
  static constexpr int month_days[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (m < 1 || m > 12 || d < 1 || d > month_days[m - 1]) return false;
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  if (m == 2 && d == 29 && !leap) return false;
  days = days_from_civil(y, static_cast<unsigned>(m), static_cast<unsigned>(d));
  return true;
}

// HH:MM:SS[.fraction]: seconds of the day and nanoseconds (digits past the
// ninth are cut).
bool iso_time(IsoText& t, std::int64_t& seconds, std::int64_t& nanos) {
  int h, m, s;
  if (!t.number(2, h) || !t.eat(':') || !t.number(2, m) || !t.eat(':') || !t.number(2, s)) return false;
  if (h > 23 || m > 59 || s > 59) return false;
  seconds = h * 3600 + m * 60 + s;
  nanos = 0;
  if (t.eat('.')) {
    int digits = 0;
    for (; t.i < t.s.size() && t.s[t.i] >= '0' && t.s[t.i] <= '9'; ++t.i, ++digits)
      if (digits < 9) nanos = nanos * 10 + (t.s[t.i] - '0');
    if (digits == 0) return false;
    for (; digits < 9; ++digits) nanos *= 10;
  }
  return true;
}

// Z, or +HH:MM, +HHMM, +HH (and -): seconds east of UTC.
bool iso_offset(IsoText& t, std::optional<int>& offset) {
  if (t.eat('Z') || t.eat('z')) return offset = 0, true;
  const bool east = t.eat('+');
  if (!east && !t.eat('-')) return true;  // none
  int h, m = 0;
  if (!t.number(2, h)) return false;
  if (t.eat(':')) {
    if (!t.number(2, m)) return false;
  } else if (!t.done() && !t.number(2, m)) {
    return false;
  }
  if (h > 23 || m > 59) return false;
  offset = (east ? 1 : -1) * (h * 3600 + m * 60);
  return true;
}

std::string quoted(std::string_view text) {
  std::string out = "\"";
  out.append(text.substr(0, 64));
  if (text.size() > 64) out += "...";
  return out + "\"";
}

// Per unit: 1000 (millis) or 1000000 (micros).
std::int64_t per_second(AvroLogical l) {
  switch (l) {
    case AvroLogical::time_millis:
    case AvroLogical::timestamp_millis:
    case AvroLogical::local_timestamp_millis: return 1000;
    default: return 1000000;
  }
}

const char* logical_name(AvroLogical l) {
  switch (l) {
    case AvroLogical::decimal: return "decimal";
    case AvroLogical::uuid: return "uuid";
    case AvroLogical::date: return "date";
    case AvroLogical::time_millis: return "time-millis";
    case AvroLogical::time_micros: return "time-micros";
    case AvroLogical::timestamp_millis: return "timestamp-millis";
    case AvroLogical::timestamp_micros: return "timestamp-micros";
    case AvroLogical::local_timestamp_millis: return "local-timestamp-millis";
    case AvroLogical::local_timestamp_micros: return "local-timestamp-micros";
    case AvroLogical::none: break;
  }
  return "";
}

// An ISO-8601 text as the logical type's number, or why not.
std::optional<std::string> iso_value(AvroLogical l, std::string_view text, std::int64_t& out) {
  IsoText t{text};
  std::int64_t days = 0, seconds = 0, nanos = 0;
  const std::int64_t unit = per_second(l);
  switch (l) {
    case AvroLogical::date:
      if (!iso_date(t, days) || !t.done()) return quoted(text) + " is not an ISO-8601 date (YYYY-MM-DD)";
      out = days;
      return std::nullopt;
    case AvroLogical::time_millis:
    case AvroLogical::time_micros:
      if (!iso_time(t, seconds, nanos) || !t.done())
        return quoted(text) + " is not a time of day (HH:MM:SS or HH:MM:SS.ffffff)";
      out = seconds * unit + nanos / (1000000000 / unit);
      return std::nullopt;
    default: break;
  }
  std::optional<int> offset;
  if (!iso_date(t, days) || !(t.eat('T') || t.eat('t') || t.eat(' ')) || !iso_time(t, seconds, nanos) ||
      !iso_offset(t, offset) || !t.done())
    return quoted(text) + " is not an ISO-8601 date and time (YYYY-MM-DDTHH:MM:SS[.ffffff]" +
           (l == AvroLogical::timestamp_millis || l == AvroLogical::timestamp_micros ? "Z or +HH:MM)" : ")");
  const bool local = l == AvroLogical::local_timestamp_millis || l == AvroLogical::local_timestamp_micros;
  if (local && offset)
    return quoted(text) + " has a zone or offset, and a " + logical_name(l) +
           " is a wall-clock time with no zone: write it without one";
  if (!local && !offset)
    return quoted(text) + " has no zone: a " + logical_name(l) +
           " is an instant, so give Z or an offset (+HH:MM)";
  // Digits below the unit are cut toward the past, as Java's Instant.toEpochMilli does.
  out = (days * 86400 + seconds - offset.value_or(0)) * unit + nanos / (1000000000 / unit);
  return std::nullopt;
}

bool is_uuid(std::string_view s) {
  if (s.size() != 36) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (s[i] != '-') return false;
    } else if (!std::isxdigit(static_cast<unsigned char>(s[i]))) {
      return false;
    }
  }
  return true;
}

// A decimal's text: [+-]digits[.digits][e[+-]digits] (a JSON number's form,
// with a leading + or digits on one side of the point only).
struct DecimalText {
  bool negative = false;
  std::string digits;         // the mantissa's digits, leading zeros dropped
  std::int64_t exponent = 0;  // value = digits * 10^exponent
};
std::optional<DecimalText> parse_decimal(std::string_view s) {
  DecimalText d;
  std::size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) d.negative = s[i++] == '-';
  std::size_t mantissa = 0, fraction = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i, ++mantissa) d.digits += s[i];
  if (i < s.size() && s[i] == '.') {
    for (++i; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i, ++mantissa, ++fraction) d.digits += s[i];
  }
  if (mantissa == 0) return std::nullopt;
  std::int64_t exponent = 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    bool minus = false;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) minus = s[i++] == '-';
    const std::size_t start = i;
    for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i)
      if (exponent < 1000000000) exponent = exponent * 10 + (s[i] - '0');
    if (i == start) return std::nullopt;
    if (minus) exponent = -exponent;
  }
  if (i != s.size()) return std::nullopt;
  d.exponent = exponent - static_cast<std::int64_t>(fraction);
  d.digits.erase(0, std::min(d.digits.find_first_not_of('0'), d.digits.size()));
  return d;
}

// The decimal `text` at `scale` as its unscaled value's two's complement,
// big-endian, in the fewest bytes; or why it cannot be (more places than the
// scale, more digits than the precision). Never rounded.
std::optional<std::string> decimal_bytes(std::string_view text, int precision, int scale, std::string& bytes) {
  const std::string type = "decimal(" + std::to_string(precision) + "," + std::to_string(scale) + ")";
  auto d = parse_decimal(text);
  if (!d) return quoted(text) + " is not a decimal number";
  std::string unscaled = d->digits;
  if (!unscaled.empty()) {
    const std::int64_t shift = d->exponent + scale;
    if (shift < 0) {
      // The digits below the scale must all be zeros.
      const auto below = static_cast<std::size_t>(-shift);
      if (mutation::active(mutation::Break::avro_decimal_rounds) && below <= unscaled.size())
        unscaled.replace(unscaled.size() - below, below, below, '0');
      if (below > unscaled.size() || unscaled.find_first_not_of('0', unscaled.size() - below) != std::string::npos)
        return std::string(text.substr(0, 64)) + " has more decimal places than the schema's " + type +
               " keeps (scale " + std::to_string(scale) + "): walrelay does not round";
      unscaled.resize(unscaled.size() - below);
    } else {
      if (static_cast<std::int64_t>(unscaled.size()) + shift > precision)
        return std::string(text.substr(0, 64)) + " has more digits than the schema's " + type +
               " holds (precision " + std::to_string(precision) + ")";
      unscaled.append(static_cast<std::size_t>(shift), '0');
    }
    unscaled.erase(0, std::min(unscaled.find_first_not_of('0'), unscaled.size()));
    if (static_cast<std::int64_t>(unscaled.size()) > precision)
      return std::string(text.substr(0, 64)) + " has more digits than the schema's " + type + " holds (precision " +
             std::to_string(precision) + ")";
  }
  // Decimal digits to base 256, little-endian while building.
  std::vector<unsigned char> magnitude;
  for (char c : unscaled) {
    unsigned carry = static_cast<unsigned>(c - '0');
    for (auto& b : magnitude) {
      const unsigned v = b * 10u + carry;
      b = static_cast<unsigned char>(v & 0xff);
      carry = v >> 8;
    }
    if (carry) magnitude.push_back(static_cast<unsigned char>(carry));
  }
  magnitude.push_back(0);  // room for the sign bit
  if (d->negative && !unscaled.empty()) {
    unsigned carry = 1;
    for (auto& b : magnitude) {
      const unsigned v = static_cast<unsigned char>(~b) + carry;
      b = static_cast<unsigned char>(v & 0xff);
      carry = v >> 8;
    }
  }
  // The fewest bytes that keep the sign.
  while (magnitude.size() > 1) {
    const unsigned char top = magnitude.back(), next = magnitude[magnitude.size() - 2];
    if ((top == 0 && !(next & 0x80)) || (top == 0xff && (next & 0x80))) magnitude.pop_back();
    else break;
  }
  bytes.assign(magnitude.rbegin(), magnitude.rend());
  return std::nullopt;
}

// The logical type of a schema node's JSON on avro-c's type `type`, when
// the spec lets it annotate that type (else none: an invalid logical type is
// ignored, as the spec says, and the node is its underlying type).
void read_logical(const nlohmann::json& j, avro_type_t type, std::int64_t fixed_size, AvroNode& node) {
  if (!j.contains("logicalType") || !j["logicalType"].is_string()) return;
  const std::string name = j["logicalType"].get<std::string>();
  if (name == "decimal") {
    if (type != AVRO_BYTES && type != AVRO_FIXED) return;
    if (!j.contains("precision") || !j["precision"].is_number_integer()) return;
    const auto precision = j["precision"].get<std::int64_t>();
    std::int64_t scale = 0;
    if (j.contains("scale")) {
      if (!j["scale"].is_number_integer()) return;
      scale = j["scale"].get<std::int64_t>();
    }
    if (precision < 1 || precision > 100000 || scale < 0 || scale > precision) return;
    if (type == AVRO_FIXED &&
        precision > static_cast<std::int64_t>(std::floor((8.0L * fixed_size - 1) * std::log10(2.0L))))
      return;
    node.logical = AvroLogical::decimal;
    node.precision = static_cast<int>(precision);
    node.scale = static_cast<int>(scale);
    return;
  }
  static const std::map<std::string, std::pair<AvroLogical, avro_type_t>> simple = {
      {"uuid", {AvroLogical::uuid, AVRO_STRING}},
      {"date", {AvroLogical::date, AVRO_INT32}},
      {"time-millis", {AvroLogical::time_millis, AVRO_INT32}},
      {"time-micros", {AvroLogical::time_micros, AVRO_INT64}},
      {"timestamp-millis", {AvroLogical::timestamp_millis, AVRO_INT64}},
      {"timestamp-micros", {AvroLogical::timestamp_micros, AVRO_INT64}},
      {"local-timestamp-millis", {AvroLogical::local_timestamp_millis, AVRO_INT64}},
      {"local-timestamp-micros", {AvroLogical::local_timestamp_micros, AVRO_INT64}},
  };
  if (auto it = simple.find(name); it != simple.end() && it->second.second == type) node.logical = it->second.first;
}

// A JSON pointer's segment (RFC 6901: ~ as ~0, / as ~1).
void append_pointer(std::string& pointer, std::string_view segment) {
  pointer += '/';
  for (char c : segment) {
    if (c == '~') pointer += "~0";
    else if (c == '/') pointer += "~1";
    else pointer += c;
  }
}

// ---------------------------------------------------------------- Avro

class AvroCodec final : public SchemaCodec {
 public:
  explicit AvroCodec(const RegisteredSchema& registered) {
    if (avro_schema_from_json_length(registered.text.data(), registered.text.size(), &schema_))
      throw RegistryError("bad_schema", "subject \"" + registered.subject + "\" schema id " +
                                            std::to_string(registered.id) + " is not an Avro schema avro-c reads: " +
                                            avro_strerror());
    iface_ = avro_generic_class_from_schema(schema_);
    if (!iface_ || avro_generic_value_new(iface_, &value_)) {
      cleanup();
      throw RegistryError("bad_schema", "subject \"" + registered.subject + "\": " + avro_strerror());
    }
    writer_ = avro_writer_memory(nullptr, 0);
    const auto text = nlohmann::json::parse(registered.text, nullptr, false);
    collect_defaults(text, "");
    root_ = annotate(text, schema_);
  }
  ~AvroCodec() override { cleanup(); }

  std::optional<MapError> encode(std::string_view json, std::string& out) override {
    padded_.assign(json);
    padded_.append(simdjson::SIMDJSON_PADDING, '\0');
    simdjson::dom::element root;
    if (parser_.parse(padded_.data(), json.size(), false).get(root))
      return MapError{"bad_content", "the payload is not JSON, which the schema's encoding takes"};
    avro_value_reset(&value_);
    path_.clear();
    pointer_.clear();
    raw_numbers_.clear();
    raw_numbers_read_ = false;
    in_default_ = 0;
    if (auto e = fill(value_, schema_, root_, root)) return e;
    std::size_t size = 0;
    if (avro_value_sizeof(&value_, &size)) return MapError{"schema_mismatch", avro_strerror()};
    const std::size_t at = out.size();
    out.resize(at + size);
    avro_writer_memory_set_dest(writer_, out.data() + at, static_cast<std::int64_t>(size));
    if (avro_value_write(writer_, &value_)) return MapError{"schema_mismatch", avro_strerror()};
    return std::nullopt;
  }

 private:
  void cleanup() {
    if (writer_) avro_writer_free(writer_);
    if (iface_) {
      avro_value_decref(&value_);
      avro_value_iface_decref(iface_);
    }
    if (schema_) avro_schema_decref(schema_);
    writer_ = nullptr;
    iface_ = nullptr;
    schema_ = nullptr;
  }

  // Field defaults by record name and field name: avro-c keeps none.
  void collect_defaults(const nlohmann::json& s, const std::string& ns) {
    if (s.is_array()) {
      for (auto& b : s) collect_defaults(b, ns);
      return;
    }
    if (!s.is_object()) return;
    const std::string type = s.value("type", "");
    std::string space = s.contains("namespace") && s["namespace"].is_string() ? s["namespace"].get<std::string>() : ns;
    if (type == "record" || type == "error") {
      std::string name = s.value("name", "");
      if (auto dot = name.rfind('.'); dot != std::string::npos) {
        space = name.substr(0, dot);
        name = name.substr(dot + 1);
      }
      if (s.contains("fields") && s["fields"].is_array())
        for (auto& f : s["fields"]) {
          if (!f.is_object()) continue;
          if (f.contains("default")) defaults_[name + "\n" + f.value("name", "")] = f["default"].dump();
          if (f.contains("type")) collect_defaults(f["type"], space);
        }
    } else if (type == "array" && s.contains("items")) {
      collect_defaults(s["items"], space);
    } else if (type == "map" && s.contains("values")) {
      collect_defaults(s["values"], space);
    } else if (s.contains("type") && (s["type"].is_object() || s["type"].is_array())) {
      collect_defaults(s["type"], space);
    }
  }

  static avro_schema_t resolve(avro_schema_t s) {
    while (avro_typeof(s) == AVRO_LINK) s = avro_schema_link_target(s);
    return s;
  }

  // What a JSON value is, for messages.
  static const char* json_kind(simdjson::dom::element j) {
    switch (j.type()) {
      case simdjson::dom::element_type::ARRAY: return "an array";
      case simdjson::dom::element_type::OBJECT: return "an object";
      case simdjson::dom::element_type::INT64:
      case simdjson::dom::element_type::UINT64:
      case simdjson::dom::element_type::DOUBLE: return "a number";
      case simdjson::dom::element_type::STRING: return "a string";
      case simdjson::dom::element_type::BOOL: return "a boolean";
      case simdjson::dom::element_type::NULL_VALUE: return "null";
    }
    return "a value";
  }

  // The schema's JSON `j` beside avro-c's node `s`: the logical types, in a
  // tree of their own. Named types are found by avro-c's node (one per name,
  // and a reference resolves to it).
  const AvroNode* annotate(const nlohmann::json& j, avro_schema_t s) {
    static const AvroNode plain;
    s = resolve(s);
    const avro_type_t type = avro_typeof(s);
    auto named = [&]() -> const AvroNode* {
      auto it = named_.find(s);
      return it != named_.end() ? it->second : &plain;
    };
    if (j.is_string()) {
      if (type == AVRO_RECORD || type == AVRO_ENUM || type == AVRO_FIXED) return named();
      return &plain;
    }
    if (j.is_array()) {
      if (type != AVRO_UNION || j.size() != avro_schema_union_size(s)) return &plain;
      auto& node = nodes_.emplace_back();
      for (std::size_t i = 0; i < j.size(); ++i)
        node.children.push_back(annotate(j[i], avro_schema_union_branch(s, static_cast<int>(i))));
      return &node;
    }
    if (!j.is_object() || !j.contains("type")) return &plain;
    const auto& t = j["type"];
    if (t.is_object() || t.is_array()) return annotate(t, s);
    if (!t.is_string()) return &plain;
    const std::string name = t.get<std::string>();
    const bool defines = name == "record" || name == "error" || name == "enum" || name == "fixed";
    if (!defines && (type == AVRO_RECORD || type == AVRO_ENUM || type == AVRO_FIXED)) return named();
    auto& node = nodes_.emplace_back();
    if (defines) named_[s] = &node;  // before the fields: a record may refer to itself
    switch (type) {
      case AVRO_RECORD:
        if (j.contains("fields") && j["fields"].is_array() && j["fields"].size() == avro_schema_record_size(s))
          for (std::size_t i = 0; i < j["fields"].size(); ++i) {
            const auto& field = j["fields"][i];
            const auto field_schema = avro_schema_record_field_get_by_index(s, static_cast<int>(i));
            node.children.push_back(field.is_object() && field.contains("type") ? annotate(field["type"], field_schema)
                                                                                 : &plain);
          }
        break;
      case AVRO_ARRAY:
        if (j.contains("items")) node.children.push_back(annotate(j["items"], avro_schema_array_items(s)));
        break;
      case AVRO_MAP:
        if (j.contains("values")) node.children.push_back(annotate(j["values"], avro_schema_map_values(s)));
        break;
      default:
        read_logical(j, type, type == AVRO_FIXED ? avro_schema_fixed_size(s) : 0, node);
        break;
    }
    return &node;
  }

  // The text of the payload's number at pointer_, as written (a double would
  // round a decimal's digits). The payload's numbers are read once, at the
  // first decimal, by simdjson's On Demand API, which keeps their text.
  std::optional<std::string_view> raw_number() {
    if (!raw_numbers_read_) {
      raw_numbers_read_ = true;
      simdjson::ondemand::document doc;
      if (!ondemand_.iterate(padded_.data(), padded_.size() - simdjson::SIMDJSON_PADDING, padded_.size()).get(doc)) {
        simdjson::ondemand::json_type t;
        std::string_view raw;
        std::string at;
        if (!doc.type().get(t) && t == simdjson::ondemand::json_type::number) {
          if (!doc.raw_json_token().get(raw)) raw_numbers_.try_emplace(at, raw);
        } else {
          simdjson::ondemand::value root;
          if (!doc.get_value().get(root)) read_numbers(root, at);
        }
      }
    }
    auto it = raw_numbers_.find(pointer_);
    if (it == raw_numbers_.end()) return std::nullopt;
    auto raw = it->second;
    while (!raw.empty() && std::isspace(static_cast<unsigned char>(raw.back()))) raw.remove_suffix(1);
    return raw;
  }
  void read_numbers(simdjson::ondemand::value v, std::string& at) {
    simdjson::ondemand::json_type t;
    if (v.type().get(t)) return;
    const auto depth = at.size();
    if (t == simdjson::ondemand::json_type::object) {
      simdjson::ondemand::object o;
      if (v.get_object().get(o)) return;
      for (auto f : o) {
        simdjson::ondemand::field field;
        std::string_view key;
        if (std::move(f).get(field) || field.unescaped_key().get(key)) return;
        append_pointer(at, key);
        read_numbers(field.value(), at);
        at.resize(depth);
      }
    } else if (t == simdjson::ondemand::json_type::array) {
      simdjson::ondemand::array a;
      if (v.get_array().get(a)) return;
      std::size_t i = 0;
      for (auto item : a) {
        simdjson::ondemand::value child;
        if (std::move(item).get(child)) return;
        at += '/';
        at += std::to_string(i++);
        read_numbers(child, at);
        at.resize(depth);
      }
    } else if (t == simdjson::ondemand::json_type::number) {
      raw_numbers_.try_emplace(at, v.raw_json_token());  // a key written twice: the first, as at_key takes it
    }
  }

  // Whether a JSON value has the form a logical type takes (its range and
  // precision are fill's to check, so that their errors say what is wrong).
  bool fits_logical(const AvroNode* node, simdjson::dom::element j) const {
    using T = simdjson::dom::element_type;
    const T t = j.type();
    std::string_view str;
    const bool is_string = !j.get_string().get(str);
    switch (node->logical) {
      case AvroLogical::decimal:
        if (in_default_) return is_string;
        return t == T::INT64 || t == T::UINT64 || t == T::DOUBLE || (is_string && parse_decimal(str));
      case AvroLogical::uuid: return is_string && is_uuid(str);
      default: {
        std::int64_t ignored;
        return t == T::INT64 || (is_string && !iso_value(node->logical, str, ignored));
      }
    }
  }

  // Whether a JSON value can be a union branch of this schema (the plain
  // JSON an application writes, not Avro's {"type": value} wrapping).
  bool fits(avro_schema_t s, const AvroNode* node, simdjson::dom::element j) const {
    s = resolve(s);
    if (node->logical != AvroLogical::none) return fits_logical(node, j);
    using T = simdjson::dom::element_type;
    const T t = j.type();
    switch (avro_typeof(s)) {
      case AVRO_NULL: return t == T::NULL_VALUE;
      case AVRO_BOOLEAN: return t == T::BOOL;
      case AVRO_INT32: {
        int64_t v;
        return t == T::INT64 && !j.get_int64().get(v) && v >= std::numeric_limits<int32_t>::min() &&
               v <= std::numeric_limits<int32_t>::max();
      }
      case AVRO_INT64: return t == T::INT64;
      case AVRO_FLOAT:
      case AVRO_DOUBLE: return t == T::INT64 || t == T::UINT64 || t == T::DOUBLE;
      case AVRO_STRING:
      case AVRO_BYTES: return t == T::STRING;
      case AVRO_ENUM: {
        std::string_view v;
        return t == T::STRING && !j.get_string().get(v) &&
               avro_schema_enum_get_by_name(s, std::string(v).c_str()) >= 0;
      }
      case AVRO_FIXED: {
        std::string_view v;
        return t == T::STRING && !j.get_string().get(v);
      }
      case AVRO_ARRAY: return t == T::ARRAY;
      case AVRO_MAP:
      case AVRO_RECORD: return t == T::OBJECT;
      default: return false;
    }
  }

  // The name a union branch is known by in Avro's JSON encoding.
  static std::string branch_name(avro_schema_t s) {
    s = resolve(s);
    switch (avro_typeof(s)) {
      case AVRO_RECORD:
      case AVRO_ENUM:
      case AVRO_FIXED: {
        const char* ns = avro_schema_namespace(s);
        const std::string name = avro_schema_type_name(s);
        return ns && *ns ? std::string(ns) + "." + name : name;
      }
      default: return avro_schema_type_name(s);
    }
  }

  // Avro's bytes and fixed in JSON: each character one byte (ISO-8859-1).
  static std::optional<std::string> latin1(std::string_view utf8) {
    std::string out;
    for (std::size_t i = 0; i < utf8.size(); ++i) {
      auto c = static_cast<unsigned char>(utf8[i]);
      if (c < 0x80) {
        out += static_cast<char>(c);
      } else if ((c & 0xE0) == 0xC0 && i + 1 < utf8.size() && c <= 0xC3) {
        out += static_cast<char>(((c & 0x1F) << 6) | (static_cast<unsigned char>(utf8[++i]) & 0x3F));
      } else {
        return std::nullopt;
      }
    }
    return out;
  }

  // A logical type's value by what it means (the JSON forms are in
  // docs/configuration.md).
  std::optional<MapError> fill_logical(avro_value_t& v, avro_schema_t s, const AvroNode* node,
                                       simdjson::dom::element j) {
    using T = simdjson::dom::element_type;
    const AvroLogical logical = node->logical;
    std::string_view str;
    const bool is_string = !j.get_string().get(str);
    if (logical == AvroLogical::decimal) {
      std::string text;
      if (is_string) {
        text.assign(str);
      } else if (j.type() == T::INT64) {
        text = std::to_string(int64_t(j));
      } else if (j.type() == T::UINT64) {
        text = std::to_string(uint64_t(j));
      } else if (j.type() == T::DOUBLE) {
        auto raw = raw_number();
        if (!raw) return mismatch(path_, "the number's text was not found in the payload");
        text.assign(*raw);
      } else {
        return expected("a decimal (a JSON number or a decimal string)", j);
      }
      if (auto why = decimal_bytes(text, node->precision, node->scale, scratch_)) return mismatch(path_, *why);
      if (avro_typeof(s) == AVRO_FIXED) {
        const auto size = static_cast<std::size_t>(avro_schema_fixed_size(s));
        if (scratch_.size() > size)
          return mismatch(path_, text + " does not fit fixed " + branch_name(s) + " (" + std::to_string(size) +
                                     " bytes)");
        const char sign = (static_cast<unsigned char>(scratch_[0]) & 0x80) ? '\xff' : '\0';
        scratch_.insert(0, size - scratch_.size(), sign);
        avro_value_set_fixed(&v, scratch_.data(), scratch_.size());
      } else {
        avro_value_set_bytes(&v, scratch_.data(), scratch_.size());
      }
      return std::nullopt;
    }
    if (logical == AvroLogical::uuid) {
      if (!is_string) return expected("a string (a UUID)", j);
      if (!is_uuid(str))
        return mismatch(path_, quoted(str) + " is not a UUID (8-4-4-4-12 hexadecimal digits, as "
                                             "0f8fad5b-d9cb-469f-a165-70867728950e)");
      scratch_.assign(str);
      avro_value_set_string_len(&v, scratch_.c_str(), scratch_.size() + 1);
      return std::nullopt;
    }
    std::int64_t n = 0;
    if (is_string) {
      if (auto why = iso_value(logical, str, n)) return mismatch(path_, *why);
    } else if (j.get_int64().get(n)) {
      return expected(std::string(logical == AvroLogical::date ? "days since 1970-01-01 or an ISO-8601 date"
                                  : logical == AvroLogical::time_millis || logical == AvroLogical::time_micros
                                      ? "a time of day (an integer or HH:MM:SS.ffffff)"
                                      : "an integer since the epoch or an ISO-8601 date and time") +
                          " for " + logical_name(logical),
                      j);
    } else if (logical == AvroLogical::time_millis || logical == AvroLogical::time_micros) {
      const std::int64_t day = 86400 * per_second(logical);
      if (n < 0 || n >= day)
        return mismatch(path_, std::to_string(n) + " is not a time of day: " + logical_name(logical) + " counts 0 to " +
                                   std::to_string(day - 1));
    }
    if (avro_typeof(s) == AVRO_INT32) {
      if (n < std::numeric_limits<int32_t>::min() || n > std::numeric_limits<int32_t>::max())
        return mismatch(path_, std::to_string(n) + " does not fit an int (32 bits)");
      avro_value_set_int(&v, static_cast<int32_t>(n));
    } else {
      avro_value_set_long(&v, n);
    }
    return std::nullopt;
  }

  // What a value of the wrong JSON kind is told.
  MapError expected(const std::string& what, simdjson::dom::element j) const {
    return mismatch(path_, "expected " + what + ", got " + json_kind(j));
  }

  // Fills an Avro value from the JSON one by its schema, the logical types
  // by what they mean; the mapping error names where it does not fit.
  std::optional<MapError> fill(avro_value_t& v, avro_schema_t s, const AvroNode* node, simdjson::dom::element j) {
    s = resolve(s);
    // A default is in the underlying type's JSON form, as the spec has it
    // (a decimal's is Avro's JSON form of bytes).
    if (node->logical != AvroLogical::none && !(in_default_ && node->logical == AvroLogical::decimal))
      return fill_logical(v, s, node, j);
    switch (avro_typeof(s)) {
      case AVRO_BYTES:
      case AVRO_FIXED: return fill_bytes(v, s, j);
      case AVRO_ARRAY: return fill_array(v, s, node, j);
      case AVRO_MAP: return fill_map(v, s, node, j);
      case AVRO_RECORD: return fill_record(v, s, node, j);
      case AVRO_UNION: return fill_union(v, s, node, j);
      default: return fill_scalar(v, s, j);
    }
  }

  // A null, boolean, number, string or enum symbol.
  std::optional<MapError> fill_scalar(avro_value_t& v, avro_schema_t s, simdjson::dom::element j) {
    using T = simdjson::dom::element_type;
    switch (avro_typeof(s)) {
      case AVRO_NULL:
        if (!j.is_null()) return expected("null", j);
        avro_value_set_null(&v);
        return std::nullopt;
      case AVRO_BOOLEAN: {
        bool b;
        if (j.get_bool().get(b)) return expected("a boolean", j);
        avro_value_set_boolean(&v, b);
        return std::nullopt;
      }
      case AVRO_INT32: {
        int64_t n;
        if (j.get_int64().get(n)) return expected("an integer (int)", j);
        if (n < std::numeric_limits<int32_t>::min() || n > std::numeric_limits<int32_t>::max())
          return mismatch(path_, std::to_string(n) + " does not fit an int (32 bits)");
        avro_value_set_int(&v, static_cast<int32_t>(n));
        return std::nullopt;
      }
      case AVRO_INT64: {
        int64_t n;
        if (j.get_int64().get(n)) return expected("an integer (long)", j);
        avro_value_set_long(&v, n);
        return std::nullopt;
      }
      case AVRO_FLOAT:
      case AVRO_DOUBLE: {
        double d;
        if (j.type() == T::INT64) d = static_cast<double>(int64_t(j));
        else if (j.type() == T::UINT64) d = static_cast<double>(uint64_t(j));
        else if (j.get_double().get(d)) return expected("a number", j);
        if (avro_typeof(s) == AVRO_FLOAT) avro_value_set_float(&v, static_cast<float>(d));
        else avro_value_set_double(&v, d);
        return std::nullopt;
      }
      case AVRO_STRING: {
        std::string_view str;
        if (j.get_string().get(str)) return expected("a string", j);
        scratch_.assign(str);
        avro_value_set_string_len(&v, scratch_.c_str(), scratch_.size() + 1);
        return std::nullopt;
      }
      case AVRO_ENUM: {
        std::string_view str;
        if (j.get_string().get(str)) return expected("a string (an enum symbol)", j);
        scratch_.assign(str);
        int symbol = avro_schema_enum_get_by_name(s, scratch_.c_str());
        if (symbol < 0) return mismatch(path_, "\"" + scratch_ + "\" is not a symbol of enum " + branch_name(s));
        avro_value_set_enum(&v, symbol);
        return std::nullopt;
      }
      default:
        return mismatch(path_, "an Avro type walrelay does not encode");
    }
  }

  // Bytes or fixed, from Avro's JSON form of bytes.
  std::optional<MapError> fill_bytes(avro_value_t& v, avro_schema_t s, simdjson::dom::element j) {
    std::string_view str;
    if (j.get_string().get(str)) return expected("a string (Avro's JSON form of bytes)", j);
    auto bytes = latin1(str);
    if (!bytes) return mismatch(path_, "bytes must be characters U+0000 to U+00FF, one per byte");
    if (avro_typeof(s) == AVRO_FIXED) {
      const auto size = avro_schema_fixed_size(s);
      if (static_cast<int64_t>(bytes->size()) != size)
        return mismatch(path_, "fixed " + branch_name(s) + " takes " + std::to_string(size) + " bytes, got " +
                                   std::to_string(bytes->size()));
      avro_value_set_fixed(&v, bytes->data(), bytes->size());
    } else {
      avro_value_set_bytes(&v, bytes->data(), bytes->size());
    }
    return std::nullopt;
  }

  // An array, item by item.
  std::optional<MapError> fill_array(avro_value_t& v, avro_schema_t s, const AvroNode* node, simdjson::dom::element j) {
    simdjson::dom::array a;
    if (j.get_array().get(a)) return expected("an array", j);
    const auto items = avro_schema_array_items(s);
    const auto depth = path_.size(), pointer_depth = pointer_.size();
    std::size_t i = 0;
    for (auto item : a) {
      avro_value_t child;
      avro_value_append(&v, &child, nullptr);
      path_ += '/';
      path_ += std::to_string(i);
      pointer_ += '/';
      pointer_ += std::to_string(i++);
      if (auto e = fill(child, items, node->child(0), item)) return e;
      path_.resize(depth);
      pointer_.resize(pointer_depth);
    }
    return std::nullopt;
  }

  // A map, member by member.
  std::optional<MapError> fill_map(avro_value_t& v, avro_schema_t s, const AvroNode* node, simdjson::dom::element j) {
    simdjson::dom::object o;
    if (j.get_object().get(o)) return expected("an object (a map)", j);
    const auto values = avro_schema_map_values(s);
    const auto depth = path_.size(), pointer_depth = pointer_.size();
    for (auto field : o) {
      avro_value_t child;
      scratch_.assign(field.key);
      avro_value_add(&v, scratch_.c_str(), &child, nullptr, nullptr);
      path_ += '/';
      path_ += scratch_;
      append_pointer(pointer_, field.key);
      if (auto e = fill(child, values, node->child(0), field.value)) return e;
      path_.resize(depth);
      pointer_.resize(pointer_depth);
    }
    return std::nullopt;
  }

  // A record, field by field: a missing field takes the schema's default; a
  // member the record does not have is refused.
  std::optional<MapError> fill_record(avro_value_t& v, avro_schema_t s, const AvroNode* node, simdjson::dom::element j) {
    simdjson::dom::object o;
    if (j.get_object().get(o)) return expected("an object (record " + branch_name(s) + ")", j);
    const auto depth = path_.size(), pointer_depth = pointer_.size();
    const auto fields = avro_schema_record_size(s);
    std::size_t matched = 0;
    for (std::size_t i = 0; i < fields; ++i) {
      const char* name = avro_schema_record_field_name(s, static_cast<int>(i));
      avro_value_t child;
      avro_value_get_by_index(&v, i, &child, nullptr);
      const auto field_schema = avro_schema_record_field_get_by_index(s, static_cast<int>(i));
      path_ += "/";
      path_ += name;
      append_pointer(pointer_, name);
      simdjson::dom::element member;
      if (!o.at_key(name).get(member)) {
        ++matched;
        if (auto e = fill(child, field_schema, node->child(i), member)) return e;
      } else if (auto d = defaults_.find(std::string(avro_schema_type_name(s)) + "\n" + name); d != defaults_.end()) {
        if (auto e = fill_default(child, field_schema, node->child(i), d->second)) return e;
      } else {
        return mismatch(path_, "the field is missing and the schema gives it no default");
      }
      path_.resize(depth);
      pointer_.resize(pointer_depth);
    }
    if (matched < o.size()) {
      for (auto field : o) {
        bool known = false;
        for (std::size_t i = 0; i < fields && !known; ++i)
          known = field.key == avro_schema_record_field_name(s, static_cast<int>(i));
        if (!known) return mismatch(path_ + "/" + std::string(field.key), "record " + branch_name(s) + " has no such field");
      }
    }
    return std::nullopt;
  }

  // A missing field's default, parsed where it is used (a parser of its
  // own: the payload's is in use).
  std::optional<MapError> fill_default(avro_value_t& v, avro_schema_t s, const AvroNode* node,
                                       const std::string& json) {
    simdjson::dom::element dv;
    if (default_parser_.parse(json).get(dv)) return mismatch(path_, "the schema's default is not JSON");
    ++in_default_;
    auto e = fill(v, s, node, dv);
    --in_default_;
    return e;
  }

  // A union: Avro's JSON encoding {"<branch name>": value}, else the first
  // branch the plain JSON value fits.
  std::optional<MapError> fill_union(avro_value_t& v, avro_schema_t s, const AvroNode* node, simdjson::dom::element j) {
    const auto branches = avro_schema_union_size(s);
    simdjson::dom::object o;
    if (!j.get_object().get(o) && o.size() == 1) {
      auto field = *o.begin();
      for (std::size_t i = 0; i < branches; ++i) {
        auto b = avro_schema_union_branch(s, static_cast<int>(i));
        if (branch_name(b) == field.key && avro_typeof(resolve(b)) != AVRO_MAP) {
          avro_value_t branch;
          avro_value_set_branch(&v, static_cast<int>(i), &branch);
          append_pointer(pointer_, field.key);
          return fill(branch, b, node->child(i), field.value);
        }
      }
    }
    for (std::size_t i = 0; i < branches; ++i) {
      auto b = avro_schema_union_branch(s, static_cast<int>(i));
      if (!fits(b, node->child(i), j)) continue;
      avro_value_t branch;
      avro_value_set_branch(&v, static_cast<int>(i), &branch);
      return fill(branch, b, node->child(i), j);
    }
    std::string names;
    for (std::size_t i = 0; i < branches; ++i)
      names += (i ? ", " : "") + branch_name(avro_schema_union_branch(s, static_cast<int>(i)));
    return mismatch(path_, std::string(json_kind(j)) + " fits none of the union's types (" + names + ")");
  }

  avro_schema_t schema_ = nullptr;
  avro_value_iface_t* iface_ = nullptr;
  avro_value_t value_{};
  avro_writer_t writer_ = nullptr;
  simdjson::dom::parser parser_, default_parser_;
  simdjson::ondemand::parser ondemand_;  // the numbers' text, for decimals
  std::string padded_, scratch_, path_;
  std::string pointer_;  // JSON pointer of the payload's value being filled (path_ is for messages)
  std::unordered_map<std::string, std::string_view> raw_numbers_;  // pointer -> a number's text in padded_
  bool raw_numbers_read_ = false;
  int in_default_ = 0;  // > 0 while a field's default fills
  std::map<std::string, std::string> defaults_;  // "record\nfield" -> the default's JSON
  std::deque<AvroNode> nodes_;  // the logical types' tree (annotate)
  std::map<avro_schema_t, const AvroNode*> named_;
  const AvroNode* root_ = nullptr;
};

// ---------------------------------------------------------------- JSON Schema

// The keywords of drafts 2019-09 and 2020-12 that a draft 4 to 7 validator
// skips as unknown, and that confluent-kafka's JSONDeserializer checks when a
// schema names no draft (it takes the newest).
const char* const later_draft_keywords[] = {
    "dependentRequired", "dependentSchemas", "unevaluatedProperties", "unevaluatedItems", "prefixItems",
    "minContains",       "maxContains",      "$anchor",               "$dynamicRef",      "$dynamicAnchor",
    "$recursiveRef",     "$recursiveAnchor", "$vocabulary"};

// The first keyword of a later draft in a schema, where it is (a JSON
// pointer), or nothing. Only schema positions are looked at: a property
// named "prefixItems" is a name, an enum's values are data.
std::optional<std::string> later_draft_keyword(const rapidjson::Value& node, const std::string& at) {
  if (node.IsArray()) {
    for (rapidjson::SizeType i = 0; i < node.Size(); ++i)
      if (auto found = later_draft_keyword(node[i], at + "/" + std::to_string(i))) return found;
    return std::nullopt;
  }
  if (!node.IsObject()) return std::nullopt;
  for (auto& member : node.GetObject()) {
    const std::string key(member.name.GetString(), member.name.GetStringLength());
    std::string here = at;
    append_pointer(here, key);
    for (const char* later : later_draft_keywords)
      if (key == later) return "\"" + key + "\" at " + (at.empty() ? "/" : at);
    if (key == "enum" || key == "const" || key == "default" || key == "examples" || key == "required") continue;
    const bool named_schemas = key == "properties" || key == "patternProperties" || key == "definitions" ||
                               key == "$defs" || key == "dependencies";
    if (named_schemas && member.value.IsObject()) {
      for (auto& named : member.value.GetObject()) {
        std::string there = here;
        append_pointer(there, std::string_view(named.name.GetString(), named.name.GetStringLength()));
        if (auto found = later_draft_keyword(named.value, there)) return found;
      }
      continue;
    }
    if (auto found = later_draft_keyword(member.value, here)) return found;
  }
  return std::nullopt;
}

// The payload is written as it is, once it validates (Confluent's JSON
// Schema serializer writes the JSON text after the frame). Validated by
// valijson, by the schema's own draft: 4, or 6 and 7 (draft 7's rules: 6
// is 7 without if/then/else and a few annotations).
class JsonSchemaCodec final : public SchemaCodec {
 public:
  explicit JsonSchemaCodec(const RegisteredSchema& registered) {
    const std::string what = "subject \"" + registered.subject + "\" schema id " + std::to_string(registered.id);
    rapidjson::Document d;
    d.Parse(registered.text.data(), registered.text.size());
    if (d.HasParseError())
      throw RegistryError("bad_schema", what + " is not JSON: " + rapidjson::GetParseError_En(d.GetParseError()));
    auto version = valijson::SchemaParser::kDraft7;
    std::string draft;
    if (d.IsObject() && d.HasMember("$schema") && d["$schema"].IsString()) {
      draft.assign(d["$schema"].GetString(), d["$schema"].GetStringLength());
      const auto is = [&](const char* name) { return draft.find(name) != std::string::npos; };
      if (is("json-schema.org/draft-04/schema")) version = valijson::SchemaParser::kDraft4;
      else if (!is("json-schema.org/draft-06/schema") && !is("json-schema.org/draft-07/schema"))
        throw RegistryError("bad_schema", what + " is JSON Schema \"" + draft +
                                              "\", and walrelay validates drafts 4, 6 and 7 only: register it "
                                              "with \"$schema\": \"http://json-schema.org/draft-07/schema#\" "
                                              "(Confluent's tools write draft-07) if its keywords are draft 7's");
    } else if (auto later = later_draft_keyword(d, "")) {
      // No draft named: a reader takes the newest, whose keywords a draft 7
      // validator would skip.
      throw RegistryError("bad_schema", what + " names no draft (\"$schema\") and uses " + *later +
                                            ", a keyword of JSON Schema 2019-09/2020-12 that walrelay cannot "
                                            "check (it validates drafts 4, 6 and 7): say which draft it is");
    }
    if (mutation::active(mutation::Break::json_schema_draft4)) version = valijson::SchemaParser::kDraft4;
    try {
      valijson::SchemaParser parser(version);
      valijson::adapters::RapidJsonAdapter adapter(d);
      parser.populateSchema(adapter, schema_);
    } catch (const std::exception& e) {
      throw RegistryError("bad_schema", what + " is not a JSON Schema walrelay can check: " + e.what() +
                                            " (a $ref to another document is not fetched)");
    }
  }

  std::optional<MapError> encode(std::string_view json, std::string& out) override {
    // RapidJSON's pool allocator never frees what a parse took: each record
    // gets a document over the same pool, emptied after it, so that memory
    // stays the size of the largest payload rather than of all of them.
    struct ClearPool {
      rapidjson::MemoryPoolAllocator<>& pool;
      ~ClearPool() { pool.Clear(); }
    } clear{pool_};
    rapidjson::Document document(&pool_);
    document.Parse(json.data(), json.size());
    if (document.HasParseError())
      return MapError{"bad_content", std::string("the payload is not JSON: ") +
                                         rapidjson::GetParseError_En(document.GetParseError()) + " at byte " +
                                         std::to_string(document.GetErrorOffset())};
    valijson::ValidationResults results;
    if (!validator_.validate(schema_, valijson::adapters::RapidJsonAdapter(document), &results)) {
      // The deepest error says most; its context is ["<root>", "[name]", "[0]", ...].
      valijson::ValidationResults::Error error, deepest;
      while (results.popError(error))
        if (deepest.context.empty() || error.context.size() > deepest.context.size()) deepest = error;
      std::string at;
      for (auto& part : deepest.context)
        if (part.size() >= 2 && part.front() == '[' && part.back() == ']')
          append_pointer(at, std::string_view(part).substr(1, part.size() - 2));
      return mismatch(at, deepest.description);
    }
    out.append(json);
    return std::nullopt;
  }

 private:
  valijson::Schema schema_;
  valijson::Validator validator_;
  rapidjson::MemoryPoolAllocator<> pool_;  // the documents' memory
};

// ---------------------------------------------------------------- Protobuf

class ProtobufErrors final : public google::protobuf::io::ErrorCollector,
                             public google::protobuf::DescriptorPool::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (text.empty()) text = "line " + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  void AddError(const std::string& filename, const std::string& element_name, const google::protobuf::Message*,
                ErrorLocation, const std::string& message) override {
    (void)filename;
    if (text.empty()) text = element_name + ": " + message;
  }
  std::string text;
};

// The registered .proto text is parsed at run time; the encoded message is
// its first top-level message (the index path [0]).
class ProtobufCodec final : public SchemaCodec {
 public:
  explicit ProtobufCodec(const RegisteredSchema& registered)
      // Google's well-known types (timestamp.proto, ...) come from the pool
      // compiled into libprotobuf, underneath the registered file.
      : pool_(google::protobuf::DescriptorPool::generated_pool()) {
    namespace pb = google::protobuf;
    const std::string what = "subject \"" + registered.subject + "\" schema id " + std::to_string(registered.id);
    pb::io::ArrayInputStream in(registered.text.data(), static_cast<int>(registered.text.size()));
    ProtobufErrors errors;
    pb::io::Tokenizer tokenizer(&in, &errors);
    pb::compiler::Parser parser;
    parser.RecordErrorsTo(&errors);
    pb::FileDescriptorProto file;
    if (!parser.Parse(&tokenizer, &file))
      throw RegistryError("bad_schema", what + " is not a .proto that libprotobuf reads: " + errors.text);
    file.set_name(registered.subject + ".proto");
    // Imports other than Google's well-known types would be schema references.
    const pb::FileDescriptor* built = pool_.BuildFileCollectingErrors(file, &errors);
    if (!built) throw RegistryError("bad_schema", what + " does not build: " + errors.text);
    if (built->message_type_count() == 0) throw RegistryError("bad_schema", what + " declares no message");
    descriptor_ = built->message_type(0);
    message_.reset(factory_.GetPrototype(descriptor_)->New());
    options_.ignore_unknown_fields = false;
  }

  std::optional<MapError> encode(std::string_view json, std::string& out) override {
    message_->Clear();
    auto status = google::protobuf::util::JsonStringToMessage(
        google::protobuf::StringPiece(json.data(), json.size()), message_.get(), options_);
    if (!status.ok())
      return MapError{"schema_mismatch", "the payload does not fit message " + descriptor_->full_name() + ": " +
                                             std::string(status.message())};
    message_->AppendToString(&out);
    return std::nullopt;
  }

 private:
  google::protobuf::DescriptorPool pool_;
  google::protobuf::DynamicMessageFactory factory_;
  const google::protobuf::Descriptor* descriptor_ = nullptr;
  std::unique_ptr<google::protobuf::Message> message_;
  google::protobuf::util::JsonParseOptions options_;
};

}  // namespace

std::unique_ptr<SchemaCodec> make_schema_codec(RegistryFormat format, const RegisteredSchema& schema) {
  static const std::map<RegistryFormat, std::string> types = {
      {RegistryFormat::avro, "AVRO"}, {RegistryFormat::json_schema, "JSON"}, {RegistryFormat::protobuf, "PROTOBUF"}};
  const std::string& want = types.at(format);
  if (schema.type != want)
    throw RegistryError("bad_schema", "subject \"" + schema.subject + "\" holds a " + schema.type +
                                          " schema (id " + std::to_string(schema.id) + "), and value.converter=" +
                                          registry_converter_name(format) + " encodes " + want);
  if (schema.references)
    throw RegistryError("bad_schema", "subject \"" + schema.subject + "\" schema id " + std::to_string(schema.id) +
                                          " refers to other schemas, which walrelay does not resolve yet: register "
                                          "it self-contained");
  switch (format) {
    case RegistryFormat::avro: return std::make_unique<AvroCodec>(schema);
    case RegistryFormat::json_schema: return std::make_unique<JsonSchemaCodec>(schema);
    case RegistryFormat::protobuf: return std::make_unique<ProtobufCodec>(schema);
    case RegistryFormat::none: break;
  }
  throw RegistryError("bad_schema", "no schema format");
}

}  // namespace walrelay
