// A record a sink keeps, owning its bytes, until its broker answers: the
// sinks whose worker thread sends what the loop submitted (Redis, HTTP, SQS)
// copy it at submit, and report it back as a Delivery.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "walrelay/sinks/sink.hpp"

namespace walrelay {

struct OwnedRecord {
  std::uint64_t token = 0;
  std::size_t bytes = 0;
  std::string topic;
  std::string event_id;
  std::optional<std::string> key, value;
  std::vector<std::pair<std::string, std::optional<std::string>>> headers;
  bool dead_letter = false;
  std::string reason;  // for a dead-letter copy: why

  // A copy of `record`, submitted with `token`.
  void take(const OutboxRecord& record, std::uint64_t token);
  // A dead-letter copy, as Sink::submit_dead_letter takes it (the event id
  // from its `id` header).
  void take_dead_letter(std::string_view reason, std::string_view topic, std::optional<std::string_view> key,
                        std::optional<std::string_view> value, const std::vector<OutboxRecord::Header>& headers,
                        std::uint64_t token, std::size_t bytes);
  // Its Delivery (views into this record): token, bytes, topic, the
  // dead-letter fields; with `own_failure`, the record itself for its
  // dead-letter copy.
  Delivery delivery(bool own_failure) const;
};

}  // namespace walrelay
