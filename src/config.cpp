// Configuration parsing and validation. Strict in the PostgreSQL manner: an
// unknown key is named, a repeated one is "conflicting or redundant", a bad
// value says what was expected. Nothing here connects to anything.
#include "walrelay/config.hpp"

#include "walrelay/connect_config.hpp"
#include "walrelay/mutation.hpp"
#include "walrelay/sinks/http/http_config.hpp"
#include "walrelay/sinks/sink_table.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <functional>
#include <set>
#include <regex>
#include <sstream>

#include <boost/algorithm/hex.hpp>
#include <boost/regex.hpp>

namespace walrelay {

std::int64_t parse_int(const std::string& key, const std::string& v, std::int64_t min, std::int64_t max) {
  std::int64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc{} || p != v.data() + v.size())
    throw ConfigError(key, "expected an integer, got \"" + v + "\"");
  if (out < min || out > max)
    throw ConfigError(key, "value " + v + " out of range [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  return out;
}

bool parse_bool(const std::string& key, const std::string& v) {
  std::string l = v;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  if (l == "true") return true;
  if (l == "false") return false;
  throw ConfigError(key, "expected true or false, got \"" + v + "\"");
}

namespace {

std::string trim(std::string_view s) {
  auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  auto e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

// A SQL identifier as walrelay will quote it: any non-empty name without NUL.
void check_identifier(const std::string& key, const std::string& v) {
  if (v.empty()) throw ConfigError(key, "must not be empty");
  if (v.size() > 63) throw ConfigError(key, "longer than PostgreSQL's 63-byte identifier limit");
}

void check_slot_name(const std::string& key, const std::string& v) {
  check_identifier(key, v);
  // PostgreSQL: slot names may only contain lower case letters, numbers and underscores.
  for (unsigned char c : v)
    if (!(std::islower(c) || std::isdigit(c) || c == '_'))
      throw ConfigError(key, "replication slot names may contain only lower case letters, digits and underscores");
}

TableName parse_table(const std::string& key, const std::string& v) {
  auto dot = v.find('.');
  TableName t;
  if (dot == std::string::npos) {
    t = {"public", v};
  } else {
    t = {v.substr(0, dot), v.substr(dot + 1)};
  }
  if (t.schema.empty() || t.name.empty() || t.name.find('.') != std::string::npos)
    throw ConfigError(key, "expected schema.table, got \"" + v + "\"");
  return t;
}

using Setter = std::function<void(Config&, const std::string& key, const std::string& value)>;

struct KeySpec {
  const char* name;
  Setter set;
};

template <class T>
Setter string_field(T Config::*field) {
  return [field](Config& c, const std::string&, const std::string& v) { c.*field = v; };
}
Setter int_field(int Config::*field, std::int64_t min, std::int64_t max) {
  return [=](Config& c, const std::string& k, const std::string& v) { c.*field = static_cast<int>(parse_int(k, v, min, max)); };
}
Setter int64_field(std::int64_t Config::*field, std::int64_t min, std::int64_t max) {
  return [=](Config& c, const std::string& k, const std::string& v) { c.*field = parse_int(k, v, min, max); };
}
Setter bool_field(bool Config::*field) {
  return [=](Config& c, const std::string& k, const std::string& v) { c.*field = parse_bool(k, v); };
}
Setter column_field(std::string Config::*field, bool optional) {
  return [=](Config& c, const std::string& k, const std::string& v) {
    if (v.empty() && !optional) throw ConfigError(k, "must name a column");
    if (!v.empty()) check_identifier(k, v);
    c.*field = v;
  };
}

// One of a few names, each an enumerator: "expected a, b or c" otherwise.
template <class E>
Setter enum_field(E Config::*field, std::vector<std::pair<std::string, E>> names) {
  return [=](Config& c, const std::string& k, const std::string& v) {
    std::string expected;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (v == names[i].first) {
        c.*field = names[i].second;
        return;
      }
      expected += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i].first;
    }
    throw ConfigError(k, "expected " + expected + ", got \"" + v + "\"");
  };
}

// A Kafka Connect converter class, as a Connect configuration names it.
Setter converter_field(Converter Config::*field) {
  return [=](Config& c, const std::string& k, const std::string& v) {
    if (v == "org.apache.kafka.connect.storage.StringConverter" ||
        v == "org.apache.kafka.connect.converters.ByteArrayConverter" ||
        v == "io.debezium.converters.BinaryDataConverter" || v == "io.debezium.converters.ByteArrayConverter")
      c.*field = Converter::string;
    else if (v == "org.apache.kafka.connect.json.JsonConverter")
      c.*field = Converter::json;
    else if (k == "key.converter" && (v.starts_with("io.confluent.connect.") || v.starts_with("io.apicurio.")))
      throw ConfigError(k, "the key is the aggregate id as text, which needs no schema: use "
                           "org.apache.kafka.connect.storage.StringConverter (a schema-registry converter applies "
                           "to value.converter)");
    else
      throw ConfigError(k, "\"" + v + "\" is not a converter walrelay writes: StringConverter, ByteArrayConverter "
                           "or JsonConverter (with schemas.enable=false)");
  };
}

// A string member of one of Config's member structs.
template <class S>
Setter member_string_field(S Config::*group, std::string S::*field) {
  return [=](Config& c, const std::string& k, const std::string& v) {
    (void)k;
    c.*group.*field = v;
  };
}

// A key of another tool's that walrelay takes with one value only: what it
// writes. Any other value is refused with `reason`.
Setter only_value_field(std::string accepted, std::string reason) {
  return [=](Config& c, const std::string& k, const std::string& v) {
    (void)c;
    if (v != accepted) throw ConfigError(k, reason);
  };
}

// A schema registry's URLs, comma-separated: http or https, no trailing '/'.
std::vector<std::string> registry_urls(const std::string& k, const std::string& v) {
  auto urls = split_list(v);
  for (auto& url : urls) {
    if (!url.starts_with("http://") && !url.starts_with("https://"))
      throw ConfigError(k, "\"" + url + "\" is not an http:// or https:// URL");
    while (url.size() > 8 && url.back() == '/') url.pop_back();
  }
  return urls;
}

// auto.register.schemas, use.latest.version, latest.compatibility.strict:
// walrelay has no schema of its own (the application writes JSON), so it
// always encodes by a registered one, the subject's latest or the row's
// table.field.event.schema.version: as use.latest.version=true and
// auto.register.schemas=false do. Either value is taken, so that a pasted
// converter configuration works; what it means here is in the docs.
Setter registry_flag_field(bool any_value = false) {
  return [=](Config& c, const std::string& k, const std::string& v) {
    (void)c;
    if (!any_value && v != "true" && v != "false") throw ConfigError(k, "expected true or false, got \"" + v + "\"");
  };
}

// JsonConverter's schemas.enable: only false exists here (walrelay writes no
// schema envelope); Connect's default is true, so it must be said.
Setter schemas_enable_field() {
  return [](Config& c, const std::string& k, const std::string& v) {
    (void)c;
    if (v != "false")
      throw ConfigError(k, "only false is supported: walrelay does not write JsonConverter's schema envelope "
                           "({\"schema\": ..., \"payload\": ...}); consumers reading schemas.enable=true output "
                           "need Debezium");
  };
}

const std::vector<KeySpec>& key_specs();

}  // namespace

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, ',')) {
    auto t = trim(item);
    if (!t.empty()) out.push_back(t);
  }
  return out;
}

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  for (auto& spec : key_specs()) keys.emplace_back(spec.name);
  return keys;
}

