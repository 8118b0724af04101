#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <random>
#include <vector>

#include "walrelay/lsn_ledger.hpp"

using walrelay::LsnLedger;
using pgoutput::Lsn;

TEST_CASE("ledger: flushed follows fully acked transactions in commit order", "[ledger]") {
  LsnLedger l(Lsn{100});
  auto t1 = l.open(0);
  l.add_record(t1, 10);
  l.add_record(t1, 10);
  l.commit(t1, Lsn{200});
  auto t2 = l.open(0);
  l.add_record(t2, 5);
  l.commit(t2, Lsn{300});
  CHECK(l.flushed() == Lsn{100});
  CHECK(l.inflight_records() == 3);
  CHECK(l.inflight_bytes() == 25);

  // t2 acked first (another partition): flushed must not move.
  l.ack(t2, 5);
  CHECK(l.flushed() == Lsn{100});
  l.ack(t1, 10);
  CHECK(l.flushed() == Lsn{100});
  l.ack(t1, 10);
  CHECK(l.flushed() == Lsn{300});
  CHECK(l.inflight_records() == 0);
  CHECK(l.idle());
}

TEST_CASE("ledger: an open transaction holds the position even when its records are acked", "[ledger]") {
  LsnLedger l;
  auto t = l.open(0);
  l.add_record(t, 1);
  l.ack(t, 1);
  CHECK(l.flushed() == Lsn{0});
  l.server_position(Lsn{1000});  // keepalive mid-transaction must not confirm
  CHECK(l.flushed() == Lsn{0});
  l.commit(t, Lsn{500});
  CHECK(l.flushed() == Lsn{500});
}

TEST_CASE("ledger: idle keepalives confirm the server's WAL end", "[ledger]") {
  LsnLedger l(Lsn{10});
  l.server_position(Lsn{900});
  CHECK(l.flushed() == Lsn{900});
  l.server_position(Lsn{800});  // never backwards
  CHECK(l.flushed() == Lsn{900});
  auto t = l.open(0);
  l.add_record(t, 1);
  l.commit(t, Lsn{1000});
  l.server_position(Lsn{5000});  // record in flight: no
  CHECK(l.flushed() == Lsn{900});
  l.ack(t, 1);
  CHECK(l.flushed() == Lsn{1000});
  l.server_position(Lsn{5000});
  CHECK(l.flushed() == Lsn{5000});
}

TEST_CASE("ledger: empty transactions behind a slow one coalesce and release together", "[ledger]") {
  LsnLedger l;
  auto slow = l.open(0);
  l.add_record(slow, 1);
  l.commit(slow, Lsn{100});
  for (int i = 0; i < 10000; ++i) {
    auto t = l.open(0);
    l.commit(t, Lsn{static_cast<std::uint64_t>(200 + i)});
  }
  CHECK(l.pending_transactions() <= 2);
  CHECK(l.flushed() == Lsn{0});
  l.ack(slow, 1);
  CHECK(l.flushed() == Lsn{200 + 9999});
}

TEST_CASE("ledger: an abandoned transaction never advances the position", "[ledger]") {
  LsnLedger l(Lsn{50});
  auto t1 = l.open(0);
  l.add_record(t1, 1);
  l.commit(t1, Lsn{100});
  auto t2 = l.open(0);
  l.add_record(t2, 1);
  l.abandon_open();  // connection lost before t2's Commit
  l.ack(t1, 1);
  CHECK(l.flushed() == Lsn{100});
  // The server sends t2 again after the reconnect.
  auto t2b = l.open(0);
  l.add_record(t2b, 1);
  l.commit(t2b, Lsn{200});
  l.ack(t2b, 1);
  CHECK(l.flushed() == Lsn{100});  // the abandoned copy's record is still in flight
  l.ack(t2, 1);
  CHECK(l.flushed() == Lsn{200});
  CHECK(l.idle());
}

TEST_CASE("ledger: lag reports the oldest unacked commit", "[ledger]") {
  LsnLedger l;
  CHECK_FALSE(l.oldest_unacked_commit_time());
  auto t1 = l.open(111, Lsn{7});
  l.add_record(t1, 1);
  l.commit(t1, Lsn{100});
  auto t2 = l.open(222);
  l.add_record(t2, 1);
  l.commit(t2, Lsn{200});
  CHECK(l.oldest_unacked_commit_time() == 111);
  CHECK(l.commit_lsn_of(t1) == Lsn{7});
  l.ack(t1, 1);
  CHECK(l.oldest_unacked_commit_time() == 222);
}

