// sink.type=http: each record is POSTed to sink.http.url (its ${topic} the
// record's routed topic), its value the body, and reported delivered once the
// endpoint answered 2xx.
//
// Per-key order: at most one request per key at a time; across keys up to
// max.inflight.requests. A transient failure (a connection error, a time-out,
// 408, 429, 5xx) is tried again in place, after retry.interval.ms or the
// answer's Retry-After, up to `retries` times, the key's later records
// waiting behind it; then it fails transiently, nothing more of that epoch is
// sent, and the relay sends it again from the slot (at least once). Other
// 4xx are the record's own failure (errors.tolerance: a dead-letter copy, or
// a halt); 401 and 403 are walrelay's credentials (a halt naming them).
// The event id goes as Idempotency-Key: the receiver tells a repeat by it.
//
// Threads: one worker thread drives a libcurl multi handle and hands
// outcomes back through one queue, posting a wake-up to the loop, where
// everything else runs.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "walrelay/sinks/http/http_config.hpp"
#include "walrelay/sinks/sink.hpp"

namespace walrelay {

class HttpSink final : public Sink {
 public:
  HttpSink(boost::asio::io_context& io, HttpConfig config);
  ~HttpSink() override;
  HttpSink(const HttpSink&) = delete;
  HttpSink& operator=(const HttpSink&) = delete;

  SubmitStatus submit(const OutboxRecord& record, std::uint64_t token) override;
  SubmitStatus submit_dead_letter(std::string_view reason, std::string_view topic,
                                  std::optional<std::string_view> key, std::optional<std::string_view> value,
                                  const std::vector<OutboxRecord::Header>& headers, std::uint64_t token,
                                  std::size_t bytes) override;
  void poll() override;
  void abort_queued() override;
  bool healthy() const override;
  std::string health_reason() const override;
  std::optional<std::string> fatal_error() const override { return std::nullopt; }
  void check_connectivity(int timeout_ms) override;

  // One POST to be.
  struct Entry {
    std::uint64_t token = 0;
    std::size_t bytes = 0;
    std::uint64_t epoch = 0;  // abort_queued() counts these: older ones are not sent
    std::string topic, url;
    std::string event_id;
    std::optional<std::string> key, value;
    std::vector<std::pair<std::string, std::optional<std::string>>> headers;
    bool dead_letter = false;
    std::string reason;       // for a dead-letter copy: why
    int attempts = 0;
    std::chrono::steady_clock::time_point not_before{};  // a retry waits until then
  };
  enum class Outcome { delivered, transient, record_error, denied };
  struct Done {
    Entry entry;
    Outcome outcome = Outcome::delivered;
    std::string code, message;
  };
  // What the loop and the worker share, under mu.
  struct Shared {
    std::mutex mu;
    std::deque<Entry> queue;
    std::vector<Done> done;
    bool stop = false;
    bool wake_posted = false;
    std::uint64_t taken_back = 0;  // entries of epochs up to this one are failed, not sent
    bool reachable = true;         // the last request got an HTTP answer
    std::string last_error;
    HttpSink* sink = nullptr;
  };

 private:
  void run_worker();
  void report(Done& d);
  SubmitStatus enqueue(Entry e);
  void wake_worker();

  boost::asio::io_context& io_;
  HttpConfig config_;
  std::shared_ptr<Shared> shared_;
  void* multi_ = nullptr;  // CURLM*, made before the worker starts (curl_multi_wakeup from the loop)
  std::uint64_t epoch_ = 1;
  std::size_t outstanding_ = 0;  // submitted, not yet reported
  std::vector<Done> scratch_;
  std::thread worker_;
};

}  // namespace walrelay
