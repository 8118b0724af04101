#include "walrelay/sinks/http/http_sink.hpp"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "walrelay/json.hpp"
#include "walrelay/mutation.hpp"

#include <nlohmann/json.hpp>

namespace walrelay {

namespace {

using Clock = std::chrono::steady_clock;

std::string base64(std::string_view bytes) { return encode_base64(bytes); }

std::string hmac_sha256(std::string_view key, std::string_view message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
       message.size(), mac, &len);
  return std::string(reinterpret_cast<const char*>(mac), len);
}

// A value that may go in a header as it is: control characters (a line
// break would end the header) and '%' itself percent-encoded; for a
// CloudEvents attribute (`cloudevents`), also space, '"' and every byte
// outside printable ASCII, as its HTTP binding says.
std::string percent_encoded(std::string_view v, bool cloudevents = false) {
  std::string out;
  out.reserve(v.size());
  for (unsigned char c : v) {
    if (c < 0x20 || c == 0x7f || c == '%' || (cloudevents && (c == ' ' || c == '"' || c > 0x7e))) {
      static const char hex[] = "0123456789ABCDEF";
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

// A header name from a record header's: what is not a token character is '_'.
std::string token_of(std::string_view name) {
  std::string out(name);
  for (auto& c : out)
    if (!(std::isalnum(static_cast<unsigned char>(c)) ||
          std::string_view("!#$&'*+-.^_`|~").find(c) != std::string_view::npos))
      c = '_';
  return out;
}

// What an answer says of the record. 408, 429 and 5xx pass; so does an
// endpoint that is not there (yet), as a NATS subject without a stream holds
// the slot: a redirect (not followed: point the URL at the final address),
// 404, 405, 421; and 409, which the Idempotency-Key draft answers while an
// earlier attempt with the same key is still being handled. 401, 403 and 407
// are walrelay's credentials. Any other 4xx is the record's own (413 too).
HttpRequestSink::Outcome outcome_of_status(long status) {
  if (status == 401 || status == 403 || status == 407) return HttpRequestSink::Outcome::denied;
  if (status == 408 || status == 429 || status >= 500 || (status >= 300 && status < 400) || status == 404 ||
      status == 405 || status == 409 || status == 421)
    return HttpRequestSink::Outcome::transient;
  return HttpRequestSink::Outcome::record_error;
}

// A header line; an empty value as curl sends one ("Name;").
std::string header_line(const std::string& name, const std::string& value) {
  return value.empty() ? name + ";" : name + ": " + value;
}

// The options every request of this sink shares: time-outs, TLS, credentials.
void common_options(CURL* easy, const HttpConfig& c, int timeout_ms) {
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_ms));
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(std::min(c.connect_timeout_ms, timeout_ms)));
  curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
  if (!c.ssl_ca_location.empty()) curl_easy_setopt(easy, CURLOPT_CAINFO, c.ssl_ca_location.c_str());
  if (!c.ssl_certificate_location.empty()) {
    curl_easy_setopt(easy, CURLOPT_SSLCERT, c.ssl_certificate_location.c_str());
    curl_easy_setopt(easy, CURLOPT_SSLKEY, c.ssl_key_location.c_str());
    if (!c.ssl_key_password.empty()) curl_easy_setopt(easy, CURLOPT_KEYPASSWD, c.ssl_key_password.c_str());
  }
  if (c.authentication == HttpAuthentication::bearer) {
    curl_easy_setopt(easy, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
    curl_easy_setopt(easy, CURLOPT_XOAUTH2_BEARER, c.bearer_token.c_str());
  } else if (c.authentication == HttpAuthentication::basic) {
    curl_easy_setopt(easy, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl_easy_setopt(easy, CURLOPT_USERNAME, c.basic_user.c_str());
    curl_easy_setopt(easy, CURLOPT_PASSWORD, c.basic_password.c_str());
  }
}

}  // namespace

HttpSink::HttpSink(boost::asio::io_context& io, HttpConfig config)
    : HttpRequestSink(io, Limits{.timeout_ms = config.timeout_ms,
                                 .connect_timeout_ms = config.connect_timeout_ms,
                                 .retries = config.retries,
                                 .retry_interval_ms = config.retry_interval_ms,
                                 .retry_after_max_ms = config.retry_after_max_ms,
                                 .max_inflight_requests = config.max_inflight_requests,
                                 .max_pending = config.max_pending,
                                 .batch_entries = config.batch_enabled ? static_cast<std::size_t>(config.batch_max_size) : 1,
                                 .batch_bytes = config.batch_max_bytes}),
      config_(std::move(config)) {
  start_worker();
}

HttpSink::~HttpSink() { stop_worker(); }

std::string HttpSink::url_of(std::string_view topic) const { return http_url(config_, topic); }

// In batches, a record whose value is not a JSON text (none, a string
// converter's, Avro's bytes) cannot be an element of a JSON array, and a
// dead-letter copy's reason is in its headers, which a JSON array of values
// leaves out: each goes alone, as without batches.
// (A UTF-8 byte order mark before a JSON text: nlohmann's accept() skips
// it, but inside an array it is no JSON, where alone a receiver may take it.)
bool HttpSink::needs_own_request(const Entry& e) const {
  return config_.batch_enabled && (e.dead_letter || !e.value || e.value->starts_with("\xEF\xBB\xBF") ||
                                   !Json::accept(*e.value));
}

// Which requests may not run at once: one key's.
std::string HttpSink::order_slot(const Entry& e) const { return e.key ? "k" + *e.key : std::string("n"); }

std::string HttpSink::describe(const Request& r) const {
  // (The URL's path and query may hold a secret: the topic names it.)
  const Entry& e = r.entries.front();
  return "POST " + http_url_for_log(e.url) + " (topic " + e.topic + ")";
}

void HttpSink::judge(const Request& r, int curl_result, long status, std::vector<Verdict>& verdicts) const {
  const auto result = static_cast<CURLcode>(curl_result);
  Verdict v;
  if (result != CURLE_OK) {
    v.outcome = outcome_of_transfer(result);
    v.code = result == CURLE_OPERATION_TIMEDOUT ? "timed_out" : "connection_failed";
    v.message = describe(r) + ": " + (r.error[0] ? std::string(r.error) : curl_easy_strerror(result));
  } else if (status >= 200 && status < 300) {
    v.outcome = Outcome::delivered;
  } else {
    v.code = "http_" + std::to_string(status);
    v.message = describe(r) + " answered " + std::to_string(status) +
                (r.response.empty() ? std::string() : ": " + percent_encoded(r.response));
    v.outcome = outcome_of_status(status);
    // A batch refused for what one of its records holds, not saying which:
    // each is sent again alone, so that the refusal lands on its own.
    if (v.outcome == Outcome::record_error && r.entries.size() > 1 &&
        !mutation::active(mutation::Break::http_batch_not_split))
      v.outcome = Outcome::alone;
  }
  verdicts.assign(r.entries.size(), v);
}

void HttpSink::prepare(Request& r) const {
  if (config_.batch_enabled && !r.entries.front().own_request) prepare_batch(r);
  else prepare_one(r);
}

namespace {

// The Idempotency-Key of a record: its event id; a dead-letter copy is
// another message.
std::string idempotency_key(const HttpRequestSink::Entry& e) {
  return percent_encoded(e.event_id) + (e.dead_letter && !e.event_id.empty() ? ".dead-letter" : "");
}

void add_headers(HttpRequestSink::Request& r, const std::vector<std::string>& lines) {
  for (auto& l : lines) {
    curl_slist* more = curl_slist_append(r.headers, l.c_str());
    if (!more) throw std::runtime_error("libcurl could not make a header");
    r.headers = more;
  }
  curl_easy_setopt(r.easy, CURLOPT_HTTPHEADER, r.headers);
}

}  // namespace

// Standard Webhooks: HMAC-SHA256 of "<id>.<timestamp>.<body>", the id the
// request's Idempotency-Key, so that a receiver's replay check sees a repeat
// as one.
void HttpSink::sign(const std::string& webhook_id, std::string_view body, std::vector<std::string>& lines) const {
  if (config_.authentication != HttpAuthentication::standard_webhooks) return;
  const std::string ts = std::to_string(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  lines.push_back("webhook-id: " + webhook_id);
  lines.push_back("webhook-timestamp: " + ts);
  lines.push_back("webhook-signature: v1," +
                  base64(hmac_sha256(config_.webhook_key, webhook_id + "." + ts + "." + std::string(body))));
}

// A request of several records of one URL (one per key): a JSON array of
// their values, or of records with their id, key and headers
// (batch.format). Its Idempotency-Key stands for the records it carries,
// in their order (a hash of their ids): the same records sent again carry
// the same key; the records' own ids (batch.format=records) tell a repeat
// when a restart sends them in other batches.
void HttpSink::prepare_batch(Request& r) const {
  const HttpConfig& c = config_;
  common_options(r.easy, c, c.timeout_ms);
  curl_easy_setopt(r.easy, CURLOPT_URL, r.entries.front().url.c_str());
  curl_easy_setopt(r.easy, CURLOPT_POST, 1L);
  std::string& body = r.body;
  std::string ids;
  bool every_id = true;
  body.push_back('[');
  for (const Entry& e : r.entries) {
    if (body.size() > 1) body.push_back(',');
    const std::string id = idempotency_key(e);
    every_id = every_id && !id.empty();
    ids += id + "\n";
    if (c.batch_format == HttpBatchFormat::values) {
      body += *e.value;
      continue;
    }
    Json o = Json::object();
    o["id"] = id.empty() ? Json(nullptr) : Json(e.event_id + (e.dead_letter ? ".dead-letter" : ""));
    o["key"] = e.key ? Json(*e.key) : Json(nullptr);
    // [name, value] pairs: a name may come twice (a headers column's member
    // named like a router's header adds a second one).
    Json headers = Json::array();
    for (auto& [name, value] : e.headers) headers.push_back(Json::array({name, value ? Json(*value) : Json(nullptr)}));
    o["headers"] = std::move(headers);
    std::string element = to_json_text(o);
    element.pop_back();  // the closing brace: the value follows as it is
    body += element + ",\"value\":" + *e.value + "}";
  }
  body.push_back(']');
  curl_easy_setopt(r.easy, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(r.easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  std::string key = "batch-" + sha256_hex(ids).substr(0, 32);
  // A record with no id: a key of this request's own, never one an earlier
  // process gave (a receiver would take another event for a repeat).
  if (!every_id) key = unique_id(r.entries.front()) + "-" + std::to_string(r.entries.size());
  std::vector<std::string> lines{"Expect:", "Idempotency-Key: " + key, "Content-Type: application/json"};
  sign(key, body, lines);
  add_headers(r, lines);
}

// The request for one record: its body, its headers, signed when configured.
void HttpSink::prepare_one(Request& r) const {
  const HttpConfig& c = config_;
  const Entry& en = r.entries.front();
  CURL* easy = r.easy;
  common_options(easy, c, c.timeout_ms);
  curl_easy_setopt(easy, CURLOPT_URL, en.url.c_str());
  curl_easy_setopt(easy, CURLOPT_POST, 1L);
  const std::string& body = en.value ? *en.value : std::string();
  curl_easy_setopt(easy, CURLOPT_POSTFIELDS, en.value ? en.value->data() : "");
  curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  auto value_of = [&](std::string_view v) { return c.headers_encode_base64 ? base64(v) : percent_encoded(v); };
  std::string content_type = c.content_type;
  std::vector<std::string> lines;
  lines.push_back("Expect:");  // no 100-continue round trip
  // The event's id tells a repeat.
  const std::string id = idempotency_key(en);
  if (!id.empty()) lines.push_back("Idempotency-Key: " + id);
  if (en.key) lines.push_back(header_line(c.headers_prefix + "key", value_of(*en.key)));
  for (auto& [name, value] : en.headers) {
    if (name == "content-type" && value) {
      content_type = percent_encoded(*value);
    } else if (name.starts_with("ce_")) {
      // CloudEvents' HTTP binary binding: ce-<attribute>, percent-encoded.
      if (value) lines.push_back(header_line("ce-" + token_of(name.substr(3)), percent_encoded(*value, true)));
    } else {
      // Under the prefix (never empty): a row's header name cannot become
      // Content-Length, Host or Authorization.
      lines.push_back(header_line(c.headers_prefix + token_of(name), value ? value_of(*value) : std::string()));
    }
  }
  lines.push_back("Content-Type: " + content_type);
  sign(id.empty() ? unique_id(en) : id, body, lines);
  add_headers(r, lines);
}

void HttpSink::check_connectivity(int timeout_ms) {
  // Any HTTP answer (405 too) says the endpoint is there; no event is sent.
  CURL* easy = curl_easy_init();
  if (!easy) throw std::runtime_error("libcurl could not make a request");
  const std::string url = http_url(config_, "walrelay-check");
  char error[CURL_ERROR_SIZE] = {};
  common_options(easy, config_, timeout_ms);
  curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
  curl_easy_setopt(easy, CURLOPT_NOBODY, 1L);
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, error);
  const CURLcode result = curl_easy_perform(easy);
  curl_easy_cleanup(easy);
  if (result != CURLE_OK)
    throw std::runtime_error("HEAD " + http_url_for_log(url) + ": " +
                             (error[0] ? std::string(error) : curl_easy_strerror(result)));
}

}  // namespace walrelay
