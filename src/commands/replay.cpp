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

// A few SQLSTATEs by their names (PostgreSQL's errcodes), for a refusal that
// may not quote the server's message.
std::string sqlstate_name(const std::string& code) {
  static const std::map<std::string, std::string> names = {
      {"21000", "cardinality_violation"},     {"22001", "string_data_right_truncation"},
      {"22003", "numeric_value_out_of_range"}, {"22007", "invalid_datetime_format"},
      {"22008", "datetime_field_overflow"},   {"22012", "division_by_zero"},
      {"22023", "invalid_parameter_value"},   {"22P02", "invalid_text_representation"},
      {"23514", "check_violation"},           {"25006", "read_only_sql_transaction"},
      {"25000", "invalid_transaction_state"}, {"42501", "insufficient_privilege"},
      {"42P01", "undefined_table"},           {"42703", "undefined_column"},
      {"42704", "undefined_object"},          {"42883", "undefined_function"},
      {"53200", "out_of_memory"},             {"54001", "statement_too_complex"},
      {"55P03", "lock_not_available"},        {"57014", "query_canceled"},
      {"P0001", "raise_exception"},
  };
  auto it = names.find(code);
  return it == names.end() ? std::string() : " " + it->second;
}

}  // namespace

std::optional<std::vector<std::string>> called_function_names(std::string_view sql) {
  std::vector<std::string> names;
  const auto ident_start = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || (c & 0x80); };
  const auto ident_char = [&](char c) { return ident_start(c) || std::isdigit(static_cast<unsigned char>(c)) || c == '$'; };
  std::size_t i = 0;
  const std::size_t n = sql.size();
  // Skips white space and comments (nested /* */ as PostgreSQL's).
  auto skip_space = [&] {
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
  };
  while (i < n) {
    skip_space();
    if (i >= n) break;
    const char c = sql[i];
    if ((c == 'u' || c == 'U') && sql.substr(i + 1, 2) == "&\"") return std::nullopt;
    if (c == '\'' || ((c == 'e' || c == 'E' || c == 'b' || c == 'B' || c == 'x' || c == 'X' || c == 'n' ||
                       c == 'N') && i + 1 < n && sql[i + 1] == '\'')) {
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
      continue;
    }
    if (c == '$') {
      // $tag$ ... $tag$ (or a parameter $1, skipped as a word).
      std::size_t j = i + 1;
      while (j < n && ident_char(sql[j]) && sql[j] != '$') ++j;
      if (j < n && sql[j] == '$' && !std::isdigit(static_cast<unsigned char>(sql[i + 1]))) {
        const std::string_view tag = sql.substr(i, j - i + 1);
        auto end = sql.find(tag, j + 1);
        i = end == std::string_view::npos ? n : end + tag.size();
        continue;
      }
      i = j;
      continue;
    }
    std::string name;
    bool read = false;
    // A name, qualified or not: the last part is the function's.
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
    if (read) {
      if (i < n && sql[i] == '(') names.push_back(name);
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

asio::awaitable<int> run_replay(asio::io_context& io, const Config& config, Sink& sink, const ReplayOptions& o,
                                const bool& stop, ReplayProgress* progress) {
  ReplayProgress unused;
  ReplayProgress& p = progress ? *progress : unused;
  // The table: one of the outbox tables, so that its rows map as the relay's do.
  std::optional<TableName> table;
  try {
    table = replay_table(config, o);
  } catch (const std::invalid_argument& e) {
    p.refusal = std::string("table: ") + e.what();
    spdlog::critical("replay: --table: {}", e.what());
    co_return exit_config;
  }
  const std::string where = table->qualified();
  p.table = where;

  PgConnection conn(io);
  try {
    co_await conn.connect(config.conninfo(false), std::chrono::milliseconds(config.database_connect_timeout_ms));
  } catch (const PgError& e) {
    spdlog::critical("replay: could not connect: {}", e.what());
    co_return exit_failure;
  }
  std::string condition;
  try {
    condition = replay_condition(
        config, o, [&](const std::string& s) { return conn.quote_identifier(s); },
        [&](const std::string& s) { return conn.quote_literal(s); });
  } catch (const std::invalid_argument& e) {
    p.refusal = e.what();
    spdlog::critical("replay: {}", e.what());
    co_return exit_config;
  }
  p.condition = condition;

  // One snapshot for the count and the rows: what was counted is what is sent.
  // READ ONLY, and every statement that carries the operator's condition goes
  // through the extended protocol, which takes one statement: the condition
  // can neither end this transaction nor run a statement of its own.
  co_await conn.query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  TableRows rows;
  std::uint64_t count = 0;
  const std::string order_column = config.snapshot_order_column.empty() ? config.field_event_id
                                                                         : config.snapshot_order_column;
  std::string select;
  try {
    rows = co_await describe_table(conn, *table);
  } catch (const PgError& e) {
    p.refusal = fmt::format("{} cannot be read: {}", where, e.what());
    spdlog::critical("replay: {}", p.refusal);
    co_return exit_config;
  }
  select = "SELECT " + rows.select_list + " FROM " + rows.quoted_table + " WHERE " + condition + " ORDER BY " +
           conn.quote_identifier(order_column);
  const std::string count_sql = "SELECT count(*) FROM " + rows.quoted_table + " WHERE " + condition;
  try {
    // Parsed and analysed first, nothing run: what the server says of the
    // condition's own text (a syntax error, an unknown column, several
    // statements) is about that text only, and is shown as it is.
    if (!mutation::active(mutation::Break::operator_sql_simple_protocol))
      co_await conn.prepare(count_sql, std::chrono::seconds(30));
  } catch (const PgError& e) {
    p.refusal = replay_condition_refused(where, condition, e);
    spdlog::critical("replay: {}", p.refusal);
    co_return exit_config;
  }
  // Read only does not stop a function with effects beyond the database's
  // rows, run once per row as walrelay's role, which has REPLICATION
  // (pg_replication_slot_advance, pg_terminate_backend, pg_sleep): the
  // condition may call immutable and stable functions only.
  {
    auto called = called_function_names(condition);
    std::string refused;
    if (!called) {
      refused = "a U& identifier, whose function names walrelay cannot check";
    } else if (!called->empty()) {
      std::string list;
      for (auto& f : *called) list += (list.empty() ? "" : ",") + conn.quote_literal(f);
      auto volatile_ones = co_await conn.query(
          "SELECT string_agg(DISTINCT p.proname, ', ' ORDER BY p.proname) FROM pg_catalog.pg_proc p "
          "WHERE p.provolatile = 'v' AND p.proname = ANY (ARRAY[" + list + "]::text[])");
      if (!volatile_ones.rows.empty() && volatile_ones.rows[0][0])
        refused = "volatile function(s) " + *volatile_ones.rows[0][0];
    }
    if (!refused.empty()) {
      p.refusal = fmt::format("the condition on {} is refused: it calls {}. where may call immutable and stable "
                              "functions only: it runs once per row as walrelay's role, which has REPLICATION, and "
                              "a volatile function can act beyond the read-only transaction: {}",
                              where, refused, condition);
      spdlog::critical("replay: {}", p.refusal);
      co_return exit_config;
    }
  }
  try {
    // Not a conditional expression: with co_await in both arms, this GCC
    // build crashed (segmentation fault in walrelay replay).
    PgRows n;
    if (mutation::active(mutation::Break::operator_sql_simple_protocol))
      n = co_await conn.query(count_sql, {}, std::chrono::hours(1));
    else
      n = co_await conn.query_prepared(std::chrono::hours(1));
    if (!conn.in_transaction()) throw PgError("the count ended the replay's transaction", "25000");
    count = std::stoull(n.rows.at(0).at(0).value_or("0"));
  } catch (const PgError& e) {
    p.refusal = replay_condition_failed(where, condition, e, o.quote_server_errors);
    co_return exit_config;
  }
  p.rows_matched = count;
  p.counted = true;
  spdlog::info("replay: {} row(s) of {} match {}", count, where, condition);
  if (count == 0) co_return exit_ok;
  if (o.dry_run) {
    spdlog::info("replay: --dry-run: nothing sent");
    co_return exit_ok;
  }
  if (count > o.confirm_above && !o.yes) {
    if (!o.may_ask || !::isatty(STDIN_FILENO)) {
      p.refusal = fmt::format("{} rows match, more than confirm_above={}: confirm with yes to send them again", count,
                              o.confirm_above);
      spdlog::critical("replay: {} rows match, more than --confirm-above={}: add --yes to send them again", count,
                       o.confirm_above);
      co_return exit_failure;
    }
    std::cerr << "Send " << count << " rows of " << where << " again (sink " << config.sink_type
              << ")? Type yes to go on: " << std::flush;
    std::string answer;
    std::getline(std::cin, answer);
    if (answer != "yes") {
      p.refusal = "not confirmed";
      spdlog::info("replay: not confirmed; nothing sent");
      co_return exit_failure;
    }
  }

  OutboxMapper mapper(config);
  Metrics metrics;
  std::unique_ptr<SchemaEncoder> encoder;
  if (config.registry.format != RegistryFormat::none) encoder = std::make_unique<SchemaEncoder>(io, config, metrics);
  pgoutput::Decoder decoder(1);
  pgoutput::MessageWriter writer;
  rows.relation(writer);
  {
    auto relation = decoder.decode(writer.bytes());
    if (!relation || !mapper.on_relation(std::get<pgoutput::Relation>(relation.value()))) {
      spdlog::critical("replay: {} is not an outbox table walrelay can map", where);
      co_return exit_config;
    }
  }
  int id_column = -1;
  for (std::size_t i = 0; i < rows.columns.size(); ++i)
    if (rows.columns[i].name == config.field_event_id) id_column = static_cast<int>(i);

  struct Tally {
    std::uint64_t inflight = 0, sent = 0, delivered = 0, failed = 0, unmapped = 0;
  } tally;
  sink.on_delivery([&](const Delivery& d) {
    tally.inflight--;
    if (d.ok) {
      p.rows_acknowledged = ++tally.delivered;
      return;
    }
    p.rows_not_delivered = ++tally.failed;
    if (tally.failed <= 10)
      spdlog::error("replay: a record to {} was not delivered: {} ({})", d.topic, d.error_message, d.error_code);
  });

  try {
    co_await conn.query_one("DECLARE walrelay_replay NO SCROLL CURSOR FOR " + select, std::chrono::seconds(30));
    if (!conn.in_transaction()) throw PgError("the cursor's declaration ended the replay's transaction", "25000");
  } catch (const PgError& e) {
    p.refusal = replay_condition_failed(where, condition, e, o.quote_server_errors);
    co_return exit_config;
  }
  const std::string fetch = "FETCH FORWARD " + std::to_string(config.snapshot_fetch_size) + " FROM walrelay_replay";
  const std::int64_t now = pgoutput::pg_epoch_micros_now();
  OutboxRecord record;
  auto started = std::chrono::steady_clock::now(), logged = started;
  bool halted = false, read_failed = false;
  while (!stop && !halted) {
    PgResultPtr result(nullptr, &PQclear);
    try {
      // The cursor runs the condition again, in the same snapshot: what
      // failed here would have failed the count, but a FETCH is reported the
      // same way.
      result = co_await conn.query_result(fetch, std::chrono::hours(24));
    } catch (const PgError& e) {
      p.refusal = replay_condition_failed(where, condition, e, o.quote_server_errors);
      halted = read_failed = true;
      break;
    }
    const int n = result ? PQntuples(result.get()) : 0;
    if (n == 0) break;
    for (int r = 0; r < n && !stop && !halted; ++r) {
      rows.insert(writer, result.get(), r);
      auto decoded = decoder.decode(writer.bytes());
      if (!decoded || !std::holds_alternative<pgoutput::Insert>(decoded.value())) {
        spdlog::critical("replay: could not encode a row of {} as an Insert", where);  // a bug, not the row's
        halted = true;
        break;
      }
      const auto& insert = std::get<pgoutput::Insert>(decoded.value());
      std::optional<MapError> error = mapper.map(insert, now, record);
      if (!error) error = co_await encode_when_ready(io, encoder.get(), record, stop);
      if (error) {
        p.rows_unmapped = ++tally.unmapped;
        const std::string id = id_column >= 0 && !PQgetisnull(result.get(), r, id_column)
                                   ? PQgetvalue(result.get(), r, id_column)
                                   : std::string("?");
        spdlog::error("replay: the row of {} with {}={} cannot be mapped ({}): {}", where, config.field_event_id, id,
                      error->reason, error->message);
        // errors.tolerance=none: stop there, as the relay would.
        if (config.errors_tolerance == ErrorTolerance::none) halted = true;
        continue;
      }
      if (stop) break;
      while (tally.inflight >= static_cast<std::uint64_t>(config.max_inflight_records)) {
        sink.poll();
        if (tally.inflight >= static_cast<std::uint64_t>(config.max_inflight_records)) co_await pause(io, 5ms);
      }
      tally.inflight++;  // before submit: a refusal reports inside it
      co_await submit_when_taken(io, sink, record, 0);
      p.rows_sent = ++tally.sent;
    }
    sink.poll();
    auto now_t = std::chrono::steady_clock::now();
    if (now_t - logged >= 5s) {
      logged = now_t;
      spdlog::info("replay: {} of {} rows sent, {} acknowledged", tally.sent, count, tally.delivered);
    }
  }
  // Everything sent settles before the exit; a stop waits shutdown.timeout.ms.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(config.shutdown_timeout_ms);
  while (tally.inflight > 0 && (!stop || std::chrono::steady_clock::now() < deadline)) {
    sink.poll();
    co_await pause(io, 20ms);
  }
  try {
    co_await conn.query("COMMIT");
  } catch (const PgError&) {
  }
  conn.close();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  spdlog::info("replay: {} of {} rows of {} sent again in {:.1f} s; {} acknowledged, {} not delivered, {} could not "
               "be mapped",
               tally.sent, count, where, seconds, tally.delivered, tally.failed + tally.inflight, tally.unmapped);
  if (stop) {
    spdlog::warn("replay: interrupted after {} rows; the rows sent were sent at least once: run it again, or narrow "
                 "it with --from-id",
                 tally.sent);
    co_return exit_failure;
  }
  if (read_failed) co_return exit_failure;
  co_return tally.failed + tally.unmapped + tally.inflight > 0 ? exit_halted : exit_ok;
}

}  // namespace walrelay
