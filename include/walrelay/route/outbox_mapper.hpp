// From an outbox row (a pgoutput Insert) to a Kafka record, with the Outbox
// Event Router's rules. The wire format is the decoder's business; what a row
// means is this module's.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <boost/regex.hpp>
#include <pgoutput/pgoutput.hpp>

#include "walrelay/config.hpp"

namespace walrelay {

// One record ready for the sink. Views point into the mapper's reusable
// buffers or into the received WAL buffer; valid until the next map() call.
struct OutboxRecord {
  struct Header {
    std::string_view name;  // must point at NUL-terminated storage (librdkafka takes a C string)
    std::optional<std::string_view> value;
  };
  std::string_view topic;                 // NUL-terminated
  std::optional<std::string_view> key;
  std::optional<std::string_view> value;  // nullopt: a tombstone
  std::int64_t timestamp_ms = 0;          // unix epoch
  std::int32_t partition = -1;            // a partition placement's value; -1: by key
  // The event's id (also the `id` header): the brokers that deduplicate by
  // a message id (NATS JetStream's Nats-Msg-Id, AMQP's message_id) get it.
  std::string_view event_id;
  std::vector<Header> headers;            // capacity kept between rows
  // Where it came from: a position in table.include.list, or past its end
  // the position of a message prefix pattern in message.prefix.include.list.
  std::uint16_t table_index = 0;
  // With a schema registry (value.converter): the event's type, for the
  // record name strategies, and the schema version the row asks for
  // (table.field.event.schema.version); nullopt when not set or NULL.
  std::optional<std::string_view> event_type;
  std::optional<int> schema_version;
  // Where the stream put it: its transaction's commit LSN and a number that
  // rises with its place in that transaction (from the change's own LSN and
  // its rank among the rows of one WAL record). The same on every decoding
  // of the same WAL, so a sink can tell a record sent again (the Redis
  // stream's entry id). nullopt for records of no stream (an initial
  // snapshot's rows, replay, redrive).
  struct Position {
    std::uint64_t commit_lsn = 0;
    std::uint64_t index = 0;
  };
  std::optional<Position> position;

  std::size_t size_bytes() const {
    return (key ? key->size() : 0) + (value ? value->size() : 0);
  }
};

// Why a row could not be mapped. reason is a metric label.
struct MapError {
  std::string reason;   // missing_column, null_value, unsupported_type, bad_timestamp, bad_content, ...
  std::string message;  // names the column and what is wrong
};

// PostgreSQL type OIDs the mapper understands in binary mode (any type works
// in text mode, where PostgreSQL sends its text form).
namespace pgtype {
inline constexpr std::uint32_t bool_ = 16, bytea = 17, name = 19, int8 = 20, int2 = 21, int4 = 23, text = 25,
                               oid = 26, json = 114, bpchar = 1042, varchar = 1043, timestamp = 1114,
                               timestamptz = 1184, uuid = 2950, jsonb = 3802;
}

class OutboxMapper {
 public:
  explicit OutboxMapper(const Config& config);

  // Remembers a Relation message (also after ALTER TABLE mid-stream). Returns
  // true when the relation is one of table.include.list.
  bool on_relation(const pgoutput::Relation& relation);
  // True when rows of this relation OID are outbox rows.
  bool is_outbox(std::uint32_t relation_oid) const;
  // schema.table of a known relation, or "" if unknown.
  std::string_view table_name(std::uint32_t relation_oid) const;

  // Maps one inserted row. commit_time_us is the transaction's commit time
  // (PostgreSQL epoch micros). On success `out` is filled; else the error.
  std::optional<MapError> map(const pgoutput::Insert& insert, std::int64_t commit_time_us, OutboxRecord& out);

