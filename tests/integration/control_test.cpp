// The operator's control of a running walrelay (POST /pause, /resume,
// /restart, GET /status, walrelay ctl) against the real PostgreSQL and
// Kafka. The pause under load, for Kafka and RabbitMQ, is in
// broker_sink_test.cpp beside the other tests of every sink; the halt that
// stays up, fixed and restarted in place, in tests/deploy/test_alerts_fire.sh.
#include <csignal>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "test_util.hpp"

using namespace it;
using nlohmann::json;

namespace {

const std::string reader = "reader-token-1";
const std::string replayer = "replay-token-2";
const std::string controller = "control-token-3";

std::string tokens() {
  return "admin.token=" + reader + "\nadmin.replay.token=" + replayer + "\nadmin.control.token=" + controller + "\n";
}

json status_json(Walrelay& relay) {
  auto r = relay.get("/status", reader);
  INFO("/status: " << r.status << " " << r.body);
  REQUIRE(r.status == 200);
  return json::parse(r.body);
}

std::string state_of(Walrelay& relay) { return status_json(relay)["connector"]["state"]; }

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("control: each state-changing request needs admin.control.token - refused without it or with the readers' "
          "or the replay token - forbidden when it is not set - the log names who asked",
          "[control]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config(tokens()));
  relay.start();
  relay.wait_streaming();
  for (const std::string& path : std::vector<std::string>{"/pause", "/resume", "/restart", "/connectors/" + f.slot + "/pause"}) {
    INFO(path);
    CHECK(relay.request("POST", path).status == 401);
    CHECK(relay.request("POST", path, reader).status == 401);
    CHECK(relay.request("POST", path, replayer).status == 401);
    CHECK(relay.request("POST", path, "Bearer").status == 401);
  }
  CHECK(relay.request("GET", "/pause", controller).status == 405);
  CHECK(relay.request("PUT", "/restart", controller).status == 405);
  CHECK(relay.get("/status").status == 401);  // a halt's trace may quote a row: the readers' token
  REQUIRE(eventually([&] { return state_of(relay) == "RUNNING"; }, 30s));
  CHECK(relay.get("/status", controller).status == 200);
  CHECK(relay.metric("walrelay_paused", reader) == std::optional<double>(0));

  // Kafka Connect's paths and its PUT: the same requests.
  CHECK(relay.request("PUT", "/connectors/" + f.slot + "/pause", controller).status == 202);
  REQUIRE(eventually([&] { return state_of(relay) == "PAUSED"; }, 30s, 100ms));
  auto connect = json::parse(relay.get("/connectors/" + f.slot + "/status", reader).body);
  CHECK(connect["name"] == f.slot);
  CHECK(connect["tasks"][0]["state"] == "PAUSED");
  CHECK(connect["connector"]["worker_id"].get<std::string>().find(":" + std::to_string(relay.pid())) !=
        std::string::npos);
  CHECK(relay.request("POST", "/resume", controller).status == 202);
  REQUIRE(eventually([&] { return state_of(relay) == "RUNNING"; }, 30s, 100ms));
  // Events flow again.
  f.db().exec(insert_event(f.table, "Pause", "k", "jsonb_build_object('seq', 0)"));
  CHECK(read_topic(f.topic("Pause"), 1).size() == 1);
  CHECK(relay.log().find("admin: refused POST /pause from 127.0.0.1:") != std::string::npos);
  CHECK(relay.log().find("admin: PUT /connectors/" + f.slot + "/pause from 127.0.0.1:") == std::string::npos);
  CHECK(relay.log().find("admin: PUT /pause from 127.0.0.1:") != std::string::npos);
  CHECK(relay.log().find("paused by 127.0.0.1:") != std::string::npos);
  CHECK(relay.log().find(controller) == std::string::npos);  // a secret never logged

  // Without admin.control.token nobody may: 403, naming the key.
  Fixture g;
  create_outbox(g.db(), g.table, "bigint");
  Walrelay plain(g.config("admin.token=" + reader + "\n"));
  plain.start();
  plain.wait_streaming();
  for (const std::string path : {"/pause", "/resume", "/restart"}) {
    auto r = plain.request("POST", path, reader);
    INFO(path << ": " << r.status << " " << r.body);
    CHECK(r.status == 403);
    CHECK(r.body.find("admin.control.token") != std::string::npos);
  }
}

TEST_CASE("control: POST /restart in place - a new session and admin endpoint on the same port with the "
          "configuration read again and the pause kept - a configuration that does not load is refused and "
          "changes nothing",
          "[control]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config(tokens()));
  relay.start();
  relay.wait_streaming();
  const int port = relay.admin_port();
  f.db().exec(insert_event(f.table, "Restart", "k", "jsonb_build_object('seq', 0)"));
  REQUIRE(read_topic(f.topic("Restart"), 1).size() == 1);
  REQUIRE(relay.request("POST", "/pause", controller).status == 202);
  REQUIRE(eventually([&] { return status_json(relay)["walrelay"]["pause"]["recorded"] == true; }, 30s, 100ms));

  // A configuration that does not load: refused, the relay runs on.
  const std::string good = file_text(relay.config_path());
  std::ofstream(relay.config_path()) << good << "max.inflight.records=zero\n";
  auto refused = relay.request("POST", "/restart", controller);
  CHECK(refused.status == 409);
  CHECK(refused.body.find("max.inflight.records") != std::string::npos);
  CHECK(state_of(relay) == "PAUSED");

  // A new configuration (a new route) is read by the restart.
  std::ofstream(relay.config_path()) << with_key(good, "route.topic.replacement", f.topic_prefix + "v2.${routedByValue}");
  CHECK(relay.request("POST", "/restart", controller).status == 202);
  REQUIRE(eventually([&] { return count_of(relay.log(), "slot=" + f.slot + " streaming:") >= 2; }, 60s, 100ms));
  CHECK(relay.running());
  CHECK(relay.admin_port() == port);
  REQUIRE(eventually([&] { return http_get(port, "/status", reader).status == 200 && state_of(relay) == "PAUSED"; },
                     30s, 100ms));
  CHECK(status_json(relay)["walrelay"]["pause"]["by"].get<std::string>().find("127.0.0.1:") == 0);  // carried over
  f.db().exec(insert_event(f.table, "Restart", "k", "jsonb_build_object('seq', 1)"));
  std::this_thread::sleep_for(2s);
  CHECK(count_records(f.topic("v2.Restart")) == 0);  // still paused
  REQUIRE(relay.request("POST", "/resume", controller).status == 202);
  auto recs = read_topic(f.topic("v2.Restart"), 1);
  REQUIRE(recs.size() == 1);
  CHECK(recs[0].value->find("\"seq\": 1") != std::string::npos);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit(60s) == 0);
}

