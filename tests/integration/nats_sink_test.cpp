// sink.type=nats-jetstream against a real nats-server with JetStream
// (scripts/services.sh start nats), read back with nats-py
// (tests/integration/nats/read.py), never with walrelay's code. Each stream
// is the test's own, with JetStream's default duplicate window (2 min), so
// what a restart sends again is dropped by its Nats-Msg-Id: the stream must
// hold every event exactly once.
#include <csignal>

#include <nlohmann/json.hpp>

#include "test_util.hpp"

using namespace it;
using nlohmann::json;

namespace {

std::string nats_url() {
  static const bool started = [] {
    Services::control("start nats");
    return true;
  }();
  (void)started;
  auto url = Services::current("WALRELAY_TEST_NATS");
  REQUIRE_FALSE(url.empty());
  return url;
}

CommandResult nats_py(const std::string& args) {
  return run_command(test_python() + " " + WALRELAY_SOURCE_DIR + "/tests/integration/nats/read.py --url " +
                     nats_url() + " " + args + " 2>&1");
}

// A JetStream stream for the life of the object.
class Stream {
 public:
  Stream(std::string name, const std::string& subjects, const std::string& extra = "") : name_(std::move(name)) {
    auto r = nats_py("stream-add --name " + name_ + " --subjects '" + subjects + "' " + extra);
    INFO(r.output);
    REQUIRE(r.status == 0);
  }
  ~Stream() { nats_py("stream-delete --name " + name_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// The stream's messages as records: the subject as topic, the stream
// sequence as offset (one "partition"), the `key` header as key.
std::vector<KafkaRecord> read_stream(const std::string& stream, std::size_t at_least = 0,
                                     std::chrono::seconds timeout = 60s) {
  auto r = nats_py("read --name " + stream + " --count " + std::to_string(at_least) + " --timeout " +
                   std::to_string(timeout.count()));
  INFO(r.output.substr(0, 2000));
  REQUIRE(r.status == 0);
  std::vector<KafkaRecord> out;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    auto j = json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    KafkaRecord rec;
    rec.topic = j["subject"];
    rec.partition = 0;
    rec.offset = j["seq"];
    rec.value = j["data"].get<std::string>();
    for (auto& [name, value] : j["headers"].items()) {
      rec.headers.emplace_back(name, value.get<std::string>());
      if (name == "key") rec.key = value.get<std::string>();
    }
    out.push_back(std::move(rec));
  }
  return out;
}

// Everything, once the slot is confirmed past what was written so far:
// walrelay confirms only what a PubAck covered.
std::vector<KafkaRecord> read_stream_all(Fixture& f, const std::string& stream, std::chrono::milliseconds timeout = 120s) {
  auto end = f.db().current_wal_lsn();
  if (!eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, timeout, 100ms))
    FAIL("the slot was not confirmed past " << end << " in time (confirmed " << f.db().confirmed_flush(f.slot) << ")");
  return read_stream(stream);
}

// The fixture's configuration for the NATS sink: no kafka.* keys.
std::string nats_config(Fixture& f, const std::string& extra = "") {
  auto c = f.config("sink.type=nats-jetstream\nsink.nats-jetstream.url=" + nats_url() + "\n" + extra);
  auto p = c.find("kafka.bootstrap.servers=");
  REQUIRE(p != std::string::npos);
  c.erase(p, c.find('\n', p) - p + 1);
  return c;
}

// The NATS server down for the life of the object (its streams kept on
// disk), back on its port at the end or at restart().
class NatsOutage {
 public:
  NatsOutage() { Services::control("nats-stop"); }
  ~NatsOutage() {
    if (down_) try {
        Services::control("nats-start");
      } catch (...) {
      }
  }
  NatsOutage(const NatsOutage&) = delete;
  NatsOutage& operator=(const NatsOutage&) = delete;
  void restart() {
    Services::control("nats-start");
    down_ = false;
  }

