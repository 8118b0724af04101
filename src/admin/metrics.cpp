// Prometheus metrics of the relay: the registry, its families and the
// process metrics read from /proc/self at scrape time.
#include "walrelay/admin/metrics.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

namespace walrelay {
namespace {

// Registers a counter without labels and returns its only child.
prometheus::Counter& add_counter(prometheus::Registry& registry, const std::string& name,
                                 const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

// Registers a gauge without labels and returns its only child.
prometheus::Gauge& add_gauge(prometheus::Registry& registry, const std::string& name, const std::string& help,
                             const prometheus::Labels& labels = {}) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add(labels);
}

// Registers a histogram without labels, with buckets from 0.5 ms to 1 min.
prometheus::Histogram& add_latency_histogram(prometheus::Registry& registry, const std::string& name,
                                             const std::string& help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add(
      {}, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                  1, 2.5, 5, 10, 30, 60});
}

// The label that names the slot on the gauges that describe it.
prometheus::Labels by_slot(std::string_view slot) { return {{"slot", std::string(slot)}}; }

// The families registered with labels (Metrics::labelled_families_).
using LabelledFamilies = std::map<std::string, Metrics::FamilyDescription, std::less<>>;

// Registers a counter family whose children are added later, one per set of
// values of `labels`, which are recorded for describe().
prometheus::Family<prometheus::Counter>* add_counter_family(prometheus::Registry& registry,
                                                            LabelledFamilies& declared, const std::string& name,
                                                            const std::string& help,
                                                            std::vector<std::string> labels) {
  declared[name] = {name, "counter", std::move(labels), help};
  return &prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}

// The same for a gauge family (labels may be empty: a family whose only
// sample is added and removed).
prometheus::Family<prometheus::Gauge>* add_gauge_family(prometheus::Registry& registry, LabelledFamilies& declared,
                                                        const std::string& name, const std::string& help,
                                                        std::vector<std::string> labels) {
  declared[name] = {name, "gauge", std::move(labels), help};
  return &prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

const char* type_name(prometheus::MetricType type) {
  switch (type) {
    case prometheus::MetricType::Counter: return "counter";
    case prometheus::MetricType::Gauge: return "gauge";
    case prometheus::MetricType::Histogram: return "histogram";
    case prometheus::MetricType::Summary: return "summary";
    case prometheus::MetricType::Untyped: return "untyped";
  }
  return "untyped";
}

// Seconds since the Unix epoch, with sub-second precision.
double unix_now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// One family with a single unlabelled sample.
prometheus::MetricFamily single_sample(std::string name, std::string help,
                                       prometheus::MetricType type, double value) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  prometheus::ClientMetric sample;
  if (type == prometheus::MetricType::Counter) {
    sample.counter.value = value;
  } else {
    sample.gauge.value = value;
  }
  family.metric.push_back(std::move(sample));
  return family;
}

// The fields of /proc/self/stat that the process metrics need.
struct ProcStat {
  std::uint64_t utime_ticks = 0;      // field 14
  std::uint64_t stime_ticks = 0;      // field 15
  std::uint64_t starttime_ticks = 0;  // field 22, ticks after boot
  std::uint64_t vsize_bytes = 0;      // field 23
  std::int64_t rss_pages = 0;         // field 24
};

// Reads a whole small file from /proc; nullopt if it cannot be read.
std::optional<std::string> read_proc_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return std::nullopt;
  return text;
}

// Parses /proc/self/stat. The command name (field 2) may hold spaces and
// parentheses, so the fixed fields are read after the last ')'.
std::optional<ProcStat> read_proc_stat() {
  const auto text = read_proc_file("/proc/self/stat");
  if (!text) return std::nullopt;
  const auto close = text->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text->substr(close + 1));
  // After ')' comes field 3 (state); collect fields 3..24.
  std::vector<std::string> tokens;
  std::string token;
  while (tokens.size() < 22 && fields >> token) tokens.push_back(token);
  if (tokens.size() < 22) return std::nullopt;
  auto field = [&tokens](int number) -> const std::string& {
    return tokens[static_cast<std::size_t>(number - 3)];
  };
  ProcStat stat;
  try {
    stat.utime_ticks = std::stoull(field(14));
    stat.stime_ticks = std::stoull(field(15));
    stat.starttime_ticks = std::stoull(field(22));
    stat.vsize_bytes = std::stoull(field(23));
    stat.rss_pages = std::stoll(field(24));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return stat;
}

