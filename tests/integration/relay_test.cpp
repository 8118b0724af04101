// The relay end to end: real PostgreSQL, real Kafka, kcat as the judge.
#include <catch2/catch.hpp>

#include <csignal>
#include <set>
#include <thread>

#include "test_util.hpp"

#include <map>

using namespace it;


TEST_CASE("relay: every committed event arrives once with topic, key, value, headers and timestamp - rollbacks never",
          "[relay]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  Walrelay relay(f.config("table.fields.additional.placement=type:header:eventType"));
  relay.start();
  relay.wait_streaming();

  f.db().exec("BEGIN;" + insert_event(f.table, "Order", "o-1", "'{\"n\": 1}'") +
            insert_event(f.table, "Customer", "c-1", "'{\"n\": 2}'") + "COMMIT;");
  f.db().exec("BEGIN;" + insert_event(f.table, "Order", "rolled-back", "'{\"n\": -1}'") + "ROLLBACK;");
  f.db().exec("BEGIN;" + insert_event(f.table, "Order", "o-2", "'{\"n\": 3}'") + "SAVEPOINT s;" +
            insert_event(f.table, "Order", "savepoint-rolled-back", "'{\"n\": -2}'") + "ROLLBACK TO SAVEPOINT s;" +
            insert_event(f.table, "Order", "o-3", "'{\"n\": 4}'") + "COMMIT;");
  // Updates and deletes of the outbox are not events.
  f.db().exec("UPDATE " + f.table + " SET type = 'Changed'; DELETE FROM " + f.table + " WHERE aggregateid = 'o-1';");

  // Once the slot is confirmed past everything written, every record walrelay
  // produced has been acknowledged: a wrong extra one would be there now.
  auto end = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, 30s));
  auto orders = consume(f.topic_prefix + "Order", 3);
  auto customers = consume(f.topic_prefix + "Customer", 1);
  REQUIRE(orders.size() == 3);
  REQUIRE(customers.size() == 1);
  std::set<std::string> keys;
  for (auto& r : orders) {
    REQUIRE(r.key);
    keys.insert(*r.key);
    CHECK(r.header("eventType") == std::optional<std::string>("Created"));
    REQUIRE(r.header("id"));
    CHECK(r.header("id")->size() == 36);  // a uuid's text form
    CHECK(r.timestamp_ms > 0);
  }
  CHECK(keys == std::set<std::string>{"o-1", "o-2", "o-3"});
  CHECK(customers[0].key == std::optional<std::string>("c-1"));
  CHECK(customers[0].value == std::optional<std::string>("{\"n\": 2}"));
  // jsonb's text form (normalised by PostgreSQL): the bytes PostgreSQL holds.
  for (auto& r : orders)
    if (r.key == "o-2") CHECK(r.value == std::optional<std::string>("{\"n\": 3}"));

  // The record timestamp is the commit time (within a second of now).
  auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::system_clock::now().time_since_epoch()).count();
  for (auto& r : orders) CHECK(std::abs(now_ms - r.timestamp_ms) < 60000);

  // Clean stop: exit 0, and the slot confirmed as far as the server's WAL.
  auto lsn_before_stop = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= lsn_before_stop; }, 15s));
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}

TEST_CASE("relay: the timestamp column sets the record timestamp", "[relay]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  Walrelay relay(f.config("table.field.event.timestamp=created_at"));
  relay.start();
  relay.wait_streaming();
  f.db().exec("INSERT INTO " + f.table +
            " (aggregatetype, aggregateid, type, payload, created_at) VALUES ('T', 'k', 'x', '{}', "
            "'2024-02-29 12:34:56.789+00')");
  auto recs = consume(f.topic_prefix + "T", 1);
  REQUIRE(recs.size() == 1);
  CHECK(recs[0].timestamp_ms == 1709210096789LL);
}

