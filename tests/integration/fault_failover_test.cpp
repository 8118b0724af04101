// The database's own high availability: walrelay reading a hot standby
// (16+), a failover slot that survives the primary's failover (17+), and a
// failover without one. They need a streaming standby
// (scripts/services.sh standby start) and a given major, so they are hidden
// from the default run; scripts/test.sh runs them on the majors they need:
//   PG_MAJOR=17 scripts/services.sh start && build/tests/integration_tests "[failover]"
#include <csignal>

#include "test_util.hpp"

using namespace it;

namespace {

// The standby for the life of the object, and the primary back as it was at
// its end (a failover test stops and replaces it).
struct Standby {
  std::string port;
  Standby() {
    Services::control("standby start");
    port = Services::current("WALRELAY_TEST_STANDBY_PGPORT");
    REQUIRE_FALSE(port.empty());
  }
  ~Standby() {
    try {
      Services::control("standby stop fast");
    } catch (...) {
    }
    try {
      Services::control("start pg");  // the old primary back on its port, if it was stopped
    } catch (...) {
    }
  }
};

// walrelay given the primary and the standby as database.hostname's hosts.
std::string both_hosts_config(Fixture& f, const Standby& standby, const std::string& extra) {
  const auto& s = Services::get();
  return with_key(with_key(f.config("reconnect.backoff.max.ms=1000\n" + extra),
                           "database.hostname", s.pg_host + "," + s.pg_host),
                  "database.port", s.pg_port + "," + standby.port);
}

// The standby's copy of the slot is kept through a promotion once it is
// synchronized and no longer temporary: the primary's slot must have moved
// past a running-transactions record. Events of `type` are written meanwhile.
void wait_slot_synced(Fixture& f, Db& on_standby, const std::string& type) {
  REQUIRE(eventually(
      [&] {
        f.db().exec(insert_event(f.table, type, "warm-up", "jsonb_build_object('seq', -1)"));
        f.db().exec("SELECT pg_log_standby_snapshot()");
        return on_standby.scalar("SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = '" +
                                 f.slot + "'") == "t";
      },
      90s, 500ms));
}

// Waits until the standby has replayed everything the primary wrote so far.
void replayed(Db& primary, Db& standby) {
  auto end = primary.current_wal_lsn();
  REQUIRE(eventually([&] { return parse_lsn(standby.scalar("SELECT pg_last_wal_replay_lsn()")) >= end; }, 30s));
}

}  // namespace

TEST_CASE("failover: walrelay on a hot standby relays the primary's events, its lag includes replay, and it goes on "
          "after the standby is promoted",
          "[.standby]") {
  if (Services::pg_major() < 16) FAIL("decoding on a standby needs PostgreSQL 16 or later");
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  // On a standby walrelay can change nothing: the publication comes from the primary.
  f.db().exec("CREATE PUBLICATION " + f.slot + " FOR TABLE " + f.table + " WITH (publish = 'insert')");
  Standby standby;
  Db on_standby("", standby.port);
  replayed(f.db(), on_standby);
  const std::string config = with_key(f.config("publication.autocreate.mode=disabled\n"), "database.port", standby.port);

  // First start: the slot is made on the standby; the marker cannot be, and
  // walrelay says what to run on the primary.
  Walrelay relay(config);
  relay.start();
  REQUIRE(eventually([&] { return !relay.running(); }, 120s, 100ms));
  CHECK(relay.wait_exit() == 3);
  auto log = relay.log();
  auto at = log.find("On the primary, run once: ");
  INFO(log.substr(log.size() > 3000 ? log.size() - 3000 : 0));
  REQUIRE(at != std::string::npos);
  auto sql = log.substr(at + 26, log.find('\n', at) - at - 26);
  f.db().exec(sql);
  replayed(f.db(), on_standby);

  relay.start();
  relay.wait_streaming();
  for (int i = 0; i < 20; ++i)
    f.db().exec(insert_event(f.table, "Standby", "k" + std::to_string(i % 4), "jsonb_build_object('seq', " +
                                                                                   std::to_string(i) + ")"));
  REQUIRE(eventually([&] { return count_records(f.topic("Standby")) == 20; }, 60s, 200ms));

  // Replay paused on the standby: the primary's WAL arrives there but is not
  // decoded. The lag walrelay reports grows with what was received.
  on_standby.exec("SELECT pg_wal_replay_pause()");
  struct Resume {
    Db& db;
    ~Resume() {
      try {
        db.exec("SELECT pg_wal_replay_resume()");
      } catch (...) {
      }
    }
  } resume{on_standby};
  f.db().exec("CREATE TABLE " + f.slot + "_filler (v text)");
  auto from = f.db().current_wal_lsn();
  f.db().exec("INSERT INTO " + f.slot + "_filler SELECT repeat(md5(g::text), 32) FROM generate_series(1, 10000) g");
  f.db().exec(insert_event(f.table, "Standby", "paused", "jsonb_build_object('seq', 100)"));
  auto written = f.db().current_wal_lsn() - from;
  CHECK(eventually([&] { return relay.metric("walrelay_slot_lag_bytes").value_or(0) >= written; }, 30s, 200ms));
  CHECK(count_records(f.topic("Standby")) == 20);  // not replayed, not decoded
  on_standby.exec("SELECT pg_wal_replay_resume()");
  REQUIRE(eventually([&] { return count_records(f.topic("Standby")) == 21; }, 60s, 200ms));

  // The standby promoted: walrelay reconnects if it must, and relays what is
  // written there.
  Services::control("standby promote");
  Db promoted("", standby.port);
  promoted.exec(insert_event(f.table, "Standby", "after-promotion", "jsonb_build_object('seq', 101)"));
  REQUIRE(eventually([&] { return count_records(f.topic("Standby")) >= 22; }, 60s, 200ms));
  auto seen = ids_of(read_topic(f.topic("Standby"), 22));
  CHECK(missing_ids(promoted, f.table, seen).empty());
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
  promoted.exec("SELECT pg_drop_replication_slot('" + f.slot + "')");
}

