#include "walrelay/source/table_rows.hpp"

#include <cstdlib>

namespace walrelay {
namespace asio = boost::asio;

void TableRows::relation(pgoutput::MessageWriter& writer) const {
  std::vector<pgoutput::MessageWriter::ColumnSpec> specs;
  specs.reserve(columns.size());
  for (auto& c : columns) specs.push_back({c.name, c.type_oid, c.type_modifier});
  writer.relation(oid, name.schema, name.name, specs);
}

void TableRows::insert(pgoutput::MessageWriter& writer, const PGresult* result, int row) const {
  const auto n = static_cast<std::uint16_t>(columns.size());
  writer.insert(oid, n);
  for (int c = 0; c < n; ++c) {
    if (PQgetisnull(result, row, c)) writer.null();
    else writer.text({PQgetvalue(result, row, c), static_cast<std::size_t>(PQgetlength(result, row, c))});
  }
}

std::size_t TableRows::insert_copy_text(pgoutput::MessageWriter& writer, std::string_view row,
                                        std::string& scratch) const {
  writer.insert(oid, static_cast<std::uint16_t>(columns.size()));
  return for_each_copy_text_field(row, scratch, [&](std::optional<std::string_view> value) {
    if (value) writer.text(*value);
    else writer.null();
  });
}

namespace {
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

// The escapes of COPY's text format (PostgreSQL's copyfromparse.c): \b \f
// \n \r \t \v, one to three octal digits, \x and one or two hex digits,
// and a backslash before any other character stands for that character.
// COPY TO writes only the first six and \\; the others are read as the
// server would read them.
std::string_view unescape_copy_text(std::string_view raw, std::string& scratch) {
  std::size_t at = raw.find('\\');
  if (at == std::string_view::npos) return raw;
  scratch.assign(raw.data(), at);
  while (at < raw.size()) {
    const char c = raw[at++];
    if (c != '\\' || at == raw.size()) {
      scratch.push_back(c);
      continue;
    }
    const char e = raw[at++];
    switch (e) {
      case 'b': scratch.push_back('\b'); break;
      case 'f': scratch.push_back('\f'); break;
      case 'n': scratch.push_back('\n'); break;
      case 'r': scratch.push_back('\r'); break;
      case 't': scratch.push_back('\t'); break;
      case 'v': scratch.push_back('\v'); break;
      case 'x':
        if (at < raw.size() && hex_value(raw[at]) >= 0) {
          int v = hex_value(raw[at++]);
          if (at < raw.size() && hex_value(raw[at]) >= 0) v = v * 16 + hex_value(raw[at++]);
          scratch.push_back(static_cast<char>(v));
        } else {
          scratch.push_back('x');
        }
        break;
      default:
        if (e >= '0' && e <= '7') {
          int v = e - '0';
          for (int digits = 1; digits < 3 && at < raw.size() && raw[at] >= '0' && raw[at] <= '7'; ++digits)
            v = v * 8 + (raw[at++] - '0');
          scratch.push_back(static_cast<char>(v & 0xff));
        } else {
          scratch.push_back(e);
        }
    }
  }
  return scratch;
}

asio::awaitable<TableRows> describe_table(PgConnection& conn, const TableName& name) {
  TableRows t;
  t.name = name;
  t.quoted_table = conn.quote_identifier(name.schema) + "." + conn.quote_identifier(name.name);
  // Simple queries only: a walsender in database mode takes no other.
  auto rows = co_await conn.query(
      "SELECT a.attrelid::oid, a.attname, a.atttypid::oid, a.atttypmod FROM pg_catalog.pg_attribute a "
      "WHERE a.attrelid = " + conn.quote_literal(t.quoted_table) +
      "::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum");
  for (auto& row : rows.rows) {
    t.oid = static_cast<std::uint32_t>(std::strtoul(row[0].value_or("0").c_str(), nullptr, 10));
    auto& c = t.columns.emplace_back();
    c.name = row[1].value_or("");
    c.type_oid = static_cast<std::uint32_t>(std::strtoul(row[2].value_or("0").c_str(), nullptr, 10));
    c.type_modifier = static_cast<std::int32_t>(std::strtol(row[3].value_or("-1").c_str(), nullptr, 10));
    t.select_list += (t.select_list.empty() ? "" : ", ") + conn.quote_identifier(c.name);
  }
  co_return t;
}

asio::awaitable<std::uint64_t> estimate_rows(PgConnection& conn, const std::string& select) {
  auto plan = co_await conn.query("EXPLAIN " + select);
  if (plan.rows.empty() || plan.rows[0].empty() || !plan.rows[0][0]) co_return 0;
  const std::string& line = *plan.rows[0][0];
  auto at = line.find("rows=");
  co_return at == std::string::npos ? 0 : std::strtoull(line.c_str() + at + 5, nullptr, 10);
}

asio::awaitable<void> check_one_statement(asio::io_context& io, const Config& config, const std::string& select) {
  PgConnection conn(io);
  co_await conn.connect(config.conninfo(false), std::chrono::milliseconds(config.database_connect_timeout_ms));
  co_await conn.query("BEGIN READ ONLY");
  co_await conn.prepare(select, std::chrono::seconds(30));
  conn.close();  // the transaction ends with the connection
}

}  // namespace walrelay
