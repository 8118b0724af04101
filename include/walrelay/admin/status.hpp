// What the relay knows about itself, as the admin endpoint shows it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <pgoutput/pgoutput.hpp>

namespace walrelay {

// Lifecycle of the relay; the admin endpoint derives /readyz and /healthz from it.
enum class RelayState {
  starting,      // configuration read, nothing connected yet
  connecting,    // opening or re-opening the replication connection
  standby,       // the slot is held by another process; waiting to take over
  snapshot,      // sending the rows the outbox held when the slot was created
  streaming,     // START_REPLICATION accepted, events flow
  reconnecting,  // connection lost; waiting out the backoff
  draining,      // shutting down: no more reads, waiting for in-flight acks
  halted,        // stopped on an error that needs a human (errors.tolerance=none ...)
  stopped,       // clean shutdown finished
};

const char* to_string(RelayState state);

struct StatusSnapshot;
// The state in Kafka Connect's words (RUNNING, PAUSED, FAILED, UNASSIGNED
// for a standby, STOPPED) and walrelay's own (STARTING, SNAPSHOTTING).
const char* connect_state(const StatusSnapshot& status);

// The server's own view of the slot, from pg_replication_slots on a separate
// ordinary connection (slot.status.interval.ms); never touches the outbox.
struct ServerSlotInfo {
  std::string wal_status;                 // reserved, extended, unreserved, lost
  std::optional<std::int64_t> safe_wal_size;
  std::optional<std::int32_t> active_pid;
  std::optional<pgoutput::Lsn> confirmed_flush_lsn;
  std::optional<pgoutput::Lsn> restart_lsn;
  // pg_current_wal_lsn(), or on a standby pg_last_wal_receive_lsn()
  std::optional<pgoutput::Lsn> current_wal_lsn;
  std::int64_t observed_at_unix_ms = 0;
};

// Retention's view for /slot (table.retention.policy other than none).
struct RetentionStatus {
  std::string policy;                    // delete, drop-partitions
  std::int64_t retention_ms = 0;         // table.retention.ms
  std::int64_t last_run_unix_ms = 0;     // the last run's end (0: none yet)
  std::string last_outcome;              // ok, behind (the slot short of the fence), error
  std::string last_error;                // the last run's error, when it failed
  std::uint64_t partitions_removed = 0;  // drop-partitions: dropped or archived
  struct Table {
    std::string name;                    // schema.table, as configured
    std::optional<double> bytes;         // with its partitions and indexes
    std::optional<double> rows_held;     // written before walrelay relayed it (delete)
    std::uint64_t rows_deleted = 0;      // by this process
    std::optional<double> oldest_row_age_seconds;
  };
  std::vector<Table> tables;             // in table.include.list's order
};

// A snapshot of the relay for /slot and /readyz. Built on the loop thread.
struct StatusSnapshot {
  std::string slot_name;
  RelayState state = RelayState::starting;
  std::string state_reason;             // why not streaming, or why halted
  // halt.action=stay: a halted relay stays up, so /healthz (liveness) says it
  // is alive rather than ask for a restart that would halt again.
  bool halt_stays = false;
  std::int64_t state_since_unix_ms = 0; // when the state last changed
  std::string worker_id;                // host:pid, as Kafka Connect names a worker
  // POST /pause: asked for (or read from the slot marker at a start), and
  // whether the read loop has stopped at a transaction boundary yet.
  struct Pause {
    bool reading_stopped = false;       // no more WAL is read
    std::string since;                  // ISO 8601 UTC, as the slot marker keeps it
    std::string by;                     // who asked: the peer, or the slot marker
    bool recorded = false;              // the slot marker holds it (survives a restart)
    std::string record_error;           // why it is not recorded yet
  };
  std::optional<Pause> pause;
  // A halt's details for /status's trace: what failed, where, what to do.
  struct Failure {
    std::string cause;                  // walrelay_halted's reason label
    std::string where;                  // slot, LSN and xid when it halted
    std::string action;                 // what an operator does about it
  };
  std::optional<Failure> failure;
  pgoutput::Lsn received_lsn;           // end of the newest WAL received
  pgoutput::Lsn confirmed_flush_lsn;    // flushed LSN walrelay reported to the server
  pgoutput::Lsn server_wal_end;         // the server's WAL position (the stream's until the poller answers)
  std::uint64_t lag_bytes = 0;          // server_wal_end - the slot's confirmed_flush_lsn
  std::uint64_t retained_wal_bytes = 0; // server_wal_end - the slot's restart_lsn
  double lag_seconds = 0;               // age of the oldest unacknowledged commit
  std::uint64_t inflight_records = 0;
  std::uint64_t inflight_bytes = 0;
  std::string sink = "kafka";           // sink.type: the broker behind producer_healthy
  bool producer_healthy = true;
  std::string producer_error;           // last broker-level error while unhealthy
  std::string schema_registry_error;    // why records wait on the schema registry, or empty
  // exactly.once.support=required: the transactional.id and the position
  // the last committed Kafka transaction holds.
  struct ExactlyOnce {
    std::string transactional_id;
    std::optional<pgoutput::Lsn> committed_lsn;
  };
  std::optional<ExactlyOnce> exactly_once;
  // The initial snapshot (snapshot.mode), while it runs and once it is done.
  struct Snapshot {
    bool done = false;
    std::string table;                    // the table being read
    std::uint64_t rows_done = 0;          // rows handed to the sink
    std::uint64_t rows_estimated = 0;     // the planner's estimate, all tables
    double rows_per_second = 0;
    std::optional<double> seconds_left;   // from the rate and the estimate
    double seconds = 0;                   // since it began (its length, once done)
  };
  std::optional<Snapshot> snapshot;
  std::optional<ServerSlotInfo> server;
  std::optional<RetentionStatus> retention;  // none without table.retention.policy
};

// Implemented by the relay; the admin server asks it on every request.
class StatusSource {
 public:
  virtual ~StatusSource() = default;
  virtual StatusSnapshot status() const = 0;
};

}  // namespace walrelay