TEST_CASE("failover: a failover slot survives the primary's hard stop - walrelay finds the promoted standby and "
          "every committed event is in Kafka",
          "[.failover]") {
  if (Services::pg_major() < 17) FAIL("failover slots need PostgreSQL 17 or later");
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Standby standby;
  const std::string config = both_hosts_config(f, standby, "slot.failover=true\n");
  Walrelay relay(config);
  relay.start();
  relay.wait_streaming();
  Db on_standby("", standby.port);
  wait_slot_synced(f, on_standby, "Failover");
  {
    Walrelay check(config);
    CHECK(check.run({"--check", "--config", check.config_path()}) == 0);
    INFO(check.log());
    CHECK(check.log().find("problem:") == std::string::npos);
  }

  // Under load, the primary stops hard and the standby is promoted.
  Writer writer(f.table, "Failover", 1000000, 1, 5ms);
  REQUIRE(eventually([&] { return writer.committed() > 300; }, 60s));
  // Counted before the stop: walrelay may find the promoted server before
  // the promotion's command has returned here.
  auto streams = count_of(relay.log(), "streaming: START_REPLICATION");
  Services::control("primary stop immediate");
  writer.stop();
  Services::control("standby promote");
  Db promoted("", standby.port);
  wait_streaming_after(relay, streams, 120s);
  // The synchronized slot: created once, at the first start, never again.
  CHECK(count_of(relay.log(), "slot=" + f.slot + " does not exist") == 1);
  promoted.exec(insert_event(f.table, "Failover", "after", "jsonb_build_object('seq', 1000000)"));

  // Every event the promoted server has, in Kafka: the primary's WAL that
  // never reached the standby was never relayed either
  // (synchronized_standby_slots), so nothing confirmed is lost.
  auto end = promoted.current_wal_lsn();
  REQUIRE(eventually([&] { return promoted.confirmed_flush(f.slot) >= end; }, 120s));
  auto recs = read_topic(f.topic("Failover"), 1);
  auto seen = ids_of(recs);
  auto missing = missing_ids(promoted, f.table, seen);
  std::cout << "failover: rows on the promoted server " << promoted.scalar("SELECT count(*) FROM " + f.table)
            << ", records " << seen.records << ", duplicates " << seen.duplicates() << ", missing "
            << missing.size() << "\n";
  CHECK(missing.empty());
  check_order_per_key(recs);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
  promoted.exec("SELECT pg_drop_replication_slot('" + f.slot + "')");
}

TEST_CASE("failover: without a failover slot the promoted standby has no slot - walrelay exits 3, never makes a new one",
          "[.standby]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Standby standby;
  Walrelay relay(both_hosts_config(f, standby, ""));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "NoFailover", "k", "jsonb_build_object('seq', 0)"));
  REQUIRE(read_topic(f.topic("NoFailover"), 1).size() == 1);
  Db on_standby("", standby.port);
  replayed(f.db(), on_standby);  // the publication and its slot marker are there too

  Services::control("primary stop immediate");
  Services::control("standby promote");
  CHECK(relay.wait_exit(120s) == 3);
  auto log = relay.log();
  INFO(log.substr(log.size() > 3000 ? log.size() - 3000 : 0));
  CHECK(log.find("is missing, but walrelay created it") != std::string::npos);
  Db promoted("", standby.port);
  CHECK(promoted.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'") == "0");
}

