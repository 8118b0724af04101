#include "walrelay/route/outbox_mapper.hpp"

#include <array>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iterator>
#include <string>

#include <boost/algorithm/hex.hpp>
#include <boost/beast/core/detail/base64.hpp>
#include <boost/regex.hpp>
#include <nlohmann/json.hpp>
#include <simdjson.h>
#include <pgoutput/binary.hpp>

#include "walrelay/json.hpp"
#include "walrelay/logging.hpp"
#include "walrelay/route/trace_context.hpp"

namespace walrelay {
namespace {

// PostgreSQL's epoch, 2000-01-01 00:00:00 UTC, in Unix milliseconds.
constexpr std::int64_t pg_epoch_unix_ms = pgoutput::binary::pg_epoch_unix_micros / 1000;

// The value of a hex digit, either case, or -1 if c is not one.
int hex_digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// bytea's text form, hex format (the connection sets bytea_output=hex).
// Decoded by hand, on the row path for bytea payloads: per 200-byte payload
// Boost's unhex took 2.5 times as long, and std::from_chars(..., 16), which
// g++ 12 does not inline here, three times the instructions.
bool decode_bytea_hex(std::string_view text, std::string& out) {
  if (text.size() < 2 || text[0] != '\\' || text[1] != 'x' || (text.size() % 2) != 0) return false;
  out.resize((text.size() - 2) / 2);
  for (std::size_t i = 2, o = 0; i < text.size(); i += 2, ++o) {
    const int hi = hex_digit_value(text[i]);
    const int lo = hex_digit_value(text[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[o] = static_cast<char>((hi << 4) | lo);
  }
  return true;
}

// Bytes as bytea's hex text form, "\x" and two lowercase digits a byte.
std::string bytea_hex(pgoutput::Bytes bytes) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  std::string out = "\\x";
  out.reserve(2 + 2 * bytes.size());
  boost::algorithm::hex_lower(data, data + bytes.size(), std::back_inserter(out));
  return out;
}

// A uuid's text form as PostgreSQL writes it (uuid_out): 8-4-4-4-12 lowercase hex digits.
void format_uuid(const pgoutput::binary::Uuid& uuid, std::string& out) {
  std::array<char, 36> text;
  char* p = text.data();
  for (std::size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) *p++ = '-';
    p = boost::algorithm::hex_lower(&uuid[i], &uuid[i] + 1, p);
  }
  out.assign(text.data(), text.size());
}

// An integer's decimal text in out, reusing out's storage.
template <class Int>
void format_decimal(Int value, std::string& out) {
  std::array<char, 24> text;
  const auto end = std::to_chars(text.data(), text.data() + text.size(), value).ptr;
  out.assign(text.data(), end);
}

// Reads the number in s[pos, pos + len), which it must fill.
bool read_number(std::string_view s, std::size_t pos, std::size_t len, int& out) {
  if (pos + len > s.size()) return false;
  auto r = std::from_chars(s.data() + pos, s.data() + pos + len, out);
  return r.ec == std::errc{} && r.ptr == s.data() + pos + len;
}

// PostgreSQL's ISO text form: "2026-11-30 04:51:07.123456+00" (or +05:30, or no zone).
bool parse_iso_timestamp(std::string_view s, std::int64_t& unix_ms) {
  int y, mo, d, h, mi, sec;
  if (s.size() < 19 || !read_number(s, 0, 4, y) || s[4] != '-' || !read_number(s, 5, 2, mo) || s[7] != '-' ||
      !read_number(s, 8, 2, d) || (s[10] != ' ' && s[10] != 'T') || !read_number(s, 11, 2, h) || s[13] != ':' ||
      !read_number(s, 14, 2, mi) || s[16] != ':' || !read_number(s, 17, 2, sec))
    return false;
  std::size_t pos = 19;
  std::int64_t micros = 0;
  if (pos < s.size() && s[pos] == '.') {
    ++pos;
    int digits = 0;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
      if (digits < 6) micros = micros * 10 + (s[pos] - '0'), ++digits;
      ++pos;
    }
    while (digits++ < 6) micros *= 10;
  }
  int offset_s = 0;
  if (pos + 1 == s.size() && s[pos] == 'Z') {
    ++pos;  // JSON's (ISO 8601's) UTC
  } else if (pos < s.size() && (s[pos] == '+' || s[pos] == '-')) {
    int sign = s[pos] == '-' ? -1 : 1, oh = 0, om = 0, os = 0;
    if (!read_number(s, pos + 1, 2, oh)) return false;
    pos += 3;
    if (pos < s.size() && s[pos] == ':') {
      if (!read_number(s, pos + 1, 2, om)) return false;
      pos += 3;
      if (pos < s.size() && s[pos] == ':') {
        if (!read_number(s, pos + 1, 2, os)) return false;
        pos += 3;
      }
    }
    offset_s = sign * (oh * 3600 + om * 60 + os);
  }
  if (pos != s.size()) return false;
  using namespace std::chrono;
  const year_month_day date{year{y}, month{static_cast<unsigned>(mo)}, day{static_cast<unsigned>(d)}};
  // sys_days of an impossible date (a 13th month, February 30th) is unspecified.
  if (!date.ok()) return false;
  const sys_seconds utc = sys_days{date} + hours{h} + minutes{mi} + seconds{sec} - seconds{offset_s};
  // micros is never negative, so truncating it floors the whole instant.
  unix_ms = (utc.time_since_epoch() + duration_cast<milliseconds>(microseconds{micros})).count();
  return true;
}

}  // namespace

