// Prometheus metrics of the relay (prometheus-cpp; its text serializer).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace walrelay {

// All metrics live here so that the names are in one place. Counters with
// labels are looked up once and cached by the caller (a relation-cache entry
// keeps its own Counter*), so the hot path does no label hashing.
class Metrics {
 public:
  // One metric family as exported: `walrelay --list-metrics` prints these,
  // and tests/deploy/test_metrics_table.sh diffs docs/operations.md against them.
  struct FamilyDescription {
    std::string name;
    std::string type;                 // counter, gauge, histogram
    std::vector<std::string> labels;  // empty for a family without labels
    std::string help;
  };

 private:
  // Declared first: the references below are bound to it in the constructor.
  std::shared_ptr<prometheus::Registry> registry_;
  // The families registered with labels, by name: their children are added
  // later, and the registry's Collect() leaves a family without children out
  // and cannot tell its label names before the first one (describe()).
  std::map<std::string, FamilyDescription, std::less<>> labelled_families_;

 public:
  // slot: the replication slot's name, a `slot` label on the gauges that
  // describe the slot and the relay's state, so that alerts can judge an
  // active/passive pair (two instances, one slot) as one.
  explicit Metrics(std::string_view slot = {});
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Prometheus text exposition of everything, process metrics included.
  std::string serialize();

  // Every family in the registry, children or not, then the process_* ones.
  std::vector<FamilyDescription> describe();

  prometheus::Counter& events_relayed(std::string_view table, std::string_view topic);
  prometheus::Counter& delivery_errors(std::string_view reason);
  prometheus::Counter& dead_lettered(std::string_view reason);
  prometheus::Counter& mapping_errors(std::string_view reason);
  prometheus::Counter& skipped_rows(std::string_view table);
  prometheus::Counter& skipped_messages(std::string_view prefix);
  prometheus::Counter& invalid_operations(std::string_view table);  // outbox updates (table.op.invalid.behavior)
  prometheus::Counter& kafka_transactions(std::string_view outcome);  // committed, aborted
  prometheus::Counter& schema_registry_requests(std::string_view outcome);  // ok, unreachable, not_found, ...
  // Retention (table.retention.policy): rows deleted by table, runs by outcome
  // (ok, behind, error), the table's size on disk.
  prometheus::Counter& retention_rows_deleted(std::string_view table);
  prometheus::Counter& retention_runs(std::string_view outcome);
  prometheus::Gauge& retention_table_bytes(std::string_view table);
  prometheus::Gauge& retention_oldest_row_age(std::string_view table);
  prometheus::Gauge& retention_rows_held(std::string_view table);
  // walrelay_sink_info{sink} 1: the sink.type records go to.
  void set_sink(std::string_view sink);

