// walrelay's configuration: Kafka Connect style key=value, Debezium's names.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace walrelay {

// A configuration error: names the key and what is wrong. Exit code 2.
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string key, const std::string& message)
      : std::runtime_error(key.empty() ? message : key + ": " + message), key_(std::move(key)) {}
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

enum class PublicationAutocreate { filtered, disabled };
enum class ErrorTolerance { none, all };
enum class LogFormat { text, json };
// table.op.invalid.behavior: what an UPDATE of an outbox row does (a
// publication that sends updates): skip it with a warning or an error in the
// log, or halt.
enum class InvalidOperation { warn, error, fatal };
// halt.action: what a halted relay does once what was in flight has settled.
// stay keeps the process and its admin endpoint up in the halted state (as a
// failed Kafka Connect task stays FAILED on a running worker), so that the
// state can be seen and alerted on and a supervisor does not restart it into
// the same halt; exit ends the process with code 3.
enum class HaltAction { stay, exit };
// snapshot.mode (Debezium's names): no_data relays what is inserted after the
// slot exists; initial first sends the rows already in the outbox tables, read
// in the slot's exported snapshot; initial_only does that and stops.
enum class SnapshotMode { no_data, initial, initial_only };
enum class RetentionPolicy { none, delete_rows, drop_partitions };

// `column:placement[:alias]` of table.fields.additional.placement, as
// Debezium's router defines them: a header, a member of the value's
// envelope ({"payload": ..., alias: ...}), or the record's partition.
enum class Placement { header, envelope, partition };
struct AdditionalField {
  std::string column;
  Placement placement = Placement::header;
  std::string alias;      // header or envelope member name; the column name when empty
};
// The placement's name as the configuration spells it.
const char* placement_name(Placement placement);

// key.converter / value.converter: the Kafka Connect converter whose bytes
// walrelay writes. string: StringConverter (and ByteArrayConverter, the
// same bytes here); json: JsonConverter with schemas.enable=false.
enum class Converter { string, json };

// CloudEvents 1.0 in Kafka's protocol binding, built from the outbox columns
// (id, type, key as subject, timestamp, a configured source). binary: the
// attributes are ce_* headers and the value is the payload; structured: the
// value is the event as JSON (Debezium's CloudEventsConverter) with the
// payload as data (or data_base64).
enum class CloudEventsMode { none, binary, structured };

// value.converter naming a schema-registry converter (Confluent's class
// names): the payload, JSON as the application wrote it, is encoded by the
// subject's registered schema and framed in Confluent's wire format (magic
// byte 0, the schema id as 4 bytes big-endian, then the encoded value).
enum class RegistryFormat { none, avro, json_schema, protobuf };
// value.converter.value.subject.name.strategy: the subject a record's schema
// is registered under. topic: <topic>-value; record: the record name;
// topic_record: <topic>-<record name>. The record name is the event's type
// (table.field.event.type), as the schema's full name.
enum class SubjectNameStrategy { topic, record, topic_record };

// The converter's class name, as value.converter spells it.
const char* registry_converter_name(RegistryFormat format);
// Text with the user info (user:password@) of every URL in it masked, for
// logs, errors and printed settings: from each :// to the last @ before the
// next :// (a password may hold a / or an @).
std::string redact_url(const std::string& text);

struct SchemaRegistryConfig {
  RegistryFormat format = RegistryFormat::none;
  std::vector<std::string> urls;          // value.converter.schema.registry.url (one or several)
  std::string basic_auth_user_info;       // value.converter.basic.auth.user.info (user:password)
  std::string bearer_token;               // value.converter.bearer.auth.token
  std::string ssl_ca_location;            // value.converter.schema.registry.ssl.ca.location (PEM)
  std::string ssl_certificate_location;   // ... .ssl.certificate.location (PEM, a client certificate)
  std::string ssl_key_location;           // ... .ssl.key.location (PEM)
  std::string ssl_key_password;           // ... .ssl.key.password
  bool ssl_verify = true;                 // ... .ssl.endpoint.identification.algorithm (https; "" turns it off)
  SubjectNameStrategy subject_strategy = SubjectNameStrategy::topic;
  // value.converter named Apicurio's converter (its framing is Apicurio 3's
  // default, the same bytes); its credentials, as Apicurio's keys name them.
  bool apicurio = false;
  std::string apicurio_username, apicurio_password;
  int request_timeout_ms = 10000;         // value.converter.schema.registry.request.timeout.ms
};

