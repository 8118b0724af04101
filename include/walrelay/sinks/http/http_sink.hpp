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
// Threads: HttpRequestSink's worker (one request per record; batches not yet).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "walrelay/sinks/http/http_config.hpp"
#include "walrelay/sinks/http/http_request_sink.hpp"

namespace walrelay {

class HttpSink final : public HttpRequestSink {
 public:
  HttpSink(boost::asio::io_context& io, HttpConfig config);
  ~HttpSink() override;

  void check_connectivity(int timeout_ms) override;

 private:
  std::string url_of(std::string_view topic) const override;
  std::string order_slot(const Entry& e) const override;
  bool needs_own_request(const Entry& e) const override;
  void prepare(Request& r) const override;
  void prepare_one(Request& r) const;
  void prepare_batch(Request& r) const;
  void sign(const std::string& webhook_id, std::string_view body, std::vector<std::string>& lines) const;
  void judge(const Request& r, int curl_result, long status, std::vector<Verdict>& verdicts) const override;
  std::string describe(const Request& r) const override;

  HttpConfig config_;
};

}  // namespace walrelay