TEST_CASE("relay: pgoutput.binary=true - uuid and bigint ids, jsonb payloads, timestamps and headers as in text mode",
          "[relay]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  const std::string second = f.table + "_b";
  create_outbox(f.db(), second, "bigint");
  Walrelay relay(base_config(f.slot) + "table.include.list=" + f.table + "," + second +
                 "\nroute.topic.replacement=" + f.topic_prefix + "${routedByValue}\npgoutput.binary=true\n"
                 "table.field.event.timestamp=created_at\ntable.fields.additional.placement=type:header:eventType\n");
  relay.start();
  relay.wait_streaming();
  f.db().exec("INSERT INTO " + f.table + " (id, aggregatetype, aggregateid, type, payload, created_at) VALUES "
              "('6f1c2a4e-0b7d-4c1e-9a3f-2d5e8b7c9a01', 'Bin', 'k-uuid', 'Created', '{\"n\": 1, \"s\": \"é\"}', "
              "'2024-02-29 12:34:56.789+00')");
  f.db().exec("INSERT INTO " + second + " (aggregatetype, aggregateid, type, payload, created_at) VALUES "
              "('Bin', 'k-bigint', 'Updated', '[1, 2]', '1999-12-31 23:59:59.999+00')");
  auto recs = read_topic(f.topic("Bin"), 2);
  REQUIRE(recs.size() == 2);
  std::map<std::string, KafkaRecord> by_key;
  for (auto& r : recs) by_key[r.key.value_or("")] = r;
  auto& u = by_key["k-uuid"];
  CHECK(u.value == std::optional<std::string>("{\"n\": 1, \"s\": \"é\"}"));  // jsonb's text form
  CHECK(u.header("id") == std::optional<std::string>("6f1c2a4e-0b7d-4c1e-9a3f-2d5e8b7c9a01"));
  CHECK(u.header("eventType") == std::optional<std::string>("Created"));
  CHECK(u.timestamp_ms == 1709210096789LL);
  auto& b = by_key["k-bigint"];
  CHECK(b.value == std::optional<std::string>("[1, 2]"));
  CHECK(b.header("id") == std::optional<std::string>("1"));
  CHECK(b.header("eventType") == std::optional<std::string>("Updated"));
  CHECK(b.timestamp_ms == 946684799999LL);
  CHECK(relay.log().find("binary 'true'") != std::string::npos);
}

TEST_CASE("relay: per-key order holds across concurrent writers", "[relay]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  Walrelay relay(f.config());
  relay.start();
  relay.wait_streaming();
  constexpr int writers = 4, per_writer = 250, keys = 20;
  f.db().exec("CREATE TABLE " + f.slot + "_locks (k text PRIMARY KEY)");
  for (int k = 0; k < keys; ++k) {
    f.db().exec("CREATE SEQUENCE " + f.slot + "_k" + std::to_string(k));
    f.db().exec("INSERT INTO " + f.slot + "_locks VALUES ('k" + std::to_string(k) + "')");
  }
  std::vector<std::thread> threads;
  for (int w = 0; w < writers; ++w) {
    threads.emplace_back([&, w] {
      Db db;
      for (int i = 0; i < per_writer; ++i) {
        // Each key's sequence is taken under the key's row lock, held to
        // commit: commit order and sequence order agree per key.
        std::string key = "k" + std::to_string((w * per_writer + i) % keys);
        db.exec("BEGIN; SELECT 1 FROM " + f.slot + "_locks WHERE k = '" + key + "' FOR UPDATE; INSERT INTO " + f.table +
                " (aggregatetype, aggregateid, type, payload) SELECT 'Seq', '" + key +
                "', 'x', jsonb_build_object('seq', nextval('" + f.slot + "_" + key + "')); COMMIT;");
      }
    });
  }
  for (auto& t : threads) t.join();
  auto recs = read_topic(f.topic_prefix + "Seq", writers * per_writer, 120s);
  REQUIRE(recs.size() == writers * per_writer);
  CHECK(ids_of(recs).duplicates() == 0);
  check_order_per_key(recs);
}

TEST_CASE("relay: a 10,000-row transaction, bigint ids, several outbox tables", "[relay]") {
  Fixture f;
  std::string second = f.table + "_b";
  create_outbox(f.db(), f.table, "bigint");
  create_outbox(f.db(), second, "uuid");
  Walrelay relay(base_config(f.slot) + "table.include.list=" + f.table + "," + second +
                 "\nroute.topic.replacement=" + f.topic_prefix + "${routedByValue}\n");
  relay.start();
  relay.wait_streaming();
  f.db().exec("INSERT INTO " + f.table +
            " (aggregatetype, aggregateid, type, payload) SELECT 'Big', 'k' || (g % 100), 'x', "
            "jsonb_build_object('g', g) FROM generate_series(1, 10000) g");
  f.db().exec("INSERT INTO " + second + " (aggregatetype, aggregateid, type, payload) VALUES ('Second', 's', 'x', '{}')");
  auto big = consume(f.topic_prefix + "Big", 10000, 120s);
  REQUIRE(big.size() == 10000);
  std::set<std::string> ids;
  for (auto& r : big) ids.insert(*r.header("id"));
  CHECK(ids.size() == 10000);
  CHECK(ids.count("1"));  // bigint ids as their text form
  CHECK(ids.count("10000"));
  auto second_recs = consume(f.topic_prefix + "Second", 1);
  REQUIRE(second_recs.size() == 1);
  CHECK(second_recs[0].header("id")->size() == 36);
}