struct TableName {
  std::string schema;
  std::string name;
  std::string qualified() const { return schema + "." + name; }
  bool operator==(const TableName&) const = default;
};

struct Config {
  // database.* (Debezium's PostgreSQL connector names)
  // One host, or several (libpq's multi-host list: a,b,c) tried in order.
  std::string database_hostname = "localhost";
  // One port for every host, or one per host ("5432,5433").
  std::string database_port = "5432";
  // libpq's target_session_attrs: any, read-write, read-only, primary,
  // standby, prefer-standby. Empty: read-write with several hosts (find the
  // primary after a failover), any with one.
  std::string database_target_session_attrs;
  std::string database_user = "postgres";
  std::string database_password;
  std::string database_dbname = "postgres";
  std::string database_sslmode = "prefer";
  std::string database_sslrootcert;
  std::string database_sslcert;
  std::string database_sslkey;
  int database_connect_timeout_ms = 10000;

  std::string slot_name = "walrelay";
  bool slot_failover = false;             // slot.failover: create the slot as a failover slot (17+)
  std::string publication_name = "walrelay";
  PublicationAutocreate publication_autocreate = PublicationAutocreate::filtered;
  int status_update_interval_ms = 1000;
  int replication_timeout_ms = 30000;     // silence after which the connection is declared dead
  bool bulk_read = true;                  // replication.bulk.read: fewer wake-ups while events come in bulk
  int reconnect_backoff_ms = 500;
  int reconnect_backoff_max_ms = 30000;
  int slot_status_interval_ms = 10000;    // 0 turns the pg_replication_slots poll off
  bool binary = false;                    // pgoutput binary mode (reads text forms otherwise)

  // The initial snapshot, taken once, when the slot is created.
  SnapshotMode snapshot_mode = SnapshotMode::no_data;
  int snapshot_fetch_size = 10240;        // snapshot.fetch.size: rows per FETCH (fewer when rows are large)
  // snapshot.select.statement.overrides.<schema.table>: a SELECT of that
  // table's rows, or a WHERE condition on them.
  std::map<std::string, std::string> snapshot_select_overrides;
  std::string snapshot_override_tables;   // snapshot.select.statement.overrides: Debezium's list of them
  std::string snapshot_order_column;      // snapshot.order.column; empty: table.field.event.id

  // Retention: walrelay deletes outbox rows the broker has acknowledged once
  // they are older than table.retention.ms (source/outbox_retention.hpp).
  RetentionPolicy retention_policy = RetentionPolicy::none;  // table.retention.policy
  std::int64_t retention_ms = 7LL * 24 * 3600 * 1000;       // table.retention.ms: kept at least this long
  int retention_interval_ms = 60000;                         // table.retention.interval.ms
  int retention_batch_size = 1000;                           // table.retention.batch.size: rows per DELETE
  std::string retention_time_column;  // table.retention.time.column; empty: table.field.event.timestamp
  std::string retention_archive_schema;  // table.retention.archive.schema: drop-partitions moves them there
  std::string retention_user;         // table.retention.user; empty: database.user
  std::string retention_password;     // table.retention.password

