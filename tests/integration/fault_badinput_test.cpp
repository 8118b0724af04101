// Fault: rows walrelay cannot relay. A row that cannot be mapped (NULL key),
// a payload larger than the producer accepts, a topic name Kafka rejects.
// errors.tolerance=none halts (exit 3) with the row named and the slot held
// before its transaction; errors.tolerance=all sends it to the dead-letter
// topic with the error headers and keeps going.
#include <csignal>

#include "test_util.hpp"

using namespace it;

namespace {

// An outbox whose key and route columns allow NULL, so a bad row can be written.
void create_loose_outbox(Db& db, const std::string& table) {
  db.exec("CREATE TABLE " + table +
          " (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, aggregatetype text, aggregateid text, type text, "
          "payload jsonb)");
}

// A good row of type Good with payload {"seq": n}.
std::string good_row(const std::string& table, int n) {
  return insert_event(table, "Good", "k0", "jsonb_build_object('seq', " + std::to_string(n) + ")");
}

struct BadRow {
  std::string name;        // what is wrong
  std::string insert;      // VALUES (...) after the column list
  std::string log_reason;  // a text only this row's halt message contains
  std::string reason;      // the reason label of walrelay_dead_lettered_total
  bool mapping;            // a mapping error (else the broker or producer refuses it)
};

std::vector<BadRow> bad_rows() {
  return {
      {"NULL aggregateid", "('Good', NULL, 'x', '{\"seq\": 100}')", "event key column \"aggregateid\" is NULL",
       "null_value", true},
      {"2 MB payload", "('Good', 'k0', 'x', jsonb_build_object('seq', 100, 'pad', repeat('x', 2000000)))",
       "too large", "msg_size_too_large", false},
      {"topic name Kafka rejects", "('bad topic/name', 'k0', 'x', '{\"seq\": 100}')",
       "makes an illegal Kafka topic name: it contains ' '", "invalid_topic", true},
  };
}

// Inserts the bad row in a transaction of its own; returns its id.
std::string insert_bad(Db& db, const std::string& table, const BadRow& bad) {
  return db.scalar("INSERT INTO " + table + " (aggregatetype, aggregateid, type, payload) VALUES " + bad.insert +
                   " RETURNING id");
}

}  // namespace

TEST_CASE("fault: errors.tolerance=none halts on a row it cannot relay, names it, and holds the slot before it",
          "[fault][badinput]") {
  for (auto& bad : bad_rows()) {
    DYNAMIC_SECTION(bad.name) {
      Fixture f;
      create_loose_outbox(f.db(), f.table);
      Walrelay relay(f.config("errors.tolerance=none\n"));
      relay.start();
      relay.wait_streaming();
      f.db().exec(good_row(f.table, 0));
      REQUIRE(read_topic(f.topic("Good"), 1).size() == 1);
      // A good row right before the bad one, not waited for: the halt must
      // drain it and confirm it. Its position is taken inside its transaction.
      auto inside_good = parse_lsn(f.db().scalar("BEGIN;" + good_row(f.table, 1) +
                                                 "SELECT pg_current_wal_insert_lsn(); COMMIT;"));
      auto id = insert_bad(f.db(), f.table, bad);
      // Past the bad row's commit (taken after it, by the same session): the
      // slot must stay below it. (A position taken before the bad row is no
      // bound: other tests' WAL between the two may be confirmed, rightly.)
      auto after_bad = f.db().current_wal_lsn();
      f.db().exec(good_row(f.table, 2));

      int code = relay.wait_exit(60s);
      auto log = relay.log();
      INFO("log tail:\n" << log.substr(log.size() > 4000 ? log.size() - 4000 : 0));
      REQUIRE(code == 3);
      // The halt names the table, the row's id and an LSN.
      auto halt = log.find("halted: ");
      REQUIRE(halt != std::string::npos);
      auto line = log.substr(halt, log.find('\n', halt) - halt);
      INFO("halt line: " << line);
      CHECK(line.find(f.slot + "_outbox") != std::string::npos);
      CHECK(line.find("id " + id) != std::string::npos);
      CHECK(line.find("LSN ") != std::string::npos);
      CHECK(line.find(bad.log_reason) != std::string::npos);
      // The row before it was relayed and confirmed; nothing at or past the
      // bad row's transaction was confirmed, and the row after it was not
      // relayed: a mapping error and a producer-side rejection both stop
      // walrelay before the next row.
      CHECK(f.db().confirmed_flush(f.slot) > inside_good);
      CHECK(f.db().confirmed_flush(f.slot) < after_bad);
      CHECK(count_records(f.topic("Good")) == 2);
      // A restart halts again on the same row: it is not skipped. (The
      // exact check: after_bad may lie past other sessions' WAL.)
      Walrelay again(f.config("errors.tolerance=none\n"));
      again.start();
      CHECK(again.wait_exit(60s) == 3);
      CHECK(again.log().find("id " + id) != std::string::npos);
      CHECK(f.db().confirmed_flush(f.slot) < after_bad);
    }
  }
}

