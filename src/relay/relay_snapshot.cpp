// The initial snapshot (snapshot.mode=initial or initial_only): the rows the
// outbox tables hold when walrelay creates the slot, sent before the stream.
//
// The slot is created inside a REPEATABLE READ transaction with USE_SNAPSHOT.
// That transaction sees exactly the rows committed before the slot's
// consistent point, and the slot streams exactly the transactions that commit
// after it: a row is in one or the other, never both and never neither,
// however busy the writers are meanwhile. This is the only place walrelay
// reads an outbox table, and only when asked.
//
// Rows are read with COPY (SELECT ...) TO STDOUT, as PostgreSQL's own table
// synchronisation reads them on its walsender connection, and take the
// stream's path: each becomes a pgoutput Insert (MessageWriter) that is
// decoded, mapped and handed to the sink under the same in-flight limits, so
// memory is bounded as in streaming. Nothing is confirmed meanwhile: the slot
// stays at its consistent point until every row is acknowledged.
//
// An interrupted snapshot (a crash, a stop, a delivery that failed) is taken
// again from the start, as Debezium's is. Resuming after the last
// acknowledged key would need the same snapshot, and an exported snapshot
// ends with its transaction; rows are read in key order, not commit order.
// The slot is kept: it holds what was committed since its consistent point,
// also the events that leave no row (a row deleted in its own transaction or
// by a cleaner, a logical message), which no new snapshot could read. The
// first snapshot's view (pg_current_snapshot()) is in the pending marker, and
// the snapshot taken again reads only the rows whose insert that view saw;
// the kept slot streams the rest. Rows sent before are sent again (at least
// once, by id).
//
// Exactly once: the whole snapshot is one Kafka transaction, committed with
// the consistent point as its position once every row is acknowledged. An
// interrupted snapshot's transaction never commits (the next start's
// init_transactions aborts it), so taking it again from the start sends
// nothing twice to a read_committed consumer. A start that finds the
// snapshot committed but not yet recorded in the publication (a crash in
// between) records it and streams. One transaction must end within the
// coordinator's time-out: walrelay halts, naming the key, before the
// coordinator would abort it, rather than take it again and again.
#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <cctype>

#include <pgoutput/encode.hpp>

#include "walrelay/source/catalog.hpp"
#include "walrelay/mutation.hpp"
#include "walrelay/relay/relay.hpp"
#include "walrelay/source/sqlstate.hpp"
#include "walrelay/source/table_rows.hpp"

namespace walrelay {
namespace asio = boost::asio;
using namespace std::chrono_literals;
using pgoutput::Lsn;

namespace {

// The server begins the COPY before it runs the query (a sort, when no
// index gives the order, comes after): this bounds only the planning and
// any lock the query waits for.
constexpr auto fetch_timeout = std::chrono::hours(24);

bool starts_with_word(const std::string& text, std::string_view word) {
  if (text.size() < word.size()) return false;
  for (std::size_t i = 0; i < word.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(text[i])) != word[i]) return false;
  return text.size() == word.size() || !std::isalnum(static_cast<unsigned char>(text[word.size()]));
}

// For the rest of the snapshot's transaction only (SET LOCAL), whatever the
// role or the database sets (a walsender takes their settings too): each
// table is one COPY, which lasts as long as the broker takes its rows
// (nothing is read while the in-flight limits are reached), and the
// transaction then waits idle for the last acknowledgements. Cut by a
// time-out, the snapshot would be taken again, as long, and cut again: its
// rows sent again and again. Outside it (the catalog reads, the locks
// before it) the role's time-outs stay.
asio::awaitable<void> allow_long_snapshot(PgConnection& conn) {
  co_await conn.query("SET LOCAL statement_timeout = 0");
  co_await conn.query("SET LOCAL idle_in_transaction_session_timeout = 0");
}

// A failed snapshot query's error: the query's own (see query_own_error)
// halts naming what decides the query, with the SQLSTATE only, since the
// server's message of an error raised while rows are read may quote a
// value; any other is the session's, and the snapshot is taken again.
[[noreturn]] void throw_snapshot_query_error(const PgError& e, const std::string& key, const std::string& table,
                                             std::uint64_t rows_read) {
  if (!query_own_error(e.sqlstate())) throw e;
  const bool overridden = key.starts_with("snapshot.select.statement.overrides.");
  throw Fatal((overridden ? key : std::string("snapshot.mode")) + ": the initial snapshot's query of " + table +
              " failed after " + std::to_string(rows_read) + " of its rows: SQLSTATE " + e.sqlstate() +
              sqlstate_name(e.sqlstate()) +
              " (the server's message is not shown, as it may quote the rows' values: run the query in psql to "
              "read it: " + (overridden ? "the override's" : "the table's") + " SELECT is in the log above)");
}

}  // namespace