  // Outbox Event Router (Debezium's names and defaults)
  std::vector<TableName> table_include_list{{"public", "outbox"}};
  std::string field_event_id = "id";
  std::string field_event_key = "aggregateid";
  std::string field_event_type = "type";
  std::string field_event_payload = "payload";
  std::string field_event_timestamp;      // empty: the commit time
  // table.field.event.headers: a column (json, jsonb or text) holding a JSON
  // object whose members become Kafka headers. Empty: none.
  std::string field_event_headers;
  // table.field.event.schema.version: a column holding the version of the
  // subject's schema that encodes the row (a schema registry). Empty, or
  // NULL in the row: the subject's latest version.
  std::string field_event_schema_version;
  std::string route_by_field = "aggregatetype";
  std::string route_topic_replacement = "outbox.event.${routedByValue}";
  // route.topic.regex: matched against the whole route value; the
  // replacement's ${name} and $n refer to its groups (Java's syntax). No
  // match: the route value itself is the topic, as in Debezium.
  static constexpr const char* default_route_topic_regex = "(?<routedByValue>.*)";
  std::string route_topic_regex = default_route_topic_regex;
  // Whether the topic depends on the route value (a group reference in the
  // replacement, or a regex of one's own).
  bool routes_by_value() const {
    return route_topic_replacement.find('$') != std::string::npos || route_topic_regex != default_route_topic_regex;
  }
  std::vector<AdditionalField> additional_placement;
  // table.fields.additional.error.on.missing: a placed column the table (or
  // message) lacks is the row's mapping error; false leaves the field out.
  bool additional_error_on_missing = true;
  InvalidOperation op_invalid_behavior = InvalidOperation::warn;  // table.op.invalid.behavior
  HaltAction halt_action = HaltAction::stay;  // halt.action
  bool route_tombstone_on_empty_payload = false;
  bool expand_json_payload = false;       // table.expand.json.payload
  Converter key_converter = Converter::string;
  Converter value_converter = Converter::string;
  CloudEventsMode cloudevents = CloudEventsMode::none;  // cloudevents.mode
  SchemaRegistryConfig registry;          // value.converter=<a schema-registry converter> and its keys
  std::string cloudevents_source;         // cloudevents.source; empty: /walrelay/<database.dbname>
  std::string cloudevents_source_or_default() const {
    return cloudevents_source.empty() ? "/walrelay/" + database_dbname : cloudevents_source;
  }
  // tracing.span.context.field: a column (or message member) holding the
  // writer's W3C trace context, as Debezium's router reads it (Java
  // properties text) or as a plain traceparent. Empty: not read.
  std::string tracing_span_context_field = "tracingspancontext";
  // tracing.enabled: pass that context on as traceparent/tracestate headers.
  // Off by default, as Debezium's stock router (it traces only with
  // OpenTelemetry on its classpath); Debezium's ActivateTracingSpan in a
  // pasted transform chain turns it on.
  bool tracing_enabled = false;

  // The tableless outbox: transactional logical messages
  // (pg_logical_emit_message) whose prefix matches one of these regular
  // expressions (whole prefix, Debezium's message.prefix.include.list) are
  // outbox events. Empty: messages are not requested at all.
  std::vector<std::string> message_prefix_include_list;

  // exactly once (Kafka Connect's names)
  bool exactly_once = false;              // exactly.once.support=required
  int transaction_boundary_interval_ms = 100;  // transaction.boundary.interval.ms (transaction.boundary=poll: 0)
  long transaction_boundary_max_records = 10000;
  std::string offsets_topic = "walrelay-offsets";  // offsets.storage.topic
  // kafka.transactional.id, or walrelay-<dbname>-<slot>: the same for every
  // walrelay of one slot, so that a takeover fences the old one.
  std::string transactional_id() const;

  // flow control and errors
  std::int64_t max_inflight_records = 2048;
  std::int64_t max_inflight_bytes = 64LL * 1024 * 1024;
  ErrorTolerance errors_tolerance = ErrorTolerance::none;
  std::string dlq_topic;                  // errors.deadletterqueue.topic.name
  bool dlq_context_headers = true;        // errors.deadletterqueue.context.headers.enable
  int shutdown_timeout_ms = 30000;