namespace {

// "kafka or nats-jetstream", for messages.
std::string sink_type_names() {
  std::string s;
  auto kinds = sink_kinds();
  for (std::size_t i = 0; i < kinds.size(); ++i)
    s += (i == 0 ? "" : i + 1 == kinds.size() ? " or " : ", ") + std::string(kinds[i].name);
  return s;
}

const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> specs = {
      {"database.hostname", string_field(&Config::database_hostname)},
      {"database.port",
       [](Config& c, const std::string& k, const std::string& v) {
         auto ports = split_list(v);
         if (ports.empty()) throw ConfigError(k, "must name a port");
         for (auto& p : ports) parse_int(k, p, 1, 65535);
         std::string joined;
         for (auto& p : ports) joined += (joined.empty() ? "" : ",") + p;
         c.database_port = joined;
       }},
      {"database.target.session.attrs",
       [](Config& c, const std::string& k, const std::string& v) {
         static const std::set<std::string> attrs{"any", "read-write", "read-only", "primary", "standby",
                                                  "prefer-standby"};
         if (!attrs.count(v))
           throw ConfigError(k, "expected any, read-write, read-only, primary, standby or prefer-standby; got \"" + v +
                                    "\"");
         c.database_target_session_attrs = v;
       }},
      {"database.user", string_field(&Config::database_user)},
      {"database.password", string_field(&Config::database_password)},
      {"database.dbname", string_field(&Config::database_dbname)},
      {"database.sslmode",
       [](Config& c, const std::string& k, const std::string& v) {
         static const std::set<std::string> modes{"disable", "allow", "prefer", "require", "verify-ca", "verify-full"};
         if (!modes.count(v)) throw ConfigError(k, "expected one of disable, allow, prefer, require, verify-ca, verify-full; got \"" + v + "\"");
         c.database_sslmode = v;
       }},
      {"database.sslrootcert", string_field(&Config::database_sslrootcert)},
      {"database.sslcert", string_field(&Config::database_sslcert)},
      {"database.sslkey", string_field(&Config::database_sslkey)},
      {"database.connect.timeout.ms", int_field(&Config::database_connect_timeout_ms, 1000, 3600000)},
      {"slot.name", [](Config& c, const std::string& k, const std::string& v) { check_slot_name(k, v); c.slot_name = v; }},
      {"slot.failover", bool_field(&Config::slot_failover)},
      {"publication.name", [](Config& c, const std::string& k, const std::string& v) { check_identifier(k, v); c.publication_name = v; }},
      {"publication.autocreate.mode",
       [](Config& c, const std::string& k, const std::string& v) {
         if (v == "filtered") c.publication_autocreate = PublicationAutocreate::filtered;
         else if (v == "disabled") c.publication_autocreate = PublicationAutocreate::disabled;
         else throw ConfigError(k, "expected filtered or disabled, got \"" + v + "\" (all_tables is not offered: the outbox needs only its own tables)");
       }},
      {"status.update.interval.ms", int_field(&Config::status_update_interval_ms, 10, 3600000)},
      {"replication.timeout.ms", int_field(&Config::replication_timeout_ms, 1000, 3600000)},
      {"replication.bulk.read", bool_field(&Config::bulk_read)},
      {"reconnect.backoff.ms", int_field(&Config::reconnect_backoff_ms, 1, 3600000)},
      {"reconnect.backoff.max.ms", int_field(&Config::reconnect_backoff_max_ms, 1, 3600000)},
      {"slot.status.interval.ms", int_field(&Config::slot_status_interval_ms, 0, 3600000)},
      {"pgoutput.binary", bool_field(&Config::binary)},
      {"snapshot.mode",
       [](Config& c, const std::string& k, const std::string& v) {
         if (v == "no_data" || v == "never") c.snapshot_mode = SnapshotMode::no_data;
         else if (v == "initial") c.snapshot_mode = SnapshotMode::initial;
         else if (v == "initial_only") c.snapshot_mode = SnapshotMode::initial_only;
         else if (v == "always" || v == "when_needed" || v == "recovery")
           throw ConfigError(k, "\"" + v + "\" is not offered: walrelay takes the snapshot once, when it creates "
                                "the slot (initial); to send rows again later, use walrelay replay");
         else
           throw ConfigError(k, "expected no_data, initial or initial_only, got \"" + v + "\"");
       }},
      {"snapshot.fetch.size", int_field(&Config::snapshot_fetch_size, 1, 1000000)},
      {"table.retention.policy",
       [](Config& c, const std::string& k, const std::string& v) {
         if (v == "none") c.retention_policy = RetentionPolicy::none;
         else if (v == "delete") c.retention_policy = RetentionPolicy::delete_rows;
         else if (v == "drop-partitions") c.retention_policy = RetentionPolicy::drop_partitions;
         else throw ConfigError(k, "expected none, delete or drop-partitions, got \"" + v + "\"");
       }},
      {"table.retention.ms", int64_field(&Config::retention_ms, 0, 100LL * 365 * 24 * 3600 * 1000)},
      {"table.retention.interval.ms", int_field(&Config::retention_interval_ms, 100, 86400000)},
      {"table.retention.batch.size", int_field(&Config::retention_batch_size, 1, 100000)},
      {"table.retention.time.column", column_field(&Config::retention_time_column, true)},
      {"table.retention.archive.schema", column_field(&Config::retention_archive_schema, true)},
      {"table.retention.user", string_field(&Config::retention_user)},
      {"table.retention.password", string_field(&Config::retention_password)},
      {"snapshot.select.statement.overrides",
       string_field(&Config::snapshot_override_tables)},
      {"snapshot.order.column",
       [](Config& c, const std::string& k, const std::string& v) {
         check_identifier(k, v);
         c.snapshot_order_column = v;
       }},
      {"table.include.list",
       [](Config& c, const std::string& k, const std::string& v) {
         auto items = split_list(v);
         c.table_include_list.clear();  // empty: messages only (checked in validate)
         for (auto& i : items) {
           auto t = parse_table(k, i);
           if (std::find(c.table_include_list.begin(), c.table_include_list.end(), t) != c.table_include_list.end())
             throw ConfigError(k, "table " + t.qualified() + " listed twice");
           c.table_include_list.push_back(t);
         }
       }},
      {"table.field.event.id", column_field(&Config::field_event_id, false)},
      {"table.field.event.key", column_field(&Config::field_event_key, false)},
      {"table.field.event.type", column_field(&Config::field_event_type, true)},
      {"table.field.event.payload", column_field(&Config::field_event_payload, false)},
      {"table.field.event.timestamp", column_field(&Config::field_event_timestamp, true)},
      {"table.field.event.headers", column_field(&Config::field_event_headers, true)},
      {"table.field.event.schema.version", column_field(&Config::field_event_schema_version, true)},
      {"route.by.field", column_field(&Config::route_by_field, true)},
      {"route.topic.regex",
       [](Config& c, const std::string& k, const std::string& v) {
         if (v.empty()) throw ConfigError(k, "must not be empty");
         try {
           boost::regex check(v, boost::regex::perl);
         } catch (const boost::regex_error& e) {
           throw ConfigError(k, "\"" + v + "\" is not a regular expression: " + e.what());
         }
         c.route_topic_regex = v;
       }},
      {"tracing.span.context.field", column_field(&Config::tracing_span_context_field, true)},
      {"tracing.enabled", bool_field(&Config::tracing_enabled)},
      {"table.fields.additional.error.on.missing", bool_field(&Config::additional_error_on_missing)},
      {"table.op.invalid.behavior",
       enum_field(&Config::op_invalid_behavior, {{"warn", InvalidOperation::warn},
                                                 {"error", InvalidOperation::error},
                                                 {"fatal", InvalidOperation::fatal}})},
      {"route.topic.replacement",
       [](Config& c, const std::string& k, const std::string& v) {
         if (v.empty()) throw ConfigError(k, "must not be empty");
         c.route_topic_replacement = v;
       }},
      {"table.fields.additional.placement",
       [](Config& c, const std::string& k, const std::string& v) {
         c.additional_placement.clear();
         for (auto& item : split_list(v)) {
           std::vector<std::string> parts;
           std::string part;
           std::istringstream in(item);
           while (std::getline(in, part, ':')) parts.push_back(trim(part));
           if (parts.size() < 2 || parts.size() > 3 || parts[0].empty())
             throw ConfigError(k, "expected column:header[:alias], got \"" + item + "\"");
           Placement placement;
           if (parts[1] == "header") placement = Placement::header;
           else if (parts[1] == "envelope") placement = Placement::envelope;
           else if (parts[1] == "partition") placement = Placement::partition;
           else
             throw ConfigError(k, "placement \"" + parts[1] + "\" in \"" + item +
                                      "\" is not one of header, envelope, partition");
           if (placement == Placement::partition &&
               std::any_of(c.additional_placement.begin(), c.additional_placement.end(),
                           [](auto& f) { return f.placement == Placement::partition; }))
             throw ConfigError(k, "more than one partition placement: a record has one partition");
           c.additional_placement.push_back({parts[0], placement, parts.size() == 3 ? parts[2] : parts[0]});
         }
       }},
      {"route.tombstone.on.empty.payload", bool_field(&Config::route_tombstone_on_empty_payload)},
      {"table.expand.json.payload", bool_field(&Config::expand_json_payload)},
      {"key.converter", converter_field(&Config::key_converter)},
      {"value.converter",
       [](Config& c, const std::string& k, const std::string& v) {
         // Debezium's converter of CloudEvents: the structured mode. Keys are
         // set in order of their names, so cloudevents.mode is known here.
         if (v == "io.debezium.converters.CloudEventsConverter") {
           if (c.origin.count("cloudevents.mode") && c.cloudevents != CloudEventsMode::structured)
             throw ConfigError(k, "CloudEventsConverter writes the structured mode; cloudevents.mode says otherwise");
           c.cloudevents = CloudEventsMode::structured;
           return;
         }
         // Schema-registry converters: Confluent's, as Connect names them.
         static const std::map<std::string, RegistryFormat> registry = {
             {"io.confluent.connect.avro.AvroConverter", RegistryFormat::avro},
             {"io.confluent.connect.json.JsonSchemaConverter", RegistryFormat::json_schema},
             {"io.confluent.connect.protobuf.ProtobufConverter", RegistryFormat::protobuf},
         };
         if (auto it = registry.find(v); it != registry.end()) {
           c.registry.format = it->second;
           return;
         }
         // Apicurio's converters: Apicurio 3's serdes frame records as
         // Confluent's do (magic byte, 4-byte content id: Default4ByteIdHandler,
         // use-id=contentId, no headers), and the content id is the id of
         // Apicurio's Confluent-compatible API, which walrelay asks.
         if (v == "io.apicurio.registry.utils.converter.AvroConverter") {
           c.registry.format = RegistryFormat::avro;
           c.registry.apicurio = true;
           return;
         }
         if (v == "io.apicurio.registry.utils.converter.SerdeBasedConverter") {
           c.registry.apicurio = true;  // the format: apicurio.registry.converter.serializer
           return;
         }
         if (v.starts_with("io.apicurio.registry.utils.converter."))
           throw ConfigError(k, "\"" + v + "\" writes JSON with its schema inside (ExtJsonConverter) or is not a "
                                "converter walrelay knows: use io.apicurio.registry.utils.converter.AvroConverter, "
                                "or SerdeBasedConverter with the JSON Schema or Protobuf serializer");
         converter_field(&Config::value_converter)(c, k, v);
       }},
      {"value.converter.schema.registry.url",
       [](Config& c, const std::string& k, const std::string& v) { c.registry.urls = registry_urls(k, v); }},
      {"value.converter.apicurio.registry.url",
       [](Config& c, const std::string& k, const std::string& v) {
         // Apicurio's own API (/apis/registry/v2 or v3): walrelay asks its
         // Confluent-compatible one beside it.
         c.registry.urls = registry_urls(k, v);
         for (auto& url : c.registry.urls) {
           if (auto at = url.find("/apis/"); at != std::string::npos) url.erase(at);
           url += "/apis/ccompat/v7";
         }
       }},
      {"value.converter.apicurio.registry.converter.serializer",
       [](Config& c, const std::string& k, const std::string& v) {
         static const std::map<std::string, RegistryFormat> serializers = {
             {"io.apicurio.registry.serde.avro.AvroKafkaSerializer", RegistryFormat::avro},
             {"io.apicurio.registry.serde.jsonschema.JsonSchemaKafkaSerializer", RegistryFormat::json_schema},
             {"io.apicurio.registry.serde.protobuf.ProtobufKafkaSerializer", RegistryFormat::protobuf},
         };
         auto it = serializers.find(v);
         if (it == serializers.end())
           throw ConfigError(k, "expected io.apicurio.registry.serde.avro.AvroKafkaSerializer, "
                                "...jsonschema.JsonSchemaKafkaSerializer or ...protobuf.ProtobufKafkaSerializer");
         c.registry.format = it->second;
       }},
      {"value.converter.apicurio.registry.converter.deserializer", registry_flag_field(true)},
      {"value.converter.apicurio.registry.headers.enabled",
       only_value_field("false", "ids in headers (Apicurio 2's default) are not written: walrelay frames records as "
                                 "Apicurio 3's serdes do by default (magic byte, 4-byte content id in the value), "
                                 "which Apicurio 2 and 3 deserializers and Confluent's read; set it to false")},
      {"value.converter.apicurio.registry.use-id",
       only_value_field("contentId", "only contentId (Apicurio 3's default, the id of its Confluent-compatible API) "
                                     "is written")},
      {"value.converter.apicurio.registry.id-handler",
       only_value_field("io.apicurio.registry.serde.Default4ByteIdHandler",
                        "only io.apicurio.registry.serde.Default4ByteIdHandler (Apicurio 3's default: a 4-byte id "
                        "after the magic byte) is written")},
      {"value.converter.apicurio.registry.artifact.group-id",
       only_value_field("default", "only the default group is looked up (Apicurio's Confluent-compatible API "
                                   "maps subjects to it)")},
      {"value.converter.apicurio.registry.avro.encoding",
       only_value_field("BINARY", "only BINARY (Avro's binary encoding, the default) is written")},
      {"value.converter.apicurio.registry.as-confluent", registry_flag_field()},
      {"value.converter.apicurio.registry.auto-register", registry_flag_field()},
      {"value.converter.apicurio.registry.find-latest", registry_flag_field()},
      {"value.converter.apicurio.auth.username", member_string_field(&Config::registry, &SchemaRegistryConfig::apicurio_username)},
      {"value.converter.apicurio.auth.password", member_string_field(&Config::registry, &SchemaRegistryConfig::apicurio_password)},
      {"value.converter.basic.auth.credentials.source",
       [](Config& c, const std::string& k, const std::string& v) {
         (void)c;
         // URL: the user info is in the URL itself, which libcurl reads.
         if (v != "USER_INFO" && v != "URL")
           throw ConfigError(k, "expected USER_INFO (value.converter.basic.auth.user.info) or URL (user:password@ in "
                                "the registry's URL); SASL_INHERIT needs Kafka's SASL/PLAIN credentials, which walrelay "
                                "does not lend to the registry: set basic.auth.user.info instead");
       }},
      {"value.converter.basic.auth.user.info",
       [](Config& c, const std::string& k, const std::string& v) {
         if (!v.empty() && v.find(':') == std::string::npos) throw ConfigError(k, "expected user:password");
         c.registry.basic_auth_user_info = v;
       }},
      {"value.converter.bearer.auth.credentials.source",
       [](Config& c, const std::string& k, const std::string& v) {
         (void)c;
         if (!v.empty() && v != "STATIC_TOKEN")
           throw ConfigError(k, "only STATIC_TOKEN (value.converter.bearer.auth.token) is offered; fetch an OAuth "
                                "token outside walrelay and pass it in WALRELAY_VALUE_CONVERTER_BEARER_AUTH_TOKEN");
       }},
      {"value.converter.bearer.auth.token", member_string_field(&Config::registry, &SchemaRegistryConfig::bearer_token)},
      {"value.converter.schema.registry.ssl.ca.location",
       member_string_field(&Config::registry, &SchemaRegistryConfig::ssl_ca_location)},
      {"value.converter.schema.registry.ssl.certificate.location",
       member_string_field(&Config::registry, &SchemaRegistryConfig::ssl_certificate_location)},
      {"value.converter.schema.registry.ssl.key.location",
       member_string_field(&Config::registry, &SchemaRegistryConfig::ssl_key_location)},
      {"value.converter.schema.registry.ssl.key.password",
       member_string_field(&Config::registry, &SchemaRegistryConfig::ssl_key_password)},
      {"value.converter.schema.registry.ssl.endpoint.identification.algorithm",
       [](Config& c, const std::string& k, const std::string& v) {
         if (v == "https") c.registry.ssl_verify = true;
         else if (v.empty() || v == "none") c.registry.ssl_verify = false;
         else throw ConfigError(k, "expected https (check the registry's host name) or none");
       }},
      {"value.converter.schema.registry.request.timeout.ms",
       [](Config& c, const std::string& k, const std::string& v) {
         c.registry.request_timeout_ms = parse_int(k, v, 100, 600000);
       }},
      {"value.converter.value.subject.name.strategy",
       [](Config& c, const std::string& k, const std::string& v) {
         // Confluent's class names, or their last part.
         const auto name = v.substr(v.rfind('.') == std::string::npos ? 0 : v.rfind('.') + 1);
         if (name == "TopicNameStrategy") c.registry.subject_strategy = SubjectNameStrategy::topic;
         else if (name == "RecordNameStrategy") c.registry.subject_strategy = SubjectNameStrategy::record;
         else if (name == "TopicRecordNameStrategy") c.registry.subject_strategy = SubjectNameStrategy::topic_record;
         else
           throw ConfigError(k, "expected io.confluent.kafka.serializers.subject.TopicNameStrategy, "
                                "RecordNameStrategy or TopicRecordNameStrategy, got \"" + v + "\"");
       }},
      {"value.converter.auto.register.schemas", registry_flag_field()},
      {"value.converter.use.latest.version", registry_flag_field()},
      {"value.converter.latest.compatibility.strict", registry_flag_field()},
      {"cloudevents.mode",
       enum_field(&Config::cloudevents, {{"none", CloudEventsMode::none},
                                         {"binary", CloudEventsMode::binary},
                                         {"structured", CloudEventsMode::structured}})},
      {"cloudevents.source",
       [](Config& c, const std::string& k, const std::string& v) {
         if (v.empty()) throw ConfigError(k, "must not be empty (CloudEvents requires a source)");
         c.cloudevents_source = v;
       }},
      {"key.converter.schemas.enable", schemas_enable_field()},
      {"value.converter.schemas.enable", schemas_enable_field()},
      {"message.prefix.include.list",
       [](Config& c, const std::string& k, const std::string& v) {
         c.message_prefix_include_list.clear();
         for (auto& item : split_list(v)) {
           try {
             std::regex check(item);
           } catch (const std::regex_error& e) {
             throw ConfigError(k, "\"" + item + "\" is not a regular expression: " + e.what());
           }
           c.message_prefix_include_list.push_back(item);
         }
       }},
      {"sink.type",
       [](Config& c, const std::string& k, const std::string& v) {
         if (!find_sink_kind(v)) throw ConfigError(k, "expected " + sink_type_names() + ", got \"" + v + "\"");
         c.sink_type = v;
       }},
      {"exactly.once.support",
       [](Config& c, const std::string& k, const std::string& v) {
         if (v == "required" || v == "requested") c.exactly_once = true;
         else if (v == "disabled") c.exactly_once = false;
         else throw ConfigError(k, "expected disabled, requested or required, got \"" + v + "\"");
       }},
      {"transaction.boundary",
       [](Config& c, const std::string& k, const std::string& v) {
         // poll: a Kafka transaction per source transaction; interval: as
         // many as transaction.boundary.interval.ms gathers.
         if (v == "poll") c.transaction_boundary_interval_ms = 0;
         else if (v != "interval")
           throw ConfigError(k, "expected poll or interval, got \"" + v + "\" (connector-defined boundaries are not offered)");
       }},
      {"transaction.boundary.interval.ms", int_field(&Config::transaction_boundary_interval_ms, 0, 600000)},
      {"transaction.boundary.max.records",
       [](Config& c, const std::string& k, const std::string& v) {
         c.transaction_boundary_max_records = static_cast<long>(parse_int(k, v, 1, 100000000));
       }},
      {"offsets.storage.topic", string_field(&Config::offsets_topic)},
      {"max.inflight.records", int64_field(&Config::max_inflight_records, 1, 10000000)},
      {"max.inflight.bytes", int64_field(&Config::max_inflight_bytes, 1024 * 1024, 16LL * 1024 * 1024 * 1024)},
      {"errors.tolerance",
       [](Config& c, const std::string& k, const std::string& v) {
         if (v == "none") c.errors_tolerance = ErrorTolerance::none;
         else if (v == "all") c.errors_tolerance = ErrorTolerance::all;
         else throw ConfigError(k, "expected none or all, got \"" + v + "\"");
       }},
      {"errors.deadletterqueue.topic.name", string_field(&Config::dlq_topic)},
      {"errors.deadletterqueue.context.headers.enable", bool_field(&Config::dlq_context_headers)},
      {"shutdown.timeout.ms", int_field(&Config::shutdown_timeout_ms, 0, 3600000)},
      {"halt.action", enum_field(&Config::halt_action, {{"stay", HaltAction::stay}, {"exit", HaltAction::exit}})},
      {"admin.listen",
       [](Config& c, const std::string& k, const std::string& v) {
         auto colon = v.rfind(':');
         if (colon == std::string::npos || colon == 0 || colon + 1 == v.size())
           throw ConfigError(k, "expected host:port, got \"" + v + "\"");
         parse_int(k, v.substr(colon + 1), 0, 65535);
         c.admin_listen = v;
       }},
      {"admin.token", string_field(&Config::admin_token)},
      {"admin.replay.token", string_field(&Config::admin_replay_token)},
      {"admin.control.token", string_field(&Config::admin_control_token)},
      {"log.level",
       [](Config& c, const std::string& k, const std::string& v) {
         static const std::set<std::string> levels{"trace", "debug", "info", "warn", "error", "critical", "off"};
         if (!levels.count(v)) throw ConfigError(k, "expected trace, debug, info, warn, error, critical or off; got \"" + v + "\"");
         c.log_level = v;
       }},
      {"log.format",
       [](Config& c, const std::string& k, const std::string& v) {
         if (v == "text") c.log_format = LogFormat::text;
         else if (v == "json") c.log_format = LogFormat::json;
         else throw ConfigError(k, "expected text or json, got \"" + v + "\"");
       }},
  };
  return specs;
}

