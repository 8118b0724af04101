// Fault: one transaction of many outbox rows, and a large transaction on an
// unrelated table. Both are relayed with walrelay's memory bounded by the
// in-flight limits, not by the size of the transaction.
#include <csignal>

#include "test_util.hpp"

using namespace it;

TEST_CASE("fault: a single transaction of many outbox rows and a large unrelated one, with bounded memory",
          "[fault][bigtxn]") {
  const long rows = scaled(200000, 1000000);
  const long unrelated_rows = scaled(500000, 2000000);
  const long inflight_limit = 10000;
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  std::string other = f.slot + "_unrelated";
  f.db().exec("CREATE TABLE " + other + " (id bigserial PRIMARY KEY, v text)");
  Walrelay relay(with_key(f.config("max.inflight.records=" + std::to_string(inflight_limit) + "\n"), "log.level", "info"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Big", "warm-up", "jsonb_build_object('seq', -1)"));
  REQUIRE(read_topic(f.topic("Big"), 1).size() == 1);
  long rss_start = proc_status_kb(relay.pid(), "VmRSS");

  // The unrelated transaction first: the server decodes it, pgoutput filters it.
  auto t0 = std::chrono::steady_clock::now();
  f.db().exec("INSERT INTO " + other + " (v) SELECT repeat('u', 100) FROM generate_series(1, " +
              std::to_string(unrelated_rows) + ")");
  auto after_unrelated = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= after_unrelated; }, 300s, 200ms));
  double unrelated_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  long hwm_unrelated = proc_status_kb(relay.pid(), "VmHWM");

  // One transaction of `rows` outbox rows, ~100-byte payloads, 64 keys.
  auto t1 = std::chrono::steady_clock::now();
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) SELECT 'Big', 'k' || (g % 64), "
              "'x', jsonb_build_object('seq', g, 'pad', repeat('p', 80)) FROM generate_series(1, " +
              std::to_string(rows) + ") g");
  auto after_big = f.db().current_wal_lsn();
  double inflight_peak = 0;
  long rss_peak = 0;
  REQUIRE(eventually(
      [&] {
        inflight_peak = std::max(inflight_peak, relay.metric("walrelay_inflight_records").value_or(0));
        rss_peak = std::max(rss_peak, proc_status_kb(relay.pid(), "VmRSS"));
        return f.db().confirmed_flush(f.slot) >= after_big;
      },
      900s, 250ms));
  double big_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  long hwm = proc_status_kb(relay.pid(), "VmHWM");

  auto recs = read_all(f, f.topic("Big"), 600s);
  auto seen = ids_of(recs);
  std::cout << "fault bigtxn: unrelated " << unrelated_rows << " rows confirmed in " << unrelated_s << "s (VmHWM "
            << hwm_unrelated / 1024 << " MB); outbox transaction of " << rows << " rows relayed and confirmed in "
            << big_s << "s (" << static_cast<long>(rows / big_s) << " events/s); VmRSS at start "
            << rss_start / 1024 << " MB, peak VmRSS " << rss_peak / 1024 << " MB, VmHWM " << hwm / 1024
            << " MB; inflight peak " << inflight_peak << " (limit " << inflight_limit << ")\n";
  CHECK(seen.count.size() == static_cast<std::size_t>(rows + 1));
  CHECK(missing_ids(f.db(), f.table, seen).empty());
  check_order_per_key(recs);
  // The bound held, and was tested: records were seen in flight.
  CHECK(inflight_peak > 0);
  CHECK(inflight_peak <= inflight_limit);
  // The bound, justified in docs/reliability.md: the idle process (~15 MB)
  // plus at most max.inflight.records records held by walrelay and
  // librdkafka (~130 bytes of key, value and headers, plus librdkafka's
  // per-message bookkeeping: well under 1 kB each, so < 10 MB for 10,000),
  // librdkafka's batches and the replication socket's buffers. Measured:
  // about 20 MB at 200,000 and at 1,000,000 rows. 48 MB fails if memory grew
  // with the transaction: its records alone would take > 25 MB at 200,000.
  CHECK(hwm < 48 * 1024);
  CHECK(relay.running());
}
