#include "walrelay/lsn_ledger.hpp"

#include <algorithm>

#include "walrelay/mutation.hpp"

namespace walrelay {

LsnLedger::TxnId LsnLedger::open(std::int64_t commit_time_us, Lsn commit_lsn) {
  if (open_) abandon_open();  // a Begin without Commit: the stream restarted
  TxnId id = next_id_++;
  txns_.push_back(Txn{id, Lsn{}, commit_time_us, commit_lsn});
  open_ = id;
  return id;
}

LsnLedger::Entry LsnLedger::locate(TxnId id) {
  // Ids are ascending but not dense: entries are popped from the front and
  // done ones fold into the entry before them.
  if (txns_.empty() || id < txns_.front().id || id > txns_.back().id) return txns_.end();
  auto it = std::lower_bound(txns_.begin(), txns_.end(), id, [](const Txn& t, TxnId v) { return t.id < v; });
  return (it != txns_.end() && it->id == id) ? it : txns_.end();
}

void LsnLedger::fold(Entry it) {
  if (mutation::active(mutation::Break::ledger_unbounded)) return;
  if (it == txns_.end() || it == txns_.begin() || !it->committed || it->pending > 0) return;
  if (it->abandoned) {
    // It confirms nothing and waits for nothing more: gone. The entry after
    // it may now fold into the one before.
    fold(txns_.erase(it));
    return;
  }
  Txn& prev = *std::prev(it);
  if (!prev.committed || prev.abandoned) return;  // an abandoned entry confirms nothing: it cannot carry an end
  // The slot can be confirmed past `it` only once `prev` is done too: one
  // entry, prev's records in flight, its end. Its retired transactions come
  // along, their commit times as offsets from prev's.
  prev.end_lsn = std::max(prev.end_lsn, it->end_lsn);
  const double shift = static_cast<double>(it->commit_time - prev.commit_time);
  if (it->had_records) {
    ++prev.folded_with_records;
    prev.folded_commit_offsets += shift;
  }
  prev.folded_with_records += it->folded_with_records;
  prev.folded_commit_offsets += it->folded_commit_offsets + shift * static_cast<double>(it->folded_with_records);
  txns_.erase(it);
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
  fold(locate(txn));
  advance();
}

void LsnLedger::abandon_open() {
  if (!open_) return;
  auto it = locate(*open_);
  if (it != txns_.end()) {
    it->committed = true;
    it->abandoned = true;
  }
  open_.reset();
  fold(it);
  advance();
}

bool LsnLedger::settle(TxnId txn, std::size_t bytes, const char* what) {
  auto it = locate(txn);
  Txn* t = it == txns_.end() ? nullptr : &*it;
  if (inflight_records_ == 0 || !t || t->pending == 0) {
    violate(std::string(what) + " of a record of transaction " + std::to_string(txn) + ", which has " +
            (t ? "no record in flight" : "no entry (already complete or never opened)") + "; " +
            std::to_string(inflight_records_) + " records in flight in all");
    return false;
  }
  --inflight_records_;
  inflight_bytes_ -= std::min<std::uint64_t>(bytes, inflight_bytes_);
  --t->pending;
  fold(it);
  advance();
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
      if (on_retired_) {
        if (t.had_records) on_retired_(t.commit_time);
        if (t.folded_with_records > 0) {
          const auto mean = t.commit_time + static_cast<std::int64_t>(t.folded_commit_offsets /
                                                                      static_cast<double>(t.folded_with_records));
          for (std::uint64_t i = 0; i < t.folded_with_records; ++i) on_retired_(mean);
        }
      }
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
