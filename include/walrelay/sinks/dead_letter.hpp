// Dead-letter records, laid out as Kafka Connect's dead-letter queue lays
// them out (__connect.errors.* headers, errors.deadletterqueue.context.
// headers.enable) plus walrelay's own walrelay.* headers, so that tools made
// for Connect's dead letters read them. Built only when a record cannot be
// relayed: they own their bytes and do not try to be cheap.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pgoutput/pgoutput.hpp>

#include "walrelay/route/outbox_mapper.hpp"
#include "walrelay/sinks/sink.hpp"

namespace walrelay {

struct DeadLetter {
  std::string reason;                  // why, as a metric label (null_value, msg_size_too_large ...)
  std::optional<std::string> key;
  std::optional<std::string> value;
  std::vector<std::pair<std::string, std::optional<std::string>>> headers;

  // The headers as the sink takes them; valid while this object lives.
  std::vector<OutboxRecord::Header> header_views() const;
  std::size_t size_bytes() const { return (key ? key->size() : 0) + (value ? value->size() : 0); }
};

// A row the mapper could not map: its columns as JSON, with the table, the
// LSN and the event id it came from.
DeadLetter unmappable_row(const OutboxMapper& mapper, const pgoutput::Insert& insert, const MapError& error,
                          pgoutput::Lsn lsn, bool context_headers);

// A logical message that could not be mapped (or was refused: not
// transactional): its content as it came, with the prefix and the LSN.
DeadLetter unmappable_message(const pgoutput::LogicalMessage& message, const MapError& error, bool context_headers);

// A record the broker refused for a reason of its own: its key and headers as
// sent, and its value unless the value is what was refused (too large), or
// the copy would be refused the same way.
DeadLetter refused_record(const Delivery& delivery, bool context_headers);

}  // namespace walrelay
