#include "walrelay/sinks/rabbitmq/rabbitmq_config.hpp"

#include <array>

#include "walrelay/config.hpp"

namespace walrelay {

namespace {

constexpr std::string_view prefix = "sink.rabbitmq.";

constexpr std::array<std::string_view, 18> keys = {
    "connection.host", "connection.port", "connection.username", "connection.password",
    "connection.virtual.host", "connection.requested.heartbeat", "connection.connection.timeout",
    "connection.ssl.enabled", "connection.ssl.ca.location", "connection.ssl.certificate.location",
    "connection.ssl.key.location", "exchange", "routingKeyFromTopicName", "routingKey", "deliveryMode",
    "ackTimeout", "max.pending", "autoCreateRoutingKey",
};

}  // namespace

std::span<const std::string_view> rabbitmq_keys() { return keys; }

RabbitMqConfig rabbitmq_config(const Config& config) {
  RabbitMqConfig r;
  bool ssl_named = false;
  for (auto& [key, v] : config.sink_settings) {
    if (!key.starts_with(prefix)) continue;
    const std::string_view k = std::string_view(key).substr(prefix.size());
    if (k == "connection.host") r.host = v;
    else if (k == "connection.port") r.port = static_cast<int>(parse_int(key, v, 1, 65535));
    else if (k == "connection.username") r.username = v;
    else if (k == "connection.password") r.password = v;
    else if (k == "connection.virtual.host") r.virtual_host = v;
    else if (k == "connection.requested.heartbeat") r.heartbeat_s = static_cast<int>(parse_int(key, v, 0, 3600));
    else if (k == "connection.connection.timeout") r.connect_timeout_ms = static_cast<int>(parse_int(key, v, 100, 600000));
    else if (k == "connection.ssl.enabled") r.ssl = parse_bool(key, v) || r.ssl;
    else if (k == "connection.ssl.ca.location") { r.ssl_ca_location = v; ssl_named = true; }
    else if (k == "connection.ssl.certificate.location") { r.ssl_certificate_location = v; ssl_named = true; }
    else if (k == "connection.ssl.key.location") { r.ssl_key_location = v; ssl_named = true; }
    else if (k == "exchange") r.exchange = v;
    else if (k == "routingKeyFromTopicName") r.routing_key_from_topic = parse_bool(key, v);
    else if (k == "routingKey") r.routing_key = v;
    else if (k == "deliveryMode") {
      if (v != "2")
        throw ConfigError(key, "only 2 (persistent): a transient message (1) is lost when the broker restarts, after "
                               "walrelay was told it was delivered");
    } else if (k == "ackTimeout") r.ack_timeout_ms = static_cast<int>(parse_int(key, v, 100, 3600000));
    else if (k == "max.pending") r.max_pending = static_cast<int>(parse_int(key, v, 1, 1000000));
    else if (k == "autoCreateRoutingKey")
      throw ConfigError(key, "walrelay does not declare queues: declare and bind them as the consumers need (an "
                             "unroutable message comes back to walrelay and goes to errors.tolerance's policy)");
    else throw ConfigError(key, "unknown key of the rabbitmq sink");
  }
  if (ssl_named) r.ssl = true;
  if (r.ssl_certificate_location.empty() != r.ssl_key_location.empty())
    throw ConfigError("sink.rabbitmq.connection.ssl.certificate.location",
                      "a client certificate needs its key: set connection.ssl.certificate.location and "
                      "connection.ssl.key.location together");
  if (!r.routing_key_from_topic && r.routing_key.empty())
    throw ConfigError("sink.rabbitmq.routingKey", "is required with routingKeyFromTopicName=false");
  return r;
}

}  // namespace walrelay
