#include "walrelay/lsn_ledger.hpp"

#include <algorithm>

namespace walrelay {

LsnLedger::TxnId LsnLedger::open(std::int64_t commit_time_us, Lsn commit_lsn) {
  if (open_) abandon_open();  // a Begin without Commit: the stream restarted
  TxnId id = next_id_++;
  txns_.push_back(Txn{id, Lsn{}, commit_time_us, commit_lsn});
  open_ = id;
  return id;
}

LsnLedger::Txn* LsnLedger::find(TxnId id) {
  // Ids are dense and ascending, but entries are popped from the front and
  // empty committed ones coalesce, so search from the back (newest is likeliest).
  if (txns_.empty() || id < txns_.front().id || id > txns_.back().id) return nullptr;
  auto it = std::lower_bound(txns_.begin(), txns_.end(), id, [](const Txn& t, TxnId v) { return t.id < v; });
  return (it != txns_.end() && it->id == id) ? &*it : nullptr;
}

void LsnLedger::violate(std::string what) {
  if (!violation_) violation_ = std::move(what);
}

void LsnLedger::add_record(TxnId txn, std::size_t bytes) {
  Txn* t = find(txn);
  if (!t || t->committed) {
    violate("a record was added to transaction " + std::to_string(txn) + ", which is " +
            (t ? "already committed" : "not open"));
    return;
  }
  ++t->pending;
  t->had_records = true;
  ++inflight_records_;
  inflight_bytes_ += bytes;
}

void LsnLedger::commit(TxnId txn, Lsn end_lsn) {
  Txn* t = find(txn);
  if (!t) return;
  t->committed = true;
  t->end_lsn = end_lsn;
  if (open_ == txn) open_.reset();
  // Coalesce a run of empty committed transactions into one entry so that a
  // busy non-outbox workload behind a slow record does not grow the deque.
  if (t->pending == 0 && txns_.size() >= 2) {
    Txn& prev = txns_[txns_.size() - 2];
    if (&txns_.back() == t && prev.committed && !prev.abandoned && prev.pending == 0) {
      prev.end_lsn = std::max(prev.end_lsn, end_lsn);
      txns_.pop_back();
    }
  }
  advance();
}

void LsnLedger::abandon_open() {
  if (!open_) return;
  if (Txn* t = find(*open_)) {
    t->committed = true;
    t->abandoned = true;
  }
  open_.reset();
  advance();
}

bool LsnLedger::settle(TxnId txn, std::size_t bytes, const char* what) {
  Txn* t = find(txn);
  if (inflight_records_ == 0 || !t || t->pending == 0) {
    violate(std::string(what) + " of a record of transaction " + std::to_string(txn) + ", which has " +
            (t ? "no record in flight" : "no entry (already complete or never opened)") + "; " +
            std::to_string(inflight_records_) + " records in flight in all");
    return false;
  }
  --inflight_records_;
  inflight_bytes_ -= std::min<std::uint64_t>(bytes, inflight_bytes_);
  --t->pending;
  if (t == &txns_.front()) advance();
  return true;
}

void LsnLedger::ack(TxnId txn, std::size_t bytes) { settle(txn, bytes, "acknowledgement"); }

void LsnLedger::withdraw(TxnId txn, std::size_t bytes) { settle(txn, bytes, "withdrawal"); }

void LsnLedger::reset() {
  txns_.clear();
  open_.reset();
  inflight_records_ = 0;
  inflight_bytes_ = 0;
}

void LsnLedger::reset(Lsn flushed) {
  reset();
  flushed_ = flushed;
}

void LsnLedger::advance() {
  while (!txns_.empty() && !violation_) {
    Txn& t = txns_.front();
    if (!t.committed || t.pending > 0) break;
    if (!t.abandoned) {
      flushed_ = std::max(flushed_, t.end_lsn);
      if (t.had_records && on_retired_) on_retired_(t.commit_time);
    }
    txns_.pop_front();
  }
}

void LsnLedger::server_position(Lsn wal_end) {
  if (txns_.empty() && !open_ && !violation_) flushed_ = std::max(flushed_, wal_end);
}

std::optional<std::int64_t> LsnLedger::oldest_unacked_commit_time() const {
  for (const Txn& t : txns_)
    if (t.pending > 0 && !t.abandoned) return t.commit_time;
  return std::nullopt;
}

bool LsnLedger::had_records(TxnId txn) const {
  const Txn* t = find(txn);
  return t && t->had_records;
}

std::optional<pgoutput::Lsn> LsnLedger::commit_lsn_of(TxnId txn) const {
  const Txn* t = find(txn);
  if (!t) return std::nullopt;
  return t->commit_lsn;
}

}  // namespace walrelay