TEST_CASE("relay: json, text and bytea payloads are relayed as stored", "[relay]") {
  Fixture f;
  std::string t_json = f.table + "_json", t_text = f.table + "_text", t_bytea = f.table + "_bytea";
  create_outbox(f.db(), t_json, "uuid", "json");
  create_outbox(f.db(), t_text, "uuid", "text");
  create_outbox(f.db(), t_bytea, "uuid", "bytea");
  Walrelay relay(base_config(f.slot) + "table.include.list=" + t_json + "," + t_text + "," + t_bytea +
                 "\nroute.topic.replacement=" + f.topic_prefix + "${routedByValue}\n");
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(t_json, "Json", "k", "'{\"b\":1,  \"a\": [1,2]}'"));
  f.db().exec(insert_event(t_text, "Text", "k", "'plain text, ünïcödé ✓'"));
  f.db().exec(insert_event(t_bytea, "Bytea", "k", "'\\x00ff0a0d7f80'::bytea"));
  f.db().exec(insert_event(t_text, "Text", "k", "NULL"));
  auto json = consume(f.topic_prefix + "Json", 1);
  REQUIRE(json.size() == 1);
  CHECK(json[0].value == std::optional<std::string>("{\"b\":1,  \"a\": [1,2]}"));  // json keeps the text as written
  auto text = consume_values_raw(f.topic_prefix + "Text", 2);
  REQUIRE(text.size() == 2);
  CHECK(text[0] == std::optional<std::string>("plain text, ünïcödé ✓"));
  CHECK_FALSE(text[1].has_value());  // NULL payload: a tombstone
  auto bytea = consume_values_raw(f.topic_prefix + "Bytea", 1);
  REQUIRE(bytea.size() == 1);
  CHECK(bytea[0] == std::optional<std::string>(std::string("\x00\xff\x0a\x0d\x7f\x80", 6)));
}

TEST_CASE("relay: ALTER TABLE ADD COLUMN mid-stream", "[relay]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  Walrelay relay(f.config());
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Alter", "before", "'{}'"));
  REQUIRE(consume(f.topic_prefix + "Alter", 1).size() == 1);
  f.db().exec("ALTER TABLE " + f.table + " ADD COLUMN tenant text DEFAULT 'acme'");
  f.db().exec("ALTER TABLE " + f.table + " DROP COLUMN created_at");
  f.db().exec(insert_event(f.table, "Alter", "after", "'{\"v\": 2}'"));
  auto recs = consume(f.topic_prefix + "Alter", 2);
  REQUIRE(recs.size() == 2);
  std::set<std::string> keys;
  for (auto& r : recs) keys.insert(*r.key);
  CHECK(keys == std::set<std::string>{"before", "after"});
  CHECK(relay.running());
}

TEST_CASE("relay: the slot follows the server's WAL while the outbox is idle and another table is busy", "[relay]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  std::string busy = f.table + "_busy";
  f.db().exec("CREATE TABLE " + busy + " (id serial PRIMARY KEY, v text)");
  Walrelay relay(f.config());
  relay.start();
  relay.wait_streaming();
  for (int round = 0; round < 3; ++round) {
    f.db().exec("INSERT INTO " + busy + " (v) SELECT repeat('x', 100) FROM generate_series(1, 2000)");
    auto target = f.db().current_wal_lsn();
    INFO("round " << round);
    REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= target; }, 20s));
  }
}

