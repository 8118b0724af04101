// Fault: two walrelay processes on one slot (active/passive), and a slot that
// is dropped or invalidated under walrelay: a clear fatal error and exit 3,
// never a silently recreated slot.
#include <csignal>

#include "test_util.hpp"

using namespace it;

TEST_CASE("fault: a second walrelay on the slot waits as standby and takes over after kill -9, losing nothing",
          "[fault][standby]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay first(f.config());
  first.start();
  first.wait_streaming();
  Walrelay second(f.config());
  second.start();
  HttpResponse ready, slot;
  REQUIRE(eventually([&] { return (slot = second.get("/slot")).body.find("\"standby\"") != std::string::npos; }, 20s));
  ready = second.get("/readyz");
  INFO("standby /readyz: " << ready.status << " " << ready.body << "\n/slot: " << slot.body);
  CHECK(ready.status == 503);
  CHECK(ready.body.find("standby") != std::string::npos);
  CHECK(eventually([&] { return first.get("/readyz").status == 200; }, 10s));

  const long rows = scaled(4000, 20000);
  Writer writer(f.table, "Standby", rows, 10, 10ms);
  REQUIRE(eventually([&] { return first.metric("walrelay_events_relayed_total").value_or(0) > 500; }, 60s, 200ms));
  first.signal(SIGKILL);
  REQUIRE(first.wait_exit(10s) == 128 + SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  wait_streaming_after(second, 0, 30s);
  double takeover_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(eventually([&] { return second.get("/readyz").status == 200; }, 10s));
  writer.join();
  REQUIRE(writer.failures() == 0);
  REQUIRE(writer.committed() == rows);
  auto recs = read_all(f, f.topic("Standby"), 120s);
  auto seen = ids_of(recs);
  auto missing = missing_ids(f.db(), f.table, seen);
  std::cout << "fault standby: takeover " << takeover_s << "s after kill -9 of the active process; records="
            << seen.records << " duplicates=" << seen.duplicates() << " missing=" << missing.size() << "\n";
  CHECK(takeover_s < 10);
  CHECK(missing.empty());
  check_order_per_key(recs);
}

TEST_CASE("fault: the slot dropped while walrelay reconnects: exit 3, the slot is not recreated", "[fault][slot]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  // A backoff long enough to drop the slot between the disconnect and the reconnect.
  Walrelay relay(f.config("reconnect.backoff.ms=3000\nreconnect.backoff.max.ms=3000\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Drop", "k0", "jsonb_build_object('seq', 0)"));
  REQUIRE(read_topic(f.topic("Drop"), 1).size() == 1);

  // Terminate the walsender, then drop the slot as soon as it is released.
  REQUIRE(f.db().scalar("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '" +
                        f.slot + "'") == "t");
  REQUIRE(eventually(
      [&] {
        try {
          f.db().exec("SELECT pg_drop_replication_slot('" + f.slot + "')");
          return true;
        } catch (const std::exception&) {
          return false;  // still active for a moment
        }
      },
      3s, 10ms));
  CHECK(relay.wait_exit(30s) == 3);
  auto log = relay.log();
  INFO(log.substr(log.size() > 3000 ? log.size() - 3000 : 0));
  CHECK(log.find("halted: slot.name: replication slot " + f.slot + " is missing, but walrelay created it") !=
        std::string::npos);
  CHECK(f.db().scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'") == "0");
}

TEST_CASE("fault: the slot invalidated by max_slot_wal_keep_size: a clear error, exit 3, not recreated",
          "[fault][slot][solo]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  ServerSettings keep_size{{"max_slot_wal_keep_size", "1MB"}};  // for this test only
  Walrelay relay(with_key(f.config("reconnect.backoff.ms=200\n"), "slot.status.interval.ms", "500"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Lost", "k0", "jsonb_build_object('seq', 0)"));
  REQUIRE(read_topic(f.topic("Lost"), 1).size() == 1);

  // walrelay falls behind: frozen, it confirms nothing while WAL is written.
  Frozen frozen(relay);
  f.db().exec("CREATE TABLE " + f.slot + "_filler (v text)");
  f.db().exec(insert_event(f.table, "Lost", "k0", "jsonb_build_object('seq', 1)"));
  REQUIRE(eventually(
      [&] {
        f.db().exec("INSERT INTO " + f.slot + "_filler SELECT repeat('x', 1000) FROM generate_series(1, 3000)");
        f.db().exec("SELECT pg_switch_wal()");
        f.db().exec("CHECKPOINT");
        return f.db().scalar("SELECT wal_status FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'") ==
               "lost";
      },
      60s, 10ms));
  frozen.thaw();
  CHECK(relay.wait_exit(30s) == 3);
  auto log = relay.log();
  INFO(log.substr(log.size() > 3000 ? log.size() - 3000 : 0));
  // Whichever notices first (the slot poller, the catalog check or
  // START_REPLICATION's refusal), the words are the same.
  CHECK(log.find("halted: slot.name: replication slot " + f.slot + " has been invalidated (") != std::string::npos);
  // Still the invalidated slot, not a new one.
  CHECK(f.db().scalar("SELECT wal_status FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'") == "lost");
}

TEST_CASE("fault: a slot dropped while walrelay is stopped - every restart exits 3 creating nothing, --reset-slot "
          "accepts the gap",
          "[fault][slot]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config());
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Reset", "before", "jsonb_build_object('seq', 0)"));
  REQUIRE(read_topic(f.topic("Reset"), 1).size() == 1);
  relay.signal(SIGTERM);
  REQUIRE(relay.wait_exit() == 0);
  // The marker lives in the database, beside the slot.
  CHECK(f.db().scalar("SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = '" +
                      f.slot + "'").find("walrelay.slot=" + f.slot + " created_lsn=") != std::string::npos);

  f.db().exec("SELECT pg_drop_replication_slot('" + f.slot + "')");
  f.db().exec(insert_event(f.table, "Reset", "in-the-gap", "jsonb_build_object('seq', 1)"));
  // A supervisor that restarts on any exit: each start refuses, none creates a slot.
  // Watched until the exit or a slot, whichever comes first: a start that
  // made a slot would stream from it, and the rest would mean nothing.
  auto slots = [&] { return f.db().scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'"); };
  for (int start = 0; start < 3; ++start) {
    relay.start();
    eventually([&] { return !relay.running() || slots() != "0"; }, 30s, 20ms);
    REQUIRE(slots() == "0");
    CHECK(relay.wait_exit(30s) == 3);
  }
  auto log = relay.this_run_log();
  INFO(log);
  CHECK(log.find("is missing, but walrelay created it") != std::string::npos);
  CHECK(log.find("walrelay --reset-slot") != std::string::npos);
  CHECK(log.find("streaming: START_REPLICATION") == std::string::npos);

  // --check says the same, and creates nothing either.
  Walrelay check(f.config());
  CHECK(check.run({"--check", "--config", check.config_path()}) == 1);
  CHECK(check.log().find("is missing, but walrelay created it") != std::string::npos);

  // The operator's explicit act: the slot is created, the gap is logged.
  Walrelay reset(f.config());
  CHECK(reset.run({"--reset-slot", "--config", reset.config_path()}) == 0);
  INFO(reset.log());
  CHECK(reset.log().find("reset by the operator: events committed after") != std::string::npos);
  CHECK(f.db().scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'") == "1");
  // A second --reset-slot finds a usable slot and leaves it alone.
  auto confirmed = f.db().confirmed_flush(f.slot);
  CHECK(reset.run({"--reset-slot", "--config", reset.config_path()}) == 0);
  CHECK(reset.this_run_log().find("nothing to reset") != std::string::npos);
  CHECK(f.db().confirmed_flush(f.slot) == confirmed);

  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Reset", "after", "jsonb_build_object('seq', 2)"));
  REQUIRE(eventually([&] { return count_records(f.topic("Reset")) >= 2; }, 30s));
  auto recs = read_topic(f.topic("Reset"), 2);
  std::set<std::string> keys;
  for (auto& r : recs) keys.insert(r.key.value_or(""));
  CHECK(keys == std::set<std::string>{"before", "after"});  // the gap is the gap
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}

TEST_CASE("fault: an invalidated slot stays invalidated across restarts until --reset-slot replaces it",
          "[fault][slot][solo]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  ServerSettings keep_size{{"max_slot_wal_keep_size", "1MB"}};  // for this test only
  Walrelay relay(f.config());
  relay.start();
  relay.wait_streaming();
  relay.signal(SIGTERM);
  REQUIRE(relay.wait_exit() == 0);
  auto confirmed = f.db().scalar("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '" +
                                 f.slot + "'");
  f.db().exec("CREATE TABLE " + f.slot + "_filler (v text)");
  REQUIRE(eventually(
      [&] {
        f.db().exec("INSERT INTO " + f.slot + "_filler SELECT repeat('x', 1000) FROM generate_series(1, 3000)");
        f.db().exec("SELECT pg_switch_wal()");
        f.db().exec("CHECKPOINT");
        return f.db().scalar("SELECT wal_status FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'") ==
               "lost";
      },
      60s, 10ms));
  for (int start = 0; start < 2; ++start) {
    relay.start();
    CHECK(relay.wait_exit(30s) == 3);
    CHECK(f.db().scalar("SELECT wal_status FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'") == "lost");
  }
  CHECK(count_of(relay.log(), "has been invalidated") >= 2);

  Walrelay reset(f.config());
  CHECK(reset.run({"--reset-slot", "--config", reset.config_path()}) == 0);
  INFO(reset.log());
  CHECK(reset.log().find("events committed after " + confirmed + " and before") != std::string::npos);
  CHECK(f.db().scalar("SELECT wal_status FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'") != "lost");
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Lost", "after-reset", "jsonb_build_object('seq', 0)"));
  REQUIRE(read_topic(f.topic("Lost"), 1).size() == 1);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}

TEST_CASE("fault: creating the slot waits for a long transaction with no time-out, saying what it waits for",
          "[fault][slot][solo]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  // A transaction with an xid, open while walrelay creates its slot: the
  // server cannot make the slot consistent until it ends.
  Db holder;
  holder.exec("BEGIN; INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES "
              "('Held', 'k', 'x', '{}')");
  Walrelay relay(f.config());
  relay.start();
  REQUIRE(eventually([&] { return relay.log().find("still being created") != std::string::npos; }, 30s));
  auto log = relay.log();
  INFO(log);
  CHECK(log.find("transaction(s) with an xid are running now") != std::string::npos);
  CHECK(relay.running());
  CHECK(relay.get("/readyz").status == 503);
  holder.exec("COMMIT");
  relay.wait_streaming();
  CHECK(relay.log().find("timed out") == std::string::npos);
  f.db().exec(insert_event(f.table, "Held", "after", "'{}'"));
  auto recs = read_topic(f.topic("Held"), 1);
  REQUIRE(recs.size() == 1);
  CHECK(recs[0].key == std::optional<std::string>("after"));
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}

TEST_CASE("fault: halted on a dropped slot and still draining - walrelay_slot_invalid 1, walrelay_halted 1, /healthz "
          "503 naming why, then exit 3",
          "[fault][slot][solo]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config("reconnect.backoff.ms=1000\nreconnect.backoff.max.ms=1000\nshutdown.timeout.ms=60000\n"));
  relay.start();
  relay.wait_streaming();
  BrokerOutage outage;  // a record in flight keeps the halted relay draining
  f.db().exec(insert_event(f.table, "Invalid", "k", "jsonb_build_object('seq', 0)"));
  REQUIRE(eventually([&] { return relay.metric("walrelay_inflight_records").value_or(0) == 1; }, 20s));
  REQUIRE(f.db().scalar("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '" +
                        f.slot + "'") == "t");
  REQUIRE(eventually(
      [&] {
        try {
          f.db().exec("SELECT pg_drop_replication_slot('" + f.slot + "')");
          return true;
        } catch (const std::exception&) {
          return false;
        }
      },
      5s, 10ms));
  REQUIRE(eventually([&] { return relay.metric("walrelay_slot_invalid") == std::optional<double>(1); }, 30s));
  CHECK(relay.metric("walrelay_halted") == std::optional<double>(1));
  CHECK(relay.metric("walrelay_ready") == std::optional<double>(0));
  auto health = relay.get("/healthz");
  CHECK(health.status == 503);
  CHECK(health.body.rfind("halted: slot.name: replication slot " + f.slot + " is missing, but walrelay created it",
                          0) == 0);
  CHECK(relay.running());
  outage.restart();
  CHECK(relay.wait_exit(60s) == 3);
  CHECK(f.db().scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'") == "0");
}

TEST_CASE("fault: a role that does not own the publication relays all the same - the missing slot marker is a "
          "warning and walrelay_slot_marker_missing, and the owner's statement records it",
          "[fault][slot]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  f.db().exec("CREATE PUBLICATION " + f.slot + " FOR TABLE " + f.table + " WITH (publish = 'insert')");
  TemporaryRole temporary(f, f.slot + "_relay");
  const std::string& role = temporary.name;
  const std::string config = with_key(f.config("publication.autocreate.mode=disabled\n"), "database.user", role);
  Walrelay relay(config);
  relay.start();
  relay.wait_streaming();
  CHECK(relay.metric("walrelay_slot_marker_missing").value_or(-1) == 1);
  auto log = relay.log();
  auto at = log.find("have the owner run: ");
  REQUIRE(at != std::string::npos);
  f.db().exec(insert_event(f.table, "Unowned", "k", "'{\"seq\": 1}'"));
  CHECK(read_topic(f.topic("Unowned"), 1, 60s).size() == 1);
  // The owner records the slot with the statement from the warning; the
  // next start finds the marker.
  const std::string marker = log.substr(at + 20, log.find('\n', at) - at - 20);
  auto end = marker.find("; walrelay relays without the marker");
  f.db().exec(marker.substr(0, end));
  relay.signal(SIGTERM);
  REQUIRE(relay.wait_exit(30s) == 0);
  relay.start();
  relay.wait_streaming();
  CHECK(relay.metric("walrelay_slot_marker_missing").value_or(-1) == 0);
}
