// sink.type=http: Debezium Server's keys (debezium.sink.http.*) without the
// `debezium.` prefix where it has them, walrelay's own for the in-flight
// bounds, TLS (librdkafka's names, as kafka.* uses them), bearer and basic
// credentials (secrets: from the environment as any key, masked in
// --print-config).
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace walrelay {

struct Config;

enum class HttpAuthentication { none, standard_webhooks, bearer, basic };
// batch.format: the body of a request that carries several records.
// values: a JSON array of the records' values (Debezium Server's batches);
// records: a JSON array of {"id", "key", "headers", "value"} (walrelay's:
// what one request per record says in its headers, for each record).
enum class HttpBatchFormat { values, records };

struct HttpConfig {
  // url: where each record is POSTed; ${topic} is its routed topic (the
  // dead-letter copies' is the dead-letter topic's name).
  std::string url;
  int timeout_ms = 60000;          // timeout.ms: a request not answered by then fails transiently
  int connect_timeout_ms = 10000;  // connection.timeout.ms (walrelay's)
  int retries = 5;                 // retries: attempts after the first, in place, before the slot sends it again
  int retry_interval_ms = 1000;    // retry.interval.ms: between attempts (a longer Retry-After wins)
  int retry_after_max_ms = 300000; // retry.after.max.ms (walrelay's): the most a Retry-After is waited
  std::string headers_prefix = "X-DEBEZIUM-";  // headers.prefix: before each record header's name
  bool headers_encode_base64 = true;           // headers.encode.base64: header values as base64
  std::string content_type = "application/json";  // content.type (walrelay's)
  int max_inflight_requests = 16;  // max.inflight.requests: requests at once, at most one per key
  int max_pending = 4096;          // max.pending: records submitted and not yet answered
  bool batch_enabled = false;      // batch.enabled: several records of one URL in one request, a JSON array
  int batch_max_size = 200;        // batch.max-size: the most records a request carries
  std::size_t batch_max_bytes = 1048576;  // batch.max.bytes (walrelay's): the most value bytes a request carries
  HttpBatchFormat batch_format = HttpBatchFormat::values;  // batch.format (walrelay's)
  HttpAuthentication authentication = HttpAuthentication::none;  // authentication.type
  std::string webhook_secret;      // authentication.webhook.secret (whsec_<base64>): Standard Webhooks
  std::string webhook_key;         // its key, decoded
  std::string bearer_token;        // authentication.bearer.token
  std::string basic_user;          // authentication.basic.user
  std::string basic_password;      // authentication.basic.password
  std::string ssl_ca_location;     // ssl.ca.location: CA bundle for https (default: the system's)
  std::string ssl_certificate_location;  // ssl.certificate.location: client certificate (PEM)
  std::string ssl_key_location;    // ssl.key.location: its key (PEM)
  std::string ssl_key_password;    // ssl.key.password
};

// The keys after `sink.http.`.
std::span<const std::string_view> http_keys();
// Reads config.sink_settings (and the environment variables they name);
// throws ConfigError naming the key.
HttpConfig http_config(const Config& config);
// The URL of a record routed to `topic`.
std::string http_url(const HttpConfig& config, std::string_view topic);
// A URL template with each ${topic} replaced by `topic` as one path segment
// (what would end or escape it percent-encoded).
std::string url_with_topic(std::string_view tpl, std::string_view topic);
// The URL as messages show it: scheme, host and port (user info, path and
// query may hold secrets).
std::string http_url_for_log(std::string_view url);
// Base64 of `bytes`, padded.
std::string encode_base64(std::string_view bytes);
// SHA-256 of `bytes`, 64 lowercase hex digits.
std::string sha256_hex(std::string_view bytes);
// Base64 (padding optional); nullopt when not base64.
std::optional<std::string> decode_base64(std::string_view text);

}  // namespace walrelay
