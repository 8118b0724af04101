// Where records go. The relay and its LSN ledger only see these interfaces,
// so another broker (NATS JetStream, RabbitMQ) or an exactly-once sink (Kafka
// transactions) can replace the at-least-once Kafka producer without touching
// them. sinks/sink_table.hpp names them all.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio/awaitable.hpp>

#include <pgoutput/pgoutput.hpp>

#include "walrelay/route/outbox_mapper.hpp"

namespace walrelay {

// The outcome of one record, reported exactly once per submitted record.
struct Delivery {
  std::uint64_t token = 0;       // what submit() was given
  std::size_t bytes = 0;         // what submit() counted
  bool ok = true;
  bool at_submit = false;        // refused inside submit(), before it reached a broker
  // On failure: true when the error is not the record's own (a time-out, a
  // broker or network error): the record must be sent again, never
  // dead-lettered. False for what belongs to the record (too large, invalid
  // or unauthorised topic, policy violation), which errors.tolerance governs.
  bool transient = false;
  // On failure: refused for want of a permission of walrelay's principal
  // (an ACL). Not the record's fault, so never dead-lettered, and not
  // transient either: a replay meets the same refusal. error_message names
  // the permission.
  bool denied = false;
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

// The position an exactly-once sink commits with its output: the end LSN of
// the last source transaction in it, and where it was read.
struct CommittedPosition {
  pgoutput::Lsn end_lsn;
  std::string system;  // the database's system identifier
  std::string timeline;
};

// Where the records come from, written beside the position.
struct SourceIdentity {
  std::string system;
  std::string timeline;
  std::string database;
  std::string slot;
};

enum class SubmitStatus {
  accepted,    // the sink owns the record now; a Delivery will follow
  queue_full,  // try again after some deliveries (backpressure, never a drop)
  // Refused at once (too large, an invalid topic): the Delivery with the
  // error has already been handed to the handler, inside submit().
  refused_reported,
};

class TransactionalSink;

// A broker behind the relay. Every sink is at least once: it reports each
// record's outcome once, and the relay confirms the slot only past records
// reported delivered. The exactly-once members live on TransactionalSink.
class Sink {
 public:
  using DeliveryHandler = std::function<void(const Delivery&)>;
  virtual ~Sink() = default;

  // Hands one record over. `token` comes back in its Delivery.
  virtual SubmitStatus submit(const OutboxRecord& record, std::uint64_t token) = 0;
  // Sends a record as-is to the dead-letter destination, with error headers;
  // its Delivery comes back with dead_lettered=true and `reason` as its
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
  // A fatal client error (e.g. idempotence broken): the sink cannot go on.
  virtual std::optional<std::string> fatal_error() const = 0;
  // A round trip to the broker, for --check; throws std::runtime_error with the reason.
  virtual void check_connectivity(int timeout_ms) = 0;
  // The exactly-once side of this sink, or null when it has none (every
  // sink but Kafka's with exactly.once.support=required).
  virtual TransactionalSink* transactions() { return nullptr; }
  // Where the records come from, once the relay has identified the server
  // (before the first record of each session). A sink that tells a record
  // sent again by its position (Redis) keeps it beside what it wrote.
  virtual void source_identified(const SourceIdentity&) {}

  void on_delivery(DeliveryHandler handler) { on_delivery_ = std::move(handler); }
  // Called on the loop when fatal_error() has just become set, so that an
  // idle read loop looks at it now rather than at its next wake-up.
  void on_fatal(std::function<void()> handler) { on_fatal_ = std::move(handler); }

 protected:
  DeliveryHandler on_delivery_;
  std::function<void()> on_fatal_;
};

// Exactly once: the sink's output commits in transactions that also hold the
// position (the end LSN of the last source transaction in them). Records are
// visible only when their transaction commits, and an abort takes them back,
// so the slot follows the commits, not the acknowledgements.
class TransactionalSink {
 public:
  virtual ~TransactionalSink() = default;

  // The fatal error is a fence: another producer with the same
  // transactional.id took over.
  virtual bool fenced() const = 0;
  // The fatal error is the coordinator aborting a transaction older than
  // its time-out (librdkafka reports it as a fence too), not a takeover: a
  // broker outage longer than the time-out, or walrelay held up. Cleared by
  // renew().
  virtual bool timed_out() const = 0;
  // Once per session, before the first record: takes over the transactional
  // producer (fencing any older one) and returns the position committed with
  // the output, or nullopt when there is none. Throws std::runtime_error.
  virtual boost::asio::awaitable<std::optional<CommittedPosition>> recover(const SourceIdentity& source) = 0;
  // Whether this producer took the transactional.id over (init_transactions:
  // another producer may have fenced it since).
  virtual bool taken_over() const = 0;
  // Whether the sink takes records now (not while a transaction aborts).
  virtual bool accepting() const = 0;
  // Whether a commit or an abort is under way, records wait for one, or
  // whole source transactions wait in an open transaction: a shutdown waits
  // (calling commit_now) until it is not.
  virtual bool settling() const = 0;
  // A source transaction whose records were all submitted ended at end_lsn:
  // the sink commits when its boundary is due.
  virtual void source_transaction_ended(pgoutput::Lsn end_lsn) = 0;
  // How far the slot may be confirmed as far as the sink is concerned: the
  // position of its last committed transaction.
  virtual std::optional<pgoutput::Lsn> confirm_limit() const = 0;
  // With no transaction open and nothing waiting for one: commits one that
  // holds only the position `end_lsn`, so that the slot follows the server
  // past WAL without events. False when it cannot now.
  virtual bool commit_position(pgoutput::Lsn end_lsn) = 0;
  // The shutdown's deadline: a commit or an abort still blocking then is
  // left to the coordinator rather than outlast shutdown.timeout.ms.
  virtual void stop_by(std::chrono::steady_clock::time_point deadline) = 0;
  // Drops the open transaction, if any (a replay from the committed position follows).
  virtual void abandon_transaction() = 0;
  // After a fatal error that is not a fence: replaces the producer with a
  // new one, whose recover() takes over from the committed position. Every
  // record of the old one is forgotten (none was confirmed past that
  // position). Also before a new session of a producer that took over in
  // an earlier one (`why` says which). Returns false when the sink cannot
  // be renewed.
  virtual boost::asio::awaitable<bool> renew(std::string_view why) = 0;
  // Shutting down: commits the open transaction now if it holds only whole
  // source transactions (one cut in the middle is left to be aborted).
  virtual void commit_now() = 0;
  // How long the coordinator lets a transaction stay open before it aborts
  // it (an initial snapshot is one transaction: it must end within this).
  virtual std::chrono::milliseconds transaction_timeout() const = 0;

  // Called on the loop when a transaction committed: everything up to end_lsn is visible.
  void on_committed(std::function<void(pgoutput::Lsn)> handler) { on_committed_ = std::move(handler); }
  // Called on the loop when a transaction had to be aborted: a replay from
  // the committed position must follow.
  void on_aborted(std::function<void(std::string reason)> handler) { on_aborted_ = std::move(handler); }

 protected:
  std::function<void(pgoutput::Lsn)> on_committed_;
  std::function<void(std::string)> on_aborted_;
};

}  // namespace walrelay
