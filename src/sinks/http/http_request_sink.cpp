#include "walrelay/sinks/http/http_request_sink.hpp"

#include <curl/curl.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <tuple>

#include <boost/asio/post.hpp>

#include "walrelay/mutation.hpp"
#include "walrelay/sinks/loop_wake.hpp"

namespace walrelay {

using Clock = std::chrono::steady_clock;

// What the loop and the worker share, under mu.
struct HttpRequestSink::Shared {
  std::mutex mu;
  std::deque<Entry> queue;
  std::vector<Done> done;
  bool stop = false;
  bool wake_posted = false;
  std::uint64_t taken_back = 0;  // entries of epochs up to this one are failed, not sent
  bool reachable = true;         // the last request got an answer that took or judged its records
  std::string last_error;
  HttpRequestSink* sink = nullptr;
};

HttpRequestSink::Request::~Request() {
  if (headers) curl_slist_free_all(headers);
  if (easy) curl_easy_cleanup(easy);
}

HttpRequestSink::HttpRequestSink(boost::asio::io_context& io, Limits limits)
    : limits_(limits), io_(io), shared_(std::make_shared<Shared>()) {
  static_assert(sizeof(Request{}.error) >= CURL_ERROR_SIZE);
  std::random_device random;
  nonce_ = std::to_string((static_cast<std::uint64_t>(random()) << 32) | random());
  curl_global_init(CURL_GLOBAL_DEFAULT);
  multi_ = curl_multi_init();
  if (!multi_) throw std::runtime_error(std::string(limits_.thread_name) + ": libcurl could not make a multi handle");
  curl_multi_setopt(static_cast<CURLM*>(multi_), CURLMOPT_MAX_TOTAL_CONNECTIONS,
                    static_cast<long>(limits_.max_inflight_requests));
  shared_->sink = this;
}

HttpRequestSink::~HttpRequestSink() {
  stop_worker();
  curl_multi_cleanup(static_cast<CURLM*>(multi_));
}

void HttpRequestSink::start_worker() {
  worker_ = std::thread([this] { run_worker(); });
}

void HttpRequestSink::stop_worker() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard lock(shared_->mu);
    shared_->stop = true;
    shared_->sink = nullptr;
  }
  wake_worker();
  worker_.join();
}

void HttpRequestSink::wake_worker() { curl_multi_wakeup(static_cast<CURLM*>(multi_)); }

bool HttpRequestSink::healthy() const {
  std::lock_guard lock(shared_->mu);
  return shared_->reachable;
}

std::string HttpRequestSink::health_reason() const {
  std::lock_guard lock(shared_->mu);
  return shared_->last_error;
}

SubmitStatus HttpRequestSink::enqueue(Entry e) {
  if (outstanding_ >= static_cast<std::size_t>(limits_.max_pending)) return SubmitStatus::queue_full;
  e.epoch = epoch_;
  e.seq = ++seq_;
  e.refusal = refusal_of(e);
  e.own_request = needs_own_request(e);
  {
    std::lock_guard lock(shared_->mu);
    shared_->queue.push_back(std::move(e));
  }
  ++outstanding_;
  wake_worker();
  return SubmitStatus::accepted;
}

SubmitStatus HttpRequestSink::submit(const OutboxRecord& record, std::uint64_t token) {
  Entry e;
  e.take(record, token);
  e.url = url_of(record.topic);
  return enqueue(std::move(e));
}

SubmitStatus HttpRequestSink::submit_dead_letter(std::string_view reason, std::string_view topic,
                                                 std::optional<std::string_view> key,
                                                 std::optional<std::string_view> value,
                                                 const std::vector<OutboxRecord::Header>& headers,
                                                 std::uint64_t token, std::size_t bytes) {
  Entry e;
  e.take_dead_letter(reason, topic, key, value, headers, token, bytes);
  e.url = url_of(topic);
  return enqueue(std::move(e));
}

// Everything queued and not yet sent fails (transiently) rather than land
// after a record that failed: the worker drops the entries of this epoch.
void HttpRequestSink::abort_queued() {
  {
    std::lock_guard lock(shared_->mu);
    shared_->taken_back = std::max(shared_->taken_back, epoch_);
  }
  ++epoch_;
  wake_worker();
}

void HttpRequestSink::poll() {
  {
    std::lock_guard lock(shared_->mu);
    scratch_.swap(shared_->done);
  }
  for (auto& d : scratch_) report(d);
  scratch_.clear();
}

void HttpRequestSink::report(Done& done) {
  if (outstanding_ > 0) --outstanding_;
  Delivery d = done.entry.delivery(done.outcome == Outcome::record_error);
  d.ok = done.outcome == Outcome::delivered;
  d.transient = done.outcome == Outcome::transient;
  d.denied = done.outcome == Outcome::denied;
  d.error_code = done.code;
  d.error_message = done.message;
  if (on_delivery_) on_delivery_(d);
}

