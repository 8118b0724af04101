// Reading an outbox table's rows, for the two jobs that do (the initial
// snapshot and replay): the table's columns as a pgoutput Relation, and each
// row of a query result as an Insert, so that rows read from the table take
// the same decoder and mapper path as rows read from the WAL.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <string>
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <libpq-fe.h>

#include <pgoutput/encode.hpp>

#include "walrelay/config.hpp"
#include "walrelay/source/pg_connection.hpp"

namespace walrelay {

struct TableRows {
  struct Column {
    std::string name;
    std::uint32_t type_oid = 0;
    std::int32_t type_modifier = -1;
  };
  TableName name;
  std::uint32_t oid = 0;
  std::vector<Column> columns;  // every column the table has, in attnum order
  std::string select_list;      // the columns quoted, comma-separated
  std::string quoted_table;     // "schema"."table"

  // 'R' for the table (the mapper finds its columns by name in it).
  void relation(pgoutput::MessageWriter& writer) const;
  // 'I' for row `row` of `result`, a SELECT of select_list.
  void insert(pgoutput::MessageWriter& writer, const PGresult* result, int row) const;
  // 'I' for one row of COPY's text format (one CopyData message of a
  // COPY (SELECT select_list ...) TO STDOUT). Returns the number of fields
  // the row held: the Insert is whole only when that is columns.size().
  // `scratch` holds a field's unescaped text meanwhile.
  std::size_t insert_copy_text(pgoutput::MessageWriter& writer, std::string_view row, std::string& scratch) const;
};

// COPY's text format, one row (PostgreSQL's CopyReadAttributesText, client
// side): `row` split at tabs, each field handed to `field` as its text, or as
// nullopt for \N; backslash escapes undone into `scratch` only when a field
// has one. The row's line end (\n, or \r\n from a Windows server) is not
// a field's. Returns the number of fields.
template <typename Field>
std::size_t for_each_copy_text_field(std::string_view row, std::string& scratch, Field&& field);
std::string_view unescape_copy_text(std::string_view raw, std::string& scratch);

// The table's OID and columns from the catalog. PgError 42P01 when it does not exist.
boost::asio::awaitable<TableRows> describe_table(PgConnection& conn, const TableName& name);

// The planner's estimate of a query's rows (EXPLAIN), 0 when it gives none.
boost::asio::awaitable<std::uint64_t> estimate_rows(PgConnection& conn, const std::string& select);

// Parses `select` (nothing run) on an ordinary connection of its own, in a
// READ ONLY transaction, with the extended protocol: PgError when it is not
// exactly one statement the server accepts. For SQL that carries an
// operator's text and must then run on a walsender, which takes simple
// queries only.
boost::asio::awaitable<void> check_one_statement(boost::asio::io_context& io, const Config& config,
                                                 const std::string& select);

template <typename Field>
std::size_t for_each_copy_text_field(std::string_view row, std::string& scratch, Field&& field) {
  if (!row.empty() && row.back() == '\n') row.remove_suffix(1);
  // A carriage return in a value is escaped (\r): a bare one ends the line.
  if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
  std::size_t fields = 0;
  for (;;) {
    const std::size_t tab = row.find('\t');
    const std::string_view raw = row.substr(0, tab);
    ++fields;
    if (raw == "\\N") field(std::optional<std::string_view>());
    else field(std::optional<std::string_view>(unescape_copy_text(raw, scratch)));
    if (tab == std::string_view::npos) return fields;
    row.remove_prefix(tab + 1);
  }
}

}  // namespace walrelay