struct Relay::SnapshotTable {
  TableRows rows;
  std::string select;
  std::string key;  // the configuration key that decides the SELECT, for errors
  std::uint64_t estimated = 0;
};

// Creates (or takes again) the slot inside a REPEATABLE READ transaction that
// uses its snapshot, sends the outbox rows it sees, and waits until each is
// acknowledged: the steps below, in order. nullopt: stopped or halted first.
asio::awaitable<std::optional<Lsn>> Relay::initial_snapshot(PgConnection& conn, const ServerFacts& facts,
                                                            const SourceIdentity& source) {
  const std::string lock_key = co_await lock_snapshot(conn, facts);
  if (transactional_) {
    if (auto point = co_await snapshot_in_kafka(conn, facts, source, lock_key)) co_return point;
  }
  // An interrupted snapshot's slot is kept: it holds every event committed
  // since its consistent point, rows and the events that leave none (a row
  // deleted in its own transaction or by a cleaner, a logical message). The
  // snapshot is taken again in an ordinary REPEATABLE READ transaction,
  // reading only the rows whose insert the first snapshot saw (its view is
  // in the marker); the slot streams the rest from the same point. So every
  // event arrives once from one or the other, as if the first had finished.
  const bool retake = facts.marker && facts.marker->snapshot_pending && facts.slot.exists &&
                      facts.slot.confirmed_flush_lsn &&
                      !mutation::active(mutation::Break::snapshot_retake_new_slot);
  std::string first_view;  // the first snapshot's pg_snapshot, when retaking
  Lsn point;
  if (facts.marker && facts.marker->snapshot_pending) metrics_.snapshot_restarts.Increment();
  if (retake) {
    point = *facts.slot.confirmed_flush_lsn;
    // The first snapshot's view and floors, when the slot is the one it
    // made (one made again by hand under its name streams from later: the
    // rows in between were neither in the view nor streamed). The rows are
    // read through this start's overrides.
    snapshot_origin_ = {};
    if (facts.marker->created_lsn && *facts.marker->created_lsn == point)
      snapshot_origin_ = {facts.marker->slot_view, false, !config_.snapshot_select_overrides.empty(),
                          facts.marker->retention_floors, facts.marker->retention_lineage};
    first_view = co_await begin_snapshot_retake(conn, facts, point);
  } else {
    point = co_await begin_snapshot_with_slot(conn, facts);
  }
  const std::string visible = co_await first_view_filter(conn, first_view);
  std::vector<SnapshotTable> tables;
  co_await plan_snapshot(conn, visible, tables);
  start_snapshot_progress(point, tables);

  // The stream's decoder is made anew by START_REPLICATION; this one only
  // ever sees the snapshot's own messages.
  decoder_ = pgoutput::Decoder(1);
  commit_time_ = pgoutput::pg_epoch_micros_now();  // a snapshot row's event time, as Debezium's
  struct Running {
    Metrics& metrics;
    ~Running() { metrics.snapshot_running.Set(0); }
  } running{metrics_};
  co_await send_snapshot(conn, tables, point);
  co_return co_await finish_snapshot(conn, facts, point, lock_key);
}