  prometheus::Counter& bytes_relayed;         // walrelay_bytes_relayed_total (key + value)
  prometheus::Counter& transactions;          // walrelay_transactions_total (commits seen)
  prometheus::Counter& messages_received;     // walrelay_replication_messages_total
  prometheus::Counter& status_updates;        // walrelay_status_updates_total
  prometheus::Counter& reconnects;            // walrelay_reconnects_total
  prometheus::Counter& replays;               // walrelay_replays_total
  prometheus::Counter& exactly_once_skipped;  // walrelay_exactly_once_skipped_transactions_total
  prometheus::Counter& producer_replacements; // walrelay_kafka_producer_replacements_total
  prometheus::Counter& trace_context_errors;  // walrelay_trace_context_errors_total
  prometheus::Gauge& committed_lsn;           // walrelay_exactly_once_committed_lsn
  prometheus::Gauge& exactly_once_slot_ahead; // walrelay_exactly_once_slot_ahead_bytes
  prometheus::Gauge& slot_marker_missing;     // walrelay_slot_marker_missing
  prometheus::Counter& decode_errors;         // walrelay_decode_errors_total
  prometheus::Counter& snapshot_rows;         // walrelay_snapshot_rows_total (handed to the sink)
  prometheus::Gauge& snapshot_rows_estimated; // walrelay_snapshot_rows_estimated
  prometheus::Gauge& snapshot_running;        // walrelay_snapshot_running (1 while it runs)
  prometheus::Counter& snapshot_restarts;     // walrelay_snapshot_restarts_total
  prometheus::Gauge& retention_last_run;      // walrelay_retention_last_run_timestamp_seconds
  prometheus::Counter& retention_partitions_removed;  // walrelay_retention_partitions_removed_total
  prometheus::Gauge& replay_job_running;      // walrelay_replay_job_running (POST /replay)
  prometheus::Counter& replay_job_rows;       // walrelay_replay_job_rows_total (sent again, acknowledged)
  prometheus::Gauge& inflight_records;        // walrelay_inflight_records
  prometheus::Gauge& inflight_bytes;          // walrelay_inflight_bytes
  prometheus::Gauge& ledger_transactions;     // walrelay_ledger_transactions
  prometheus::Gauge& received_lsn;            // walrelay_received_lsn (as a number)
  prometheus::Gauge& flushed_lsn;             // walrelay_flushed_lsn
  // From pg_replication_slots and pg_current_wal_lsn() (slot.status.interval.ms):
  // the server's view, which keeps moving while walrelay holds back.
  prometheus::Gauge& server_wal_end;          // walrelay_server_wal_end_lsn
  prometheus::Gauge& lag_bytes;               // walrelay_slot_lag_bytes
  prometheus::Gauge& retained_wal_bytes;      // walrelay_slot_retained_wal_bytes
  // walrelay_slot_safe_wal_size_bytes: nullopt removes the sample (no
  // max_slot_wal_keep_size, or the slot not seen).
  void set_safe_wal_size(std::optional<double> bytes);
  prometheus::Gauge& lag_seconds;             // walrelay_slot_lag_seconds
  prometheus::Gauge& ready;                   // walrelay_ready (1 while /readyz is 200)
  // walrelay_halted{slot, reason}: 0 (no reason label) until the relay
  // halts, then 1 with the reason (record, stream, slot, source, producer,
  // internal).
  void set_halted(std::string_view reason);
  prometheus::Gauge& backpressure;            // walrelay_backpressure (1 while reads paused)
  prometheus::Gauge& paused;                  // walrelay_paused (1 while POST /pause holds)
  prometheus::Gauge& start_time;              // walrelay_start_time_seconds
  prometheus::Gauge& slot_invalidated;        // walrelay_slot_invalid (1: slot lost/dropped)
  // Per source transaction with outbox events, from its commit timestamp
  // (the server's clock) to when walrelay received its Commit, and to when
  // Kafka had acknowledged it and every earlier event (its LSN confirmable).
  prometheus::Histogram& commit_to_receive;   // walrelay_commit_to_receive_seconds
  prometheus::Histogram& commit_to_ack;       // walrelay_commit_to_ack_seconds

 private:
  // families with labels, kept to add children lazily
  prometheus::Family<prometheus::Counter>* events_family_;
  prometheus::Family<prometheus::Counter>* delivery_errors_family_;
  prometheus::Family<prometheus::Counter>* dead_lettered_family_;
  prometheus::Family<prometheus::Counter>* mapping_errors_family_;
  prometheus::Family<prometheus::Counter>* skipped_rows_family_;
  prometheus::Family<prometheus::Counter>* skipped_messages_family_;
  prometheus::Family<prometheus::Counter>* invalid_operations_family_;
  prometheus::Family<prometheus::Counter>* kafka_transactions_family_;
  prometheus::Family<prometheus::Counter>* schema_registry_family_;
  prometheus::Family<prometheus::Counter>* retention_rows_family_;
  prometheus::Family<prometheus::Counter>* retention_runs_family_;
  prometheus::Family<prometheus::Gauge>* retention_bytes_family_;
  prometheus::Family<prometheus::Gauge>* retention_oldest_family_;
  prometheus::Family<prometheus::Gauge>* retention_held_family_;
  prometheus::Family<prometheus::Gauge>* safe_wal_size_family_;
  prometheus::Family<prometheus::Gauge>* sink_info_family_;
  prometheus::Gauge* safe_wal_size_ = nullptr;
  prometheus::Family<prometheus::Gauge>* halted_family_;
  prometheus::Gauge* halted_;
  std::string slot_;
};

}  // namespace walrelay
