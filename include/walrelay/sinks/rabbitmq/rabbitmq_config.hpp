// sink.type=rabbitmq: Debezium Server's keys (debezium.sink.rabbitmq.*)
// without the `debezium.` prefix where it has them, walrelay's own for TLS
// files, the in-flight bound and the confirm wait.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace walrelay {

struct Config;

struct RabbitMqConfig {
  std::string host = "localhost";        // connection.host
  int port = 5672;                       // connection.port (5671 is the usual TLS port)
  std::string username = "guest";        // connection.username
  std::string password = "guest";        // connection.password
  std::string virtual_host = "/";        // connection.virtual.host
  int heartbeat_s = 10;                  // connection.requested.heartbeat (seconds)
  int connect_timeout_ms = 5000;         // connection.connection.timeout (ms)
  bool ssl = false;                      // connection.ssl.enabled, or any connection.ssl.*.location
  std::string ssl_ca_location;           // connection.ssl.ca.location (PEM)
  std::string ssl_certificate_location;  // connection.ssl.certificate.location (PEM, a client certificate)
  std::string ssl_key_location;          // connection.ssl.key.location
  // exchange: where every record is published ("" is the default exchange,
  // which routes to the queue named by the routing key).
  std::string exchange;
  // routingKeyFromTopicName (default true here): the routing key is the
  // record's topic (route.topic.replacement); false takes routingKey for all.
  bool routing_key_from_topic = true;
  std::string routing_key;
  int max_pending = 4096;                // max.pending: publishes awaiting their confirm
  int ack_timeout_ms = 30000;            // ackTimeout: a confirm not back by then fails transiently
};

// The keys after `sink.rabbitmq.`.
std::span<const std::string_view> rabbitmq_keys();
// Reads config.sink_settings; throws ConfigError naming the key.
RabbitMqConfig rabbitmq_config(const Config& config);

}  // namespace walrelay
