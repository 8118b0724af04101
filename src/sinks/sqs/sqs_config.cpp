#include "walrelay/sinks/sqs/sqs_config.hpp"

#include <array>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>

#include "walrelay/config.hpp"
#include "walrelay/sinks/http/http_config.hpp"

namespace walrelay {

namespace {

constexpr std::string_view prefix = "sink.sqs.";

constexpr std::array<std::string_view, 14> keys = {
    "queue.url",         "region",          "credentials.profile", "timeout.ms",         "connection.timeout.ms",
    "retries",           "retry.interval.ms", "max.inflight.requests", "max.pending",     "batch.size",
    "batch.max.bytes",   "body.base64",     "ssl.ca.location",     "endpoint",
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string trimmed(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

// The settings of `section` in an INI file as the AWS CLI writes them.
std::map<std::string, std::string> ini_section(const std::string& path, const std::string& section) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    const std::string t = trimmed(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      inside = trimmed(std::string_view(t).substr(1, t.size() - 2)) == section;
      continue;
    }
    const auto eq = t.find('=');
    if (inside && eq != std::string::npos) out[trimmed(std::string_view(t).substr(0, eq))] = trimmed(std::string_view(t).substr(eq + 1));
  }
  return out;
}

std::string home_file(const char* variable, const char* under_home) {
  const std::string set = env(variable);
  if (!set.empty()) return set;
  return env("HOME") + under_home;
}

// The AWS CLI's order: the environment's keys, unless a profile is named
// in the configuration; then the profile's in the credentials file, then
// in the config file.
void read_credentials(SqsConfig& s, bool profile_named) {
  if (!profile_named && !env("AWS_ACCESS_KEY_ID").empty()) {
    s.access_key_id = env("AWS_ACCESS_KEY_ID");
    s.secret_access_key = env("AWS_SECRET_ACCESS_KEY");
    s.session_token = env("AWS_SESSION_TOKEN");
    s.credentials_source = "the environment (AWS_ACCESS_KEY_ID)";
    if (s.secret_access_key.empty())
      throw ConfigError("sink.sqs.credentials.profile", "AWS_ACCESS_KEY_ID is set without AWS_SECRET_ACCESS_KEY");
    return;
  }
  const std::string credentials = home_file("AWS_SHARED_CREDENTIALS_FILE", "/.aws/credentials");
  const std::string config = home_file("AWS_CONFIG_FILE", "/.aws/config");
  auto found = ini_section(credentials, s.profile);
  std::string source = credentials;
  if (found.find("aws_access_key_id") == found.end()) {
    found = ini_section(config, s.profile == "default" ? s.profile : "profile " + s.profile);
    source = config;
  }
  if (found.find("aws_access_key_id") == found.end() || found["aws_secret_access_key"].empty())
    throw ConfigError("sink.sqs.credentials.profile",
                      "no AWS credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set, and profile \"" +
                          s.profile + "\" has no aws_access_key_id and aws_secret_access_key in " + credentials +
                          " or " + config);
  s.access_key_id = found["aws_access_key_id"];
  s.secret_access_key = found["aws_secret_access_key"];
  s.session_token = found["aws_session_token"];
  s.credentials_source = "profile " + s.profile + " in " + source;
}

// sqs.<region>.amazonaws.com, <region>.queue.amazonaws.com (the legacy name).
std::string region_of_host(std::string_view url) {
  const auto scheme = url.find("://");
  if (scheme == std::string_view::npos) return {};
  std::string_view host = url.substr(scheme + 3);
  host = host.substr(0, host.find_first_of(":/?#"));
  if (host.starts_with("sqs.")) {
    host.remove_prefix(4);
    const auto dot = host.find('.');
    if (dot != std::string_view::npos && host.substr(dot).starts_with(".amazonaws.com")) return std::string(host.substr(0, dot));
  }
  const auto queue = host.find(".queue.amazonaws.com");
  if (queue != std::string_view::npos && host.find('.') == queue) return std::string(host.substr(0, queue));
  return {};
}

void read_key(SqsConfig& s, const std::string& key, std::string_view k, const std::string& v, bool& profile_named) {
  if (k == "queue.url") {
    if (!v.starts_with("http://") && !v.starts_with("https://"))
      throw ConfigError(key, "expected an http:// or https:// queue URL (https://sqs.<region>.amazonaws.com/<account>/${topic})");
    s.queue_url = v;
  } else if (k == "region") {
    s.region = v;
  } else if (k == "credentials.profile") {
    s.profile = v;
    profile_named = true;
  } else if (k == "timeout.ms") {
    s.timeout_ms = static_cast<int>(parse_int(key, v, 100, 3600000));
  } else if (k == "connection.timeout.ms") {
    s.connect_timeout_ms = static_cast<int>(parse_int(key, v, 100, 600000));
  } else if (k == "retries") {
    s.retries = static_cast<int>(parse_int(key, v, 0, 1000));
  } else if (k == "retry.interval.ms") {
    s.retry_interval_ms = static_cast<int>(parse_int(key, v, 1, 3600000));
  } else if (k == "max.inflight.requests") {
    s.max_inflight_requests = static_cast<int>(parse_int(key, v, 1, 1024));
  } else if (k == "max.pending") {
    s.max_pending = static_cast<int>(parse_int(key, v, 1, 1000000));
  } else if (k == "batch.size") {
    s.batch_size = static_cast<int>(parse_int(key, v, 1, 10));
  } else if (k == "batch.max.bytes") {
    s.batch_max_bytes = static_cast<int>(parse_int(key, v, 1024, 1048576));
  } else if (k == "body.base64") {
    s.body_base64 = parse_bool(key, v);
  } else if (k == "ssl.ca.location") {
    s.ssl_ca_location = v;
  } else if (k == "endpoint") {
    throw ConfigError(key, "walrelay calls the endpoint of sink.sqs.queue.url's host; write the queue URL with it");
  } else {
    throw ConfigError(key, "unknown key of the sqs sink");
  }
}

}  // namespace

std::span<const std::string_view> sqs_keys() { return keys; }

SqsConfig sqs_config(const Config& config) {
  SqsConfig s;
  bool profile_named = false;
  for (auto& [key, v] : config.sink_settings)
    if (key.starts_with(prefix)) read_key(s, key, std::string_view(key).substr(prefix.size()), v, profile_named);
  if (s.queue_url.empty())
    throw ConfigError("sink.sqs.queue.url", "sink.type=sqs needs the queue URL (${topic} the routed topic)");
  if (s.region.empty()) s.region = region_of_host(s.queue_url);
  if (s.region.empty()) s.region = env("AWS_REGION");
  if (s.region.empty()) s.region = env("AWS_DEFAULT_REGION");
  if (s.region.empty())
    throw ConfigError("sink.sqs.region", "the queue URL's host names no region, and AWS_REGION is not set");
  for (char c : s.region)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-'))
      throw ConfigError("sink.sqs.region", "\"" + s.region + "\" is not a region name");
  if (s.profile.empty()) s.profile = env("AWS_PROFILE");
  if (s.profile.empty()) s.profile = "default";
  read_credentials(s, profile_named);
  return s;
}

std::string sqs_queue_url(const SqsConfig& config, std::string_view topic) {
  // A queue's name takes letters, digits, '-' and '_' (Kafka's topics take
  // '.' too): anything else in the topic is '_'.
  std::string name(topic);
  for (auto& c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) c = '_';
  return url_with_topic(config.queue_url, name);
}

bool sqs_is_fifo(std::string_view queue_url) {
  queue_url = queue_url.substr(0, queue_url.find_first_of("?#"));
  return queue_url.ends_with(".fifo");
}

std::string sqs_url_for_log(std::string_view queue_url) {
  const std::string shown = http_url_for_log(queue_url);  // scheme://host[:port] and "/..." (user info, account id)
  const auto last = queue_url.substr(0, queue_url.find_first_of("?#")).rfind('/');
  if (last == std::string_view::npos || !shown.ends_with("/...")) return shown;
  return shown + std::string(queue_url.substr(last, queue_url.find_first_of("?#") - last));
}

std::string sqs_endpoint(std::string_view queue_url) {
  const auto scheme = queue_url.find("://");
  const auto path = queue_url.find('/', scheme == std::string_view::npos ? 0 : scheme + 3);
  return std::string(queue_url.substr(0, path)) + "/";
}

std::string sqs_id_of(std::string_view value) {
  bool fits = !value.empty() && value.size() <= 128;
  for (unsigned char c : value) fits = fits && c > 0x20 && c < 0x7f;
  if (fits) return std::string(value);
  return "sha256:" + sha256_hex(value);
}

}  // namespace walrelay
