// Partitioned outbox tables, and rows the publication sends from tables that
// are not the outbox: every event arrives, and nothing is skipped without a
// count and a warning.
#include <csignal>

#include "test_util.hpp"

using namespace it;

namespace {

// A range-partitioned outbox with a plain partition, a list-sub-partitioned
// one and a default partition (the pg_partman shape, plus the odd ones).
void create_partitioned_outbox(Db& db, const std::string& t) {
  db.exec("CREATE TABLE " + t +
          " (id uuid NOT NULL DEFAULT gen_random_uuid(), aggregatetype text NOT NULL, aggregateid text NOT NULL, "
          "type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now(), "
          "PRIMARY KEY (id, created_at, aggregatetype)) PARTITION BY RANGE (created_at);"
          "CREATE TABLE " + t + "_2026_01 PARTITION OF " + t + " FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');"
          "CREATE TABLE " + t + "_2026_02 PARTITION OF " + t +
          " FOR VALUES FROM ('2026-02-01') TO ('2026-03-01') PARTITION BY LIST (aggregatetype);"
          "CREATE TABLE " + t + "_2026_02_order PARTITION OF " + t + "_2026_02 FOR VALUES IN ('Order');"
          "CREATE TABLE " + t + "_2026_02_rest PARTITION OF " + t + "_2026_02 DEFAULT;"
          "CREATE TABLE " + t + "_default PARTITION OF " + t + " DEFAULT;");
}

std::string insert_at(const std::string& table, const std::string& type, const std::string& key,
                      const std::string& created_at) {
  return "INSERT INTO " + table + " (aggregatetype, aggregateid, type, payload, created_at) VALUES ('" + type +
         "', '" + key + "', 'Created', jsonb_build_object('k', '" + key + "'), '" + created_at + "');";
}

// The keys of every record in the topics, with how often each came.
std::map<std::string, int> keys_in(const std::vector<std::string>& topics, std::size_t expected) {
  std::map<std::string, int> keys;
  auto deadline = std::chrono::steady_clock::now() + 30s;
  do {
    keys.clear();
    for (auto& t : topics)
      for (auto& r : consume(t, 0, 1s))
        if (r.key) keys[*r.key]++;
  } while (keys.size() < expected && std::chrono::steady_clock::now() < deadline);
  return keys;
}

}  // namespace

TEST_CASE("relay: a partitioned outbox - leaf, sub-partitioned, default and newly attached partitions all relayed",
          "[relay][partition]") {
  Fixture f;
  create_partitioned_outbox(f.db(), f.table);
  Walrelay relay(f.config());
  relay.start();
  relay.wait_streaming();
  CHECK(f.db().scalar("SELECT pubviaroot FROM pg_publication WHERE pubname = '" + f.slot + "'") == "t");

  std::vector<std::string> keys;
  auto write = [&](const std::string& table, const std::string& type, const std::string& at) {
    keys.push_back("k" + std::to_string(keys.size()));
    f.db().exec(insert_at(table, type, keys.back(), at));
  };
  write(f.table, "Order", "2026-01-15 10:00+00");              // a leaf
  write(f.table, "Order", "2026-02-10 10:00+00");              // a sub-partition
  write(f.table, "Customer", "2026-02-11 10:00+00");           // its default sub-partition
  write(f.table, "Order", "2031-06-01 10:00+00");              // the default partition
  write(f.table + "_2026_01", "Customer", "2026-01-20 10:00+00");  // into a partition by its own name
  // Partitions made while walrelay runs: created, and attached.
  f.db().exec("CREATE TABLE " + f.table + "_2026_03 PARTITION OF " + f.table +
              " FOR VALUES FROM ('2026-03-01') TO ('2026-04-01')");
  write(f.table, "Order", "2026-03-05 10:00+00");
  f.db().exec("CREATE TABLE " + f.table + "_2026_04 (LIKE " + f.table + " INCLUDING DEFAULTS);"
              "ALTER TABLE " + f.table + " ATTACH PARTITION " + f.table + "_2026_04 FOR VALUES FROM ('2026-04-01') TO "
              "('2026-05-01')");
  write(f.table, "Customer", "2026-04-05 10:00+00");
  // The clean-up a partitioned outbox is for: detach and drop an old one.
  f.db().exec("ALTER TABLE " + f.table + " DETACH PARTITION " + f.table + "_2026_01; DROP TABLE " + f.table +
              "_2026_01");
  write(f.table, "Order", "2026-03-06 10:00+00");

  auto seen = keys_in({f.topic("Order"), f.topic("Customer")}, keys.size());
  for (auto& k : keys) {
    INFO("key " << k);
    CHECK(seen[k] == 1);
  }
  CHECK(seen.size() == keys.size());
  CHECK_FALSE(relay.metric("walrelay_skipped_rows_total").has_value());
  // Confirmed past every event: nothing was held back either.
  auto end = f.db().current_wal_lsn();
  CHECK(eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, 15s));
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}

