// walrelay replay: an operator's command, run beside a running walrelay, that
// sends again the rows an outbox table still keeps (by a condition, an id
// range or a time range) to where they would go now, with their original id
// header so that consumers deduplicate. It reads the table on an ordinary
// connection in one REPEATABLE READ transaction, through a cursor, and never
// touches the slot.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include "walrelay/config.hpp"
#include "walrelay/source/pg_connection.hpp"
#include "walrelay/sinks/sink.hpp"

namespace walrelay {

struct ReplayOptions {
  std::string table;        // schema.table, one of table.include.list ("" with one listed: that one)
  std::string where;        // an SQL condition on the table's rows
  std::string from_id, to_id;      // table.field.event.id, inclusive
  std::string since, until;        // the time column, since inclusive, until exclusive
  std::string time_column;         // default table.field.event.timestamp
  bool yes = false;                // no confirmation above confirm_above
  std::uint64_t confirm_above = 1000;
  bool dry_run = false;            // count and say what would be sent
  bool may_ask = false;            // above confirm_above without yes: ask on a terminal (the CLI), else refuse
  // The server's message of a condition that fails on the rows goes to the
  // log (the CLI's operator holds the configuration and may read every row);
  // otherwise (POST /replay) only its SQLSTATE, as the message may quote a
  // row's value.
  bool quote_server_errors = false;
};

// What a replay has done so far, for POST /replay's job (GET /replay).
struct ReplayProgress {
  std::string table;               // schema.table
  std::string condition;           // the WHERE clause, once built
  std::uint64_t rows_matched = 0;  // counted in the replay's snapshot
  std::uint64_t rows_sent = 0;
  std::uint64_t rows_acknowledged = 0;
  std::uint64_t rows_not_delivered = 0;
  std::uint64_t rows_unmapped = 0;
  bool counted = false;            // rows_matched is known
  std::string refusal;             // why nothing was sent (a bad option or condition, not confirmed)
};

// The outbox table a replay reads: options.table among table.include.list
// (or the only one listed); std::invalid_argument naming the choices.
TableName replay_table(const Config& config, const ReplayOptions& options);

// The WHERE clause the options select (quoted as `conn` would), or a
// std::invalid_argument naming the option that is wrong or missing.
std::string replay_condition(const Config& config, const ReplayOptions& options,
                             const std::function<std::string(const std::string&)>& quote_identifier,
                             const std::function<std::string(const std::string&)>& quote_literal);

// A refusal of the condition's text (the server's parse of it: several
// statements, a syntax error, an unknown column), quoting the server's
// primary message, which names only what the text names.
std::string replay_condition_refused(const std::string& table, const std::string& condition, const PgError& error);

// The names of the functions an SQL condition calls (an identifier, or a
// quoted one, followed by "("; the last part of a qualified name),
// lowercased unless quoted, string constants and comments skipped; nullopt
// for text whose names cannot be read that way (a U& identifier).
std::optional<std::vector<std::string>> called_function_names(std::string_view sql);
// A condition that failed while the rows were read: the SQLSTATE only, never
// the server's message, which may quote a row's value; logged as well (with
// the server's message when `quote_server_message`).
std::string replay_condition_failed(const std::string& table, const std::string& condition, const PgError& error,
                                    bool quote_server_message);

// Runs the replay; returns the exit code (0 all sent and acknowledged, 1
// refused or interrupted, 2 bad options, 3 rows that could not be mapped or
// delivered).
// progress, when given, is kept up to date as the replay goes.
boost::asio::awaitable<int> run_replay(boost::asio::io_context& io, const Config& config, Sink& sink,
                                       const ReplayOptions& options, const bool& stop_requested,
                                       ReplayProgress* progress = nullptr);

}  // namespace walrelay
