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

// The retention connections' lock_timeout: a statement waits at most this
// long for a lock, so the application's inserts never wait long behind one.
constexpr std::string_view session_lock_timeout = "SET lock_timeout = '1s'";

OutboxRetention::OutboxRetention(asio::io_context& io, const Config& config, Metrics& metrics)
    : io_(io), config_(config), metrics_(metrics), timer_(io) {
  status_.policy = config.retention_policy == RetentionPolicy::drop_partitions ? "drop-partitions" : "delete";
  status_.retention_ms = config.retention_ms;
  for (const auto& table : config.table_include_list) table_status(table);
}

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
  if (floors.empty()) return "NULL::bigint";
  std::string floor = "(CASE tableoid::bigint";
  for (const auto& [oid, xid] : floors) floor += " WHEN " + std::to_string(oid) + " THEN " + std::to_string(xid);
  return floor + " END)";
}

// A row the slot's view sees was committed before the slot's consistent
// point: the slot did not stream it, and it was carried only where an
// initial snapshot sent it (its table's floor is 0). (Subtransactions are
// judged right: the view a slot exports lists every xid between its bounds
// that it did not see commit, subtransactions' too.)
static std::string seen_by_view_sql(const std::string& floor, const std::string& slot_view) {
  if (slot_view.empty()) return "false";
  if (!is_pg_snapshot_text(slot_view)) throw PgError("retention: not a snapshot: " + slot_view, "");
  return "(" + floor + " > 0 AND pg_catalog.pg_visible_in_snapshot(" + row_xid8_sql() + "::text::xid8, '" +
         slot_view + "'::pg_snapshot))";
}

static std::string not_carried_sql(const std::string& floor, const std::string& slot_view) {
  return "(" + row_xid8_sql() + " < " + floor + " OR " + seen_by_view_sql(floor, slot_view) + ")";
}

std::string not_carried_condition(const std::map<std::uint32_t, std::uint64_t>& floors,
                                  const std::string& slot_view) {
  return not_carried_sql(floor_of_row_sql(floors), slot_view);
}

std::string acknowledged_rows_condition(const std::string& snapshot,
                                        const std::map<std::uint32_t, std::uint64_t>& floors,
                                        const std::string& slot_view) {
  if (!is_pg_snapshot_text(snapshot)) throw PgError("retention: not a snapshot: " + snapshot, "");
  if (floors.empty()) return "false";
  const std::string xid8 = row_xid8_sql();
  const std::string floor = floor_of_row_sql(floors);
  // (NOT NULL is NULL: a row without a floor stays.)
  return "(" + xid8 + " >= " + floor + " AND NOT " + seen_by_view_sql(floor, slot_view) + " AND " + xid8 +
         " < pg_catalog.pg_snapshot_xmin('" + snapshot + "'::pg_snapshot)::text::bigint)";
}

std::optional<RetentionStatus> OutboxRetention::status() const {
  if (config_.retention_policy == RetentionPolicy::none) return std::nullopt;
  return status_;
}

RetentionStatus::Table& OutboxRetention::table_status(const TableName& table) {
  const std::string name = table.qualified();
  for (auto& t : status_.tables)
    if (t.name == name) return t;
  return status_.tables.emplace_back(RetentionStatus::Table{name, {}, {}, 0, {}});
}

