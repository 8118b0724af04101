// What the sinks that speak HTTP through libcurl share (sink.type=http, and
// sqs through its HTTP API): a worker thread driving a libcurl multi handle,
// at most one request per ordering slot (a key), requests batched per URL
// when the sink allows it, transient failures tried again in place with the
// slot held, and an epoch that stops everything queued behind a record that
// failed for good. The derived sink says how a request is made and what an
// answer means for each of its records.
//
// Threads: the worker hands outcomes back through one queue, posting a
// wake-up to the loop, where everything else runs. The derived class starts
// the worker at the end of its constructor and stops it first thing in its
// destructor: the worker calls its virtual functions.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "walrelay/sinks/owned_record.hpp"
#include "walrelay/sinks/sink.hpp"

typedef void CURL;
struct curl_slist;

namespace walrelay {

class HttpRequestSink : public Sink {
 public:
  // The bounds a sink's keys set.
  struct Limits {
    int timeout_ms = 60000;           // a request not answered by then fails transiently
    int connect_timeout_ms = 10000;
    int retries = 5;                  // attempts after the first, in place
    int retry_interval_ms = 1000;     // between attempts (a longer Retry-After wins)
    int retry_after_max_ms = 300000;  // the most a Retry-After is waited
    int max_inflight_requests = 16;   // requests at once
    int max_pending = 4096;           // records submitted and not yet answered
    std::size_t batch_entries = 1;    // records one request may carry (same URL)
    std::size_t batch_bytes = SIZE_MAX;
    std::size_t response_bytes = 300;  // of an answer's body kept for judging and messages
    const char* thread_name = "wr-http";
    const char* name = "http";         // in messages
  };

  // One record to send.
  struct Entry : OwnedRecord {
    std::uint64_t epoch = 0;  // abort_queued() counts these: older ones are not sent
    std::uint64_t seq = 0;    // submission order
    std::string url;
    std::string refusal;   // the sink cannot send it at all: the record's own failure, in its turn
    bool alone = false;    // to go in a request of its own (a batch was refused whole)
    bool own_request = false;  // the sink cannot put it in a batch (needs_own_request)
    // Records of one request tried again in place share a group, and go
    // again together and alone: the same request (the same Idempotency-Key).
    std::uint64_t group = 0;
    int attempts = 0;
    std::chrono::steady_clock::time_point not_before{};  // a retry waits until then
  };
  // alone: the request was refused whole for what one of its records holds,
  // not saying which; each is sent again by itself.
  enum class Outcome { delivered, transient, record_error, denied, alone };
  struct Verdict {
    Outcome outcome = Outcome::delivered;
    std::string code, message;
  };
  struct Done {
    Entry entry;
    Outcome outcome = Outcome::delivered;
    std::string code, message;
  };
  // One request under way, and what it owns while it is.
  struct Request {
    std::vector<Entry> entries;
    CURL* easy = nullptr;
    curl_slist* headers = nullptr;
    std::string body;      // the request's, when the derived sink builds one
    std::string response;  // the first Limits::response_bytes of the answer
    std::size_t response_limit = 300;
    char error[256] = {};  // CURL_ERROR_SIZE
    ~Request();
  };

  ~HttpRequestSink() override;
  HttpRequestSink(const HttpRequestSink&) = delete;
  HttpRequestSink& operator=(const HttpRequestSink&) = delete;

  SubmitStatus submit(const OutboxRecord& record, std::uint64_t token) final;
  SubmitStatus submit_dead_letter(std::string_view reason, std::string_view topic,
                                  std::optional<std::string_view> key, std::optional<std::string_view> value,
                                  const std::vector<OutboxRecord::Header>& headers, std::uint64_t token,
                                  std::size_t bytes) final;
  void poll() final;
  void abort_queued() final;
  bool healthy() const final;
  std::string health_reason() const final;
  std::optional<std::string> fatal_error() const final { return std::nullopt; }

  struct Shared;

 protected:
  HttpRequestSink(boost::asio::io_context& io, Limits limits);
  void start_worker();
  void stop_worker();

  // The URL a record routed to `topic` goes to; records of one URL may share a request.
  virtual std::string url_of(std::string_view topic) const = 0;
  // Records of one slot go one at a time, in order; "" orders nothing.
  virtual std::string order_slot(const Entry& e) const = 0;
  // Why the sink cannot send this record at all (the record's own), or "".
  virtual std::string refusal_of(const Entry&) const { return {}; }
  // Whether the record must go in a request of its own, in a form that
  // carries one record only.
  virtual bool needs_own_request(const Entry&) const { return false; }
  // Makes r's request on r.easy (time-outs, the answer's buffer and the
  // error buffer are set): its URL, body, headers.
  virtual void prepare(Request& r) const = 0;
  // What the answer means for each of r's records, in their order: one verdict each.
  virtual void judge(const Request& r, int curl_result, long status, std::vector<Verdict>& verdicts) const = 0;
  // Messages name a request's target by this (a URL's path may hold a secret).
  virtual std::string describe(const Request& r) const = 0;

  // A transfer that failed below HTTP: a certificate walrelay cannot use or
  // a server's that does not verify is the configuration's (denied: a halt
  // naming it); the rest (refused, reset, timed out, a name not resolved)
  // passes (transient).
  static Outcome outcome_of_transfer(int curl_result);

  // An id for a record that has none (a deduplication id, webhook-id, a
  // batch's key): this process's random nonce and the record's submission
  // number, never one an earlier process gave (the records' tokens start
  // again at every start).
  std::string unique_id(const Entry& e) const { return "walrelay-" + nonce_ + "-" + std::to_string(e.seq); }

  const Limits limits_;

 private:
  friend class RequestWorker;
  void run_worker();
  void report(Done& d);
  SubmitStatus enqueue(Entry e);
  void wake_worker();

  boost::asio::io_context& io_;
  std::shared_ptr<Shared> shared_;
  std::string nonce_;  // random, per process (unique_id)
  void* multi_ = nullptr;  // CURLM*, made before the worker starts (curl_multi_wakeup from the loop)
  std::uint64_t epoch_ = 1;
  std::uint64_t seq_ = 0;
  std::size_t outstanding_ = 0;  // submitted, not yet reported
  std::vector<Done> scratch_;
  std::thread worker_;
};

}  // namespace walrelay