 private:
  bool down_ = true;
};

// Every id in the stream once, none missing from the table, order per key kept.
void check_exactly_once(Fixture& f, const std::vector<KafkaRecord>& recs, std::size_t rows) {
  auto seen = ids_of(recs);
  CHECK(missing_ids(f.db(), f.table, seen).empty());
  CHECK(seen.count.size() == rows);
  CHECK(seen.duplicates() == 0);
  check_order_per_key(recs);
}

}  // namespace

TEST_CASE("nats: every committed event reaches its JetStream subject once, in commit order per key, with Nats-Msg-Id, "
          "its key and headers - never a rolled-back one - and /slot, /readyz and /metrics name the sink",
          "[nats]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Stream stream(f.slot, f.topic_prefix + ">");
  Walrelay relay(nats_config(f));
  relay.start();
  relay.wait_streaming();
  REQUIRE(eventually([&] { return relay.get("/readyz").status == 200; }, 20s));
  f.db().exec("BEGIN; " + insert_event(f.table, "Order", "rolled-back", "jsonb_build_object('seq', -1)") + " ROLLBACK");
  const long rows = 3000;
  Writer writer(f.table, "Order", rows, 10, 0ms);
  writer.join();
  REQUIRE(writer.committed() == rows);
  auto recs = read_stream_all(f, stream.name());
  check_exactly_once(f, recs, rows);
  for (auto& r : recs) {
    INFO(r.topic << " " << r.value.value_or(""));
    CHECK(r.topic == f.topic("Order"));
    CHECK(r.header("Nats-Msg-Id") == r.header("id"));
    CHECK(r.key.has_value());
    CHECK(r.value->find("rolled-back") == std::string::npos);
  }
  auto slot = relay.get("/slot");
  CHECK(slot.body.find("\"sink\":\"nats-jetstream\"") != std::string::npos);
  CHECK(relay.metric("walrelay_events_relayed_total").value_or(0) == rows);
  CHECK(relay.metric("walrelay_sink_info{sink=\"nats-jetstream\"}") == std::optional<double>(1));
}

TEST_CASE("nats: kill -9 under load, again and again: every committed event in the stream exactly once, in order per "
          "key (the duplicate window drops what a restart sends again)",
          "[nats][fault]") {
  const long total = scaled(8000, 40000);
  const int kills = static_cast<int>(scaled(3, 8));
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Stream stream(f.slot, f.topic_prefix + ">");
  const std::string cfg = nats_config(f, "max.inflight.records=500\nstatus.update.interval.ms=200\n");
  auto relay = std::make_unique<Walrelay>(cfg);
  relay->start();
  relay->wait_streaming();
  Writer writer(f.table, "Crash", total, 20, 10ms);
  int landed_in_flight = 0;
  for (int k = 0; k < kills; ++k) {
    REQUIRE(eventually([&] { return writer.committed() >= total * (k + 1) / (kills + 1); }, 120s, 10ms));
    bool in_flight = eventually([&] { return relay->metric("walrelay_inflight_records").value_or(0) > 0; }, 5s, 1ms);
    auto confirmed = f.db().confirmed_flush(f.slot), wal = f.db().current_wal_lsn();
    relay->signal(SIGKILL);
    if (in_flight && confirmed < wal) ++landed_in_flight;
    REQUIRE(relay->wait_exit(10s) == 128 + SIGKILL);
    relay = std::make_unique<Walrelay>(cfg);
    relay->start();
    wait_streaming_after(*relay, 0);
  }
  writer.join();
  REQUIRE(writer.failures() == 0);
  REQUIRE(writer.committed() == total);
  CHECK(landed_in_flight == kills);  // the premise: each kill left records unacknowledged
  auto recs = read_stream_all(f, stream.name(), 180s);
  std::cout << "nats crash: events=" << total << " kills=" << kills << " records=" << recs.size() << "\n";
  check_exactly_once(f, recs, total);
}

TEST_CASE("nats: the server restarted, then down 30 s under load: the slot holds below the first unacknowledged "
          "event, /readyz names NATS, in-flight stays bounded, and afterwards every event is there once, in order",
          "[nats][fault]") {
  const long inflight_limit = 500;
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Stream stream(f.slot, f.topic_prefix + ">");
  Walrelay relay(nats_config(f, "max.inflight.records=" + std::to_string(inflight_limit) + "\n"));
  relay.start();
  relay.wait_streaming();
  const long rows = 12000;
  Writer writer(f.table, "Outage", rows, 20, 5ms);
  // A restart in the middle of the stream.
  REQUIRE(eventually([&] { return writer.committed() >= rows / 4; }, 60s, 10ms));
  {
    NatsOutage restart;
    restart.restart();
  }
  // Then an outage of 30 s while the writer goes on.
  REQUIRE(eventually([&] { return writer.committed() >= rows / 2; }, 60s, 10ms));
  NatsOutage outage;
  // An event written during the outage: the slot stays below it.
  auto in_outage = parse_lsn(f.db().scalar("BEGIN;" + insert_event(f.table, "Outage", "k-outage", "jsonb_build_object('seq', -1)") +
                                           "SELECT pg_current_wal_insert_lsn(); COMMIT;"));
  auto down_at = std::chrono::steady_clock::now();
  double inflight_peak = 0;
  bool said_unreachable = false;
  while (std::chrono::steady_clock::now() - down_at < std::chrono::seconds(scaled(30, 60))) {
    REQUIRE(relay.running());
    REQUIRE(f.db().confirmed_flush(f.slot) < in_outage);
    auto ready = relay.get("/readyz");
    if (ready.status == 503 && ready.body.find("broker unreachable (nats-jetstream)") != std::string::npos)
      said_unreachable = true;
    inflight_peak = std::max(inflight_peak, relay.metric("walrelay_inflight_records").value_or(0));
    std::this_thread::sleep_for(250ms);
  }
  outage.restart();
  writer.join();
  REQUIRE(writer.failures() == 0);
  auto recs = read_stream_all(f, stream.name(), 180s);
  std::cout << "nats outage: rows=" << rows << " records=" << recs.size() << " inflight_peak=" << inflight_peak << "\n";
  CHECK(said_unreachable);
  CHECK(inflight_peak <= inflight_limit);
  check_exactly_once(f, recs, rows + 1);
  CHECK(eventually([&] { return relay.get("/readyz").status == 200; }, 30s));
}

TEST_CASE("nats: a frozen server (SIGSTOP) - at most sink.nats-jetstream.max.pending publishes wait, the walsender is "
          "held back, RSS stays flat - thawed, everything arrives once",
          "[nats][fault]") {
  const int max_pending = 200;
  const std::string pad = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 31))";
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Stream stream(f.slot, f.topic_prefix + ">");
  Walrelay relay(nats_config(f, "sink.nats-jetstream.max.pending=" + std::to_string(max_pending) +
                                    "\nsink.nats-jetstream.ack.timeout.ms=120000\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Freeze", "k0", "jsonb_build_object('seq', -1)"));
  REQUIRE(read_stream(stream.name(), 1).size() == 1);
  long rss_before = proc_status_kb(relay.pid(), "VmRSS");
  const std::string pid = Services::current("WALRELAY_RUN_DIR") + "/nats/pid";
  const long rows = 20000;  // 1 KB each: 20 MB, a hundred times the bound's worth
  REQUIRE(run_command("kill -STOP $(cat " + pid + ")").status == 0);
  struct Thaw {
    std::string pid;
    ~Thaw() { run_command("kill -CONT $(cat " + pid + ")"); }
  } thaw{pid};
  Writer writer(f.table, "Freeze", rows, 100, 0ms, 16, pad);
  writer.join();
  REQUIRE(writer.committed() == rows);
  double inflight_peak = 0;
  long rss_peak = rss_before;
  for (int i = 0; i < 20; ++i) {
    inflight_peak = std::max(inflight_peak, relay.metric("walrelay_inflight_records").value_or(0));
    rss_peak = std::max(rss_peak, proc_status_kb(relay.pid(), "VmRSS"));
    std::this_thread::sleep_for(250ms);
  }
  auto sent = f.db().sent_lsn(f.slot), wal = f.db().current_wal_lsn();
  INFO("walsender sent " << sent << " of " << wal);
  CHECK(wal - sent > 10ull * 1024 * 1024);
  CHECK(inflight_peak == max_pending);
  CHECK(relay.metric("walrelay_backpressure") == std::optional<double>(1));
  CHECK(rss_peak - rss_before < 16 * 1024);
  REQUIRE(run_command("kill -CONT $(cat " + pid + ")").status == 0);
  auto recs = read_stream_all(f, stream.name(), 180s);
  std::cout << "nats freeze: rows=" << rows << " inflight_peak=" << inflight_peak << " rss_before=" << rss_before / 1024
            << "MB rss_peak=" << rss_peak / 1024 << "MB\n";
  check_exactly_once(f, recs, rows + 1);
}

