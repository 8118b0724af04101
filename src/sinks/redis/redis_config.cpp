#include "walrelay/sinks/redis/redis_config.hpp"

#include <array>
#include <cstdint>
#include <cstdio>

#include "walrelay/config.hpp"

namespace walrelay {

namespace {

constexpr std::string_view prefix = "sink.redis.";

constexpr std::array<std::string_view, 21> keys = {
    "address",        "user",           "password",          "db.index",
    "message.format", "null.key",       "null.value",        "stream.template",
    "stream.maxlen",  "batch.size",     "max.pending",       "connection.timeout.ms",
    "socket.timeout.ms", "retry.initial.delay.ms", "retry.max.delay.ms", "wait.enabled",
    "wait.timeout.ms", "wait.replicas",
    // Debezium Server's, refused with the reason (below).
    "ssl.enabled",    "memory.threshold.percentage", "memory.limit.mb",
};

}  // namespace

std::span<const std::string_view> redis_keys() { return keys; }

RedisConfig redis_config(const Config& config) {
  RedisConfig r;
  for (auto& [key, v] : config.sink_settings) {
    if (!key.starts_with(prefix)) continue;
    const std::string_view k = std::string_view(key).substr(prefix.size());
    if (k == "address") {
      const auto colon = v.rfind(':');
      if (v.empty() || colon == 0) throw ConfigError(key, "expected host:port, got \"" + v + "\"");
      if (colon == std::string::npos) {
        r.host = v;
      } else {
        r.host = v.substr(0, colon);
        r.port = static_cast<int>(parse_int(key, v.substr(colon + 1), 1, 65535));
      }
      if (r.host.size() > 2 && r.host.front() == '[' && r.host.back() == ']') r.host = r.host.substr(1, r.host.size() - 2);
    } else if (k == "user") {
      r.user = v;
    } else if (k == "password") {
      r.password = v;
    } else if (k == "db.index") {
      r.db_index = static_cast<int>(parse_int(key, v, 0, 1 << 20));
    } else if (k == "message.format") {
      if (v != "extended" && v != "compact") throw ConfigError(key, "expected extended or compact, got \"" + v + "\"");
      r.extended = v == "extended";
    } else if (k == "null.key") {
      r.null_key = v;
    } else if (k == "null.value") {
      r.null_value = v;
    } else if (k == "stream.template") {
      if (v.empty()) throw ConfigError(key, "names no stream");
      r.stream_template = v;
    } else if (k == "stream.maxlen") {
      r.maxlen = parse_int(key, v, 0, INT64_MAX);
    } else if (k == "batch.size") {
      r.batch_size = static_cast<int>(parse_int(key, v, 1, 100000));
    } else if (k == "max.pending") {
      r.max_pending = static_cast<int>(parse_int(key, v, 1, 1000000));
    } else if (k == "connection.timeout.ms") {
      r.connect_timeout_ms = static_cast<int>(parse_int(key, v, 100, 600000));
    } else if (k == "socket.timeout.ms") {
      r.socket_timeout_ms = static_cast<int>(parse_int(key, v, 100, 600000));
    } else if (k == "retry.initial.delay.ms") {
      r.retry_initial_delay_ms = static_cast<int>(parse_int(key, v, 10, 600000));
    } else if (k == "retry.max.delay.ms") {
      r.retry_max_delay_ms = static_cast<int>(parse_int(key, v, 10, 3600000));
    } else if (k == "wait.enabled") {
      r.wait_enabled = parse_bool(key, v);
    } else if (k == "wait.timeout.ms") {
      r.wait_timeout_ms = static_cast<int>(parse_int(key, v, 1, 600000));
    } else if (k == "wait.replicas") {
      r.wait_replicas = static_cast<int>(parse_int(key, v, 1, 100));
    } else if (k == "ssl.enabled") {
      if (parse_bool(key, v))
        throw ConfigError(key, "TLS to Redis is not in this build: Debian 12's hiredis (0.14) has none; reach a "
                               "TLS Redis through a local stunnel, or ask for a build with hiredis 1.x");
    } else if (k == "memory.threshold.percentage" || k == "memory.limit.mb") {
      throw ConfigError(key, "walrelay does not poll Redis's memory: its in-flight bound (sink.redis.max.pending) "
                             "holds the slot instead, and an OOM refusal from Redis is sent again, never dropped; "
                             "remove the key");
    } else {
      throw ConfigError(key, "unknown key of the redis sink");
    }
  }
  std::string picked;
  for (const auto& t : config.table_include_list) picked += t.qualified() + "\n";
  picked += "\n";
  for (const auto& p : config.message_prefix_include_list) picked += p + "\n";
  std::uint64_t fnv = 14695981039346656037ull;  // FNV-1a: the same in every build
  for (unsigned char ch : picked) fnv = (fnv ^ ch) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv));
  r.selection = hex;
  if (r.retry_max_delay_ms < r.retry_initial_delay_ms)
    throw ConfigError("sink.redis.retry.max.delay.ms", "shorter than sink.redis.retry.initial.delay.ms");
  if (!r.user.empty() && r.password.empty())
    throw ConfigError("sink.redis.user", "a user needs sink.redis.password");
  // An event's entry id is its commit LSN and place, a dead-letter copy's the
  // time (XADD's <ms>-*), which is far above: in one stream, every event after
  // a copy would fall below the stream's last id and count as a conflict.
  if (config.errors_tolerance == ErrorTolerance::all && !config.dlq_topic.empty() &&
      r.stream_template.find("${topic}") == std::string::npos)
    throw ConfigError("sink.redis.stream.template",
                      "\"" + r.stream_template +
                          "\" has no ${topic} while errors.tolerance=all dead-letters to "
                          "errors.deadletterqueue.topic.name: the copies would go into the events' stream, whose "
                          "entry ids are commit positions that a copy's (the time) would pass; put ${topic} in it");
  return r;
}

std::string redis_stream_name(const RedisConfig& config, std::string_view topic) {
  std::string out;
  const std::string_view tpl = config.stream_template;
  constexpr std::string_view placeholder = "${topic}";
  std::size_t at = 0;
  while (true) {
    const auto next = tpl.find(placeholder, at);
    out.append(tpl.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at));
    if (next == std::string_view::npos) break;
    out.append(topic);
    at = next + placeholder.size();
  }
  return out;
}

}  // namespace walrelay