OutboxMapper::OutboxMapper(const Config& config) : config_(config) {
  if (config_.route_topic_regex != Config::default_route_topic_regex)
    route_regex_.emplace(config_.route_topic_regex, boost::regex::perl);
  // The regex's group names, as written: (?<name>...), (?P<name>...), (?'name'...).
  std::vector<std::string> groups{"routedByValue"};
  if (route_regex_) {
    groups.clear();
    static const boost::regex named(R"(\(\?P?<([A-Za-z][A-Za-z0-9_]*)>|\(\?'([A-Za-z][A-Za-z0-9_]*)')");
    for (boost::sregex_iterator it(config_.route_topic_regex.begin(), config_.route_topic_regex.end(), named), end;
         it != end; ++it)
      groups.push_back((*it)[1].matched ? (*it)[1].str() : (*it)[2].str());
  }
  std::string ignored;
  expand_route_replacement(
      config_.route_topic_replacement,
      [&](std::string_view ref) -> std::optional<std::string_view> {
        const std::string name(ref);
        const bool number = std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!number && std::find(groups.begin(), groups.end(), name) == groups.end() &&
            std::find(route_column_names_.begin(), route_column_names_.end(), name) == route_column_names_.end())
          route_column_names_.push_back(name);
        return std::string_view("x");
      },
      ignored);
  route_column_values_.resize(route_column_names_.size());
  route_column_bufs_.resize(route_column_names_.size());
  ce_source_ = config_.cloudevents_source_or_default();
}

bool OutboxMapper::on_relation(const pgoutput::Relation& relation) {
  RelationInfo info;
  std::string schema = relation.nspname.empty() ? "pg_catalog" : std::string(relation.nspname);
  info.table = schema + "." + std::string(relation.relname);
  for (std::size_t i = 0; i < config_.table_include_list.size(); ++i) {
    const auto& t = config_.table_include_list[i];
    if (t.schema == schema && t.name == relation.relname) {
      info.outbox = true;
      info.table_index = static_cast<std::uint16_t>(i);
    }
  }
  for (const pgoutput::RelationColumn& c : relation.columns) {
    info.column_names.emplace_back(c.name);
    info.column_types.push_back(c.type_oid);
  }
  auto find = [&](const std::string& name, bool required) {
    ColumnRef ref;
    if (name.empty()) return ref;
    for (std::size_t i = 0; i < info.column_names.size(); ++i)
      if (info.column_names[i] == name) {
        ref.index = static_cast<int>(i);
        ref.type_oid = info.column_types[i];
      }
    if (!ref && required) info.missing += (info.missing.empty() ? "" : ", ") + name;
    return ref;
  };
  info.id = find(config_.field_event_id, true);
  info.key = find(config_.field_event_key, true);
  info.payload = find(config_.field_event_payload, true);
  info.timestamp = find(config_.field_event_timestamp, true);
  info.route = find(config_.route_by_field, config_.routes_by_value());
  info.tracing = find(config_.tracing_span_context_field, false);  // used where the table has it
  info.headers = find(config_.field_event_headers, true);
  // The CloudEvents type is required; otherwise the column is not read.
  info.type = find(config_.field_event_type,
                   config_.cloudevents != CloudEventsMode::none ||
                       (config_.registry.format != RegistryFormat::none &&
                        config_.registry.subject_strategy != SubjectNameStrategy::topic));
  info.schema_version = find(config_.field_event_schema_version, true);
  for (auto& name : route_column_names_) info.route_columns.push_back(find(name, true));
  // A placed column the table lacks is its mapping error, or with
  // table.fields.additional.error.on.missing=false a field left out.
  for (auto& p : config_.additional_placement)
    info.placements.push_back({find(p.column, config_.additional_error_on_missing), p.alias, p.column});
  bool outbox = info.outbox;
  relations_[relation.oid] = std::move(info);
  return outbox;
}

bool OutboxMapper::is_outbox(std::uint32_t relation_oid) const {
  auto it = relations_.find(relation_oid);
  return it != relations_.end() && it->second.outbox;
}

std::string_view OutboxMapper::table_name(std::uint32_t relation_oid) const {
  auto it = relations_.find(relation_oid);
  return it == relations_.end() ? std::string_view{} : std::string_view(it->second.table);
}

std::optional<MapError> OutboxMapper::text_of(const RelationInfo& rel, const ColumnRef& ref,
                                              const pgoutput::Column& column, std::string& buf,
                                              std::string_view& out, std::string_view role) const {
  const std::string& name = rel.column_names[static_cast<std::size_t>(ref.index)];
  switch (column.kind) {
    case pgoutput::ColumnKind::null:
      return MapError{"null_value", std::string(role) + " column \"" + name + "\" is NULL"};
    case pgoutput::ColumnKind::unchanged_toast:
      return MapError{"unchanged_toast",
                      std::string(role) + " column \"" + name + "\" was sent as an unchanged TOAST value"};
    case pgoutput::ColumnKind::text:
      out = column.text();
      return std::nullopt;
    case pgoutput::ColumnKind::binary:
      break;
  }
  // Binary send format: produce PostgreSQL's text form for the common key types.
  const auto& d = column.data;
  auto bad = [&]() {
    return MapError{"unsupported_type", std::string(role) + " column \"" + name + "\" has type OID " +
                                            std::to_string(ref.type_oid) +
                                            " that walrelay cannot read in binary mode (set pgoutput.binary=false)"};
  };
  namespace binary = pgoutput::binary;
  switch (ref.type_oid) {
    case pgtype::text: case pgtype::varchar: case pgtype::bpchar: case pgtype::name: case pgtype::json:
      out = column.text();
      return std::nullopt;
    case pgtype::jsonb: {
      const auto text = binary::to_jsonb_text(d);
      if (!text) return bad();
      out = *text;
      return std::nullopt;
    }
    case pgtype::uuid: {
      const auto uuid = binary::to_uuid(d);
      if (!uuid) return bad();
      format_uuid(*uuid, buf);
      break;
    }
    case pgtype::int8: {
      const auto v = binary::to_int64(d);
      if (!v) return bad();
      format_decimal(*v, buf);
      break;
    }
    case pgtype::int4: {
      const auto v = binary::to_int32(d);
      if (!v) return bad();
      format_decimal(*v, buf);
      break;
    }
    case pgtype::oid: {
      const auto v = binary::to_oid(d);
      if (!v) return bad();
      format_decimal(*v, buf);
      break;
    }
    case pgtype::int2: {
      const auto v = binary::to_int16(d);
      if (!v) return bad();
      format_decimal(*v, buf);
      break;
    }
    case pgtype::bool_: {
      const auto v = binary::to_bool(d);
      if (!v) return bad();
      buf = *v ? "t" : "f";
      break;
    }
    default:
      return bad();
  }
  out = buf;
  return std::nullopt;
}

