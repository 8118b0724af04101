// The sinks walrelay can write to, by `sink.type`: one explicit table, so
// that a sink is never lost to a linker that drops self-registration, and a
// new broker touches its folder, this table and nothing else of the relay.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>

#include "walrelay/sinks/sink.hpp"

namespace walrelay {

struct Config;

struct SinkKind {
  std::string_view name;  // sink.type's value, and the `sink.<name>.` prefix of its keys
  // Its keys, after the prefix (empty for Kafka, whose keys are kafka.*).
  std::span<const std::string_view> keys;
  // Checks its keys' values; throws ConfigError naming the key.
  void (*validate)(const Config& config);
  // The sink; throws ConfigError for what only the client library can judge.
  std::unique_ptr<Sink> (*make)(boost::asio::io_context& io, const Config& config);
  // The key that says where the broker is (--check names it when it does not answer).
  std::string_view address_key;
};

// Every sink, Kafka first (the default).
std::span<const SinkKind> sink_kinds();
// The sink called `name`, or null.
const SinkKind* find_sink_kind(std::string_view name);
// The sink that config.sink_type names.
std::unique_ptr<Sink> make_sink(boost::asio::io_context& io, const Config& config);

}  // namespace walrelay
