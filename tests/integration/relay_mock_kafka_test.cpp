// The Relay in process against the real PostgreSQL and librdkafka's mock
// cluster: broker answers the real broker gives only by chance (a
// transaction the coordinator will not end) come on cue here.
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <iostream>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "in_process.hpp"
#include "test_util.hpp"
#include "walrelay/config.hpp"
#include "walrelay/exit_codes.hpp"
#include "walrelay/sinks/kafka/kafka_sink.hpp"
#include "walrelay/admin/metrics.hpp"
#include "walrelay/relay/relay.hpp"

using namespace it;
namespace asio = boost::asio;

namespace {

constexpr int16_t api_end_txn = 26;  // Kafka's EndTxn request
constexpr int16_t api_produce = 0;   // Kafka's Produce request

struct MockCluster {
  rd_kafka_t* rk = nullptr;
  rd_kafka_mock_cluster_t* mc = nullptr;
  explicit MockCluster(int brokers = 1) {
    char err[256];
    rk = rd_kafka_new(RD_KAFKA_PRODUCER, rd_kafka_conf_new(), err, sizeof err);
    REQUIRE(rk);
    mc = rd_kafka_mock_cluster_new(rk, brokers);
    REQUIRE(mc);
  }
  ~MockCluster() {
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(rk);
  }
  std::string bootstraps() const { return rd_kafka_mock_cluster_bootstraps(mc); }

  // The id headers of every record in `topic` (one partition), read with an
  // independent consumer.
  std::multiset<std::string> ids(const std::string& topic) const {
    auto seq = id_sequence(topic);
    return {seq.begin(), seq.end()};
  }
  // The same, in the partition's order.
  std::vector<std::string> id_sequence(const std::string& topic) const {
    char err[256];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", bootstraps().c_str(), err, sizeof err);
    rd_kafka_conf_set(conf, "group.id", "mock-reader", err, sizeof err);
    rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof err);  // no coordinator needed
    rd_kafka_conf_set(conf, "enable.partition.eof", "true", err, sizeof err);
    rd_kafka_t* c = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    REQUIRE(c);
    rd_kafka_topic_partition_list_t* parts = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(parts, topic.c_str(), 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(c, parts);
    rd_kafka_topic_partition_list_destroy(parts);
    std::vector<std::string> out;
    auto deadline = std::chrono::steady_clock::now() + 30s;
    for (bool eof = false; !eof && std::chrono::steady_clock::now() < deadline;) {
      rd_kafka_message_t* m = rd_kafka_consumer_poll(c, 200);
      if (!m) continue;
      if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) eof = true;
      rd_kafka_headers_t* hdrs = nullptr;
      const void* val = nullptr;
      size_t size = 0;
      if (!m->err && rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR &&
          rd_kafka_header_get_last(hdrs, "id", &val, &size) == RD_KAFKA_RESP_ERR_NO_ERROR)
        out.emplace_back(static_cast<const char*>(val), size);
      rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    return out;
  }
};

// What each test here starts from: an outbox, a mock cluster with the
// events' topic and the exactly-once offsets topic (one partition each),
// walrelay's log at warnings.
struct MockOutbox {
  Fixture f;
  MockCluster cluster;
  const std::string topic = f.topic("Mock");
  const std::string offsets = f.slot + ".offsets";
  explicit MockOutbox(int brokers = 1) : cluster(brokers) {
    create_outbox(f.db(), f.table, "bigint");
    REQUIRE(rd_kafka_mock_topic_create(cluster.mc, topic.c_str(), 1, 1) == RD_KAFKA_RESP_ERR_NO_ERROR);
    REQUIRE(rd_kafka_mock_topic_create(cluster.mc, offsets.c_str(), 1, 1) == RD_KAFKA_RESP_ERR_NO_ERROR);
    spdlog::set_level(spdlog::level::warn);
  }
  ~MockOutbox() { spdlog::set_level(spdlog::level::info); }
  // One-row transactions from..to-1 over `keys` keys.
  void write(int from, int to, int keys = 7) {
    for (int i = from; i < to; ++i)
      f.db().exec(insert_event(f.table, "Mock", "k" + std::to_string(i % keys), "'{}'"));
  }
  // One source transaction of `rows` rows of `type`, keyed prefix + i % 7.
  void write_one_transaction(const std::string& type, const std::string& prefix, int rows) {
    std::string tx = "BEGIN;";
    for (int i = 0; i < rows; ++i) tx += insert_event(f.table, type, prefix + std::to_string(i % 7), "'{}'");
    f.db().exec(tx + "COMMIT;");
  }
  // Ends walrelay's replication session as the server would (its walsender terminated).
  void terminate_walsender() {
    REQUIRE(f.db().scalar("SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots WHERE "
                          "slot_name = '" + f.slot + "' AND active_pid IS NOT NULL") == "1");
  }
};

// A Relay and a KafkaSink on their own loop thread, the sink made as
// main.cpp makes it: transactional when exactly.once.support asks for it.
struct InProcess : InProcessRelay<walrelay::KafkaSink> {
  InProcess(Fixture& f, const std::string& bootstraps, const std::string& extra)
      : InProcessRelay(
            walrelay::parse_config(
                with_key(with_key(f.config("status.update.interval.ms=100\nshutdown.timeout.ms=2000\n" + extra),
                                  "slot.status.interval.ms", "0"),
                         "kafka.bootstrap.servers", bootstraps),
                "relay_mock_kafka_test", {}),
            [](asio::io_context& io, const walrelay::Config& c) {
              std::optional<walrelay::KafkaTransactions> transactions;
              if (c.exactly_once)
                transactions = walrelay::KafkaTransactions{c.transactional_id(), c.offsets_topic,
                                                           c.transaction_boundary_interval_ms,
                                                           c.transaction_boundary_max_records};
              return std::make_unique<walrelay::KafkaSink>(io, c.kafka, std::move(transactions));
            }) {}
};

}  // namespace

