#include "walrelay/sinks/http/http_sink.hpp"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <stdexcept>

#include <boost/asio/post.hpp>

#include "walrelay/mutation.hpp"

namespace walrelay {

namespace {

using Clock = std::chrono::steady_clock;

std::string base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(std::max(n, 0)));
  return out;
}

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
HttpSink::Outcome outcome_of_status(long status) {
  if (status == 401 || status == 403 || status == 407) return HttpSink::Outcome::denied;
  if (status == 408 || status == 429 || status >= 500 || (status >= 300 && status < 400) || status == 404 ||
      status == 405 || status == 409 || status == 421)
    return HttpSink::Outcome::transient;
  return HttpSink::Outcome::record_error;
}

// A transfer that failed below HTTP: a certificate walrelay cannot use or
// the server's that does not verify is the configuration's (a halt naming
// it); the rest (refused, reset, timed out, a name not resolved) passes.
HttpSink::Outcome outcome_of_transfer(CURLcode result) {
  switch (result) {
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CIPHER:
    case CURLE_UNSUPPORTED_PROTOCOL:
      return HttpSink::Outcome::denied;
    default:
      return HttpSink::Outcome::transient;
  }
}

// A header line; an empty value as curl sends one ("Name;").
std::string header_line(const std::string& name, const std::string& value) {
  return value.empty() ? name + ";" : name + ": " + value;
}

// One transfer under way, and what it owns while it is.
struct Transfer {
  HttpSink::Entry entry;
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  std::string response;  // the first bytes of the answer's body, for messages
  char error[CURL_ERROR_SIZE] = {};
  ~Transfer() {
    if (headers) curl_slist_free_all(headers);
    if (easy) curl_easy_cleanup(easy);
  }
};

std::size_t keep_some(char* data, std::size_t size, std::size_t n, void* user) {
  auto* out = static_cast<std::string*>(user);
  const std::size_t bytes = size * n;
  if (out->size() < 300) out->append(data, std::min(bytes, 300 - out->size()));
  return bytes;
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

// Which requests may not run at once: one key's.
std::string key_slot(const HttpSink::Entry& e) { return e.key ? "k" + *e.key : std::string("n"); }

}  // namespace

HttpSink::HttpSink(boost::asio::io_context& io, HttpConfig config)
    : io_(io), config_(std::move(config)), shared_(std::make_shared<Shared>()) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  multi_ = curl_multi_init();
  if (!multi_) throw std::runtime_error("http: libcurl could not make a multi handle");
  curl_multi_setopt(static_cast<CURLM*>(multi_), CURLMOPT_MAX_TOTAL_CONNECTIONS,
                    static_cast<long>(config_.max_inflight_requests));
  shared_->sink = this;
  worker_ = std::thread([this] { run_worker(); });
}

HttpSink::~HttpSink() {
  {
    std::lock_guard lock(shared_->mu);
    shared_->stop = true;
    shared_->sink = nullptr;
  }
  wake_worker();
  worker_.join();
  curl_multi_cleanup(static_cast<CURLM*>(multi_));
}

void HttpSink::wake_worker() { curl_multi_wakeup(static_cast<CURLM*>(multi_)); }

bool HttpSink::healthy() const {
  std::lock_guard lock(shared_->mu);
  return shared_->reachable;
}

std::string HttpSink::health_reason() const {
  std::lock_guard lock(shared_->mu);
  return shared_->last_error;
}

SubmitStatus HttpSink::enqueue(Entry e) {
  if (outstanding_ >= static_cast<std::size_t>(config_.max_pending)) return SubmitStatus::queue_full;
  e.epoch = epoch_;
  {
    std::lock_guard lock(shared_->mu);
    shared_->queue.push_back(std::move(e));
  }
  ++outstanding_;
  wake_worker();
  return SubmitStatus::accepted;
}

SubmitStatus HttpSink::submit(const OutboxRecord& record, std::uint64_t token) {
  Entry e;
  e.token = token;
  e.bytes = record.size_bytes();
  e.topic.assign(record.topic);
  e.url = http_url(config_, record.topic);
  e.event_id.assign(record.event_id);
  if (record.key) e.key.emplace(*record.key);
  if (record.value) e.value.emplace(*record.value);
  for (auto& h : record.headers)
    e.headers.emplace_back(std::string(h.name), h.value ? std::optional<std::string>(std::string(*h.value)) : std::nullopt);
  return enqueue(std::move(e));
}