TEST_CASE("nats: no stream for the subject holds the slot with the subject named on /readyz, dead-letters nothing, "
          "and once a stream takes it every event arrives",
          "[nats][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  const std::string dlq = f.slot + "_dead";
  Stream dead(f.slot + "_dlq", dlq);
  Walrelay relay(nats_config(f, "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" + dlq + "\n"));
  relay.start();
  relay.wait_streaming();
  auto in_first = parse_lsn(f.db().scalar("BEGIN;" + insert_event(f.table, "Lost", "k", "jsonb_build_object('seq', -1)") +
                                          "SELECT pg_current_wal_insert_lsn(); COMMIT;"));
  for (int i = 0; i < 3; ++i) f.db().exec(insert_event(f.table, "Lost", "k" + std::to_string(i), "jsonb_build_object('seq', " + std::to_string(i) + ")"));
  HttpResponse ready;
  REQUIRE(eventually([&] { return (ready = relay.get("/readyz")).body.find("no JetStream stream takes subject") != std::string::npos; }, 20s));
  CHECK(ready.status == 503);
  CHECK(ready.body.find(f.topic("Lost")) != std::string::npos);
  CHECK(relay.log().find("no JetStream stream takes subject \"" + f.topic("Lost") + "\"") != std::string::npos);
  CHECK(f.db().confirmed_flush(f.slot) < in_first);
  Stream stream(f.slot, f.topic_prefix + ">");
  auto recs = read_stream_all(f, stream.name());
  check_exactly_once(f, recs, 4);
  CHECK(read_stream(dead.name()).empty());
  CHECK(eventually([&] { return relay.get("/readyz").status == 200; }, 20s));
}