// The system boot time ("btime" in /proc/stat) in Unix seconds.
std::optional<std::uint64_t> read_boot_time() {
  const auto text = read_proc_file("/proc/stat");
  if (!text) return std::nullopt;
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("btime ", 0) == 0) {
      try {
        return std::stoull(line.substr(6));
      } catch (const std::exception&) {
        return std::nullopt;
      }
    }
  }
  return std::nullopt;
}

// Number of entries in /proc/self/fd (the directory's own descriptor included).
std::optional<std::uint64_t> count_open_fds() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/proc/self/fd", ec);
  if (ec) return std::nullopt;
  std::uint64_t count = 0;
  for (const std::filesystem::directory_iterator end; it != end; it.increment(ec)) {
    if (ec) return std::nullopt;
    ++count;
  }
  if (ec) return std::nullopt;
  return count;
}

// The standard process_* families (as the Prometheus client libraries name
// them), computed now. A value that cannot be read is left out.
std::vector<prometheus::MetricFamily> collect_process_metrics() {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families;
  const long ticks_per_second = ::sysconf(_SC_CLK_TCK);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (const auto stat = read_proc_stat()) {
    if (ticks_per_second > 0) {
      const double cpu = static_cast<double>(stat->utime_ticks + stat->stime_ticks) /
                         static_cast<double>(ticks_per_second);
      families.push_back(single_sample("process_cpu_seconds_total",
                                       "Total user and system CPU time spent in seconds.",
                                       MetricType::Counter, cpu));
    }
    if (page_size > 0) {
      families.push_back(single_sample(
          "process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge,
          static_cast<double>(stat->rss_pages) * static_cast<double>(page_size)));
    }
    families.push_back(single_sample("process_virtual_memory_bytes",
                                     "Virtual memory size in bytes.", MetricType::Gauge,
                                     static_cast<double>(stat->vsize_bytes)));
    if (ticks_per_second > 0) {
      if (const auto boot = read_boot_time()) {
        const double start = static_cast<double>(*boot) +
                             static_cast<double>(stat->starttime_ticks) /
                                 static_cast<double>(ticks_per_second);
        families.push_back(single_sample(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.", MetricType::Gauge, start));
      }
    }
  }
  if (const auto fds = count_open_fds()) {
    families.push_back(single_sample("process_open_fds", "Number of open file descriptors.",
                                     MetricType::Gauge, static_cast<double>(*fds)));
  }
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    const double max = limit.rlim_cur == RLIM_INFINITY ? static_cast<double>(UINT64_MAX)
                                                       : static_cast<double>(limit.rlim_cur);
    families.push_back(single_sample("process_max_fds",
                                     "Maximum number of open file descriptors.",
                                     MetricType::Gauge, max));
  }
  return families;
}

}  // namespace

