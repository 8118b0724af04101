// Retention (table.retention.policy=delete): walrelay deletes the outbox rows
// the broker has acknowledged, once older than table.retention.ms, and never
// a row it has not sent.
#include <algorithm>
#include <csignal>
#include <fstream>
#include <iterator>
#include <sstream>

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

// Until retention's first run has settled the tables' floors: kept with the
// slot (given when walrelay made it, from its view), or new from that run
// (rows of transactions begun before stay: it cannot know they were sent,
// and a test writes after it).
void wait_floor(Walrelay& relay) {
  REQUIRE(eventually([&] {
    const auto log = relay.log();
    return log.find("retention: rows of transactions from xid") != std::string::npos ||
           log.find("retention: floors kept with slot") != std::string::npos;
  }, 30s, 20ms));
}

// The slot's marker line, from the publication's comment.
std::string marker_line(Fixture& f) {
  return f.db().scalar("SELECT coalesce(substring(obj_description(oid, 'pg_publication') from "
                       "'walrelay\\.slot=" + f.slot + " [^\n]*'), '') FROM pg_publication WHERE pubname = '" +
                       f.slot + "'");
}

long rows_in(Fixture& f, const std::string& table) { return std::stol(f.db().scalar("SELECT count(*) FROM " + table)); }

// A row an hour old by its time column.
void insert_old(Db& db, const std::string& table, const std::string& type, const std::string& key, long seq) {
  db.exec("INSERT INTO " + table + " (aggregatetype, aggregateid, type, payload, created_at) VALUES ('" + type +
          "', '" + key + "', 'Created', '{\"seq\": " + std::to_string(seq) + "}', now() - interval '1 hour')");
}

// An outbox partitioned by aggregate id, with one partition, for 'a'.
void create_list_outbox(Fixture& f) {
  f.db().exec("CREATE TABLE " + f.table + " (id bigserial, aggregatetype text NOT NULL, aggregateid text NOT NULL, "
              "type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (id, "
              "aggregateid)) PARTITION BY LIST (aggregateid); CREATE TABLE " + f.table + "_a PARTITION OF " +
              f.table + " FOR VALUES IN ('a')");
}

double ok_runs(Walrelay& relay) { return relay.metric("walrelay_retention_runs_total{outcome=\"ok\"}").value_or(0); }

// Until `relay` has finished `n` more runs that found its fence passed.
void wait_ok_runs(Walrelay& relay, int n) {
  const double runs = ok_runs(relay);
  REQUIRE(eventually([&] { return ok_runs(relay) >= runs + n; }, 30s, 50ms));
}

// The floors the slot's marker keeps, from the publication's comment.
std::string kept_floors(Fixture& f) {
  return f.db().scalar("SELECT coalesce(substring(obj_description(oid, 'pg_publication') from "
                       "'retention_floors=([0-9:,]+)'), '') FROM pg_publication WHERE pubname = '" + f.slot + "'");
}

// The `seq` of every record, with how many records carried it.
std::map<long, int> seqs_of(const std::vector<KafkaRecord>& recs) {
  std::map<long, int> out;
  for (auto& r : recs) {
    auto doc = json::parse(r.value.value_or(""), nullptr, false);
    if (doc.is_object() && doc.contains("seq")) out[doc["seq"].get<long>()]++;
  }
  return out;
}

// The first SQL block after `marker` in docs/<page>, each `from` in it
// replaced by its `to`: a procedure run from the page's own text.
std::string sql_from_page(const std::string& page, const std::string& marker,
                          const std::vector<std::pair<std::string, std::string>>& replacements) {
  std::ifstream in(std::string(WALRELAY_SOURCE_DIR) + "/docs/" + page);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at_marker = text.find(marker);
  REQUIRE(at_marker != std::string::npos);
  const auto begin = text.find("```sql\n", at_marker) + 7;
  std::string sql = text.substr(begin, text.find("```", begin) - begin);
  for (const auto& [from, to] : replacements)
    for (auto at = sql.find(from); at != std::string::npos; at = sql.find(from, at + to.size()))
      sql.replace(at, from.size(), to);
  return sql;
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
      CHECK(metric_at(relay, "walrelay_retention_rows_deleted_total", total) == total);
      CHECK(relay.metric("walrelay_retention_runs_total{outcome=\"ok\"}").value_or(0) > 0);
      CHECK(relay.metric("walrelay_retention_table_bytes").value_or(0) > 0);
      CHECK(relay.metric("walrelay_retention_runs_total{outcome=\"error\"}").value_or(0) == 0);
      // The same in /slot, after a run that measured the emptied table.
      wait_ok_runs(relay, 1);
      const auto slot = relay.get("/slot");
      REQUIRE(slot.status == 200);
      const auto doc = json::parse(slot.body);
      INFO(slot.body);
      REQUIRE(doc["retention"].is_object());
      const auto& retention = doc["retention"];
      CHECK(retention["policy"] == "delete");
      CHECK(retention["retention_ms"] == 1000);
      CHECK(retention["last_outcome"] == "ok");
      CHECK(retention["last_error"].is_null());
      CHECK(retention["last_run_unix_ms"].get<std::int64_t>() > 0);
      REQUIRE(retention["tables"].size() == 1);
      const auto& table = retention["tables"][0];
      CHECK(table["table"] == f.table);
      CHECK(table["rows_deleted"] == total);
      CHECK(table["rows_held"] == 0);
      CHECK(table["bytes"].get<double>() > 0);
      CHECK(table["oldest_row_age_seconds"] == 0);
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
    // Visible: the oldest row's age, and a lag longer than the retention.
    CHECK(relay.metric("walrelay_retention_oldest_row_age_seconds").value_or(0) > 3000);
    REQUIRE(eventually(
        [&] { return relay.log().find("longer than table.retention.ms (1000 ms)") != std::string::npos; }, 30s,
        50ms));
  }
  auto recs = read_all(f, f.topic("Late"));
  auto seen = seqs_of(recs);
  CHECK(seen.size() == static_cast<std::size_t>(expected));
  REQUIRE(eventually([&] { return rows_in(f, f.table) == 0; }, 30s, 100ms));
  CHECK(metric_at(relay, "walrelay_retention_rows_deleted_total", expected) == expected);
  wait_ok_runs(relay, 1);
  CHECK(relay.metric("walrelay_retention_oldest_row_age_seconds").value_or(-1) == 0);
}

