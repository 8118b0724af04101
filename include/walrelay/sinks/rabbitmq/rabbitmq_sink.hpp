// sink.type=rabbitmq: each record is published persistent and `mandatory` to
// one exchange, routed by its topic, on one channel in publisher-confirm
// mode, with its event id as message_id, and reported delivered only when a
// confirm covers it. A message that comes back unroutable (basic.return) is
// the record's own failure (errors.tolerance decides); a nack, a lost
// connection or a confirm later than ackTimeout is transient (the relay
// sends again from the slot; consumers deduplicate by message_id).
//
// Threads: rabbitmq-c is blocking (amqp_basic_publish blocks on a full
// socket, and a frame is read whole), so the connection has a thread of its
// own, as librdkafka's brokers do: the loop hands it records through one
// queue and it hands back outcomes through another, waking the loop once
// per batch. Nothing of rabbitmq-c runs on the loop.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "walrelay/sinks/sink.hpp"
#include "walrelay/sinks/rabbitmq/rabbitmq_config.hpp"

namespace walrelay {

class RabbitMqSink final : public Sink {
 public:
  RabbitMqSink(boost::asio::io_context& io, RabbitMqConfig config);
  ~RabbitMqSink() override;
  RabbitMqSink(const RabbitMqSink&) = delete;
  RabbitMqSink& operator=(const RabbitMqSink&) = delete;

  SubmitStatus submit(const OutboxRecord& record, std::uint64_t token) override;
  SubmitStatus submit_dead_letter(std::string_view reason, std::string_view topic,
                                  std::optional<std::string_view> key, std::optional<std::string_view> value,
                                  const std::vector<OutboxRecord::Header>& headers, std::uint64_t token,
                                  std::size_t bytes) override;
  void poll() override;
  // Fails every record still queued for the connection's thread (a lost
  // connection fails them itself, with those in flight, in order).
  void abort_queued() override;
  bool healthy() const override { return connected_; }
  std::string health_reason() const override { return last_error_; }
  std::optional<std::string> fatal_error() const override { return std::nullopt; }
  void check_connectivity(int timeout_ms) override;

  // Tests only, to hold the connection's thread at a chosen step: `take`
  // bounds how many more records it takes from the queue (nullopt: all, as
  // always); pause_for_test(true) stops it between two turns (nothing read,
  // nothing published) and returns once it has stopped.
  void limit_taking_for_test(std::optional<std::size_t> take);
  void pause_for_test(bool pause);
  // Tests only: outcomes the thread has handed back that poll() has not taken yet.
  std::size_t outcomes_waiting_for_test();

  // The header that carries the record's key (AMQP messages have none).
  static constexpr const char* key_header = "key";

  // One record on its way, owned by whichever thread holds it.
  struct Outgoing {
    std::string routing_key;
    std::optional<std::string> key, body;
    std::string message_id;
    std::vector<std::pair<std::string, std::optional<std::string>>> headers;
    std::int64_t timestamp_ms = 0;
    std::uint64_t token = 0;
    std::size_t bytes = 0;
    bool dead_letter = false;
    std::string reason;  // for a dead-letter copy: why
    std::uint64_t losses_seen = 0;  // lost connections the loop had seen when it handed this over
  };
  struct Outcome {
    Outgoing record;
    bool ok = false;
    bool transient = true;
    std::string code, message;
  };
  // Between the loop and the connection's thread.
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Outgoing> to_send;
    std::vector<Outcome> done;
    bool connected = false;
    std::string error = "no RabbitMQ connection yet";
    // Connections lost so far. A record handed over by a loop that had not
    // yet seen the last loss's failures is failed, never published: it would
    // overtake them.
    std::uint64_t losses = 0;
    bool stop = false;
    bool wake_posted = false;
    int wake_fd = -1;  // an eventfd the thread polls beside its socket
    RabbitMqSink* sink = nullptr;
    // The tests' hold (limit_taking_for_test, pause_for_test).
    std::optional<std::size_t> test_take_limit;
    bool test_paused = false;
    bool test_pause_reached = false;
  };

 private:
  SubmitStatus hand_over(Outgoing out);

  boost::asio::io_context& io_;
  RabbitMqConfig config_;
  std::shared_ptr<Shared> shared_;
  std::size_t outstanding_ = 0;  // handed over, not yet reported
  std::uint64_t losses_seen_ = 0;  // Shared::losses as of the last poll()
  bool connected_ = false;
  std::string last_error_ = "no RabbitMQ connection yet";
  std::vector<Outcome> scratch_;
  std::vector<OutboxRecord::Header> header_views_;
  std::thread thread_;
};

}  // namespace walrelay
