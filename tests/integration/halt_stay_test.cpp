// halt.action=stay, the default: a halted walrelay that stays up (found by a
// review of the change; the first case failed on it).
//  - /healthz needs no token, and under stay it names the halt's reason for
//    as long as the process stays halted: row data of the poison row (here
//    its route value) is served to anyone who can reach the port, while
//    admin.token is set to keep such details to the readers of /readyz.
//  - a standby takes the slot from a halted walrelay that stays up, halts on
//    the same row, and nothing is confirmed past it; SIGTERM exits 3 on both.
#include <csignal>

#include "test_util.hpp"

using namespace it;

namespace {

void create_loose_outbox(Db& db, const std::string& table) {
  db.exec("CREATE TABLE " + table +
          " (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, aggregatetype text, aggregateid text, type text, "
          "payload jsonb)");
}

// The default, written out: the harness runs the other tests with
// halt.action=exit unless the file names the key.
std::string stay(const std::string& config) { return config + "halt.action=stay\n"; }

std::string good_row(const std::string& table, int n) {
  return insert_event(table, "Good", "k0", "jsonb_build_object('seq', " + std::to_string(n) + ")");
}

}  // namespace

TEST_CASE("halt: stay - unauthenticated healthz does not serve the halted row's data", "[halt]") {
  Fixture f;
  create_loose_outbox(f.db(), f.table);
  Walrelay relay(stay(f.config("errors.tolerance=none\nadmin.token=reader-token-123\n")));
  relay.start();
  relay.wait_streaming();
  // A route value Kafka rejects as a topic name: the halt reason quotes it.
  f.db().exec("INSERT INTO " + f.table +
              " (aggregatetype, aggregateid, type, payload) VALUES ('customer 4711 jane.doe@example.com', 'k', 't', "
              "'{}')");
  REQUIRE(eventually([&] { return relay.log().find("halted, staying up") != std::string::npos; }, 60s, 100ms));
  REQUIRE(relay.running());
  auto health = relay.get("/healthz");
  INFO("/healthz: " << health.status << " " << health.body);
  CHECK(health.status == 200);
  // The premise: /readyz, behind the token, names it.
  CHECK(relay.get("/readyz").status == 401);
  CHECK(relay.get("/readyz", "reader-token-123").body.find("jane.doe@example.com") != std::string::npos);
  CHECK(health.body.find("jane.doe@example.com") == std::string::npos);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit(60s) == 3);
}

TEST_CASE("halt: stay - a standby takes the slot from a halted walrelay that stays up, halts on the same row",
          "[halt]") {
  Fixture f;
  create_loose_outbox(f.db(), f.table);
  const std::string extra = "errors.tolerance=none\nreconnect.backoff.max.ms=500\n";
  Walrelay active(stay(f.config(extra)));
  active.start();
  active.wait_streaming();
  Walrelay standby(stay(f.config(extra)));
  standby.start();
  REQUIRE(eventually([&] { return standby.log().find("standby:") != std::string::npos; }, 30s, 100ms));
  f.db().exec(good_row(f.table, 0));
  REQUIRE(read_topic(f.topic("Good"), 1).size() == 1);
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES ('Good', NULL, 't', '{}')");
  // Past the bad row's commit: the slot must stay below it. (A position
  // taken before it is no bound: other tests' WAL may be confirmed.)
  auto after_bad = f.db().current_wal_lsn();
  f.db().exec(good_row(f.table, 2));
  REQUIRE(eventually([&] { return active.log().find("halted, staying up") != std::string::npos; }, 60s, 100ms));
  // The standby takes the slot and halts on the same row: the exact check
  // that nothing at or past it was confirmed (after_bad may lie past other
  // sessions' WAL), since the standby reads from the slot's position.
  REQUIRE(eventually([&] { return standby.log().find("halted, staying up") != std::string::npos; }, 60s, 100ms));
  CHECK(active.running());
  CHECK(standby.running());
  std::this_thread::sleep_for(3s);
  CHECK(f.db().confirmed_flush(f.slot) < after_bad);
  CHECK(count_records(f.topic("Good")) == 1);
  active.signal(SIGTERM);
  standby.signal(SIGTERM);
  CHECK(active.wait_exit(60s) == 3);
  CHECK(standby.wait_exit(60s) == 3);
  CHECK(f.db().confirmed_flush(f.slot) < after_bad);
}

TEST_CASE("halt: stay - exactly once, a standby with the same transactional id takes over from a halted "
          "walrelay that stays up mid source transaction",
          "[halt]") {
  Fixture f;
  create_loose_outbox(f.db(), f.table);
  const std::string extra = "errors.tolerance=none\nexactly.once.support=required\ntransaction.boundary.interval.ms=50\n"
                            "offsets.storage.topic=" + f.slot + ".offsets\nreconnect.backoff.ms=200\n"
                            "reconnect.backoff.max.ms=500\n";
  Walrelay active(stay(f.config(extra)));
  active.start();
  active.wait_streaming();
  Walrelay standby(stay(f.config(extra)));
  standby.start();
  REQUIRE(eventually([&] { return standby.log().find("standby:") != std::string::npos; }, 30s, 100ms));
  f.db().exec(good_row(f.table, 0));
  REQUIRE(read_topic(f.topic("Good"), 1).size() == 1);
  // Good rows, then the poison row, in one source transaction: the open Kafka
  // transaction holds part of it when the active one halts.
  f.db().exec("BEGIN;" + good_row(f.table, 1) + good_row(f.table, 2) + "INSERT INTO " + f.table +
              " (aggregatetype, aggregateid, type, payload) VALUES ('Good', NULL, 't', '{}'); COMMIT;");
  auto after_bad = f.db().current_wal_lsn();  // past that transaction's commit
  f.db().exec(good_row(f.table, 3));
  REQUIRE(eventually([&] { return active.log().find("halted, staying up") != std::string::npos; }, 60s, 100ms));
  REQUIRE(eventually([&] { return standby.log().find("halted, staying up") != std::string::npos; }, 90s, 100ms));
  std::this_thread::sleep_for(5s);
  CHECK(active.running());
  CHECK(f.db().confirmed_flush(f.slot) < after_bad);
  CHECK(count_records(f.topic("Good")) == 1);  // read_committed: nothing of the cut transaction
  active.signal(SIGTERM);
  standby.signal(SIGTERM);
  int a = active.wait_exit(60s), b = standby.wait_exit(60s);
  INFO("active log tail: " << active.log().substr(active.log().size() > 3000 ? active.log().size() - 3000 : 0));
  CHECK(a == 3);
  CHECK(b == 3);
  CHECK(f.db().confirmed_flush(f.slot) < after_bad);
  CHECK(count_records(f.topic("Good")) == 1);
}
