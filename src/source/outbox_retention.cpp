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
// it was taken: committed before the fence's LSN. At or above its table's
// floor, it began while the slot was streamed, so the slot carried it: a row
// committed before the slot existed (a backlog at the first start with
// no_data, the gap after --reset-slot, a table or partition attached with its
// rows) was never sent, and stays.
std::string row_xid8_sql() {
  const std::string now = "(SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint)";
  return "(" + now + " - ((" + now + " % 4294967296 - xmin::text::bigint + 4294967296) % 4294967296))";
}

// The floor of the table (partition) holding a row, by its tableoid; a
// table with none: NULL, and the row stays.
static std::string floor_of_row_sql(const std::map<std::uint32_t, std::uint64_t>& floors) {
  std::string floor = "(CASE tableoid::bigint";
  for (const auto& [oid, xid] : floors) floor += " WHEN " + std::to_string(oid) + " THEN " + std::to_string(xid);
  return floor + " END)";
}

std::string acknowledged_rows_condition(const std::string& snapshot,
                                        const std::map<std::uint32_t, std::uint64_t>& floors) {
  if (!is_pg_snapshot_text(snapshot)) throw PgError("retention: not a snapshot: " + snapshot, "");
  if (floors.empty()) return "false";
  const std::string xid8 = row_xid8_sql();
  const std::string floor = floor_of_row_sql(floors);
  return "(" + xid8 + " >= " + floor + " AND " + xid8 + " < pg_catalog.pg_snapshot_xmin('" + snapshot +
         "'::pg_snapshot)::text::bigint)";
}

void OutboxRetention::slot_created() {
  ++generation_;
  floors_ = {};
  floors_settled_ = false;
}