TEST_CASE("control: POST /restart of a walrelay whose broker went away - a new session and producer while the broker "
          "is down - every event written meanwhile arrives once it is back and in order per key",
          "[control][fault][broker][solo]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config(tokens() + "max.inflight.records=200\nshutdown.timeout.ms=2000\n"));
  relay.start();
  relay.wait_streaming();
  Writer before(f.table, "Away", 200, 10, 0ms);
  before.join();
  REQUIRE(read_topic(f.topic("Away"), 200).size() == 200);
  BrokerOutage outage;
  Writer writer(f.table, "Away", 2000, 10, 5ms, 16, "", 200);
  REQUIRE(eventually([&] { return relay.get("/readyz", reader).body.find("broker unreachable") != std::string::npos; },
                     120s, 200ms));
  CHECK(relay.request("POST", "/restart", controller).status == 202);
  REQUIRE(eventually([&] { return relay.log().find("session ended for the restart") != std::string::npos; }, 60s,
                     100ms));
  REQUIRE(eventually([&] { return count_of(relay.log(), "slot=" + f.slot + " streaming:") >= 2; }, 60s, 100ms));
  CHECK(relay.running());
  writer.join();
  REQUIRE(writer.failures() == 0);
  outage.restart();
  const auto end = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, 180s, 200ms));
  auto recs = read_topic(f.topic("Away"), 2200);
  auto seen = ids_of(recs);
  CHECK(missing_ids(f.db(), f.table, seen).empty());
  CHECK(seen.count.size() == 2200);
  check_order_per_key(recs);
  CHECK(state_of(relay) == "RUNNING");
}

