#include "walrelay/sinks/nats/nats_config.hpp"

#include <array>

#include "walrelay/config.hpp"

namespace walrelay {

namespace {

constexpr std::string_view prefix = "sink.nats-jetstream.";

constexpr std::array<std::string_view, 19> keys = {
    "url",           "create-stream",    "stream.name",     "subjects",
    "storage",       "duplicate.window.ms", "auth.user",    "auth.password",
    "auth.token",    "auth.credentials.file", "tls.enabled", "tls.ca.location",
    "tls.certificate.location", "tls.key.location", "max.pending", "ack.timeout.ms",
    "connect.timeout.ms",
    // Debezium Server's, refused with what to use instead (below).
    "auth.jwt",      "auth.seed",
};

}  // namespace

std::span<const std::string_view> nats_jetstream_keys() { return keys; }

NatsJetStreamConfig nats_jetstream_config(const Config& config) {
  NatsJetStreamConfig n;
  bool tls_named = false;
  for (auto& [key, v] : config.sink_settings) {
    if (!key.starts_with(prefix)) continue;
    const std::string_view k = std::string_view(key).substr(prefix.size());
    if (k == "url") {
      n.urls = split_list(v);
      if (n.urls.empty()) throw ConfigError(key, "names no server");
      for (auto& u : n.urls)
        if (u.starts_with("tls://")) n.tls = true;
    } else if (k == "create-stream") {
      n.create_stream = parse_bool(key, v);
    } else if (k == "stream.name") {
      if (v.empty() || v.find_first_of(" .*>\t") != std::string::npos)
        throw ConfigError(key, "a stream name has no spaces, dots or wildcards, got \"" + v + "\"");
      n.stream_name = v;
    } else if (k == "subjects") {
      n.subjects = split_list(v);
    } else if (k == "storage") {
      if (v != "file" && v != "memory") throw ConfigError(key, "expected file or memory, got \"" + v + "\"");
      n.storage = v;
    } else if (k == "duplicate.window.ms") {
      n.duplicate_window_ms = parse_int(key, v, 1000, 7LL * 24 * 3600 * 1000);
    } else if (k == "auth.user") {
      n.user = v;
    } else if (k == "auth.password") {
      n.password = v;
    } else if (k == "auth.token") {
      n.token = v;
    } else if (k == "auth.credentials.file") {
      n.credentials_file = v;
    } else if (k == "tls.enabled") {
      n.tls = parse_bool(key, v) || n.tls;
    } else if (k == "tls.ca.location") {
      n.tls_ca_location = v;
      tls_named = true;
    } else if (k == "tls.certificate.location") {
      n.tls_certificate_location = v;
      tls_named = true;
    } else if (k == "tls.key.location") {
      n.tls_key_location = v;
      tls_named = true;
    } else if (k == "max.pending") {
      n.max_pending = static_cast<int>(parse_int(key, v, 1, 1000000));
    } else if (k == "ack.timeout.ms") {
      n.ack_timeout_ms = static_cast<int>(parse_int(key, v, 100, 600000));
    } else if (k == "connect.timeout.ms") {
      n.connect_timeout_ms = static_cast<int>(parse_int(key, v, 100, 600000));
    } else if (k == "auth.jwt" || k == "auth.seed") {
      throw ConfigError(key, "give the JWT and the NKey seed together as a .creds file in "
                             "sink.nats-jetstream.auth.credentials.file (what `nsc generate creds` writes), so "
                             "that neither sits in the configuration");
    } else {
      throw ConfigError(key, "unknown key of the nats-jetstream sink");
    }
  }
  if (tls_named) n.tls = true;
  if (n.tls_certificate_location.empty() != n.tls_key_location.empty())
    throw ConfigError("sink.nats-jetstream.tls.certificate.location",
                      "a client certificate needs its key: set tls.certificate.location and tls.key.location together");
  if (!n.user.empty() && !n.token.empty())
    throw ConfigError("sink.nats-jetstream.auth.token", "conflicting: auth.user/auth.password and auth.token both set");
  if (n.subjects.empty()) {
    // The router's default topics (outbox.event.<aggregatetype>), and the
    // dead-letter subject: a route.topic.replacement of one's own names its
    // subjects too.
    n.subjects = {"outbox.event.>"};
    if (!config.dlq_topic.empty()) n.subjects.push_back(config.dlq_topic);
  }
  return n;
}

}  // namespace walrelay