std::optional<MapError> OutboxMapper::timestamp_of(const RelationInfo& rel, const pgoutput::Column& column,
                                                   std::int64_t& out_ms) const {
  const std::string& name = rel.column_names[static_cast<std::size_t>(rel.timestamp.index)];
  auto bad = [&](const std::string& why) {
    return MapError{"bad_timestamp", "timestamp column \"" + name + "\": " + why};
  };
  if (column.kind == pgoutput::ColumnKind::null) return bad("is NULL");
  auto oid = rel.timestamp.type_oid;
  if (column.kind == pgoutput::ColumnKind::binary) {
    if (oid == pgtype::timestamptz || oid == pgtype::timestamp) {
      if (const auto micros = pgoutput::binary::to_timestamp(column.data)) {
        out_ms = pg_epoch_unix_ms + *micros / 1000;
        return std::nullopt;
      }
    }
    if (oid == pgtype::int8) {
      if (const auto ms = pgoutput::binary::to_int64(column.data)) {
        out_ms = *ms;
        return std::nullopt;
      }
    }
    return bad("type OID " + std::to_string(oid) + " is not timestamptz, timestamp or bigint");
  }
  auto text = column.text();
  if (oid == pgtype::int8 || oid == pgtype::int4) {
    auto r = std::from_chars(text.data(), text.data() + text.size(), out_ms);
    if (r.ec == std::errc{} && r.ptr == text.data() + text.size()) return std::nullopt;
    return bad("\"" + std::string(text) + "\" is not epoch milliseconds");
  }
  if (oid == pgtype::timestamptz || oid == pgtype::timestamp) {
    if (parse_iso_timestamp(text, out_ms)) return std::nullopt;
    return bad("could not parse \"" + std::string(text) + "\"");
  }
  return bad("type OID " + std::to_string(oid) + " is not timestamptz, timestamp or bigint");
}

std::optional<MapError> OutboxMapper::map(const pgoutput::Insert& insert, std::int64_t commit_time_us,
                                          OutboxRecord& out) {
  auto it = relations_.find(insert.relation_oid);
  if (it == relations_.end())
    return MapError{"unknown_relation", "Insert for relation OID " + std::to_string(insert.relation_oid) +
                                            " that no Relation message described"};
  const RelationInfo& rel = it->second;
  out.table_index = rel.table_index;
  if (!rel.missing.empty())
    return MapError{"missing_column", "table " + rel.table + " has no column " + rel.missing};

  columns_.clear();
  for (const pgoutput::Column& c : insert.new_tuple) columns_.push_back(c);
  if (columns_.size() != rel.column_names.size())
    return MapError{"column_count", "row of " + rel.table + " has " + std::to_string(columns_.size()) +
                                        " columns, its Relation message " + std::to_string(rel.column_names.size())};

  std::string_view id;
  if (auto e = text_of(rel, rel.id, column(rel.id), id_buf_, id, "event id")) return e;
  std::string_view key;
  if (auto e = text_of(rel, rel.key, column(rel.key), key_buf_, key, "event key")) return e;
  out.key = key;
  if (auto e = row_topic(rel, out)) return e;
  if (auto e = row_value(rel, out)) return e;
  if (rel.timestamp) {
    if (auto e = timestamp_of(rel, column(rel.timestamp), out.timestamp_ms)) return e;
  } else {
    out.timestamp_ms = pg_epoch_unix_ms + commit_time_us / 1000;
  }
  if (auto e = row_headers(rel, id, out)) return e;
  convert(out, rel.payload.type_oid == pgtype::bytea);
  if (auto e = row_schema_fields(rel, out)) return e;
  if (config_.cloudevents != CloudEventsMode::none) {
    const pgoutput::Column& c = column(rel.type);
    if (c.is_null())
      return MapError{"null_value", "CloudEvents type column \"" + config_.field_event_type + "\" is NULL"};
    std::string_view type;
    if (auto e = text_of(rel, rel.type, c, ce_type_buf_, type, "CloudEvents type")) return e;
    const auto t = rel.payload.type_oid;
    cloudevent(id, type, key, t == pgtype::json || t == pgtype::jsonb, t == pgtype::bytea, out);
  }
  row_trace(rel, out);
  return std::nullopt;
}