TEST_CASE("retention: exactly once - rows go only once their Kafka transaction committed: none while the broker is "
          "frozen, every one after, each event once to a read_committed reader",
          "[fault][eos][retention][solo]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(retention_config(f, "exactly.once.support=required\ntransaction.boundary.interval.ms=50\n"
                                     "offsets.storage.topic=" + f.slot + ".offsets\n"));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  const long total = 1000;
  Writer writer(f.table, "Eos", total, 10, 5ms);
  writer.join();
  REQUIRE(writer.failures() == 0);
  REQUIRE(eventually([&] { return rows_in(f, f.table) == 0; }, 60s, 100ms));
  {
    BrokerFreeze frozen;
    for (int seq = 0; seq < 20; ++seq) insert_old(f.db(), f.table, "Eos", "k" + std::to_string(seq % 3), seq);
    // Runs that find the committed position behind their fence: nothing goes.
    const double behind = relay.metric("walrelay_retention_runs_total{outcome=\"behind\"}").value_or(0);
    REQUIRE(eventually([&] {
      return relay.metric("walrelay_retention_runs_total{outcome=\"behind\"}").value_or(0) >= behind + 2;
    }, 30s, 50ms));
    CHECK(rows_in(f, f.table) == 20);
  }
  REQUIRE(eventually([&] { return rows_in(f, f.table) == 0; }, 90s, 100ms));
  auto seen = ids_of(read_all(f, f.topic("Eos")));
  CHECK(seen.records == static_cast<std::size_t>(total + 20));
  CHECK(seen.duplicates() == 0);
  CHECK(metric_at(relay, "walrelay_retention_rows_deleted_total", total + 20) == total + 20);
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
  wait_floor(active);
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
  // The floors are kept with the slot: the rows the other relayed go too.
  for (int seq = 10; seq < 13; ++seq) insert_old(f.db(), f.table, "Standby", "k", seq);
  const bool all_gone = eventually(
      [&] { return standby.metric("walrelay_retention_rows_deleted_total").value_or(0) == 13; }, 30s, 50ms);
  INFO(standby.log());
  REQUIRE(all_gone);
  CHECK(rows_in(f, f.table) == 0);
  CHECK(seqs_of(read_all(f, f.topic("Standby"))).size() == 13);
  CHECK(standby.log().find("retention: floors kept with slot " + f.slot + " for 1 of 1 tables") != std::string::npos);
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
  const auto oid = static_cast<std::uint32_t>(std::stoul(f.db().scalar("SELECT '" + f.table + "'::regclass::oid::text")));
  insert(f.db(), "ended");
  // Its row's xmin is a subtransaction's: the snapshot does not list it.
  Db running;
  running.exec("BEGIN; SAVEPOINT s; SELECT 1");
  insert(running, "running");
  // A snapshot whose xmin is past the ended row's transaction (another
  // test's transaction, running meanwhile, can hold it back for a moment).
  const auto xid_of = [&](const std::string& key) {
    return std::stoull(f.db().scalar("SELECT xmin::text FROM " + f.table + " WHERE aggregateid = '" + key + "'"));
  };
  const auto snapshot_past = [&](std::uint64_t xid) {
    std::string taken;
    REQUIRE(eventually([&] {
      taken = f.db().scalar("SELECT pg_current_snapshot()::text");
      return std::stoull(taken.substr(0, taken.find(':'))) > xid;
    }, 30s, 10ms));
    return taken;
  };
  const std::string snapshot = snapshot_past(xid_of("ended"));
  running.exec("COMMIT");
  auto rows = f.db().exec("SELECT aggregateid FROM " + f.table + " WHERE " +
                          walrelay::acknowledged_rows_condition(snapshot, {{oid, floor}}, "") + " ORDER BY 1");
  REQUIRE(rows.size() == 1);
  CHECK(rows[0][0] == std::optional<std::string>("ended"));
  // A table without a floor: none of its rows.
  CHECK(f.db().exec("SELECT 1 FROM " + f.table + " WHERE " +
                    walrelay::acknowledged_rows_condition(snapshot, {{oid + 1, 1}}, "")).empty());
  CHECK(f.db().exec("SELECT 1 FROM " + f.table + " WHERE " + walrelay::acknowledged_rows_condition(snapshot, {}, ""))
            .empty());
  // A slot's view, as a slot exports it at its consistent point: every xid
  // between its bounds it did not see commit is listed, the running
  // transaction's subtransaction too (pg_current_snapshot() lists only
  // top-level ones, so the test adds it).
  const std::uint64_t sub = xid_of("running");
  std::vector<std::uint64_t> xip;
  std::uint64_t xmin = 0, xmax = 0;
  {
    std::string text = snapshot;
    std::replace(text.begin(), text.end(), ':', ' ');
    std::replace(text.begin(), text.end(), ',', ' ');
    std::istringstream in(text);
    in >> xmin >> xmax;
    for (std::uint64_t x; in >> x;) xip.push_back(x);
  }
  xip.push_back(sub);
  std::sort(xip.begin(), xip.end());
  xip.erase(std::unique(xip.begin(), xip.end()), xip.end());
  std::string view = std::to_string(xmin) + ":" + std::to_string(std::max(xmax, xip.back() + 1)) + ":";
  for (std::size_t i = 0; i < xip.size(); ++i) view += (i ? "," : "") + std::to_string(xip[i]);
  INFO("view: " << view);
  const std::string later = snapshot_past(sub);
  // A floor above 0: a row the view saw commit was not streamed; one it saw
  // running was.
  rows = f.db().exec("SELECT aggregateid FROM " + f.table + " WHERE " +
                     walrelay::acknowledged_rows_condition(later, {{oid, 1}}, view) + " ORDER BY 1");
  REQUIRE(rows.size() == 1);
  CHECK(rows[0][0] == std::optional<std::string>("running"));
  rows = f.db().exec("SELECT aggregateid FROM " + f.table + " WHERE " +
                     walrelay::not_carried_condition({{oid, floor}}, view) + " ORDER BY 1");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0][0] == std::optional<std::string>("before-floor"));
  CHECK(rows[1][0] == std::optional<std::string>("ended"));
  // A floor of 0 (an initial snapshot sent what the view saw): every row.
  CHECK(f.db().exec("SELECT 1 FROM " + f.table + " WHERE " +
                    walrelay::acknowledged_rows_condition(later, {{oid, 0}}, view)).size() == 3);
  CHECK(f.db().exec("SELECT 1 FROM " + f.table + " WHERE " + walrelay::not_carried_condition({{oid, 0}}, view))
            .empty());
}

TEST_CASE("retention: rows committed before walrelay first streamed the slot (a backlog at a first start with "
          "no_data) were never sent - they are never deleted, and hold the table's deletes until the operator "
          "has removed them",
          "[relay][retention]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  for (int seq = 0; seq < 5; ++seq) insert_old(f.db(), f.table, "Backlog", "k", seq);
  Walrelay relay(retention_config(f));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  // Sent, but held while the backlog is there: an UPDATE or a rewrite would
  // lift the backlog's xmins above the floor, and nothing else tells them
  // apart.
  insert_old(f.db(), f.table, "Backlog", "k", 5);
  REQUIRE(seqs_of(read_all(f, f.topic("Backlog"))).size() == 1);
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_held").value_or(0) == 5; }, 30s, 50ms));
  wait_ok_runs(relay, 3);
  CHECK(rows_in(f, f.table) == 6);
  CHECK(relay.metric("walrelay_retention_rows_deleted_total").value_or(0) == 0);
  REQUIRE(eventually([&] { return relay.log().find("holds rows written before walrelay relayed it (5 in " + f.slot +
                                                   "_outbox)") != std::string::npos; }, 30s, 50ms));
  // The operator deals with the backlog: then what was sent goes.
  f.db().exec("DELETE FROM " + f.table + " WHERE (payload->>'seq')::int < 5");
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_deleted_total").value_or(0) == 1; }, 30s, 50ms));
  CHECK(rows_in(f, f.table) == 0);
  CHECK(relay.metric("walrelay_retention_rows_held").value_or(-1) == 0);
}

TEST_CASE("retention: turned on for a slot walrelay made earlier - the rows it relayed before go, told from a "
          "backlog committed before the slot by the slot's view at its consistent point, which stays",
          "[relay][retention]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  for (int seq = 0; seq < 3; ++seq) insert_old(f.db(), f.table, "Later", "k", seq);  // never sent
  {
    Walrelay first(f.config());
    first.start();
    first.wait_streaming();
    for (int seq = 3; seq < 13; ++seq) insert_old(f.db(), f.table, "Later", "k" + std::to_string(seq % 3), seq);
    REQUIRE(seqs_of(read_all(f, f.topic("Later"))).size() == 10);
    first.signal(SIGTERM);
    REQUIRE(first.wait_exit(30s) == 0);
  }
  const std::string marker = marker_line(f);
  INFO("marker: " << marker);
  REQUIRE(marker.find(" slot_view=") != std::string::npos);
  CHECK(marker.find("view_sent") == std::string::npos);
  Walrelay relay(retention_config(f));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  // The backlog is held, and holds the table's deletes; the rows relayed
  // before retention was on are not held.
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_held").value_or(0) == 3; }, 30s, 50ms));
  wait_ok_runs(relay, 3);
  CHECK(rows_in(f, f.table) == 13);
  CHECK(relay.metric("walrelay_retention_rows_held").value_or(-1) == 3);
  f.db().exec("DELETE FROM " + f.table + " WHERE (payload->>'seq')::int < 3");
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_deleted_total").value_or(0) == 10; }, 30s,
                     50ms));
  CHECK(rows_in(f, f.table) == 0);
  CHECK(relay.metric("walrelay_retention_rows_held").value_or(-1) == 0);
  CHECK(seqs_of(read_all(f, f.topic("Later"))).size() == 10);
}

