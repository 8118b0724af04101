// The admin endpoint during a real run, checked against the server's truth
// (pg_replication_slots, pg_current_wal_lsn) and against what kcat reads.
#include <catch2/catch.hpp>

#include <csignal>
#include <regex>
#include <thread>

#include <simdjson.h>

#include "test_util.hpp"

using namespace it;

namespace {

struct SlotJson {
  std::string state, confirmed, server_wal_end, received, server_confirmed;
  std::uint64_t lag_bytes = 0, retained_wal_bytes = 0;
  double lag_seconds = 0;
  std::uint64_t inflight = 0;
  bool has_server = false;
  std::string wal_status;
};

SlotJson parse_slot(const std::string& body) {
  simdjson::ondemand::parser parser;
  simdjson::padded_string json(body);
  auto doc = parser.iterate(json);
  SlotJson s;
  s.state = std::string(std::string_view(doc["state"].get_string().value()));
  s.received = std::string(std::string_view(doc["received_lsn"].get_string().value()));
  s.confirmed = std::string(std::string_view(doc["confirmed_flush_lsn"].get_string().value()));
  s.server_wal_end = std::string(std::string_view(doc["server_wal_end"].get_string().value()));
  s.lag_bytes = doc["lag_bytes"].get_uint64().value();
  s.retained_wal_bytes = doc["retained_wal_bytes"].get_uint64().value();
  s.lag_seconds = doc["lag_seconds"].get_double().value();
  s.inflight = doc["inflight_records"].get_uint64().value();
  auto server = doc["server"];
  if (!server.is_null()) {
    s.has_server = true;
    s.wal_status = std::string(std::string_view(server["wal_status"].get_string().value()));
    s.server_confirmed = std::string(std::string_view(server["confirmed_flush_lsn"].get_string().value()));
  }
  return s;
}

}  // namespace