// Topic: ${routedByValue} replaced by the route column's text form.
std::optional<MapError> OutboxMapper::row_topic(const RelationInfo& rel, OutboxRecord& out) {
  if (!config_.routes_by_value()) {
    out.topic = config_.route_topic_replacement;
    return std::nullopt;
  }
  std::string_view route;
  if (auto e = text_of(rel, rel.route, column(rel.route), route_buf_, route, "route")) return e;
  for (std::size_t i = 0; i < rel.route_columns.size(); ++i) {
    const pgoutput::Column& c = column(rel.route_columns[i]);
    if (c.is_null())
      return MapError{"null_value", "route column \"" + route_column_names_[i] +
                                        "\" (named by route.topic.replacement) is NULL: no topic to route to"};
    if (auto e = text_of(rel, rel.route_columns[i], c, route_column_bufs_[i], route_column_values_[i], "route"))
      return e;
  }
  return route_to(route, "route column", out);
}

// Value: the payload as stored. NULL is a tombstone; so is an empty payload
// when route.tombstone.on.empty.payload is set.
std::optional<MapError> OutboxMapper::row_value(const RelationInfo& rel, OutboxRecord& out) {
  const pgoutput::Column& payload = column(rel.payload);
  if (payload.is_null()) {
    out.value.reset();
  } else if (payload.is_unchanged_toast()) {
    return MapError{"unchanged_toast", "payload column sent as an unchanged TOAST value"};
  } else if (rel.payload.type_oid == pgtype::bytea) {
    if (payload.kind == pgoutput::ColumnKind::binary) {
      out.value = payload.text();
    } else {
      if (!decode_bytea_hex(payload.text(), value_buf_))
        return MapError{"bad_value", "bytea payload is not in hex format"};
      out.value = value_buf_;
    }
  } else {
    std::string_view v;
    if (auto e = text_of(rel, rel.payload, payload, value_buf_, v, "payload")) return e;
    out.value = v;
  }
  tombstone_if_empty(out);
  return std::nullopt;
}

// An empty payload as a tombstone, when route.tombstone.on.empty.payload says so.
void OutboxMapper::tombstone_if_empty(OutboxRecord& out) const {
  if (out.value && out.value->empty() && config_.route_tombstone_on_empty_payload) out.value.reset();
}

// The headers a mapped record starts with (its id), and no placement yet.
void OutboxMapper::start_headers(std::string_view id, OutboxRecord& out) {
  out.headers.clear();
  out.headers.push_back({"id", id});
  out.event_id = id;
  out.partition = -1;
  envelope_.clear();
}

// The id header, the placed columns (header, envelope, partition) and the
// headers column's members.
std::optional<MapError> OutboxMapper::row_headers(const RelationInfo& rel, std::string_view id, OutboxRecord& out) {
  start_headers(id, out);
  if (header_bufs_.size() < rel.placements.size()) header_bufs_.resize(rel.placements.size());
  for (std::size_t i = 0; i < rel.placements.size(); ++i) {
    const PlacedColumn& p = rel.placements[i];
    if (!p.column) continue;  // absent, and error.on.missing=false
    const pgoutput::Column& c = column(p.column);
    if (c.is_null()) {
      if (auto e = place(i, std::nullopt, false, out)) return e;
      continue;
    }
    std::string_view v;
    if (auto e = text_of(rel, p.column, c, header_bufs_[i], v, placement_name(config_.additional_placement[i].placement))) return e;
    const auto t = p.column.type_oid;
    const bool number = t == pgtype::int2 || t == pgtype::int4 || t == pgtype::int8 || t == pgtype::oid;
    if (auto e = place(i, v, number, out)) return e;
  }
  if (rel.headers) {
    const pgoutput::Column& c = column(rel.headers);
    if (!c.is_null()) {
      std::string_view text;
      if (auto e = text_of(rel, rel.headers, c, headers_text_buf_, text, "headers")) return e;
      if (auto e = add_row_headers(text, out)) return e;
    }
  }
  return std::nullopt;
}

// With a schema registry: the event's type (for the record name strategies)
// and the schema version the row asks for.
std::optional<MapError> OutboxMapper::row_schema_fields(const RelationInfo& rel, OutboxRecord& out) {
  out.event_type.reset();
  out.schema_version.reset();
  if (config_.registry.format == RegistryFormat::none) return std::nullopt;
  if (rel.type && config_.registry.subject_strategy != SubjectNameStrategy::topic && !column(rel.type).is_null()) {
    std::string_view type;
    if (auto e = text_of(rel, rel.type, column(rel.type), event_type_buf_, type, "type")) return e;
    out.event_type = type;
  }
  if (rel.schema_version && !column(rel.schema_version).is_null()) {
    std::string_view text;
    if (auto e = text_of(rel, rel.schema_version, column(rel.schema_version), schema_version_buf_, text, "schema version"))
      return e;
    int version = 0;
    auto r = std::from_chars(text.data(), text.data() + text.size(), version);
    if (r.ec != std::errc{} || r.ptr != text.data() + text.size() || version < 1)
      return MapError{"bad_value", "schema version column \"" + config_.field_event_schema_version + "\" holds \"" +
                                       std::string(text.substr(0, 40)) + "\", not a version number (1, 2, ...)"};
    out.schema_version = version;
  }
  return std::nullopt;
}

// The trace context column's traceparent and tracestate headers; a problem
// with it is noted (trace_problem_), never the row's mapping error.
void OutboxMapper::row_trace(const RelationInfo& rel, OutboxRecord& out) {
  trace_problem_.clear();
  if (!rel.tracing || !config_.tracing_enabled) return;
  const pgoutput::Column& c = column(rel.tracing);
  std::string_view text;
  if (c.kind == pgoutput::ColumnKind::text || c.kind == pgoutput::ColumnKind::binary) {
    if (auto e = text_of(rel, rel.tracing, c, trace_text_buf_, text, "tracing span context"))
      trace_problem_ = e->message;
    else
      add_trace_headers(text, out);
  }
}

