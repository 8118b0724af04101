// Reading an outbox table's rows, for the two jobs that do (the initial
// snapshot and replay): the table's columns as a pgoutput Relation, and each
// row of a query result as an Insert, so that rows read from the table take
// the same decoder and mapper path as rows read from the WAL.
#pragma once

#include <cstdint>
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
};

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

}  // namespace walrelay