  // Maps the content of a logical message (pg_logical_emit_message): a JSON
  // object whose members are named by the same table.field.event.* keys as
  // a row's columns, with the same rules. A string member counts as a
  // column's text; any other JSON value as its JSON text (a jsonb column's
  // text form). source_index goes to out.table_index.
  std::optional<MapError> map_message(const pgoutput::LogicalMessage& message, std::int64_t commit_time_us,
                                      std::uint16_t source_index, OutboxRecord& out);

  // Why the last mapped event's trace context was left out (malformed), or
  // empty. The event itself is relayed either way.
  const std::string& trace_problem() const { return trace_problem_; }

  // The row as a JSON object of column name to text form (or null; binary
  // values as "\\x" hex), for a dead-letter record when the row cannot be
  // mapped. Always valid JSON: invalid UTF-8 becomes U+FFFD.
  std::string row_json(const pgoutput::Insert& insert) const;
  // The event id column's text form if it can be read (for error messages).
  std::string event_id_of(const pgoutput::Insert& insert) const;

 private:
  struct ColumnRef {
    int index = -1;
    std::uint32_t type_oid = 0;
    explicit operator bool() const { return index >= 0; }
  };
  struct PlacedColumn {
    ColumnRef column;
    std::string header;  // the header's or envelope member's name
    std::string column_name;
  };
  struct RelationInfo {
    std::string table;                  // schema.table
    bool outbox = false;
    std::uint16_t table_index = 0;      // position in table.include.list
    std::vector<std::string> column_names;
    std::vector<std::uint32_t> column_types;
    ColumnRef id, key, payload, timestamp, route, tracing, headers, type, schema_version;
    std::vector<ColumnRef> route_columns;  // one per route_column_names_
    std::vector<PlacedColumn> placements;
    std::string missing;                // required columns absent, named; empty if none
  };
  // The text form of a column value: zero-copy for text, converted into buf for binary.
  std::optional<MapError> text_of(const RelationInfo& rel, const ColumnRef& ref, const pgoutput::Column& column,
                                  std::string& buf, std::string_view& out, std::string_view role) const;
  std::optional<MapError> timestamp_of(const RelationInfo& rel, const pgoutput::Column& column,
                                       std::int64_t& out_ms) const;

  // One additional placement's value (nullopt: NULL) put where its
  // placement says; json: the text is a JSON value, else a string.
  std::optional<MapError> place(std::size_t index, std::optional<std::string_view> value, bool json,
                                OutboxRecord& out);
  // key.converter, value.converter, table.expand.json.payload and the
  // envelope applied to a mapped record. payload_bytes: the payload is a
  // bytea's bytes, which JSON carries as base64 (as Connect's JsonConverter).
  void convert(OutboxRecord& out, bool payload_bytes);
  // One Kafka header per member of the JSON object in `json`
  // (table.field.event.headers): a string's characters, other values as
  // their JSON text, null as a header without a value.
  std::optional<MapError> add_row_headers(std::string_view json, OutboxRecord& out);
  // Makes the mapped record a CloudEvent (config_.cloudevents): ce_* headers
  // (binary), or the event as the value's JSON (structured). payload_json:
  // the payload is JSON (a json or jsonb column, a message's JSON member);
  // payload_bytes: a bytea's bytes (data_base64). Text that parses as JSON
  // is data, other text a string with datacontenttype text/plain.
  void cloudevent(std::string_view id, std::string_view type, std::optional<std::string_view> subject,
                  bool payload_json, bool payload_bytes, OutboxRecord& out);
  // Adds traceparent (and tracestate) headers from a trace context's text,
  // or sets trace_problem_.
  void add_trace_headers(std::string_view text, OutboxRecord& out);
  // Sets out.topic from the route value and the route columns' values
  // (route_column_values_); `what` names its source in errors.
  std::optional<MapError> route_to(std::string_view route, std::string_view what, OutboxRecord& out);
  // The value of a column route.topic.replacement names, for the row being mapped.
  std::optional<std::string_view> route_column(std::string_view name) const;
  // map()'s parts, for the row in columns_.
  std::optional<MapError> row_topic(const RelationInfo& rel, OutboxRecord& out);
  std::optional<MapError> row_value(const RelationInfo& rel, OutboxRecord& out);
  std::optional<MapError> row_headers(const RelationInfo& rel, std::string_view id, OutboxRecord& out);
  std::optional<MapError> row_schema_fields(const RelationInfo& rel, OutboxRecord& out);
  void row_trace(const RelationInfo& rel, OutboxRecord& out);
  // The column a reference names, in the row being mapped.
  const pgoutput::Column& column(const ColumnRef& ref) const { return columns_[static_cast<std::size_t>(ref.index)]; }
  // An empty payload as a tombstone, when route.tombstone.on.empty.payload says so.
  void tombstone_if_empty(OutboxRecord& out) const;
  // The headers a mapped record starts with (its id), and no placement yet.
  void start_headers(std::string_view id, OutboxRecord& out);