std::optional<MapError> OutboxMapper::place(std::size_t index, std::optional<std::string_view> value, bool json,
                                            OutboxRecord& out) {
  const AdditionalField& f = config_.additional_placement[index];
  if (f.placement == Placement::header) {
    out.headers.push_back({f.alias, value});
  } else if (f.placement == Placement::envelope) {
    envelope_.push_back({index, value, json});
  } else if (value) {  // partition; NULL leaves it to the key
    std::int32_t p = -1;
    auto r = std::from_chars(value->data(), value->data() + value->size(), p);
    if (r.ec != std::errc{} || r.ptr != value->data() + value->size() || p < 0)
      return MapError{"bad_partition", "partition placement \"" + f.column + "\" value \"" +
                                           std::string(value->substr(0, 40)) + "\" is not a partition number"};
    out.partition = p;
  }
  return std::nullopt;
}

namespace {
// A JSON value that is not a string or null as its text: an object or array
// as written, a number or boolean as its token, trailing blanks dropped.
// nullopt when it is not valid JSON.
std::optional<std::string_view> json_text(simdjson::ondemand::value& value, simdjson::ondemand::json_type type) {
  namespace od = simdjson::ondemand;
  std::string_view raw;
  bool failed = false;
  if (type == od::json_type::object) {
    od::object o;
    failed = value.get_object().get(o) || o.raw_json().get(raw);
  } else if (type == od::json_type::array) {
    od::array a;
    failed = value.get_array().get(a) || a.raw_json().get(raw);
  } else {
    raw = value.raw_json_token();
  }
  if (failed) return std::nullopt;
  while (!raw.empty() && (raw.back() == ' ' || raw.back() == '\n' || raw.back() == '\r' || raw.back() == '\t'))
    raw.remove_suffix(1);
  return raw;
}
}  // namespace

std::optional<MapError> OutboxMapper::add_row_headers(std::string_view json, OutboxRecord& out) {
  namespace od = simdjson::ondemand;
  // Its own parser: a message's member views may point into the other one's.
  static thread_local od::parser parser;
  auto bad = [&](const std::string& why) {
    return MapError{"bad_headers", "headers \"" + config_.field_event_headers + "\": " + why};
  };
  headers_json_buf_.assign(json);
  headers_json_buf_.append(simdjson::SIMDJSON_PADDING, '\0');
  // Unescaped names and values are never longer than their JSON text, and a
  // NUL per name needs at most one byte per member: this never reallocates.
  headers_store_.clear();
  headers_store_.reserve(2 * json.size() + 16);
  od::document doc;
  od::object object;
  if (parser.iterate(headers_json_buf_.data(), json.size(), headers_json_buf_.size()).get(doc) ||
      doc.get_object().get(object))
    return bad("not a JSON object");
  for (auto field : object) {
    std::string_view name;
    if (field.unescaped_key().get(name)) return bad("a member's name is not valid JSON");
    const auto name_at = headers_store_.size();
    headers_store_.append(name);
    headers_store_.push_back('\0');
    std::string_view name_view(headers_store_.data() + name_at, name.size());
    od::value value = field.value();
    od::json_type type;
    if (value.type().get(type)) return bad("member \"" + std::string(name) + "\" is not valid JSON");
    if (type == od::json_type::null) {
      if (value.is_null().error()) return bad("member \"" + std::string(name) + "\" is not valid JSON");
      out.headers.push_back({name_view, std::nullopt});
    } else if (type == od::json_type::string) {
      std::string_view v;
      if (value.get_string().get(v)) return bad("member \"" + std::string(name) + "\" is not valid JSON");
      const auto at = headers_store_.size();
      headers_store_.append(v);
      out.headers.push_back({name_view, std::string_view(headers_store_.data() + at, v.size())});
    } else {
      auto raw = json_text(value, type);
      if (!raw) return bad("member \"" + std::string(name) + "\" is not valid JSON");
      out.headers.push_back({name_view, *raw});  // a view into headers_json_buf_
    }
  }
  return std::nullopt;
}

namespace {
// A string as a JSON string (invalid UTF-8 as U+FFFD).
std::string json_string(std::string_view s) {
  return Json(std::string(s)).dump(-1, ' ', false, Json::error_handler_t::replace);
}
}  // namespace

void OutboxMapper::convert(OutboxRecord& out, bool payload_bytes) {
  if (config_.key_converter == Converter::json && out.key) {
    converted_key_buf_ = json_string(*out.key);
    out.key = converted_key_buf_;
  }
  if (!out.value) return;  // a tombstone stays one
  std::string_view payload = *out.value;
  bool payload_json = false;
  if (payload_bytes) {
    // Bytes are no text: under JsonConverter or in an envelope they are a
    // base64 string, as Connect writes a BYTES field.
    if (config_.value_converter != Converter::json && envelope_.empty()) return;
    namespace b64 = boost::beast::detail::base64;
    expanded_buf_.assign(1, '"');
    expanded_buf_.resize(1 + b64::encoded_size(payload.size()));
    expanded_buf_.resize(1 + b64::encode(expanded_buf_.data() + 1, payload.data(), payload.size()));
    expanded_buf_ += '"';
    payload = expanded_buf_;
    payload_json = true;
  } else if (config_.expand_json_payload || config_.registry.format != RegistryFormat::none) {
    // (A schema registry's converter encodes the payload's JSON: it is read
    // as JSON whatever table.expand.json.payload says.)
    // Debezium parses the payload and writes it back compact; text that is
    // not JSON stays a string.
    static thread_local simdjson::dom::parser parser;
    simdjson::dom::element ignored;
    if (!parser.parse(payload.data(), payload.size()).get(ignored)) {
      expanded_buf_.resize(payload.size() + simdjson::SIMDJSON_PADDING);
      std::size_t len = 0;
      if (!simdjson::minify(payload.data(), payload.size(), expanded_buf_.data(), len)) {
        expanded_buf_.resize(len);
        payload = expanded_buf_;
        payload_json = true;
      }
    }
  }
  if (!envelope_.empty()) {
    std::string& v = converted_value_buf_;
    v = "{\"payload\":";
    v += payload_json ? std::string(payload) : json_string(payload);
    for (const EnvelopeMember& m : envelope_) {
      v += ',';
      v += json_string(config_.additional_placement[m.index].alias);
      v += ':';
      if (!m.value) v += "null";
      else if (m.json) v.append(*m.value);
      else v += json_string(*m.value);
    }
    v += '}';
    out.value = v;
  } else if (config_.value_converter == Converter::json && !payload_json) {
    converted_value_buf_ = json_string(payload);
    out.value = converted_value_buf_;
  } else {
    out.value = payload;
  }
}