// librdkafka settings walrelay's guarantees rest on: defaults that the user
// may not weaken.
void apply_kafka_policy(Config& c) {
  // librdkafka accepts two names for some properties; a copied Kafka Connect
  // or Java producer setting uses the other one. Fold them so that the checks
  // below see every spelling, and refuse both at once.
  static const std::pair<const char*, const char*> aliases[] = {
      {"request.required.acks", "acks"},
      {"delivery.timeout.ms", "message.timeout.ms"},
      {"queue.buffering.max.ms", "linger.ms"},
      {"retries", "message.send.max.retries"},
      {"max.in.flight", "max.in.flight.requests.per.connection"},
  };
  for (auto& [alias, name] : aliases) {
    auto it = c.kafka.find(alias);
    if (it == c.kafka.end()) continue;
    if (c.kafka.count(name))
      throw ConfigError("kafka." + std::string(alias),
                        "conflicting or redundant: kafka." + std::string(name) + " is the same librdkafka property");
    c.kafka[name] = it->second;
    c.kafka.erase(it);
  }
  auto require = [&](const std::string& key, const std::string& safe, std::initializer_list<const char*> allowed) {
    auto it = c.kafka.find(key);
    if (it == c.kafka.end()) {
      c.kafka[key] = safe;
      return;
    }
    for (auto a : allowed)
      if (it->second == a) return;
    throw ConfigError("kafka." + key, "\"" + it->second + "\" would weaken delivery guarantees; walrelay requires " + safe);
  };
  require("enable.idempotence", "true", {"true"});
  require("acks", "all", {"all", "-1"});
  c.kafka.try_emplace("partitioner", "murmur2_random");
  if (c.exactly_once) {
    // librdkafka requires message.timeout.ms <= transaction.timeout.ms: a
    // record not delivered by then aborts its transaction, and walrelay
    // replays from the committed position.
    c.kafka.try_emplace("transaction.timeout.ms", "60000");
    c.kafka.try_emplace("message.timeout.ms", c.kafka["transaction.timeout.ms"]);
  }
  c.kafka.try_emplace("message.timeout.ms", "0");
  // A batch that grows only while the producer is busy: a lone event goes at
  // once (linger 0), and while one produce request is outstanding the next
  // events wait for its answer and go together in one request. A fixed linger
  // delays every lone event by its length; linger 0 with several requests in
  // flight makes each lone event a request of its own however busy the broker
  // is, which lengthened the tail at 5,000 1-row transactions/s (p99 22.6 ms
  // against 7.0 with one in flight) and in an earlier run fell behind there
  // (docs/benchmarks.md, "Sidecar cost at everyday rates" and finding 4).
  c.kafka.try_emplace("linger.ms", "0");
  c.kafka.try_emplace("max.in.flight.requests.per.connection", "1");
  if (!c.kafka.count("bootstrap.servers"))
    throw ConfigError("kafka.bootstrap.servers",
                      "is required (a Debezium connector's configuration names no broker: Kafka Connect's worker "
                      "does; set kafka.bootstrap.servers, or add the worker's bootstrap.servers)");
  // librdkafka's own queue must hold at least what walrelay lets in flight,
  // so that QUEUE_FULL stays an exception rather than the flow control.
  auto q = std::to_string(std::max<std::int64_t>(c.max_inflight_records + 1000, 100000));
  c.kafka.try_emplace("queue.buffering.max.messages", q);
  auto kb = std::to_string(std::max<std::int64_t>(c.max_inflight_bytes / 1024 * 2, 1048576));
  c.kafka.try_emplace("queue.buffering.max.kbytes", kb);
}

