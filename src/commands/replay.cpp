#include "walrelay/commands/replay.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <iostream>
#include <map>
#include <stdexcept>

#include "walrelay/commands/command_support.hpp"
#include "walrelay/exit_codes.hpp"
#include "walrelay/admin/metrics.hpp"
#include "walrelay/mutation.hpp"
#include "walrelay/route/outbox_mapper.hpp"
#include "walrelay/source/pg_connection.hpp"
#include "walrelay/source/sqlstate.hpp"
#include "walrelay/route/schema_registry.hpp"
#include "walrelay/source/table_rows.hpp"

namespace walrelay {
namespace asio = boost::asio;
using namespace std::chrono_literals;

std::string replay_condition(const Config& config, const ReplayOptions& o,
                             const std::function<std::string(const std::string&)>& qi,
                             const std::function<std::string(const std::string&)>& ql) {
  std::vector<std::string> parts;
  if (!o.where.empty()) parts.push_back("(" + o.where + ")");
  // Literals, not numbers: PostgreSQL casts them to the column's type, so an
  // id range works for bigint and uuid ids alike.
  if (!o.from_id.empty()) parts.push_back(qi(config.field_event_id) + " >= " + ql(o.from_id));
  if (!o.to_id.empty()) parts.push_back(qi(config.field_event_id) + " <= " + ql(o.to_id));
  if (!o.since.empty() || !o.until.empty()) {
    const std::string column = o.time_column.empty() ? config.field_event_timestamp : o.time_column;
    if (column.empty())
      throw std::invalid_argument("--since/--until: name the column that holds the rows' time with --time-column "
                                  "(table.field.event.timestamp is not set)");
    if (!o.since.empty()) parts.push_back(qi(column) + " >= " + ql(o.since));
    if (!o.until.empty()) parts.push_back(qi(column) + " < " + ql(o.until));
  }
  if (parts.empty())
    throw std::invalid_argument("say which rows to send again: --where, --from-id/--to-id or --since/--until "
                                "(--where true sends every row the table keeps)");
  std::string out;
  for (auto& p : parts) out += (out.empty() ? "" : " AND ") + p;
  return out;
}

namespace {

bool ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || (c & 0x80); }
bool ident_char(char c) { return ident_start(c) || std::isdigit(static_cast<unsigned char>(c)) || c == '$'; }

// A left-to-right reader of SQL text for called_function_names: it steps
// over what can hold no function call (blanks, comments, constants).
struct SqlScanner {
  std::string_view sql;
  std::size_t i = 0;

  // Skips white space and comments (nested /* */ as PostgreSQL's).
  void skip_space() {
    const std::size_t n = sql.size();
    while (i < n) {
      if (std::isspace(static_cast<unsigned char>(sql[i]))) {
        ++i;
      } else if (sql.substr(i, 2) == "--") {
        while (i < n && sql[i] != '\n') ++i;
      } else if (sql.substr(i, 2) == "/*") {
        int depth = 0;
        while (i < n) {
          if (sql.substr(i, 2) == "/*") depth++, i += 2;
          else if (sql.substr(i, 2) == "*/") { i += 2; if (--depth == 0) break; }
          else ++i;
        }
      } else {
        break;
      }
    }
  }

  // Skips a string constant ('...', E'...', B'...', X'...', N'...') when one
  // starts here; whether it did.
  bool skip_string_constant() {
    const std::size_t n = sql.size();
    const char c = sql[i];
    if (!(c == '\'' || ((c == 'e' || c == 'E' || c == 'b' || c == 'B' || c == 'x' || c == 'X' || c == 'n' ||
                         c == 'N') && i + 1 < n && sql[i + 1] == '\'')))
      return false;
    const bool escapes = c == 'e' || c == 'E';
    i += c == '\'' ? 1 : 2;
    while (i < n) {
      if (escapes && sql[i] == '\\') { i += 2; continue; }
      if (sql[i] == '\'') {
        if (i + 1 < n && sql[i + 1] == '\'') { i += 2; continue; }
        ++i;
        break;
      }
      ++i;
    }
    return true;
  }

  // At a '$': skips $tag$ ... $tag$ (or a parameter $1, skipped as a word).
  void skip_dollar() {
    const std::size_t n = sql.size();
    std::size_t j = i + 1;
    while (j < n && ident_char(sql[j]) && sql[j] != '$') ++j;
    if (j < n && sql[j] == '$' && !std::isdigit(static_cast<unsigned char>(sql[i + 1]))) {
      const std::string_view tag = sql.substr(i, j - i + 1);
      auto end = sql.find(tag, j + 1);
      i = end == std::string_view::npos ? n : end + tag.size();
      return;
    }
    i = j;
  }

