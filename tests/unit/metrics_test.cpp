// Metrics: names, help and types in the exposition, label children, and the
// process_* families read from /proc at scrape time.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "walrelay/admin/metrics.hpp"

namespace {

// Sample lines ("name{labels} value") of an exposition, keyed by everything before the value.
std::map<std::string, double> samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line.front() == '#') continue;
    const auto space = line.rfind(' ');
    REQUIRE(space != std::string::npos);
    out[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
  }
  return out;
}

double unix_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

TEST_CASE("every walrelay metric is exposed with help and type", "[metrics]") {
  walrelay::Metrics metrics;
  // Labelled families only appear once they have a child.
  metrics.events_relayed("public.outbox", "orders");
  metrics.delivery_errors("msg_timed_out");
  metrics.dead_lettered("mapping");
  metrics.mapping_errors("missing_topic");
  const std::string text = metrics.serialize();

  const std::map<std::string, std::string> expected = {
      {"walrelay_events_relayed_total", "counter"},   {"walrelay_bytes_relayed_total", "counter"},
      {"walrelay_delivery_errors_total", "counter"},  {"walrelay_dead_lettered_total", "counter"},
      {"walrelay_mapping_errors_total", "counter"},   {"walrelay_transactions_total", "counter"},
      {"walrelay_replication_messages_total", "counter"}, {"walrelay_status_updates_total", "counter"},
      {"walrelay_reconnects_total", "counter"},       {"walrelay_decode_errors_total", "counter"},
      {"walrelay_inflight_records", "gauge"},         {"walrelay_inflight_bytes", "gauge"},
      {"walrelay_ledger_transactions", "gauge"},
      {"walrelay_received_lsn", "gauge"},             {"walrelay_flushed_lsn", "gauge"},
      {"walrelay_server_wal_end_lsn", "gauge"},       {"walrelay_slot_lag_bytes", "gauge"},
      {"walrelay_slot_lag_seconds", "gauge"},         {"walrelay_ready", "gauge"},
      {"walrelay_halted", "gauge"},                   {"walrelay_backpressure", "gauge"},
      {"walrelay_start_time_seconds", "gauge"},       {"walrelay_slot_invalid", "gauge"},
  };
  for (const auto& [name, type] : expected) {
    INFO(name);
    CHECK(text.find("# HELP " + name + " ") != std::string::npos);
    CHECK(text.find("# TYPE " + name + " " + type + "\n") != std::string::npos);
  }
}

TEST_CASE("counters and gauges show their values", "[metrics]") {
  walrelay::Metrics metrics("s1");
  CHECK(samples(metrics.serialize()).at(R"(walrelay_halted{slot="s1"})") == 0);
  metrics.events_relayed("public.outbox", "orders").Increment(3);
  metrics.events_relayed("public.outbox", "payments").Increment();
  metrics.delivery_errors("msg_timed_out").Increment(2);
  metrics.bytes_relayed.Increment(1234);
  metrics.lag_bytes.Set(4096);
  metrics.set_halted("record");

  const auto values = samples(metrics.serialize());
  CHECK(values.at(R"(walrelay_events_relayed_total{table="public.outbox",topic="orders"})") == 3);
  CHECK(values.at(R"(walrelay_events_relayed_total{table="public.outbox",topic="payments"})") == 1);
  CHECK(values.at(R"(walrelay_delivery_errors_total{reason="msg_timed_out"})") == 2);
  CHECK(values.at("walrelay_bytes_relayed_total") == 1234);
  CHECK(values.at(R"(walrelay_slot_lag_bytes{slot="s1"})") == 4096);
  // One series: the reason replaces the 0 without one.
  CHECK(values.at(R"(walrelay_halted{reason="record",slot="s1"})") == 1);
  CHECK(values.count(R"(walrelay_halted{slot="s1"})") == 0);
  CHECK(values.at(R"(walrelay_ready{slot="s1"})") == 0);
}

TEST_CASE("the same labels give the same child", "[metrics]") {
  walrelay::Metrics metrics;
  auto& a = metrics.events_relayed("t", "x");
  auto& b = metrics.events_relayed("t", "x");
  auto& c = metrics.events_relayed("t", "y");
  CHECK(&a == &b);
  CHECK(&a != &c);
  CHECK(&metrics.dead_lettered("r") == &metrics.dead_lettered("r"));
  CHECK(&metrics.mapping_errors("r") != &metrics.mapping_errors("s"));
}