TEST_CASE("retention: a first start while writers run - the rows committed after the slot's consistent point go, "
          "also those committed before retention's first run, and with snapshot.mode=initial the rows its snapshot "
          "sent go too",
          "[relay][retention]") {
  for (const bool snapshot : {false, true}) {
    DYNAMIC_SECTION((snapshot ? "snapshot.mode=initial" : "snapshot.mode=no_data")) {
      Fixture f;
      create_outbox(f.db(), f.table, "bigint");
      for (int seq = 0; seq < 5; ++seq) insert_old(f.db(), f.table, "Busy", "k", seq);  // before the slot
      const long total = 1500;
      Writer writer(f.table, "Busy", total, 5, 10ms, 16, "", 5);
      REQUIRE(eventually([&] { return writer.committed() >= 100; }, 30s, 10ms));
      Walrelay relay(retention_config(f, snapshot ? "snapshot.mode=initial\n" : ""));
      relay.start();
      relay.wait_streaming();
      const long at_start = writer.committed();
      writer.join();
      REQUIRE(writer.failures() == 0);
      // The writer ran across the slot's creation and retention's first run.
      REQUIRE(at_start < total);
      const std::string marker = marker_line(f);
      INFO("marker: " << marker);
      CHECK(marker.find(" slot_view=") != std::string::npos);
      CHECK((marker.find(" view_sent=true") != std::string::npos) == snapshot);
      if (snapshot) {
        // Every row: the snapshot's and the stream's.
        REQUIRE(eventually([&] { return rows_in(f, f.table) == 0; }, 60s, 100ms));
        auto seen = seqs_of(read_all(f, f.topic("Busy")));
        CHECK(seen.size() == static_cast<std::size_t>(total + 5));
        CHECK(relay.metric("walrelay_retention_rows_held").value_or(-1) == 0);
      } else {
        // The rows from before the slot, and those committed while it was
        // made, were never sent: they stay (and hold the table), and only
        // they. Then everything the slot carried goes.
        const std::string never_sent = "SELECT count(*) FROM " + f.table +
                                       " WHERE pg_visible_in_snapshot(xmin::text::xid8, (SELECT substring("
                                       "obj_description(p.oid, 'pg_publication') from 'slot_view=([0-9:,]+)') "
                                       "FROM pg_publication p WHERE pubname = '" + f.slot + "')::pg_snapshot)";
        const long unsent = std::stol(f.db().scalar(never_sent));
        REQUIRE(unsent >= 5);
        REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_held").value_or(0) == unsent; }, 30s,
                           50ms));
        auto seen = seqs_of(read_all(f, f.topic("Busy")));
        CHECK(seen.size() == static_cast<std::size_t>(total + 5 - unsent));
        f.db().exec("DELETE FROM " + f.table + " WHERE pg_visible_in_snapshot(xmin::text::xid8, (SELECT "
                    "substring(obj_description(p.oid, 'pg_publication') from 'slot_view=([0-9:,]+)') FROM "
                    "pg_publication p WHERE pubname = '" + f.slot + "')::pg_snapshot)");
        REQUIRE(eventually([&] { return rows_in(f, f.table) == 0; }, 60s, 100ms));
        CHECK(relay.metric("walrelay_retention_rows_held").value_or(-1) == 0);
        CHECK(metric_at(relay, "walrelay_retention_rows_deleted_total", total + 5 - unsent) == total + 5 - unsent);
      }
    }
  }
}

TEST_CASE("retention: an initial snapshot whose snapshot.select.statement.overrides leaves rows out - those rows "
          "were never sent and stay, held, and the rows it sent and those streamed go once the operator removed them",
          "[relay][retention]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  for (int seq = 0; seq < 6; ++seq) insert_old(f.db(), f.table, "Override", "k", seq);
  Walrelay relay(retention_config(f, "snapshot.mode=initial\nsnapshot.select.statement.overrides=" + f.table +
                                         "\nsnapshot.select.statement.overrides." + f.table + "=SELECT * FROM " +
                                         f.table + " WHERE (payload->>'seq')::int >= 2\n"));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  insert_old(f.db(), f.table, "Override", "k", 6);
  auto seen = seqs_of(read_all(f, f.topic("Override")));
  REQUIRE(seen.size() == 5);  // 2 to 6
  CHECK(seen.count(0) == 0);
  CHECK(seen.count(1) == 0);
  // Every row the view saw is held (walrelay cannot tell which the override
  // left out), so nothing of the table goes until those two are removed.
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_held").value_or(0) == 6; }, 30s, 50ms));
  wait_ok_runs(relay, 3);
  CHECK(rows_in(f, f.table) == 7);
  // Not said sent: the override may have left rows out.
  CHECK(marker_line(f).find("view_sent") == std::string::npos);
  CHECK(marker_line(f).find(" slot_view=") != std::string::npos);
  // The operator checks the snapshot's rows are in the broker and removes
  // them with the two left out.
  f.db().exec("DELETE FROM " + f.table + " WHERE (payload->>'seq')::int < 6");
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_deleted_total").value_or(0) == 1; }, 30s,
                     50ms));
  CHECK(rows_in(f, f.table) == 0);
}

TEST_CASE("retention: a slot whose view the server cannot export (more unfinished transactions than a snapshot "
          "holds: initial slot snapshot too large) is made without it - walrelay streams, and retention gives the "
          "table its floor at its first run",
          "[relay][retention][solo]") {
  // [solo]: it holds transactions open while its slot is made, and every
  // other test's slot made meanwhile on a shared server waits on them (CI
  // run 35: this one and "the floors are kept" each timed out waiting).
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  // The walsender making the slot waits on this transaction's lock.
  const auto waited_on = [&](const std::string& xid) {
    return eventually([&] {
      return f.db().scalar("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE "
                           "a.backend_type = 'walsender' AND NOT l.granted AND l.locktype = 'transactionid' AND "
                           "l.transactionid::text = '" + xid + "'") == "1";
    }, 60s, 20ms);
  };
  // More xids than a snapshot holds (PostgreSQL's MaxBackends and prepared
  // transactions), with room.
  const long room = std::stol(f.db().scalar(
      "SELECT current_setting('max_connections')::int + current_setting('autovacuum_max_workers')::int + "
      "current_setting('max_worker_processes')::int + current_setting('max_wal_senders')::int + "
      "current_setting('max_prepared_transactions')::int + 2"));
  // The slot is consistent two running-transaction records after its start:
  // the transactions running at the first (t0) ended, then those running at
  // the second (t1). A transaction begun between them (t2) still runs at the
  // consistent point, so the view's xmin is below every xid aborted after
  // it, and one committed after those puts the view's xmax above them.
  Db t0, t1, t2, aborter;
  const std::string x0 = t0.scalar("BEGIN; SELECT txid_current()::text");
  Walrelay relay(retention_config(f));
  relay.start();
  REQUIRE(waited_on(x0));
  const std::string x1 = t1.scalar("BEGIN; SELECT txid_current()::text");
  t0.exec("COMMIT");
  REQUIRE(waited_on(x1));
  const std::string x2 = t2.scalar("BEGIN; SELECT txid_current()::text");
  std::string aborts;
  for (long i = 0; i < room + 20; ++i) aborts += "BEGIN; SELECT txid_current(); ROLLBACK; ";
  aborter.exec(aborts + "BEGIN; SELECT txid_current(); COMMIT;");
  t1.exec("COMMIT");
  REQUIRE(eventually([&] { return relay.log().find("could not export its view at the consistent point") !=
                                  std::string::npos; }, 60s, 20ms));
  REQUIRE(relay.log().find("initial slot snapshot too large") != std::string::npos);
  // Made again without it, it waits for t2 as any slot does.
  REQUIRE(waited_on(x2));
  t2.exec("COMMIT");
  relay.wait_streaming();
  const std::string marker = marker_line(f);
  INFO("marker: " << marker);
  CHECK(marker.find("created_lsn=") != std::string::npos);
  CHECK(marker.find("slot_view") == std::string::npos);
  wait_floor(relay);
  CHECK(relay.log().find("retention: rows of transactions from xid") != std::string::npos);
  insert_old(f.db(), f.table, "Large", "k", 0);
  REQUIRE(seqs_of(read_all(f, f.topic("Large"))).size() == 1);
  REQUIRE(eventually([&] { return rows_in(f, f.table) == 0; }, 30s, 50ms));
  CHECK(metric_at(relay, "walrelay_retention_rows_deleted_total", 1) == 1);
}

