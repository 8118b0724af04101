// What the operator's commands (walrelay replay, walrelay redrive) share:
// they run on a loop of their own, beside the relay, and wait on the
// registry and the sink the way the relay's read loop does, but with plain
// timers instead of its wake-ups.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include "walrelay/route/outbox_mapper.hpp"
#include "walrelay/route/schema_registry.hpp"
#include "walrelay/sinks/sink.hpp"

namespace walrelay {

boost::asio::awaitable<void> pause(boost::asio::io_context& io, std::chrono::milliseconds duration);

// The record's value by its registered schema (no-op without a registry),
// waiting while the schema is being fetched or the registry does not answer:
// a registry that is down is backpressure, never a mapping error. The
// mapping error when the value does not fit; nullopt when encoded, or when
// `stop` ended the wait (the caller checks it).
boost::asio::awaitable<std::optional<MapError>> encode_when_ready(boost::asio::io_context& io, SchemaEncoder* encoder,
                                                                  OutboxRecord& record, const bool& stop);

// Hands the record to the sink, offering it again while the sink's queue is full.
boost::asio::awaitable<void> submit_when_taken(boost::asio::io_context& io, Sink& sink, const OutboxRecord& record,
                                               std::uint64_t token);

}  // namespace walrelay
