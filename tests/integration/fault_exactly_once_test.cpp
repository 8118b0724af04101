// Fault: exactly.once.support=required. Every event lands exactly once for a
// read_committed consumer (kcat's default, librdkafka's), whatever kills,
// restarts or freezes walrelay, PostgreSQL or the broker.
#include <csignal>
#include <random>

#include "test_util.hpp"

using namespace it;

namespace {

std::string eos_config(const Fixture& f, const std::string& extra = "") {
  return f.config("exactly.once.support=required\ntransaction.boundary.interval.ms=50\noffsets.storage.topic=" +
                  f.slot + ".offsets\nreconnect.backoff.ms=200\nreconnect.backoff.max.ms=2000\n" + extra);
}

// Exactly once: every id once, none missing, order per key.
void check_exactly_once(Fixture& f, const std::string& topic, std::chrono::milliseconds timeout = 180s) {
  auto recs = read_all(f, topic, timeout);
  auto seen = ids_of(recs);
  auto missing = missing_ids(f.db(), f.table, seen);
  std::cout << "exactly once: " << topic << " records=" << seen.records << " duplicates=" << seen.duplicates()
            << " missing=" << missing.size() << "\n";
  CHECK(seen.records > 0);
  CHECK(seen.duplicates() == 0);
  CHECK(missing.empty());
  check_order_per_key(recs);
}

}  // namespace

TEST_CASE("fault: exactly once - kill -9 ten times under load, transactions of 1 and 20 rows: every event once, in "
          "order per key",
          "[fault][eos]") {
  for (int per_txn : {1, 20}) {
    DYNAMIC_SECTION("rows per transaction: " << per_txn) {
      const long total = scaled(per_txn == 1 ? 4000 : 10000, per_txn == 1 ? 20000 : 100000);
      const int kills = 10;
      Fixture f;
      create_outbox(f.db(), f.table, "bigint");
      auto relay = std::make_unique<Walrelay>(eos_config(f));
      relay->start();
      relay->wait_streaming();
      Writer writer(f.table, "Eos", total, per_txn, per_txn == 1 ? 1ms : 5ms);
      std::mt19937 rng(std::random_device{}());
      int landed_in_flight = 0;
      for (int k = 0; k < kills && writer.committed() < total; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(200, 700)(rng)));
        // Kill with records relayed but not yet confirmed: an open or
        // committing Kafka transaction is then lost with the process.
        bool pending = eventually([&] { return relay->metric("walrelay_inflight_records").value_or(0) > 0 ||
                                               f.db().confirmed_flush(f.slot) < f.db().current_wal_lsn(); },
                                  3s, 1ms);
        relay->signal(SIGKILL);
        REQUIRE(relay->wait_exit(10s) == 128 + SIGKILL);
        landed_in_flight += pending;
        relay = std::make_unique<Walrelay>(eos_config(f));
        relay->start();
        wait_streaming_after(*relay, 0);
      }
      writer.join();
      REQUIRE(writer.failures() == 0);
      CHECK(landed_in_flight > 0);
      // One event after the last kill: the last walrelay commits it itself
      // (the writer may have finished before that walrelay started).
      f.db().exec(insert_event(f.table, "Eos", "last", "'{\"seq\": 0}'"));
      check_exactly_once(f, f.topic("Eos"));
      CHECK(eventually([&] {
        return relay->metric("walrelay_kafka_transactions_total{outcome=\"committed\"}").value_or(0) > 0;
      }, 30s));
    }
  }
}

TEST_CASE("fault: exactly once - PostgreSQL restarted with -m immediate under load: the slot goes back, nothing is "
          "relayed twice",
          "[fault][eos]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(eos_config(f));
  relay.start();
  relay.wait_streaming();
  Writer writer(f.table, "EosDb", std::numeric_limits<long>::max(), 1, 2ms);
  REQUIRE(eventually([&] { return relay.metric("walrelay_events_relayed_total").value_or(0) > 1000; }, 60s, 100ms));
  auto streams = count_of(relay.log(), "streaming: START_REPLICATION");
  Services::control("pg-restart immediate");
  f.reconnect();
  wait_streaming_after(relay, streams, 60s);
  REQUIRE(eventually([&] { return relay.metric("walrelay_exactly_once_skipped_transactions_total").value_or(0) > 0; },
                     60s, 200ms));  // the premise: the server sent committed transactions again
  auto relayed = relay.metric("walrelay_events_relayed_total").value_or(0);
  REQUIRE(eventually([&] { return relay.metric("walrelay_events_relayed_total").value_or(0) > relayed + 500; }, 60s,
                     100ms));
  writer.stop();
  check_exactly_once(f, f.topic("EosDb"));
}