SubmitStatus HttpSink::submit_dead_letter(std::string_view reason, std::string_view topic,
                                          std::optional<std::string_view> key, std::optional<std::string_view> value,
                                          const std::vector<OutboxRecord::Header>& headers, std::uint64_t token,
                                          std::size_t bytes) {
  Entry e;
  e.token = token;
  e.bytes = bytes;
  e.topic.assign(topic);
  e.url = http_url(config_, topic);
  if (key) e.key.emplace(*key);
  if (value) e.value.emplace(*value);
  for (auto& h : headers) {
    e.headers.emplace_back(std::string(h.name), h.value ? std::optional<std::string>(std::string(*h.value)) : std::nullopt);
    if (h.name == "id" && h.value) e.event_id.assign(*h.value);
  }
  e.dead_letter = true;
  e.reason.assign(reason);
  return enqueue(std::move(e));
}

// Everything queued and not yet sent fails (transiently) rather than land
// after a record that failed: the worker drops the entries of this epoch.
void HttpSink::abort_queued() {
  {
    std::lock_guard lock(shared_->mu);
    shared_->taken_back = std::max(shared_->taken_back, epoch_);
  }
  ++epoch_;
  wake_worker();
}

void HttpSink::poll() {
  {
    std::lock_guard lock(shared_->mu);
    scratch_.swap(shared_->done);
  }
  for (auto& d : scratch_) report(d);
  scratch_.clear();
}

void HttpSink::report(Done& done) {
  if (outstanding_ > 0) --outstanding_;
  Entry& e = done.entry;
  Delivery d;
  d.token = e.token;
  d.bytes = e.bytes;
  d.dead_lettered = e.dead_letter;
  d.dead_letter_reason = e.reason;
  d.topic = e.topic;
  d.ok = done.outcome == Outcome::delivered;
  d.transient = done.outcome == Outcome::transient;
  d.denied = done.outcome == Outcome::denied;
  if (done.outcome == Outcome::record_error) {
    d.key = e.key;
    d.value = e.value;
    for (auto& [name, value] : e.headers)
      d.headers.push_back({name, value ? std::optional<std::string_view>(*value) : std::nullopt});
  }
  d.error_code = done.code;
  d.error_message = done.message;
  if (on_delivery_) on_delivery_(d);
}

namespace {

// The request for `e`: its body, its headers, signed when configured.
std::unique_ptr<Transfer> make_transfer(HttpSink::Entry&& e, const HttpConfig& c) {
  auto t = std::make_unique<Transfer>();
  t->easy = curl_easy_init();
  if (!t->easy) throw std::runtime_error("libcurl could not make a request");
  t->entry = std::move(e);
  const HttpSink::Entry& en = t->entry;
  CURL* easy = t->easy;
  common_options(easy, c, c.timeout_ms);
  curl_easy_setopt(easy, CURLOPT_URL, en.url.c_str());
  curl_easy_setopt(easy, CURLOPT_POST, 1L);
  const std::string& body = en.value ? *en.value : std::string();
  curl_easy_setopt(easy, CURLOPT_POSTFIELDS, en.value ? en.value->data() : "");
  curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, keep_some);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, &t->response);
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, t->error);
  curl_easy_setopt(easy, CURLOPT_PRIVATE, t.get());
  auto value_of = [&](std::string_view v) {
    return c.headers_encode_base64 ? base64(v) : percent_encoded(v);
  };
  std::string content_type = c.content_type;
  std::vector<std::string> lines;
  lines.push_back("Expect:");  // no 100-continue round trip
  // The event's id tells a repeat; a dead-letter copy is another message.
  const std::string id =
      percent_encoded(en.event_id) + (en.dead_letter && !en.event_id.empty() ? ".dead-letter" : "");
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
  if (c.authentication == HttpAuthentication::standard_webhooks) {
    // Standard Webhooks: HMAC-SHA256 of "<id>.<timestamp>.<body>", the id
    // the event's, so that a receiver's replay check sees a repeat as one.
    const std::string webhook_id = id.empty() ? "walrelay-" + std::to_string(en.token) : id;
    const std::string ts = std::to_string(
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
    lines.push_back("webhook-id: " + webhook_id);
    lines.push_back("webhook-timestamp: " + ts);
    lines.push_back("webhook-signature: v1," + base64(hmac_sha256(c.webhook_key, webhook_id + "." + ts + "." + body)));
  }
  for (auto& l : lines) t->headers = curl_slist_append(t->headers, l.c_str());
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, t->headers);
  return t;
}

}  // namespace