  // admin and logs
  std::string admin_listen = "127.0.0.1:8080";
  std::string admin_token;          // GET /readyz, /metrics, /slot, /replay
  std::string admin_replay_token;   // POST /replay (admin.replay.token); empty: no POST
  std::string admin_control_token;  // POST /pause, /resume, /restart and /replay (admin.control.token); empty: none
  std::string log_level = "info";
  LogFormat log_format = LogFormat::text;

  // sink.type: where records go (sinks/sink_table.hpp): kafka, nats-jetstream, rabbitmq.
  std::string sink_type = "kafka";
  // sink.<type>.* as written, full key; the sink reads its own (e.g.
  // sinks/nats/nats_config.hpp).
  std::map<std::string, std::string> sink_settings;

  // kafka.* passed to librdkafka verbatim, prefix stripped, walrelay's defaults applied
  std::map<std::string, std::string> kafka;

  // Where each key's value came from, for --check and the echoed configuration.
  std::map<std::string, std::string> origin;
  // Keys of a Debezium or Kafka Connect configuration that mean nothing
  // here, each with why (connect_config.hpp); logged once at start.
  std::vector<std::string> notes;

  // The libpq connection string; `replication` is "database" or empty.
  std::string conninfo(bool replication) const;
  // Retention's deletes: table.retention.user's, else conninfo(false).
  std::string retention_conninfo() const;
  // The same with the password masked, for logs.
  std::string conninfo_redacted(bool replication) const;

 private:
  std::string conninfo_as(const std::string& user, const std::string& password, bool replication) const;

 public:
  // Every key with its effective value, secrets masked, one `key=value` a line.
  std::string describe() const;
};

// Parses `key=value` lines (`#` and `!` comments, blank lines), or the JSON
// of Kafka Connect's REST API, reads Debezium's and Connect's keys as
// walrelay's (connect_config.hpp), then overlays WALRELAY_* variables from
// `environ` (upper case, dots as underscores), which win. Unknown, repeated
// or invalid keys throw ConfigError naming the key. No connection is made.
Config load_config(const std::string& path, const std::vector<std::string>& environ);
Config parse_config(const std::string& text, const std::string& source_name,
                    const std::vector<std::string>& environ);

// route.topic.replacement's syntax, Java's Matcher replacement: ${name} and
// $n refer to route.topic.regex's groups, a backslash escapes the next
// character. Expands `replacement` into `out`, each group looked up by
// `group`; returns what is wrong (a group `group` does not know, a ${
// without its }), or nullopt.
using RouteGroup = std::function<std::optional<std::string_view>(std::string_view name)>;
std::optional<std::string> expand_route_replacement(std::string_view replacement, const RouteGroup& group,
                                                    std::string& out);

// Why `name` is not a topic Kafka accepts (legal characters are ASCII
// letters, digits, '.', '_' and '-'; 1 to 249 of them; not "." or ".."), or
// nullopt when it is one.
std::optional<std::string> illegal_topic_reason(std::string_view name);

// What a valid configuration still does that an operator should know at
// start (logged as warnings).
std::vector<std::string> config_warnings(const Config& config);

// True for keys whose values are never shown (passwords, tokens, sasl
// secrets, user info): a key holding one of secret_key_words().
bool is_secret_key(const std::string& key);
const std::vector<std::string>& secret_key_words();
// A setting's value as printed or logged anywhere (--print-config, --check,
// the notes on a translated configuration, the container's rendered file):
// ******** for a secret key, else the value with every URL's user info
// masked. The one rule for showing a setting.
std::string shown_setting(const std::string& key, const std::string& value);

// A key's value as an integer in [min, max], or as true/false (any case);
// throws ConfigError naming the key. For the sinks' own keys too.
std::int64_t parse_int(const std::string& key, const std::string& v, std::int64_t min, std::int64_t max);
bool parse_bool(const std::string& key, const std::string& v);

// The items of a comma-separated list, each trimmed, empty ones dropped.
std::vector<std::string> split_list(const std::string& s);

// Every key the configuration accepts besides kafka.* (--print-config
// prints each one).
std::vector<std::string> config_keys();

}  // namespace walrelay