TEST_CASE("control: POST /restart refused where a new session would lose events or not start - a lost slot is a 409 "
          "naming --reset-slot - a sink the file's keys cannot build runs the previous configuration again - "
          "onlyFailed restarts only a failed walrelay - a standby leaves pause to the walrelay that holds the slot",
          "[control]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config(tokens() + "reconnect.backoff.max.ms=500\nhalt.action=stay\n"));
  relay.start();
  relay.wait_streaming();
  const std::string streaming = "slot=" + f.slot + " streaming:";

  // Kafka Connect's onlyFailed: nothing to restart.
  CHECK(relay.request("POST", "/connectors/" + f.slot + "/restart?includeTasks=true&onlyFailed=true", controller)
            .status == 204);

  // A standby: 409, the active one decides.
  Walrelay standby(f.config(tokens() + "reconnect.backoff.max.ms=500\n"));
  standby.start();
  REQUIRE(eventually([&] { return standby.log().find("standby:") != std::string::npos; }, 30s, 100ms));
  auto refused = standby.request("POST", "/pause", controller);
  CHECK(refused.status == 409);
  CHECK(refused.body.find("standby") != std::string::npos);
  standby.signal(SIGTERM);
  CHECK(standby.wait_exit(60s) == 0);

  // A Kafka key librdkafka refuses only when the producer is made: the
  // restart's new session cannot start, the previous configuration runs on.
  const std::string good = file_text(relay.config_path());
  std::ofstream(relay.config_path()) << good << "kafka.no.such.property=1\n";
  CHECK(relay.request("POST", "/restart", controller).status == 202);
  REQUIRE(eventually([&] { return relay.log().find("running the previous one again") != std::string::npos; }, 60s,
                     100ms));
  REQUIRE(eventually([&] { return count_of(relay.log(), streaming) >= 2; }, 60s, 100ms));
  CHECK(relay.running());
  f.db().exec(insert_event(f.table, "Restart", "k", "jsonb_build_object('seq', 0)"));
  CHECK(read_topic(f.topic("Restart"), 1).size() == 1);
  std::ofstream(relay.config_path()) << good;

  // The slot dropped under it: halted (stays up); a restart would make a new
  // slot and skip what was written since, so it is refused.
  REQUIRE(eventually([&] {
    f.db().exec("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '" + f.slot +
                "' AND active_pid IS NOT NULL");
    try {
      f.db().exec("SELECT pg_drop_replication_slot('" + f.slot + "')");
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }, 30s, 50ms));
  REQUIRE(eventually([&] { return state_of(relay) == "FAILED"; }, 60s, 100ms));
  auto lost = relay.request("POST", "/restart", controller);
  CHECK(lost.status == 409);
  CHECK(lost.body.find("--reset-slot") != std::string::npos);
  std::this_thread::sleep_for(2s);
  CHECK(f.db().scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + f.slot + "'") == "0");
  CHECK(state_of(relay) == "FAILED");
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit(60s) == 3);
}

TEST_CASE("control: SIGTERM right after POST /restart ends the process (exit 0) - no new generation after it", "[control]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config(tokens()));
  relay.start();
  relay.wait_streaming();
  for (auto delay : {0ms, 150ms}) {
    INFO("SIGTERM " << delay.count() << " ms after the restart");
    if (delay == 150ms) {
      relay.start();
      relay.wait_streaming();
    }
    REQUIRE(relay.request("POST", "/restart", controller).status == 202);
    std::this_thread::sleep_for(delay);
    relay.signal(SIGTERM);
    CHECK(relay.wait_exit(60s) == 0);
    // Once the signal was taken, no new generation began (one begun before
    // it, the signal held while the generations changed, stops as any does).
    const std::string log = relay.this_run_log();
    const auto signalled = log.find("signal 15 received");
    REQUIRE(signalled != std::string::npos);
    CHECK(log.find(" starting: slot=" + f.slot, signalled) == std::string::npos);
    CHECK(log.find("stopped; confirmed_flush_lsn=", signalled) != std::string::npos);
  }
}