TEST_CASE_METHOD(MockOutbox,
                 "relay with a mock cluster: exactly once - a transaction the coordinator will not end (a fatal "
                 "INVALID_TXN_STATE) replaces the producer, every event lands, nothing halts",
                 "[relay][eos]") {
  InProcess p(f, cluster.bootstraps(),
              "exactly.once.support=required\ntransaction.boundary.interval.ms=20\noffsets.storage.topic=" + offsets +
                  "\nreconnect.backoff.ms=100\nkafka.retry.backoff.ms=50\n");
  REQUIRE(eventually([&] { return p.status().state == walrelay::RelayState::streaming; }, 60s, 20ms));

  write(0, 20);
  REQUIRE(eventually([&] { return p.metrics.kafka_transactions("committed").Value() >= 1; }, 30s, 20ms));
  // The next transaction's end is refused as librdkafka 2.0 can meet it on a
  // real broker right after a connection loss: a fatal error.
  rd_kafka_mock_push_request_errors(cluster.mc, api_end_txn, 1, RD_KAFKA_RESP_ERR_INVALID_TXN_STATE);
  write(20, 200);
  auto end = f.db().current_wal_lsn();
  CHECK(eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, 60s, 50ms));
  CHECK(p.metrics.producer_replacements.Value() == 1);
  CHECK(p.metrics.replays.Value() >= 1);
  CHECK(p.status().state == walrelay::RelayState::streaming);
  auto ids = cluster.ids(topic);
  std::set<std::string> distinct(ids.begin(), ids.end());
  CHECK(distinct.size() == 200);
  CHECK(p.stop() == 0);
}

namespace {

// One broker: its id in the mock cluster.
constexpr int32_t mock_broker = 1;

// The next Produce answered after 1.5 s and the next EndTxn after 0.8 s
// with `end_txn`: a transaction older than 2 s when it ends, each request
// below librdkafka's request time-out (which is the transaction's).
void slow_transaction(rd_kafka_mock_cluster_t* mc, rd_kafka_resp_err_t end_txn) {
  REQUIRE(rd_kafka_mock_broker_push_request_error_rtts(mc, mock_broker, api_produce, 1, RD_KAFKA_RESP_ERR_NO_ERROR,
                                                       1500) == RD_KAFKA_RESP_ERR_NO_ERROR);
  REQUIRE(rd_kafka_mock_broker_push_request_error_rtts(mc, mock_broker, api_end_txn, 1, end_txn, 800) ==
          RD_KAFKA_RESP_ERR_NO_ERROR);
}

}  // namespace