void OutboxRetention::run_ended(const std::string& outcome, const std::string& error) {
  metrics_.retention_runs(outcome).Increment();
  status_.last_outcome = outcome;
  // A server's message can carry a DETAIL or a trigger's text: the start is
  // enough for /slot (the log has it whole).
  status_.last_error = error.size() > 500 ? error.substr(0, 500) + "..." : error;
  status_.last_run_unix_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
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
  const std::string lock_timeout(session_lock_timeout), statement_timeout = "SET statement_timeout = '60s'";
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
  const std::string role = own_role ? config_.retention_user : config_.database_user;
  if (config_.retention_policy == RetentionPolicy::drop_partitions && config_.retention_ms < 3600000)
    spdlog::warn("retention: table.retention.ms={} is shorter than an hour: a partition is frozen that long after "
                 "its range ended, and a transaction still writing events with a time in that range then fails",
                 config_.retention_ms);
  if (config_.retention_policy == RetentionPolicy::drop_partitions)
    spdlog::info("retention: table.retention.policy=drop-partitions: partitions whose range ended more than {} ms ago "
                 "are detached, then {} once acknowledged, every {} ms, as {}",
                 config_.retention_ms,
                 config_.retention_archive_schema.empty() ? "dropped"
                                                          : "moved to schema " + config_.retention_archive_schema,
                 config_.retention_interval_ms, role);
  else
    spdlog::info("retention: table.retention.policy=delete: rows acknowledged and older than {} ms by {} go, {} at a "
                 "time, every {} ms, as {}",
                 config_.retention_ms, time_column(), config_.retention_batch_size, config_.retention_interval_ms,
                 role);
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
    } catch (const std::exception& e) {
      // Whatever failed (the server's error, or an answer walrelay could not
      // read), the next run tries again: retention never stops silently.
      run_ended("error", e.what());
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
  if (config_.retention_policy == RetentionPolicy::drop_partitions) {
    co_await drop_partitions(deleter, *fence);
    co_return;
  }
  const bool passed = co_await wait_until_passed(*fence);
  if (passed) {
    for (const auto& table : config_.table_include_list) {
      if (!may_delete(*fence)) co_return;
      co_await clean_table(deleter, table, *fence);
    }
    last_passed_ = std::chrono::steady_clock::now();
  }
  for (const auto& table : config_.table_include_list) co_await measure_table(deleter, table);
  run_ended(passed ? "ok" : "behind", "");
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
    spdlog::info("retention: floors kept with slot {} for {} of {} tables (rows earlier walrelays relayed may go{})",
                 config_.slot_name, settled.floors.size() - settled.added.size(), settled.floors.size(),
                 settled.slot_view.empty() ? ""
                                           : "; those of the slot's view at its consistent point, where an initial "
                                             "snapshot sent them");

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
  const std::string acknowledged = acknowledged_rows_condition(fence.snapshot, floors, floors_.slot_view);
  // The condition again on the rows deleted: a ctid names a row within one
  // table only (a partitioned outbox's partitions share them), and a row
  // updated meanwhile is judged by its new version.
  const std::string condition = acknowledged + old_enough;
  const std::string deleted_rows = "DELETE FROM " + name + " WHERE ctid = ANY (ARRAY(SELECT ctid FROM " + name +
                                   " WHERE " + condition + " LIMIT " + std::to_string(config_.retention_batch_size) +
                                   ")) AND " + condition;
  std::string sql = "WITH gone AS (" + deleted_rows + " RETURNING 1) SELECT count(*) FROM gone";
  if (!config_.retention_archive_schema.empty()) sql = co_await archiving_delete(conn, table, deleted_rows);
  const std::string qualified = table.qualified();
  const std::vector<std::string> no_params;
  std::int64_t deleted = 0;
  const bool archiving = !config_.retention_archive_schema.empty();
  while (may_delete(fence)) {
    std::int64_t n = 0;
    if (archiving) {
      n = co_await archive_batch(conn, table, sql);
    } else {
      auto rows = co_await conn.query(sql, no_params, 70s);
      n = std::stoll(rows.at(0, "count").value_or("0"));
    }
    deleted += n;
    metrics_.retention_rows_deleted(qualified).Increment(static_cast<double>(n));
    table_status(table).rows_deleted += static_cast<std::uint64_t>(n);
    if (n < config_.retention_batch_size) break;
    co_await pause(10ms);  // room for the application between batches
  }
  if (deleted > 0) spdlog::info("retention: {} rows of {} deleted", deleted, qualified);
}

// The delete that moves its rows into table.retention.archive.schema's table
// of the same name, in the one statement: a row is archived exactly when it is
// deleted (a failed insert deletes nothing; the run says why and the next
// tries again). The columns are the outbox table's as they are now, less those
// the archive generates itself.
asio::awaitable<std::string> OutboxRetention::archiving_delete(PgConnection& conn, const TableName& table,
                                                               const std::string& deleted_rows) {
  const std::string archive =
      conn.quote_identifier(config_.retention_archive_schema) + "." + conn.quote_identifier(table.name);
  auto cols = co_await conn.query(
      "SELECT a.attname FROM pg_catalog.pg_attribute a WHERE a.attrelid = " +
          conn.quote_literal(conn.quote_identifier(table.schema) + "." + conn.quote_identifier(table.name)) +
          "::regclass AND a.attnum > 0 AND NOT a.attisdropped AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute "
          "b WHERE b.attrelid = " + conn.quote_literal(archive) + "::regclass AND b.attname = a.attname AND "
          "b.attgenerated <> '') ORDER BY a.attnum",
      std::vector<std::string>{}, 60s);
  std::string list;
  for (const auto& row : cols.rows) list += (list.empty() ? "" : ", ") + conn.quote_identifier(row[0].value_or(""));
  co_return "WITH gone AS (" + deleted_rows + " RETURNING " + list + "), kept AS (INSERT INTO " + archive + " (" +
      list + ") OVERRIDING SYSTEM VALUE SELECT " + list + " FROM gone RETURNING 1) SELECT (SELECT count(*) FROM gone) "
      "AS count, (SELECT count(*) FROM kept) AS kept";
}