TEST_CASE("retention: the floors are kept with the slot - after a restart the rows an earlier walrelay relayed go, "
          "while a table added to table.include.list keeps the rows it had before",
          "[relay][retention]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  {
    // The first keeps everything (a day's retention; the rows are an hour old).
    Walrelay first(with_key(retention_config(f), "table.retention.ms", "86400000"));
    first.start();
    first.wait_streaming();
    wait_floor(first);
    for (int seq = 0; seq < 10; ++seq) insert_old(f.db(), f.table, "Restart", "k" + std::to_string(seq % 3), seq);
    REQUIRE(seqs_of(read_all(f, f.topic("Restart"))).size() == 10);
    wait_ok_runs(first, 2);
    CHECK(rows_in(f, f.table) == 10);
    first.signal(SIGTERM);
    REQUIRE(first.wait_exit(30s) == 0);
  }
  REQUIRE(!kept_floors(f).empty());
  // A second outbox with rows of its own, never published.
  const std::string second = f.table + "2";
  create_outbox(f.db(), second, "bigint");
  for (int seq = 0; seq < 4; ++seq) insert_old(f.db(), second, "Added", "k", seq);
  Walrelay relay(with_key(retention_config(f), "table.include.list", f.table + "," + second));
  relay.start();
  relay.wait_streaming();
  REQUIRE(eventually([&] { return rows_in(f, f.table) == 0; }, 30s, 50ms));
  // The added table's own rows from now on go; its earlier ones stay.
  wait_floor(relay);
  for (int seq = 4; seq < 6; ++seq) insert_old(f.db(), second, "Added", "k", seq);
  CHECK(seqs_of(read_all(f, f.topic("Added"))).size() == 2);
  // Its earlier rows hold its deletes until the operator removes them.
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_held").value_or(0) == 4; }, 30s, 50ms));
  wait_ok_runs(relay, 3);
  CHECK(rows_in(f, second) == 6);
  CHECK(metric_at(relay, "walrelay_retention_rows_deleted_total", 10) == 10);
  f.db().exec("DELETE FROM " + second + " WHERE (payload->>'seq')::int < 4");
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_deleted_total").value_or(0) == 12; }, 30s,
                     50ms));
  CHECK(rows_in(f, second) == 0);
}

TEST_CASE("retention: a slot made again starts from its own view - rows committed while there was none are never "
          "deleted, nor those relayed before, and what the new slot relays goes",
          "[relay][retention]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  {
    Walrelay first(with_key(retention_config(f), "table.retention.ms", "86400000"));
    first.start();
    first.wait_streaming();
    wait_floor(first);
    for (int seq = 0; seq < 3; ++seq) insert_old(f.db(), f.table, "Reset", "k", seq);
    REQUIRE(seqs_of(read_all(f, f.topic("Reset"))).size() == 3);
    wait_ok_runs(first, 2);
    first.signal(SIGTERM);
    REQUIRE(first.wait_exit(30s) == 0);
  }
  const std::string before = kept_floors(f);
  REQUIRE(!before.empty());
  f.db().exec("SELECT pg_drop_replication_slot('" + f.slot + "')");
  for (int seq = 3; seq < 6; ++seq) insert_old(f.db(), f.table, "Reset", "k", seq);  // the gap: never sent
  Walrelay reset(retention_config(f));
  const std::string old_marker = marker_line(f);
  REQUIRE(reset.run({"--reset-slot", "--config", reset.config_path()}) == 0);
  // The new slot's floors and view, nothing of the old one's.
  const std::string new_marker = marker_line(f);
  INFO("before: " << old_marker << "\nafter: " << new_marker);
  CHECK(!kept_floors(f).empty());
  CHECK(kept_floors(f) != before);
  const auto view_of = [](const std::string& line) {
    const auto at = line.find(" slot_view=");
    return at == std::string::npos ? std::string() : line.substr(at, line.find(' ', at + 1) - at);
  };
  CHECK(!view_of(new_marker).empty());
  CHECK(view_of(new_marker) != view_of(old_marker));
  Walrelay relay(retention_config(f));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  for (int seq = 6; seq < 8; ++seq) insert_old(f.db(), f.table, "Reset", "k", seq);
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_held").value_or(0) == 6; }, 30s, 50ms));
  wait_ok_runs(relay, 3);
  CHECK(rows_in(f, f.table) == 8);
  CHECK(kept_floors(f) != before);
  // The gap's rows (3, 4, 5) were never sent: the operator sends them again
  // with walrelay replay, or accepts their loss, and removes them with the
  // others from before the new slot; then what it relays goes.
  f.db().exec("DELETE FROM " + f.table + " WHERE (payload->>'seq')::int < 6");
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_deleted_total").value_or(0) == 2; }, 30s,
                     50ms));
  CHECK(rows_in(f, f.table) == 0);
}

TEST_CASE("retention: a partition attached with rows in it keeps them (the slot never carried them) - rows written "
          "into it after go, and so do the other partitions'",
          "[relay][retention]") {
  Fixture f;
  create_list_outbox(f);
  Walrelay relay(retention_config(f));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  // Written while walrelay streams, into a table not yet part of the outbox.
  f.db().exec("CREATE TABLE " + f.table + "_b (LIKE " + f.table + " INCLUDING DEFAULTS)");
  for (int seq = 0; seq < 3; ++seq) insert_old(f.db(), f.table + "_b", "Attached", "b", seq);
  f.db().exec("ALTER TABLE " + f.table + " ATTACH PARTITION " + f.table + "_b FOR VALUES IN ('b')");
  // Until a run has given the new partition its floor.
  REQUIRE(eventually(
      [&] {
        std::istringstream lines(relay.log());
        for (std::string line; std::getline(lines, line);)
          if (line.find("may go once acknowledged, in") != std::string::npos &&
              line.find(f.slot + "_outbox_b") != std::string::npos)
            return true;
        return false;
      },
      30s, 50ms));
  for (int seq = 3; seq < 5; ++seq) {
    insert_old(f.db(), f.table, "Attached", "a", seq);
    insert_old(f.db(), f.table, "Attached", "b", seq);
  }
  // The other partition's rows go; the attached one's wait for its earlier rows.
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_deleted_total").value_or(0) == 2; }, 30s,
                     50ms));
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_held").value_or(0) == 3; }, 30s, 50ms));
  wait_ok_runs(relay, 3);
  CHECK(f.db().scalar("SELECT string_agg(payload->>'seq', ',' ORDER BY payload->>'seq') FROM " + f.table + "_b") ==
        "0,1,2,3,4");
  CHECK(read_all(f, f.topic("Attached")).size() == 4);
  f.db().exec("DELETE FROM " + f.table + "_b WHERE (payload->>'seq')::int < 3");
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_deleted_total").value_or(0) == 4; }, 30s,
                     50ms));
  CHECK(rows_in(f, f.table) == 0);
}

TEST_CASE("retention: a partition detached, written to by name, and attached again keeps the rows written while "
          "it was out (its floor rises with the new attachment)",
          "[relay][retention]") {
  Fixture f;
  create_list_outbox(f);
  // A day's retention: the floors are given and kept, nothing deleted yet.
  Walrelay relay(with_key(retention_config(f), "table.retention.ms", "86400000"));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  insert_old(f.db(), f.table, "Again", "a", 0);
  wait_ok_runs(relay, 2);
  relay.signal(SIGTERM);
  REQUIRE(relay.wait_exit(30s) == 0);
  // Out, written to by name (never published), and in again.
  f.db().exec("ALTER TABLE " + f.table + " DETACH PARTITION " + f.table + "_a");
  insert_old(f.db(), f.table + "_a", "Again", "a", 1);
  f.db().exec("ALTER TABLE " + f.table + " ATTACH PARTITION " + f.table + "_a FOR VALUES IN ('a')");
  Walrelay again(retention_config(f));
  again.start();
  again.wait_streaming();
  // After the run that saw the new attachment: rows before that stay.
  wait_floor(again);
  insert_old(f.db(), f.table, "Again", "a", 2);
  REQUIRE(eventually([&] { return again.metric("walrelay_retention_rows_held").value_or(0) == 2; }, 30s, 50ms));
  wait_ok_runs(again, 3);
  CHECK(rows_in(f, f.table) == 3);
  CHECK(again.metric("walrelay_retention_rows_deleted_total").value_or(0) == 0);
  CHECK(seqs_of(read_all(f, f.topic("Again"))).size() == 2);  // 0 and 2; 1 never was
}