// Messages only: the default outbox table is not wanted unless named; and
// something must be relayed.
void check_relayed(Config& c) {
  if (!c.message_prefix_include_list.empty() && !c.origin.count("table.include.list")) c.table_include_list.clear();
  if (c.table_include_list.empty() && c.message_prefix_include_list.empty())
    throw ConfigError("table.include.list", "must name at least one table (or set message.prefix.include.list for "
                                            "the tableless outbox)");
}

// A port for all hosts, or one per host.
void check_hosts(Config& c) {
  auto hosts = split_list(c.database_hostname);
  auto ports = split_list(c.database_port);
  if (hosts.empty()) throw ConfigError("database.hostname", "must name a host");
  if (ports.size() != 1 && ports.size() != hosts.size())
    throw ConfigError("database.port", std::to_string(ports.size()) + " ports for " + std::to_string(hosts.size()) +
                                           " hosts: give one port for all, or one per host");
}

// The operators' tokens (POST /replay's, the control requests') must not be
// one the readers of /metrics hold.
void check_replay_token(Config& c) {
  if (!c.admin_replay_token.empty() && c.admin_replay_token == c.admin_token)
    throw ConfigError("admin.replay.token", "is admin.token: give POST /replay a token of its own, one that the "
                                            "readers of /metrics and /slot do not hold");
  if (!c.admin_control_token.empty() && c.admin_control_token == c.admin_token)
    throw ConfigError("admin.control.token", "is admin.token: give pause, resume and restart a token of their own, "
                                             "one that the readers of /metrics and /slot do not hold");
}