  const Config& config_;
  std::optional<boost::regex> route_regex_;  // a route.topic.regex of the user's own
  // Columns (or message members) that route.topic.replacement names besides
  // the regex's groups (${aggregatetype}.${type}), and their values for the
  // row being mapped. With any, topics depend on more than the route value
  // and are not cached.
  std::vector<std::string> route_column_names_;
  std::vector<std::string_view> route_column_values_;
  std::vector<std::string> route_column_bufs_;
  // Topic per route value under route_regex_ (node-based: out.topic points into it).
  struct ViewHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::string, ViewHash, std::equal_to<>> topic_cache_;
  static constexpr std::size_t max_cached_topics = 10000;
  std::unordered_map<std::uint32_t, RelationInfo> relations_;
  // Reusable buffers: no allocation per row once warm.
  std::string topic_buf_, key_buf_, value_buf_, id_buf_, route_buf_;
  std::vector<std::string> header_bufs_;
  std::vector<pgoutput::Column> columns_;
  std::string message_buf_;  // a message's content, padded as simdjson reads it
  // One member of a message's JSON object: a string's characters, or any
  // other value's JSON text.
  struct MessageMember {
    bool present = false;
    bool null = false;
    bool string = false;
    std::string_view text;
  };
  std::vector<MessageMember> placed_members_;  // one per additional placement
  std::vector<MessageMember> route_members_;   // one per route_column_names_
  // A message's members that the mapping reads, found in one pass.
  struct MessageMembers {
    MessageMember id, key, payload, timestamp, route, tracing, headers, type;
  };
  std::optional<MapError> read_members(pgoutput::Bytes content, MessageMembers& m);
  std::size_t member_targets(std::string_view name, MessageMembers& m, MessageMember* (&targets)[16]);
  std::optional<MapError> message_topic(const MessageMember& route, OutboxRecord& out);
  std::optional<MapError> message_timestamp(const MessageMember& timestamp, std::int64_t commit_time_us,
                                            OutboxRecord& out) const;
  // A member the mapping needs, missing or null: its mapping error.
  static std::optional<MapError> required(const MessageMember& m, const std::string& member, std::string_view role);
  std::string trace_text_buf_, traceparent_buf_, tracestate_buf_, trace_problem_;
  // The headers column's text (padded for simdjson) and its members' names
  // (NUL-terminated) and unescaped string values, reserved before filling so
  // that the header views into it stay put.
  std::string headers_text_buf_, headers_json_buf_, headers_store_;
  std::string ce_source_, ce_type_buf_, ce_time_buf_, ce_value_buf_, schema_version_buf_, event_type_buf_;
  struct EnvelopeMember {
    std::size_t index;  // in config_.additional_placement
    std::optional<std::string_view> value;
    bool json;
  };
  std::vector<EnvelopeMember> envelope_;
  std::string expanded_buf_, converted_value_buf_, converted_key_buf_;
};

}  // namespace walrelay