TEST_CASE("label values are escaped by the serializer", "[metrics]") {
  walrelay::Metrics metrics;
  metrics.mapping_errors("bad \"topic\"\nline\\").Increment();
  const std::string text = metrics.serialize();
  CHECK(text.find(R"(walrelay_mapping_errors_total{reason="bad \"topic\"\nline\\"} 1)") != std::string::npos);
}

TEST_CASE("start time is set at construction", "[metrics]") {
  const double before = unix_now();
  walrelay::Metrics metrics;
  const double after = unix_now();
  CHECK(metrics.start_time.Value() >= before - 1);
  CHECK(metrics.start_time.Value() <= after + 1);
}

TEST_CASE("process metrics come from /proc/self and are plausible", "[metrics]") {
  walrelay::Metrics metrics;
  const std::string text = metrics.serialize();
  const auto values = samples(text);

  CHECK(text.find("# TYPE process_cpu_seconds_total counter\n") != std::string::npos);
  CHECK(text.find("# TYPE process_resident_memory_bytes gauge\n") != std::string::npos);
  REQUIRE(values.count("process_resident_memory_bytes") == 1);
  CHECK(values.at("process_resident_memory_bytes") > 1024 * 1024);
  REQUIRE(values.count("process_virtual_memory_bytes") == 1);
  CHECK(values.at("process_virtual_memory_bytes") >= values.at("process_resident_memory_bytes"));
  REQUIRE(values.count("process_cpu_seconds_total") == 1);
  CHECK(values.at("process_cpu_seconds_total") >= 0);
  REQUIRE(values.count("process_open_fds") == 1);
  CHECK(values.at("process_open_fds") >= 3);  // stdin, stdout, stderr at least
  REQUIRE(values.count("process_max_fds") == 1);
  CHECK(values.at("process_max_fds") >= values.at("process_open_fds"));
  REQUIRE(values.count("process_start_time_seconds") == 1);
  // The process started before this scrape and, for a test run, not long ago.
  const double start = values.at("process_start_time_seconds");
  CHECK(start <= unix_now() + 2);
  CHECK(start > unix_now() - 24 * 3600);
}

TEST_CASE("describe lists every family served, with the labels its children carry", "[metrics]") {
  walrelay::Metrics metrics;
  // Before any child: the labelled families are listed with their declared labels.
  auto before = metrics.describe();
  std::map<std::string, walrelay::Metrics::FamilyDescription> listed;
  for (auto& d : before) listed[d.name] = d;
  CHECK(listed.size() == before.size());  // each family once
  REQUIRE(listed.count("walrelay_events_relayed_total"));
  CHECK(listed["walrelay_events_relayed_total"].labels == std::vector<std::string>{"table", "topic"});
  CHECK(listed["walrelay_events_relayed_total"].type == "counter");
  REQUIRE(listed.count("walrelay_slot_safe_wal_size_bytes"));
  CHECK(listed["walrelay_slot_safe_wal_size_bytes"].labels == std::vector<std::string>{"slot"});
  CHECK(listed["walrelay_halted"].labels == std::vector<std::string>{"slot", "reason"});
  REQUIRE(listed.count("process_cpu_seconds_total"));

  // Every labelled accessor: its child carries exactly the declared labels,
  // so --list-metrics does not change once the relay runs.
  metrics.events_relayed("public.outbox", "orders");
  metrics.delivery_errors("msg_timed_out");
  metrics.dead_lettered("mapping");
  metrics.mapping_errors("missing_topic");
  metrics.skipped_rows("public.other");
  metrics.skipped_messages("audit");
  metrics.invalid_operations("public.outbox");
  metrics.kafka_transactions("committed");
  metrics.schema_registry_requests("ok");
  metrics.retention_rows_deleted("public.outbox");
  metrics.retention_runs("ok");
  metrics.retention_table_bytes("public.outbox");
  metrics.retention_oldest_row_age("public.outbox");
  metrics.retention_rows_held("public.outbox");
  metrics.set_sink("kafka");
  metrics.set_safe_wal_size(1024);
  auto after = metrics.describe();
  CHECK(after.size() == before.size());
  for (auto& d : after) {
    INFO(d.name);
    REQUIRE(listed.count(d.name));
    CHECK(listed[d.name].labels == d.labels);
    CHECK(listed[d.name].type == d.type);
    CHECK(!d.help.empty());
  }
  // And every family the exposition serves is listed.
  const std::string text = metrics.serialize();
  std::istringstream lines(text);
  std::string line;
  int families = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    ++families;
    const auto name = line.substr(7, line.find(' ', 7) - 7);
    INFO(name);
    CHECK(listed.count(name));
  }
  CHECK(families == static_cast<int>(after.size()));
}
