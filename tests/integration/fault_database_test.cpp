// Fault: the database goes away under walrelay (fast and immediate restarts,
// a terminated walsender) or goes silent without closing (a stopped
// walsender). walrelay reconnects with backoff and loses nothing; silence is
// detected within replication.timeout.ms.
#include <csignal>
#include <mutex>
#include <set>
#include <thread>

#include "test_util.hpp"

using namespace it;

TEST_CASE("fault: PostgreSQL restarted (fast, immediate) and the walsender terminated mid-run - nothing lost",
          "[fault][database][solo]") {
  const long progress = scaled(200, 2000);  // events relayed between two faults
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config("reconnect.backoff.ms=200\nreconnect.backoff.max.ms=2000\n"));
  relay.start();
  relay.wait_streaming();
  // ~1,000 rows/s until stopped, reconnecting through the restarts.
  Writer writer(f.table, "Db", std::numeric_limits<long>::max(), 10, 10ms);

  std::vector<std::string> faults = {"pg-restart fast", "terminate", "pg-restart immediate"};
  std::vector<double> recovery_s;
  // What /readyz answers through it all, sampled by a second thread.
  std::set<std::string> readyz_seen;
  std::mutex readyz_mutex;
  std::jthread readyz_poller([&](std::stop_token st) {
    while (!st.stop_requested()) {
      auto r = relay.get("/readyz");
      if (r.status != 0) {
        std::lock_guard lock(readyz_mutex);
        readyz_seen.insert(std::to_string(r.status) + " " + r.body.substr(0, r.body.find(':')));
      }
      std::this_thread::sleep_for(10ms);
    }
  });
  // Events flowing again, relayed by walrelay.
  auto wait_progress = [&] {
    // walrelay's own count of acknowledged records: cheap to poll, unlike re-reading the topic.
    auto relayed = [&] { return relay.metric("walrelay_events_relayed_total").value_or(0); };
    auto base = relayed();
    REQUIRE(eventually([&] { return relayed() > base + progress; }, 60s, 200ms));
  };
  for (auto& fault : faults) {
    wait_progress();
    auto streams = count_of(relay.log(), "streaming: START_REPLICATION");
    auto t0 = std::chrono::steady_clock::now();
    if (fault == "terminate") {
      REQUIRE(f.db().scalar("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '" +
                            f.slot + "'") == "t");
    } else {
      Services::control(fault);
      f.reconnect();
    }
    INFO("after " << fault);
    wait_streaming_after(relay, streams, 60s);
    recovery_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  wait_progress();
  writer.stop();
  readyz_poller.request_stop();
  readyz_poller.join();
  {
    std::string all;
    for (auto& r : readyz_seen) all += "[" + r + "] ";
    INFO("/readyz answers seen: " << all);
    CHECK(readyz_seen.count("200 ready\n"));
    // While the database was away, not ready, saying why.
    CHECK((readyz_seen.count("503 reconnecting") || readyz_seen.count("503 connecting")));
  }
  auto rows = std::stoul(f.db().scalar("SELECT count(*) FROM " + f.table));
  INFO("writer errors:\n" << writer.errors());
  // The writer really wrote through it all (its errors are the restarts').
  REQUIRE(rows >= static_cast<unsigned long>(4 * progress));
  auto recs = read_all(f, f.topic("Db"), 180s);
  auto seen = ids_of(recs);
  auto missing = missing_ids(f.db(), f.table, seen);
  auto reconnects = relay.metric("walrelay_reconnects_total").value_or(0);
  std::cout << "fault database: rows committed=" << f.db().scalar("SELECT count(*) FROM " + f.table)
            << " writer failures=" << writer.failures() << " records=" << seen.records
            << " duplicates=" << seen.duplicates() << " missing=" << missing.size() << " reconnects=" << reconnects
            << " back to streaming after: fast restart " << recovery_s[0] << "s, terminate " << recovery_s[1]
            << "s, immediate restart " << recovery_s[2] << "s\n";
  CHECK(missing.empty());
  CHECK(reconnects >= 3);
  check_order_per_key(recs);
  CHECK(relay.running());
}

