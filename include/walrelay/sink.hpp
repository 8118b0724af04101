// Where records go. The relay and its LSN ledger only see this interface, so
// an exactly-once sink (Kafka transactions) or another broker can replace the
// at-least-once Kafka producer without touching them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "walrelay/outbox_mapper.hpp"

namespace walrelay {

// The outcome of one record, reported exactly once per submitted record.
struct Delivery {
  std::uint64_t token = 0;       // what submit() was given
  std::size_t bytes = 0;         // what submit() counted
  bool ok = true;
  // On failure: true when the error is not the record's own (a time-out, a
  // broker or network error): the record must be sent again, never
  // dead-lettered. False for what belongs to the record (too large, invalid
  // or unauthorised topic, policy violation), which errors.tolerance governs.
  bool transient = false;
  bool dead_lettered = false;    // delivered to the dead-letter topic instead
  std::string dead_letter_reason;// for dead_lettered: why the record went there (a metric label)
  std::string error_code;        // short code, a metric label (msg_size_too_large ...)
  std::string error_message;     // human-readable
  std::string_view topic;        // the record's topic (valid during the handler call)
  // On failure only, valid during the handler call: the record as it was
  // submitted, so a dead-letter copy can be made without keeping it around.
  std::optional<std::string_view> key;
  std::optional<std::string_view> value;
  std::vector<OutboxRecord::Header> headers;
};

enum class SubmitStatus {
  accepted,    // the sink owns the record now; a Delivery will follow
  queue_full,  // try again after some deliveries (backpressure, never a drop)
  // Refused at once (too large, an invalid topic): the Delivery with the
  // error has already been handed to the handler, inside submit().
  refused_reported,
};

class Sink {
 public:
  using DeliveryHandler = std::function<void(const Delivery&)>;
  virtual ~Sink() = default;

  // Hands one record over. `token` comes back in its Delivery.
  virtual SubmitStatus submit(const OutboxRecord& record, std::uint64_t token) = 0;
  // Sends a record as-is to the dead-letter topic, with error headers; its
  // Delivery comes back with dead_lettered=true and `reason` as its
  // dead_letter_reason.
  virtual SubmitStatus submit_dead_letter(std::string_view reason, std::string_view topic,
                                          std::optional<std::string_view> key,
                                          std::optional<std::string_view> value,
                                          const std::vector<OutboxRecord::Header>& headers, std::uint64_t token,
                                          std::size_t bytes) = 0;
  // Serves delivery reports (on the caller's thread).
  virtual void poll() = 0;
  // Fails every record not yet sent to a broker; each reports a transient
  // failure. After one record failed, none queued behind it may land before
  // it is sent again.
  virtual void abort_queued() = 0;
  // Whether the broker is reachable; reason when not.
  virtual bool healthy() const = 0;
  virtual std::string health_reason() const = 0;
  // A fatal producer error (e.g. idempotence broken): the sink cannot go on.
  virtual std::optional<std::string> fatal_error() const = 0;
  // Metadata round trip, for --check; throws std::runtime_error with the reason.
  virtual void check_connectivity(int timeout_ms) = 0;

  void on_delivery(DeliveryHandler handler) { on_delivery_ = std::move(handler); }

 protected:
  DeliveryHandler on_delivery_;
};

}  // namespace walrelay