TEST_CASE_METHOD(MockOutbox,
                 "relay with a mock cluster: exactly once - reading goes on while a transaction commits, and what came "
                 "meanwhile goes into the next transaction",
                 "[relay][eos]") {
  InProcess p(f, cluster.bootstraps(),
              "exactly.once.support=required\ntransaction.boundary.interval.ms=20000\ntransaction.boundary.max.records=1\n"
                  "offsets.storage.topic=" + offsets +
                  "\n");
  REQUIRE(eventually([&] { return p.status().state == walrelay::RelayState::streaming; }, 60s, 20ms));
  write(0, 10);
  const auto first = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= first; }, 30s, 20ms));
  // Every answer of the broker held back until the test lets it go (the
  // mock cluster delays each response by the broker's round-trip time, read
  // when it is due to go out): the next commit waits as long as the reads
  // below take, however loaded the machine.
  REQUIRE(rd_kafka_mock_broker_set_rtt(cluster.mc, mock_broker, 600000) == RD_KAFKA_RESP_ERR_NO_ERROR);
  const double committed_before = p.metrics.kafka_transactions("committed").Value();
  // One record is enough for a commit: a source transaction's end begins it
  // at once, so once it has been read, the slow commit is under way.
  write(10, 11);
  // Read: up to where the server was after the write (other tests' WAL,
  // written side by side, keeps moving the server's position on).
  const auto after_write = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return p.status().received_lsn.value >= after_write; }, 30s, 5ms));
  write(11, 60);  // 49 one-row transactions while it runs
  const auto written = f.db().current_wal_lsn();
  // All read (and held in the sink) while the commit waits: the read loop
  // did not stop for it.
  CHECK(eventually([&] { return p.status().received_lsn.value >= written; }, 30s, 5ms));
  CHECK(p.metrics.kafka_transactions("committed").Value() == committed_before);
  REQUIRE(rd_kafka_mock_broker_set_rtt(cluster.mc, mock_broker, 0) == RD_KAFKA_RESP_ERR_NO_ERROR);
  CHECK(eventually([&] { return f.db().confirmed_flush(f.slot) >= written; }, 30s, 20ms));
  // The slow one, then everything that waited for it in one transaction
  // (not one per source transaction: 49 would be 49). Beside those, a
  // transaction of the position alone may commit, at most once a second,
  // when other tests' WAL moves the server on (main-suite run 11 saw one).
  const double commits = p.metrics.kafka_transactions("committed").Value() - committed_before;
  CHECK(commits >= 2);
  CHECK(commits <= 5);
  auto ids = cluster.ids(topic);
  std::set<std::string> distinct(ids.begin(), ids.end());
  CHECK(distinct.size() == 60);
  CHECK(ids.size() == 60);  // nothing was aborted or replayed: each once
  CHECK(p.metrics.replays.Value() == 0);
  CHECK(p.stop() == 0);
}

TEST_CASE_METHOD(MockOutbox,
                 "relay with a mock cluster: exactly once - a commit that fails while records wait for it is aborted, "
                 "they are replayed from the committed position, every event lands, nothing halts",
                 "[relay][eos]") {
  InProcess p(f, cluster.bootstraps(),
              "exactly.once.support=required\ntransaction.boundary.interval.ms=0\noffsets.storage.topic=" + offsets +
                  "\nreconnect.backoff.ms=100\n");
  REQUIRE(eventually([&] { return p.status().state == walrelay::RelayState::streaming; }, 60s, 20ms));
  write(0, 10);
  REQUIRE(eventually([&] { return p.metrics.kafka_transactions("committed").Value() >= 1; }, 30s, 20ms));
  // The next commit is refused with an error that requires an abort
  // (librdkafka: UNKNOWN_PRODUCER_ID on EndTxn is abortable), once the test
  // lets the broker answer (see the test above).
  REQUIRE(rd_kafka_mock_broker_push_request_error_rtts(cluster.mc, mock_broker, api_end_txn, 1,
                                                       RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID, 0) ==
          RD_KAFKA_RESP_ERR_NO_ERROR);
  REQUIRE(rd_kafka_mock_broker_set_rtt(cluster.mc, mock_broker, 600000) == RD_KAFKA_RESP_ERR_NO_ERROR);
  write(10, 11);
  // Read: up to where the server was after the write (other tests' WAL,
  // written side by side, keeps moving the server's position on).
  const auto after_write = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return p.status().received_lsn.value >= after_write; }, 30s, 5ms));
  write(11, 60);  // these wait in the sink for the commit that will fail
  const auto written = f.db().current_wal_lsn();
  CHECK(eventually([&] { return p.status().received_lsn.value >= written; }, 30s, 5ms));
  CHECK(p.metrics.kafka_transactions("aborted").Value() == 0);
  REQUIRE(rd_kafka_mock_broker_set_rtt(cluster.mc, mock_broker, 0) == RD_KAFKA_RESP_ERR_NO_ERROR);
  CHECK(eventually([&] { return p.metrics.kafka_transactions("aborted").Value() >= 1; }, 30s, 20ms));
  write(60, 80);
  const auto end = f.db().current_wal_lsn();
  CHECK(eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, 60s, 50ms));
  CHECK(p.metrics.replays.Value() >= 1);
  CHECK(p.status().state == walrelay::RelayState::streaming);
  // The mock cluster keeps aborted records visible: only that each event
  // landed is checked here (the real broker's tests check for duplicates).
  auto ids = cluster.ids(topic);
  std::set<std::string> distinct(ids.begin(), ids.end());
  CHECK(distinct.size() == 80);
  CHECK(p.stop() == 0);
}

