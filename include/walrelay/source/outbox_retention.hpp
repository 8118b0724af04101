// Retention (table.retention.policy=delete): the active walrelay deletes the
// outbox rows the broker has acknowledged once they are older than
// table.retention.ms, in batches, on a connection of its own.
//
// The fence. A row carries no LSN, and its time column is the application's
// clock (a transaction that commits late keeps an old time): neither says
// whether the row was sent. So each run takes a snapshot S and then
// L = pg_current_wal_insert_lsn(): every transaction that had ended when S
// was taken (below S's xmin) wrote its commit record before L. Once the relay
// has confirmed past L (exactly once: its committed position, which the
// confirmed one never passes), the rows those transactions inserted are
// acknowledged, if the slot carried them: only those that began after a
// walrelay first streamed this slot (the table's floor, kept in the slot's
// marker) may go. The time column only decides which of them are old enough.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <optional>
#include <string>
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "pgoutput/pgoutput.hpp"
#include "walrelay/admin/metrics.hpp"
#include "walrelay/admin/status.hpp"
#include "walrelay/config.hpp"
#include "walrelay/source/catalog.hpp"

namespace walrelay {

class PgConnection;
class PgError;

class OutboxRetention {
 public:
  // The position up to which the broker has acknowledged everything while
  // this walrelay relays (nullopt otherwise: a standby, a snapshot, a halt).
  using Acknowledged = std::function<std::optional<pgoutput::Lsn>()>;

  OutboxRetention(boost::asio::io_context& io, const Config& config, Metrics& metrics);

  // Runs every table.retention.interval.ms until stop(); nothing without
  // table.retention.policy=delete.
  void start(Acknowledged acknowledged);
  void stop();
  // The relay made a new slot: what the old one carried says nothing of it.
  void slot_created();
  // For /slot: nullopt without a retention policy.
  std::optional<RetentionStatus> status() const;

 private:
  struct Fence {
    std::string snapshot;  // pg_current_snapshot() as text
    pgoutput::Lsn lsn;     // pg_current_wal_insert_lsn() after it
    std::uint64_t generation;  // of the slot, when it was taken
  };
  boost::asio::awaitable<void> run_loop();
  // One run: a fence, the wait for the relay to pass it, then each table
  // (deleted from on `deleter`).
  boost::asio::awaitable<void> connect(PgConnection& conn, const std::string& conninfo);
  boost::asio::awaitable<void> run_once(PgConnection& conn, PgConnection& deleter);
  boost::asio::awaitable<std::optional<Fence>> take_fence(PgConnection& conn);
  boost::asio::awaitable<void> settle_floors(PgConnection& conn);
  boost::asio::awaitable<bool> wait_until_passed(const Fence& fence);
  bool may_delete(const Fence& fence) const;
  boost::asio::awaitable<void> clean_table(PgConnection& conn, const TableName& table, const Fence& fence);
  boost::asio::awaitable<std::int64_t> archive_batch(PgConnection& conn, const TableName& table,
                                                     const std::string& sql);
  boost::asio::awaitable<std::string> archiving_delete(PgConnection& conn, const TableName& table,
                                                       const std::string& deleted_rows);
  boost::asio::awaitable<std::map<std::uint32_t, std::uint64_t>> floors_without_held(PgConnection& conn,
                                                                                     const TableName& table,
                                                                                     const std::string& name);
  boost::asio::awaitable<void> measure_table(PgConnection& conn, const TableName& table);
  // drop-partitions (outbox_retention.cpp says how).
  boost::asio::awaitable<void> drop_partitions(PgConnection& conn, const Fence& fence);
  // One table's partitions in one run. PostgreSQL's rules: one detach
  // pending per table at a time; with a DEFAULT partition, no CONCURRENTLY.
  struct TablePartitions {
    std::string root;  // the partitioned table, quoted
    bool has_default = false;
    bool pending = false;  // a detach is pending
  };
  using Row = std::vector<std::optional<std::string>>;
  boost::asio::awaitable<void> detach_expired(PgConnection& conn, const TableName& table, const Fence& fence);
  boost::asio::awaitable<PgRows> list_partitions(PgConnection& conn, const TableName& table, const std::string& root);
  boost::asio::awaitable<bool> resume_partition(PgConnection& conn, const TableName& table, const Row& row,
                                                TablePartitions& parts);
  boost::asio::awaitable<void> retire_partition(PgConnection& conn, const TableName& table, const Row& row,
                                                TablePartitions& parts);
  boost::asio::awaitable<bool> freeze(PgConnection& conn, const std::string& root, const std::string& name,
                                      std::uint64_t floor, bool has_default);
  boost::asio::awaitable<void> detach(PgConnection& conn, const std::string& root, const std::string& name,
                                      bool has_default);
  boost::asio::awaitable<void> finish_detach(PgConnection& conn, const std::string& root, const std::string& name);
  boost::asio::awaitable<int> drop_detached(PgConnection& conn, const Fence& fence);
  boost::asio::awaitable<void> remove_detached(PgConnection& conn, const std::string& name,
                                               const pgoutput::Lsn& lsn);
  static bool retry_later(const PgError& e);
  boost::asio::awaitable<void> restore_lock_timeout(PgConnection& conn);
  void warn_once(const std::string& what, const std::string& message);
  void warn_if_lagging();
  const std::string& time_column() const;
  boost::asio::awaitable<void> pause(std::chrono::milliseconds duration);

