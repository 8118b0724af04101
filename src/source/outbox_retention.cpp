// Retention of outbox rows (see outbox_retention.hpp).
#include "walrelay/source/outbox_retention.hpp"

#include <spdlog/spdlog.h>

#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "walrelay/source/catalog.hpp"
#include "walrelay/source/pg_connection.hpp"

namespace walrelay {
namespace asio = boost::asio;
using namespace std::chrono_literals;
using pgoutput::Lsn;

OutboxRetention::OutboxRetention(asio::io_context& io, const Config& config, Metrics& metrics)
    : io_(io), config_(config), metrics_(metrics), timer_(io) {}

void OutboxRetention::start(Acknowledged acknowledged) {
  if (config_.retention_policy == RetentionPolicy::none) return;
  acknowledged_ = std::move(acknowledged);
  asio::co_spawn(io_, run_loop(), asio::detached);
}

void OutboxRetention::stop() {
  stopped_ = true;
  timer_.cancel();
}

// A row's xmin as the xid8 it stands for: the latest one with those 32 bits
// at or before the current snapshot's xmax. Then two bounds, not
// pg_visible_in_snapshot: a snapshot lists running transactions, not their
// subtransactions, so a row inserted after a SAVEPOINT of a transaction still
// running would look visible. Below the snapshot's xmin, the row's
// transaction (its subtransactions' parent has a smaller xid) had ended when
// it was taken: committed before the fence's LSN. At or above the floor, it
// began while this walrelay streamed the slot, so the slot carried it: a row
// committed before the slot existed (a backlog at the first start with
// no_data, the gap after --reset-slot) was never sent, and stays.
std::string acknowledged_rows_condition(const std::string& snapshot, std::uint64_t floor) {
  if (!is_pg_snapshot_text(snapshot)) throw PgError("retention: not a snapshot: " + snapshot, "");
  const std::string now = "(SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint)";
  const std::string xid8 = "(" + now + " - ((" + now + " % 4294967296 - xmin::text::bigint + 4294967296) % 4294967296))";
  return "(" + xid8 + " >= " + std::to_string(floor) + " AND " + xid8 + " < pg_catalog.pg_snapshot_xmin('" + snapshot +
         "'::pg_snapshot)::text::bigint)";
}

asio::awaitable<void> OutboxRetention::pause(std::chrono::milliseconds duration) {
  timer_.expires_after(duration);
  boost::system::error_code ec;
  co_await timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

asio::awaitable<void> OutboxRetention::run_loop() {
  PgConnection conn(io_);
  const auto interval = std::chrono::milliseconds(config_.retention_interval_ms);
  spdlog::info("retention: table.retention.policy=delete: rows acknowledged and older than {} ms by {} go, {} at a "
               "time, every {} ms",
               config_.retention_ms,
               config_.retention_time_column.empty() ? config_.field_event_timestamp : config_.retention_time_column,
               config_.retention_batch_size, config_.retention_interval_ms);
  while (!stopped_) {
    // Until the floor is set, soon: rows begun before it are left in place.
    co_await pause(floor_ == 0 ? 100ms : interval);
    if (stopped_) break;
    // Only the walrelay that relays cleans: a standby's view of what was
    // acknowledged is nothing.
    if (!acknowledged_ || !acknowledged_()) continue;
    try {
      if (!conn.connected()) {
        co_await conn.connect(config_.conninfo(false), std::chrono::milliseconds(config_.database_connect_timeout_ms));
        // A batch waits at most a second for a lock (the application's
        // inserts never wait behind one) and runs at most a minute.
        const std::string lock_timeout = "SET lock_timeout = '1s'", statement_timeout = "SET statement_timeout = '60s'";
        co_await conn.query(lock_timeout);
        co_await conn.query(statement_timeout);
      }
      co_await run_once(conn);
    } catch (const PgError& e) {
      metrics_.retention_runs("error").Increment();
      spdlog::warn("retention: {}; trying again in {} ms", e.what(), config_.retention_interval_ms);
      conn.close();
    }
    metrics_.retention_last_run.Set(
        static_cast<double>(std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count()));
  }
}

asio::awaitable<void> OutboxRetention::run_once(PgConnection& conn) {
  auto fence = co_await take_fence(conn);
  if (!fence) co_return;  // a standby server: its primary's walrelay cleans
  if (!co_await wait_until_passed(*fence)) {
    metrics_.retention_runs("behind").Increment();
    co_return;
  }
  for (const auto& table : config_.table_include_list) {
    if (stopped_ || !acknowledged_()) co_return;
    co_await clean_table(conn, table, *fence);
  }
  metrics_.retention_runs("ok").Increment();
}

// The snapshot first, the WAL position after it (one statement, evaluated
// in that order under its snapshot).
asio::awaitable<std::optional<OutboxRetention::Fence>> OutboxRetention::take_fence(PgConnection& conn) {
  // (Named: g++ 12 frees a temporary argument of a coroutine twice.)
  const std::vector<std::string> no_params;
  const std::string sql =
      "SELECT pg_catalog.pg_is_in_recovery()::text AS standby, pg_catalog.pg_current_snapshot()::text AS snapshot, "
      "pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text AS xmax, "
      "CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL ELSE pg_catalog.pg_current_wal_insert_lsn()::text END "
      "AS lsn";
  auto rows = co_await conn.query(sql, no_params, 10s);
  if (rows.at(0, "standby").value_or("true") == "true") co_return std::nullopt;
  auto lsn = Lsn::parse(rows.at(0, "lsn").value_or(""));
  const auto& snapshot = rows.at(0, "snapshot");
  const auto& xmax = rows.at(0, "xmax");
  if (!lsn || !snapshot || !xmax || xmax->find_first_not_of("0123456789") != std::string::npos)
    throw PgError("retention: could not read the snapshot and the WAL position", "");
  // The first fence sets the floor: what begins after it, the slot carries.
  if (floor_ == 0) {
    floor_ = std::stoull(*xmax);
    spdlog::info("retention: rows of transactions from xid {} on may go once acknowledged; older ones (committed "
                 "before this walrelay relayed the slot, perhaps never sent) are left in place",
                 floor_);
  }
  co_return Fence{*snapshot, *lsn};
}

// Until the relay has confirmed past the fence, for at most one interval.
asio::awaitable<bool> OutboxRetention::wait_until_passed(const Fence& fence) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(config_.retention_interval_ms);
  while (!stopped_) {
    auto acknowledged = acknowledged_();
    if (!acknowledged) co_return false;
    if (*acknowledged >= fence.lsn) co_return true;
    if (std::chrono::steady_clock::now() >= deadline) co_return false;
    co_await pause(100ms);
  }
  co_return false;
}

// Batches by ctid, each its own statement (and transaction), until one comes
// back short.
asio::awaitable<void> OutboxRetention::clean_table(PgConnection& conn, const TableName& table, const Fence& fence) {
  const std::string name = conn.quote_identifier(table.schema) + "." + conn.quote_identifier(table.name);
  const std::string column =
      config_.retention_time_column.empty() ? config_.field_event_timestamp : config_.retention_time_column;
  std::string old_enough;
  if (config_.retention_ms > 0)
    old_enough = " AND " + conn.quote_identifier(column) + " < pg_catalog.now() - " +
                 conn.quote_literal(std::to_string(config_.retention_ms) + " milliseconds") + "::interval";
  const std::string acknowledged = acknowledged_rows_condition(fence.snapshot, floor_);
  // The condition again on the rows deleted: a ctid names a row within one
  // table only (a partitioned outbox's partitions share them), and a row
  // updated meanwhile is judged by its new version.
  const std::string condition = acknowledged + old_enough;
  const std::string sql = "WITH gone AS (DELETE FROM " + name + " WHERE ctid = ANY (ARRAY(SELECT ctid FROM " + name +
                          " WHERE " + condition + " LIMIT " + std::to_string(config_.retention_batch_size) +
                          ")) AND " + condition + " RETURNING 1) SELECT count(*) FROM gone";
  const std::string qualified = table.qualified();
  const std::vector<std::string> no_params;
  std::int64_t deleted = 0;
  while (!stopped_ && acknowledged_()) {
    auto rows = co_await conn.query(sql, no_params, 70s);
    const auto n = std::stoll(rows.at(0, "count").value_or("0"));
    deleted += n;
    metrics_.retention_rows_deleted(qualified).Increment(static_cast<double>(n));
    if (n < config_.retention_batch_size) break;
    co_await pause(10ms);  // room for the application between batches
  }
  // A partitioned table's size is its partitions' (the root has no storage).
  const std::string regclass = conn.quote_literal(name) + "::regclass";
  const std::string size_sql = "SELECT (pg_catalog.pg_total_relation_size(" + regclass +
                               ") + coalesce((SELECT sum(pg_catalog.pg_total_relation_size(relid)) FROM "
                               "pg_catalog.pg_partition_tree(" + regclass + ") WHERE relid <> " + regclass +
                               "), 0))::text AS bytes";
  auto size = co_await conn.query(size_sql, no_params, 10s);
  metrics_.retention_table_bytes(qualified).Set(std::stod(size.at(0, "bytes").value_or("0")));
  if (deleted > 0) spdlog::info("retention: {} rows of {} deleted", deleted, qualified);
}

}  // namespace walrelay