// Found by review: an abort that purged the records still queued behind the
// one on the wire (rd_kafka_purge) left a hole in the idempotent producer's
// sequence numbers, which only abort_transaction's own purge closes: the
// replay's first batch was then out of sequence, and a second abort and
// replay followed.
TEST_CASE_METHOD(MockOutbox,
                 "relay with a mock cluster: exactly once - an abort with records queued behind one on the wire "
                 "costs one abort and one replay, and every event lands",
                 "[relay][eos]") {
  InProcess p(f, cluster.bootstraps(),
              "exactly.once.support=required\ntransaction.boundary.interval.ms=0\nmax.inflight.records=50\n"
              "kafka.batch.num.messages=10\n"
              "offsets.storage.topic=" + offsets + "\nreconnect.backoff.ms=100\n");
  REQUIRE(eventually([&] { return p.status().state == walrelay::RelayState::streaming; }, 60s, 20ms));
  write(0, 1);
  REQUIRE(eventually([&] { return p.metrics.kafka_transactions("committed").Value() >= 1; }, 30s, 20ms));
  // The next Produce requests answered after 1 s each: with one request (of
  // at most 10 records) on the wire at a time, the rest of what the relay
  // hands over waits queued.
  for (int i = 0; i < 3; ++i)
    REQUIRE(rd_kafka_mock_broker_push_request_error_rtts(cluster.mc, mock_broker, api_produce, 1,
                                                         RD_KAFKA_RESP_ERR_NO_ERROR, 1000) ==
            RD_KAFKA_RESP_ERR_NO_ERROR);
  // One source transaction of 500 rows, read up to the in-flight bound (50).
  write_one_transaction("Mock", "k", 500);
  const auto end = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return p.metrics.inflight_records.Value() >= 50; }, 30s, 5ms));
  // The session ends in the middle of it: the open Kafka transaction is
  // aborted with those records queued, and the relay sends it again.
  terminate_walsender();
  CHECK(eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, 60s, 50ms));
  // One abort, as a rule. But when the session ends while a commit of the
  // position alone is under way (the server's WAL moved on: other tests'
  // writes, side by side), the records wait for that commit outside any
  // transaction, and there is nothing to abort: the replay alone must do.
  // (Seen once in CI run 29; the subject then goes untested in that run.)
  const double aborted = p.metrics.kafka_transactions("aborted").Value();
  CHECK(aborted <= 1);
  if (aborted == 0) WARN("no abort: a position-only commit was under way when the session ended");
  CHECK(p.metrics.replays.Value() == 1);
  CHECK(p.status().state == walrelay::RelayState::streaming);
  auto ids = cluster.ids(topic);
  std::set<std::string> distinct(ids.begin(), ids.end());
  CHECK(distinct.size() == 501);
  CHECK(p.stop() == 0);
}

