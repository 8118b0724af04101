// What the operator's commands (walrelay replay, walrelay redrive) share:
// they run on a loop of their own, beside the relay, and wait on the
// registry and the sink the way the relay's read loop does, but with plain
// timers instead of its wake-ups.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include <pgoutput/encode.hpp>

#include "walrelay/admin/metrics.hpp"
#include "walrelay/config.hpp"
#include "walrelay/route/outbox_mapper.hpp"
#include "walrelay/route/schema_registry.hpp"
#include "walrelay/sinks/sink.hpp"
#include "walrelay/source/table_rows.hpp"

namespace walrelay {

// How the commands map a table's rows as the relay does: the mapper, the
// registry's encoder (when value.converter has one), and the writer and
// decoder that make a row the Insert the mapper takes.
struct RowMapping {
  RowMapping(boost::asio::io_context& io, const Config& config);
  // Describes the table to the mapper (its Relation message); false when it
  // is not an outbox table the mapper maps.
  bool announce(const TableRows& rows);

  OutboxMapper mapper;
  Metrics metrics;
  std::unique_ptr<SchemaEncoder> encoder;  // null without a registry
  pgoutput::Decoder decoder{1};
  pgoutput::MessageWriter writer;
};

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