// An asynchronous failover that loses WAL walrelay had relayed: the standby
// stopped receiving, the primary did not wait for it, walrelay sent the
// primary's last events and confirmed them there. The promoted server's
// timeline forks below that position, so the new events it sends lie below
// it too: the position of the old server must not confirm them on the new
// one before the broker has them (a crash, a replay or a cleaning of the
// outbox would then lose them).
TEST_CASE("failover: an asynchronous failover that loses relayed WAL - the promoted server's slot is confirmed only "
          "past what it sent and Kafka acknowledged",
          "[.failover]") {
  if (Services::pg_major() < 17) FAIL("failover slots need PostgreSQL 17 or later");
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Standby standby;
  Walrelay relay(both_hosts_config(f, standby, "slot.failover=true\nstatus.update.interval.ms=200\n"));
  relay.start();
  relay.wait_streaming();
  Db on_standby("", standby.port);
  wait_slot_synced(f, on_standby, "Fork");

  // The standby stops receiving WAL (its slot's copy stops with it), and the
  // primary no longer holds logical decoding back for it.
  Services::control("standby unsync");
  on_standby.exec("ALTER SYSTEM SET primary_conninfo = ''");
  on_standby.exec("SELECT pg_reload_conf()");
  REQUIRE(eventually(
      [&] {
        return f.db().scalar("SELECT count(*) FROM pg_stat_replication WHERE application_name = "
                             "'walrelay_standby'") == "0";
      },
      30s, 100ms));
  // The primary writes on; walrelay relays it and confirms it there.
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) SELECT 'Lost', 'k' || (g % "
              "4), 'x', jsonb_build_object('seq', g, 'pad', repeat('p', 1000)) FROM generate_series(1, 3000) g");
  const auto relayed_end = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= relayed_end; }, 60s, 100ms));

  auto streams = count_of(relay.log(), "streaming: START_REPLICATION");
  {
    // Records of the old primary still in flight at the failover: they
    // settle before walrelay streams from the promoted server.
    BrokerFreeze frozen;
    for (int i = 0; i < 10; ++i)
      f.db().exec(insert_event(f.table, "Lost", "in-flight", "jsonb_build_object('seq', " + std::to_string(5000 + i) +
                                                                 ")"));
    REQUIRE(eventually([&] { return relay.metric("walrelay_inflight_records").value_or(0) >= 10; }, 30s, 50ms));
    Services::control("primary stop immediate");
    Services::control("standby promote");
    REQUIRE(eventually([&] { return relay.log().find("every record in flight settles") != std::string::npos; },
                       120s, 100ms));
    CHECK(count_of(relay.log(), "streaming: START_REPLICATION") == streams);
  }
  Db promoted("", standby.port);
  wait_streaming_after(relay, streams, 120s);
  const auto fork_start = promoted.current_wal_lsn();
  // The premise: the new timeline's WAL lies below what walrelay confirmed.
  REQUIRE(fork_start < relayed_end);

  {
    // Kafka frozen: the promoted server's events stay unacknowledged while
    // walrelay reads them and sends status updates.
    BrokerFreeze frozen;
    // Idle before them, walrelay may confirm up to here (the walsender's
    // keepalives), never further.
    const auto before_events = promoted.current_wal_lsn();
    for (int i = 0; i < 20; ++i)
      promoted.exec(insert_event(f.table, "Fork", "k" + std::to_string(i % 4),
                                 "jsonb_build_object('seq', " + std::to_string(i) + ")"));
    const auto written = promoted.current_wal_lsn();
    REQUIRE(written < relayed_end);
    // Read and handed to the frozen broker (helper-46: walrelay_received_lsn
    // would show the old server's position, proving nothing).
    REQUIRE(eventually([&] { return relay.metric("walrelay_inflight_records").value_or(0) >= 20; }, 30s, 50ms));
    const double updates = relay.metric("walrelay_status_updates_total").value_or(0);
    REQUIRE(eventually([&] { return relay.metric("walrelay_status_updates_total").value_or(0) >= updates + 3; }, 30s,
                       50ms));
    INFO("fork at " << fork_start << ", relayed to " << relayed_end << ", events from " << before_events
                    << ", promoted slot confirmed " << promoted.confirmed_flush(f.slot));
    CHECK(promoted.confirmed_flush(f.slot) <= before_events);
  }
  // Thawed: every event of the promoted server arrives, and then the slot
  // follows.
  const auto end = promoted.current_wal_lsn();
  REQUIRE(eventually([&] { return promoted.confirmed_flush(f.slot) >= end; }, 120s, 100ms));
  auto recs = read_topic(f.topic("Fork"), 1);
  auto seen = ids_of(recs);
  CHECK(missing_ids(promoted, f.table, seen).empty());
  CHECK(relay.log().find("another server than before") != std::string::npos);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
  promoted.exec("SELECT pg_drop_replication_slot('" + f.slot + "')");
}