// A snapshot's statement overrides name relayed tables, for a snapshot
// that is taken.
void check_snapshot_overrides(Config& c) {
  for (auto& [table, statement] : c.snapshot_select_overrides) {
    const std::string key = "snapshot.select.statement.overrides." + table;
    bool listed = false;
    for (auto& t : c.table_include_list) listed = listed || t.qualified() == table;
    if (!listed) throw ConfigError(key, table + " is not in table.include.list");
    if (c.snapshot_mode == SnapshotMode::no_data)
      throw ConfigError(key, "is used only by a snapshot: set snapshot.mode=initial (or initial_only)");
  }
  // Debezium's list names the tables that have an override; each must.
  for (auto& name : split_list(c.snapshot_override_tables)) {
    auto t = parse_table("snapshot.select.statement.overrides", name).qualified();
    if (!c.snapshot_select_overrides.count(t))
      throw ConfigError("snapshot.select.statement.overrides",
                        "names " + t + ", but snapshot.select.statement.overrides." + t + " is not set");
  }
}

// The back-off grows from its start to its bound, not down.
void check_backoff(Config& c) {
  if (c.reconnect_backoff_max_ms < c.reconnect_backoff_ms)
    throw ConfigError("reconnect.backoff.max.ms", "must be at least reconnect.backoff.ms");
}

// A row walrelay cannot relay goes somewhere when it is tolerated.
void check_dead_letter_named(Config& c) {
  if (c.errors_tolerance == ErrorTolerance::all && c.dlq_topic.empty())
    throw ConfigError("errors.deadletterqueue.topic.name",
                      "is required with errors.tolerance=all: walrelay never drops an event silently");
}

// JsonConverter's schemas.enable defaults to an envelope walrelay does not
// write, so it must be turned off explicitly.
void check_json_schemas(Config& c) {
  for (const char* side : {"key", "value"}) {
    const bool json = std::string(side) == "key" ? c.key_converter == Converter::json : c.value_converter == Converter::json;
    const std::string schemas = std::string(side) + ".converter.schemas.enable";
    if (json && !c.origin.count(schemas))
      throw ConfigError(schemas, "must be set to false with " + std::string(side) +
                                     ".converter=org.apache.kafka.connect.json.JsonConverter (Kafka Connect's default "
                                     "is true, a schema envelope walrelay does not write)");
  }
}

// A schema registry's keys: set with a registry converter only, and with
// what one needs (a URL, one kind of credentials, a record name).
void check_registry(Config& c) {
  const bool registry = c.registry.format != RegistryFormat::none;
  if (c.registry.apicurio && !registry)
    throw ConfigError("value.converter.apicurio.registry.converter.serializer",
                      "is required with SerdeBasedConverter: it names the format");
  if (!registry) {
    // (The other registry keys are harmless without one: --print-config
    // lists them all, and its output must load again.)
    for (const char* key : {"value.converter.schema.registry.url", "table.field.event.schema.version"})
      if ((key[0] == 'v' ? !c.registry.urls.empty() : !c.field_event_schema_version.empty()))
        throw ConfigError(key, "applies to a schema-registry converter only: set value.converter to "
                               "io.confluent.connect.avro.AvroConverter, ...json.JsonSchemaConverter or "
                               "...protobuf.ProtobufConverter");
    return;
  }
  if (!c.registry.apicurio_username.empty() || !c.registry.apicurio_password.empty()) {
    if (!c.registry.basic_auth_user_info.empty())
      throw ConfigError("value.converter.apicurio.auth.username",
                        "and value.converter.basic.auth.user.info both set: give one");
    c.registry.basic_auth_user_info = c.registry.apicurio_username + ":" + c.registry.apicurio_password;
  }
  if (c.registry.urls.empty() && c.registry.apicurio)
    throw ConfigError("value.converter.apicurio.registry.url", "is required with Apicurio's converter");
  if (c.registry.urls.empty())
    throw ConfigError("value.converter.schema.registry.url", "is required with value.converter=" +
                                                                 std::string(registry_converter_name(c.registry.format)));
  if (c.cloudevents == CloudEventsMode::structured)
    throw ConfigError("value.converter", "CloudEvents' structured mode writes the event as JSON; with a schema "
                                         "registry use cloudevents.mode=binary (the attributes in headers, the "
                                         "value encoded by its schema)");
  if (c.registry.subject_strategy != SubjectNameStrategy::topic && c.field_event_type.empty())
    throw ConfigError("table.field.event.type", "must name a column: the record name strategies take the "
                                                "record's name from the event's type");
  if (!c.registry.basic_auth_user_info.empty() && !c.registry.bearer_token.empty())
    throw ConfigError("value.converter.bearer.auth.token", "and value.converter.basic.auth.user.info both set: "
                                                           "the registry takes one kind of credentials");
}

// A replacement that refers to the route value needs a column to take it from.
void check_route_by_field(Config& c) {
  if (c.routes_by_value() && c.route_by_field.empty())
    throw ConfigError("route.by.field", "must name a column while route.topic.replacement refers to the route value");
}

// CloudEvents need a type, and are the value's format and envelope themselves.
void check_cloudevents(Config& c) {
  if (c.cloudevents == CloudEventsMode::none) return;
  if (c.field_event_type.empty())
    throw ConfigError("table.field.event.type", "must name a column: it is the CloudEvents type, which is required");
  if (c.value_converter == Converter::json)
    throw ConfigError("value.converter", "the CloudEvents structured mode is the value's format: set "
                                         "value.converter=io.debezium.converters.CloudEventsConverter or leave "
                                         "it out");
  for (auto& f : c.additional_placement)
    if (f.placement == Placement::envelope)
      throw ConfigError("table.fields.additional.placement",
                        "an envelope placement (" + f.column + ") and CloudEvents: the event is the value's "
                        "envelope; place the column in a header instead");
}

// A column placed in a header needs the header's name.
void check_header_names(Config& c) {
  for (auto& f : c.additional_placement)
    if (f.alias.empty()) throw ConfigError("table.fields.additional.placement", "empty header name for column " + f.column);
}

// Kafka transactions are walrelay's to manage, with a legal offsets topic
// and a boundary interval the transaction timeout leaves room for.
void check_transactions(Config& c) {
  if (!c.exactly_once && c.kafka.count("transactional.id"))
    throw ConfigError("kafka.transactional.id", "transactions are walrelay's to manage: set exactly.once.support=required");
  if (!c.exactly_once) return;
  if (auto why = illegal_topic_reason(c.offsets_topic))
    throw ConfigError("offsets.storage.topic", "\"" + c.offsets_topic + "\" is not a legal Kafka topic name: " + *why);
  // librdkafka's default when the key is not set.
  auto found = c.kafka.find("transaction.timeout.ms");
  const std::string timeout_text = found != c.kafka.end() ? found->second : "60000";
  auto ms = parse_int("kafka.transaction.timeout.ms", timeout_text, 1000, 3600000);
  // A Kafka transaction stays open at least one boundary interval; the
  // broker aborts one older than transaction.timeout.ms.
  if (c.transaction_boundary_interval_ms * 2 > ms)
    throw ConfigError("transaction.boundary.interval.ms",
                      std::to_string(c.transaction_boundary_interval_ms) +
                          " ms leaves no room in kafka.transaction.timeout.ms=" + timeout_text +
                          ": a Kafka transaction stays open for one interval and must commit well within the "
                          "timeout (and so must the largest source transaction): keep the interval under half of "
                          "it");
}

// The dead-letter topic is written to: its name must be legal.
void check_dead_letter_topic(Config& c) {
  if (!c.dlq_topic.empty())
    if (auto why = illegal_topic_reason(c.dlq_topic))
      throw ConfigError("errors.deadletterqueue.topic.name", "\"" + c.dlq_topic + "\" is not a legal Kafka topic name: " + *why);
}

// The fixed parts of the route must be legal whatever the row supplies:
// every group reference stands for one legal character here.
void check_route_replacement(Config& c) {
  std::string fixed;
  if (auto problem = expand_route_replacement(
          c.route_topic_replacement, [](std::string_view) { return std::optional<std::string_view>("x"); }, fixed))
    throw ConfigError("route.topic.replacement", "\"" + c.route_topic_replacement + "\": " + *problem);
  if (auto why = illegal_topic_reason(fixed))
    throw ConfigError("route.topic.replacement",
                      "\"" + c.route_topic_replacement + "\" cannot make a legal Kafka topic name: " + *why);
}

// Kafka's policy for the Kafka sink; for another broker, what only Kafka or
// another sink has would silently mean nothing. Then the sink's own checks.
void check_sink(Config& c) {
  if (c.sink_type == "kafka") {
    apply_kafka_policy(c);
  } else {
    if (!c.kafka.empty())
      throw ConfigError("kafka." + c.kafka.begin()->first,
                        "sink.type is " + c.sink_type + ": kafka.* keys configure the Kafka sink only");
    if (c.exactly_once)
      throw ConfigError("exactly.once.support", "required needs Kafka transactions: sink.type=" + c.sink_type +
                                                    " is at least once (its broker drops repeats by the event id)");
  }
  for (auto& [key, value] : c.sink_settings) {
    const std::string own = "sink." + c.sink_type + ".";
    if (!key.starts_with(own))
      throw ConfigError(key, "sink.type is " + c.sink_type + ": this key of another sink would be ignored");
  }
  find_sink_kind(c.sink_type)->validate(c);
}