// One batch of the archiving delete, in a transaction of its own: a row the
// archive table did not keep (a trigger that returns NULL, a rule) rolls the
// batch back, since a data-modifying WITH deletes whatever its INSERT does.
// The server's message without its DETAIL, which can hold a whole row.
asio::awaitable<std::int64_t> OutboxRetention::archive_batch(PgConnection& conn, const TableName& table,
                                                            const std::string& sql) {
  const std::vector<std::string> no_params;
  co_await conn.query("BEGIN", no_params, 10s);
  std::string failure, sqlstate;
  std::int64_t deleted = 0, kept = 0;
  try {
    auto rows = co_await conn.query(sql, no_params, 70s);
    deleted = std::stoll(rows.at(0, "count").value_or("0"));
    kept = std::stoll(rows.at(0, "kept").value_or("0"));
  } catch (const PgError& e) {
    failure = e.primary().empty() ? std::string(e.what()) : e.primary();
    failure = "moving rows of " + table.qualified() + " to the archive: " + failure.substr(0, failure.find('\n'));
    sqlstate = e.sqlstate();
  }
  if (failure.empty() && kept != deleted)
    failure = "the archive table " + config_.retention_archive_schema + "." + table.name + " kept " +
              std::to_string(kept) + " of " + std::to_string(deleted) + " rows (a trigger or a rule on it?): nothing "
              "of " + table.qualified() + " deleted";
  if (!failure.empty()) {
    try {
      co_await conn.query("ROLLBACK", no_params, 10s);
    } catch (const std::exception&) {
      // The connection is gone: its transaction with it.
    }
    throw PgError(failure, sqlstate);
  }
  co_await conn.query("COMMIT", no_params, 10s);
  co_return deleted;
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
  const std::vector<std::string> no_params;
  auto held = co_await conn.query("SELECT tableoid::bigint::text, tableoid::regclass::text, count(*)::text FROM " +
                                      name + " WHERE " + not_carried_condition(floors, floors_.slot_view) +
                                      " GROUP BY 1, 2",
                                  no_params, 70s);
  double total = 0;
  std::string where;
  for (const auto& row : held.rows) {
    floors.erase(static_cast<std::uint32_t>(std::stoul(row[0].value_or("0"))));
    total += std::stod(row[2].value_or("0"));
    where += (where.empty() ? "" : ", ") + row[2].value_or("?") + " in " + row[1].value_or("?");
  }
  metrics_.retention_rows_held(table.qualified()).Set(total);
  table_status(table).rows_held = total;
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
  // drop-partitions: the age by the partition key (a time).
  const auto key = partition_keys_.find(table.qualified());
  const std::string column = config_.retention_policy == RetentionPolicy::drop_partitions
                                 ? (key == partition_keys_.end() ? std::string() : key->second)
                                 : (config_.retention_ms > 0 ? time_column() : std::string());
  if (!column.empty())
    sql += ", coalesce(extract(epoch FROM pg_catalog.now() - (SELECT min(" + conn.quote_identifier(column) +
           ")::timestamptz FROM " + name + " WHERE pg_catalog.isfinite(" + conn.quote_identifier(column) +
           "))), 0)::text AS age";
  const std::vector<std::string> no_params;
  auto rows = co_await conn.query(sql, no_params, 60s);
  const std::string qualified = table.qualified();
  auto& shown = table_status(table);
  shown.bytes = std::stod(rows.at(0, "bytes").value_or("0"));
  metrics_.retention_table_bytes(qualified).Set(*shown.bytes);
  if (!column.empty()) {
    shown.oldest_row_age_seconds = std::max(0.0, std::stod(rows.at(0, "age").value_or("0")));
    metrics_.retention_oldest_row_age(qualified).Set(*shown.oldest_row_age_seconds);
  }
}