Metrics::Metrics(std::string_view slot)
    : registry_(std::make_shared<prometheus::Registry>()),
      bytes_relayed(add_counter(*registry_, "walrelay_bytes_relayed_total",
                                "Bytes (key plus value) of records acknowledged by Kafka.")),
      transactions(add_counter(*registry_, "walrelay_transactions_total",
                               "Commit messages received from the replication stream.")),
      messages_received(add_counter(*registry_, "walrelay_replication_messages_total",
                                    "pgoutput messages received from the replication stream.")),
      status_updates(add_counter(*registry_, "walrelay_status_updates_total",
                                 "Standby status updates (flush feedback) sent to the server.")),
      reconnects(add_counter(*registry_, "walrelay_reconnects_total",
                             "Times the replication connection was re-opened after a loss.")),
      replays(add_counter(*registry_, "walrelay_replays_total",
                          "Times a transient delivery failure made walrelay send everything from the slot's "
                          "confirmed position again.")),
      exactly_once_skipped(add_counter(*registry_, "walrelay_exactly_once_skipped_transactions_total",
                                       "Exactly once: source transactions read again and dropped, their events being "
                                       "in Kafka already.")),
      producer_replacements(add_counter(*registry_, "walrelay_kafka_producer_replacements_total",
                                        "Exactly once: times a producer that failed (not fenced) was replaced by a new "
                                        "one, resuming from the committed position.")),
      trace_context_errors(add_counter(*registry_, "walrelay_trace_context_errors_total",
                                       "Events relayed without trace headers because their trace context "
                                       "(tracing.span.context.field) was malformed.")),
      committed_lsn(add_gauge(*registry_, "walrelay_exactly_once_committed_lsn",
                              "Exactly once: end LSN of the last source transaction in a committed Kafka "
                              "transaction.")),
      exactly_once_slot_ahead(add_gauge(*registry_, "walrelay_exactly_once_slot_ahead_bytes",
                                        "Exactly once: bytes of WAL by which the slot was confirmed past the "
                                        "committed position at the last start (events confirmed without being in "
                                        "Kafka); 0 when it was not.")),
      slot_marker_missing(add_gauge(*registry_, "walrelay_slot_marker_missing",
                                    "1 when walrelay's role may not record the slot in the publication's comment "
                                    "(not its owner): a lost slot would then look like a first start.")),
      decode_errors(add_counter(*registry_, "walrelay_decode_errors_total",
                                "Replication messages that could not be decoded.")),
      snapshot_rows(add_counter(*registry_, "walrelay_snapshot_rows_total",
                                "Rows of the initial snapshot (snapshot.mode) handed to the sink.")),
      snapshot_rows_estimated(add_gauge(*registry_, "walrelay_snapshot_rows_estimated",
                                        "The planner's estimate of the initial snapshot's rows, all tables.")),
      snapshot_running(add_gauge(*registry_, "walrelay_snapshot_running",
                                 "1 while the initial snapshot is being taken.")),
      snapshot_restarts(add_counter(*registry_, "walrelay_snapshot_restarts_total",
                                    "Initial snapshots taken again from the start after one was interrupted.")),
      retention_last_run(add_gauge(*registry_, "walrelay_retention_last_run_timestamp_seconds",
                                   "When retention (table.retention.policy) last ended a run, as Unix time.")),
      retention_partitions_removed(add_counter(*registry_, "walrelay_retention_partitions_removed_total",
                                               "Partitions retention (table.retention.policy=drop-partitions) "
                                               "dropped, or moved to table.retention.archive.schema.")),
      replay_job_running(add_gauge(*registry_, "walrelay_replay_job_running",
                                   "1 while a replay started by POST /replay runs.")),
      replay_job_rows(add_counter(*registry_, "walrelay_replay_job_rows_total",
                                  "Rows sent again by POST /replay replays and acknowledged by the broker.")),
      inflight_records(add_gauge(*registry_, "walrelay_inflight_records",
                                 "Records handed to the Kafka producer and not yet acknowledged.")),
      inflight_bytes(add_gauge(*registry_, "walrelay_inflight_bytes",
                               "Bytes of records handed to the producer and not yet acknowledged.")),
      ledger_transactions(add_gauge(*registry_, "walrelay_ledger_transactions",
                                    "Entries of the LSN ledger: source transactions with records not yet "
                                    "acknowledged, and those they hold back. Bounded by what is in flight.")),
      received_lsn(add_gauge(*registry_, "walrelay_received_lsn",
                             "End LSN of the newest WAL received, as a byte position.")),
      flushed_lsn(add_gauge(*registry_, "walrelay_flushed_lsn",
                            "LSN reported to the server as flushed (all earlier events in Kafka).")),
      server_wal_end(add_gauge(*registry_, "walrelay_server_wal_end_lsn",
                               "The server's current WAL position (pg_current_wal_lsn), as a byte position.")),
      lag_bytes(add_gauge(*registry_, "walrelay_slot_lag_bytes",
                          "The server's current WAL position minus the slot's confirmed_flush_lsn.", by_slot(slot))),
      retained_wal_bytes(add_gauge(*registry_, "walrelay_slot_retained_wal_bytes",
                                   "WAL the slot keeps on the server: current WAL position minus restart_lsn.",
                                   by_slot(slot))),
      lag_seconds(add_gauge(*registry_, "walrelay_slot_lag_seconds",
                            "Age in seconds of the oldest commit not yet acknowledged by Kafka.", by_slot(slot))),
      ready(add_gauge(*registry_, "walrelay_ready",
                      "1 while the relay is streaming with a healthy producer (/readyz is 200).", by_slot(slot))),
      backpressure(add_gauge(*registry_, "walrelay_backpressure",
                             "1 while replication reads are paused because the producer is full.")),
      paused(add_gauge(*registry_, "walrelay_paused",
                       "1 while an operator's pause (POST /pause, or the slot marker's) holds the relay.",
                       by_slot(slot))),
      start_time(add_gauge(*registry_, "walrelay_start_time_seconds",
                           "Time the relay started, in Unix seconds.")),
      slot_invalidated(add_gauge(*registry_, "walrelay_slot_invalid",
                                 "1 when the replication slot has been lost or dropped.", by_slot(slot))),
      commit_to_receive(add_latency_histogram(
          *registry_, "walrelay_commit_to_receive_seconds",
          "Per transaction with outbox events: its commit timestamp to walrelay receiving its Commit.")),
      commit_to_ack(add_latency_histogram(
          *registry_, "walrelay_commit_to_ack_seconds",
          "Per transaction with outbox events: its commit timestamp to Kafka having acknowledged it and "
          "every earlier event.")),
      events_family_(add_counter_family(*registry_, labelled_families_, "walrelay_events_relayed_total",
                                        "Outbox events acknowledged by Kafka, by table and topic.",
                                        {"table", "topic"})),
      delivery_errors_family_(add_counter_family(*registry_, labelled_families_, "walrelay_delivery_errors_total",
          "Kafka delivery reports that carried an error, by reason.", {"reason"})),
      dead_lettered_family_(add_counter_family(*registry_, labelled_families_, "walrelay_dead_lettered_total",
                                               "Events written to the dead-letter topic, by reason.", {"reason"})),
      mapping_errors_family_(add_counter_family(*registry_, labelled_families_, "walrelay_mapping_errors_total",
          "Outbox rows that could not be mapped to a Kafka record, by reason.", {"reason"})),
      skipped_rows_family_(add_counter_family(*registry_, labelled_families_, "walrelay_skipped_rows_total",
          "Inserted rows the publication sent from tables that are not in table.include.list, by table.", {"table"})),
      skipped_messages_family_(add_counter_family(*registry_, labelled_families_, "walrelay_skipped_messages_total",
          "Logical messages whose prefix matches no pattern of message.prefix.include.list, by prefix.", {"prefix"})),
      invalid_operations_family_(add_counter_family(
          *registry_, labelled_families_, "walrelay_invalid_operations_total",
          "Updates of outbox rows that the publication sent, skipped as table.op.invalid.behavior says, by table.",
          {"table"})),
      kafka_transactions_family_(add_counter_family(*registry_, labelled_families_, "walrelay_kafka_transactions_total",
          "Exactly once: Kafka transactions ended, by outcome (committed, aborted).", {"outcome"})),
      schema_registry_family_(add_counter_family(
          *registry_, labelled_families_, "walrelay_schema_registry_requests_total",
          "Schema lookups in the schema registry, by outcome (ok, unreachable, not_found, unauthorized, "
          "bad_response, bad_schema); any but ok holds the records of that subject back.", {"outcome"})),
      retention_rows_family_(add_counter_family(*registry_, labelled_families_, "walrelay_retention_rows_deleted_total",
          "Outbox rows deleted by retention (table.retention.policy=delete), by table.", {"table"})),
      retention_runs_family_(add_counter_family(*registry_, labelled_families_, "walrelay_retention_runs_total",
          "Retention runs, by outcome: ok, behind (the slot not yet past the run's fence: nothing deleted), "
          "error.", {"outcome"})),
      retention_bytes_family_(add_gauge_family(*registry_, labelled_families_, "walrelay_retention_table_bytes",
          "The outbox table's size on disk (pg_total_relation_size, a partitioned one's partitions), read by each retention run.", {"table"})),
      retention_oldest_family_(add_gauge_family(*registry_, labelled_families_,
          "walrelay_retention_oldest_row_age_seconds",
          "The age of the oldest row the outbox table keeps, by its retention time column, read by each retention "
          "run (0: empty); past table.retention.ms, rows wait for the broker or are older than the slot.",
          {"table"})),
      retention_held_family_(add_gauge_family(*registry_, labelled_families_, "walrelay_retention_rows_held",
          "Rows of the outbox table written before walrelay relayed it (perhaps never sent), read by each "
          "retention run: while a table or partition holds any, none of its rows are deleted.", {"table"})),
      safe_wal_size_family_(add_gauge_family(*registry_, labelled_families_, "walrelay_slot_safe_wal_size_bytes",
                                             "WAL that can still be written before max_slot_wal_keep_size "
                                             "invalidates the slot; absent while the server sets no limit.",
                                             {"slot"})),
      sink_info_family_(add_gauge_family(
          *registry_, labelled_families_, "walrelay_sink_info",
          "1, labelled with the broker records go to (sink.type: kafka, nats-jetstream, rabbitmq).", {"sink"})),
      halted_family_(add_gauge_family(*registry_, labelled_families_, "walrelay_halted",
                                      "1, with the reason (record, stream, slot, source, producer, internal), once "
                                      "the relay has stopped on an error that needs an operator; 0 before.",
                                      {"slot", "reason"})),
      halted_(&halted_family_->Add(by_slot(slot))),
      slot_(slot) {
  start_time.Set(unix_now_seconds());
}