TEST_CASE("retention: a time column that is missing or not a time is refused by --check and at start, naming the "
          "table and the column",
          "[relay][retention]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  f.db().exec("ALTER TABLE " + f.table + " ADD COLUMN stamp text");
  Walrelay check(retention_config(f, "table.retention.time.column=stamp\n"));
  CHECK(check.run({"--check", "--config", check.config_path()}) == 1);
  CHECK(check.log().find("table.retention.time.column: column \"stamp\" of " + f.table +
                         " is text, not a timestamp or a date") != std::string::npos);
  Walrelay missing(retention_config(f, "table.retention.time.column=written_at\n"));
  missing.start();
  CHECK(missing.wait_exit(60s) == 3);
  CHECK(missing.log().find("table.retention.time.column: table " + f.table + " has no column \"written_at\"") !=
        std::string::npos);
  // A domain over a time is a time.
  f.db().exec("CREATE DOMAIN " + f.slot + "_stamp AS timestamptz; ALTER TABLE " + f.table + " ADD COLUMN written " +
              f.slot + "_stamp");
  Walrelay domain(retention_config(f, "table.retention.time.column=written\n"));
  CHECK(domain.run({"--check", "--config", domain.config_path()}) == 0);
  f.db().exec("ALTER TABLE " + f.table + " DROP COLUMN written; DROP DOMAIN " + f.slot + "_stamp");
  // table.retention.ms=0 reads no time.
  Walrelay none(with_key(retention_config(f, "table.retention.time.column=stamp\n"), "table.retention.ms", "0"));
  CHECK(none.run({"--check", "--config", none.config_path()}) == 0);
}

TEST_CASE("retention: the deletes run as table.retention.user - without DELETE it fails, says so and deletes "
          "nothing - granted, the rows go - its password is never logged",
          "[relay][retention]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  const std::string role = f.slot + "_cleaner", password = "cl34n-" + f.slot;
  // quickstart.md's grant, from the page's own text.
  const std::string grant = sql_from_page("quickstart.md", "where retention keeps its floors):",
                                          {{"walrelay_cleaner", role}, {"'...'", "'" + password + "'"},
                                           {"public.outbox", f.table}});
  INFO(grant);
  f.db().exec(grant);
  struct DropRole {
    std::string role;
    ~DropRole() {
      try {
        Db db;
        db.exec("DROP OWNED BY " + role);
        db.exec("DROP ROLE IF EXISTS " + role);
      } catch (...) {
      }
    }
  } drop_role{role};
  f.db().exec("REVOKE DELETE ON " + f.table + " FROM " + role);
  Walrelay relay(retention_config(f, "table.retention.user=" + role + "\ntable.retention.password=" + password +
                                         "\n"));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  for (int seq = 0; seq < 5; ++seq) insert_old(f.db(), f.table, "Role", "k", seq);
  REQUIRE(seqs_of(read_all(f, f.topic("Role"))).size() == 5);
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_runs_total{outcome=\"error\"}").value_or(0) >= 2; },
                     30s, 50ms));
  CHECK(relay.log().find("permission denied for table " + f.slot + "_outbox") != std::string::npos);
  CHECK(rows_in(f, f.table) == 5);
  f.db().exec("GRANT DELETE ON " + f.table + " TO " + role);
  REQUIRE(eventually([&] { return rows_in(f, f.table) == 0; }, 30s, 50ms));
  CHECK(metric_at(relay, "walrelay_retention_rows_deleted_total", 5) == 5);
  // The floors stay with the slot: written on walrelay's own role.
  CHECK(!kept_floors(f).empty());
  CHECK(relay.log().find(password) == std::string::npos);
}

TEST_CASE("retention: walrelay replay --since reaches back exactly as far as table.retention.ms - the older rows "
          "are gone once sent, every younger one is sent again",
          "[relay][retention][replay]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  // Two hours' retention; rows from three hours ago to now, a minute apart,
  // with a gap around the limit so that the clock moving on changes nothing.
  Walrelay relay(with_key(retention_config(f), "table.retention.ms", "7200000"));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  const std::string insert = "INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload, created_at) "
                             "SELECT 'Reach', 'k' || (g % 8), 'x', jsonb_build_object('seq', g), now() - g * "
                             "interval '1 minute' FROM generate_series(0, 180) g WHERE g NOT BETWEEN 110 AND 130";
  f.db().exec(insert);
  const long younger = 110, older = 50;  // 0..109 minutes old, 131..180
  auto first = read_all(f, f.topic("Reach"), 60s);
  REQUIRE(ids_of(first).count.size() == static_cast<std::size_t>(younger + older));
  REQUIRE(eventually([&] { return rows_in(f, f.table) == younger; }, 30s, 50ms));
  wait_ok_runs(relay, 3);
  CHECK(rows_in(f, f.table) == younger);
  // What the retention promises: everything younger than it, sent again.
  const std::string since = f.db().scalar("SELECT (now() - interval '2 hours')::text");
  auto r = run_command(std::string(WALRELAY_BINARY) + " replay --config " + relay.config_path() + " --since '" +
                       since + "' --yes < /dev/null 2>&1");
  INFO(r.output);
  REQUIRE(exit_code(r) == 0);
  CHECK(r.output.find(std::to_string(younger) + " row(s)") != std::string::npos);
  auto all = read_topic(f.topic("Reach"), static_cast<std::size_t>(2 * younger + older), 60s);
  auto seen = ids_of(all);
  CHECK(seen.records == 2 * younger + older);
  CHECK(seen.duplicates() == static_cast<std::size_t>(younger));
}

TEST_CASE("retention: a table taken out of table.include.list loses its floor - relayed again later, the rows "
          "written while it was out are held, never deleted",
          "[relay][retention]") {
  Fixture f;
  const std::string second = f.table + "2";
  create_outbox(f.db(), f.table, "bigint");
  create_outbox(f.db(), second, "bigint");
  // The publication is the operator's, and keeps publishing both.
  f.db().exec("CREATE PUBLICATION " + f.slot + " FOR TABLE " + f.table + ", " + second +
              " WITH (publish = 'insert')");
  const std::string both = with_key(with_key(retention_config(f), "table.include.list", f.table + "," + second),
                                    "publication.autocreate.mode", "disabled");
  {
    Walrelay first(with_key(both, "table.retention.ms", "86400000"));
    first.start();
    first.wait_streaming();
    wait_floor(first);
    wait_ok_runs(first, 2);
    first.signal(SIGTERM);
    REQUIRE(first.wait_exit(30s) == 0);
  }
  const auto floors_kept = [&] {
    const auto floors = kept_floors(f);
    return floors.empty() ? 0 : 1 + std::count(floors.begin(), floors.end(), ',');
  };
  REQUIRE(floors_kept() == 2);
  {
    // Only the first table relayed, without retention: the second one's rows
    // are decoded and skipped, never sent.
    Walrelay narrow(with_key(with_key(both, "table.include.list", f.table), "table.retention.policy", "none"));
    narrow.start();
    narrow.wait_streaming();
    REQUIRE(eventually([&] { return floors_kept() == 1; }, 30s, 50ms));
    for (int seq = 0; seq < 3; ++seq) insert_old(f.db(), second, "Out", "k", seq);
    insert_old(f.db(), f.table, "In", "k", 0);
    REQUIRE(seqs_of(read_all(f, f.topic("In"))).size() == 1);
    narrow.signal(SIGTERM);
    REQUIRE(narrow.wait_exit(30s) == 0);
  }
  Walrelay relay(both);
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_held").value_or(0) == 3; }, 30s, 50ms));
  wait_ok_runs(relay, 3);
  CHECK(rows_in(f, second) == 3);
  CHECK(read_all(f, f.topic("Out")).empty());
}

TEST_CASE("retention: a publication that filters the outbox's rows is refused (the rows it leaves out would be "
          "deleted unsent), and a partition made UNLOGGED for a while keeps the rows written meanwhile",
          "[relay][retention]") {
  Fixture f;
  SECTION("a row filter") {
    create_outbox(f.db(), f.table, "bigint");
    f.db().exec("CREATE PUBLICATION " + f.slot + " FOR TABLE " + f.table +
                " WHERE (aggregatetype <> 'Internal') WITH (publish = 'insert')");
    Walrelay check(with_key(retention_config(f), "publication.autocreate.mode", "disabled"));
    CHECK(check.run({"--check", "--config", check.config_path()}) == 1);
    CHECK(check.log().find("table.retention.policy: publication " + f.slot + " filters the rows of " + f.table) !=
          std::string::npos);
  }
  SECTION("an UNLOGGED partition") {
    create_list_outbox(f);
    Walrelay relay(retention_config(f));
    relay.start();
    relay.wait_streaming();
    wait_floor(relay);
    insert_old(f.db(), f.table, "Unlogged", "a", 0);
    REQUIRE(eventually([&] { return rows_in(f, f.table) == 0; }, 30s, 50ms));
    // No WAL while UNLOGGED: the slot never sees this row.
    f.db().exec("ALTER TABLE " + f.table + "_a SET UNLOGGED");
    insert_old(f.db(), f.table, "Unlogged", "a", 1);
    f.db().exec("ALTER TABLE " + f.table + "_a SET LOGGED");
    insert_old(f.db(), f.table, "Unlogged", "a", 2);
    REQUIRE(eventually([&] { return relay.metric("walrelay_retention_rows_held").value_or(0) >= 1; }, 30s, 50ms));
    wait_ok_runs(relay, 3);
    CHECK(f.db().scalar("SELECT count(*) FROM " + f.table + " WHERE payload->>'seq' = '1'") == "1");
    CHECK(seqs_of(read_all(f, f.topic("Unlogged"))).count(1) == 0);
  }
}