// Found by the fault campaign: a broker down longer than the transaction
// time-out ends in a fence (the coordinator aborted the transaction and
// bumped the epoch), which walrelay took for a transaction too long to ever
// commit and halted on, waiting for a human.
TEST_CASE_METHOD(MockOutbox,
                 "relay with a mock cluster: exactly once - a commit answered with a fence after "
                 "kafka.transaction.timeout.ms is sent again by a new producer, every event lands, nothing halts",
                 "[relay][eos]") {
  InProcess p(f, cluster.bootstraps(),
              "exactly.once.support=required\ntransaction.boundary.interval.ms=0\nkafka.transaction.timeout.ms=2000\n"
              "offsets.storage.topic=" + offsets + "\nreconnect.backoff.ms=100\n");
  REQUIRE(eventually([&] { return p.status().state == walrelay::RelayState::streaming; }, 60s, 20ms));
  write(0, 10);
  REQUIRE(eventually([&] { return p.metrics.kafka_transactions("committed").Value() >= 1; }, 30s, 20ms));
  const auto first = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= first; }, 30s, 20ms));
  // The next transaction is past the time-out when it ends, and its EndTxn
  // meets the fence the coordinator's abort leaves.
  slow_transaction(cluster.mc, RD_KAFKA_RESP_ERR_PRODUCER_FENCED);
  const double replaced_before = p.metrics.producer_replacements.Value();
  write(10, 30);
  const auto written = f.db().current_wal_lsn();
  CHECK(eventually([&] { return f.db().confirmed_flush(f.slot) >= written; }, 60s, 50ms));
  CHECK(p.metrics.producer_replacements.Value() == replaced_before + 1);
  CHECK(p.status().state == walrelay::RelayState::streaming);
  auto ids = cluster.ids(topic);
  std::set<std::string> distinct(ids.begin(), ids.end());
  CHECK(distinct.size() == 30);
  // (A second time-out with nothing committed since halts: the real
  // broker's test of a walrelay frozen twice shows it.)
  CHECK(p.stop() == 0);
}

TEST_CASE_METHOD(MockOutbox,
                 "relay with a mock cluster: exactly once - what waited for a commit meets a full producer queue and "
                 "still goes out whole, in order, each event once",
                 "[relay][eos]") {
  // librdkafka's queue (5 records) far below walrelay's in-flight limit: the
  // records that waited for the slow commit cannot all be produced at once.
  InProcess p(f, cluster.bootstraps(),
              "exactly.once.support=required\ntransaction.boundary.interval.ms=20000\n"
              "transaction.boundary.max.records=1\nkafka.queue.buffering.max.messages=5\noffsets.storage.topic=" +
                  offsets + "\n");
  REQUIRE(eventually([&] { return p.status().state == walrelay::RelayState::streaming; }, 60s, 20ms));
  write(0, 3, 3);
  const auto first = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= first; }, 30s, 20ms));
  REQUIRE(rd_kafka_mock_broker_push_request_error_rtts(cluster.mc, mock_broker, api_end_txn, 1,
                                                       RD_KAFKA_RESP_ERR_NO_ERROR, 6000) ==
          RD_KAFKA_RESP_ERR_NO_ERROR);
  write(3, 4, 3);
  // Read: up to where the server was after the write (other tests' WAL,
  // written side by side, keeps moving the server's position on).
  const auto after_write = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return p.status().received_lsn.value >= after_write; }, 10s, 5ms));
  write(4, 64, 3);  // 60 one-row transactions wait for the slow commit
  const auto written = f.db().current_wal_lsn();
  CHECK(eventually([&] { return p.status().received_lsn.value >= written; }, 5000ms, 5ms));
  CHECK(eventually([&] { return f.db().confirmed_flush(f.slot) >= written; }, 60s, 20ms));
  CHECK(p.metrics.replays.Value() == 0);
  CHECK(p.status().state == walrelay::RelayState::streaming);
  // Each once, in commit order (one partition, one writer: ids ascending).
  auto seq = cluster.id_sequence(topic);
  std::set<std::string> distinct(seq.begin(), seq.end());
  CHECK(distinct.size() == 64);
  CHECK(seq.size() == 64);
  std::vector<long> numbers;
  for (auto& id : seq) numbers.push_back(std::stol(id));
  CHECK(std::is_sorted(numbers.begin(), numbers.end()));
  CHECK(p.stop() == 0);
}