TEST_CASE("relay: the slot never passes an unacknowledged record - it catches up after the broker returns",
          "[relay][broker][solo]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  Walrelay relay(f.config());
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Outage", "before", "'{}'"));
  REQUIRE(consume(f.topic_prefix + "Outage", 1).size() == 1);
  auto settled = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= settled; }, 15s));

  BrokerOutage outage;
  // The slot stays below the commit of the first unacknowledged transaction.
  // It may pass WAL inside that transaction (a keepalive while the walsender
  // decodes it), which is safe: a transaction is sent again whole. See
  // docs/reliability.md, "the bound".
  f.db().exec(insert_event(f.table, "Outage", "during-0", "'{}'"));
  auto first_commit_end = f.db().current_wal_lsn();
  for (int i = 1; i < 50; ++i) f.db().exec(insert_event(f.table, "Outage", "during-" + std::to_string(i), "'{}'"));
  auto after_rows = f.db().current_wal_lsn();
  // While the broker is down, rows are written and read, but the slot stays
  // below the first unacknowledged record's commit.
  auto deadline = std::chrono::steady_clock::now() + 8s;
  while (std::chrono::steady_clock::now() < deadline) {
    REQUIRE(f.db().confirmed_flush(f.slot) < first_commit_end);
    std::this_thread::sleep_for(250ms);
  }
  // /readyz reports the broker down.
  HttpResponse ready;
  CHECK(eventually([&] { return (ready = relay.get("/readyz")).status == 503; }, 30s));
  INFO("readyz: " << ready.status << " " << ready.body);
  CHECK(ready.body.find("broker") != std::string::npos);
  outage.restart();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= after_rows; }, 60s));
  auto recs = read_topic(f.topic_prefix + "Outage", 51, 120s);
  auto seen = ids_of(recs);
  CHECK(missing_ids(f.db(), f.table, seen).empty());
  CHECK(seen.count.size() == 51);
  CHECK(eventually([&] { return relay.get("/readyz").status == 200; }, 30s));
  CHECK(relay.running());
}

TEST_CASE("relay: zero SELECT load on the outbox", "[relay]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  f.db().exec("SELECT pg_stat_statements_reset()");
  // Table statistics reach pg_stat_user_tables late (14: the collector, every
  // 0.5 s; 15+: at a backend's next flush). A scan of our own is the
  // sentinel: once it shows, what came before it has landed too.
  auto scans = [&] {
    if (Services::pg_major() >= 15) f.db().exec("SELECT pg_stat_force_next_flush()");
    f.db().exec("SELECT pg_stat_clear_snapshot()");
    return std::stol(f.db().scalar("SELECT coalesce(seq_scan,0) + coalesce(idx_scan,0) FROM pg_stat_user_tables "
                                   "WHERE relid = '" + f.table + "'::regclass"));
  };
  auto sentinel = [&] {
    auto before = scans();
    f.db().exec("SELECT count(*) FROM " + f.table);
    REQUIRE(eventually([&] { return scans() > before; }, 10s));
    return scans();
  };
  const long baseline = sentinel();
  Walrelay relay(f.config());
  relay.start();
  relay.wait_streaming();
  for (int i = 0; i < 200; ++i) f.db().exec(insert_event(f.table, "Load", "k" + std::to_string(i % 7), "'{}'"));
  REQUIRE(consume(f.topic_prefix + "Load", 200).size() == 200);
  relay.signal(SIGTERM);
  REQUIRE(relay.wait_exit() == 0);
  CHECK(sentinel() == baseline + 1);  // our second sentinel, and no scan of walrelay's
  auto reads = f.db().exec("SELECT query FROM pg_stat_statements WHERE query ILIKE '%" + f.slot +
                         "_outbox%' AND query NOT ILIKE 'INSERT%' AND query NOT ILIKE 'CREATE%' AND query NOT ILIKE "
                         "'SELECT coalesce(seq_scan%' AND query NOT ILIKE 'SELECT pg_stat%' AND query NOT ILIKE "
                         "'SELECT count(*) FROM%'");
  for (auto& r : reads) INFO("statement touching the outbox: " << r[0].value_or(""));
  CHECK(reads.empty());
}