void Metrics::set_halted(std::string_view reason) {
  halted_family_->Remove(halted_);
  halted_ = &halted_family_->Add({{"slot", slot_}, {"reason", std::string(reason)}});
  halted_->Set(1);
}

void Metrics::set_sink(std::string_view sink) { sink_info_family_->Add({{"sink", std::string(sink)}}).Set(1); }

std::string Metrics::serialize() {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  auto process = collect_process_metrics();
  families.insert(families.end(), std::make_move_iterator(process.begin()),
                  std::make_move_iterator(process.end()));
  return prometheus::TextSerializer().Serialize(families);
}

std::vector<Metrics::FamilyDescription> Metrics::describe() {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  auto process = collect_process_metrics();
  families.insert(families.end(), std::make_move_iterator(process.begin()),
                  std::make_move_iterator(process.end()));
  std::vector<FamilyDescription> out;
  std::set<std::string, std::less<>> seen;
  for (auto& family : families) {
    FamilyDescription d{family.name, type_name(family.type), {}, family.help};
    if (auto it = labelled_families_.find(family.name); it != labelled_families_.end()) d.labels = it->second.labels;
    // Labels a child carries that were not declared (a family registered
    // without add_*_family) are listed too, in the order first seen.
    for (auto& sample : family.metric)
      for (auto& label : sample.label)
        if (std::find(d.labels.begin(), d.labels.end(), label.name) == d.labels.end()) d.labels.push_back(label.name);
    seen.insert(d.name);
    out.push_back(std::move(d));
  }
  // The labelled families with no child yet (Collect() leaves them out).
  for (auto& [name, d] : labelled_families_)
    if (!seen.count(name)) out.push_back(d);
  return out;
}