TEST_CASE("ledger: randomized acks never confirm past an unacked record", "[ledger]") {
  // Model check against a brute-force oracle.
  std::mt19937 rng(42);
  for (int round = 0; round < 50; ++round) {
    LsnLedger l;
    struct Rec { LsnLedger::TxnId txn; std::uint64_t end; bool acked = false; };
    std::vector<Rec> recs;
    std::vector<std::pair<LsnLedger::TxnId, std::uint64_t>> txns;
    std::uint64_t lsn = 0;
    for (int i = 0; i < 30; ++i) {
      auto t = l.open(0);
      int n = static_cast<int>(rng() % 4);
      lsn += 10;
      for (int r = 0; r < n; ++r) {
        l.add_record(t, 1);
        recs.push_back({t, lsn});
      }
      l.commit(t, Lsn{lsn});
      txns.push_back({t, lsn});
    }
    std::shuffle(recs.begin(), recs.end(), rng);
    for (auto& r : recs) {
      l.ack(r.txn, 1);
      r.acked = true;
      std::uint64_t lowest_unacked_end = UINT64_MAX;
      for (auto& o : recs)
        if (!o.acked) lowest_unacked_end = std::min(lowest_unacked_end, o.end);
      // flushed must be below every unacked record's transaction end
      REQUIRE(l.flushed().value < lowest_unacked_end);
    }
    CHECK(l.flushed().value == lsn);
  }
}

TEST_CASE("ledger: a transaction retires once, in commit order, only with records", "[ledger]") {
  LsnLedger l(Lsn{100});
  std::vector<std::int64_t> retired;
  l.on_retired([&](std::int64_t commit_time) { retired.push_back(commit_time); });
  auto t1 = l.open(1001);
  l.add_record(t1, 1);
  l.commit(t1, Lsn{200});
  auto t2 = l.open(1002);  // no outbox rows: confirms, but is not an event latency
  l.commit(t2, Lsn{300});
  auto t3 = l.open(1003);
  l.add_record(t3, 1);
  l.commit(t3, Lsn{400});
  auto t4 = l.open(1004);
  l.add_record(t4, 1);  // abandoned: the server sends it again
  l.abandon_open();

  l.ack(t3, 1);  // acked before t1: waits for it
  CHECK(retired.empty());
  l.ack(t1, 1);
  CHECK(retired == std::vector<std::int64_t>{1001, 1003});
  l.ack(t4, 1);
  CHECK(retired == std::vector<std::int64_t>{1001, 1003});
  CHECK(l.flushed() == Lsn{400});
}

TEST_CASE("ledger: a double acknowledgement is a violation that freezes the position, in every build", "[ledger]") {
  LsnLedger l(Lsn{100});
  auto t1 = l.open(0);
  l.add_record(t1, 1);
  l.commit(t1, Lsn{200});
  auto t2 = l.open(0);
  l.add_record(t2, 1);
  l.commit(t2, Lsn{300});
  l.ack(t1, 1);
  CHECK(l.flushed() == Lsn{200});
  CHECK_FALSE(l.violation());
  l.ack(t1, 1);  // again: t1 is gone, and this must not count as t2's
  REQUIRE(l.violation());
  CHECK(l.violation()->find("acknowledgement") != std::string::npos);
  l.ack(t2, 1);
  CHECK(l.flushed() == Lsn{200});  // frozen: nothing past the violation is confirmable
  l.server_position(Lsn{400});
  CHECK(l.flushed() == Lsn{200});
}

TEST_CASE("ledger: records added to a committed or unknown transaction are violations", "[ledger]") {
  LsnLedger l;
  auto t = l.open(0);
  l.commit(t, Lsn{10});
  l.add_record(t, 1);
  REQUIRE(l.violation());
  LsnLedger m;
  m.add_record(42, 1);
  CHECK(m.violation());
  LsnLedger n;
  auto u = n.open(0);
  n.ack(u, 1);  // nothing in flight
  CHECK(n.violation());
}

TEST_CASE("ledger: withdraw undoes an addition the sink did not take", "[ledger]") {
  LsnLedger l(Lsn{5});
  auto t = l.open(0);
  l.add_record(t, 7);
  l.withdraw(t, 7);
  CHECK(l.inflight_records() == 0);
  CHECK(l.inflight_bytes() == 0);
  l.commit(t, Lsn{50});
  CHECK(l.flushed() == Lsn{50});
  CHECK_FALSE(l.violation());
}

TEST_CASE("ledger: reset after a replay forgets every transaction, keeps the position and never reuses ids",
          "[ledger]") {
  LsnLedger l(Lsn{100});
  auto t1 = l.open(0);
  l.add_record(t1, 1);
  l.add_record(t1, 1);
  l.commit(t1, Lsn{200});
  l.ack(t1, 1);  // one delivered, one failed for good: t1 can never complete
  CHECK(l.flushed() == Lsn{100});
  l.reset();
  CHECK(l.inflight_records() == 0);
  CHECK(l.pending_transactions() == 0);
  CHECK(l.flushed() == Lsn{100});
  auto t2 = l.open(0);
  CHECK(t2 > t1);
  l.add_record(t2, 1);
  l.commit(t2, Lsn{200});
  l.ack(t2, 1);
  CHECK(l.flushed() == Lsn{200});
  CHECK_FALSE(l.violation());
}