TEST_CASE("relay: kill -9 mid-run, then a restart: every committed event is in Kafka", "[relay]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  Walrelay relay(f.config());
  relay.start();
  relay.wait_streaming();
  constexpr int total = 5000;
  std::jthread writer([&] {
    Db db;
    for (int i = 0; i < total / 50; ++i)
      db.exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) SELECT 'Kill', 'k' || g, 'x', "
              "jsonb_build_object('i', " + std::to_string(i) + ", 'g', g) FROM generate_series(1, 50) g");
  });
  // Killed with records in flight: the slot is behind what walrelay has read.
  REQUIRE(eventually([&] { return relay.metric("walrelay_events_relayed_total").value_or(0) > 500; }, 60s));
  relay.signal(SIGKILL);
  CHECK(relay.wait_exit() == 128 + SIGKILL);
  writer.join();
  relay.start();
  relay.wait_streaming();
  auto ids = f.db().exec("SELECT id::text FROM " + f.table);  // the truth, read once at the end
  // Wait for every id, not for a record count: the records sent again after
  // the kill count towards a total long before the last events arrive.
  std::vector<KafkaRecord> recs;
  std::set<std::string> seen;
  std::size_t missing = 0;
  eventually([&] {
    recs = consume(f.topic_prefix + "Kill", total, 1s);
    seen.clear();
    for (auto& r : recs) seen.insert(*r.header("id"));
    missing = 0;
    for (auto& row : ids) missing += seen.count(*row[0]) ? 0 : 1;
    return missing == 0;
  }, 120s, 500ms);
  CHECK(missing == 0);
  CHECK(seen.size() == static_cast<std::size_t>(total));
  INFO("duplicates after kill -9: " << recs.size() - seen.size());
}

// replication.bulk.read (the default): while events come in bulk the socket
// wakes walrelay only once 16 KiB are queued; the tick reads what is there
// within a millisecond. Without that tick the tail of a burst would wait for
// the next status update (a minute here) or the server's keepalive.
TEST_CASE("relay: bulk reading - the last events of a burst arrive without waiting for more, and a lone event after "
          "it at once",
          "[relay]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config("status.update.interval.ms=60000\n"));
  relay.start();
  relay.wait_streaming();
  const long rows = 20000;
  auto relayed = [&] { return relay.metric("walrelay_events_relayed_total").value_or(0); };
  for (int burst = 0; burst < 3; ++burst) {
    Writer writer(f.table, "Bulk", rows, 1, 0ms);
    writer.join();
    REQUIRE(writer.committed() == rows);
    const double want = static_cast<double>((burst + 1) * rows + burst);
    CHECK(eventually([&] { return relayed() >= want; }, 10s, 10ms));
    f.db().exec(insert_event(f.table, "Bulk", "lone", "jsonb_build_object('seq', " + std::to_string(burst) + ")"));
    CHECK(eventually([&] { return relayed() >= want + 1; }, 10s, 10ms));
  }
  // The premise: the bursts were read in bulk.
  CHECK(relay.log().find("bulk reading on") != std::string::npos);
  relay.signal(SIGTERM);
  REQUIRE(relay.wait_exit(30s) == 0);
  // (Not read_all: with walrelay stopped the slot cannot follow the WAL
  // other tests write meanwhile. Every record was acknowledged above.)
  auto recs = read_topic(f.topic("Bulk"), static_cast<std::size_t>(3 * rows + 3), 60s);
  CHECK(ids_of(recs).count.size() == static_cast<std::size_t>(3 * rows + 3));
}

// helper-44: the end of the copy at a stop waits on the socket with no tick;
// left at 16 KiB, the low-water mark held the walsender's last bytes (fewer)
// until end_copy's 2 s deadline, and the final status update went unconfirmed.
TEST_CASE("relay: bulk reading - a stop in the middle of a burst ends the copy at once and confirms what was "
          "acknowledged",
          "[relay]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config());
  relay.start();
  relay.wait_streaming();
  Writer writer(f.table, "BulkStop", std::numeric_limits<long>::max(), 1, 0ms);
  // The premise: reading in bulk when the stop comes.
  REQUIRE(eventually([&] { return relay.log().find("bulk reading on") != std::string::npos; }, 30s, 10ms));
  REQUIRE(eventually([&] { return relay.metric("walrelay_events_relayed_total").value_or(0) > 5000; }, 30s, 10ms));
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit(30s) == 0);
  writer.stop();
  INFO(relay.log().substr(relay.log().size() > 3000 ? relay.log().size() - 3000 : 0));
  CHECK(relay.log().find("timed out: ending replication") == std::string::npos);
  CHECK(relay.log().find("final status update") != std::string::npos);
}
