#include "walrelay/sinks/sink_table.hpp"

#include <algorithm>

#include "walrelay/config.hpp"
#include "walrelay/sinks/http/http_sink.hpp"
#include "walrelay/sinks/kafka/kafka_sink.hpp"
#include "walrelay/sinks/nats/nats_sink.hpp"
#include "walrelay/sinks/rabbitmq/rabbitmq_sink.hpp"
#include "walrelay/sinks/redis/redis_sink.hpp"
#include "walrelay/sinks/sqs/sqs_sink.hpp"

namespace walrelay {

namespace {

void validate_kafka(const Config&) {}  // kafka.* is checked where it is parsed (config.cpp)

std::unique_ptr<Sink> make_kafka(boost::asio::io_context& io, const Config& config) {
  std::optional<KafkaTransactions> transactions;
  if (config.exactly_once)
    transactions = KafkaTransactions{config.transactional_id(), config.offsets_topic,
                                     config.transaction_boundary_interval_ms, config.transaction_boundary_max_records};
  return std::make_unique<KafkaSink>(io, config.kafka, std::move(transactions));
}

std::unique_ptr<Sink> make_nats(boost::asio::io_context& io, const Config& config) {
  return std::make_unique<NatsJetStreamSink>(io, nats_jetstream_config(config));
}

void validate_nats(const Config& config) { (void)nats_jetstream_config(config); }

std::unique_ptr<Sink> make_rabbitmq(boost::asio::io_context& io, const Config& config) {
  return std::make_unique<RabbitMqSink>(io, rabbitmq_config(config));
}

void validate_rabbitmq(const Config& config) { (void)rabbitmq_config(config); }

std::unique_ptr<Sink> make_redis(boost::asio::io_context& io, const Config& config) {
  return std::make_unique<RedisStreamsSink>(io, redis_config(config));
}

void validate_redis(const Config& config) { (void)redis_config(config); }

std::unique_ptr<Sink> make_http(boost::asio::io_context& io, const Config& config) {
  return std::make_unique<HttpSink>(io, http_config(config));
}

void validate_http(const Config& config) { (void)http_config(config); }

std::unique_ptr<Sink> make_sqs(boost::asio::io_context& io, const Config& config) {
  return std::make_unique<SqsSink>(io, sqs_config(config));
}

void validate_sqs(const Config& config) { (void)sqs_config(config); }

const SinkKind kinds[] = {
    {"kafka", {}, validate_kafka, make_kafka, "kafka.bootstrap.servers"},
    {"nats-jetstream", nats_jetstream_keys(), validate_nats, make_nats, "sink.nats-jetstream.url"},
    {"rabbitmq", rabbitmq_keys(), validate_rabbitmq, make_rabbitmq, "sink.rabbitmq.connection.host"},
    {"redis", redis_keys(), validate_redis, make_redis, "sink.redis.address"},
    {"http", http_keys(), validate_http, make_http, "sink.http.url"},
    {"sqs", sqs_keys(), validate_sqs, make_sqs, "sink.sqs.queue.url"},
};

}  // namespace

std::span<const SinkKind> sink_kinds() { return kinds; }

const SinkKind* find_sink_kind(std::string_view name) {
  auto it = std::find_if(std::begin(kinds), std::end(kinds), [&](const SinkKind& k) { return k.name == name; });
  return it == std::end(kinds) ? nullptr : &*it;
}

std::unique_ptr<Sink> make_sink(boost::asio::io_context& io, const Config& config) {
  const SinkKind* kind = find_sink_kind(config.sink_type);
  if (!kind) throw ConfigError("sink.type", "unknown sink \"" + config.sink_type + "\"");
  return kind->make(io, config);
}

}  // namespace walrelay