const std::string& OutboxRetention::time_column() const {
  return config_.retention_time_column.empty() ? config_.field_event_timestamp : config_.retention_time_column;
}

}  // namespace walrelay

namespace walrelay {

// drop-partitions. A leaf partition whose range ended more than
// table.retention.ms ago goes in three steps:
// - Frozen, in one transaction: a SHARE ROW EXCLUSIVE lock waits (half a
//   second at most: else the next run) for the transactions writing to it to end, a
//   late one with an old time included, and keeps new ones out; every row in
//   it then is committed, before the WAL position L read next. A constraint
//   CHECK (false) NOT VALID refuses any row from then on (without a DEFAULT
//   partition such a row has no partition to go to once it is detached
//   anyway). The partition's comment records the slot, L and its floor.
//   Rows from before the floor (perhaps never sent) keep it in place.
// - Detached: CONCURRENTLY, blocking nobody, unless a DEFAULT partition
//   forbids it (then in the freezing transaction, waiting half a second at
//   most for each lock); FINALIZE when an earlier one was interrupted.
// - Dropped, or moved to table.retention.archive.schema, by a later run once
//   the relay has confirmed past L under the same slot.
// A crash between the steps leaves a frozen partition, attached or not, with
// its comment, and the next run goes on from there: nothing is lost.
namespace {

constexpr std::string_view detached_word = "walrelay.retention.detached";
constexpr std::string_view frozen_constraint = "walrelay_retention_frozen";
constexpr std::string_view held_word = "walrelay.retention.held";

// `key=value` from a frozen partition's comment.
std::string comment_value(const std::string& comment, const std::string& key) {
  const auto at = comment.find(" " + key + "=");
  if (at == std::string::npos) return {};
  const auto begin = at + key.size() + 2;
  return comment.substr(begin, comment.find(' ', begin) - begin);
}

// SQL: whether the table whose oid `relation` (an SQL expression) gives has
// the freezing constraint.
std::string frozen_sql(PgConnection& conn, const std::string& relation) {
  return "EXISTS (SELECT FROM pg_catalog.pg_constraint k WHERE k.conrelid = " + relation + " AND k.conname = " +
         conn.quote_literal(std::string(frozen_constraint)) + ")";
}

}  // namespace

// The partitions of `table` whose range ended more than table.retention.ms
// ago, frozen and detached; also those an earlier run left frozen or half
// detached. A partition can fail for a while (its lock not to be had, a
// time-out): the others go on, and the next run tries it again.
asio::awaitable<void> OutboxRetention::detach_expired(PgConnection& conn, const TableName& table, const Fence& fence) {
  TablePartitions parts;
  parts.root = conn.quote_identifier(table.schema) + "." + conn.quote_identifier(table.name);
  const PgRows partitions = co_await list_partitions(conn, table, parts.root);
  for (const auto& row : partitions.rows) {
    parts.has_default = parts.has_default || row[4] == "true";
    parts.pending = parts.pending || row[3] == "true";
  }
  for (const auto& row : partitions.rows) {
    if (!may_delete(fence)) co_return;
    std::exception_ptr failure;
    try {
      if (!co_await resume_partition(conn, table, row, parts)) co_await retire_partition(conn, table, row, parts);
    } catch (const PgError& e) {
      if (!retry_later(e)) throw;
      failure = std::current_exception();
    }
    if (failure) {
      co_await restore_lock_timeout(conn);
      partition_failed_ = true;
      try {
        std::rethrow_exception(failure);
      } catch (const PgError& e) {
        spdlog::warn("retention: partition {} of {}: {}; the next run tries again", row[1].value_or("?"),
                     table.qualified(), e.primary().empty() ? e.what() : e.primary());
      }
    }
  }
}

// The partitions of `table`, a half-detached one first; each row: oid,
// name, relkind, detach pending, DEFAULT, expired (its range ended more than
// table.retention.ms ago by the partition key's own clock: now() for
// timestamptz, the session's local time, UTC, for timestamp and date),
// comment, frozen. Records the partition key's column.
asio::awaitable<PgRows> OutboxRetention::list_partitions(PgConnection& conn, const TableName& table,
                                                          const std::string& root) {
  const std::vector<std::string> no_params;
  auto key = co_await conn.query("SELECT a.attname, a.atttypid::regtype::text AS type FROM "
                                 "pg_catalog.pg_partitioned_table p JOIN pg_catalog.pg_attribute a ON a.attrelid = "
                                 "p.partrelid AND a.attnum = p.partattrs[0] WHERE p.partstrat = 'r' AND p.partrelid = " +
                                     conn.quote_literal(root) + "::regclass",
                                 no_params, 30s);
  if (key.rows.empty()) throw PgError("retention: " + table.qualified() + " is not partitioned by range", "");
  partition_keys_[table.qualified()] = key.rows[0][0].value_or("");
  const bool zoned = key.at(0, "type") == "timestamp with time zone";
  const std::string type = zoned ? "timestamptz" : "timestamp", now = zoned ? "pg_catalog.now()" : "pg_catalog.localtimestamp";
  const std::string sql =
      "SELECT c.oid::text, format('%I.%I', n.nspname, c.relname) AS name, c.relkind::text AS kind, "
      "i.inhdetachpending::text AS pending, (pg_catalog.pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT')::text AS "
      "is_default, coalesce(substring(pg_catalog.pg_get_expr(c.relpartbound, c.oid) from 'TO \\(''([^'']*)''\\)$')::" +
      type + " <= " + now + " - " + conn.quote_literal(std::to_string(config_.retention_ms) + " milliseconds") +
      "::interval, false)::text AS expired, coalesce(pg_catalog.obj_description(c.oid, 'pg_class'), '') AS comment, " +
      frozen_sql(conn, "c.oid") + "::text AS frozen FROM pg_catalog.pg_inherits i JOIN "
      "pg_catalog.pg_class c ON c.oid = i.inhrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE "
      "i.inhparent = " + conn.quote_literal(root) + "::regclass ORDER BY i.inhdetachpending DESC, 2";
  co_return co_await conn.query(sql, no_params, 30s);
}

// A partition an earlier run (or someone else) began with: half detached,
// or frozen. Finishes what is this slot's; false for any other partition.
asio::awaitable<bool> OutboxRetention::resume_partition(PgConnection& conn, const TableName& table,
                                                         const Row& row,
                                                         TablePartitions& parts) {
  const std::string name = row[1].value_or("?"), comment = " " + row[6].value_or("");
  const bool frozen = row[7] == "true";
  const bool ours = comment_value(comment, "slot") == config_.slot_name;
  if (row[3] == "true") {  // a CONCURRENTLY interrupted (a time-out, a crash)
    if (frozen && ours) {
      co_await finish_detach(conn, parts.root, name);
      parts.pending = false;
    } else {
      warn_once(name, "retention: partition " + name + " of " + table.qualified() +
                          " is being detached by someone else (DETACH ... CONCURRENTLY not finished): no other "
                          "partition of it can be detached until it is finalized");
    }
    co_return true;
  }
  if (!frozen) co_return false;
  // Frozen by an earlier run that did not get to detach it (expired or
  // not: it refuses new rows either way), or by another slot's walrelay,
  // which detaches and drops it itself.
  if (!ours) {
    warn_once(name, "retention: partition " + name + " of " + table.qualified() +
                        " was frozen by the walrelay of another slot (" + comment_value(comment, "slot") +
                        "): left to it");
  } else if (!parts.pending || parts.has_default) {
    parts.pending = !parts.has_default;  // a CONCURRENTLY that fails stays pending
    co_await detach(conn, parts.root, name, parts.has_default);
    parts.pending = false;
  }
  co_return true;
}

// An expired partition of this table, neither frozen nor half detached:
// frozen at the floor the slot carried its rows from, then detached, unless
// it cannot be (not a leaf, held, no floor or marker yet).
asio::awaitable<void> OutboxRetention::retire_partition(PgConnection& conn, const TableName& table,
                                                         const Row& row,
                                                         TablePartitions& parts) {
  const std::string name = row[1].value_or("?"), comment = " " + row[6].value_or("");
  if (row[5] != "true") co_return;  // not ended long enough ago (or DEFAULT, or MAXVALUE)
  if (row[2] != "r") {
    warn_once(name, "retention: partition " + name + " of " + table.qualified() +
                        " is not a plain table (partitioned itself, or foreign): drop-partitions detaches "
                        "leaf partitions only; it stays");
    co_return;
  }
  // Held once (rows from before its floor): for good, since an xmin does
  // not last (2^32 transactions later an old one reads as new).
  if (comment.rfind(" " + std::string(held_word) + " ", 0) == 0) {
    warn_once(name, "retention: partition " + name + " of " + table.qualified() +
                        " is held (it had rows from before walrelay relayed it); once they are known to be in "
                        "the broker, drop it by hand (or delete them and remove its comment)");
    co_return;
  }
  const auto floor = floors_.floors.find(static_cast<std::uint32_t>(std::stoul(row[0].value_or("0"))));
  if (floor == floors_.floors.end()) co_return;  // not published, or no floor yet
  // The drop needs to know the slot is the one that carried the rows.
  if (floors_.slot_identity.empty()) {
    warn_once(table.qualified(), "retention: drop-partitions needs the slot's marker in publication " +
                                     config_.publication_name + "'s comment (walrelay's role must own the "
                                     "publication to write it): no partition of " + table.qualified() +
                                     " is frozen until it is there");
    co_return;
  }
  // One pending detach at a time per table (PostgreSQL's rule): a frozen
  // partition waits for it.
  if (co_await freeze(conn, parts.root, name, floor->second, parts.has_default) && !parts.has_default &&
      !parts.pending) {
    parts.pending = true;  // a CONCURRENTLY that fails stays pending
    co_await detach(conn, parts.root, name, parts.has_default);
    parts.pending = false;
  }
}

// Errors a partition can meet for a while, that leave the connection usable:
// a lock not to be had, a statement cancelled by its time-out, a deadlock, a
// detach already pending, a name taken in the archive schema, a dependent
// view. The others (the connection lost) end the run.
bool OutboxRetention::retry_later(const PgError& e) {
  const auto& state = e.sqlstate();
  return state.size() == 5 && state.rfind("08", 0) != 0 && state.rfind("57P", 0) != 0 && state != "53300";
}

asio::awaitable<void> OutboxRetention::restore_lock_timeout(PgConnection& conn) {
  try {
    const std::string sql(session_lock_timeout);
    co_await conn.query(sql);
  } catch (const PgError&) {
  }
}

// The freezing transaction (above); with a DEFAULT partition, the detach
// too. False when the partition stays for now: holding rows from before its
// floor (then marked held in its comment, for good).
asio::awaitable<bool> OutboxRetention::freeze(PgConnection& conn, const std::string& root, const std::string& name,
                                              std::uint64_t floor, bool has_default) {
  const std::vector<std::string> no_params;
  const std::string begin = "BEGIN", commit = "COMMIT", rollback = "ROLLBACK";
  // Below PostgreSQL's default deadlock_timeout: should the locks taken here
  // (the partition's, then the table's for a detach) meet a session that
  // takes them the other way round, this one gives up first.
  const std::string short_wait = "SET LOCAL lock_timeout = '500ms'";
  const std::string long_scan = "SET LOCAL statement_timeout = '30min'";
  std::exception_ptr failure;
  bool frozen = false;
  co_await conn.query(begin);
  try {
    co_await conn.query(short_wait);
    // The scan below reads the whole partition: a day's rows can take longer
    // than the session's minute. Only late rows for its range wait on it.
    co_await conn.query(long_scan);
    co_await conn.query("LOCK TABLE " + name + " IN SHARE ROW EXCLUSIVE MODE", no_params, 10s);
    // Frozen, or marked, by another walrelay since the partitions were listed.
    auto now = co_await conn.query("SELECT coalesce(pg_catalog.obj_description(" + conn.quote_literal(name) +
                                       "::regclass, 'pg_class'), '') AS comment, " +
                                       frozen_sql(conn, conn.quote_literal(name) + "::regclass") + "::text AS frozen",
                                   no_params, 10s);
    const std::string comment = now.at(0, "comment").value_or("");
    const bool taken = now.at(0, "frozen") == "true" || comment.rfind(std::string(detached_word) + " ", 0) == 0 ||
                       comment.rfind(std::string(held_word) + " ", 0) == 0;
    PgRows before;
    if (!taken)
      before = co_await conn.query("SELECT count(*)::text AS n FROM " + name + " WHERE " +
                                       not_carried_sql(std::to_string(floor), floors_.slot_view),
                                   no_params, 31min);
    if (taken) {
      // Left for the next run to see as it is.
    } else if (before.at(0, "n") != "0") {
      warn_once(name, "retention: partition " + name + " of " + root + " holds " + before.at(0, "n").value_or("?") +
                          " rows written before walrelay relayed it (perhaps never sent): it stays, held (its "
                          "comment says so); see that they are in the broker (walrelay replay sends them again), "
                          "then drop it by hand");
      co_await conn.query("COMMENT ON TABLE " + name + " IS " +
                              conn.quote_literal(std::string(held_word) + " slot=" + config_.slot_name +
                                                 " rows=" + before.at(0, "n").value_or("?") +
                                                 " floor=" + std::to_string(floor)),
                          no_params, 10s);
    } else {
      co_await conn.query("ALTER TABLE " + name + " ADD CONSTRAINT " + std::string(frozen_constraint) +
                              " CHECK (false) NOT VALID",
                          no_params, 10s);
      if (has_default) co_await conn.query("ALTER TABLE " + root + " DETACH PARTITION " + name, no_params, 10s);
      auto lsn = co_await conn.query("SELECT pg_catalog.pg_current_wal_insert_lsn()::text AS lsn", no_params, 10s);
      const std::string comment = std::string(detached_word) + " slot=" + config_.slot_name + " id=" +
                                  floors_.slot_identity + " lsn=" + lsn.at(0, "lsn").value_or("") +
                                  " floor=" + std::to_string(floor);
      co_await conn.query("COMMENT ON TABLE " + name + " IS " + conn.quote_literal(comment), no_params, 10s);
      frozen = true;
    }
    co_await conn.query(commit);
  } catch (const PgError&) {
    failure = std::current_exception();
  }
  if (!failure) {
    if (frozen)
      spdlog::info("retention: {} frozen{}; it goes once the slot has passed the position recorded in its comment",
                   name, has_default ? " and detached from " + root : "");
    co_return frozen;
  }
  try {
    co_await conn.query(rollback);
  } catch (const PgError&) {
  }
  std::rethrow_exception(failure);
}

// A frozen partition detached: CONCURRENTLY (the transactions that read the
// table finish first; a minute at most, then the next run FINALIZEs it), or
// in one step when a DEFAULT partition forbids that (half a second at most
// for its lock).
asio::awaitable<void> OutboxRetention::detach(PgConnection& conn, const std::string& root, const std::string& name,
                                              bool has_default) {
  const std::vector<std::string> no_params;
  const std::string detach = "ALTER TABLE " + root + " DETACH PARTITION " + name;
  if (has_default) {
    const std::string shorter = "SET lock_timeout = '500ms'";
    co_await conn.query(shorter);
    co_await conn.query(detach, no_params, 10s);
  } else {
    const std::string longer = "SET lock_timeout = '60s'";
    co_await conn.query(longer);
    co_await conn.query(detach + " CONCURRENTLY", no_params, 70s);
  }
  co_await restore_lock_timeout(conn);  // (after a failure, the caller does)
  spdlog::info("retention: {} detached from {}", name, root);
}

// FINALIZE waits for the snapshots that may still see the partition: as long
// as CONCURRENTLY would.
asio::awaitable<void> OutboxRetention::finish_detach(PgConnection& conn, const std::string& root,
                                                     const std::string& name) {
  const std::vector<std::string> no_params;
  const std::string longer = "SET lock_timeout = '60s'";
  co_await conn.query(longer);
  co_await conn.query("ALTER TABLE " + root + " DETACH PARTITION " + name + " FINALIZE", no_params, 70s);
  co_await restore_lock_timeout(conn);
  spdlog::info("retention: {} detached from {} (FINALIZE)", name, root);
}

// The frozen, detached partitions of this slot whose position the relay has
// passed: dropped, or moved to the archive schema. Returns how many wait.
asio::awaitable<int> OutboxRetention::drop_detached(PgConnection& conn, const Fence& fence) {
  const std::vector<std::string> no_params;
  auto tables = co_await conn.query(
      "SELECT format('%I.%I', n.nspname, c.relname), d.description, " + frozen_sql(conn, "c.oid") +
          "::text FROM pg_catalog.pg_description d JOIN pg_catalog.pg_class c ON c.oid = d.objoid JOIN "
          "pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE d.classoid = 'pg_catalog.pg_class'::regclass "
          "AND d.objsubid = 0 AND c.relkind = 'r' AND NOT c.relispartition AND d.description LIKE " +
          conn.quote_literal(std::string(detached_word) + " slot=%"),
      no_params, 30s);
  int waiting = 0;
  for (const auto& row : tables.rows) {
    if (!may_delete(fence)) co_return waiting;
    const std::string name = row[0].value_or("?"), comment = " " + row[1].value_or("");
    if (comment_value(comment, "slot") != config_.slot_name) continue;
    const auto lsn = Lsn::parse(comment_value(comment, "lsn"));
    if (!lsn) continue;
    // Its constraint dropped by hand: rows may have come in since.
    if (row[2] != "true") {
      warn_once(name, "retention: " + name + " has lost its constraint " + std::string(frozen_constraint) +
                          ": rows written since may not be in the broker, and it stays; drop it by hand");
      continue;
    }
    // Frozen under another slot (made again since): this one vouches for
    // nothing the other carried.
    if (floors_.slot_identity.empty() || comment_value(comment, "id") != floors_.slot_identity) {
      warn_once(name, "retention: " + name + " was frozen under an earlier slot " + config_.slot_name +
                          " (made again since): it stays; drop it by hand once its rows are in the broker");
      continue;
    }
    const auto acknowledged = acknowledged_();
    if (!acknowledged || *acknowledged < *lsn) {
      ++waiting;
      continue;
    }
    if (!may_delete(fence)) co_return waiting;
    std::exception_ptr failure;
    try {
      co_await remove_detached(conn, name, *lsn);
    } catch (const PgError& e) {
      if (!retry_later(e)) throw;
      failure = std::current_exception();
    }
    if (failure) {
      partition_failed_ = true;
      if (!config_.retention_archive_schema.empty()) {
        try {
          const std::string rollback = "ROLLBACK";  // the archive's transaction
          co_await conn.query(rollback);
        } catch (const PgError&) {
        }
      }
      try {
        std::rethrow_exception(failure);
      } catch (const PgError& e) {
        spdlog::warn("retention: {} could not be {}: {}; the next run tries again", name,
                     config_.retention_archive_schema.empty() ? "dropped" : "archived",
                     e.primary().empty() ? e.what() : e.primary());
      }
      continue;
    }
    metrics_.retention_partitions_removed.Increment();
    ++status_.partitions_removed;
  }
  co_return waiting;
}

// A detached partition the slot has passed: dropped, or moved to the
// archive schema in one transaction with its new comment (an archived table
// keeps no comment a later run would drop it by).
asio::awaitable<void> OutboxRetention::remove_detached(PgConnection& conn, const std::string& name, const Lsn& lsn) {
  const std::vector<std::string> no_params;
  if (config_.retention_archive_schema.empty()) {
    co_await conn.query("DROP TABLE " + name, no_params, 70s);
    spdlog::info("retention: {} dropped (the slot passed {})", name, lsn.to_string());
    co_return;
  }
  const std::string begin = "BEGIN", commit = "COMMIT";
  co_await conn.query(begin);
  co_await conn.query("COMMENT ON TABLE " + name + " IS " +
                          conn.quote_literal("walrelay.retention.archived slot=" + config_.slot_name +
                                             " lsn=" + lsn.to_string()),
                      no_params, 10s);
  co_await conn.query("ALTER TABLE " + name + " SET SCHEMA " + conn.quote_identifier(config_.retention_archive_schema),
                      no_params, 70s);
  co_await conn.query(commit);
  spdlog::info("retention: {} moved to schema {} (the slot passed {})", name, config_.retention_archive_schema,
               lsn.to_string());
}

// One run of drop-partitions: the partitions detached earlier whose
// position the relay has passed go, then those expired since are detached.
asio::awaitable<void> OutboxRetention::drop_partitions(PgConnection& conn, const Fence& fence) {
  partition_failed_ = false;
  const int waiting = co_await drop_detached(conn, fence);
  for (const auto& table : config_.table_include_list) {
    if (!may_delete(fence)) co_return;
    co_await detach_expired(conn, table, fence);
  }
  for (const auto& table : config_.table_include_list) co_await measure_table(conn, table);
  if (waiting == 0) last_passed_ = std::chrono::steady_clock::now();
  // A partition that failed makes it an error run (logged above), even when
  // the others went.
  run_ended(partition_failed_ ? "error" : waiting == 0 ? "ok" : "behind",
            partition_failed_ ? "a partition could not be removed (the log says which and why)" : "");
  if (waiting > 0) warn_if_lagging();
}

void OutboxRetention::warn_once(const std::string& what, const std::string& message) {
  if (!warned_.insert(what).second) return;
  spdlog::warn("{}", message);
}

}  // namespace walrelay
