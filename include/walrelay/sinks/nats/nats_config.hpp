// sink.type=nats-jetstream: the keys are Debezium Server's
// (debezium.sink.nats-jetstream.*) without the `debezium.` prefix, plus
// walrelay's own for TLS, the in-flight bound and the acknowledgement wait.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace walrelay {

struct Config;

struct NatsJetStreamConfig {
  std::vector<std::string> urls{"nats://127.0.0.1:4222"};  // url: one or several, comma-separated
  // create-stream: at start, create the stream (stream.name, over subjects)
  // when it does not exist. Off by default, as in Debezium Server: streams
  // are usually the platform's, with their retention and replicas.
  bool create_stream = false;
  std::string stream_name = "walrelay";
  // subjects: the created stream's; default: the router's default topics
  // (outbox.event.>) and the dead-letter subject.
  std::vector<std::string> subjects;
  std::string storage = "file";               // storage: file or memory, for the created stream
  std::int64_t duplicate_window_ms = 120000;  // duplicate.window.ms, for the created stream
  std::string user, password, token;          // auth.user, auth.password, auth.token
  std::string credentials_file;               // auth.credentials.file: a .creds file (JWT and NKey seed)
  std::string tls_ca_location;                // tls.ca.location: PEM; setting any tls.* asks for TLS
  std::string tls_certificate_location;       // tls.certificate.location: a client certificate (PEM)
  std::string tls_key_location;               // tls.key.location
  bool tls = false;                           // tls.enabled, or any tls.*.location, or a tls:// URL
  int max_pending = 4096;                     // max.pending: publishes awaiting their PubAck
  int ack_timeout_ms = 5000;                  // ack.timeout.ms: a PubAck not back by then fails transiently
  int connect_timeout_ms = 2000;              // connect.timeout.ms
};

// The keys after `sink.nats-jetstream.`.
std::span<const std::string_view> nats_jetstream_keys();
// Reads config.sink_settings; throws ConfigError naming the key.
NatsJetStreamConfig nats_jetstream_config(const Config& config);

}  // namespace walrelay