void OutboxMapper::cloudevent(std::string_view id, std::string_view type, std::optional<std::string_view> subject,
                              bool payload_json, bool payload_bytes, OutboxRecord& out) {
  // time: the record's timestamp (the timestamp column, or the commit), RFC 3339 in UTC.
  {
    const std::time_t secs = static_cast<std::time_t>(out.timestamp_ms / 1000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[40];
    const auto n = std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                                 static_cast<int>(out.timestamp_ms % 1000));
    ce_time_buf_.assign(buf, static_cast<std::size_t>(n));
  }
  // What the payload is: JSON goes in as data, bytes as data_base64, other text as a string.
  std::string_view payload = out.value.value_or(std::string_view{});
  if (out.value && !payload_json && !payload_bytes) {
    static thread_local simdjson::dom::parser parser;
    simdjson::dom::element ignored;
    payload_json = !parser.parse(payload.data(), payload.size()).get(ignored);
  }
  const char* content_type = payload_bytes  ? "application/octet-stream"
                             : payload_json ? "application/json"
                                            : "text/plain; charset=utf-8";
  if (config_.cloudevents == CloudEventsMode::binary) {
    out.headers.push_back({"ce_specversion", std::string_view("1.0")});
    out.headers.push_back({"ce_id", id});
    out.headers.push_back({"ce_source", std::string_view(ce_source_)});
    out.headers.push_back({"ce_type", type});
    out.headers.push_back({"ce_time", std::string_view(ce_time_buf_)});
    if (subject) out.headers.push_back({"ce_subject", *subject});
    if (out.value) out.headers.push_back({"content-type", std::string_view(content_type)});
    return;
  }
  std::string& v = ce_value_buf_;
  v = "{\"specversion\":\"1.0\",\"id\":";
  v += json_string(id);
  v += ",\"source\":";
  v += json_string(ce_source_);
  v += ",\"type\":";
  v += json_string(type);
  if (subject) {
    v += ",\"subject\":";
    v += json_string(*subject);
  }
  v += ",\"time\":\"";
  v += ce_time_buf_;
  v += '"';
  if (out.value) {
    v += ",\"datacontenttype\":\"";
    v += content_type;
    if (payload_bytes) {
      namespace b64 = boost::beast::detail::base64;
      v += "\",\"data_base64\":\"";
      const auto at = v.size();
      v.resize(at + b64::encoded_size(payload.size()));
      v.resize(at + b64::encode(v.data() + at, payload.data(), payload.size()));
      v += '"';
    } else {
      v += "\",\"data\":";
      if (payload_json) v += payload;
      else v += json_string(payload);
    }
  }
  v += '}';
  out.value = v;
  out.headers.push_back({"content-type", std::string_view("application/cloudevents+json; charset=UTF-8")});
}

void OutboxMapper::add_trace_headers(std::string_view text, OutboxRecord& out) {
  if (!parse_trace_context(text, traceparent_buf_, tracestate_buf_, trace_problem_)) return;
  out.headers.push_back({"traceparent", traceparent_buf_});
  if (!tracestate_buf_.empty()) out.headers.push_back({"tracestate", tracestate_buf_});
}

std::optional<std::string_view> OutboxMapper::route_column(std::string_view name) const {
  for (std::size_t i = 0; i < route_column_names_.size(); ++i)
    if (route_column_names_[i] == name) return route_column_values_[i];
  return std::nullopt;
}