TEST_CASE("admin: /slot and /metrics agree with the server and with Kafka", "[admin]") {
  Fixture f;
  Db& db = f.db();
  const std::string& slot = f.slot;
  const std::string& table = f.table;
  create_outbox(db, table);
  Walrelay relay(base_config(slot) + "table.include.list=" + table + "\nroute.topic.replacement=" + slot +
                 ".events\nadmin.token=s3cret-token\n");
  relay.start();
  relay.wait_streaming();

  // Auth: everything but /healthz needs the token.
  CHECK(relay.get("/healthz").status == 200);
  CHECK(relay.get("/metrics").status == 401);
  CHECK(relay.get("/slot").status == 401);
  CHECK(relay.get("/slot", "wrong").status == 401);
  // ready once a broker answers the producer's metadata probe
  CHECK(eventually([&] { return relay.get("/readyz", "s3cret-token").status == 200; }, 10s));

  for (int i = 0; i < 20; ++i)
    db.exec("INSERT INTO " + table + " (aggregatetype, aggregateid, type, payload) SELECT 'A', 'k' || g, 't', "
            "jsonb_build_object('g', g) FROM generate_series(1, 50) g");
  auto recs = consume(slot + ".events", 1000, 60s);
  REQUIRE(recs.size() == 1000);

  // The slot: walrelay's view equals the server's once the status update lands.
  auto wal = db.current_wal_lsn();
  REQUIRE(eventually([&] { return db.confirmed_flush(slot) >= wal; }, 15s));
  SlotJson s;
  REQUIRE(eventually([&] {
    auto r = relay.get("/slot", "s3cret-token");
    if (r.status != 200) return false;
    s = parse_slot(r.body);
    return parse_lsn(s.confirmed) == db.confirmed_flush(slot) && s.has_server;
  }, 15s));
  CHECK(s.state == "streaming");
  CHECK(s.inflight == 0);
  CHECK(s.lag_seconds == 0);
  CHECK(s.wal_status == "reserved");
  // lag_bytes = the server's WAL position - the slot's confirmed_flush_lsn,
  // each the newer of what the slot poller last read from the server (up to
  // slot.status.interval.ms old) and what the stream knows: right after the
  // slot caught up the poller's answer may still show the old lag.
  CHECK(parse_lsn(s.server_wal_end) <= db.current_wal_lsn());
  CHECK(parse_lsn(s.server_confirmed) <= db.confirmed_flush(slot));
  const auto confirmed = std::max(parse_lsn(s.server_confirmed), parse_lsn(s.confirmed));
  const auto wal_end = parse_lsn(s.server_wal_end);
  CHECK(s.lag_bytes == (wal_end > confirmed ? wal_end - confirmed : 0));
  CHECK(s.lag_bytes <= db.current_wal_lsn() - db.confirmed_flush(slot) + 1024 * 1024);

  // /metrics: events relayed equals what kcat read; LSN gauges match /slot.
  auto m = relay.get("/metrics", "s3cret-token");
  REQUIRE(m.status == 200);
  CHECK(metric_value(m.body, "walrelay_events_relayed_total") == 1000);
  CHECK(metric_value(m.body, "walrelay_transactions_total") >= 20);
  CHECK(metric_value(m.body, "walrelay_inflight_records") == 0);
  CHECK(metric_value(m.body, "walrelay_ready") == 1);
  CHECK(metric_value(m.body, "walrelay_halted") == 0);
  CHECK(metric_value(m.body, "walrelay_status_updates_total") > 0);
  CHECK(metric_value(m.body, "process_resident_memory_bytes") > 0);
  CHECK(metric_value(m.body, "walrelay_flushed_lsn") == static_cast<double>(parse_lsn(s.confirmed)));
  // Latency histograms: one observation per transaction with outbox events
  // (20 statements of 50 rows), each well under a minute.
  CHECK(metric_value(m.body, "walrelay_commit_to_receive_seconds_count") == 20);
  CHECK(metric_value(m.body, "walrelay_commit_to_ack_seconds_count") == 20);
  CHECK(metric_value(m.body, "walrelay_commit_to_ack_seconds_bucket{le=\"+Inf\"}") == 20);
  double ack_sum = metric_value(m.body, "walrelay_commit_to_ack_seconds_sum").value_or(-1);
  CHECK(ack_sum > 0);
  CHECK(ack_sum < 20 * 60);
  CHECK(metric_value(m.body, "walrelay_commit_to_receive_seconds_sum") <= ack_sum);

  // The token appears nowhere in what walrelay printed or serves.
  CHECK(relay.log().find("s3cret-token") == std::string::npos);
  CHECK(m.body.find("s3cret-token") == std::string::npos);

  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}

TEST_CASE("admin: lag grows while the broker is down and /readyz says why", "[admin][broker][solo]") {
  Fixture f;
  Db& db = f.db();
  const std::string& slot = f.slot;
  const std::string& table = f.table;
  create_outbox(db, table);
  Walrelay relay(base_config(slot) + "table.include.list=" + table + "\nroute.topic.replacement=" + slot + ".events\n");
  relay.start();
  relay.wait_streaming();
  db.exec("INSERT INTO " + table + " (aggregatetype, aggregateid, type, payload) VALUES ('A', 'k', 't', '{}')");
  REQUIRE(consume(slot + ".events", 1).size() == 1);
  REQUIRE(eventually([&] { return relay.get("/readyz").status == 200; }, 10s));

  BrokerOutage outage;
  HttpResponse ready;
  REQUIRE(eventually([&] { return (ready = relay.get("/readyz")).status == 503; }, 30s));
  CHECK(ready.body.find("broker unreachable") != std::string::npos);
  CHECK(relay.get("/healthz").status == 200);  // alive, just not ready
  db.exec("INSERT INTO " + table + " (aggregatetype, aggregateid, type, payload) VALUES ('A', 'k2', 't', '{}')");
  SlotJson s;
  REQUIRE(eventually([&] {
    s = parse_slot(relay.get("/slot").body);
    return s.inflight == 1 && s.lag_seconds > 1.0 && s.lag_bytes > 0;
  }, 20s));
  CHECK(parse_lsn(s.confirmed) == db.confirmed_flush(slot));

  outage.restart();
  REQUIRE(eventually([&] { return relay.get("/readyz").status == 200; }, 60s));
  REQUIRE(consume(slot + ".events", 2, 60s).size() == 2);
  REQUIRE(eventually([&] {
    s = parse_slot(relay.get("/slot").body);
    return s.inflight == 0 && s.lag_seconds == 0;
  }, 30s));
}