// Retention deletes table rows, older than table.retention.ms by a column of
// their own time (the one replay --since reads).
void check_retention(Config& c) {
  if (c.retention_policy == RetentionPolicy::none) {
    if (!c.retention_archive_schema.empty())
      throw ConfigError("table.retention.archive.schema", "set without table.retention.policy: nothing is removed, "
                                                          "so nothing is archived");
    return;
  }
  if (c.table_include_list.empty())
    throw ConfigError("table.retention.policy", "it needs outbox tables (table.include.list is empty: "
                                                "logical messages leave no rows to delete)");
  if (!c.retention_archive_schema.empty() && c.retention_policy == RetentionPolicy::delete_rows) {
    // The deleted rows of a table go to the archive table of its name.
    std::set<std::string> names;
    for (const auto& t : c.table_include_list) {
      if (!names.insert(t.name).second)
        throw ConfigError("table.retention.archive.schema", "two outbox tables are named \"" + t.name +
                                                            "\": their deleted rows would share one archive table");
      if (t.schema == c.retention_archive_schema)
        throw ConfigError("table.retention.archive.schema", "it is the schema of the outbox table " + t.qualified() +
                                                            ": its rows would be archived into the table itself");
    }
  }
  if (!c.retention_password.empty() && c.retention_user.empty())
    throw ConfigError("table.retention.password", "set without table.retention.user: the deletes would run as "
                                                  "database.user, and this password would be ignored");
  // drop-partitions reads a partition's age from its range, not from rows.
  if (c.retention_policy == RetentionPolicy::delete_rows && c.retention_ms > 0 && c.retention_time_column.empty() &&
      c.field_event_timestamp.empty())
    throw ConfigError("table.retention.ms",
                      "a row's age is read from a column of its own: set table.retention.time.column (or "
                      "table.field.event.timestamp), or table.retention.ms=0 to delete rows once acknowledged");
}

// The rules on keys that must agree, in the order they are checked: the
// first broken one is reported. Some fill in what follows from the others.
constexpr void (*config_checks[])(Config&) = {
    check_relayed,           check_hosts,           check_replay_token,   check_snapshot_overrides,
    check_backoff,           check_dead_letter_named, check_json_schemas, check_registry,
    check_route_by_field,    check_cloudevents,     check_header_names,   check_transactions,
    check_dead_letter_topic, check_route_replacement, check_sink,           check_retention,
};

// The configuration as a whole checked, once every key has been read.
void validate(Config& c) {
  for (auto check : config_checks) check(c);
}

// A byte as two lowercase hex digits, for a message that names it.
std::string fmt_hex(unsigned char c) { return boost::algorithm::hex_lower(std::string(1, static_cast<char>(c))); }

std::string quote_conninfo(const std::string& v) {
  std::string out = "'";
  for (char ch : v) {
    if (ch == '\'' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "'";
}

}  // namespace

const char* registry_converter_name(RegistryFormat format) {
  switch (format) {
    case RegistryFormat::avro: return "io.confluent.connect.avro.AvroConverter";
    case RegistryFormat::json_schema: return "io.confluent.connect.json.JsonSchemaConverter";
    case RegistryFormat::protobuf: return "io.confluent.connect.protobuf.ProtobufConverter";
    case RegistryFormat::none: break;
  }
  return "";
}

std::string redact_url(const std::string& text) {
  // scheme://user:password@host...: everything from :// to the last @ before
  // the next URL (or the end) goes. Not the first /: a password may hold one
  // unencoded, and a client may still read it so; the host in a URL whose
  // path holds an @ is masked too, which hides too much, never too little.
  std::string out;
  std::size_t from = 0;
  for (;;) {
    const auto scheme = text.find("://", from);
    if (scheme == std::string::npos) break;
    const auto start = scheme + 3;
    const auto next = text.find("://", start);
    const auto at = text.rfind('@', next == std::string::npos ? std::string::npos : next);
    out.append(text, from, start - from);
    if (at != std::string::npos && at >= start) {
      out += "********";
      from = at;
    } else {
      from = start;
    }
  }
  out.append(text, from, std::string::npos);
  return out;
}

std::string shown_setting(const std::string& key, const std::string& value) {
  if (mutation::active(mutation::Break::secrets_shown)) return value;
  if (is_secret_key(key)) return value.empty() ? value : "********";
  // A webhook URL often holds its secret in its path or query (Slack's,
  // Teams', Azure Functions' ?code=): only its scheme, host and port show.
  if (key == "sink.http.url") return http_url_for_log(value);
  return redact_url(value);
}

const char* placement_name(Placement placement) {
  switch (placement) {
    case Placement::header: return "header";
    case Placement::envelope: return "envelope";
    case Placement::partition: return "partition";
  }
  return "?";
}

std::optional<std::string> expand_route_replacement(std::string_view r, const RouteGroup& group, std::string& out) {
  out.clear();
  for (std::size_t i = 0; i < r.size(); ++i) {
    if (r[i] == '\\' && i + 1 < r.size()) {
      out += r[++i];
      continue;
    }
    if (r[i] != '$' || i + 1 == r.size()) {
      out += r[i];
      continue;
    }
    std::string_view ref;
    if (r[i + 1] == '{') {
      const auto close = r.find('}', i);
      if (close == std::string_view::npos) return std::string("a ${ without its }");
      ref = r.substr(i + 2, close - i - 2);
      i = close;
    } else {
      const std::size_t start = i + 1;
      while (i + 1 < r.size() && r[i + 1] >= '0' && r[i + 1] <= '9') ++i;
      ref = r.substr(start, i + 1 - start);
      if (ref.empty()) {  // a '$' that refers to nothing is itself
        out += '$';
        continue;
      }
    }
    auto value = group(ref);
    if (!value)
      return "route.topic.replacement refers to group \"" + std::string(ref) + "\", which route.topic.regex does not have";
    out.append(*value);
  }
  return std::nullopt;
}

std::optional<std::string> illegal_topic_reason(std::string_view name) {
  if (name.empty()) return "it is empty";
  if (name.size() > 249) return "it is " + std::to_string(name.size()) + " characters long, more than 249";
  if (name == "." || name == "..") return "\".\" and \"..\" are reserved";
  for (unsigned char c : name)
    if (!(std::isalnum(c) && c < 0x80) && c != '.' && c != '_' && c != '-')
      return c < 0x20 || c >= 0x7f ? "it contains the byte 0x" + fmt_hex(c) : std::string("it contains '") + static_cast<char>(c) + "'";
  return std::nullopt;
}

std::vector<std::string> config_warnings(const Config& c) {
  std::vector<std::string> out;
  auto timeout = c.kafka.find("message.timeout.ms");
  if (timeout != c.kafka.end() && timeout->second != "0")
    out.push_back("kafka.message.timeout.ms=" + timeout->second +
                  ": a record the brokers have not acknowledged by then fails; walrelay then sends everything from "
                  "the slot's confirmed position again, so nothing is lost or dead-lettered, but during a long "
                  "outage a record may reach its topic after a later one of the same key. 0, walrelay's default "
                  "(like Kafka Connect's delivery.timeout.ms=2147483647), waits instead");
  return out;
}

const std::vector<std::string>& secret_key_words() {
  // deploy/docker/entrypoint.sh's is_secret lists the same words (a unit
  // test checks that the two agree on every key).
  static const std::vector<std::string> words = {"password",    "token",   "secret",
                                                 "sasl.jaas",   "ssl.key.pem", "ssl_key",
                                                 "user.info",   "oauthbearer.config", "seed",
                                                 "jwt"};
  return words;
}

bool is_secret_key(const std::string& key) {
  for (auto& word : secret_key_words())
    if (key.find(word) != std::string::npos) return true;
  return false;
}

namespace {

// The file as written: a properties file, or Kafka Connect's JSON.
std::vector<RawSetting> read_settings(const std::string& text, const std::string& source_name) {
  if (auto json = parse_connect_json(text, source_name)) return std::move(*json);
  std::vector<RawSetting> settings;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    auto t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == '!') continue;
    auto eq = t.find('=');
    if (eq == std::string::npos)
      throw ConfigError("", source_name + ":" + std::to_string(lineno) + ": expected key=value, got \"" +
                                shown_setting(t, t) + "\"");
    auto key = trim(t.substr(0, eq));
    auto value = trim(t.substr(eq + 1));
    if (key.empty()) throw ConfigError("", source_name + ":" + std::to_string(lineno) + ": empty key");
    for (auto& s : settings)
      if (s.key == key)
        throw ConfigError(key, "conflicting or redundant: set again at " + source_name + ":" + std::to_string(lineno));
    settings.push_back({key, value, source_name + ":" + std::to_string(lineno)});
  }
  return settings;
}

// Each key's value and where it was set.
using SettingValues = std::map<std::string, std::pair<std::string, std::string>>;  // key -> (value, origin)