// table.retention.policy=drop-partitions: an outbox partitioned by range on
// created_at, its partitions dropped (or archived) whole.
namespace {

const std::string drop_controller = "drop-control-token";

std::string drop_config(const Fixture& f, const std::string& extra = "") {
  return f.config("table.retention.policy=drop-partitions\ntable.retention.ms=1000\n"
                  "table.retention.interval.ms=200\nadmin.control.token=" + drop_controller + "\n" + extra);
}

// Partitions _d3 (from 3 to 2 days ago, expired at once), _now (from half an
// hour to a day ahead) and a DEFAULT one when asked; _d2 comes later, from
// add_expiring_partition. The tests' retention is a second.
void create_range_outbox(Fixture& f, bool with_default) {
  f.db().exec("CREATE TABLE " + f.table + " (id bigint GENERATED ALWAYS AS IDENTITY, aggregatetype text NOT NULL, "
              "aggregateid text NOT NULL, type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT "
              "now(), PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at); CREATE TABLE " + f.table +
              "_d3 PARTITION OF " + f.table + " FOR VALUES FROM (now() - interval '3 days') TO (now() - interval "
              "'2 days'); CREATE TABLE " + f.table + "_now PARTITION OF " + f.table + " FOR VALUES FROM (now() + "
              "interval '30 minutes') TO (now() + interval '1 day')");
  if (with_default) f.db().exec("CREATE TABLE " + f.table + "_def PARTITION OF " + f.table + " DEFAULT");
}

// _d2, from 2 days ago to 15 s from now (an event an hour old goes there until
// it expires), made while walrelay streams, as pg_partman makes them, and
// given its floor by retention's next run. Made now rather than with the
// table: the time to write into it starts here, not before walrelay's start,
// which has no bound the test can count on (a new slot waits for every
// transaction open on the server, other tests' too).
void add_expiring_partition(Fixture& f, Walrelay& relay) {
  f.db().exec("CREATE TABLE " + f.table + "_d2 PARTITION OF " + f.table + " FOR VALUES FROM (now() - interval "
              "'2 days') TO (now() + interval '15 seconds')");
  const std::string name = f.table.substr(f.table.find('.') + 1) + "_d2";
  REQUIRE(eventually([&] {
    const auto log = relay.log();
    for (auto at = log.find("may go once acknowledged, in "); at != std::string::npos;
         at = log.find("may go once acknowledged, in ", at + 1)) {
      const auto line = log.substr(at, log.find('\n', at) - at);
      if (line.find(name) != std::string::npos) return true;
    }
    return false;
  }, 30s, 20ms));
}

const std::string hour_ago = "now() - interval '1 hour'";     // _d2
const std::string hour_ahead = "now() + interval '1 hour'";   // _now
const std::string days_ahead = "now() + interval '2 days'";   // DEFAULT

// `n` events with seq from `first` on, in one transaction, at `when` (SQL).
std::string insert_at(const std::string& table, const std::string& type, long first, int n, const std::string& when) {
  return "INSERT INTO " + table + " (aggregatetype, aggregateid, type, payload, created_at) SELECT '" + type +
         "', 'k' || (g % 4), 'Created', jsonb_build_object('seq', g), " + when + " FROM generate_series(" +
         std::to_string(first) + ", " + std::to_string(first + n - 1) + ") g";
}

bool table_exists(Fixture& f, const std::string& name) {
  return f.db().scalar("SELECT to_regclass('" + name + "') IS NOT NULL") == "t";
}

bool is_attached(Fixture& f, const std::string& name) {
  return f.db().scalar("SELECT coalesce((SELECT relispartition FROM pg_class WHERE oid = to_regclass('" + name +
                       "')), false)") == "t";
}

std::string connector_state(Walrelay& relay) {
  auto r = relay.get("/status");
  auto doc = json::parse(r.body, nullptr, false);
  return doc.is_object() ? doc["connector"].value("state", "") : "";
}

double runs_of(Walrelay& relay, const std::string& outcome) {
  return relay.metric("walrelay_retention_runs_total{outcome=\"" + outcome + "\"}").value_or(0);
}

}  // namespace

TEST_CASE("retention: drop-partitions - partitions whose range ended more than table.retention.ms ago are frozen and "
          "detached, and dropped only once the slot has passed them (held back by a pause) - with a DEFAULT "
          "partition and without - every event arrived, the others stay",
          "[relay][retention]") {
  for (const bool with_default : {false, true}) {
    DYNAMIC_SECTION((with_default ? "with a DEFAULT partition" : "without a DEFAULT partition")) {
      Fixture f;
      create_range_outbox(f, with_default);
      Walrelay relay(drop_config(f));
      relay.start();
      relay.wait_streaming();
      wait_floor(relay);
      add_expiring_partition(f, relay);
      REQUIRE(relay.request("POST", "/pause", drop_controller).status == 202);
      REQUIRE(eventually([&] { return connector_state(relay) == "PAUSED"; }, 30s, 50ms));
      f.db().exec(insert_at(f.table, "Drop", 0, 30, hour_ago));
      f.db().exec(insert_at(f.table, "Drop", 100, 30, hour_ahead));
      std::set<long> expected;
      for (long base : {0L, 100L})
        for (long i = 0; i < 30; ++i) expected.insert(base + i);
      if (with_default) {
        f.db().exec(insert_at(f.table, "Drop", 300, 10, days_ahead));
        for (long i = 0; i < 10; ++i) expected.insert(300 + i);
      }
      // Expired, frozen and detached while the relay is held back; not dropped.
      REQUIRE(eventually([&] { return !is_attached(f, f.table + "_d2"); }, 60s, 50ms));
      const double behind = runs_of(relay, "behind");
      REQUIRE(eventually([&] { return runs_of(relay, "behind") >= behind + 3; }, 30s, 50ms));
      CHECK(rows_in(f, f.table + "_d2") == 30);
      CHECK(count_records(f.topic("Drop")) == 0);
      CHECK(is_attached(f, f.table + "_now"));
      // A late event for the expired range: with a DEFAULT partition it lands
      // there; without, no partition takes it.
      if (with_default) {
        f.db().exec(insert_at(f.table, "Drop", 400, 1, hour_ago));
        expected.insert(400);
        CHECK(rows_in(f, f.table + "_def") == 11);
      } else {
        CHECK_THROWS(f.db().exec(insert_at(f.table, "Drop", 400, 1, hour_ago)));
      }

      REQUIRE(relay.request("POST", "/resume", drop_controller).status == 202);
      auto seen = seqs_of(read_all(f, f.topic("Drop")));
      std::set<long> got;
      for (auto& [seq, n] : seen) got.insert(seq);
      CHECK(got == expected);
      REQUIRE(eventually([&] { return !table_exists(f, f.table + "_d3") && !table_exists(f, f.table + "_d2"); }, 30s,
                         50ms));
      CHECK(metric_at(relay, "walrelay_retention_partitions_removed_total", 2) == 2);
      CHECK(is_attached(f, f.table + "_now"));
      CHECK(rows_in(f, f.table + "_now") == 30);
      CHECK(rows_in(f, f.table) == (with_default ? 41 : 30));
      if (with_default) CHECK(is_attached(f, f.table + "_def"));
      CHECK(relay.log().find("dropped (the slot passed") != std::string::npos);
      CHECK(runs_of(relay, "error") == 0);
      CHECK(relay.metric("walrelay_retention_table_bytes").value_or(0) > 0);
    }
  }
}

