// KafkaSink against librdkafka's in-process mock cluster: deterministic fault
// injection in addition to the real broker the integration tests use.
#include <catch2/catch.hpp>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <boost/asio/io_context.hpp>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/details/os.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "walrelay/config.hpp"
#include "walrelay/sinks/kafka/kafka_sink.hpp"

using namespace walrelay;
using namespace std::chrono_literals;

namespace {

struct MockCluster {
  rd_kafka_t* rk = nullptr;
  rd_kafka_mock_cluster_t* mc = nullptr;
  explicit MockCluster(int brokers = 1) {
    char err[256];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    REQUIRE(rk);
    mc = rd_kafka_mock_cluster_new(rk, brokers);
    REQUIRE(mc);
    REQUIRE(rd_kafka_mock_topic_create(mc, "events", 3, 1) == RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  ~MockCluster() {
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(rk);
  }
  std::map<std::string, std::string> settings() const {
    return {{"bootstrap.servers", rd_kafka_mock_cluster_bootstraps(mc)},
            {"enable.idempotence", "true"},
            {"acks", "all"},
            {"message.timeout.ms", "0"},
            {"statistics.interval.ms", "100"},
            {"retry.backoff.ms", "50"},
            {"linger.ms", "1"}};
  }
};

bool run_until(boost::asio::io_context& io, const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    io.run_for(20ms);
    if (io.stopped()) io.restart();
    if (cond()) return true;
  }
  return cond();
}

OutboxRecord record(const std::string& value) {
  static std::string stored;
  stored = value;
  OutboxRecord r;
  r.topic = "events";
  r.key = "k";
  r.value = stored;
  r.timestamp_ms = 1700000000000;
  r.headers.push_back({"id", std::string_view("42")});
  return r;
}

}  // namespace

TEST_CASE("kafka sink: every record gets exactly one delivery report, on the polling thread", "[sink]") {
  MockCluster cluster;
  boost::asio::io_context io;
  KafkaSink sink(io, cluster.settings());
  std::vector<Delivery> reports;
  sink.on_delivery([&](const Delivery& d) { reports.push_back(d); });
  for (std::uint64_t t = 1; t <= 100; ++t) REQUIRE(sink.submit(record("v"), t) == SubmitStatus::accepted);
  REQUIRE(run_until(io, [&] { return reports.size() == 100; }, 20s));
  std::set<std::uint64_t> tokens;
  for (auto& d : reports) {
    CHECK(d.ok);
    CHECK(d.bytes == 2);  // key + value
    tokens.insert(d.token);
  }
  CHECK(tokens.size() == 100);
  // healthy once the broker answers the metadata probe (or acknowledges a record)
  CHECK(run_until(io, [&] { return sink.healthy(); }, 5s));
}

TEST_CASE("kafka sink: a new topic's metadata is requested when its first record arrives", "[sink]") {
  // Producing by topic name would leave a topic librdkafka has not seen to its
  // once-a-second topic scan, and its first records would wait for it.
  MockCluster cluster;
  REQUIRE(rd_kafka_mock_topic_create(cluster.mc, "second", 2, 1) == RD_KAFKA_RESP_ERR_NO_ERROR);
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(2000);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("ring", ring));
  spdlog::set_level(spdlog::level::debug);
  struct Restore {
    std::shared_ptr<spdlog::logger> logger;
    ~Restore() {
      spdlog::set_default_logger(logger);
      spdlog::set_level(spdlog::level::info);
    }
  } restore{previous};
  boost::asio::io_context io;
  auto settings = cluster.settings();
  settings["debug"] = "metadata,broker";
  KafkaSink sink(io, settings);
  std::vector<Delivery> reports;
  sink.on_delivery([&](const Delivery& d) { reports.push_back(d); });
  // A usable broker to ask: the connection to broker 1 up, not only the
  // bootstrap connection that may have answered the health probe.
  auto broker_up = [&] {
    for (auto& line : ring->last_formatted())
      if (line.find("/1: Broker changed state") != std::string::npos && line.find("-> UP") != std::string::npos)
        return true;
    return false;
  };
  REQUIRE(run_until(io, [&] { return sink.healthy() && broker_up(); }, 5s));
  // Asked (a leader query), or known already: librdkafka 2.0.2 answers the
  // health probe's metadata request with every topic, and the new handle
  // finds its leaders in that cache (it logs them as it is made).
  auto asked = [&] {
    for (auto& line : ring->last_formatted())
      if ((line.find("Requesting metadata") != std::string::npos && line.find("leader query") != std::string::npos) ||
          (line.find("[thrd:app]:   Topic events partition") != std::string::npos &&
           line.find("Leader") != std::string::npos))
        return true;
    return false;
  };
  CHECK_FALSE(asked());
  REQUIRE(sink.submit(record("v"), 1) == SubmitStatus::accepted);
  // A leader query made by the new handle, not the scan of unknown topics;
  // librdkafka's log lines reach spdlog when the loop polls.
  CHECK(run_until(io, asked, 2s));
  auto second = record("w");
  second.topic = "second";
  REQUIRE(sink.submit(second, 2) == SubmitStatus::accepted);
  REQUIRE(sink.submit(record("x"), 3) == SubmitStatus::accepted);  // the same handle again
  REQUIRE(run_until(io, [&] { return reports.size() == 3; }, 20s));
  std::set<std::string> topics;
  for (auto& d : reports) {
    CHECK(d.ok);
    topics.insert(std::string(d.topic));
  }
  CHECK(topics == std::set<std::string>{"events", "second"});
}