asio::awaitable<void> OutboxRetention::pause(std::chrono::milliseconds duration) {
  timer_.expires_after(duration);
  boost::system::error_code ec;
  co_await timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

// A batch waits at most a second for a lock (the application's inserts never
// wait behind one) and runs at most a minute.
asio::awaitable<void> OutboxRetention::connect(PgConnection& conn, const std::string& conninfo) {
  if (conn.connected()) co_return;
  co_await conn.connect(conninfo, std::chrono::milliseconds(config_.database_connect_timeout_ms));
  const std::string lock_timeout = "SET lock_timeout = '1s'", statement_timeout = "SET statement_timeout = '60s'";
  co_await conn.query(lock_timeout);
  co_await conn.query(statement_timeout);
}

asio::awaitable<void> OutboxRetention::run_loop() {
  // The fence and the floors on walrelay's role; the deletes on
  // table.retention.user's when set (DELETE is a right the relay's role need
  // not have).
  PgConnection conn(io_), own(io_);
  const bool own_role = !config_.retention_user.empty();
  PgConnection& deleter = own_role ? own : conn;
  const auto interval = std::chrono::milliseconds(config_.retention_interval_ms);
  spdlog::info("retention: table.retention.policy=delete: rows acknowledged and older than {} ms by {} go, {} at a "
               "time, every {} ms, as {}",
               config_.retention_ms, time_column(), config_.retention_batch_size, config_.retention_interval_ms,
               own_role ? config_.retention_user : config_.database_user);
  while (!stopped_) {
    // Until the floors are set, soon: rows begun before them are left in place.
    co_await pause(floors_settled_ ? interval : 100ms);
    if (stopped_) break;
    // Only the walrelay that relays cleans: a standby's view of what was
    // acknowledged is nothing.
    if (!acknowledged_ || !acknowledged_()) {
      last_passed_ = std::chrono::steady_clock::now();  // a lag is counted while relaying only
      continue;
    }
    try {
      co_await connect(conn, config_.conninfo(false));
      if (own_role) co_await connect(own, config_.retention_conninfo());
      co_await run_once(conn, deleter);
    } catch (const PgError& e) {
      metrics_.retention_runs("error").Increment();
      spdlog::warn("retention: {}; trying again in {} ms", e.what(), config_.retention_interval_ms);
      conn.close();
      own.close();
    }
    metrics_.retention_last_run.Set(
        static_cast<double>(std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count()));
  }
}

asio::awaitable<void> OutboxRetention::run_once(PgConnection& conn, PgConnection& deleter) {
  auto fence = co_await take_fence(conn);
  if (!fence) co_return;  // a standby server: its primary's walrelay cleans
  co_await settle_floors(conn);
  if (!may_delete(*fence)) co_return;
  const bool passed = co_await wait_until_passed(*fence);
  if (passed) {
    for (const auto& table : config_.table_include_list) {
      if (!may_delete(*fence)) co_return;
      co_await clean_table(deleter, table, *fence);
    }
    last_passed_ = std::chrono::steady_clock::now();
  }
  for (const auto& table : config_.table_include_list) co_await measure_table(deleter, table);
  metrics_.retention_runs(passed ? "ok" : "behind").Increment();
  if (!passed) warn_if_lagging();
}

// The slot lagging more than the retention: rows past it are kept until the
// broker has them, and the table grows beyond what the retention promises.
void OutboxRetention::warn_if_lagging() {
  const auto now = std::chrono::steady_clock::now();
  const auto retention = std::chrono::milliseconds(config_.retention_ms);
  if (now - last_passed_ <= retention || now - last_lag_warning_ < std::max<std::chrono::milliseconds>(retention, 10min))
    return;
  last_lag_warning_ = now;
  spdlog::warn("retention: the slot has not passed a run's fence for {} s, longer than table.retention.ms ({} ms): "
               "rows past their retention are kept until the broker acknowledges them, and the outbox grows until "
               "then (see walrelay_slot_lag_bytes)",
               std::chrono::duration_cast<std::chrono::seconds>(now - last_passed_).count(), config_.retention_ms);
}

// The snapshot first, the WAL position after it (one statement, evaluated
// in that order under its snapshot).
asio::awaitable<std::optional<OutboxRetention::Fence>> OutboxRetention::take_fence(PgConnection& conn) {
  const auto generation = generation_;
  // (Named: g++ 12 frees a temporary argument of a coroutine twice.)
  const std::vector<std::string> no_params;
  const std::string sql =
      "SELECT pg_catalog.pg_is_in_recovery()::text AS standby, pg_catalog.pg_current_snapshot()::text AS snapshot, "
      "CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL ELSE pg_catalog.pg_current_wal_insert_lsn()::text END "
      "AS lsn";
  auto rows = co_await conn.query(sql, no_params, 10s);
  if (rows.at(0, "standby").value_or("true") == "true") co_return std::nullopt;
  auto lsn = Lsn::parse(rows.at(0, "lsn").value_or(""));
  const auto& snapshot = rows.at(0, "snapshot");
  if (!lsn || !snapshot) throw PgError("retention: could not read the snapshot and the WAL position", "");
  co_return Fence{*snapshot, *lsn, generation};
}

// The floors as the slot's marker keeps them, given to tables (and
// partitions) that have none yet; said once each, as is a marker that cannot
// keep them.
asio::awaitable<void> OutboxRetention::settle_floors(PgConnection& conn) {
  const auto generation = generation_;
  auto settled = co_await settle_retention_floors(conn, config_, floors_);
  // A slot made meanwhile: these may be the old one's.
  if (generation != generation_ || !acknowledged_()) co_return;
  if (!floors_settled_ && settled.added.size() < settled.floors.size())
    spdlog::info("retention: floors kept with slot {} for {} of {} tables (rows earlier walrelays relayed may go)",
                 config_.slot_name, settled.floors.size() - settled.added.size(), settled.floors.size());
  if (!settled.added.empty()) {
    std::string tables;
    for (const auto& t : settled.added) tables += (tables.empty() ? "" : ", ") + t;
    spdlog::info("retention: rows of transactions from xid {} on may go once acknowledged, in {}; older ones "
                 "(committed before this slot carried the table, perhaps never sent) are left in place",
                 settled.candidate, tables);
  }
  if (settled.refused != floors_refused_ && settled.refused)
    spdlog::warn("retention: the floors are not kept with the slot ({}): after a restart, rows from before it stay "
                 "in the outbox",
                 *settled.refused);
  floors_refused_ = settled.refused;
  floors_ = std::move(settled);
  floors_settled_ = true;
}

// Deletes stop when the relay stops relaying or makes a new slot.
bool OutboxRetention::may_delete(const Fence& fence) const {
  return !stopped_ && fence.generation == generation_ && floors_settled_ && acknowledged_ && acknowledged_();
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
  std::string old_enough;
  if (config_.retention_ms > 0)
    old_enough = " AND " + conn.quote_identifier(time_column()) + " < pg_catalog.now() - " +
                 conn.quote_literal(std::to_string(config_.retention_ms) + " milliseconds") + "::interval";
  const auto floors = co_await floors_without_held(conn, table, name);
  const std::string acknowledged = acknowledged_rows_condition(fence.snapshot, floors);
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
  while (may_delete(fence)) {
    auto rows = co_await conn.query(sql, no_params, 70s);
    const auto n = std::stoll(rows.at(0, "count").value_or("0"));
    deleted += n;
    metrics_.retention_rows_deleted(qualified).Increment(static_cast<double>(n));
    if (n < config_.retention_batch_size) break;
    co_await pause(10ms);  // room for the application between batches
  }
  if (deleted > 0) spdlog::info("retention: {} rows of {} deleted", deleted, qualified);
}

// The floors, less those of the tables (partitions) that hold rows from
// before their floor: the slot may never have carried them, and while any is
// there none of that table's rows go. A row's xmin is all that tells it from
// the others, and it does not last: an UPDATE or a rewrite (pg_repack, ALTER
// ... TYPE) gives it a new one above the floor, and 2^32 transactions later
// its xmin reads as a new one. So the operator decides about those rows
// first (sends them with walrelay replay, or finds them in the broker, then
// deletes them).
asio::awaitable<std::map<std::uint32_t, std::uint64_t>> OutboxRetention::floors_without_held(PgConnection& conn,
                                                                                             const TableName& table,
                                                                                             const std::string& name) {
  auto floors = floors_.floors;
  const std::string floor = floor_of_row_sql(floors);
  const std::vector<std::string> no_params;
  auto held = co_await conn.query("SELECT tableoid::bigint::text, tableoid::regclass::text, count(*)::text FROM " +
                                      name + " WHERE " + row_xid8_sql() + " < " + floor + " GROUP BY 1, 2",
                                  no_params, 70s);
  double total = 0;
  std::string where;
  for (const auto& row : held.rows) {
    floors.erase(static_cast<std::uint32_t>(std::stoul(row[0].value_or("0"))));
    total += std::stod(row[2].value_or("0"));
    where += (where.empty() ? "" : ", ") + row[2].value_or("?") + " in " + row[1].value_or("?");
  }
  metrics_.retention_rows_held(table.qualified()).Set(total);
  const auto now = std::chrono::steady_clock::now();
  auto& warned = held_warnings_[table.qualified()];
  if (total > 0 && (warned == std::chrono::steady_clock::time_point{} || now - warned > 10min)) {
    warned = now;
    spdlog::warn("retention: {} holds rows written before walrelay relayed it ({}): the slot may never have carried "
                 "them, and none of that table's rows are deleted while they are there. See that they are in the "
                 "broker (walrelay replay sends them again), then delete them by hand",
                 table.qualified(), where);
  }
  co_return floors;
}

// The table's size and the age of its oldest row, for the metrics.
asio::awaitable<void> OutboxRetention::measure_table(PgConnection& conn, const TableName& table) {
  const std::string name = conn.quote_identifier(table.schema) + "." + conn.quote_identifier(table.name);
  // A partitioned table's size is its partitions' (the root has no storage).
  const std::string regclass = conn.quote_literal(name) + "::regclass";
  std::string sql = "SELECT (pg_catalog.pg_total_relation_size(" + regclass +
                    ") + coalesce((SELECT sum(pg_catalog.pg_total_relation_size(relid)) FROM "
                    "pg_catalog.pg_partition_tree(" + regclass + ") WHERE relid <> " + regclass +
                    "), 0))::text AS bytes";
  if (config_.retention_ms > 0)
    sql += ", coalesce(extract(epoch FROM pg_catalog.now() - (SELECT min(" + conn.quote_identifier(time_column()) +
           ") FROM " + name + " WHERE pg_catalog.isfinite(" + conn.quote_identifier(time_column()) + "))), 0)::text AS age";
  const std::vector<std::string> no_params;
  auto rows = co_await conn.query(sql, no_params, 60s);
  const std::string qualified = table.qualified();
  metrics_.retention_table_bytes(qualified).Set(std::stod(rows.at(0, "bytes").value_or("0")));
  if (config_.retention_ms > 0)
    metrics_.retention_oldest_row_age(qualified).Set(std::max(0.0, std::stod(rows.at(0, "age").value_or("0"))));
}

const std::string& OutboxRetention::time_column() const {
  return config_.retention_time_column.empty() ? config_.field_event_timestamp : config_.retention_time_column;
}

}  // namespace walrelay