// Two walrelays starting on one slot: the second waits as a standby, as it
// would for a slot in use. The lock is the session's, so a crash frees it.
// Returns the lock's key, for the unlock.
asio::awaitable<std::string> Relay::lock_snapshot(PgConnection& conn, const ServerFacts& facts) {
  const std::string lock_key =
      "pg_catalog.hashtext(" + conn.quote_literal("walrelay.snapshot." + config_.slot_name) + ")";
  auto lock = co_await conn.query("SELECT pg_catalog.pg_try_advisory_lock(" + lock_key + ")");
  if (lock.rows.empty() || lock.rows[0][0] != "t")
    throw PgError("another walrelay is taking the initial snapshot for slot " + config_.slot_name +
                      "; waiting to take over if it stops",
                  "55006");

  // What prepare() saw may have changed while another walrelay held the
  // lock (it may have finished the snapshot): look again, and start the
  // session over if so.
  std::vector<std::string> problems, warnings;
  const ServerFacts now = co_await inspect_server(conn, config_, facts.system, problems, warnings);
  const auto pending = [](const ServerFacts& f) { return f.marker && f.marker->snapshot_pending; };
  if (now.slot.exists != facts.slot.exists || pending(now) != pending(facts) ||
      now.marker.has_value() != facts.marker.has_value()) {
    co_await conn.query("SELECT pg_catalog.pg_advisory_unlock(" + lock_key + ")");
    throw PgError("slot " + config_.slot_name + " or its marker changed while waiting for the snapshot's lock "
                  "(another walrelay took or finished the snapshot); looking again",
                  "");
  }
  co_return lock_key;
}

// Exactly once: takes the transactional.id over now (a zombie's open
// transaction, an interrupted snapshot's, is aborted); the committed position
// says whether an earlier snapshot got into Kafka. Its point when it did.
asio::awaitable<std::optional<Lsn>> Relay::snapshot_in_kafka(PgConnection& conn, const ServerFacts& facts,
                                                             const SourceIdentity& source,
                                                             const std::string& lock_key) {
  const std::optional<CommittedPosition> committed = co_await transactional_->recover(source);
  if (!(facts.marker && facts.marker->snapshot_pending && facts.slot.exists && committed &&
        committed->system == source.system && facts.slot.confirmed_flush_lsn &&
        committed->end_lsn == *facts.slot.confirmed_flush_lsn))
    co_return std::nullopt;
  const Lsn point = committed->end_lsn;
  spdlog::info("slot={} exactly once: the initial snapshot begun on {} is in Kafka (committed at its consistent "
               "point {}); only its record in the publication was missing: streaming from there",
               config_.slot_name, facts.marker->created_at, point.to_string());
  SlotOrigin origin;  // (named: g++ 12 frees a temporary argument of a coroutine twice)
  if (facts.marker->created_lsn && *facts.marker->created_lsn == point)
    origin = snapshot_sent({facts.marker->slot_view, false, facts.marker->snapshot_filtered,
                            facts.marker->retention_floors, facts.marker->retention_lineage});
  co_await record_slot(conn, facts, point, origin);
  co_await conn.query("SELECT pg_catalog.pg_advisory_unlock(" + lock_key + ")");
  co_return point;
}

// An interrupted snapshot taken again on its kept slot, from `point`: the
// tables locked, the transaction begun, and the first snapshot's view
// returned when it can still choose the rows ("" when every row is sent).
asio::awaitable<std::string> Relay::begin_snapshot_retake(PgConnection& conn, const ServerFacts& facts, Lsn point) {
  std::string first_view = facts.marker->snapshot_xids;
  if (facts.marker->created_lsn && *facts.marker->created_lsn != point)
    spdlog::warn("slot={} the slot's confirmed position {} is not the snapshot's consistent point {} recorded in "
                 "the marker: streaming from the slot's",
                 config_.slot_name, point.to_string(), facts.marker->created_lsn->to_string());
  // The tables' locks first (a rewrite now would give rows new xmins
  // under this snapshot), then the snapshot, taken by the first query.
  co_await allow_long_transaction(conn);
  co_await conn.query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  std::string tables_sql;
  for (const auto& t : config_.table_include_list)
    tables_sql += (tables_sql.empty() ? "" : ", ") + conn.quote_identifier(t.schema) + "." +
                  conn.quote_identifier(t.name);
  if (!tables_sql.empty()) co_await conn.query("LOCK TABLE " + tables_sql + " IN ACCESS SHARE MODE");
  co_await allow_long_snapshot(conn);
  const std::string unusable = co_await first_view_unusable(conn, facts);
  if (unusable.empty()) {
    spdlog::warn("slot={} the initial snapshot begun on {} did not finish: taking it again from the start with the "
                 "rows it would have sent (those still in the outbox), then streaming from its slot, kept at {}, "
                 "everything committed since; rows sent before are sent again (the same ids, for consumers that "
                 "deduplicate)",
                 config_.slot_name, facts.marker->created_at, point.to_string());
    co_return first_view;
  }
  if (transactional_)
    throw Fatal("slot.name: the initial snapshot begun on " + facts.marker->created_at + " did not finish and " +
                unusable + ". Taken again with every row the outbox holds, under exactly.once.support=required "
                "the rows committed since its consistent point " + point.to_string() +
                " would reach read_committed consumers twice (from the snapshot and from the slot). Choose: "
                "start once without exactly.once.support=required (at least once: those rows twice, the same "
                "ids), or drop slot " + config_.slot_name + " (SELECT pg_drop_replication_slot('" +
                config_.slot_name + "')) to take the snapshot with a new slot, skipping the events since that "
                "point that left no row in the outbox");
  spdlog::warn("slot={} the initial snapshot begun on {} did not finish and {}: taking it again from the start "
               "with every row the outbox holds now, then streaming from its slot at {}; rows committed since "
               "then are sent twice (the same ids), the second copy possibly after a later event of its key",
               config_.slot_name, facts.marker->created_at, unusable, point.to_string());
  co_return std::string();
}