TEST_CASE_METHOD(MockOutbox,
                 "relay with a mock cluster: a fatal producer error while the relay is idle halts it at once, not at "
                 "its next wake-up",
                 "[relay][idle]") {
  // At least once: a fatal error of the idempotent producer is a halt (exit 3).
  InProcess p(f, cluster.bootstraps(), "");
  REQUIRE(eventually([&] { return p.status().state == walrelay::RelayState::streaming; }, 60s, 20ms));
  write(0, 1);
  const auto end = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, 30s, 20ms));
  // Idle: no status update for a whole second (the loop sleeps until its
  // 10 s update or the server's ping, whichever comes first).
  REQUIRE(p.wait_status_updates_quiet(1s, 8s));
  auto t0 = std::chrono::steady_clock::now();
  p.sink->raise_fatal_error_for_test("injected by the test");
  // Seen through librdkafka's event queue at once (the halt ends the loop);
  // waiting for the next wake-up would take up to 10 s.
  CHECK(eventually([&] { return p.io.stopped(); }, 2s, 10ms));
  std::cout << "fatal while idle: halted after "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s\n";
  CHECK(p.stop() == walrelay::exit_halted);
}

namespace {

// Two brokers: the second one goes down with a partition it leads.
struct TwoBrokerOutbox : MockOutbox {
  TwoBrokerOutbox() : MockOutbox(2) {}
};
constexpr int32_t down_broker = 2;

}  // namespace

TEST_CASE_METHOD(TwoBrokerOutbox,
                 "relay with a mock cluster: a record retried forever (a partition with no leader) holds the slot "
                 "below it while later transactions flow to other partitions, and the ledger stays bounded",
                 "[relay][ledger]") {
  const std::string stuck_topic = f.topic("Stuck");
  REQUIRE(rd_kafka_mock_topic_create(cluster.mc, stuck_topic.c_str(), 1, 1) == RD_KAFKA_RESP_ERR_NO_ERROR);
  // Both topics led by broker 1 for now.
  for (auto* t : {topic.c_str(), stuck_topic.c_str()})
    REQUIRE(rd_kafka_mock_partition_set_leader(cluster.mc, t, 0, mock_broker) == RD_KAFKA_RESP_ERR_NO_ERROR);
  // At least once, kafka.message.timeout.ms at its default 0: retried forever.
  const int max_inflight = 200;
  InProcess p(f, cluster.bootstraps(), "max.inflight.records=" + std::to_string(max_inflight) + "\n");
  REQUIRE(eventually([&] { return p.status().state == walrelay::RelayState::streaming; }, 60s, 20ms));
  f.db().exec(insert_event(f.table, "Stuck", "s", "'{}'"));
  write(0, 1);
  const auto flowing = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= flowing; }, 30s, 20ms));

  // The stuck topic's only partition loses its leader: led by broker 2,
  // which is down. (A leader of -1 would say the same, but librdkafka
  // 2.8's mock broker crashes answering a Produce for such a partition.)
  REQUIRE(rd_kafka_mock_broker_set_down(cluster.mc, down_broker) == RD_KAFKA_RESP_ERR_NO_ERROR);
  REQUIRE(rd_kafka_mock_partition_set_leader(cluster.mc, stuck_topic.c_str(), 0, down_broker) ==
          RD_KAFKA_RESP_ERR_NO_ERROR);
  const auto before_stuck = f.db().current_wal_lsn();
  f.db().exec(insert_event(f.table, "Stuck", "s", "'{}'"));
  // Then 20,000 one-row transactions to the other topic, each acknowledged.
  const int later = 20000;
  std::atomic<double> largest{0};
  std::atomic<bool> sampling{true};
  std::thread sampler([&] {
    while (sampling) {
      largest = std::max(largest.load(), p.metrics.ledger_transactions.Value());
      std::this_thread::sleep_for(5ms);
    }
  });
  f.db().exec("DO $$ BEGIN FOR i IN 1.." + std::to_string(later) + " LOOP " +
              insert_event(f.table, "Mock", "k", "'{}'") + " COMMIT; END LOOP; END $$");
  const auto written = f.db().current_wal_lsn();
  CHECK(eventually([&] { return p.status().received_lsn.value >= written; }, 60s, 20ms));
  CHECK(eventually([&] { return cluster.ids(topic).size() == static_cast<std::size_t>(later + 1); }, 60s, 200ms));
  p.wait_status_updates(2);
  sampling = false;
  sampler.join();
  const double at_end = p.metrics.ledger_transactions.Value();
  std::cout << "stuck record: ledger at most " << largest.load() << " entries during " << later
            << " later transactions, " << at_end << " at their end\n";
  // An entry per transaction with a record in flight, one done entry ahead
  // of each at most, the open one; at the end the stuck one and what it holds.
  CHECK(largest.load() <= 2 * max_inflight + 2);
  CHECK(at_end <= 2);
  CHECK(p.status().inflight_records == 1);
  // Never confirmed past the stuck record.
  CHECK(f.db().confirmed_flush(f.slot) <= before_stuck);
  CHECK(f.db().confirmed_flush(f.slot) >= flowing);

  // Its leader up again: the stuck record lands, and the slot jumps to the end.
  REQUIRE(rd_kafka_mock_broker_set_up(cluster.mc, down_broker) == RD_KAFKA_RESP_ERR_NO_ERROR);
  CHECK(eventually([&] { return f.db().confirmed_flush(f.slot) >= written; }, 60s, 50ms));
  CHECK(cluster.ids(stuck_topic).size() == 2);
  p.wait_status_updates(1);
  CHECK(p.metrics.ledger_transactions.Value() == 0);
  CHECK(p.stop() == 0);
}