TEST_CASE("relay: publication.autocreate.mode=disabled refuses a partitioned outbox published under its leaves' names",
          "[relay][partition]") {
  Fixture f;
  create_partitioned_outbox(f.db(), f.table);
  f.db().exec("CREATE PUBLICATION " + f.slot + " FOR TABLE " + f.table + " WITH (publish = 'insert')");
  const std::string config = f.config("publication.autocreate.mode=disabled\n");

  Walrelay check(config);
  CHECK(check.run({"--check", "--config", check.config_path()}) == 1);
  INFO(check.log());
  CHECK(check.log().find("publish_via_partition_root = true") != std::string::npos);

  Walrelay relay(config);
  relay.start();
  CHECK(relay.wait_exit(30s) == 3);
  CHECK(relay.log().find("publish_via_partition_root = true") != std::string::npos);
  CHECK(relay.log().find("streaming: START_REPLICATION") == std::string::npos);
  CHECK(f.db().scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'") == "0");

  // With the fix the message names, it streams.
  f.db().exec("ALTER PUBLICATION " + f.slot + " SET (publish_via_partition_root = true)");
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_at(f.table, "Order", "after-fix", "2026-01-15 10:00+00"));
  auto recs = read_topic(f.topic("Order"), 1);
  REQUIRE(recs.size() == 1);
  CHECK(recs[0].key == std::optional<std::string>("after-fix"));
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}

TEST_CASE("relay: rows the publication sends from other tables are counted and warned about once, never silently "
          "skipped",
          "[relay][partition]") {
  Fixture f;
  create_partitioned_outbox(f.db(), f.table);
  const std::string other = "public." + f.slot + "_other";
  f.db().exec("CREATE TABLE " + other + " (v int)");
  Walrelay relay(f.config());
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_at(f.table, "Order", "before", "2026-01-15 10:00+00"));
  REQUIRE(read_topic(f.topic("Order"), 1).size() == 1);

  // Someone changes the publication under walrelay: another table, and the
  // outbox's partitions under their own names.
  f.db().exec("ALTER PUBLICATION " + f.slot + " ADD TABLE " + other + ";"
              "ALTER PUBLICATION " + f.slot + " SET (publish_via_partition_root = false)");
  f.db().exec("INSERT INTO " + other + " SELECT generate_series(1, 3)");
  f.db().exec(insert_at(f.table, "Order", "leaf-named-1", "2026-01-16 10:00+00"));
  f.db().exec(insert_at(f.table, "Order", "leaf-named-2", "2026-01-17 10:00+00"));
  REQUIRE(eventually([&] { return relay.metric("walrelay_skipped_rows_total").value_or(0) >= 5; }, 20s));
  auto body = relay.get("/metrics").body;
  INFO(body);
  CHECK(body.find("walrelay_skipped_rows_total{table=\"" + other + "\"} 3") != std::string::npos);
  CHECK(body.find("walrelay_skipped_rows_total{table=\"" + f.table + "_2026_01\"} 2") != std::string::npos);
  auto log = relay.log();
  CHECK(count_of(log, "the publication sends inserts into " + other + ",") == 1);
  CHECK(count_of(log, "the publication sends inserts into " + f.table + "_2026_01,") == 1);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}

TEST_CASE("relay: a generated route column - PostgreSQL 18 publishes it (publish_generated_columns), earlier majors "
          "refuse it at start",
          "[relay][generated]") {
  Fixture f;
  f.db().exec("CREATE TABLE " + f.table + " (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, kind text NOT NULL, "
              "aggregatetype text GENERATED ALWAYS AS ('Gen' || kind) STORED, aggregateid text NOT NULL, "
              "type text NOT NULL, payload jsonb)");
  Walrelay relay(f.config());
  relay.start();
  if (Services::pg_major() < 18) {
    CHECK(relay.wait_exit(30s) == 3);
    CHECK(relay.log().find("is a generated column, which PostgreSQL") != std::string::npos);
    return;
  }
  relay.wait_streaming();
  CHECK(f.db().scalar("SELECT pubgencols FROM pg_publication WHERE pubname = '" + f.slot + "'") == "s");
  f.db().exec("INSERT INTO " + f.table + " (kind, aggregateid, type, payload) VALUES ('Order', 'k', 'x', '{}')");
  auto recs = read_topic(f.topic("GenOrder"), 1);
  REQUIRE(recs.size() == 1);
  CHECK(recs[0].key == std::optional<std::string>("k"));
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}