TEST_CASE("retention: drop-partitions, exactly once - an expired partition is frozen and detached, dropped only once "
          "its Kafka transaction committed (none while the broker is frozen), each event once to a read_committed "
          "reader",
          "[fault][eos][retention][solo]") {
  Fixture f;
  create_range_outbox(f, false);
  Walrelay relay(drop_config(f, "exactly.once.support=required\ntransaction.boundary.interval.ms=50\n"
                                "offsets.storage.topic=" + f.slot + ".offsets\n"));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  add_expiring_partition(f, relay);
  // Before _d2 expires: events in it, and in _now.
  f.db().exec(insert_at(f.table, "DropEos", 0, 30, hour_ahead));
  f.db().exec(insert_at(f.table, "DropEos", 100, 30, hour_ago));
  REQUIRE(seqs_of(read_all(f, f.topic("DropEos"))).size() == 60);
  REQUIRE(is_attached(f, f.table + "_d2"));
  {
    BrokerFreeze frozen;
    f.db().exec(insert_at(f.table, "DropEos", 200, 30, hour_ahead));
    // Expired, frozen and detached; not dropped while the committed position
    // is short of the position recorded when it was frozen (past the events
    // just written, which wait for the broker).
    REQUIRE(eventually([&] { return !is_attached(f, f.table + "_d2"); }, 60s, 50ms));
    const double behind = runs_of(relay, "behind");
    REQUIRE(eventually([&] { return runs_of(relay, "behind") >= behind + 3; }, 30s, 50ms));
    CHECK(table_exists(f, f.table + "_d2"));
    CHECK(rows_in(f, f.table + "_d2") == 30);
  }
  REQUIRE(eventually([&] { return !table_exists(f, f.table + "_d2") && !table_exists(f, f.table + "_d3"); }, 90s,
                     50ms));
  auto recs = read_all(f, f.topic("DropEos"));
  auto seen = ids_of(recs);
  CHECK(seen.records == 90);
  CHECK(seen.duplicates() == 0);
  CHECK(seqs_of(recs).size() == 90);
  CHECK(metric_at(relay, "walrelay_retention_partitions_removed_total", 2) == 2);
  CHECK(runs_of(relay, "error") == 0);
}

TEST_CASE("retention: drop-partitions with table.retention.archive.schema - an expired partition moves there with "
          "its rows once sent, and refuses new ones",
          "[relay][retention]") {
  Fixture f;
  create_range_outbox(f, false);
  const std::string archive = f.slot + "_archive";
  f.db().exec("CREATE SCHEMA " + archive);
  Walrelay relay(drop_config(f, "table.retention.archive.schema=" + archive + "\n"));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  add_expiring_partition(f, relay);
  f.db().exec(insert_at(f.table, "Archive", 0, 25, hour_ago));
  const std::string name = f.table.substr(f.table.find('.') + 1);
  REQUIRE(eventually([&] { return table_exists(f, archive + "." + name + "_d2"); }, 60s, 50ms));
  CHECK_FALSE(table_exists(f, f.table + "_d2"));
  CHECK(rows_in(f, archive + "." + name + "_d2") == 25);
  CHECK(seqs_of(read_all(f, f.topic("Archive"))).size() == 25);
  CHECK_THROWS(f.db().exec(insert_at(archive + "." + name + "_d2", "Archive", 100, 1, hour_ago)));
  REQUIRE(eventually([&] { return relay.metric("walrelay_retention_partitions_removed_total").value_or(0) == 2; }, 30s,
                     50ms));  // _d3, empty, as well
  CHECK(relay.log().find("moved to schema " + archive) != std::string::npos);
  f.db().exec("DROP SCHEMA " + archive + " CASCADE");
}

TEST_CASE("retention: drop-partitions - a transaction writing into an expired partition, open across runs, keeps it "
          "attached - once it commits, its event is sent before the partition goes - rows from before walrelay "
          "relayed a partition keep it in place, held by its comment, with a warning",
          "[relay][retention]") {
  Fixture f;
  create_range_outbox(f, false);
  // Written before walrelay first ran: perhaps never sent.
  f.db().exec(insert_at(f.table, "Late", 500, 3, "now() - interval '2 days 12 hours'"));  // _d3
  Walrelay relay(drop_config(f));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  add_expiring_partition(f, relay);
  Db late;
  late.exec("BEGIN; " + insert_at(f.table, "Late", 0, 1, hour_ago));  // _d2
  // _d2 expires meanwhile, and its lock is not to be had.
  REQUIRE(eventually(
      [&] {
        return relay.log().find("_d2 of " + f.table + ": canceling statement due to lock timeout; the next run tries "
                                "again") != std::string::npos;
      },
      60s, 50ms));
  // Each run that cannot have its lock counts as an error run, and tries again.
  const double failed = runs_of(relay, "error");
  REQUIRE(eventually([&] { return runs_of(relay, "error") >= failed + 3; }, 30s, 50ms));
  CHECK(is_attached(f, f.table + "_d2"));
  CHECK(count_records(f.topic("Late")) == 0);
  late.exec("COMMIT");
  REQUIRE(eventually([&] { return !table_exists(f, f.table + "_d2"); }, 30s, 50ms));
  auto seen = seqs_of(read_all(f, f.topic("Late")));
  CHECK(seen.count(0) == 1);
  // _d3 holds rows from before the floor: it stays, attached, said once.
  CHECK(is_attached(f, f.table + "_d3"));
  CHECK(rows_in(f, f.table + "_d3") == 3);
  CHECK(relay.log().find("holds 3 rows written before walrelay relayed it") != std::string::npos);
  CHECK(f.db().scalar("SELECT obj_description('" + f.table + "_d3'::regclass, 'pg_class')")
            .rfind("walrelay.retention.held slot=" + f.slot + " rows=3 ", 0) == 0);
  CHECK(metric_at(relay, "walrelay_retention_partitions_removed_total", 1) == 1);
}

TEST_CASE("retention: drop-partitions needs an outbox partitioned by range on a time, and an archive schema that "
          "exists - --check names the table and the schema",
          "[relay][retention]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(drop_config(f));
  auto check = walrelay_check(relay.config_path());
  INFO(check.output);
  CHECK(check.status != 0);
  CHECK(check.output.find("drop-partitions needs tables partitioned by range on one time column; " + f.table +
                          " is not partitioned") != std::string::npos);

  Fixture g;
  create_range_outbox(g, false);
  Walrelay archiving(drop_config(g, "table.retention.archive.schema=" + g.slot + "_nowhere\n"));
  auto missing = walrelay_check(archiving.config_path());
  INFO(missing.output);
  CHECK(missing.status != 0);
  CHECK(missing.output.find("table.retention.archive.schema: schema \"" + g.slot + "_nowhere\" does not exist") !=
        std::string::npos);
}

TEST_CASE("retention: drop-partitions - a partition frozen by another slot's walrelay is left to it, with a warning, "
          "and the other partitions go",
          "[relay][retention]") {
  Fixture f;
  create_range_outbox(f, false);
  // _d3 as another slot's walrelay leaves it when it stops between the
  // freeze and the detach.
  f.db().exec("ALTER TABLE " + f.table + "_d3 ADD CONSTRAINT walrelay_retention_frozen CHECK (false) NOT VALID; "
              "COMMENT ON TABLE " + f.table + "_d3 IS 'walrelay.retention.detached slot=other_slot id=0/1@x "
              "lsn=0/1 floor=1'");
  Walrelay relay(drop_config(f));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  add_expiring_partition(f, relay);
  f.db().exec(insert_at(f.table, "Other", 0, 10, hour_ago));  // _d2
  REQUIRE(eventually([&] { return !table_exists(f, f.table + "_d2"); }, 60s, 50ms));
  CHECK(seqs_of(read_all(f, f.topic("Other"))).size() == 10);
  CHECK(is_attached(f, f.table + "_d3"));
  CHECK(relay.log().find("was frozen by the walrelay of another slot (other_slot): left to it") != std::string::npos);
  CHECK(runs_of(relay, "error") == 0);
}