HttpRequestSink::Outcome HttpRequestSink::outcome_of_transfer(int curl_result) {
  switch (static_cast<CURLcode>(curl_result)) {
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CIPHER:
    case CURLE_UNSUPPORTED_PROTOCOL:
      return Outcome::denied;
    default:
      return Outcome::transient;
  }
}

namespace {

std::size_t keep_some(char* data, std::size_t size, std::size_t n, void* user) {
  auto* r = static_cast<HttpRequestSink::Request*>(user);
  const std::size_t bytes = size * n;
  if (r->response.size() < r->response_limit)
    r->response.append(data, std::min(bytes, r->response_limit - r->response.size()));
  return bytes;
}

}  // namespace

// The worker's state and its steps; it lives on the worker thread only.
class RequestWorker {
 public:
  using Entry = HttpRequestSink::Entry;
  using Outcome = HttpRequestSink::Outcome;
  using Request = HttpRequestSink::Request;
  using Done = HttpRequestSink::Done;

  RequestWorker(HttpRequestSink& sink, const HttpRequestSink::Limits& limits, CURLM* multi,
                std::function<void(std::vector<Done>&)> hand_over)
      : sink_(sink), limits_(limits), multi_(multi), hand_over_(std::move(hand_over)) {}
  ~RequestWorker() {
    for (auto& [easy, r] : running_) curl_multi_remove_handle(multi_, easy);
  }

  // One turn: what was queued joins the waiting, due retries take their
  // place again, requests start, ended ones are judged; then waits.
  void turn(std::deque<Entry>& queued, std::uint64_t taken_back) {
    taken_back_ = taken_back;
    while (!queued.empty()) {
      waiting_.push_back(std::move(queued.front()));
      queued.pop_front();
    }
    take_back_due_retries();
    schedule();
    int still = 0;
    curl_multi_perform(multi_, &still);
    const bool freed = collect();
    hand_over_(out_);
    curl_multi_poll(multi_, nullptr, 0, wait_ms(freed), nullptr);
  }

 private:
  bool full() const { return running_.size() >= static_cast<std::size_t>(limits_.max_inflight_requests); }

  // Taken back, or behind one that failed for good: failed, never sent.
  bool dropped(Entry& e) {
    if (e.epoch <= taken_back_) fail_transient(std::move(e), "taken_back", "taken back after an earlier record failed");
    else if (e.epoch <= poisoned_) fail_transient(std::move(e), "after_failure", "not sent: an earlier request failed");
    else return false;
    return true;
  }

  void fail_transient(Entry e, std::string code, std::string message) {
    out_.push_back(Done{std::move(e), Outcome::transient, std::move(code), std::move(message)});
  }

  // A retry that is due goes back in front of the waiting (it is older than
  // anything of its slot there); its slot is held until then.
  void take_back_due_retries() {
    const auto now = Clock::now();
    std::vector<Entry> due;
    for (auto it = retrying_.begin(); it != retrying_.end();) {
      const std::string slot = sink_.order_slot(*it);
      if (dropped(*it)) {
        busy_.erase(slot);
        it = retrying_.erase(it);
      } else if (it->not_before <= now) {
        busy_.erase(slot);
        due.push_back(std::move(*it));
        it = retrying_.erase(it);
      } else {
        ++it;
      }
    }
    // A group's records side by side, to go again as one request (each key
    // has one record here at most: the order across keys is free).
    std::sort(due.begin(), due.end(),
              [](const Entry& a, const Entry& b) { return std::tie(a.group, a.seq) < std::tie(b.group, b.seq); });
    waiting_.insert(waiting_.begin(), std::make_move_iterator(due.begin()), std::make_move_iterator(due.end()));
  }