std::optional<MapError> OutboxMapper::route_to(std::string_view route, std::string_view what, OutboxRecord& out) {
  if (route.empty())
    return MapError{"empty_route", std::string(what) + " \"" + config_.route_by_field + "\" is empty: no topic to route to"};
  if (!route_regex_) {
    // The default regex, (?<routedByValue>.*): every group is the whole value.
    auto problem = expand_route_replacement(
        config_.route_topic_replacement,
        [&](std::string_view name) -> std::optional<std::string_view> {
          if (name == "routedByValue" || name == "0" || name == "1") return route;
          return route_column(name);
        },
        topic_buf_);
    if (problem) return MapError{"invalid_topic", *problem};
  } else {
    // Routes repeat: each value's topic is worked out once.
    if (route_column_names_.empty())
      if (auto it = topic_cache_.find(route); it != topic_cache_.end()) {
        out.topic = it->second;
        return std::nullopt;
      }
    const std::string value(route);
    boost::smatch match;
    if (boost::regex_match(value, match, *route_regex_)) {
      auto problem = expand_route_replacement(config_.route_topic_replacement, [&](std::string_view ref) -> std::optional<std::string_view> {
        const std::string name(ref);
        if (!name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
          const auto n = std::stoul(name);
          if (n >= match.size()) return std::nullopt;
          return std::string_view(value).substr(static_cast<std::size_t>(match.position(static_cast<int>(n))),
                                                static_cast<std::size_t>(match.length(static_cast<int>(n))));
        }
        const auto& sub = match[name];
        if (!sub.matched && match.named_subexpression_index(name.c_str(), name.c_str() + name.size()) < 0)
          return route_column(ref);
        return sub.matched ? std::string_view(&*sub.first, static_cast<std::size_t>(sub.length())) : std::string_view{};
      }, topic_buf_);
      if (problem) return MapError{"invalid_topic", *problem};
    } else {
      topic_buf_ = value;  // no match: the route value is the topic (Debezium)
    }
  }
  // Event data names the topic: check it as Kafka would, so that a bad value
  // is this event's mapping error, not a producer or broker refusal later.
  if (auto why = illegal_topic_reason(topic_buf_))
    return MapError{"invalid_topic", std::string(what) + " \"" + config_.route_by_field + "\" value \"" + printable(route, 100) +
                                         "\" makes an illegal Kafka topic name: " + *why + " (topic \"" +
                                         printable(topic_buf_, 300) + "\")"};
  if (route_regex_ && route_column_names_.empty()) {
    if (topic_cache_.size() >= max_cached_topics) topic_cache_.clear();
    out.topic = topic_cache_.emplace(std::string(route), topic_buf_).first->second;
  } else {
    out.topic = topic_buf_;
  }
  return std::nullopt;
}

std::string OutboxMapper::row_json(const pgoutput::Insert& insert) const {
  auto it = relations_.find(insert.relation_oid);
  const std::vector<std::string>* names = it == relations_.end() ? nullptr : &it->second.column_names;
  Json row = Json::object();
  std::size_t i = 0;
  for (const pgoutput::Column& c : insert.new_tuple) {
    std::string name = names != nullptr && i < names->size() ? (*names)[i] : "column" + std::to_string(i);
    // A row longer than its Relation names its extra columns "columnN"; a
    // real column may have that name, and neither value may be lost.
    while (row.contains(name)) name.insert(0, 1, '_');
    if (c.is_null()) {
      row[name] = nullptr;
    } else if (c.kind == pgoutput::ColumnKind::binary) {
      row[name] = bytea_hex(c.data);
    } else {
      row[name] = c.text();
    }
    ++i;
  }
  return to_json_text(row);
}

std::string OutboxMapper::event_id_of(const pgoutput::Insert& insert) const {
  auto it = relations_.find(insert.relation_oid);
  if (it == relations_.end() || !it->second.id) return {};
  std::size_t i = 0;
  for (const pgoutput::Column& c : insert.new_tuple) {
    if (static_cast<int>(i++) != it->second.id.index) continue;
    if (c.kind != pgoutput::ColumnKind::text && c.kind != pgoutput::ColumnKind::binary) return {};
    std::string buf;
    std::string_view v;
    if (text_of(it->second, it->second.id, c, buf, v, "id")) return {};
    return std::string(v);
  }
  return {};
}

// A logical message's content. simdjson's on-demand reader: one pass over
// the members, views into the content (or into the parser's buffer for
// strings with escapes), nothing allocated per message once warm.
std::optional<MapError> OutboxMapper::map_message(const pgoutput::LogicalMessage& message,
                                                  std::int64_t commit_time_us, std::uint16_t source_index,
                                                  OutboxRecord& out) {
  out.table_index = source_index;
  MessageMembers m;
  if (auto e = read_members(message.content, m)) return e;
  if (auto e = required(m.id, config_.field_event_id, "event id")) return e;
  if (auto e = required(m.key, config_.field_event_key, "event key")) return e;
  out.key = m.key.text;
  if (auto e = message_topic(m.route, out)) return e;
  // The payload as written: a string's characters, other JSON as its text;
  // null is a tombstone, as a NULL payload column is.
  if (!m.payload.present)
    return MapError{"missing_column", "payload member \"" + config_.field_event_payload + "\" is missing"};
  if (m.payload.null) out.value.reset();
  else out.value = m.payload.text;
  tombstone_if_empty(out);
  if (auto e = message_timestamp(m.timestamp, commit_time_us, out)) return e;

  start_headers(m.id.text, out);
  for (std::size_t i = 0; i < placed_members_.size(); ++i) {
    const MessageMember& p = placed_members_[i];
    auto value = !p.present || p.null ? std::nullopt : std::optional<std::string_view>(p.text);
    if (auto e = place(i, value, !p.string, out)) return e;
  }
  if (m.headers.present && !m.headers.null)
    if (auto e = add_row_headers(m.headers.text, out)) return e;
  convert(out, false);
  out.event_type.reset();
  out.schema_version.reset();
  if (config_.registry.format != RegistryFormat::none && m.type.present && !m.type.null) out.event_type = m.type.text;
  if (config_.cloudevents != CloudEventsMode::none) {
    if (auto e = required(m.type, config_.field_event_type, "CloudEvents type")) return e;
    cloudevent(m.id.text, m.type.text, m.key.text, m.payload.present && !m.payload.string, false, out);
  }
  trace_problem_.clear();
  if (config_.tracing_enabled && m.tracing.present && !m.tracing.null) add_trace_headers(m.tracing.text, out);
  return std::nullopt;
}

// A member the mapping needs, missing or null: its mapping error.
std::optional<MapError> OutboxMapper::required(const MessageMember& m, const std::string& member,
                                               std::string_view role) {
  if (!m.present) return MapError{"missing_column", std::string(role) + " member \"" + member + "\" is missing"};
  if (m.null) return MapError{"null_value", std::string(role) + " member \"" + member + "\" is null"};
  return std::nullopt;
}

