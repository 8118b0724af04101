// sink.type=nats-jetstream: each record is published asynchronously to a
// JetStream subject (the topic routed as for Kafka) with its event id as
// Nats-Msg-Id, and reported delivered only when its PubAck is back.
//
// Order: nats.c's own reconnection is off. A connection that drops takes
// every publish not yet acknowledged with it (each reported as a transient
// failure, so the relay sends again from the slot), and nothing more is
// written on it; a new connection is made on a worker thread. What the
// server stored is then always a prefix of what was sent, and the stream's
// duplicate window drops the repeats, so per-key order holds across a
// broker restart.
//
// Threads: nats.c calls back on its own threads; those calls only queue
// what happened and wake the loop, where everything else runs.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include "walrelay/sinks/sink.hpp"
#include "walrelay/sinks/nats/nats_config.hpp"

// nats.c's types (nats/nats.h), kept out of the header.
struct __natsConnection;
struct __natsMsg;
struct __natsOptions;
struct __jsCtx;

namespace walrelay {

class NatsJetStreamSink final : public Sink {
 public:
  NatsJetStreamSink(boost::asio::io_context& io, NatsJetStreamConfig config);
  ~NatsJetStreamSink() override;
  NatsJetStreamSink(const NatsJetStreamSink&) = delete;
  NatsJetStreamSink& operator=(const NatsJetStreamSink&) = delete;

  SubmitStatus submit(const OutboxRecord& record, std::uint64_t token) override;
  SubmitStatus submit_dead_letter(std::string_view reason, std::string_view topic,
                                  std::optional<std::string_view> key, std::optional<std::string_view> value,
                                  const std::vector<OutboxRecord::Header>& headers, std::uint64_t token,
                                  std::size_t bytes) override;
  void poll() override;
  // Every publish is on the connection as soon as submit() returns: nothing
  // waits in walrelay to be taken back.
  void abort_queued() override {}
  bool healthy() const override { return js_ != nullptr && !stream_problem_ && server_refusal_.empty(); }
  std::string health_reason() const override;
  std::optional<std::string> fatal_error() const override { return std::nullopt; }
  void check_connectivity(int timeout_ms) override;

  // The header that carries the record's key (NATS messages have none).
  static constexpr const char* key_header = "key";

  // What nats.c's threads hand the loop (public for its C callbacks).
  struct Completion {
    __natsMsg* msg = nullptr;  // ours to destroy
    bool ok = false;
    bool duplicate = false;    // the stream had it already (a send again within the window)
    int status = 0;            // natsStatus
    int js_code = 0;           // jsErrCode
    std::string text;
  };
  struct Inbox {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Completion> done;
    bool closed = false;        // the connection closed: make a new one
    bool close_seen = false;    // for the destructor's wait
    bool wake_posted = false;
    std::string async_error;    // the server's last asynchronous error (a permission ...)
    bool async_error_new = false;  // set with it, taken by poll()
    NatsJetStreamSink* sink = nullptr;
  };
  // What nats.c's callbacks are given: the inbox and how to wake the loop.
  // It outlives the connections (the destructor waits for the last closed
  // callback before it goes).
  struct CallbackRef;

 private:
  struct Pending {
    std::uint64_t token;
    std::size_t bytes;
    bool dead_letter;
    std::string reason;  // for a dead-letter copy: why
  };
  struct Connected {
    __natsConnection* nc = nullptr;
    __jsCtx* js = nullptr;
    std::string error;  // when neither
  };
  static __natsOptions* make_options(const NatsJetStreamConfig& config, int timeout_ms, CallbackRef* ref);
  // Connects (blocking: on the worker), creating the stream when asked.
  static Connected connect(const NatsJetStreamConfig& config, __natsOptions* options, void* ack_closure);
  void start_connect();
  void connected(Connected c);
  void connection_closed();
  void retire_connection();
  SubmitStatus publish(std::string_view subject, std::optional<std::string_view> key,
                       std::optional<std::string_view> value, const std::vector<OutboxRecord::Header>& headers,
                       std::string_view msg_id, Pending pending, std::uint64_t token, std::size_t bytes);
  void report(const Completion& c);
  // A Delivery for a record refused before it left.
  void refuse_at_submit(Delivery& d, std::string_view subject, std::optional<std::string_view> key,
                        std::optional<std::string_view> value, const std::vector<OutboxRecord::Header>& headers);

  boost::asio::io_context& io_;
  NatsJetStreamConfig config_;
  std::shared_ptr<Inbox> inbox_;
  std::unique_ptr<CallbackRef> ref_;
  __natsOptions* options_ = nullptr;
  __natsConnection* nc_ = nullptr;
  __jsCtx* js_ = nullptr;
  bool connecting_ = false;
  std::string last_error_ = "no NATS connection yet";
  bool stream_problem_ = false;  // a subject no stream takes: not ready until a publish succeeds
  // What the server refused asynchronously (a permission): its publishes
  // never get a PubAck, so nothing else would say why. Not ready until a
  // publish succeeds.
  std::string server_refusal_;
  std::chrono::milliseconds backoff_{0};
  boost::asio::steady_timer reconnect_timer_;
  boost::asio::thread_pool worker_{1};  // the blocking connect
  std::unordered_map<__natsMsg*, Pending> pending_;
  std::vector<Completion> scratch_;
  std::string id_buf_, value_buf_;
  std::vector<OutboxRecord::Header> headers_scratch_;
  std::vector<std::string> header_store_;
};

}  // namespace walrelay