TEST_CASE("fault: a walsender that goes silent (SIGSTOP) is declared dead within replication.timeout.ms",
          "[fault][database]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config("replication.timeout.ms=5000\nreconnect.backoff.ms=200\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Silent", "k0", "jsonb_build_object('seq', 0)"));
  REQUIRE(read_topic(f.topic("Silent"), 1).size() == 1);
  int pid = f.db().walsender_pid(f.slot);
  REQUIRE(pid > 0);
  auto reconnects_before = relay.metric("walrelay_reconnects_total").value_or(0);

  Frozen frozen(pid);  // never a stopped backend left behind
  auto t0 = std::chrono::steady_clock::now();
  // Rows committed while the walsender is frozen: they must arrive later.
  f.db().exec(insert_event(f.table, "Silent", "k0", "jsonb_build_object('seq', 1)"));
  REQUIRE(eventually([&] { return relay.log().find("connection declared dead") != std::string::npos; }, 15s, 100ms));
  double detected_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(eventually([&] { return relay.metric("walrelay_reconnects_total").value_or(0) > reconnects_before; }, 5s));
  // The frozen backend still holds the slot: walrelay waits as a standby.
  CHECK(eventually([&] { return relay.get("/slot").body.find("standby") != std::string::npos; }, 10s, 100ms));
  frozen.thaw();
  // Resumed, the old walsender finds its socket closed and exits; walrelay takes the slot.
  auto t1 = std::chrono::steady_clock::now();
  auto recs = read_topic(f.topic("Silent"), 2, 60s);
  double resumed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::cout << "fault silent walsender: declared dead after " << detected_s
            << "s (replication.timeout.ms=5000); streaming again " << resumed_s << "s after SIGCONT\n";
  // Declared dead at replication.timeout.ms (5 s) after the last message,
  // which came at most a ping interval (timeout / 3) before the freeze, and
  // noticed within one status tick (1 s).
  CHECK(detected_s > 5.0 - 5.0 / 3 - 0.5);
  CHECK(detected_s < 5.0 + 1.0 + 1.0);
  auto seen = ids_of(recs);
  CHECK(seen.count.size() == 2);
  CHECK(missing_ids(f.db(), f.table, seen).empty());
  CHECK(relay.running());
}

TEST_CASE("fault: an idle database is not a dead one - a quiet server is pinged at each silence and the session stays",
          "[fault][database][solo]") {
  // An idle server sends nothing: walrelay's updates count as replies for
  // the walsender, which then never pings. walrelay asks for a reply after
  // replication.timeout.ms / 3 of silence, at every silence: asking only at
  // the first one declared an idle session dead at 4/3 of the time-out
  // (every 40 s with the defaults) and reconnected.
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config("replication.timeout.ms=1500\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Quiet", "k0", "jsonb_build_object('seq', 0)"));
  REQUIRE(read_topic(f.topic("Quiet"), 1).size() == 1);
  int pid = f.db().walsender_pid(f.slot);
  REQUIRE(pid > 0);
  auto reconnects_before = relay.metric("walrelay_reconnects_total").value_or(0);

  // Five time-outs of an idle database (the slot monitor's query writes no WAL).
  std::this_thread::sleep_for(7500ms);  // the silence is the condition under test
  CHECK(relay.log().find("declared dead") == std::string::npos);
  CHECK(relay.metric("walrelay_reconnects_total").value_or(0) == reconnects_before);
  CHECK(f.db().walsender_pid(f.slot) == pid);  // the same session, as the server sees it

  f.db().exec(insert_event(f.table, "Quiet", "k0", "jsonb_build_object('seq', 1)"));
  auto recs = read_topic(f.topic("Quiet"), 2, 30s);
  CHECK(ids_of(recs).count.size() == 2);
  CHECK(relay.running());
}