TEST_CASE("ledger: a reset to a position puts flushed back there (exactly once after an abort)", "[ledger]") {
  LsnLedger l(Lsn{100});
  auto t1 = l.open(0);
  l.add_record(t1, 10);
  l.commit(t1, Lsn{200});
  l.ack(t1, 10);  // acknowledged into a Kafka transaction that was then aborted
  REQUIRE(l.flushed() == Lsn{200});
  l.reset(Lsn{100});
  CHECK(l.flushed() == Lsn{100});
  CHECK(l.idle());
  // The replay brings it back only as its records are acknowledged again.
  auto again = l.open(0);
  l.add_record(again, 10);
  l.commit(again, Lsn{200});
  CHECK(l.flushed() == Lsn{100});
  l.ack(again, 10);
  CHECK(l.flushed() == Lsn{200});
}

TEST_CASE("ledger: one stuck record keeps the ledger bounded behind it, never confirms past it, and releases "
          "everything once acknowledged",
          "[ledger]") {
  LsnLedger l(Lsn{100});
  std::uint64_t retired = 0;
  l.on_retired([&](std::int64_t) { ++retired; });
  // A record retried forever (a partition with no leader).
  auto stuck = l.open(1, Lsn{150});
  l.add_record(stuck, 10);
  l.commit(stuck, Lsn{200});
  // A million later transactions, each acknowledged after the next one opened
  // (acks arrive behind the stream), most with a record, some with none.
  const std::uint64_t n = 1'000'000;
  std::optional<LsnLedger::TxnId> previous;
  std::size_t largest = 0;
  std::uint64_t with_records = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    auto t = l.open(static_cast<std::int64_t>(i + 2));
    const bool record = i % 10 != 0;
    if (record) {
      l.add_record(t, 10);
      ++with_records;
    }
    l.commit(t, Lsn{300 + i});
    if (previous) l.ack(*previous, 10);
    previous = record ? std::optional(t) : std::nullopt;
    largest = std::max(largest, l.pending_transactions());
    if (i % 100'000 == 0) REQUIRE(l.flushed() == Lsn{100});
  }
  if (previous) l.ack(*previous, 10);
  INFO("largest ledger: " << largest << " transactions");
  CHECK(largest <= 3);
  CHECK(l.pending_transactions() <= 2);
  CHECK(l.flushed() == Lsn{100});  // never past the stuck record
  CHECK(l.oldest_unacked_commit_time() == 1);
  CHECK(l.inflight_records() == 1);
  CHECK(retired == 0);
  l.ack(stuck, 10);
  CHECK(l.flushed() == Lsn{300 + n - 1});  // straight to the end
  CHECK(l.idle());
  CHECK(l.pending_transactions() == 0);
  CHECK(retired == with_records + 1);  // each transaction with records counted once
  CHECK_FALSE(l.violation());
}

TEST_CASE("ledger: randomized opens, commits, abandons and acks confirm exactly what an oracle does, in a "
          "ledger bounded by what is in flight",
          "[ledger]") {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    LsnLedger l(Lsn{10});
    struct Txn {
      LsnLedger::TxnId id;
      std::uint64_t end = 0;
      int pending = 0;
      bool committed = false, abandoned = false;
    };
    std::vector<Txn> txns;            // every transaction, in order
    std::vector<std::size_t> records;  // in flight: index into txns
    std::uint64_t lsn = 10, oracle = 10;
    std::size_t abandoned = 0;
    std::optional<std::size_t> open;
    for (int step = 0; step < 400; ++step) {
      const unsigned op = rng() % 10;
      if (!open && op < 3) {
        txns.push_back({l.open(0)});
        open = txns.size() - 1;
      } else if (open && op < 5) {
        l.add_record(txns[*open].id, 1);
        ++txns[*open].pending;
        records.push_back(*open);
      } else if (open && op < 7) {
        lsn += 10;
        l.commit(txns[*open].id, Lsn{lsn});
        txns[*open].end = lsn;
        txns[*open].committed = true;
        open.reset();
      } else if (open && op == 7 && rng() % 4 == 0) {
        l.abandon_open();
        txns[*open].committed = txns[*open].abandoned = true;
        ++abandoned;
        open.reset();
      } else if (!records.empty()) {
        std::size_t k = rng() % records.size();
        std::size_t i = records[k];
        records.erase(records.begin() + static_cast<std::ptrdiff_t>(k));
        l.ack(txns[i].id, 1);
        --txns[i].pending;
      }
      // The oracle: the newest end such that it and every earlier transaction
      // are committed and fully acknowledged; abandoned ones confirm nothing.
      for (auto& t : txns) {
        if (!t.committed || t.pending > 0) break;
        if (!t.abandoned) oracle = std::max(oracle, t.end);
      }
      REQUIRE_FALSE(l.violation());
      REQUIRE(l.flushed().value == oracle);
      // Bounded: an entry per transaction with records in flight, one done
      // entry ahead of each, the open one.
      REQUIRE(l.pending_transactions() <= 2 * records.size() + abandoned + 2);
    }
  }
}
