// sink.type=redis: Debezium Server's keys (debezium.sink.redis.*) without the
// `debezium.` prefix where it has them, walrelay's own for the stream's name,
// the in-flight bound and MAXLEN.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace walrelay {

struct Config;

struct RedisConfig {
  std::string host = "127.0.0.1";  // address: host:port
  int port = 6379;
  std::string user;                // user (Redis 6 ACLs); with password only, the default user
  std::string password;            // password
  int db_index = 0;                // db.index
  // message.format: extended (walrelay's default: fields key, value, id and
  // headers, a JSON object) or compact (Debezium Server's default: one field,
  // the key, whose value is the record's; headers are not carried).
  bool extended = true;
  std::string null_key = "default";    // null.key: compact's field name for a record without key
  std::string null_value = "default";  // null.value: compact's value for a tombstone
  // stream.template: the stream of a record; ${topic} is its routed topic.
  std::string stream_template = "${topic}";
  std::int64_t maxlen = 0;       // stream.maxlen: XADD MAXLEN ~ n; 0 keeps every entry
  int batch_size = 500;          // batch.size: entries per round trip
  int max_pending = 4096;        // max.pending: entries submitted and not yet answered
  int connect_timeout_ms = 2000; // connection.timeout.ms
  int socket_timeout_ms = 5000;  // socket.timeout.ms: a reply not back by then fails transiently
  int retry_initial_delay_ms = 300;  // retry.initial.delay.ms: the first reconnection's wait
  int retry_max_delay_ms = 10000;    // retry.max.delay.ms
  bool wait_enabled = false;     // wait.enabled: WAIT for a replica after each batch
  int wait_timeout_ms = 1000;    // wait.timeout.ms
  int wait_replicas = 1;         // wait.replicas (walrelay's): how many replicas WAIT asks for
  // What picks the events (table.include.list, message.prefix.include.list),
  // as a hash: part of the source the mark names. Changed, the events of a
  // transaction are others, and the mark vouches for none of them.
  std::string selection;
};

// The keys after `sink.redis.`.
std::span<const std::string_view> redis_keys();
// Reads config.sink_settings; throws ConfigError naming the key.
RedisConfig redis_config(const Config& config);
// The stream of a record routed to `topic`.
std::string redis_stream_name(const RedisConfig& config, std::string_view topic);

}  // namespace walrelay
