// Retention (table.retention.policy=delete): walrelay deletes the outbox rows
// the broker has acknowledged, once older than table.retention.ms, and never
// a row it has not sent.
#include <csignal>

#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "walrelay/source/outbox_retention.hpp"

using namespace it;
using json = nlohmann::json;

namespace {

std::string retention_config(const Fixture& f, const std::string& extra = "") {
  return f.config("table.retention.policy=delete\ntable.retention.ms=1000\ntable.retention.interval.ms=200\n"
                  "table.retention.batch.size=100\ntable.field.event.timestamp=created_at\n" + extra);
}

// Rows of transactions begun before walrelay's first retention run stay (it
// cannot know they were sent): a test writes after it.
void wait_floor(Walrelay& relay) {
  REQUIRE(eventually([&] { return relay.log().find("retention: rows of transactions from xid") != std::string::npos; },
                     30s, 20ms));
}

long rows_in(Fixture& f, const std::string& table) { return std::stol(f.db().scalar("SELECT count(*) FROM " + table)); }

// The `seq` of every record, with how many records carried it.
std::map<long, int> seqs_of(const std::vector<KafkaRecord>& recs) {
  std::map<long, int> out;
  for (auto& r : recs) {
    auto doc = json::parse(r.value.value_or(""), nullptr, false);
    if (doc.is_object() && doc.contains("seq")) out[doc["seq"].get<long>()]++;
  }
  return out;
}

}  // namespace

TEST_CASE("retention: rows acknowledged and older than table.retention.ms are deleted in batches while writers run "
          "- every event arrived, the table ends empty, the metrics count them",
          "[relay][retention]") {
  for (const bool partitioned : {false, true}) {
    DYNAMIC_SECTION((partitioned ? "a partitioned outbox" : "a plain outbox")) {
      Fixture f;
      if (partitioned) {
        // Partitions share ctids: a batch must not take another partition's
        // row that happens to have the same one.
        f.db().exec("CREATE TABLE " + f.table + " (id bigint GENERATED ALWAYS AS IDENTITY, aggregatetype text NOT "
                    "NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb, created_at timestamptz NOT "
                    "NULL DEFAULT now(), PRIMARY KEY (id)) PARTITION BY HASH (id); CREATE TABLE " + f.table +
                    "_p0 PARTITION OF " + f.table + " FOR VALUES WITH (MODULUS 2, REMAINDER 0); CREATE TABLE " +
                    f.table + "_p1 PARTITION OF " + f.table + " FOR VALUES WITH (MODULUS 2, REMAINDER 1)");
      } else {
        create_outbox(f.db(), f.table, "bigint");
      }
      Walrelay relay(retention_config(f));
      relay.start();
      relay.wait_streaming();
      wait_floor(relay);
      const long total = 3000;
      Writer writer(f.table, "Kept", total, 10, 10ms);
      writer.join();
      REQUIRE(writer.failures() == 0);
      // Rows go while the writer runs and after: in the end all of them.
      REQUIRE(eventually([&] { return rows_in(f, f.table) == 0; }, 60s, 100ms));
      auto recs = read_all(f, f.topic("Kept"));
      auto seen = seqs_of(recs);
      CHECK(seen.size() == static_cast<std::size_t>(total));
      CHECK(seen.begin()->first == 0);
      CHECK(seen.rbegin()->first == total - 1);
      CHECK(relay.metric("walrelay_retention_rows_deleted_total").value_or(-1) == total);
      CHECK(relay.metric("walrelay_retention_runs_total{outcome=\"ok\"}").value_or(0) > 0);
      CHECK(relay.metric("walrelay_retention_table_bytes").value_or(0) > 0);
      CHECK(relay.metric("walrelay_retention_runs_total{outcome=\"error\"}").value_or(0) == 0);
    }
  }
}

TEST_CASE("retention: an unsent row is never deleted - a transaction opened before the window and committed with an "
          "old created_at, and rows written while the broker is frozen, stay until acknowledged, then go",
          "[fault][retention][solo]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(retention_config(f));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  // A transaction open across several runs, its row an hour old by the clock.
  Db late;
  late.exec("BEGIN; INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload, created_at) VALUES "
            "('Late', 'late', 'Created', '{\"seq\": 0}', now() - interval '1 hour')");
  const double runs = relay.metric("walrelay_retention_runs_total{outcome=\"ok\"}").value_or(0);
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_runs_total{outcome=\"ok\"}").value_or(0) >= runs + 3; },
                     30s, 50ms));
  long expected = 1;
  {
    BrokerFreeze frozen;
    late.exec("COMMIT");
    for (int seq = 1; seq <= 20; ++seq, ++expected)
      f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload, created_at) VALUES ('Late', "
                  "'k" + std::to_string(seq % 3) + "', 'Created', '{\"seq\": " + std::to_string(seq) +
                  "}', now() - interval '1 hour')");
    // Runs that find the relay behind their fence: nothing may go.
    const double behind = relay.metric("walrelay_retention_runs_total{outcome=\"behind\"}").value_or(0);
    REQUIRE(eventually(
        [&] { return relay.metric("walrelay_retention_runs_total{outcome=\"behind\"}").value_or(0) >= behind + 3; },
        60s, 50ms));
    CHECK(rows_in(f, f.table) == expected);
    CHECK(relay.metric("walrelay_retention_rows_deleted_total").value_or(0) == 0);
  }
  auto recs = read_all(f, f.topic("Late"));
  auto seen = seqs_of(recs);
  CHECK(seen.size() == static_cast<std::size_t>(expected));
  REQUIRE(eventually([&] { return rows_in(f, f.table) == 0; }, 30s, 100ms));
  CHECK(relay.metric("walrelay_retention_rows_deleted_total").value_or(0) == expected);
}