TEST_CASE("fault: errors.tolerance=all sends a row it cannot relay to the dead-letter topic and keeps going",
          "[fault][badinput]") {
  for (auto& bad : bad_rows()) {
    DYNAMIC_SECTION(bad.name) {
      Fixture f;
      create_loose_outbox(f.db(), f.table);
      std::string dlq = f.topic_prefix + "dlq";
      Walrelay relay(f.config("errors.tolerance=all\nerrors.deadletterqueue.topic.name=" + dlq + "\n"));
      relay.start();
      relay.wait_streaming();
      f.db().exec(good_row(f.table, 0));
      auto id = insert_bad(f.db(), f.table, bad);
      for (int i = 1; i <= 20; ++i) f.db().exec(good_row(f.table, i));
      auto good = read_topic(f.topic("Good"), 21, 60s);
      auto dead = read_topic(dlq, 1, 60s);
      auto log = relay.log();
      INFO("log tail:\n" << log.substr(log.size() > 4000 ? log.size() - 4000 : 0));
      CHECK(good.size() == 21);
      REQUIRE(dead.size() == 1);
      auto& d = dead[0];
      for (auto& [k, v] : d.headers) INFO("header " << k << "=" << v.substr(0, 200));
      CHECK(d.header("id") == std::optional<std::string>(id));
      REQUIRE(d.header("__connect.errors.exception.message"));
      REQUIRE(d.header("__connect.errors.exception.class.name"));
      REQUIRE(d.header("walrelay.error.reason"));
      CHECK(d.header("walrelay.error.reason") == std::optional<std::string>(bad.reason));
      if (bad.mapping) {
        // A mapping error: the row as JSON, with where it came from.
        CHECK(d.header("walrelay.source.table") == std::optional<std::string>(f.table));
        CHECK(d.header("walrelay.source.lsn"));
        REQUIRE(d.value);
        CHECK(d.value->find("\"id\":\"" + id + "\"") != std::string::npos);
        if (bad.name == "NULL aggregateid") CHECK(d.value->find("\"aggregateid\":null") != std::string::npos);
      } else {
        // A delivery error: the original record, its topic named.
        CHECK(d.header("__connect.errors.topic"));
        if (bad.name == "2 MB payload") {
          CHECK(d.header("walrelay.value.dropped.bytes"));
          CHECK_FALSE(d.value);
        }
      }
      CHECK(relay.running());
      CHECK(metric_at(relay, "walrelay_dead_lettered_total", 1) == 1);
      CHECK(relay.get("/metrics").body.find("walrelay_dead_lettered_total{reason=\"" + bad.reason + "\"} 1") !=
            std::string::npos);
      auto settled = f.db().current_wal_lsn();
      CHECK(eventually([&] { return f.db().confirmed_flush(f.slot) >= settled; }, 20s));
    }
  }
}

TEST_CASE("fault: a mapped column dropped while walrelay runs - the next row halts naming it, the rows before are "
          "confirmed",
          "[fault][badinput]") {
  Fixture f;
  create_loose_outbox(f.db(), f.table);
  Walrelay relay(f.config("errors.tolerance=none\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(good_row(f.table, 0));
  REQUIRE(read_topic(f.topic("Good"), 1).size() == 1);
  auto inside_good = parse_lsn(f.db().scalar("BEGIN;" + good_row(f.table, 1) +
                                             "SELECT pg_current_wal_insert_lsn(); COMMIT;"));
  f.db().exec("ALTER TABLE " + f.table + " DROP COLUMN aggregateid");
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, type, payload) VALUES ('Good', 'x', '{\"seq\": 2}')");
  auto after_bad = f.db().current_wal_lsn();  // past the bad row's commit
  CHECK(relay.wait_exit(60s) == 3);
  auto log = relay.log();
  auto halt = log.find("halted: ");
  REQUIRE(halt != std::string::npos);
  auto line = log.substr(halt, log.find('\n', halt) - halt);
  INFO(line);
  CHECK(line.find("has no column aggregateid") != std::string::npos);
  CHECK(f.db().confirmed_flush(f.slot) > inside_good);
  CHECK(f.db().confirmed_flush(f.slot) < after_bad);
  CHECK(count_records(f.topic("Good")) == 2);
  // The exact check (after_bad may lie past other sessions' WAL): with the
  // column back (so that the start's catalog check passes), walrelay started
  // again from the slot meets the same row, decoded as it was written, and
  // halts on it.
  f.db().exec("ALTER TABLE " + f.table + " ADD COLUMN aggregateid text");
  Walrelay again(f.config("errors.tolerance=none\n"));
  again.start();
  CHECK(again.wait_exit(60s) == 3);
  CHECK(again.log().find("has no column aggregateid") != std::string::npos);
}