// /readyz's view of the broker comes from a metadata probe when the producer
// starts and after every broker went down (librdkafka's statistics are off by
// default): with nothing written, no delivery can say the broker is back.
TEST_CASE("admin: /readyz follows the broker with nothing written - ready at start, not ready while it is down, "
          "ready again once it is back", "[admin][broker][solo]") {
  Fixture f;
  create_outbox(f.db(), f.table);
  Walrelay relay(base_config(f.slot) + "table.include.list=" + f.table + "\nroute.topic.replacement=" + f.slot +
                 ".events\n");
  relay.start();
  relay.wait_streaming();
  REQUIRE(eventually([&] { return relay.get("/readyz").status == 200; }, 10s));
  {
    BrokerOutage outage;
    HttpResponse ready;
    REQUIRE(eventually([&] { return (ready = relay.get("/readyz")).status == 503; }, 30s));
    CHECK(ready.body.find("broker unreachable") != std::string::npos);
    outage.restart();
    REQUIRE(eventually([&] { return relay.get("/readyz").status == 200; }, 60s));
  }
  CHECK(relay.log().find("kafka: broker reachable again") != std::string::npos);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}

TEST_CASE("admin: slot lag follows the server's WAL while walrelay holds back - 50 MB written, lag past 50 MB",
          "[admin][broker][solo]") {
  Fixture f;
  Db& db = f.db();
  const std::string& slot = f.slot;
  const std::string& table = f.table;
  create_outbox(db, table);
  db.exec("CREATE TABLE " + slot + "_filler (v text)");
  // One record in flight is the limit: with the broker down, walrelay stops
  // reading at once and the stream's own WAL end stands still.
  Walrelay relay(base_config(slot) + "table.include.list=" + table + "\nroute.topic.replacement=" + slot +
                 ".events\nmax.inflight.records=1\n");
  relay.start();
  relay.wait_streaming();
  db.exec("INSERT INTO " + table + " (aggregatetype, aggregateid, type, payload) VALUES ('A', 'k', 't', '{}')");
  REQUIRE(consume(slot + ".events", 1).size() == 1);

  BrokerOutage outage;
  db.exec("INSERT INTO " + table + " (aggregatetype, aggregateid, type, payload) VALUES ('A', 'k2', 't', '{}')");
  db.exec("INSERT INTO " + table + " (aggregatetype, aggregateid, type, payload) VALUES ('A', 'k3', 't', '{}')");
  REQUIRE(eventually([&] { return relay.metric("walrelay_backpressure") == 1; }, 20s));
  const std::uint64_t written_from = db.current_wal_lsn();
  db.exec("INSERT INTO " + slot + "_filler SELECT repeat(md5(g::text), 32) FROM generate_series(1, 50000) g");
  const std::uint64_t written = db.current_wal_lsn() - written_from;
  REQUIRE(written > 50ull * 1024 * 1024);
  SlotJson s;
  double metric_lag = 0;
  CHECK(eventually([&] {
    s = parse_slot(relay.get("/slot").body);
    metric_lag = relay.metric("walrelay_slot_lag_bytes").value_or(-1);
    return s.lag_bytes > written && metric_lag > static_cast<double>(written);
  }, 30s));
  INFO("written " << written << " lag_bytes " << s.lag_bytes << " metric " << metric_lag);
  CHECK(s.retained_wal_bytes >= s.lag_bytes);
  CHECK(relay.metric("walrelay_slot_retained_wal_bytes") >= static_cast<double>(written));
  // The server agrees.
  CHECK(db.current_wal_lsn() - db.confirmed_flush(slot) >= written);

  outage.restart();
  REQUIRE(consume(slot + ".events", 3, 60s).size() == 3);
  CHECK(eventually([&] { return parse_slot(relay.get("/slot").body).lag_bytes < 1024 * 1024; }, 60s));
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}
