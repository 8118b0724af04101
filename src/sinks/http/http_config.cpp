#include "walrelay/sinks/http/http_config.hpp"

#include <openssl/evp.h>
#include <openssl/sha.h>

#include <algorithm>
#include <array>
#include <cctype>

#include "walrelay/config.hpp"

namespace walrelay {

namespace {

constexpr std::string_view prefix = "sink.http.";

constexpr std::array<std::string_view, 24> keys = {
    "url",
    "timeout.ms",
    "connection.timeout.ms",
    "retries",
    "retry.interval.ms",
    "retry.after.max.ms",
    "headers.prefix",
    "headers.encode.base64",
    "content.type",
    "max.inflight.requests",
    "max.pending",
    "authentication.type",
    "authentication.webhook.secret",
    "authentication.bearer.token",
    "authentication.basic.user",
    "authentication.basic.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "batch.enabled",
    "batch.max-size",
    "batch.max.bytes",
    "batch.format",
};

// A header name is a token (RFC 9110): the prefix must be one too.
bool is_token(std::string_view s) {
  for (unsigned char c : s)
    if (!(std::isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos))
      return false;
  return true;
}

}  // namespace

std::string encode_base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(std::max(n, 0)));
  return out;
}

std::string sha256_hex(std::string_view bytes) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
  static const char hex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : digest) {
    out.push_back(hex[b >> 4]);
    out.push_back(hex[b & 15]);
  }
  return out;
}

std::optional<std::string> decode_base64(std::string_view text) {
  // (Padding may be left off, as secrets are often pasted.)
  std::string padded(text);
  while (padded.size() % 4 != 0) padded.push_back('=');
  std::string out(3 * padded.size() / 4, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(padded.data()), static_cast<int>(padded.size()));
  if (n < 0 || padded.empty()) return std::nullopt;
  std::size_t len = static_cast<std::size_t>(n);
  // EVP_DecodeBlock counts the padding's bytes as data.
  for (std::size_t i = padded.size(); i > 0 && padded[i - 1] == '=' && len > 0; --i) --len;
  out.resize(len);
  return out;
}

std::span<const std::string_view> http_keys() { return keys; }

namespace {

// One family of sink.http.* keys each: true when `k` (the key without its
// prefix) is of the family and was taken.

// Where and how long: the URL, time-outs and retries.
bool take_delivery_key(HttpConfig& h, std::string_view k, const std::string& key, const std::string& v) {
  if (k == "url") {
    if (!v.starts_with("http://") && !v.starts_with("https://"))
      throw ConfigError(key, "expected an http:// or https:// URL");  // (the value may hold a secret)
    h.url = v;
  } else if (k == "timeout.ms") {
    h.timeout_ms = static_cast<int>(parse_int(key, v, 100, 3600000));
  } else if (k == "connection.timeout.ms") {
    h.connect_timeout_ms = static_cast<int>(parse_int(key, v, 100, 600000));
  } else if (k == "retries") {
    h.retries = static_cast<int>(parse_int(key, v, 0, 1000));
  } else if (k == "retry.interval.ms") {
    h.retry_interval_ms = static_cast<int>(parse_int(key, v, 1, 3600000));
  } else if (k == "retry.after.max.ms") {
    h.retry_after_max_ms = static_cast<int>(parse_int(key, v, 0, 86400000));
  } else if (k == "max.inflight.requests") {
    h.max_inflight_requests = static_cast<int>(parse_int(key, v, 1, 1024));
  } else if (k == "max.pending") {
    h.max_pending = static_cast<int>(parse_int(key, v, 1, 1000000));
  } else {
    return false;
  }
  return true;
}

// What a request looks like: its headers, content type and batching.
bool take_request_key(HttpConfig& h, std::string_view k, const std::string& key, const std::string& v) {
  if (k == "headers.prefix") {
    // Not empty: the record's headers (names from the rows) must never
    // become Content-Length, Host or Authorization.
    if (v.empty() || !is_token(v))
      throw ConfigError(key, "\"" + v + "\" cannot start a header name (letters, digits, -_. ..., not empty: "
                             "the record's header names come from the rows)");
    h.headers_prefix = v;
  } else if (k == "headers.encode.base64") {
    h.headers_encode_base64 = parse_bool(key, v);
  } else if (k == "content.type") {
    if (v.empty() || v.find_first_of("\r\n") != std::string::npos) throw ConfigError(key, "not a content type");
    h.content_type = v;
  } else if (k == "batch.enabled") {
    h.batch_enabled = parse_bool(key, v);
  } else if (k == "batch.max-size") {
    h.batch_max_size = static_cast<int>(parse_int(key, v, 1, 10000));
  } else if (k == "batch.max.bytes") {
    h.batch_max_bytes = static_cast<std::size_t>(parse_int(key, v, 1024, 64 * 1024 * 1024));
  } else if (k == "batch.format") {
    if (v == "values") h.batch_format = HttpBatchFormat::values;
    else if (v == "records") h.batch_format = HttpBatchFormat::records;
    else throw ConfigError(key, "expected values (a JSON array of the values, Debezium Server's) or records (of "
                                "{\"id\", \"key\", \"headers\", \"value\"}), got \"" + v + "\"");
  } else {
    return false;
  }
  return true;
}

// Who walrelay is to the receiver: the authentication and TLS keys.
bool take_credential_key(HttpConfig& h, std::string_view k, const std::string& key, const std::string& v) {
  if (k == "authentication.type") {
    if (v == "none") h.authentication = HttpAuthentication::none;
    else if (v == "standard-webhooks") h.authentication = HttpAuthentication::standard_webhooks;
    else if (v == "bearer") h.authentication = HttpAuthentication::bearer;
    else if (v == "basic") h.authentication = HttpAuthentication::basic;
    else if (v == "jwt" || v == "oauth2")
      throw ConfigError(key, v + " (Debezium Server's token exchange) is not in walrelay: use bearer with a "
                             "long-lived token (read at start: restart walrelay to renew it), basic, or "
                             "standard-webhooks");
    else
      throw ConfigError(key, "expected none, standard-webhooks, bearer or basic, got \"" + v + "\"");
  } else if (k == "authentication.webhook.secret") {
    h.webhook_secret = v;
  } else if (k == "authentication.bearer.token") {
    h.bearer_token = v;
  } else if (k == "authentication.basic.user") {
    h.basic_user = v;
  } else if (k == "authentication.basic.password") {
    h.basic_password = v;
  } else if (k == "ssl.ca.location") {
    h.ssl_ca_location = v;
  } else if (k == "ssl.certificate.location") {
    h.ssl_certificate_location = v;
  } else if (k == "ssl.key.location") {
    h.ssl_key_location = v;
  } else if (k == "ssl.key.password") {
    h.ssl_key_password = v;
  } else {
    return false;
  }
  return true;
}

// The keys that only make sense together: each authentication type's
// secrets, a client certificate's two halves.
void check_credentials(HttpConfig& h) {
  switch (h.authentication) {
    case HttpAuthentication::standard_webhooks: {
      const std::string why = "standard-webhooks needs a secret whsec_<base64 of 24 to 64 random bytes>";
      if (!h.webhook_secret.starts_with("whsec_")) throw ConfigError("sink.http.authentication.webhook.secret", why);
      auto key = decode_base64(std::string_view(h.webhook_secret).substr(6));
      if (!key || key->size() < 16) throw ConfigError("sink.http.authentication.webhook.secret", why);
      h.webhook_key = std::move(*key);
      break;
    }
    case HttpAuthentication::bearer:
      if (h.bearer_token.empty())
        throw ConfigError("sink.http.authentication.bearer.token", "authentication.type=bearer needs the token (from "
                                                                   "WALRELAY_SINK_HTTP_AUTHENTICATION_BEARER_TOKEN)");
      break;
    case HttpAuthentication::basic:
      if (h.basic_user.empty() || h.basic_password.empty())
        throw ConfigError(h.basic_user.empty() ? "sink.http.authentication.basic.user"
                                               : "sink.http.authentication.basic.password",
                          "authentication.type=basic needs a user and a password (the password from "
                          "WALRELAY_SINK_HTTP_AUTHENTICATION_BASIC_PASSWORD)");
      break;
    case HttpAuthentication::none:
      break;
  }
  if (!h.webhook_secret.empty() && h.authentication != HttpAuthentication::standard_webhooks)
    throw ConfigError("sink.http.authentication.webhook.secret",
                      "set without sink.http.authentication.type=standard-webhooks: nothing would be signed");
  if (h.ssl_key_location.empty() != h.ssl_certificate_location.empty())
    throw ConfigError(h.ssl_key_location.empty() ? "sink.http.ssl.key.location" : "sink.http.ssl.certificate.location",
                      "a client certificate needs both ssl.certificate.location and ssl.key.location");
}

}  // namespace