void HttpSink::run_worker() {
  ::pthread_setname_np(::pthread_self(), "wr-http");  // (the fault campaign finds it by name)
  CURLM* multi = static_cast<CURLM*>(multi_);
  std::deque<Entry> waiting;                           // not started, in submission order
  std::vector<Entry> retrying;                         // failed, to be tried again at not_before
  std::map<CURL*, std::unique_ptr<Transfer>> running;
  std::set<std::string> busy;                          // keys with a request running or retrying
  std::uint64_t poisoned = 0;  // entries of epochs up to this one fail: one before them failed for good
  std::vector<Done> out;
  auto hand_over = [&] {
    if (out.empty()) return;
    std::lock_guard lock(shared_->mu);
    for (auto& d : out) shared_->done.push_back(std::move(d));
    out.clear();
    if (shared_->wake_posted || !shared_->sink) return;
    shared_->wake_posted = true;
    boost::asio::post(io_, [self = std::weak_ptr<Shared>(shared_)] {
      auto s = self.lock();
      if (!s) return;
      HttpSink* sink = nullptr;
      {
        std::lock_guard lock(s->mu);
        s->wake_posted = false;
        sink = s->sink;
      }
      if (sink) sink->poll();
    });
  };
  auto fail_transient = [&](Entry e, const std::string& code, const std::string& message) {
    out.push_back(Done{std::move(e), Outcome::transient, code, message});
  };
  // A request that cannot even be made (out of memory) fails like one that
  // was refused: nothing of its epoch goes after it.
  auto start = [&](Entry e) {
    const std::string slot = key_slot(e);
    ++e.attempts;
    std::unique_ptr<Transfer> t;
    std::string problem;
    try {
      t = make_transfer(std::move(e), config_);
    } catch (const std::exception& ex) {
      problem = ex.what();
    }
    if (t && curl_multi_add_handle(multi, t->easy) != CURLM_OK) problem = "libcurl refused the request";
    if (!problem.empty()) {
      Entry failed = t ? std::move(t->entry) : std::move(e);
      poisoned = std::max(poisoned, failed.epoch);
      fail_transient(std::move(failed), "http_error", problem);
      return;
    }
    CURL* easy = t->easy;
    running.emplace(easy, std::move(t));
    busy.insert(slot);
  };
  while (true) {
    std::uint64_t taken_back = 0;
    {
      std::lock_guard lock(shared_->mu);
      if (shared_->stop) break;
      while (!shared_->queue.empty()) {
        waiting.push_back(std::move(shared_->queue.front()));
        shared_->queue.pop_front();
      }
      taken_back = shared_->taken_back;
    }
    const auto now = Clock::now();
    // Taken back, or behind one that failed for good: failed, never sent.
    auto dropped = [&](Entry& e) {
      if (e.epoch <= taken_back) fail_transient(std::move(e), "taken_back", "taken back after an earlier record failed");
      else if (e.epoch <= poisoned) fail_transient(std::move(e), "after_failure", "not sent: an earlier POST failed");
      else return false;
      return true;
    };
    for (auto it = retrying.begin(); it != retrying.end();) {
      const std::string slot = key_slot(*it);
      if (dropped(*it)) {
        busy.erase(slot);
        it = retrying.erase(it);
      } else if (it->not_before <= now && running.size() < static_cast<std::size_t>(config_.max_inflight_requests)) {
        Entry e = std::move(*it);
        it = retrying.erase(it);
        busy.erase(slot);
        start(std::move(e));
      } else {
        ++it;
      }
    }
    std::set<std::string> blocked;  // a key whose earlier record waits: its later ones wait too
    for (auto it = waiting.begin(); it != waiting.end();) {
      if (dropped(*it)) {
        it = waiting.erase(it);
        continue;
      }
      const std::string slot = key_slot(*it);
      if (busy.count(slot) || blocked.count(slot) ||
          running.size() >= static_cast<std::size_t>(config_.max_inflight_requests)) {
        blocked.insert(slot);
        ++it;
        continue;
      }
      Entry e = std::move(*it);
      it = waiting.erase(it);
      start(std::move(e));
    }
    int still = 0;
    curl_multi_perform(multi, &still);
    bool freed = false;  // a key or a place freed: what waited may start at once
    while (CURLMsg* msg = curl_multi_info_read(multi, &still)) {
      if (msg->msg != CURLMSG_DONE) continue;
      CURL* easy = msg->easy_handle;
      const CURLcode result = msg->data.result;
      auto found = running.find(easy);
      if (found == running.end()) continue;
      std::unique_ptr<Transfer> t = std::move(found->second);
      running.erase(found);
      curl_multi_remove_handle(multi, easy);
      const std::string slot = key_slot(t->entry);
      busy.erase(slot);
      freed = true;
      long status = 0;
      curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
      curl_off_t retry_after = 0;
      curl_easy_getinfo(easy, CURLINFO_RETRY_AFTER, &retry_after);
      // (The URL's path and query may hold a secret: the topic names it.)
      const std::string where = "POST " + http_url_for_log(t->entry.url) + " (topic " + t->entry.topic + ")";
      std::string code, message;
      Outcome outcome;
      if (result != CURLE_OK) {
        outcome = outcome_of_transfer(result);
        code = result == CURLE_OPERATION_TIMEDOUT ? "timed_out" : "connection_failed";
        message = where + ": " + (t->error[0] ? std::string(t->error) : curl_easy_strerror(result));
      } else if (status >= 200 && status < 300) {
        outcome = Outcome::delivered;
      } else {
        code = "http_" + std::to_string(status);
        message = where + " answered " + std::to_string(status) +
                  (t->response.empty() ? std::string() : ": " + percent_encoded(t->response));
        outcome = outcome_of_status(status);
      }
      {
        // Healthy: the endpoint takes records (an answer that is the
        // record's own counts too); not while it refuses or is not there.
        std::lock_guard lock(shared_->mu);
        const bool reachable = outcome == Outcome::delivered || outcome == Outcome::record_error;
        if (!reachable && shared_->reachable) spdlog::warn("http: {}", message);
        if (reachable && !shared_->reachable) spdlog::info("http: {} answers again", where);
        shared_->reachable = reachable;
        shared_->last_error = reachable ? std::string() : message;
      }
      if (outcome == Outcome::transient && t->entry.attempts <= config_.retries && t->entry.epoch > poisoned) {
        // In place, its key held: the key's later records wait behind it.
        auto wait = std::chrono::milliseconds(config_.retry_interval_ms);
        if (retry_after > 0)
          wait = std::max(wait, std::chrono::milliseconds(std::min<curl_off_t>(retry_after * 1000, config_.retry_after_max_ms)));
        spdlog::debug("http: {}; attempt {} of {} in {} ms", message, t->entry.attempts + 1, config_.retries + 1,
                      wait.count());
        t->entry.not_before = Clock::now() + wait;
        if (!mutation::active(mutation::Break::http_retry_releases_key)) busy.insert(slot);
        retrying.push_back(std::move(t->entry));
        continue;
      }
      if (outcome == Outcome::transient) poisoned = std::max(poisoned, t->entry.epoch);
      out.push_back(Done{std::move(t->entry), outcome, code, message});
    }
    hand_over();
    // Until a transfer moves (its end frees a key and a place), a record is
    // queued (curl_multi_wakeup), or the next retry is due; at once when a
    // transfer just ended and something waits. A retry that is due but finds
    // every place taken waits for a transfer to end, not in a busy loop.
    int timeout_ms = 1000;
    const bool full = running.size() >= static_cast<std::size_t>(config_.max_inflight_requests);
    if (!full)
      for (auto& e : retrying)
        timeout_ms = std::min<int>(timeout_ms, static_cast<int>(std::max<long>(
                                                   1, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                          e.not_before - Clock::now()).count() + 1)));
    if (freed && (!waiting.empty() || !retrying.empty())) timeout_ms = 0;
    curl_multi_poll(multi, nullptr, 0, timeout_ms, nullptr);
  }
  for (auto& [easy, t] : running) curl_multi_remove_handle(multi, easy);
  running.clear();
  // What is still queued is never reported: the sink is going away, and the
  // relay confirms nothing past it.
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