// Why the first snapshot's view cannot choose the rows of a snapshot taken
// again ("" when it can): it was not recorded, or the tables were rewritten.
asio::awaitable<std::string> Relay::first_view_unusable(PgConnection& conn, const ServerFacts& facts) {
  std::string unusable;
  if (facts.marker->snapshot_xids.empty()) {
    unusable = "did not record its view of the tables";
  } else {
    auto files = co_await conn.query(table_files_sql(conn, config_));
    const std::string now = files.rows.empty() ? "" : files.rows[0][0].value_or("");
    if (facts.marker->snapshot_files.empty() || now != facts.marker->snapshot_files)
      unusable = "its view cannot judge the rows any more: the outbox tables were rewritten since (ALTER TABLE "
                 "... TYPE, pg_repack, VACUUM FULL, CLUSTER give rows new files and new xmins)";
  }
  if (unusable.empty() && mutation::active(mutation::Break::snapshot_retake_unfiltered))
    unusable = "(mutation snapshot_retake_unfiltered)";
  co_return unusable;
}

// A snapshot with a new slot (an interrupted one's dropped first): marked
// pending, the slot created inside the transaction, and the snapshot's view
// recorded before a row is sent. Returns the slot's consistent point.
asio::awaitable<Lsn> Relay::begin_snapshot_with_slot(PgConnection& conn, const ServerFacts& facts) {
  if (facts.marker && facts.marker->snapshot_pending) {
    spdlog::warn("slot={} the initial snapshot begun on {} did not finish: taking it again from the start; the "
                 "rows it sent are sent again (the same ids, for consumers that deduplicate){}",
                 config_.slot_name, facts.marker->created_at,
                 facts.slot.exists ? "; its slot is dropped and made again" : "");
    if (facts.slot.exists) co_await conn.query("DROP_REPLICATION_SLOT " + conn.quote_identifier(config_.slot_name));
  }
  try {
    co_await mark_snapshot_pending(conn, config_, facts);
  } catch (const PgError& e) {
    if (e.sqlstate() == "42501") throw Fatal(e.what());
    throw;
  }
  const std::string before = co_await snapshot_now(conn);
  co_await allow_long_transaction(conn);
  co_await conn.query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  const Lsn point = co_await create_slot(conn, config_, true);
  co_await allow_long_snapshot(conn);
  retention_.slot_created();
  if (mutation::active(mutation::Break::snapshot_stream_overlap))
    co_await conn.query("COMMIT; SELECT pg_sleep(1); BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  // The snapshot's view, recorded before a row is sent (on a connection of
  // its own: this one is inside the snapshot's read-only transaction), so
  // that a snapshot taken again after an interruption knows which rows
  // this one would have sent.
  auto view = co_await conn.query("SELECT pg_catalog.pg_current_snapshot()::text");
  const std::string xids = view.rows.empty() ? "" : view.rows[0][0].value_or("");
  if (!is_pg_snapshot_text(xids)) throw PgError("could not read the snapshot's view: '" + xids + "'", "");
  auto files = co_await conn.query(table_files_sql(conn, config_));
  const std::string table_files = files.rows.empty() ? "" : files.rows[0][0].value_or("");
  // Nothing is sent yet, and the view lives only in this transaction: a
  // failure to record it (a full server, a lock) is tried again for a
  // while. Given up, the slot is kept (it holds what was committed since
  // its point) and a later start takes the snapshot without the view.
  for (int attempt = 1;; ++attempt) {
    try {
      PgConnection side(io_);
      co_await side.connect(config_.conninfo(false), std::chrono::milliseconds(config_.database_connect_timeout_ms));
      // The floors from the catalog as it is now: a table attached since the
      // view was taken is new to `before` too, and gets none.
      snapshot_origin_ = co_await slot_origin(side, config_, xids, before);
      snapshot_origin_.filtered = !config_.snapshot_select_overrides.empty();
      co_await record_snapshot_view(side, config_, facts, point, table_files, snapshot_origin_);
      side.close();
      break;
    } catch (const PgError& e) {
      if (attempt >= 10 || stop_requested_) throw;
      spdlog::warn("slot={} could not record the initial snapshot's view (try {} of 10): {}", config_.slot_name,
                   attempt, e.what());
    }
    co_await sleep(std::chrono::milliseconds(500 * attempt));
  }
  co_return point;
}

// The rows the first snapshot's view saw inserted, as an SQL condition ("":
// every row): xmin made a full xid (within 2^31 of this transaction's xmax,
// as every unfrozen row's is) and looked up in that view. Freezing keeps a
// row's xmin (9.4 and later), so a frozen row older than 2^32 transactions
// can be judged wrongly; rows that old in an outbox are not expected
// (docs/operations.md says so).
asio::awaitable<std::string> Relay::first_view_filter(PgConnection& conn, const std::string& first_view) {
  if (first_view.empty() || mutation::active(mutation::Break::snapshot_retake_unfiltered)) co_return std::string();
  auto xmax = co_await conn.query("SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text");
  const std::string now = xmax.rows.empty() ? "" : xmax.rows[0][0].value_or("");
  if (now.empty() || now.find_first_not_of("0123456789") != std::string::npos)
    throw PgError("could not read this snapshot's xmax", "");
  co_return "(xmin::text::bigint < 3 OR pg_catalog.pg_visible_in_snapshot((" + now + " - ((" + now +
      " % 4294967296 - xmin::text::bigint + 4294967296) % 4294967296))::text::xid8, " +
      conn.quote_literal(first_view) + "::pg_snapshot))";
}

// Each table's snapshot query (SELECT and configuration key), checked to be
// one statement and to run, with its estimated rows.
asio::awaitable<void> Relay::plan_snapshot(PgConnection& conn, const std::string& visible_at_point,
                                           std::vector<SnapshotTable>& tables) {
  for (const auto& name : config_.table_include_list) {
    SnapshotTable& t = tables.emplace_back();
    t.rows = co_await describe_table(conn, name);
    const bool overridden = config_.snapshot_select_overrides.count(name.qualified()) > 0;
    snapshot_select(conn, name, visible_at_point, t);
    // The walsender takes simple queries only, which run every statement of
    // a text: an override's SELECT is first parsed on an ordinary connection
    // with the extended protocol, which refuses more than one.
    if (overridden && !mutation::active(mutation::Break::operator_sql_simple_protocol)) {
      try {
        co_await check_one_statement(conn.io(), config_, t.select);
      } catch (const PgError& e) {
        throw Fatal(t.key + ": the initial snapshot's query of " + name.qualified() +
                    " must be one statement (the override is a condition or a SELECT): " + e.what());
      }
    }
    try {
      t.estimated = co_await estimate_rows(conn, t.select);
    } catch (const PgError& e) {
      if (e.sqlstate() == "42501")
        throw Fatal("snapshot.mode: walrelay's role may not read " + name.qualified() + " for the initial snapshot (" +
                    e.what() + "): GRANT SELECT ON " + t.rows.quoted_table + " TO it, or set snapshot.mode=no_data");
      throw Fatal(t.key + ": the initial snapshot's query of " + name.qualified() + " fails: " + e.what() + " (" +
                  t.select + ")");
    }
  }
}

// A table's snapshot SELECT (t.select) and the key that decides it (t.key):
// its rows in the snapshot's order, as an override chooses them, only those
// `visible_at_point` when it is set.
void Relay::snapshot_select(PgConnection& conn, const TableName& name, const std::string& visible_at_point,
                            SnapshotTable& t) const {
  const std::string& list = t.rows.select_list;
  const std::string order_column =
      config_.snapshot_order_column.empty() ? config_.field_event_id : config_.snapshot_order_column;
  const std::string order = " ORDER BY " + conn.quote_identifier(order_column);
  const std::string& table_sql = t.rows.quoted_table;
  auto override_it = config_.snapshot_select_overrides.find(name.qualified());
  const std::string& id_column = conn.quote_identifier(config_.field_event_id);
  if (override_it == config_.snapshot_select_overrides.end()) {
    t.select = "SELECT " + list + " FROM " + table_sql +
               (visible_at_point.empty() ? std::string() : " WHERE " + visible_at_point) + order;
    t.key = config_.snapshot_order_column.empty() ? "table.field.event.id (the snapshot's order; see "
                                                    "snapshot.order.column)"
                                                  : "snapshot.order.column";
    return;
  }
  const std::string& statement = override_it->second;
  // A whole SELECT (Debezium's form) is read as a subquery, so that the
  // columns and the order are walrelay's; anything else is a condition.
  if (starts_with_word(statement, "select") || starts_with_word(statement, "with"))
    t.select = "SELECT " + list + " FROM (" + statement + ") AS walrelay_snapshot_rows" +
               (visible_at_point.empty() ? std::string()
                                         : " WHERE " + id_column + " IN (SELECT " + id_column + " FROM " +
                                               table_sql + " WHERE " + visible_at_point + ")") +
               order;
  else
    t.select = "SELECT " + list + " FROM " + table_sql + " WHERE (" +
               (starts_with_word(statement, "where") ? statement.substr(5) : statement) + ")" +
               (visible_at_point.empty() ? std::string() : " AND " + visible_at_point) + order;
  t.key = "snapshot.select.statement.overrides." + name.qualified();
}

// The snapshot's progress begun: its estimate, its deadline under exactly
// once, the metrics and the state that /status shows.
void Relay::start_snapshot_progress(Lsn point, const std::vector<SnapshotTable>& tables) {
  std::uint64_t estimated = 0;
  for (const auto& t : tables) estimated += t.estimated;
  snapshot_.emplace();
  snapshot_->started = snapshot_->logged = std::chrono::steady_clock::now();
  if (transactional_) {
    // A margin for the commit itself, and for the first record's
    // transaction beginning a little after this.
    const auto timeout = transactional_->transaction_timeout();
    snapshot_->end_by = snapshot_->started + timeout - std::min<std::chrono::milliseconds>(timeout / 5, 10s);
  }
  snapshot_->rows_estimated = estimated;
  metrics_.snapshot_rows_estimated.Set(static_cast<double>(estimated));
  metrics_.snapshot_running.Set(1);
  set_state(RelayState::snapshot, "sending the rows the outbox held at " + point.to_string());
  spdlog::info("slot={} initial snapshot at consistent point {}: about {} rows in {} table(s); the stream follows "
               "from there",
               config_.slot_name, point.to_string(), estimated, tables.size());
}

// Every table's rows sent, then every row acknowledged before the slot may
// be streamed from (a failed record means the snapshot is taken again);
// exactly once, the snapshot's Kafka transaction committed at `point`.
asio::awaitable<void> Relay::send_snapshot(PgConnection& conn, const std::vector<SnapshotTable>& tables, Lsn point) {
  // The rows have no position in the stream: a snapshot taken again reads
  // them in key order, where a row deleted meanwhile shifts the others, so
  // a place among them names no one row (at least once, by intent).
  position_lsn_ = 0;
  for (const auto& t : tables) {
    co_await snapshot_table(conn, t, point);
    if (stop_requested_ || halt_reason_ || replay_reason_) break;
  }
  while (!stop_requested_ && !halt_reason_ && !replay_reason_ && ledger_.inflight_records() > 0) {
    check_snapshot_deadline();
    sink_.poll();
    check_producer();
    co_await sleep(20ms);
  }
  if (transactional_ && !stop_requested_ && !halt_reason_ && !replay_reason_) {
    commit_snapshot_transaction(point);
    while (!stop_requested_ && !halt_reason_ && !replay_reason_ && !(committed_lsn_ && *committed_lsn_ >= point)) {
      sink_.poll();
      check_producer();
      co_await sleep(20ms);
    }
    if (committed_lsn_ && *committed_lsn_ >= point)
      spdlog::info("slot={} exactly once: the initial snapshot committed in one Kafka transaction at {}",
                   config_.slot_name, point.to_string());
  }
}

// The snapshot's end: taken again after a failed record, left for the next
// start when stopped, or committed and recorded in the slot's marker.
asio::awaitable<std::optional<Lsn>> Relay::finish_snapshot(PgConnection& conn, const ServerFacts& facts, Lsn point,
                                                           const std::string& lock_key) {
  if (replay_reason_)
    throw PgError("the initial snapshot was interrupted (" + *replay_reason_ + "); it is taken again from the start",
                  "");
  if (stop_requested_ || halt_reason_) {
    spdlog::warn("slot={} the initial snapshot stopped after {} rows; the next start takes it again from the start",
                 config_.slot_name, snapshot_->rows_done);
    co_return std::nullopt;
  }
  co_await conn.query("COMMIT");
  snapshot_->done = true;
  snapshot_->finished = std::chrono::steady_clock::now();
  snapshot_origin_ = snapshot_sent(std::move(snapshot_origin_));
  co_await record_slot(conn, facts, point, snapshot_origin_);
  co_await conn.query("SELECT pg_catalog.pg_advisory_unlock(" + lock_key + ")");
  const double seconds = std::chrono::duration<double>(snapshot_->finished - snapshot_->started).count();
  spdlog::info("slot={} initial snapshot done: {} rows in {:.1f} s ({:.0f} rows/s), every one acknowledged",
               config_.slot_name, snapshot_->rows_done, seconds,
               seconds > 0 ? static_cast<double>(snapshot_->rows_done) / seconds : 0.0);
  co_return point;
}

asio::awaitable<void> Relay::snapshot_table(PgConnection& conn, const SnapshotTable& t, Lsn point) {
  const std::string table = t.rows.name.qualified();
  snapshot_->table = table;
  spdlog::info("slot={} initial snapshot of {}: about {} rows: {}", config_.slot_name, table, t.estimated, t.select);
  pgoutput::MessageWriter writer;
  t.rows.relation(writer);
  if (!co_await snapshot_row(writer.bytes(), point)) co_return;
  // COPY streams the rows while they are mapped and sent (a cursor's FETCH
  // would leave the server idle while walrelay maps one chunk, and walrelay
  // idle while the server reads the next). Nothing is read from the socket
  // while the in-flight limits are reached, so the server waits on it, and
  // walrelay holds what the socket holds at most.
  try {
    co_await conn.start_copy_out("COPY (" + t.select + ") TO STDOUT", fetch_timeout);
  } catch (const PgError& e) {
    // Planned and begun: an error now is the query's (a column or a
    // function that does not exist, a permission), or the connection's.
    if (!query_own_error(e.sqlstate())) throw;
    throw Fatal(t.key + ": the initial snapshot's query of " + table + " fails: " + e.what());
  }
  std::uint64_t table_rows = 0;
  const auto columns = t.rows.columns.size();
  std::string scratch;  // a value with escapes, unescaped
  std::uint64_t chunk_rows = 0;
  // A chunk of snapshot.fetch.size rows is one transaction in the ledger,
  // at the consistent point: nothing passes the point until the last row
  // is acknowledged.
  const auto end_chunk = [&] {
    ledger_.commit(*txn_, point);
    txn_.reset();
    chunk_rows = 0;
    if (transactional_ && mutation::active(mutation::Break::snapshot_commit_chunks)) commit_snapshot_transaction(point);
    check_snapshot_deadline();
    log_snapshot_progress(false);
  };
  for (;;) {
    char* data = nullptr;
    const int n = conn.try_get_copy_data(&data, "could not read the initial snapshot's rows");
    if (n == -1) break;
    if (n == 0) {
      // A stop that came while snapshot_row yielded cancelled no wait.
      if (stop_requested_ || halt_reason_ || replay_reason_) break;
      co_await conn.wait_readable();  // cancelled by a stop, a halt or a replay
      if (stop_requested_ || halt_reason_ || replay_reason_) break;
      conn.consume_input();
      continue;
    }
    const std::unique_ptr<char, decltype(&PQfreemem)> row(data, &PQfreemem);
    if (!txn_) txn_ = ledger_.open(commit_time_, point);
    const std::size_t fields =
        t.rows.insert_copy_text(writer, std::string_view(data, static_cast<std::size_t>(n)), scratch);
    if (fields != columns)
      throw Fatal(t.key + ": the snapshot's query of " + table + " returned " + std::to_string(fields) +
                  " columns, not " + std::to_string(columns));
    if (!co_await snapshot_row(writer.bytes(), point)) break;
    snapshot_->rows_done++;
    ++table_rows;
    metrics_.snapshot_rows.Increment();
    if (++chunk_rows == static_cast<std::uint64_t>(config_.snapshot_fetch_size)) {
      end_chunk();
      if (stop_requested_ || halt_reason_ || replay_reason_) break;
    }
  }
  if (txn_) end_chunk();
  // Stopped in the middle, the COPY is left running: the session's
  // connection is closed, and the next start takes the snapshot again.
  if (stop_requested_ || halt_reason_ || replay_reason_) co_return;
  try {
    co_await conn.end_copy_out(std::chrono::seconds(30));
  } catch (const PgError& e) {
    // A cast or a division that fails on some row would fail at every try.
    throw_snapshot_query_error(e, t.key, table, table_rows);
  }
  log_snapshot_progress(true);
}

asio::awaitable<bool> Relay::snapshot_row(std::span<const std::byte> message, Lsn point) {
  const pgoutput::XLogData xlog{point, point, 0, message};
  while (true) {
    if (stop_requested_ || halt_reason_ || replay_reason_) co_return false;
    // The in-flight limits hold the COPY as they hold the walsender.
    if (!has_room()) {
      note_backpressure(true);
      sink_.poll();
      check_producer();
      if (!has_room()) co_await sleep(200ms);  // woken early by a delivery that makes room
      continue;
    }
    note_backpressure(false);
    switch (handle_message(xlog)) {
      case Step::done: break;
      case Step::stop: co_return false;
      case Step::retry:  // the producer's queue is full, or a schema is being fetched
        sink_.poll();
        co_await sleep(10ms);
        continue;
    }
    break;
  }
  // Delivery reports are served between rows as the stream serves them
  // between batches.
  if (++snapshot_polls_ % read_batch == 0) {
    sink_.poll();
    co_await asio::post(io_, asio::use_awaitable);
  }
  co_return true;
}

void Relay::commit_snapshot_transaction(Lsn point) {
  // The consistent point as the position: one holding the position alone
  // when nothing is open (empty tables), else the open one ended there.
  if (transactional_->commit_position(point)) return;
  transactional_->source_transaction_ended(point);
  transactional_->commit_now();
}

void Relay::check_snapshot_deadline() {
  if (!snapshot_ || !snapshot_->end_by || std::chrono::steady_clock::now() < *snapshot_->end_by) return;
  // Taken again, it would outlast the time-out again: a halt for a human.
  throw Fatal(fmt::format(
      "snapshot.mode: under exactly.once.support=required the initial snapshot is one Kafka transaction, and after "
      "{} of about {} rows it is near kafka.transaction.timeout.ms={} ms, when the coordinator would abort it. "
      "Nothing of it is visible to read_committed consumers. Raise kafka.transaction.timeout.ms (up to the brokers' "
      "transaction.max.timeout.ms, 15 min by default), narrow it with snapshot.select.statement.overrides, or take "
      "the snapshot at least once and then restart with exactly once; the next start takes it again from the start",
      snapshot_->rows_done, snapshot_->rows_estimated, transactional_->transaction_timeout().count()));
}

void Relay::log_snapshot_progress(bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - snapshot_->logged < 10s) return;
  snapshot_->logged = now;
  auto status = this->status();
  const auto& sn = *status.snapshot;
  spdlog::info("slot={} initial snapshot: {} of about {} rows ({} now), {:.0f} rows/s{}", config_.slot_name,
               sn.rows_done, sn.rows_estimated, sn.table, sn.rows_per_second,
               sn.seconds_left ? fmt::format(", about {:.0f} s left", *sn.seconds_left) : std::string());
}

}  // namespace walrelay