TEST_CASE("retention: table.retention.archive.schema with delete - each deleted row moves into the archive's table of "
          "the outbox's name in the statement that deletes it, only once sent - an archive table that cannot hold "
          "the rows is refused by --check, and one that stops fitting fails the run and deletes nothing",
          "[relay][retention]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  const std::string archive = f.slot + "_rows";
  const std::string name = f.table.substr(f.table.find('.') + 1);
  const std::string archived = archive + "." + name;
  const std::string config =
      retention_config(f, "table.retention.archive.schema=" + archive + "\nadmin.control.token=" + drop_controller + "\n");
  // operations.md's archive, from the page's own text: the schema alone, then
  // its table with a column that does not fit, then as the page makes it.
  const std::string make_archive = sql_from_page("operations.md", "**Archive.**",
                                                 {{"outbox_archive.outbox", archived}, {"outbox_archive", archive},
                                                  {"public.outbox", f.table}});
  INFO(make_archive);
  const auto first_statement = make_archive.find(';') + 1;
  f.db().exec(make_archive.substr(0, first_statement));
  Walrelay missing(config);
  CHECK(missing.run({"--check", "--config", missing.config_path()}) == 1);
  CHECK(missing.log().find("table.retention.archive.schema: table \"" + archive + "\".\"" + name +
                           "\" does not exist") != std::string::npos);
  f.db().exec(make_archive.substr(first_statement) + "; ALTER TABLE " + archived + " ALTER COLUMN type TYPE varchar(20)");
  Walrelay unfit(config);
  CHECK(unfit.run({"--check", "--config", unfit.config_path()}) == 1);
  CHECK(unfit.log().find("'s column \"type\" is character varying(20), not text as in " + f.table) !=
        std::string::npos);
  f.db().exec("ALTER TABLE " + archived + " ALTER COLUMN type TYPE text, ADD COLUMN must text NOT NULL");
  Walrelay unfilled(config);
  CHECK(unfilled.run({"--check", "--config", unfilled.config_path()}) == 1);
  CHECK(unfilled.log().find("'s column \"must\" is NOT NULL without a default") != std::string::npos);
  // The archive's own columns (archived_at) are welcome: a default fills them.
  f.db().exec("ALTER TABLE " + archived + " DROP COLUMN must");
  Walrelay relay(config);
  CHECK(relay.run({"--check", "--config", relay.config_path()}) == 0);
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);

  // Held back by a pause: nothing sent, so nothing deleted or archived.
  REQUIRE(relay.request("POST", "/pause", drop_controller).status == 202);
  REQUIRE(eventually([&] { return connector_state(relay) == "PAUSED"; }, 30s, 50ms));
  for (long seq = 0; seq < 30; ++seq) insert_old(f.db(), f.table, "Kept", "k" + std::to_string(seq % 4), seq);
  const double behind = runs_of(relay, "behind");
  REQUIRE(eventually([&] { return runs_of(relay, "behind") >= behind + 3; }, 30s, 50ms));
  CHECK(rows_in(f, f.table) == 30);
  CHECK(rows_in(f, archived) == 0);
  REQUIRE(relay.request("POST", "/resume", drop_controller).status == 202);
  CHECK(seqs_of(read_all(f, f.topic("Kept"))).size() == 30);
  REQUIRE(eventually([&] { return rows_in(f, f.table) == 0; }, 30s, 50ms));
  // Every row once in the archive, as it was in the outbox.
  CHECK(rows_in(f, archived) == 30);
  CHECK(f.db().scalar("SELECT count(DISTINCT (payload->>'seq')::int) FILTER (WHERE (payload->>'seq')::int BETWEEN 0 "
                      "AND 29 AND aggregatetype = 'Kept' AND created_at < now() - interval '59 minutes' AND "
                      "archived_at IS NOT NULL) FROM " + archived) == "30");
  CHECK(metric_at(relay, "walrelay_retention_rows_deleted_total", 30) == 30);

  // A column the archive lacks: the run fails, names it, and deletes nothing.
  f.db().exec("ALTER TABLE " + f.table + " ADD COLUMN note text");
  for (long seq = 30; seq < 35; ++seq) insert_old(f.db(), f.table, "Kept", "k", seq);
  CHECK(seqs_of(read_all(f, f.topic("Kept"))).size() == 35);
  const double errors = runs_of(relay, "error");
  REQUIRE(eventually([&] { return runs_of(relay, "error") >= errors + 2; }, 30s, 50ms));
  CHECK(relay.log().find("column \"note\" of relation \"" + name + "\" does not exist") != std::string::npos);
  CHECK(rows_in(f, f.table) == 5);
  CHECK(rows_in(f, archived) == 30);
  f.db().exec("ALTER TABLE " + archived + " ADD COLUMN note text");
  REQUIRE(eventually([&] { return rows_in(f, f.table) == 0; }, 30s, 50ms));
  CHECK(rows_in(f, archived) == 35);

  // A trigger that keeps no row: each batch rolls back, nothing is deleted.
  f.db().exec("CREATE FUNCTION " + archive + ".keep_none() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; "
              "END$$; CREATE TRIGGER keep_none BEFORE INSERT ON " + archived + " FOR EACH ROW EXECUTE FUNCTION " +
              archive + ".keep_none()");
  for (long seq = 35; seq < 38; ++seq) insert_old(f.db(), f.table, "Kept", "k", seq);
  CHECK(seqs_of(read_all(f, f.topic("Kept"))).size() == 38);
  const double more_errors = runs_of(relay, "error");
  REQUIRE(eventually([&] { return runs_of(relay, "error") >= more_errors + 2; }, 30s, 50ms));
  CHECK(relay.log().find("kept 0 of 3 rows (a trigger or a rule on it?)") != std::string::npos);
  CHECK(rows_in(f, f.table) == 3);
  CHECK(rows_in(f, archived) == 35);
  f.db().exec("DROP TRIGGER keep_none ON " + archived);
  REQUIRE(eventually([&] { return rows_in(f, f.table) == 0; }, 30s, 50ms));
  CHECK(rows_in(f, archived) == 38);
  CHECK(metric_at(relay, "walrelay_retention_rows_deleted_total", 38) == 38);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
  f.db().exec("DROP SCHEMA " + archive + " CASCADE");
}

TEST_CASE("retention: drop-partitions as table.retention.user - without the owning role each run fails saying so and "
          "nothing is frozen - granted the owner's role, the expired partition is frozen, detached and dropped "
          "once sent",
          "[relay][retention]") {
  Fixture f;
  create_range_outbox(f, false);
  const std::string owner = f.slot + "_owner", cleaner = f.slot + "_cleaner", password = "dr0p-" + f.slot;
  f.db().exec("CREATE ROLE " + owner + "; CREATE ROLE " + cleaner + " LOGIN PASSWORD '" + password + "'");
  struct DropRoles {
    std::string owner, cleaner;
    ~DropRoles() {
      try {
        Db db;
        db.exec("DROP OWNED BY " + cleaner + ", " + owner);
        db.exec("DROP ROLE IF EXISTS " + cleaner + "; DROP ROLE IF EXISTS " + owner);
      } catch (...) {
      }
    }
  } drop_roles{owner, cleaner};
  auto own_all = [&] {
    f.db().exec("DO $$DECLARE r regclass; BEGIN FOR r IN SELECT relid FROM pg_partition_tree('" + f.table +
                "') LOOP EXECUTE format('ALTER TABLE %s OWNER TO " + owner + "', r); END LOOP; END$$");
  };
  own_all();
  Walrelay relay(drop_config(f, "table.retention.user=" + cleaner + "\ntable.retention.password=" + password + "\n"));
  relay.start();
  relay.wait_streaming();
  wait_floor(relay);
  add_expiring_partition(f, relay);
  own_all();
  f.db().exec(insert_at(f.table, "Owned", 0, 10, hour_ago));  // _d2
  // _d2 expires; the cleaner may not lock or alter it.
  const double failed = runs_of(relay, "error");
  REQUIRE(eventually([&] { return runs_of(relay, "error") >= failed + 3; }, 60s, 50ms));
  CHECK(relay.log().find(": permission denied for table " + f.slot + "_outbox_d") != std::string::npos);
  CHECK(is_attached(f, f.table + "_d2"));
  CHECK(f.db().scalar("SELECT count(*) FROM pg_constraint WHERE conrelid = '" + f.table + "_d2'::regclass AND "
                      "NOT convalidated") == "0");  // not frozen
  f.db().exec("GRANT " + owner + " TO " + cleaner);
  auto seen = seqs_of(read_all(f, f.topic("Owned")));
  CHECK(seen.size() == 10);
  // _d2 and the empty _d3 (expired from the start).
  REQUIRE(eventually([&] { return !table_exists(f, f.table + "_d2") && !table_exists(f, f.table + "_d3"); }, 60s,
                     50ms));
  CHECK(is_attached(f, f.table + "_now"));
  CHECK(metric_at(relay, "walrelay_retention_partitions_removed_total", 2) == 2);
  CHECK(relay.log().find(password) == std::string::npos);
}