  // A name, qualified or not, when one starts here: its last part (the
  // function's), lowercased unless quoted; the blanks after it skipped.
  std::optional<std::string> read_name() {
    const std::size_t n = sql.size();
    std::string name;
    bool read = false;
    while (i < n && (ident_start(sql[i]) || sql[i] == '"')) {
      if (sql[i] == '"') {
        name.clear();
        ++i;
        while (i < n) {
          if (sql[i] == '"') {
            if (i + 1 < n && sql[i + 1] == '"') { name += '"'; i += 2; continue; }
            ++i;
            break;
          }
          name += sql[i++];
        }
      } else {
        name.clear();
        while (i < n && ident_char(sql[i])) name += static_cast<char>(std::tolower(static_cast<unsigned char>(sql[i++])));
      }
      read = true;
      skip_space();
      if (i < n && sql[i] == '.') {
        ++i;
        skip_space();
        continue;
      }
      break;
    }
    if (!read) return std::nullopt;
    return name;
  }
};

}  // namespace

std::optional<std::vector<std::string>> called_function_names(std::string_view sql) {
  std::vector<std::string> names;
  SqlScanner scan{sql};
  std::size_t& i = scan.i;
  const std::size_t n = sql.size();
  while (i < n) {
    scan.skip_space();
    if (i >= n) break;
    const char c = sql[i];
    if ((c == 'u' || c == 'U') && sql.substr(i + 1, 2) == "&\"") return std::nullopt;
    if (scan.skip_string_constant()) continue;
    if (c == '$') {
      scan.skip_dollar();
      continue;
    }
    if (auto name = scan.read_name()) {
      if (i < n && sql[i] == '(') names.push_back(*name);
      continue;
    }
    ++i;
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

std::string replay_condition_refused(const std::string& table, const std::string& condition, const PgError& e) {
  return fmt::format("the condition on {} is refused: {} (SQLSTATE {}); where is one SQL condition on the table's "
                     "rows, run as one statement in a read-only transaction: {}",
                     table, e.primary().empty() ? std::string(e.what()) : e.primary(),
                     e.sqlstate().empty() ? "none" : e.sqlstate(), condition);
}

std::string replay_condition_failed(const std::string& table, const std::string& condition, const PgError& e,
                                    bool quote_server_message) {
  // Only the SQLSTATE: the server's message of an error raised while the rows
  // are read may quote what they hold (a failed cast quotes the value), and
  // GET /replay's reader need not be allowed to read the table.
  const std::string shown =
      fmt::format("reading the rows of {} where {} failed: SQLSTATE {}{} (the server's message is not shown, as it "
                  "may quote the rows' values: run the count in psql to read it)",
                  table, condition, e.sqlstate().empty() ? "none" : e.sqlstate(), sqlstate_name(e.sqlstate()));
  if (quote_server_message)
    spdlog::critical("replay: reading the rows of {} where {} failed: {}", table, condition, e.what());
  else
    spdlog::critical("replay: {}", shown);
  return shown;
}

TableName replay_table(const Config& config, const ReplayOptions& o) {
  std::string names;
  std::optional<TableName> table;
  for (auto& t : config.table_include_list) {
    names += (names.empty() ? "" : ", ") + t.qualified();
    if (o.table.empty() ? config.table_include_list.size() == 1
                        : (t.qualified() == o.table || (t.schema == "public" && t.name == o.table)))
      table = t;
  }
  if (!table)
    throw std::invalid_argument(o.table.empty() ? "name one of the outbox tables (" + names + ")"
                                                : o.table + " is not in table.include.list (" + names + ")");
  return *table;
}

namespace {

// One replay: the table and condition checked, the rows counted and
// confirmed, then read through a cursor and sent, all in one snapshot.
class Replay {
 public:
  Replay(asio::io_context& io, const Config& config, Sink& sink, const ReplayOptions& o, const bool& stop,
         ReplayProgress& p)
      : io_(io), config_(config), sink_(sink), o_(o), stop_(stop), p_(p), conn_(io) {}

  // The whole replay, step by step; the exit code.
  asio::awaitable<int> run() {
    if (auto code = co_await open()) co_return *code;
    if (auto code = co_await check_condition()) co_return *code;
    if (auto code = co_await count()) co_return *code;
    if (auto code = confirm()) co_return *code;
    co_return co_await send();
  }

 private:
  // The table (one of the outbox tables, so that its rows map as the
  // relay's do), the connection, and the condition; an exit code when it
  // cannot go on.
  asio::awaitable<std::optional<int>> open() {
    try {
      table_ = replay_table(config_, o_);
    } catch (const std::invalid_argument& e) {
      p_.refusal = std::string("table: ") + e.what();
      spdlog::critical("replay: --table: {}", e.what());
      co_return exit_config;
    }
    where_ = table_.qualified();
    p_.table = where_;
    std::optional<int> failed;
    try {
      co_await conn_.connect(config_.conninfo(false), std::chrono::milliseconds(config_.database_connect_timeout_ms));
    } catch (const PgError& e) {
      spdlog::critical("replay: could not connect: {}", e.what());
      failed = exit_failure;
    }
    if (failed) co_return failed;
    try {
      condition_ = replay_condition(
          config_, o_, [&](const std::string& s) { return conn_.quote_identifier(s); },
          [&](const std::string& s) { return conn_.quote_literal(s); });
    } catch (const std::invalid_argument& e) {
      p_.refusal = e.what();
      spdlog::critical("replay: {}", e.what());
      co_return exit_config;
    }
    p_.condition = condition_;
    co_return std::nullopt;
  }

  // Opens the snapshot, describes the table and checks the condition's text
  // and the functions it calls; an exit code when it is refused.
  asio::awaitable<std::optional<int>> check_condition() {
    // One snapshot for the count and the rows: what was counted is what is sent.
    // READ ONLY, and every statement that carries the operator's condition goes
    // through the extended protocol, which takes one statement: the condition
    // can neither end this transaction nor run a statement of its own.
    co_await conn_.query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
    const std::string order_column = config_.snapshot_order_column.empty() ? config_.field_event_id
                                                                            : config_.snapshot_order_column;
    std::optional<int> refused;
    try {
      rows_ = co_await describe_table(conn_, table_);
    } catch (const PgError& e) {
      p_.refusal = fmt::format("{} cannot be read: {}", where_, e.what());
      spdlog::critical("replay: {}", p_.refusal);
      refused = exit_config;
    }
    if (refused) co_return refused;
    select_ = "SELECT " + rows_.select_list + " FROM " + rows_.quoted_table + " WHERE " + condition_ + " ORDER BY " +
              conn_.quote_identifier(order_column);
    count_sql_ = "SELECT count(*) FROM " + rows_.quoted_table + " WHERE " + condition_;
    try {
      // Parsed and analysed first, nothing run: what the server says of the
      // condition's own text (a syntax error, an unknown column, several
      // statements) is about that text only, and is shown as it is.
      if (!mutation::active(mutation::Break::operator_sql_simple_protocol))
        co_await conn_.prepare(count_sql_, std::chrono::seconds(30));
    } catch (const PgError& e) {
      p_.refusal = replay_condition_refused(where_, condition_, e);
      spdlog::critical("replay: {}", p_.refusal);
      refused = exit_config;
    }
    if (refused) co_return refused;
    co_return co_await check_functions();
  }

  // Read only does not stop a function with effects beyond the database's
  // rows, run once per row as walrelay's role, which has REPLICATION
  // (pg_replication_slot_advance, pg_terminate_backend, pg_sleep): the
  // condition may call immutable and stable functions only.
  asio::awaitable<std::optional<int>> check_functions() {
    auto called = called_function_names(condition_);
    std::string refused;
    if (!called) {
      refused = "a U& identifier, whose function names walrelay cannot check";
    } else if (!called->empty()) {
      std::string list;
      for (auto& f : *called) list += (list.empty() ? "" : ",") + conn_.quote_literal(f);
      auto volatile_ones = co_await conn_.query(
          "SELECT string_agg(DISTINCT p.proname, ', ' ORDER BY p.proname) FROM pg_catalog.pg_proc p "
          "WHERE p.provolatile = 'v' AND p.proname = ANY (ARRAY[" + list + "]::text[])");
      if (!volatile_ones.rows.empty() && volatile_ones.rows[0][0])
        refused = "volatile function(s) " + *volatile_ones.rows[0][0];
    }
    if (refused.empty()) co_return std::nullopt;
    p_.refusal = fmt::format("the condition on {} is refused: it calls {}. where may call immutable and stable "
                             "functions only: it runs once per row as walrelay's role, which has REPLICATION, and "
                             "a volatile function can act beyond the read-only transaction: {}",
                             where_, refused, condition_);
    spdlog::critical("replay: {}", p_.refusal);
    co_return exit_config;
  }

  // Counts the rows that match, in the snapshot; an exit code when the
  // count fails or there is nothing to send.
  asio::awaitable<std::optional<int>> count() {
    std::optional<int> failed;
    try {
      // Not a conditional expression: with co_await in both arms, this GCC
      // build crashed (segmentation fault in walrelay replay).
      PgRows n;
      if (mutation::active(mutation::Break::operator_sql_simple_protocol))
        n = co_await conn_.query(count_sql_, {}, std::chrono::hours(1));
      else
        n = co_await conn_.query_prepared(std::chrono::hours(1));
      if (!conn_.in_transaction()) throw PgError("the count ended the replay's transaction", "25000");
      count_ = std::stoull(n.rows.at(0).at(0).value_or("0"));
    } catch (const PgError& e) {
      p_.refusal = replay_condition_failed(where_, condition_, e, o_.quote_server_errors);
      failed = exit_config;
    }
    if (failed) co_return failed;
    p_.rows_matched = count_;
    p_.counted = true;
    spdlog::info("replay: {} row(s) of {} match {}", count_, where_, condition_);
    if (count_ == 0) co_return exit_ok;
    if (o_.dry_run) {
      spdlog::info("replay: --dry-run: nothing sent");
      co_return exit_ok;
    }
    co_return std::nullopt;
  }

  // Above confirm_above without --yes: asks on a terminal, else refuses; an
  // exit code when not confirmed.
  std::optional<int> confirm() {
    if (count_ <= o_.confirm_above || o_.yes) return std::nullopt;
    if (!o_.may_ask || !::isatty(STDIN_FILENO)) {
      p_.refusal = fmt::format("{} rows match, more than confirm_above={}: confirm with yes to send them again",
                               count_, o_.confirm_above);
      spdlog::critical("replay: {} rows match, more than --confirm-above={}: add --yes to send them again", count_,
                       o_.confirm_above);
      return exit_failure;
    }
    std::cerr << "Send " << count_ << " rows of " << where_ << " again (sink " << config_.sink_type
              << ")? Type yes to go on: " << std::flush;
    std::string answer;
    std::getline(std::cin, answer);
    if (answer != "yes") {
      p_.refusal = "not confirmed";
      spdlog::info("replay: not confirmed; nothing sent");
      return exit_failure;
    }
    return std::nullopt;
  }

  // Sends the counted rows and waits for their acknowledgements; the exit code.
  asio::awaitable<int> send() {
    RowMapping m(io_, config_);
    if (!m.announce(rows_)) {
      spdlog::critical("replay: {} is not an outbox table walrelay can map", where_);
      co_return exit_config;
    }
    for (std::size_t i = 0; i < rows_.columns.size(); ++i)
      if (rows_.columns[i].name == config_.field_event_id) id_column_ = static_cast<int>(i);
    sink_.on_delivery([this](const Delivery& d) { on_delivery(d); });
    std::optional<int> failed;
    try {
      co_await conn_.query_one("DECLARE walrelay_replay NO SCROLL CURSOR FOR " + select_, std::chrono::seconds(30));
      if (!conn_.in_transaction()) throw PgError("the cursor's declaration ended the replay's transaction", "25000");
    } catch (const PgError& e) {
      p_.refusal = replay_condition_failed(where_, condition_, e, o_.quote_server_errors);
      failed = exit_config;
    }
    if (failed) co_return *failed;
    const auto started = std::chrono::steady_clock::now();
    co_await fetch_all(m, started);
    co_return co_await finish(started);
  }

  // A delivery report, counted (and the first failures logged).
  void on_delivery(const Delivery& d) {
    tally_.inflight--;
    if (d.ok) {
      p_.rows_acknowledged = ++tally_.delivered;
      return;
    }
    p_.rows_not_delivered = ++tally_.failed;
    if (tally_.failed <= 10)
      spdlog::error("replay: a record to {} was not delivered: {} ({})", d.topic, d.error_message, d.error_code);
  }

  // Reads the cursor a batch at a time and sends each row, until the rows
  // end, a stop, or a halt.
  asio::awaitable<void> fetch_all(RowMapping& m, std::chrono::steady_clock::time_point started) {
    const std::string fetch = "FETCH FORWARD " + std::to_string(config_.snapshot_fetch_size) + " FROM walrelay_replay";
    const std::int64_t now = pgoutput::pg_epoch_micros_now();
    auto logged = started;
    while (!stop_ && !halted_) {
      PgResultPtr result(nullptr, &PQclear);
      try {
        // The cursor runs the condition again, in the same snapshot: what
        // failed here would have failed the count, but a FETCH is reported the
        // same way.
        result = co_await conn_.query_result(fetch, std::chrono::hours(24));
      } catch (const PgError& e) {
        p_.refusal = replay_condition_failed(where_, condition_, e, o_.quote_server_errors);
        halted_ = read_failed_ = true;
      }
      if (read_failed_) break;
      const int n = result ? PQntuples(result.get()) : 0;
      if (n == 0) break;
      for (int r = 0; r < n && !stop_ && !halted_; ++r) co_await send_row(m, result.get(), r, now);
      sink_.poll();
      auto now_t = std::chrono::steady_clock::now();
      if (now_t - logged >= 5s) {
        logged = now_t;
        spdlog::info("replay: {} of {} rows sent, {} acknowledged", tally_.sent, count_, tally_.delivered);
      }
    }
  }

  // One row of the cursor's batch, mapped and sent, waiting for room among
  // the records in flight.
  asio::awaitable<void> send_row(RowMapping& m, PGresult* result, int r, std::int64_t now) {
    rows_.insert(m.writer, result, r);
    auto decoded = m.decoder.decode(m.writer.bytes());
    if (!decoded || !std::holds_alternative<pgoutput::Insert>(decoded.value())) {
      spdlog::critical("replay: could not encode a row of {} as an Insert", where_);  // a bug, not the row's
      halted_ = true;
      co_return;
    }
    const auto& insert = std::get<pgoutput::Insert>(decoded.value());
    std::optional<MapError> error = m.mapper.map(insert, now, record_);
    if (!error) error = co_await encode_when_ready(io_, m.encoder.get(), record_, stop_);
    if (error) {
      p_.rows_unmapped = ++tally_.unmapped;
      const std::string id = id_column_ >= 0 && !PQgetisnull(result, r, id_column_)
                                 ? PQgetvalue(result, r, id_column_)
                                 : std::string("?");
      spdlog::error("replay: the row of {} with {}={} cannot be mapped ({}): {}", where_, config_.field_event_id, id,
                    error->reason, error->message);
      // errors.tolerance=none: stop there, as the relay would.
      if (config_.errors_tolerance == ErrorTolerance::none) halted_ = true;
      co_return;
    }
    if (stop_) co_return;
    while (tally_.inflight >= static_cast<std::uint64_t>(config_.max_inflight_records)) {
      sink_.poll();
      if (tally_.inflight >= static_cast<std::uint64_t>(config_.max_inflight_records)) co_await pause(io_, 5ms);
    }
    tally_.inflight++;  // before submit: a refusal reports inside it
    co_await submit_when_taken(io_, sink_, record_, 0);
    p_.rows_sent = ++tally_.sent;
  }

  // Waits for what is in flight, ends the snapshot, and says how it went.
  asio::awaitable<int> finish(std::chrono::steady_clock::time_point started) {
    // Everything sent settles before the exit; a stop waits shutdown.timeout.ms.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(config_.shutdown_timeout_ms);
    while (tally_.inflight > 0 && (!stop_ || std::chrono::steady_clock::now() < deadline)) {
      sink_.poll();
      co_await pause(io_, 20ms);
    }
    try {
      co_await conn_.query("COMMIT");
    } catch (const PgError&) {
    }
    conn_.close();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    spdlog::info("replay: {} of {} rows of {} sent again in {:.1f} s; {} acknowledged, {} not delivered, {} could "
                 "not be mapped",
                 tally_.sent, count_, where_, seconds, tally_.delivered, tally_.failed + tally_.inflight,
                 tally_.unmapped);
    if (stop_) {
      spdlog::warn("replay: interrupted after {} rows; the rows sent were sent at least once: run it again, or "
                   "narrow it with --from-id",
                   tally_.sent);
      co_return exit_failure;
    }
    if (read_failed_) co_return exit_failure;
    co_return tally_.failed + tally_.unmapped + tally_.inflight > 0 ? exit_halted : exit_ok;
  }

  asio::io_context& io_;
  const Config& config_;
  Sink& sink_;
  const ReplayOptions& o_;
  const bool& stop_;
  ReplayProgress& p_;
  PgConnection conn_;
  TableName table_;
  std::string where_;  // the table, schema.table
  std::string condition_, select_, count_sql_;
  TableRows rows_;
  std::uint64_t count_ = 0;
  int id_column_ = -1;  // where the event id is, for the log
  struct Tally {
    std::uint64_t inflight = 0, sent = 0, delivered = 0, failed = 0, unmapped = 0;
  } tally_;
  OutboxRecord record_;
  bool halted_ = false, read_failed_ = false;
};

}  // namespace

asio::awaitable<int> run_replay(asio::io_context& io, const Config& config, Sink& sink, const ReplayOptions& o,
                                const bool& stop, ReplayProgress* progress) {
  ReplayProgress unused;
  Replay replay(io, config, sink, o, stop, progress ? *progress : unused);
  co_return co_await replay.run();
}

}  // namespace walrelay
