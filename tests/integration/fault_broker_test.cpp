// Fault: the broker is stopped mid-run and started again. walrelay keeps
// running, confirms nothing past the first unacknowledged record, holds back
// (backpressure) with memory bounded, and delivers everything afterwards in
// order per key.
#include <csignal>

#include "test_util.hpp"

using namespace it;

TEST_CASE("fault: broker down mid-run - slot held, backpressure, bounded RSS, everything in order afterwards",
          "[fault][broker][solo]") {
  const auto outage_length = std::chrono::seconds(scaled(15, 30));
  const long inflight_limit = 1000;
  const long rows = 20000;  // written while the broker is down: 20 times the limit
  // 2 KB payloads that do not compress (they would, in the WAL): buffering
  // the 20,000 rows would cost ~40 MB, the limit's worth ~2 MB; the RSS
  // bound below tells the two apart.
  const std::string pad = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 63))";
  const std::string payload = "jsonb_build_object('seq', -1, 'pad', " + pad + ")";
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config("max.inflight.records=" + std::to_string(inflight_limit) + "\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Outage", "k0", payload));
  REQUIRE(read_topic(f.topic("Outage"), 1).size() == 1);
  auto settled = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= settled; }, 15s));
  long rss_before = proc_status_kb(relay.pid(), "VmRSS");

  BrokerOutage outage;
  auto down_at = std::chrono::steady_clock::now();
  // One row first, on its own: it cannot be acknowledged while the broker is
  // down, so the slot must stay below its commit (see docs/reliability.md,
  // "the bound").
  f.db().exec(insert_event(f.table, "Outage", "first-during-outage", "jsonb_build_object('seq', -2)"));
  auto first_commit_end = f.db().current_wal_lsn();
  Writer writer(f.table, "Outage", rows, 100, 0ms, 16, pad);

  // While the broker is down: the slot never passes the first unacknowledged
  // record, walrelay runs, holds at most the limit in flight, RSS stays flat.
  long rss_peak = rss_before;
  double inflight_peak = 0;
  std::optional<double> backpressure;
  std::vector<std::uint64_t> sent;  // the walsender's sent_lsn, sampled
  while (std::chrono::steady_clock::now() - down_at < outage_length) {
    REQUIRE(f.db().confirmed_flush(f.slot) < first_commit_end);
    REQUIRE(relay.running());
    rss_peak = std::max(rss_peak, proc_status_kb(relay.pid(), "VmRSS"));
    auto inflight = relay.metric("walrelay_inflight_records");
    REQUIRE(inflight);  // absent is not zero
    inflight_peak = std::max(inflight_peak, *inflight);
    if (auto b = relay.metric("walrelay_backpressure"); b && *b == 1) backpressure = b;
    sent.push_back(f.db().sent_lsn(f.slot));
    std::this_thread::sleep_for(250ms);
  }
  writer.join();
  REQUIRE(writer.failures() == 0);
  REQUIRE(writer.committed() == rows);
  auto after_rows = f.db().current_wal_lsn();
  // The server's side of backpressure: the walsender stopped sending long
  // before the end of the WAL, and stood still for the last seconds.
  REQUIRE(sent.size() >= 8);
  INFO("walsender sent_lsn at the end " << sent.back() << ", WAL end " << after_rows);
  CHECK(after_rows - sent.back() > 20ull * 1024 * 1024);
  CHECK(sent.back() == sent[sent.size() - 8]);
  outage.restart();
  auto up_at = std::chrono::steady_clock::now();

  auto recs = read_all(f, f.topic("Outage"), 180s);
  auto seen = ids_of(recs);
  double catch_up_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - up_at).count();
  std::cout << "fault broker: outage=" << outage_length.count() << "s rows=" << rows
            << " inflight_peak=" << inflight_peak << " backpressure=" << backpressure.value_or(0)
            << " rss_before=" << rss_before / 1024 << "MB rss_peak=" << rss_peak / 1024 << "MB caught up "
            << catch_up_s << "s after the broker returned duplicates=" << seen.duplicates() << "\n";
  CHECK(missing_ids(f.db(), f.table, seen).empty());
  CHECK(seen.count.size() == static_cast<std::size_t>(rows + 2));
  check_order_per_key(recs);
  CHECK(backpressure == std::optional<double>(1));
  // The limit was reached, and never exceeded.
  CHECK(inflight_peak == inflight_limit);
  // 40 MB of rows waited in the WAL, not in walrelay: RSS grows by the
  // limit's worth of records and librdkafka's buffers, well under 16 MB.
  CHECK(rss_peak - rss_before < 16 * 1024);
  CHECK(relay.running());
  CHECK(eventually([&] { return relay.get("/readyz").status == 200; }, 30s));
}

TEST_CASE("fault: a finite kafka.message.timeout.ms with errors.tolerance=all - an outage dead-letters nothing, every "
          "event arrives after it",
          "[fault][broker][solo]") {
  // Kafka Connect's delivery.timeout.ms=300000 copied as 5 s: records time
  // out while the broker is down. A time-out is not the record's fault: it is
  // sent again from the slot, never dead-lettered, and walrelay never halts.
  const auto outage = std::chrono::seconds(15);
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  const std::string dlq = f.slot + ".dlq";
  Walrelay relay(f.config("kafka.message.timeout.ms=5000\nerrors.tolerance=all\nerrors.deadletterqueue.topic.name=" +
                          dlq + "\nreconnect.backoff.ms=200\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Timeout", "k0", "jsonb_build_object('seq', -1)"));
  REQUIRE(read_topic(f.topic("Timeout"), 1).size() == 1);
  auto settled = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= settled; }, 15s));

  BrokerOutage broker;
  auto down_at = std::chrono::steady_clock::now();
  f.db().exec(insert_event(f.table, "Timeout", "first-during-outage", "jsonb_build_object('seq', -2)"));
  auto before_rows = f.db().current_wal_lsn();
  Writer writer(f.table, "Timeout", 600, 1, 20ms);
  while (std::chrono::steady_clock::now() - down_at < outage) {
    REQUIRE(f.db().confirmed_flush(f.slot) < before_rows);
    REQUIRE(relay.running());
    std::this_thread::sleep_for(250ms);
  }
  writer.join();
  REQUIRE(writer.failures() == 0);
  // The premise: records did time out while the broker was down.
  double timeouts = 0, replays = 0;
  auto body = relay.get("/metrics").body;
  timeouts = relay.metric("walrelay_delivery_errors_total").value_or(0);
  replays = relay.metric("walrelay_replays_total").value_or(0);
  INFO("delivery errors " << timeouts << " replays " << replays);
  CHECK(body.find("walrelay_delivery_errors_total{reason=\"msg_timed_out\"}") != std::string::npos);
  CHECK(replays >= 1);
  broker.restart();

  const long rows = 600 + 2;
  auto recs = read_all(f, f.topic("Timeout"), 180s);
  auto seen = ids_of(recs);
  CHECK(missing_ids(f.db(), f.table, seen).empty());
  CHECK(seen.count.size() == static_cast<std::size_t>(rows));
  check_order_per_key(recs);
  // Nothing went to the dead-letter topic, and walrelay never halted.
  CHECK(count_records(dlq) == 0);
  CHECK_FALSE(relay.metric("walrelay_dead_lettered_total").has_value());
  CHECK(relay.metric("walrelay_halted").value_or(-1) == 0);
  CHECK(relay.running());
  std::cout << "fault broker timeouts: delivery errors " << timeouts << ", replays " << replays << ", records "
            << seen.records << ", duplicates " << seen.duplicates() << "\n";
}