TEST_CASE("kafka sink: transient broker errors are retried, never reported as failures", "[sink]") {
  MockCluster cluster;
  boost::asio::io_context io;
  KafkaSink sink(io, cluster.settings());
  std::vector<Delivery> reports;
  sink.on_delivery([&](const Delivery& d) { reports.push_back(d); });
  rd_kafka_mock_push_request_errors(cluster.mc, 0 /* Produce */, 3, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                                    RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS);
  REQUIRE(sink.submit(record("v"), 7) == SubmitStatus::accepted);
  REQUIRE(run_until(io, [&] { return !reports.empty(); }, 20s));
  CHECK(reports.size() == 1);
  CHECK(reports[0].ok);
}

TEST_CASE("kafka sink: a permanent error is reported once with its code and the record", "[sink]") {
  MockCluster cluster;
  boost::asio::io_context io;
  KafkaSink sink(io, cluster.settings());
  std::vector<Delivery> reports;
  std::string seen_value, seen_header;
  sink.on_delivery([&](const Delivery& d) {
    reports.push_back(d);
    if (d.value) seen_value = std::string(*d.value);
    for (auto& h : d.headers)
      if (h.name == "id" && h.value) seen_header = std::string(*h.value);
  });
  rd_kafka_mock_push_request_errors(cluster.mc, 0 /* Produce */, 1, RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
  REQUIRE(sink.submit(record("payload"), 9) == SubmitStatus::accepted);
  REQUIRE(run_until(io, [&] { return !reports.empty(); }, 20s));
  REQUIRE(reports.size() == 1);
  CHECK_FALSE(reports[0].ok);
  CHECK(reports[0].token == 9);
  CHECK(reports[0].error_code == "topic_authorization_failed");
  CHECK_FALSE(reports[0].transient);  // the record's own: errors.tolerance decides
  CHECK(seen_value == "payload");  // the record comes back for a dead-letter copy
  CHECK(seen_header == "42");
}

TEST_CASE("kafka sink: a record that times out is a transient failure, never the record's own", "[sink]") {
  // A finite message.timeout.ms (Kafka Connect's 300000, copied) and the
  // broker down: the report must not let the relay dead-letter the record.
  MockCluster cluster;
  boost::asio::io_context io;
  auto settings = cluster.settings();
  settings["message.timeout.ms"] = "500";
  KafkaSink sink(io, settings);
  std::vector<Delivery> reports;
  sink.on_delivery([&](const Delivery& d) { reports.push_back(d); });
  rd_kafka_mock_broker_set_down(cluster.mc, 1);
  REQUIRE(sink.submit(record("v"), 5) == SubmitStatus::accepted);
  REQUIRE(run_until(io, [&] { return !reports.empty(); }, 20s));
  REQUIRE(reports.size() == 1);
  CHECK_FALSE(reports[0].ok);
  CHECK(reports[0].error_code == "msg_timed_out");
  CHECK(reports[0].transient);
}

TEST_CASE("kafka sink: a dead-letter record's report carries the reason it was sent there", "[sink]") {
  MockCluster cluster;
  boost::asio::io_context io;
  KafkaSink sink(io, cluster.settings());
  std::vector<Delivery> reports;
  sink.on_delivery([&](const Delivery& d) { reports.push_back(d); });
  REQUIRE(sink.submit_dead_letter("msg_size_too_large", "events", std::string_view("k"), std::nullopt, {}, 11, 3) ==
          SubmitStatus::accepted);
  REQUIRE(run_until(io, [&] { return !reports.empty(); }, 20s));
  CHECK(reports[0].ok);
  CHECK(reports[0].dead_lettered);
  CHECK(reports[0].dead_letter_reason == "msg_size_too_large");
  CHECK(reports[0].token == 11);
  CHECK(reports[0].bytes == 3);
}

TEST_CASE("kafka sink: a record over message.max.bytes is rejected at once and reported", "[sink]") {
  MockCluster cluster;
  boost::asio::io_context io;
  auto settings = cluster.settings();
  settings["message.max.bytes"] = "10000";
  KafkaSink sink(io, settings);
  std::vector<Delivery> reports;
  sink.on_delivery([&](const Delivery& d) { reports.push_back(d); });
  CHECK(sink.submit(record(std::string(20000, 'x')), 3) == SubmitStatus::refused_reported);
  REQUIRE(reports.size() == 1);  // synchronously
  CHECK(reports[0].error_code == "msg_size_too_large");
  CHECK_FALSE(reports[0].transient);
  CHECK(reports[0].token == 3);
  CHECK(reports[0].bytes == 20001);
}

TEST_CASE("kafka sink: broker down makes it unhealthy, records wait and arrive when it is back", "[sink]") {
  MockCluster cluster;
  boost::asio::io_context io;
  KafkaSink sink(io, cluster.settings());
  std::vector<Delivery> reports;
  sink.on_delivery([&](const Delivery& d) { reports.push_back(d); });
  REQUIRE(sink.submit(record("a"), 1) == SubmitStatus::accepted);
  REQUIRE(run_until(io, [&] { return reports.size() == 1; }, 20s));
  REQUIRE(run_until(io, [&] { return sink.healthy(); }, 5s));

  rd_kafka_mock_broker_set_down(cluster.mc, 1);
  REQUIRE(sink.submit(record("b"), 2) == SubmitStatus::accepted);
  CHECK(run_until(io, [&] { return !sink.healthy(); }, 20s));
  CHECK_FALSE(sink.health_reason().empty());
  CHECK(reports.size() == 1);  // held, not failed

  rd_kafka_mock_broker_set_up(cluster.mc, 1);
  REQUIRE(run_until(io, [&] { return reports.size() == 2; }, 30s));
  CHECK(reports[1].ok);
  CHECK(run_until(io, [&] { return sink.healthy(); }, 10s));
}

// With librdkafka's statistics off (walrelay's default), health comes from
// the metadata probe: at start, after every broker went down, and every 10 s
// while up. Three brokers, nothing written: no delivery can say anything.
TEST_CASE("kafka sink: without statistics, health follows a cluster of three brokers with nothing written",
          "[sink]") {
  MockCluster cluster(3);
  auto settings = cluster.settings();
  settings.erase("statistics.interval.ms");
  boost::asio::io_context io;
  KafkaSink sink(io, settings);
  REQUIRE(run_until(io, [&] { return sink.healthy(); }, 5s));
  for (int id = 1; id <= 3; ++id) rd_kafka_mock_broker_set_down(cluster.mc, id);
  CHECK(run_until(io, [&] { return !sink.healthy(); }, 40s));
  CHECK_FALSE(sink.health_reason().empty());
  for (int id = 1; id <= 3; ++id) rd_kafka_mock_broker_set_up(cluster.mc, id);
  CHECK(run_until(io, [&] { return sink.healthy(); }, 30s));
}

TEST_CASE("kafka sink: a bad librdkafka property is a configuration error naming the key", "[sink]") {
  boost::asio::io_context io;
  try {
    KafkaSink sink(io, {{"bootstrap.servers", "127.0.0.1:1"}, {"no.such.property", "1"}});
    FAIL("no error");
  } catch (const ConfigError& e) {
    CHECK(e.key() == "kafka.no.such.property");
  }
}

TEST_CASE("kafka sink: librdkafka's logs are written on the thread that polls, never on its own threads", "[sink]") {
  // spdlog's sinks here are single-threaded: a log line from a broker thread
  // would race the loop's own lines.
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(2000);
  auto logger = std::make_shared<spdlog::logger>("ring", ring);
  logger->set_pattern("%t %v");
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::debug);
  struct Restore {
    std::shared_ptr<spdlog::logger> logger;
    ~Restore() {
      spdlog::set_default_logger(logger);
      spdlog::set_level(spdlog::level::info);
    }
  } restore{previous};
  boost::asio::io_context io;
  // Nothing listens there: the broker threads log connection failures.
  KafkaSink sink(io, {{"bootstrap.servers", "127.0.0.1:1"}, {"debug", "broker"}, {"reconnect.backoff.ms", "10"}});
  std::this_thread::sleep_for(300ms);  // let broker threads fail to connect a few times
  auto kafka_lines = [&] {
    std::vector<std::string> out;
    for (auto& line : ring->last_formatted())
      if (line.find("kafka: ") != std::string::npos) out.push_back(line);
    return out;
  };
  auto queued_before_poll = kafka_lines().size();
  REQUIRE(run_until(io, [&] { return kafka_lines().size() > queued_before_poll + 3; }, 10s));
  std::ostringstream self;
  self << spdlog::details::os::thread_id();
  for (auto& line : kafka_lines()) {
    INFO(line);
    CHECK(line.rfind(self.str() + " ", 0) == 0);
  }
}