  boost::asio::io_context& io_;
  const Config& config_;
  Metrics& metrics_;
  Acknowledged acknowledged_;
  boost::asio::steady_timer timer_;  // between runs and batches; cancelled by stop()
  bool stopped_ = false;
  // Per outbox table, the xid from which on transactions began while the
  // slot was streamed (older rows may never have been sent): the slot
  // marker's, else given by this walrelay's first run.
  RetentionFloors floors_;
  bool floors_settled_ = false;
  std::optional<std::string> floors_refused_;  // why the marker does not keep them, as last logged
  std::uint64_t generation_ = 0;  // slots the relay made in this process
  std::chrono::steady_clock::time_point last_passed_ = std::chrono::steady_clock::now();  // a fence, last
  std::chrono::steady_clock::time_point last_lag_warning_{};
  std::map<std::string, std::chrono::steady_clock::time_point> held_warnings_;  // by table, the last one
  std::set<std::string> warned_;  // partitions a warning was given for
  bool partition_failed_ = false;  // drop-partitions: in this run
  std::map<std::string, std::string> partition_keys_;  // drop-partitions: each table's, by its name
  RetentionStatus status_;  // what /slot shows; its tables by table.include.list's order
  RetentionStatus::Table& table_status(const TableName& table);
  void run_ended(const std::string& outcome, const std::string& error);
};

// A row's xmin as an xid8 (SQL): the latest one with those 32 bits at or
// before the current snapshot's xmax.
std::string row_xid8_sql();

// The SQL condition on an outbox row (its xmin) that the slot did not carry
// it: its inserting transaction began before its table's floor (an xid8;
// `floors` by the oid of the table holding the row; none: NULL, unknown), or
// `slot_view` (RetentionFloors::slot_view, "": none) sees it and the floor is
// not 0 (0: an initial snapshot sent what the view saw).
std::string not_carried_condition(const std::map<std::uint32_t, std::uint64_t>& floors,
                                  const std::string& slot_view);

// The SQL condition on an outbox row (its xmin) that its inserting
// transaction had ended before `snapshot` was taken, and that the slot carried
// it (not not_carried_condition; a table with no floor: never). Throws
// PgError when `snapshot` or `slot_view` is not a pg_snapshot.
std::string acknowledged_rows_condition(const std::string& snapshot,
                                        const std::map<std::uint32_t, std::uint64_t>& floors,
                                        const std::string& slot_view);

}  // namespace walrelay
