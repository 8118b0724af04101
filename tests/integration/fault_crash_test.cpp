// Fault: walrelay killed with SIGKILL at random moments while events are
// written, restarted each time. Nothing committed may be missing from Kafka;
// the duplicates (at-least-once replay) must stay within the in-flight bound.
#include <csignal>
#include <random>

#include "fault_util.hpp"

using namespace fault;

TEST_CASE("fault: kill -9 at random moments during a run - every committed event arrives, duplicates bounded",
          "[fault][crash]") {
  const long total = scaled(20000, 100000);
  const int kills = static_cast<int>(scaled(4, 10));
  const long inflight_limit = 5000;
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  const std::string cfg = f.config("max.inflight.records=" + std::to_string(inflight_limit) + "\n");
  auto relay = std::make_unique<Walrelay>(cfg);
  relay->start();
  relay->wait_streaming();

  // About 2,000 events a second in transactions of 20: the run lasts long
  // enough (total / 2,000 s) for the kills to land in the middle of it.
  Writer writer(f.table, "Crash", total, 20, 10ms);
  std::mt19937 rng(std::random_device{}());
  auto run_ms = total / 2;  // expected duration of the writer
  std::uniform_int_distribution<long> delay(run_ms / kills / 4, run_ms / kills);
  std::vector<double> restart_s;
  for (int k = 0; k < kills; ++k) {
    // A deliberate random moment, not a synchronisation.
    std::this_thread::sleep_for(std::chrono::milliseconds(delay(rng)));
    relay->signal(SIGKILL);
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
  writer.join();
  REQUIRE(writer.committed() == total);

  auto recs = read_topic(f.topic("Crash"), static_cast<std::size_t>(total), 300s);
  auto seen = ids_of(recs);
  auto missing = missing_ids(f.db(), f.table, seen);
  double worst_restart = *std::max_element(restart_s.begin(), restart_s.end());
  std::cout << "fault crash: events=" << total << " kills=" << kills << " records=" << seen.records
            << " duplicates=" << seen.duplicates() << " missing=" << missing.size()
            << " bound=" << inflight_limit * kills << " slowest restart to streaming=" << worst_restart << "s\n";
  INFO("duplicates: " << seen.duplicates() << " over " << kills << " kills");
  CHECK(missing.empty());
  CHECK(seen.count.size() == static_cast<std::size_t>(total));
  // A kill loses at most what was sent but not yet confirmed: the records in
  // flight (max.inflight.records) and those acknowledged since the last
  // status update (about a second at ~2,000 events/s, under the limit here).
  CHECK(seen.duplicates() <= static_cast<std::size_t>(inflight_limit * kills));
  check_order_per_key(recs);
  CHECK(relay->running());
}
