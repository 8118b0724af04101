// Fault: walrelay killed with SIGKILL at random moments while events are
// written, restarted each time. Nothing committed may be missing from Kafka;
// the duplicates (at-least-once replay) must stay within the in-flight bound.
#include <csignal>
#include <random>

#include "test_util.hpp"

using namespace it;

TEST_CASE("fault: kill -9 at random moments during a run - every committed event arrives, duplicates bounded",
          "[fault][crash]") {
  const long total = scaled(20000, 100000);
  const int kills = static_cast<int>(scaled(4, 10));
  const long inflight_limit = 500;
  const int status_interval_ms = 200;
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  const std::string cfg = f.config("max.inflight.records=" + std::to_string(inflight_limit) +
                                   "\nstatus.update.interval.ms=" + std::to_string(status_interval_ms) + "\n");
  auto relay = std::make_unique<Walrelay>(cfg);
  relay->start();
  relay->wait_streaming();

  // About 1,000 events a second in transactions of 20, until the last kill
  // and restart are behind: the writer may not end before a kill (a loaded
  // machine's restarts take their time, and a kill after the writer ended
  // finds nothing in flight, as CI run 31 saw), so it writes up to ten times
  // `total` and is stopped once `total` rows and the kills are done.
  Writer writer(f.table, "Crash", 10 * total, 20, 20ms);
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.0, 1.0);
  std::vector<double> restart_s;
  int landed_in_flight = 0;
  auto started = std::chrono::steady_clock::now();
  for (int k = 0; k < kills; ++k) {
    // A random moment of the writer's progress, in the k-th of kills + 1
    // slices of it (by rows committed, not by time: restarts take a varying
    // time on a loaded machine, and a kill after the writer ended would find
    // nothing in flight); then the kill waits for records in flight, so that
    // it can lose something if walrelay is wrong.
    const auto target = static_cast<long>(static_cast<double>(total) * (k + jitter(rng)) / (kills + 1));
    REQUIRE(eventually([&] { return writer.committed() >= target; }, 300s, 1ms));
    // The slot's position first, then the wait: the kill follows the
    // scrape that saw records in flight at once (CI run 44 counted 3 kills
    // of 4 when the two queries in between, on a loaded machine, outlasted
    // the records' acknowledgement, or a stalled writer outlasted 5 s).
    auto confirmed = f.db().confirmed_flush(f.slot), wal = f.db().current_wal_lsn();
    bool in_flight = eventually([&] { return relay->metric("walrelay_inflight_records").value_or(0) > 0; }, 30s, 1ms);
    relay->signal(SIGKILL);
    if (in_flight && confirmed < wal) ++landed_in_flight;
    REQUIRE(relay->wait_exit(10s) == 128 + SIGKILL);
    auto t0 = std::chrono::steady_clock::now();
    relay = std::make_unique<Walrelay>(cfg);  // a fresh log and admin port
    relay->start();
    // The slot is released when PostgreSQL notices the closed socket; until
    // then the new process waits as a standby, then streams.
    wait_streaming_after(*relay, 0);
    restart_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    INFO("kill " << k + 1 << " at " << writer.committed() << " committed rows");
  }
  REQUIRE(eventually([&] { return writer.committed() >= total; }, 300s, 1ms));
  writer.stop();
  REQUIRE(writer.failures() == 0);
  const long written = writer.committed();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const double rate = written / seconds;
  // The premise: the kills landed while records were unacknowledged.
  CHECK(landed_in_flight == kills);

  // A kill sends again at most what was sent but not yet confirmed: the
  // records in flight (max.inflight.records) and those acknowledged since the
  // last status update (status.update.interval.ms at the writer's rate; three
  // times that, for a status update delayed by a busy loop).
  const auto bound = static_cast<std::size_t>(kills * (inflight_limit + 3 * rate * status_interval_ms / 1000.0));
  auto recs = read_all(f, f.topic("Crash"), 300s);
  auto seen = ids_of(recs);
  auto missing = missing_ids(f.db(), f.table, seen);
  double worst_restart = *std::max_element(restart_s.begin(), restart_s.end());
  std::cout << "fault crash: events=" << written << " kills=" << kills << " records=" << seen.records
            << " duplicates=" << seen.duplicates() << " missing=" << missing.size()
            << " bound=" << bound << " slowest restart to streaming=" << worst_restart << "s\n";
  INFO("duplicates: " << seen.duplicates() << " over " << kills << " kills; bound " << bound << " at " << rate
                      << " events/s");
  CHECK(missing.empty());
  CHECK(seen.count.size() == static_cast<std::size_t>(written));
  CHECK(seen.duplicates() <= bound);
  CHECK(bound < static_cast<std::size_t>(written / 2));  // a bound that means something
  check_order_per_key(recs);
  CHECK(relay->running());
}