  // Waiting records into requests, in order: a record whose slot is held
  // (or whose earlier record still waits) waits; records of one URL share a
  // request up to the batch bounds, a request tried again in place (a
  // group) only with its own; at most max.inflight.requests at once.
  void schedule() {
    std::map<std::string, std::vector<Entry>> open;  // by URL: a request being filled
    std::map<std::string, std::size_t> open_bytes;
    std::set<std::string> blocked;
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (dropped(*it)) {
        it = waiting_.erase(it);
        continue;
      }
      const std::string slot = sink_.order_slot(*it);
      if (!slot.empty() && (busy_.count(slot) || blocked.count(slot))) {
        blocked.insert(slot);
        ++it;
        continue;
      }
      if (!it->refusal.empty()) {  // its turn came: the record's own failure
        std::string why = std::move(it->refusal);
        // (invalid_record, as Kafka's: the dead-letter copy goes without the
        // value the sink would refuse again.)
        out_.push_back(Done{std::move(*it), Outcome::record_error, "invalid_record", std::move(why)});
        it = waiting_.erase(it);
        continue;
      }
      auto& batch = open[it->url];
      const bool fits = !batch.empty() && !batch.front().alone && !it->alone && !batch.front().own_request &&
                        !it->own_request && batch.front().group == it->group &&
                        batch.size() < limits_.batch_entries && open_bytes[it->url] + it->bytes <= limits_.batch_bytes;
      if (!batch.empty() && !fits) {
        start(std::move(batch));
        batch.clear();
        open_bytes[it->url] = 0;
      }
      if (batch.empty() && requests(open) >= static_cast<std::size_t>(limits_.max_inflight_requests)) {
        if (!slot.empty()) blocked.insert(slot);
        ++it;
        continue;
      }
      if (!slot.empty()) busy_.insert(slot);
      open_bytes[it->url] += it->bytes;
      batch.push_back(std::move(*it));
      it = waiting_.erase(it);
    }
    for (auto& [url, batch] : open)
      if (!batch.empty()) start(std::move(batch));
  }

  std::size_t requests(const std::map<std::string, std::vector<Entry>>& open) const {
    std::size_t n = running_.size();
    for (auto& [url, batch] : open) n += batch.empty() ? 0 : 1;
    return n;
  }

  // A request that cannot even be made (out of memory) fails like one that
  // was refused: nothing of its epoch goes after it.
  void start(std::vector<Entry> entries) {
    auto r = std::make_unique<Request>();
    r->entries = std::move(entries);
    r->response_limit = limits_.response_bytes;
    for (auto& e : r->entries) ++e.attempts;
    std::string problem;
    try {
      r->easy = curl_easy_init();
      if (!r->easy) throw std::runtime_error("libcurl could not make a request");
      CURL* easy = r->easy;
      curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
      curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, static_cast<long>(limits_.timeout_ms));
      curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS,
                       static_cast<long>(std::min(limits_.connect_timeout_ms, limits_.timeout_ms)));
      curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
      curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, keep_some);
      curl_easy_setopt(easy, CURLOPT_WRITEDATA, r.get());
      curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, r->error);
      curl_easy_setopt(easy, CURLOPT_PRIVATE, r.get());
      sink_.prepare(*r);
      if (curl_multi_add_handle(multi_, easy) != CURLM_OK) throw std::runtime_error("libcurl refused the request");
    } catch (const std::exception& ex) {
      problem = ex.what();
    }
    if (!problem.empty()) {
      for (auto& e : r->entries) {
        busy_.erase(sink_.order_slot(e));
        poisoned_ = std::max(poisoned_, e.epoch);
        fail_transient(std::move(e), "request_error", problem);
      }
      return;
    }
    CURL* easy = r->easy;
    running_.emplace(easy, std::move(r));
  }

  // Ended requests judged, record by record. True when one ended (a slot
  // and a place freed).
  bool collect() {
    bool freed = false;
    int still = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi_, &still)) {
      if (msg->msg != CURLMSG_DONE) continue;
      auto found = running_.find(msg->easy_handle);
      if (found == running_.end()) continue;
      const CURLcode result = msg->data.result;
      std::unique_ptr<Request> r = std::move(found->second);
      running_.erase(found);
      curl_multi_remove_handle(multi_, r->easy);
      freed = true;
      finish(*r, result);
    }
    return freed;
  }

  void finish(Request& r, CURLcode result) {
    long status = 0;
    curl_easy_getinfo(r.easy, CURLINFO_RESPONSE_CODE, &status);
    curl_off_t retry_after = 0;
    curl_easy_getinfo(r.easy, CURLINFO_RETRY_AFTER, &retry_after);
    std::vector<HttpRequestSink::Verdict> verdicts;
    try {
      sink_.judge(r, result, status, verdicts);
    } catch (const std::exception& ex) {
      // An answer walrelay cannot read is no answer: sent again, never a
      // crash (which would meet the same answer at every start).
      verdicts.assign(r.entries.size(), {Outcome::transient, "bad_answer",
                                         sink_.describe(r) + ": an answer walrelay cannot read: " + ex.what()});
    }
    verdicts.resize(r.entries.size(), {Outcome::transient, "no_verdict", sink_.describe(r) + ": no answer for it"});
    note_health(verdicts);
    const std::uint64_t group = ++groups_;
    const auto now = Clock::now();  // (one instant: a group's records are due together)
    for (std::size_t i = 0; i < r.entries.size(); ++i)
      settle(std::move(r.entries[i]), verdicts[i], retry_after, group, now);
  }

  // Healthy: the endpoint takes records (an answer that is the record's
  // own counts too); not while it refuses or is not there.
  void note_health(const std::vector<HttpRequestSink::Verdict>& verdicts) {
    const HttpRequestSink::Verdict* failing = nullptr;
    bool reachable = false;
    for (auto& v : verdicts) {
      if (v.outcome == Outcome::delivered || v.outcome == Outcome::record_error || v.outcome == Outcome::alone)
        reachable = true;
      else if (!failing)
        failing = &v;
    }
    if (!reachable && !failing) return;
    auto& shared = *sink_shared_;
    std::lock_guard lock(shared.mu);
    if (!reachable && shared.reachable) spdlog::warn("{}: {}", limits_.name, failing->message);
    if (reachable && !shared.reachable) spdlog::info("{}: answers again", limits_.name);
    shared.reachable = reachable;
    shared.last_error = reachable ? std::string() : failing->message;
  }

  // `group`: the request's: a retry in place is the same request again.
  void settle(Entry e, const HttpRequestSink::Verdict& v, curl_off_t retry_after, std::uint64_t group,
              Clock::time_point now) {
    const std::string slot = sink_.order_slot(e);
    busy_.erase(slot);
    e.group = 0;
    if (v.outcome == Outcome::alone) {  // not an attempt of its own
      e.alone = true;
      --e.attempts;
      e.not_before = now;
      hold(slot, std::move(e));
      return;
    }
    if (v.outcome == Outcome::transient && e.attempts <= limits_.retries && e.epoch > poisoned_) {
      // In place, its slot held: the slot's later records wait behind it.
      auto wait = std::chrono::milliseconds(limits_.retry_interval_ms);
      if (retry_after > 0)
        wait = std::max(wait, std::chrono::milliseconds(
                                  std::min<curl_off_t>(retry_after * 1000, limits_.retry_after_max_ms)));
      spdlog::debug("{}: {}; attempt {} of {} in {} ms", limits_.name, v.message, e.attempts + 1,
                    limits_.retries + 1, wait.count());
      e.not_before = now + wait;
      e.group = group;
      hold(slot, std::move(e));
      return;
    }
    if (v.outcome == Outcome::transient) poisoned_ = std::max(poisoned_, e.epoch);
    out_.push_back(Done{std::move(e), v.outcome, v.code, v.message});
  }

  void hold(const std::string& slot, Entry e) {
    if (!slot.empty() && !mutation::active(mutation::Break::http_retry_releases_key)) busy_.insert(slot);
    retrying_.push_back(std::move(e));
  }

  // Until a transfer moves (its end frees a slot and a place), a record is
  // queued (curl_multi_wakeup), or the next retry is due; at once when a
  // transfer just ended and something waits. A retry that is due but finds
  // every place taken waits for a transfer to end, not in a busy loop.
  int wait_ms(bool freed) const {
    int timeout_ms = 1000;
    if (!full())
      for (auto& e : retrying_)
        timeout_ms = std::min<int>(
            timeout_ms, static_cast<int>(std::max<long>(
                            1, std::chrono::duration_cast<std::chrono::milliseconds>(e.not_before - Clock::now()).count() + 1)));
    if (freed && (!waiting_.empty() || !retrying_.empty())) timeout_ms = 0;
    return timeout_ms;
  }

 public:
  HttpRequestSink::Shared* sink_shared_ = nullptr;

 private:
  HttpRequestSink& sink_;
  const HttpRequestSink::Limits& limits_;
  CURLM* multi_;
  std::function<void(std::vector<Done>&)> hand_over_;
  std::deque<Entry> waiting_;                           // not started, in submission order
  std::vector<Entry> retrying_;                         // failed, to be tried again at not_before
  std::map<CURL*, std::unique_ptr<Request>> running_;
  std::set<std::string> busy_;                          // slots with a request running or retrying
  std::uint64_t poisoned_ = 0;  // entries of epochs up to this one fail: one before them failed for good
  std::uint64_t taken_back_ = 0;
  std::uint64_t groups_ = 0;  // the last group given
  std::vector<Done> out_;
};

void HttpRequestSink::run_worker() {
  ::pthread_setname_np(::pthread_self(), limits_.thread_name);  // (the fault campaign finds it by name)
  auto hand_over = [this](std::vector<Done>& out) { walrelay::hand_over(io_, shared_, out); };

  RequestWorker worker(*this, limits_, static_cast<CURLM*>(multi_), hand_over);
  worker.sink_shared_ = shared_.get();
  std::deque<Entry> queued;
  while (true) {
    std::uint64_t taken_back = 0;
    {
      std::lock_guard lock(shared_->mu);
      if (shared_->stop) break;
      queued.swap(shared_->queue);
      taken_back = shared_->taken_back;
    }
    worker.turn(queued, taken_back);
  }
  // What is still queued is never reported: the sink is going away, and the
  // relay confirms nothing past it.
}

}  // namespace walrelay