TEST_CASE("nats: a message the stream refuses for good (over its max_msg_size) goes to the dead-letter subject with its "
          "id and the reason, the others go on in order",
          "[nats][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  const std::string dlq = f.slot + "_dead";
  Stream stream(f.slot, f.topic_prefix + "Order", "--max-msg-size 600");
  Stream dead(f.slot + "_dlq", dlq);
  Walrelay relay(nats_config(f, "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" + dlq + "\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Order", "a", "jsonb_build_object('seq', 1)"));
  f.db().exec(insert_event(f.table, "Order", "a", "jsonb_build_object('seq', 2, 'pad', repeat('x', 2000))"));
  f.db().exec(insert_event(f.table, "Order", "a", "jsonb_build_object('seq', 3)"));
  auto big_id = f.db().scalar("SELECT id FROM " + f.table + " WHERE payload ? 'pad'");
  auto recs = read_stream_all(f, stream.name());
  REQUIRE(recs.size() == 2);
  CHECK(recs[0].value->find("\"seq\": 1") != std::string::npos);
  CHECK(recs[1].value->find("\"seq\": 3") != std::string::npos);
  auto dead_recs = read_stream(dead.name(), 1);
  REQUIRE(dead_recs.size() == 1);
  INFO("dead letter: " << dead_recs[0].value.value_or("(none)").substr(0, 300));
  CHECK(dead_recs[0].header("id") == big_id);
  CHECK(dead_recs[0].header("walrelay.error.reason") == std::optional<std::string>("msg_size_too_large"));
  CHECK(dead_recs[0].key == std::optional<std::string>("a"));
  // Too large for the stream, so too large to copy: dropped, its size named (as for Kafka).
  CHECK(dead_recs[0].value == std::optional<std::string>(""));
  CHECK(std::stol(dead_recs[0].header("walrelay.value.dropped.bytes").value_or("0")) > 2000);
  CHECK(dead_recs[0].header("__connect.errors.topic") == f.topic("Order"));
  CHECK(relay.metric("walrelay_dead_lettered_total").value_or(0) == 1);
}

TEST_CASE("nats: a second walrelay on the slot waits as standby and takes over after kill -9: every event once, in order",
          "[nats][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Stream stream(f.slot, f.topic_prefix + ">");
  Walrelay first(nats_config(f));
  first.start();
  first.wait_streaming();
  Walrelay second(nats_config(f));
  second.start();
  REQUIRE(eventually([&] { return second.get("/slot").body.find("\"standby\"") != std::string::npos; }, 20s));
  CHECK(second.get("/readyz").status == 503);
  const long rows = scaled(4000, 20000);
  Writer writer(f.table, "Standby", rows, 10, 10ms);
  REQUIRE(eventually([&] { return first.metric("walrelay_events_relayed_total").value_or(0) > 500; }, 60s, 100ms));
  first.signal(SIGKILL);
  REQUIRE(first.wait_exit(10s) == 128 + SIGKILL);
  wait_streaming_after(second, 0, 30s);
  CHECK(eventually([&] { return second.get("/readyz").status == 200; }, 10s));
  writer.join();
  REQUIRE(writer.committed() == rows);
  check_exactly_once(f, read_stream_all(f, stream.name()), rows);
}