TEST_CASE("retention: the standby deletes nothing, and the walrelay that takes over deletes what it relays",
          "[relay][retention]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  // The active one keeps every row (a day's retention; the rows are an hour old).
  Walrelay active(with_key(retention_config(f), "table.retention.ms", "86400000"));
  active.start();
  active.wait_streaming();
  Walrelay standby(retention_config(f));
  standby.start();
  REQUIRE(eventually([&] { return standby.get("/slot").body.find("\"standby\"") != std::string::npos; }, 20s));
  for (int seq = 0; seq < 10; ++seq)
    f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload, created_at) VALUES "
                "('Standby', 'k" + std::to_string(seq % 3) + "', 'Created', '{\"seq\": " + std::to_string(seq) +
                "}', now() - interval '1 hour')");
  auto recs = read_all(f, f.topic("Standby"));
  CHECK(seqs_of(recs).size() == 10);
  // Acknowledged and old enough for the standby's retention, whose interval
  // has passed as often as the active one's runs: nothing deleted.
  const double runs = active.metric("walrelay_retention_runs_total{outcome=\"ok\"}").value_or(0);
  REQUIRE(eventually([&] { return active.metric("walrelay_retention_runs_total{outcome=\"ok\"}").value_or(0) >= runs + 5; },
                     30s, 50ms));
  CHECK(rows_in(f, f.table) == 10);
  CHECK(standby.metric("walrelay_retention_rows_deleted_total").value_or(0) == 0);
  active.signal(SIGKILL);
  REQUIRE(active.wait_exit(10s) == 128 + SIGKILL);
  wait_streaming_after(standby, 0, 60s);
  wait_floor(standby);
  // What it relays itself, it deletes; the rows before its floor it leaves
  // (it cannot tell them from rows the slot never carried).
  for (int seq = 10; seq < 13; ++seq)
    f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload, created_at) VALUES "
                "('Standby', 'k', 'Created', '{\"seq\": " + std::to_string(seq) + "}', now() - interval '1 hour')");
  REQUIRE(eventually([&] { return standby.metric("walrelay_retention_rows_deleted_total").value_or(0) == 3; }, 30s,
                     50ms));
  CHECK(rows_in(f, f.table) == 10);
}

TEST_CASE("retention: the fence's condition - a row inserted after a SAVEPOINT of a transaction still running when "
          "the snapshot was taken is not acknowledged by it, nor a row committed before the floor",
          "[relay][retention]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto insert = [&](Db& db, const std::string& key) {
    db.exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES ('Fence', '" + key +
            "', 'Created', '{}')");
  };
  insert(f.db(), "before-floor");
  const auto floor = std::stoull(f.db().scalar("SELECT pg_snapshot_xmax(pg_current_snapshot())::text"));
  insert(f.db(), "ended");
  // Its row's xmin is a subtransaction's: the snapshot does not list it.
  Db running;
  running.exec("BEGIN; SAVEPOINT s; SELECT 1");
  insert(running, "running");
  const std::string snapshot = f.db().scalar("SELECT pg_current_snapshot()::text");
  running.exec("COMMIT");
  auto rows = f.db().exec("SELECT aggregateid FROM " + f.table + " WHERE " +
                          walrelay::acknowledged_rows_condition(snapshot, floor) + " ORDER BY 1");
  REQUIRE(rows.size() == 1);
  CHECK(rows[0][0] == std::optional<std::string>("ended"));
}

TEST_CASE("retention: rows committed before walrelay first streamed the slot (a backlog at a first start with "
          "no_data) were never sent, and are never deleted",
          "[relay][retention]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  for (int seq = 0; seq < 5; ++seq)
    f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload, created_at) VALUES "
                "('Backlog', 'k', 'Created', '{\"seq\": " + std::to_string(seq) + "}', now() - interval '1 hour')");
  Walrelay relay(retention_config(f));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  // Rows it does send go, the backlog stays.
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload, created_at) VALUES "
              "('Backlog', 'k', 'Created', '{\"seq\": 5}', now() - interval '1 hour')");
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_deleted_total").value_or(0) == 1; }, 30s, 50ms));
  const double runs = relay.metric("walrelay_retention_runs_total{outcome=\"ok\"}").value_or(0);
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_runs_total{outcome=\"ok\"}").value_or(0) >= runs + 3; },
                     30s, 50ms));
  CHECK(rows_in(f, f.table) == 5);
}