// Environment: WALRELAY_DATABASE_PASSWORD -> database.password. Known keys
// are matched by their environment spelling; WALRELAY_KAFKA_* become kafka.*
void add_environment(SettingValues& values, const std::vector<std::string>& environ) {
  std::map<std::string, std::string> env_names;
  auto env_name = [](std::string_view key) {
    std::string e = "WALRELAY_";
    for (char ch : key) e += (ch == '.' || ch == '-') ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    return e;
  };
  for (auto& spec : key_specs()) env_names[env_name(spec.name)] = spec.name;
  // WALRELAY_SINK_NATS_JETSTREAM_AUTH_PASSWORD -> sink.nats-jetstream.auth.password
  for (auto& kind : sink_kinds())
    for (auto k : kind.keys) {
      const std::string key = "sink." + std::string(kind.name) + "." + std::string(k);
      env_names[env_name(key)] = key;
    }
  for (auto& kv : environ) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || kv.rfind("WALRELAY_", 0) != 0) continue;
    auto name = kv.substr(0, eq);
    auto value = kv.substr(eq + 1);
    std::string key;
    if (auto it = env_names.find(name); it != env_names.end()) {
      key = it->second;
    } else if (name.rfind("WALRELAY_KAFKA_", 0) == 0) {
      key = "kafka.";
      for (char ch : name.substr(15)) key += (ch == '_') ? '.' : static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    } else {
      continue;  // WALRELAY_CONFIG, test harness variables ...
    }
    values[key] = {value, "environment " + name};
  }
}

// A sink.<broker>.* key kept for its sink, which must have it.
void set_sink_setting(Config& c, const std::string& key, const std::string& value, const std::string& origin) {
  const SinkKind* kind = nullptr;
  for (auto& k : sink_kinds())
    if (key.size() > k.name.size() + 6 && key.compare(5, k.name.size(), k.name) == 0 && key[5 + k.name.size()] == '.')
      kind = &k;
  if (!kind) throw ConfigError(key, "unknown sink (sink.type takes " + sink_type_names() + ") (" + origin + ")");
  auto rest = std::string_view(key).substr(6 + kind->name.size());
  if (std::find(kind->keys.begin(), kind->keys.end(), rest) == kind->keys.end())
    throw ConfigError(key, "unknown key of the " + std::string(kind->name) + " sink (" + origin + ")");
  c.sink_settings[key] = value;
}

// One key set in the Config: a sink's, a table's snapshot statement, a
// librdkafka property, or one of key_specs.
void set_setting(Config& c, const std::string& key, const std::string& value, const std::string& origin) {
  c.origin[key] = origin;
  if (key.starts_with("sink.") && key != "sink.type") {
    set_sink_setting(c, key, value, origin);
    return;
  }
  if (constexpr std::string_view overrides = "snapshot.select.statement.overrides.";
      key.starts_with(overrides) && key.size() > overrides.size()) {
    auto table = parse_table(key, key.substr(overrides.size()));
    auto statement = trim(value);
    if (statement.empty()) throw ConfigError(key, "is empty: give a SELECT of the table's rows or a WHERE condition");
    c.snapshot_select_overrides[table.qualified()] = statement;
    return;
  }
  if (key.rfind("kafka.", 0) == 0) {
    auto k = key.substr(6);
    if (k.empty()) throw ConfigError(key, "empty librdkafka property name");
    c.kafka[k] = value;
    return;
  }
  auto spec = std::find_if(key_specs().begin(), key_specs().end(), [&](auto& s) { return key == s.name; });
  if (spec == key_specs().end())
    throw ConfigError(key, "unknown configuration key (" + origin + ")");
  spec->set(c, key, value);
}

}  // namespace

