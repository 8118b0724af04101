// sink.type=sqs: walrelay's own keys (Debezium Server has no SQS sink; its
// Kinesis sink's region, endpoint and credentials.profile are followed where
// they fit). Credentials as the AWS CLI finds them: AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN from the environment, else the
// profile's in the shared credentials file; read once, at start.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace walrelay {

struct Config;

struct SqsConfig {
  // queue.url: the queue each record goes to; ${topic} is its routed topic
  // with '.' and whatever else a queue name cannot hold as '_' (the
  // dead-letter copies' the dead-letter topic). A URL
  // whose name ends in .fifo is a FIFO queue: MessageGroupId the key.
  std::string queue_url;
  std::string region;               // region: signs the requests (default: from the URL, AWS_REGION)
  std::string profile;              // credentials.profile (default: AWS_PROFILE, else "default")
  int timeout_ms = 30000;           // timeout.ms: a request not answered by then fails transiently
  int connect_timeout_ms = 10000;   // connection.timeout.ms
  int retries = 5;                  // retries: attempts after the first, in place
  int retry_interval_ms = 1000;     // retry.interval.ms
  int max_inflight_requests = 16;   // max.inflight.requests: SendMessageBatch calls at once
  int max_pending = 4096;           // max.pending: records submitted and not yet answered
  int batch_size = 10;              // batch.size: entries per SendMessageBatch (SQS: at most 10)
  int batch_max_bytes = 262144;     // batch.max.bytes: a call's messages together (SQS: 256 KiB, 1 MiB since 2025)
  bool body_base64 = false;         // body.base64: the value base64-encoded (binary formats: SQS bodies are text)
  std::string ssl_ca_location;      // ssl.ca.location
  // Not keys: from the environment or the credentials file. Never shown.
  std::string access_key_id, secret_access_key, session_token;
  std::string credentials_source;   // where they came from, for messages
};

// The keys after `sink.sqs.`.
std::span<const std::string_view> sqs_keys();
// Reads config.sink_settings and the credentials; throws ConfigError naming the key.
SqsConfig sqs_config(const Config& config);
// The queue URL of a record routed to `topic`, each character of the topic
// that a queue name cannot hold ('.' above all) as '_'.
std::string sqs_queue_url(const SqsConfig& config, std::string_view topic);
// A FIFO queue's URL ends in .fifo.
bool sqs_is_fifo(std::string_view queue_url);
// The queue URL as messages show it: scheme://host[:port]/.../<queue name>
// (no user info, no account id).
std::string sqs_url_for_log(std::string_view queue_url);
// The endpoint a queue URL's calls go to: scheme://host[:port]/.
std::string sqs_endpoint(std::string_view queue_url);
// MessageGroupId and MessageDeduplicationId take 1 to 128 characters of
// letters, digits and punctuation: such a value as it is, any other as
// "sha256:" and its digest in hex (the same value, the same id).
std::string sqs_id_of(std::string_view value);

}  // namespace walrelay