HttpConfig http_config(const Config& config) {
  HttpConfig h;
  for (auto& [key, v] : config.sink_settings) {
    if (!key.starts_with(prefix)) continue;
    const std::string_view k = std::string_view(key).substr(prefix.size());
    if (!take_delivery_key(h, k, key, v) && !take_request_key(h, k, key, v) && !take_credential_key(h, k, key, v))
      throw ConfigError(key, "unknown key of the http sink");
  }
  if (h.url.empty()) throw ConfigError("sink.http.url", "sink.type=http needs the URL to POST the events to");
  check_credentials(h);
  return h;
}

std::string http_url(const HttpConfig& config, std::string_view topic) { return url_with_topic(config.url, topic); }

std::string url_with_topic(std::string_view tpl, std::string_view topic) {
  std::string out;
  constexpr std::string_view placeholder = "${topic}";
  std::size_t at = 0;
  while (true) {
    const auto next = tpl.find(placeholder, at);
    out.append(tpl.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at));
    if (next == std::string_view::npos) break;
    // A topic is a path segment: what would end or escape it is escaped.
    for (unsigned char c : topic) {
      if (std::isalnum(c) || std::string_view("-._~").find(static_cast<char>(c)) != std::string_view::npos) {
        out.push_back(static_cast<char>(c));
      } else {
        static const char hex[] = "0123456789ABCDEF";
        out.push_back('%');
        out.push_back(hex[c >> 4]);
        out.push_back(hex[c & 15]);
      }
    }
    at = next + placeholder.size();
  }
  return out;
}

std::string http_url_for_log(std::string_view url) {
  // scheme://host[:port] only: user info, path and query may each hold a
  // secret. Everything up to the last '@' counts as user info (a password
  // with an unencoded '/' must not escape): too much hidden, never too little.
  const auto scheme = url.find("://");
  if (scheme == std::string_view::npos) return "(an URL)";
  std::string_view rest = url.substr(scheme + 3);
  const auto at = rest.rfind('@');
  const bool user_info = at != std::string_view::npos;
  if (user_info) rest = rest.substr(at + 1);
  const auto host_end = rest.find_first_of("/?#");
  const bool more = host_end != std::string_view::npos && host_end + 1 < rest.size();
  return std::string(url.substr(0, scheme + 3)) + (user_info ? "***@" : "") + std::string(rest.substr(0, host_end)) +
         (more ? "/..." : "");
}

}  // namespace walrelay