// Found by review of f04f66c: an abort that waited for every queued record
// to be sent first waited for ever on a partition without a leader (records
// retried for ever: kafka.message.timeout.ms=0), and the relay never got to
// its replay. What is queued goes with the aborted transaction.
TEST_CASE_METHOD(TwoBrokerOutbox,
                 "relay with a mock cluster: exactly once - a session ended in the middle of a source transaction "
                 "whose records wait for a partition without a leader aborts at once, and every event lands once "
                 "the partition is back",
                 "[relay][eos]") {
  const std::string stuck_topic = f.topic("Stuck");
  REQUIRE(rd_kafka_mock_topic_create(cluster.mc, stuck_topic.c_str(), 1, 1) == RD_KAFKA_RESP_ERR_NO_ERROR);
  // Everything on broker 1 (the other one goes down), the coordinator too.
  for (auto* t : {topic.c_str(), stuck_topic.c_str(), offsets.c_str()})
    REQUIRE(rd_kafka_mock_partition_set_leader(cluster.mc, t, 0, mock_broker) == RD_KAFKA_RESP_ERR_NO_ERROR);
  const std::string transactional_id = "walrelay-" + Services::get().pg_database + "-" + f.slot;
  REQUIRE(rd_kafka_mock_coordinator_set(cluster.mc, "transaction", transactional_id.c_str(), mock_broker) ==
          RD_KAFKA_RESP_ERR_NO_ERROR);
  InProcess p(f, cluster.bootstraps(),
              "exactly.once.support=required\ntransaction.boundary.interval.ms=0\nmax.inflight.records=50\n"
              "kafka.message.timeout.ms=0\noffsets.storage.topic=" + offsets + "\nreconnect.backoff.ms=100\n");
  REQUIRE(p.config.transactional_id() == transactional_id);
  REQUIRE(eventually([&] { return p.status().state == walrelay::RelayState::streaming; }, 60s, 20ms));
  write(0, 1);
  REQUIRE(eventually([&] { return p.metrics.kafka_transactions("committed").Value() >= 1; }, 30s, 20ms));
  // The stuck topic's partition led by broker 2, which is down (see above).
  REQUIRE(rd_kafka_mock_broker_set_down(cluster.mc, down_broker) == RD_KAFKA_RESP_ERR_NO_ERROR);
  REQUIRE(rd_kafka_mock_partition_set_leader(cluster.mc, stuck_topic.c_str(), 0, down_broker) ==
          RD_KAFKA_RESP_ERR_NO_ERROR);
  // One source transaction of 200 rows for it, read up to the in-flight
  // bound (50): those wait queued, the rest unread.
  write_one_transaction("Stuck", "s", 200);
  const auto end = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return p.metrics.inflight_records.Value() >= 50; }, 30s, 5ms));
  terminate_walsender();
  // Aborted at once: the relay goes on to its replay.
  CHECK(eventually([&] { return p.metrics.kafka_transactions("aborted").Value() >= 1; }, 10s, 20ms));
  REQUIRE(rd_kafka_mock_broker_set_up(cluster.mc, down_broker) == RD_KAFKA_RESP_ERR_NO_ERROR);
  CHECK(eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, 60s, 50ms));
  CHECK(p.status().state == walrelay::RelayState::streaming);
  auto ids = cluster.ids(stuck_topic);
  std::set<std::string> distinct(ids.begin(), ids.end());
  CHECK(distinct.size() == 200);
  CHECK(p.stop() == 0);
}
