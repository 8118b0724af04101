// The LSN ledger: which WAL position may be confirmed to PostgreSQL.
//
// Each source transaction is an entry with its commit end LSN and its count of
// records the broker has not yet acknowledged. The flushed LSN is the end LSN
// of the newest transaction such that it and every earlier one are fully
// acknowledged: acks arriving out of order (partitions complete at different
// speeds) never move it further. It never goes backwards, except when a reset
// says so.
//
// Bounded by what is in flight, not by how long a record takes: a transaction
// fully acknowledged behind an earlier one is folded into it (the earlier one
// keeps its unacknowledged count and takes the later end LSN: the slot can
// only be confirmed past both together), so one record retried for hours keeps
// a handful of entries, not one per transaction since.
//
// Its own bookkeeping is checked on every call, in every build: a double
// acknowledgement or an acknowledgement of an unknown record would otherwise
// pin or advance the slot wrongly forever. The first violation is kept, and
// from then on flushed() no longer moves; the relay halts on it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>

#include <pgoutput/pgoutput.hpp>

namespace walrelay {

class LsnLedger {
 public:
  using Lsn = pgoutput::Lsn;
  // Identifies a transaction for the lifetime of the ledger; carried as the
  // opaque of every Kafka record so a delivery report finds its transaction
  // with no lookup structure and no allocation.
  using TxnId = std::uint64_t;

  // Starts at the slot's confirmed position (nothing below it is owed).
  explicit LsnLedger(Lsn start = {}) : flushed_(start) {}

  // A Begin: opens a transaction. commit_time_us is PostgreSQL's epoch micros;
  // commit_lsn is Begin's final LSN, kept to name the transaction in errors.
  TxnId open(std::int64_t commit_time_us, Lsn commit_lsn = {});
  // One record of the open transaction was handed to the sink.
  void add_record(TxnId txn, std::size_t bytes);
  // The Commit of the open transaction: it is complete at end_lsn.
  void commit(TxnId txn, Lsn end_lsn);
  // The connection was lost inside the open transaction: the server will send
  // it again, so it must never let the flushed LSN pass anything. Its records
  // still in flight are acknowledged into the void.
  void abandon_open();
  // A record of txn is acknowledged (delivered, or dead-lettered by policy).
  void ack(TxnId txn, std::size_t bytes);
  // The sink did not take a record just added (its queue was full): the
  // addition is undone, to be made again when the record is offered again.
  void withdraw(TxnId txn, std::size_t bytes);
  // Every record has settled and the unacknowledged ones will be sent again
  // from the slot's confirmed position: forget all transactions, keep
  // flushed(). Ids keep growing, so a stale token can never match a new entry.
  void reset();
  // The same, with flushed() put back to `flushed`: exactly once, where an
  // acknowledgement of an aborted Kafka transaction vouches for nothing.
  void reset(Lsn flushed);

  // A keepalive or XLogData told us how far the server's WAL reaches. With
  // nothing in flight and no transaction open, everything up to it is done:
  // the slot follows the server while the outbox is idle.
  void server_position(Lsn wal_end);

  Lsn flushed() const { return flushed_; }
  std::uint64_t inflight_records() const { return inflight_records_; }
  std::uint64_t inflight_bytes() const { return inflight_bytes_; }
  bool has_open() const { return open_.has_value(); }
  bool idle() const { return inflight_records_ == 0 && !open_; }
  // Entries in the ledger: transactions with records in flight, the done
  // ones each of them holds back (folded into one), the open one.
  std::size_t pending_transactions() const { return txns_.size(); }
  // Commit time (PostgreSQL epoch micros) of the oldest transaction not fully acked.
  std::optional<std::int64_t> oldest_unacked_commit_time() const;
  // The commit LSN of a transaction still in the ledger.
  std::optional<Lsn> commit_lsn_of(TxnId txn) const;
  // The first broken invariant, if any (flushed() is frozen since).
  const std::optional<std::string>& violation() const { return violation_; }
  // Whether a transaction still in the ledger has had a record added.
  bool had_records(TxnId txn) const;
  // Called once for each committed transaction that carried records, when it
  // and every earlier one are acknowledged (its end LSN becomes confirmable).
  // Transactions folded together retire together, each with their mean
  // commit time: the count and the sum of the latencies stay exact.
  void on_retired(std::function<void(std::int64_t commit_time_us)> callback) { on_retired_ = std::move(callback); }

 private:
  struct Txn {
    TxnId id;
    Lsn end_lsn;               // valid once committed
    std::int64_t commit_time;  // from Begin
    Lsn commit_lsn;            // from Begin
    std::uint32_t pending = 0; // records not yet acked
    // Transactions with records folded into this entry after it (done, behind
    // it), and the sum of their commit times' offsets from commit_time.
    std::uint64_t folded_with_records = 0;
    double folded_commit_offsets = 0;
    bool had_records = false;
    bool committed = false;
    bool abandoned = false;    // never advances flushed_
  };
  using Entry = std::deque<Txn>::iterator;
  Entry locate(TxnId id);
  Txn* find(TxnId id) {
    auto it = locate(id);
    return it == txns_.end() ? nullptr : &*it;
  }
  const Txn* find(TxnId id) const { return const_cast<LsnLedger*>(this)->find(id); }
  void advance();
  // The entry may be done (committed, nothing in flight): folds it into the
  // one before it, or drops it when abandoned. The front is advance()'s.
  void fold(Entry it);
  void violate(std::string what);
  // Removes one record of txn from the counts; false (and a violation) when
  // there is none to remove.
  bool settle(TxnId txn, std::size_t bytes, const char* what);

  std::deque<Txn> txns_;       // ascending ids, oldest first
  std::optional<TxnId> open_;
  TxnId next_id_ = 1;
  Lsn flushed_;
  std::uint64_t inflight_records_ = 0;
  std::uint64_t inflight_bytes_ = 0;
  std::function<void(std::int64_t)> on_retired_;
  std::optional<std::string> violation_;
};

}  // namespace walrelay