Config parse_config(const std::string& text, const std::string& source_name, const std::vector<std::string>& environ) {
  Config c;
  std::vector<RawSetting> settings = read_settings(text, source_name);
  translate_connect_keys(settings, c.notes);
  SettingValues values;
  for (auto& s : settings) {
    if (auto it = values.find(s.key); it != values.end())
      throw ConfigError(s.key, "conflicting or redundant: set at " + it->second.second + " and at " + s.origin);
    values[s.key] = {s.value, s.origin};
  }
  add_environment(values, environ);
  for (auto& [key, vo] : values) set_setting(c, key, vo.first, vo.second);
  validate(c);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& environ) {
  std::string text;
  if (!path.empty()) {
    std::ifstream f(path);
    if (!f) throw ConfigError("", "could not open configuration file \"" + path + "\"");
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  return parse_config(text, path.empty() ? "(no file)" : path, environ);
}

std::string Config::conninfo(bool replication) const {
  return conninfo_as(database_user, database_password, replication);
}

// Retention's deletes: a role of their own when table.retention.user is set.
std::string Config::retention_conninfo() const {
  if (retention_user.empty()) return conninfo(false);
  return conninfo_as(retention_user, retention_password, false);
}

std::string Config::conninfo_as(const std::string& user, const std::string& password, bool replication) const {
  std::string s = "host=" + quote_conninfo(database_hostname) + " port=" + quote_conninfo(database_port) +
                  " user=" + quote_conninfo(user) + " dbname=" + quote_conninfo(database_dbname) +
                  " sslmode=" + database_sslmode + " application_name=walrelay" +
                  // The walsender sends text in the client's encoding: UTF-8 is
                  // what Kafka consumers and the dead-letter JSON expect,
                  // whatever the database's encoding.
                  " client_encoding=UTF8" +
                  " connect_timeout=" + std::to_string(std::max(1, database_connect_timeout_ms / 1000)) +
                  " keepalives=1 keepalives_idle=10 keepalives_interval=5 keepalives_count=3";
  std::string attrs = database_target_session_attrs;
  if (attrs.empty() && database_hostname.find(',') != std::string::npos) attrs = "read-write";
  if (!attrs.empty()) s += " target_session_attrs=" + attrs;
  if (!database_sslrootcert.empty()) s += " sslrootcert=" + quote_conninfo(database_sslrootcert);
  if (!database_sslcert.empty()) s += " sslcert=" + quote_conninfo(database_sslcert);
  if (!database_sslkey.empty()) s += " sslkey=" + quote_conninfo(database_sslkey);
  // Text forms that the mapper parses must not depend on server defaults.
  s += " options='-c datestyle=ISO -c timezone=UTC -c extra_float_digits=3 -c bytea_output=hex'";
  if (replication) s += " replication=database";
  if (!password.empty()) s += " password=" + quote_conninfo(password);
  return s;
}

std::string Config::transactional_id() const {
  auto it = kafka.find("transactional.id");
  return it != kafka.end() ? it->second : "walrelay-" + database_dbname + "-" + slot_name;
}

std::string Config::conninfo_redacted(bool replication) const {
  auto s = conninfo(replication);
  auto p = s.find(" password=");
  if (p != std::string::npos) s = s.substr(0, p) + " password=********";
  return s;
}

namespace {

// The lines of --print-config, each value shown as shown_setting shows it.
struct SettingLines {
  std::ostringstream out;
  void operator()(const std::string& k, const std::string& v) { out << k << '=' << shown_setting(k, v) << '\n'; }
};

// Where walrelay reads from: the server, the slot and the replication stream.
void describe_source(const Config& c, SettingLines& line) {
  line("database.hostname", c.database_hostname);
  line("database.port", c.database_port);
  line("database.target.session.attrs", c.database_target_session_attrs);
  line("database.user", c.database_user);
  line("database.password", c.database_password);
  line("database.dbname", c.database_dbname);
  line("database.sslmode", c.database_sslmode);
  line("database.sslrootcert", c.database_sslrootcert);
  line("database.sslcert", c.database_sslcert);
  line("database.sslkey", c.database_sslkey);
  line("database.connect.timeout.ms", std::to_string(c.database_connect_timeout_ms));
  line("slot.name", c.slot_name);
  line("slot.failover", c.slot_failover ? "true" : "false");
  line("slot.status.interval.ms", std::to_string(c.slot_status_interval_ms));
  line("status.update.interval.ms", std::to_string(c.status_update_interval_ms));
  line("replication.timeout.ms", std::to_string(c.replication_timeout_ms));
  line("replication.bulk.read", c.bulk_read ? "true" : "false");
  line("reconnect.backoff.ms", std::to_string(c.reconnect_backoff_ms));
  line("reconnect.backoff.max.ms", std::to_string(c.reconnect_backoff_max_ms));
  line("pgoutput.binary", c.binary ? "true" : "false");
}

// What walrelay reads and how a row becomes a record: the snapshot, the
// publication, the outbox columns and the route.
void describe_tables(const Config& c, SettingLines& line) {
  line("snapshot.mode", c.snapshot_mode == SnapshotMode::no_data   ? "no_data"
                        : c.snapshot_mode == SnapshotMode::initial ? "initial"
                                                                 : "initial_only");
  line("snapshot.fetch.size", std::to_string(c.snapshot_fetch_size));
  line("snapshot.order.column", c.snapshot_order_column.empty() ? c.field_event_id : c.snapshot_order_column);
  line("table.retention.policy", c.retention_policy == RetentionPolicy::none          ? "none"
                                  : c.retention_policy == RetentionPolicy::delete_rows ? "delete"
                                                                                       : "drop-partitions");
  line("table.retention.archive.schema", c.retention_archive_schema);
  line("table.retention.ms", std::to_string(c.retention_ms));
  line("table.retention.interval.ms", std::to_string(c.retention_interval_ms));
  line("table.retention.batch.size", std::to_string(c.retention_batch_size));
  line("table.retention.user", c.retention_user);
  line("table.retention.password", c.retention_password);
  line("table.retention.time.column",
       c.retention_time_column.empty() ? c.field_event_timestamp : c.retention_time_column);
  {
    std::string tables;
    for (auto& [table, statement] : c.snapshot_select_overrides) tables += (tables.empty() ? "" : ",") + table;
    line("snapshot.select.statement.overrides", tables);
    for (auto& [table, statement] : c.snapshot_select_overrides)
      line("snapshot.select.statement.overrides." + table, statement);
  }
  line("publication.name", c.publication_name);
  line("publication.autocreate.mode", c.publication_autocreate == PublicationAutocreate::filtered ? "filtered" : "disabled");
  std::string tables;
  for (auto& t : c.table_include_list) tables += (tables.empty() ? "" : ",") + t.qualified();
  line("table.include.list", tables);
  line("table.field.event.id", c.field_event_id);
  line("table.field.event.key", c.field_event_key);
  line("table.field.event.type", c.field_event_type);
  line("table.field.event.payload", c.field_event_payload);
  line("table.field.event.timestamp", c.field_event_timestamp);
  line("table.field.event.headers", c.field_event_headers);
  line("route.by.field", c.route_by_field);
  line("route.topic.replacement", c.route_topic_replacement);
  line("route.topic.regex", c.route_topic_regex);
  line("tracing.span.context.field", c.tracing_span_context_field);
  line("tracing.enabled", c.tracing_enabled ? "true" : "false");
  std::string placements;
  for (auto& f : c.additional_placement)
    placements += (placements.empty() ? "" : ",") + f.column + ":" + placement_name(f.placement) +
                  (f.alias.empty() ? "" : ":" + f.alias);
  line("table.fields.additional.placement", placements);
  line("table.fields.additional.error.on.missing", c.additional_error_on_missing ? "true" : "false");
  line("table.op.invalid.behavior", c.op_invalid_behavior == InvalidOperation::warn    ? "warn"
                                    : c.op_invalid_behavior == InvalidOperation::error ? "error"
                                                                                     : "fatal");
  line("route.tombstone.on.empty.payload", c.route_tombstone_on_empty_payload ? "true" : "false");
  line("table.expand.json.payload", c.expand_json_payload ? "true" : "false");
}

// The record's formats: the converters and CloudEvents.
void describe_converters(const Config& c, SettingLines& line) {
  auto converter = [](Converter c) {
    return std::string(c == Converter::json ? "org.apache.kafka.connect.json.JsonConverter"
                                            : "org.apache.kafka.connect.storage.StringConverter");
  };
  line("key.converter", converter(c.key_converter));
  line("key.converter.schemas.enable", "false");
  line("value.converter", c.cloudevents == CloudEventsMode::structured     ? "io.debezium.converters.CloudEventsConverter"
                          : c.registry.format != RegistryFormat::none ? registry_converter_name(c.registry.format)
                                                                    : converter(c.value_converter));
  line("cloudevents.mode", c.cloudevents == CloudEventsMode::none     ? "none"
                           : c.cloudevents == CloudEventsMode::binary ? "binary"
                                                                    : "structured");
  line("cloudevents.source", c.cloudevents_source_or_default());
  line("value.converter.schemas.enable", "false");
}

// The schema registry's keys: what walrelay does, whatever was set
// (it has no schema of its own: auto.register.schemas=false and
// use.latest.version=true are what it does).
void describe_registry(const Config& c, SettingLines& line) {
  std::string urls;
  for (auto& u : c.registry.urls) urls += (urls.empty() ? "" : ",") + u;
  line("value.converter.schema.registry.url", urls);
  line("value.converter.basic.auth.credentials.source", c.registry.basic_auth_user_info.empty() ? "URL" : "USER_INFO");
  line("value.converter.basic.auth.user.info", c.registry.basic_auth_user_info);
  line("value.converter.bearer.auth.credentials.source", c.registry.bearer_token.empty() ? "" : "STATIC_TOKEN");
  line("value.converter.bearer.auth.token", c.registry.bearer_token);
  line("value.converter.schema.registry.ssl.ca.location", c.registry.ssl_ca_location);
  line("value.converter.schema.registry.ssl.certificate.location", c.registry.ssl_certificate_location);
  line("value.converter.schema.registry.ssl.key.location", c.registry.ssl_key_location);
  line("value.converter.schema.registry.ssl.key.password", c.registry.ssl_key_password);
  line("value.converter.schema.registry.ssl.endpoint.identification.algorithm", c.registry.ssl_verify ? "https" : "none");
  line("value.converter.schema.registry.request.timeout.ms", std::to_string(c.registry.request_timeout_ms));
  line("value.converter.value.subject.name.strategy",
       std::string("io.confluent.kafka.serializers.subject.") +
           (c.registry.subject_strategy == SubjectNameStrategy::topic    ? "TopicNameStrategy"
            : c.registry.subject_strategy == SubjectNameStrategy::record ? "RecordNameStrategy"
                                                                       : "TopicRecordNameStrategy"));
  line("value.converter.auto.register.schemas", "false");
  line("value.converter.use.latest.version", "true");
  line("value.converter.latest.compatibility.strict", "false");
  line("table.field.event.schema.version", c.field_event_schema_version);
  // Apicurio's converter keys: what walrelay writes with them.
  line("value.converter.apicurio.registry.url", "");
  line("value.converter.apicurio.registry.converter.serializer", "");
  line("value.converter.apicurio.registry.converter.deserializer", "");
  line("value.converter.apicurio.registry.headers.enabled", "false");
  line("value.converter.apicurio.registry.use-id", "contentId");
  line("value.converter.apicurio.registry.id-handler", "io.apicurio.registry.serde.Default4ByteIdHandler");
  line("value.converter.apicurio.registry.artifact.group-id", "default");
  line("value.converter.apicurio.registry.avro.encoding", "BINARY");
  line("value.converter.apicurio.registry.as-confluent", "true");
  line("value.converter.apicurio.registry.auto-register", "false");
  line("value.converter.apicurio.registry.find-latest", "true");
  line("value.converter.apicurio.auth.username", c.registry.apicurio_username);
  line("value.converter.apicurio.auth.password", c.registry.apicurio_password);
}

// How records are delivered: the bounds, errors, the sink, transactions,
// the admin server and the log.
void describe_delivery(const Config& c, SettingLines& line) {
  std::string prefixes;
  for (auto& p : c.message_prefix_include_list) prefixes += (prefixes.empty() ? "" : ",") + p;
  line("message.prefix.include.list", prefixes);
  line("max.inflight.records", std::to_string(c.max_inflight_records));
  line("max.inflight.bytes", std::to_string(c.max_inflight_bytes));
  line("errors.tolerance", c.errors_tolerance == ErrorTolerance::none ? "none" : "all");
  line("errors.deadletterqueue.topic.name", c.dlq_topic);
  line("errors.deadletterqueue.context.headers.enable", c.dlq_context_headers ? "true" : "false");
  line("shutdown.timeout.ms", std::to_string(c.shutdown_timeout_ms));
  line("halt.action", c.halt_action == HaltAction::stay ? "stay" : "exit");
  line("sink.type", c.sink_type);
  for (auto& [k, v] : c.sink_settings) line(k, v);
  line("exactly.once.support", c.exactly_once ? "required" : "disabled");
  line("transaction.boundary", c.transaction_boundary_interval_ms == 0 ? "poll" : "interval");
  line("transaction.boundary.interval.ms", std::to_string(c.transaction_boundary_interval_ms));
  line("transaction.boundary.max.records", std::to_string(c.transaction_boundary_max_records));
  line("offsets.storage.topic", c.offsets_topic);
  line("admin.listen", c.admin_listen);
  line("admin.token", c.admin_token);
  line("admin.replay.token", c.admin_replay_token);
  line("admin.control.token", c.admin_control_token);
  line("log.level", c.log_level);
  line("log.format", c.log_format == LogFormat::json ? "json" : "text");
  for (auto& [k, v] : c.kafka) line("kafka." + k, v);
}

}  // namespace

std::string Config::describe() const {
  SettingLines line;
  describe_source(*this, line);
  describe_tables(*this, line);
  describe_converters(*this, line);
  describe_registry(*this, line);
  describe_delivery(*this, line);
  return line.out.str();
}

}  // namespace walrelay
