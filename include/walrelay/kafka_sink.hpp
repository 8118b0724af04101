// The at-least-once Kafka sink: an idempotent librdkafka producer whose
// delivery reports are served on the relay's io_context thread.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <vector>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "walrelay/sink.hpp"

struct rd_kafka_s;
struct rd_kafka_message_s;
struct rd_kafka_topic_s;

namespace walrelay {

class KafkaSink final : public Sink {
 public:
  // settings: librdkafka properties (kafka.* without the prefix). Throws
  // ConfigError naming the kafka.* key librdkafka rejects.
  KafkaSink(boost::asio::io_context& io, const std::map<std::string, std::string>& settings);
  ~KafkaSink() override;
  KafkaSink(const KafkaSink&) = delete;
  KafkaSink& operator=(const KafkaSink&) = delete;

  SubmitStatus submit(const OutboxRecord& record, std::uint64_t token) override;
  SubmitStatus submit_dead_letter(std::string_view reason, std::string_view topic,
                                  std::optional<std::string_view> key,
                                  std::optional<std::string_view> value,
                                  const std::vector<OutboxRecord::Header>& headers, std::uint64_t token,
                                  std::size_t bytes) override;
  void poll() override;
  void abort_queued() override;
  // Not ready until librdkafka's statistics show a broker up (within
  // statistics.interval.ms of start), so a broker that refuses walrelay from
  // the start is never reported healthy.
  bool healthy() const override { return brokers_up_ > 0; }
  std::string health_reason() const override { return last_error_; }
  std::optional<std::string> fatal_error() const override { return fatal_; }
  void check_connectivity(int timeout_ms) override;

  // Called from librdkafka callbacks (on the polling thread).
  void handle_delivery(const rd_kafka_message_s* message);
  void handle_error(int err, const char* reason);
  void handle_stats(const char* json, std::size_t len);

 private:
  struct Pending;  // per-record bookkeeping carried as the message opaque
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  void watch_queue();
  rd_kafka_topic_s* topic_handle(std::string_view topic);
  // reorder_key mutation (tests/mutation/run.sh) only.
  SubmitStatus submit_reordered(const OutboxRecord& record, Pending* opaque);
  void produce_held();
  SubmitStatus produce(std::string_view topic, std::optional<std::string_view> key,
                       std::optional<std::string_view> value, std::int64_t timestamp_ms,
                       const std::vector<OutboxRecord::Header>& headers, Pending* pending);

  boost::asio::io_context& io_;
  rd_kafka_s* rk_ = nullptr;
  int wake_pipe_[2] = {-1, -1};                  // librdkafka writes here when its queue has events
  boost::asio::posix::stream_descriptor wake_;   // watches wake_pipe_[0]
  boost::asio::steady_timer poll_timer_;         // safety net: polls even if a wake-up is missed
  int brokers_up_ = 0;
  bool seen_up_ = false;                         // a broker has been up since start
  std::string last_error_ = "no broker connection yet";
  std::optional<std::string> fatal_;
  // One handle per topic, created on first use. rd_kafka_topic_new asks the
  // broker for a new topic's metadata at once; producing by name would leave
  // it to librdkafka's 1 s topic scan, and the first records would wait.
  std::unordered_map<std::string, rd_kafka_topic_s*, NameHash, std::equal_to<>> topics_;
  static constexpr std::size_t max_topic_handles = 4096;
  // State of the mutation builds (tests/mutation/run.sh); unused otherwise.
  struct Held {
    std::string topic;
    std::optional<std::string> key, value;
    std::int64_t timestamp_ms;
    std::vector<std::pair<std::string, std::optional<std::string>>> headers;
    Pending* opaque;
    std::chrono::steady_clock::time_point since;
  };
  std::optional<Held> held_;
  std::uint64_t mutation_count_ = 0;
};

}  // namespace walrelay