TEST_CASE("fault: exactly once - the broker restarted in the middle of a transaction, then down 30 s: nothing twice, "
          "nothing missing",
          "[fault][eos]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  // A long boundary: the broker goes away with records in an open transaction.
  Walrelay relay(eos_config(f, "transaction.boundary.max.records=1000000\n"));
  relay.start();
  relay.wait_streaming();
  Writer writer(f.table, "EosBroker", std::numeric_limits<long>::max(), 20, 50ms);
  REQUIRE(eventually([&] { return relay.metric("walrelay_events_relayed_total").value_or(0) > 500; }, 60s, 100ms));
  {
    BrokerOutage restart;  // stopped and started at once: mid-transaction
  }
  REQUIRE(eventually([&] { return relay.metric("walrelay_events_relayed_total").value_or(0) > 2000; }, 120s, 200ms));
  {
    BrokerOutage outage;
    std::this_thread::sleep_for(std::chrono::seconds(scaled(30, 30)));  // the outage's length is the test
    CHECK(relay.running());
  }
  auto relayed = relay.metric("walrelay_events_relayed_total").value_or(0);
  REQUIRE(eventually([&] { return relay.metric("walrelay_events_relayed_total").value_or(0) > relayed + 500; }, 120s,
                     200ms));
  writer.stop();
  REQUIRE(writer.failures() == 0);
  check_exactly_once(f, f.topic("EosBroker"), 300s);
}

TEST_CASE("fault: exactly once - two walrelays on one slot, the active one frozen: the standby fences it, nothing it "
          "had pending ever becomes visible",
          "[fault][eos]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  // Kafka transactions of 2 s: the frozen one holds records in an open one.
  const std::string config = with_key(eos_config(f), "transaction.boundary.interval.ms", "2000");
  Walrelay first(config);
  first.start();
  first.wait_streaming();
  Walrelay second(config);
  second.start();
  REQUIRE(eventually([&] { return second.get("/slot").body.find("\"standby\"") != std::string::npos; }, 20s));
  Writer writer(f.table, "EosZombie", std::numeric_limits<long>::max(), 1, 5ms);
  REQUIRE(eventually([&] { return first.metric("walrelay_kafka_transactions_total{outcome=\"committed\"}").value_or(0) >= 2; },
                     60s, 100ms));
  REQUIRE(eventually([&] { return first.metric("walrelay_inflight_records").value_or(0) > 0 ||
                                  first.metric("walrelay_events_relayed_total").value_or(0) > 0; }, 10s, 1ms));
  first.signal(SIGSTOP);
  struct Continue {
    Walrelay& r;
    ~Continue() { r.signal(SIGCONT); }
  } cont{first};
  // The frozen walrelay's connection stays until wal_sender_timeout; end it
  // as the server would.
  REQUIRE(f.db().scalar("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '" +
                        f.slot + "'") == "t");
  wait_streaming_after(second, 0, 60s);
  REQUIRE(eventually([&] { return second.metric("walrelay_kafka_transactions_total{outcome=\"committed\"}").value_or(0) >= 1; },
                     60s, 100ms));
  first.signal(SIGCONT);
  // Fenced: it cannot commit again, and stops.
  CHECK(first.wait_exit(60s) == 1);
  CHECK(first.log().find("took over") != std::string::npos);
  writer.stop();
  check_exactly_once(f, f.topic("EosZombie"));
}

TEST_CASE("fault: exactly once - one transaction of 200000 rows: exact, with memory bounded as in at-least-once mode",
          "[fault][eos]") {
  const long rows = scaled(200000, 200000);
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(eos_config(f, "max.inflight.records=1000\n"));
  relay.start();
  relay.wait_streaming();
  long rss_start = proc_status_kb(relay.pid(), "VmRSS");
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) SELECT 'EosBig', 'k' || (g % "
              "16), 'x', jsonb_build_object('seq', g) FROM generate_series(1, " + std::to_string(rows) + ") g");
  auto end = f.db().current_wal_lsn();
  long rss_peak = 0;
  REQUIRE(eventually(
      [&] {
        rss_peak = std::max(rss_peak, proc_status_kb(relay.pid(), "VmRSS"));
        return f.db().confirmed_flush(f.slot) >= end;
      },
      600s, 250ms));
  std::cout << "exactly once big transaction: VmRSS start " << rss_start / 1024 << " MB, peak " << rss_peak / 1024
            << " MB\n";
  CHECK(rss_peak - rss_start < 64 * 1024);
  check_exactly_once(f, f.topic("EosBig"), 600s);
}

TEST_CASE("fault: exactly once - a position written for another database is refused with a clear error",
          "[fault][eos]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  const std::string topic = f.slot + ".offsets";
  const std::string key = "walrelay-" + Services::get().pg_database + "-" + f.slot;
  // A position from a cluster with another system identifier.
  REQUIRE(run_command("printf '%s' '" + key + "|{\"end_lsn\":\"0/100\",\"system_identifier\":\"123\"}' | kcat -b " +
                      Services::get().kafka + " -P -t '" + topic + "' -K '|' 2>&1")
              .status == 0);
  Walrelay relay(eos_config(f));
  relay.start();
  CHECK(relay.wait_exit(60s) == 3);
  auto log = relay.log();
  INFO(log.substr(log.size() > 3000 ? log.size() - 3000 : 0));
  CHECK(log.find("was written for the database with system identifier 123, this one is") != std::string::npos);
}
