// sink.type=sqs: records go to Amazon SQS (or a server that speaks its
// API: ElasticMQ) in SendMessageBatch calls of the JSON protocol, signed
// with AWS Signature V4 by libcurl (CURLOPT_AWS_SIGV4), one queue per routed
// topic (sink.sqs.queue.url's ${topic}).
//
// FIFO queues (a name ending in .fifo): MessageGroupId is the key, so the
// queue keeps each key's order, and MessageDeduplicationId the event id, so
// the queue drops what a restart sends again within its 5-minute window.
// walrelay sends a key's records one call at a time, and never two records
// of one key in one call: a call that fails in part for the server's
// reasons cannot have put a key's later record in before its earlier one.
// Standard queues: at least once, in no order (SQS's own), calls batched
// freely.
//
// Each entry's answer is its own: Successful is delivered; Failed with
// SenderFault is the record's own (errors.tolerance), otherwise tried again
// in place. A call refused whole (400) for what one entry holds is split,
// each entry sent by itself; credentials refused halt; a queue not there
// holds the slot, as a NATS subject without a stream does.
//
// Threads: HttpRequestSink's worker ("wr-sqs").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "walrelay/sinks/http/http_request_sink.hpp"
#include "walrelay/sinks/sqs/sqs_config.hpp"

namespace walrelay {

class SqsSink final : public HttpRequestSink {
 public:
  SqsSink(boost::asio::io_context& io, SqsConfig config);
  ~SqsSink() override;

  void check_connectivity(int timeout_ms) override;

 private:
  std::string url_of(std::string_view topic) const override;
  std::string order_slot(const Entry& e) const override;
  std::string refusal_of(const Entry& e) const override;
  void prepare(Request& r) const override;
  void judge(const Request& r, int curl_result, long status, std::vector<Verdict>& verdicts) const override;
  std::string describe(const Request& r) const override;
  void sign(void* easy, curl_slist*& headers, const std::string& target) const;

  SqsConfig config_;
  std::string sigv4_;  // "aws:amz:<region>:sqs"
};

}  // namespace walrelay