// Reads the content's members that the mapping uses into `m`,
// placed_members_ and route_members_, in one pass; the others unread.
std::optional<MapError> OutboxMapper::read_members(pgoutput::Bytes content, MessageMembers& m) {
  namespace od = simdjson::ondemand;
  static thread_local od::parser parser;
  message_buf_.assign(reinterpret_cast<const char*>(content.data()), content.size());
  message_buf_.append(simdjson::SIMDJSON_PADDING, '\0');
  auto bad = [](std::string why) { return MapError{"bad_content", std::move(why)}; };
  od::document doc;
  if (parser.iterate(message_buf_.data(), content.size(), message_buf_.size()).get(doc))
    return bad("the content is not JSON");
  od::object object;
  if (doc.get_object().get(object)) return bad("the content is not a JSON object");

  placed_members_.assign(config_.additional_placement.size(), MessageMember{});
  route_members_.assign(route_column_names_.size(), MessageMember{});
  for (auto field : object) {
    std::string_view name;
    if (field.unescaped_key().get(name)) return bad("a member's name is not valid JSON");
    MessageMember* targets[16];
    const std::size_t n = member_targets(name, m, targets);
    bool wanted = n > 0;
    for (std::size_t i = 0; i < config_.additional_placement.size(); ++i)
      if (name == config_.additional_placement[i].column) wanted = true;
    if (!wanted) continue;  // skipped unread by the on-demand reader
    od::value value = field.value();
    MessageMember member;
    member.present = true;
    od::json_type type;
    if (value.type().get(type)) return bad("member \"" + std::string(name) + "\" is not valid JSON");
    if (type == od::json_type::null) {
      member.null = true;
      if (value.is_null().error()) return bad("member \"" + std::string(name) + "\" is not valid JSON");
    } else if (type == od::json_type::string) {
      member.string = true;
      if (value.get_string().get(member.text))
        return bad("member \"" + std::string(name) + "\" is not a valid JSON string");
    } else {
      auto raw = json_text(value, type);
      if (!raw) return bad("member \"" + std::string(name) + "\" is not valid JSON");
      member.text = *raw;
    }
    for (std::size_t i = 0; i < n; ++i) *targets[i] = member;
    for (std::size_t i = 0; i < config_.additional_placement.size(); ++i)
      if (name == config_.additional_placement[i].column) placed_members_[i] = member;
  }
  return std::nullopt;
}

// The members a member's name fills (it may be several roles' at once),
// into targets; how many.
std::size_t OutboxMapper::member_targets(std::string_view name, MessageMembers& m, MessageMember* (&targets)[16]) {
  std::size_t n = 0;
  if (name == config_.field_event_id) targets[n++] = &m.id;
  if (name == config_.field_event_key) targets[n++] = &m.key;
  if (name == config_.field_event_payload) targets[n++] = &m.payload;
  if (!config_.field_event_timestamp.empty() && name == config_.field_event_timestamp) targets[n++] = &m.timestamp;
  if (name == config_.route_by_field) targets[n++] = &m.route;
  if (!config_.tracing_span_context_field.empty() && name == config_.tracing_span_context_field)
    targets[n++] = &m.tracing;
  if (!config_.field_event_headers.empty() && name == config_.field_event_headers) targets[n++] = &m.headers;
  if (config_.cloudevents != CloudEventsMode::none && name == config_.field_event_type) targets[n++] = &m.type;
  for (std::size_t i = 0; i < route_column_names_.size() && n < std::size(targets); ++i)
    if (name == route_column_names_[i]) targets[n++] = &route_members_[i];
  return n;
}

// A message's topic: by its route member and the members
// route.topic.replacement names, or the fixed replacement.
std::optional<MapError> OutboxMapper::message_topic(const MessageMember& route, OutboxRecord& out) {
  if (!config_.routes_by_value()) {
    out.topic = config_.route_topic_replacement;
    return std::nullopt;
  }
  if (auto e = required(route, config_.route_by_field, "route")) return e;
  for (std::size_t i = 0; i < route_members_.size(); ++i) {
    if (auto e = required(route_members_[i], route_column_names_[i], "route")) return e;
    route_column_values_[i] = route_members_[i].text;
  }
  return route_to(route.text, "route member", out);
}

// A message's timestamp: its timestamp member (ISO 8601 or epoch
// milliseconds) when one is configured, else the commit's time.
std::optional<MapError> OutboxMapper::message_timestamp(const MessageMember& timestamp, std::int64_t commit_time_us,
                                                        OutboxRecord& out) const {
  if (config_.field_event_timestamp.empty()) {
    out.timestamp_ms = pg_epoch_unix_ms + commit_time_us / 1000;
    return std::nullopt;
  }
  const std::string& member = config_.field_event_timestamp;
  auto bad_ts = [&](const std::string& why) {
    return MapError{"bad_timestamp", "timestamp member \"" + member + "\": " + why};
  };
  if (!timestamp.present || timestamp.null) return bad_ts("is missing or null");
  if (timestamp.string) {
    if (!parse_iso_timestamp(timestamp.text, out.timestamp_ms))
      return bad_ts("could not parse \"" + std::string(timestamp.text) + "\"");
  } else {
    auto r = std::from_chars(timestamp.text.data(), timestamp.text.data() + timestamp.text.size(), out.timestamp_ms);
    if (r.ec != std::errc{} || r.ptr != timestamp.text.data() + timestamp.text.size())
      return bad_ts("\"" + std::string(timestamp.text) + "\" is neither epoch milliseconds nor an ISO 8601 string");
  }
  return std::nullopt;
}

}  // namespace walrelay