prometheus::Counter& Metrics::events_relayed(std::string_view table, std::string_view topic) {
  return events_family_->Add({{"table", std::string(table)}, {"topic", std::string(topic)}});
}

prometheus::Counter& Metrics::delivery_errors(std::string_view reason) {
  return delivery_errors_family_->Add({{"reason", std::string(reason)}});
}

prometheus::Counter& Metrics::dead_lettered(std::string_view reason) {
  return dead_lettered_family_->Add({{"reason", std::string(reason)}});
}

void Metrics::set_safe_wal_size(std::optional<double> bytes) {
  if (bytes) {
    if (!safe_wal_size_) safe_wal_size_ = &safe_wal_size_family_->Add(by_slot(slot_));
    safe_wal_size_->Set(*bytes);
  } else if (safe_wal_size_) {
    safe_wal_size_family_->Remove(safe_wal_size_);
    safe_wal_size_ = nullptr;
  }
}

prometheus::Counter& Metrics::retention_rows_deleted(std::string_view table) {
  return retention_rows_family_->Add({{"table", std::string(table)}});
}

prometheus::Counter& Metrics::retention_runs(std::string_view outcome) {
  return retention_runs_family_->Add({{"outcome", std::string(outcome)}});
}

prometheus::Gauge& Metrics::retention_table_bytes(std::string_view table) {
  return retention_bytes_family_->Add({{"table", std::string(table)}});
}

prometheus::Gauge& Metrics::retention_oldest_row_age(std::string_view table) {
  return retention_oldest_family_->Add({{"table", std::string(table)}});
}

prometheus::Gauge& Metrics::retention_rows_held(std::string_view table) {
  return retention_held_family_->Add({{"table", std::string(table)}});
}

prometheus::Counter& Metrics::schema_registry_requests(std::string_view outcome) {
  return schema_registry_family_->Add({{"outcome", std::string(outcome)}});
}

prometheus::Counter& Metrics::kafka_transactions(std::string_view outcome) {
  return kafka_transactions_family_->Add({{"outcome", std::string(outcome)}});
}

prometheus::Counter& Metrics::skipped_messages(std::string_view prefix) {
  return skipped_messages_family_->Add({{"prefix", std::string(prefix)}});
}

prometheus::Counter& Metrics::invalid_operations(std::string_view table) {
  return invalid_operations_family_->Add({{"table", std::string(table)}});
}

prometheus::Counter& Metrics::skipped_rows(std::string_view table) {
  return skipped_rows_family_->Add({{"table", std::string(table)}});
}

prometheus::Counter& Metrics::mapping_errors(std::string_view reason) {
  return mapping_errors_family_->Add({{"reason", std::string(reason)}});
}

}  // namespace walrelay
