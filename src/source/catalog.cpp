// Server checks, the publication and the slot marker (see catalog.hpp).
#include "walrelay/source/catalog.hpp"

#include "walrelay/exit_codes.hpp"
#include "walrelay/mutation.hpp"
#include "walrelay/sinks/sink_table.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <tuple>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace walrelay {
namespace asio = boost::asio;
using namespace std::chrono_literals;

std::string utc_now_iso() {
  auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

namespace {

constexpr std::string_view marker_key = "walrelay.slot=";

std::string join(const std::vector<std::string>& items, std::string_view sep = ", ") {
  std::string out;
  for (auto& i : items) {
    if (!out.empty()) out += sep;
    out += i;
  }
  return out;
}

std::string quoted_tables(const Config& config, PgConnection& conn) {
  std::vector<std::string> names;
  for (auto& t : config.table_include_list)
    names.push_back(conn.quote_identifier(t.schema) + "." + conn.quote_identifier(t.name));
  return join(names);
}

// The columns the Outbox Event Router reads, with the key that names each.
std::vector<std::pair<std::string, std::string>> mapped_columns(const Config& config) {
  std::vector<std::pair<std::string, std::string>> out{
      {"table.field.event.id", config.field_event_id},
      {"table.field.event.key", config.field_event_key},
      {"table.field.event.payload", config.field_event_payload},
      {"table.field.event.timestamp", config.field_event_timestamp},
  };
  if (config.routes_by_value())
    out.emplace_back("route.by.field", config.route_by_field);
  // With table.fields.additional.error.on.missing=false a placed column
  // the table lacks is left out of its records, not an error.
  if (config.additional_error_on_missing)
    for (auto& p : config.additional_placement) out.emplace_back("table.fields.additional.placement", p.column);
  out.emplace_back("table.field.event.headers", config.field_event_headers);
  if (config.cloudevents != CloudEventsMode::none) out.emplace_back("table.field.event.type", config.field_event_type);
  out.erase(std::remove_if(out.begin(), out.end(), [](auto& kv) { return kv.second.empty(); }), out.end());
  return out;
}

// `oid:xid[:lineage],...`; all or nothing: a floor edited by hand into
// something else is ignored (its tables get a new one, which only keeps more
// rows).
std::pair<std::map<std::uint32_t, std::uint64_t>, std::map<std::uint32_t, std::uint32_t>> parse_retention_floors(
    const std::string& text) {
  std::map<std::uint32_t, std::uint64_t> floors;
  std::map<std::uint32_t, std::uint32_t> lineages;
  std::istringstream items(text);
  std::string item;
  const auto digits = [](const std::string& s, std::size_t most) {
    return !s.empty() && s.size() <= most && s.find_first_not_of("0123456789") == std::string::npos;
  };
  while (std::getline(items, item, ',')) {
    std::vector<std::string> parts;
    std::istringstream fields(item);
    for (std::string field; std::getline(fields, field, ':');) parts.push_back(field);
    if (!item.empty() && item.back() == ':') return {};
    if (parts.size() < 2 || parts.size() > 3 || !digits(parts[0], 10) || !digits(parts[1], 19) ||
        std::stoull(parts[0]) > UINT32_MAX || (parts.size() == 3 && (!digits(parts[2], 10) ||
                                                                     std::stoull(parts[2]) > UINT32_MAX)))
      return {};
    const auto oid = static_cast<std::uint32_t>(std::stoull(parts[0]));
    floors[oid] = std::stoull(parts[1]);
    if (parts.size() == 3) lineages[oid] = static_cast<std::uint32_t>(std::stoull(parts[2]));
  }
  return {floors, lineages};
}

std::optional<pgoutput::Lsn> parse_lsn(const std::optional<std::string>& text) {
  if (!text) return std::nullopt;
  return pgoutput::Lsn::parse(*text);
}

}  // namespace

std::optional<std::vector<std::uint64_t>> parse_pg_snapshot(std::string_view text) {
  // xmin:xmax:xip,... with xmin <= xip < xmax, the xips ascending: what
  // pg_snapshot's input accepts, so that a marker edited by hand is ignored
  // here rather than failing every snapshot's query.
  std::vector<std::uint64_t> numbers;
  std::size_t colons = 0;
  std::uint64_t n = 0;
  bool digits = false;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    const char ch = i < text.size() ? text[i] : ',';
    if (ch >= '0' && ch <= '9') {
      if (n > (UINT64_MAX - 9) / 10) return std::nullopt;
      n = n * 10 + static_cast<std::uint64_t>(ch - '0');
      digits = true;
      continue;
    }
    if (ch != ':' && ch != ',') return std::nullopt;
    if (ch == ':' && ++colons > 2) return std::nullopt;
    const bool empty_xip_list = colons == 2 && numbers.size() == 2 && i == text.size();
    if (!digits && !empty_xip_list) return std::nullopt;
    if (digits) numbers.push_back(n);
    n = 0;
    digits = false;
    if (ch == ',' && colons < 2) return std::nullopt;
  }
  if (colons != 2 || numbers.size() < 2 || numbers[0] > numbers[1] || numbers[0] == 0) return std::nullopt;
  for (std::size_t i = 2; i < numbers.size(); ++i)
    if (numbers[i] < numbers[0] || numbers[i] >= numbers[1] || (i > 2 && numbers[i] <= numbers[i - 1]))
      return std::nullopt;
  return numbers;
}

bool is_pg_snapshot_text(std::string_view text) { return parse_pg_snapshot(text).has_value(); }

std::string table_files_sql(PgConnection& conn, const Config& config) {
  std::string trees;
  for (const auto& t : config.table_include_list) {
    // pg_partition_tree gives nothing for a table that is not partitioned.
    const std::string rel =
        conn.quote_literal(conn.quote_identifier(t.schema) + "." + conn.quote_identifier(t.name)) +
        "::pg_catalog.regclass";
    trees += std::string(trees.empty() ? "" : " UNION ") + "SELECT " + rel + " AS relid UNION SELECT relid FROM " +
             "pg_catalog.pg_partition_tree(" + rel + ")";
  }
  if (trees.empty()) return "SELECT ''";
  return "SELECT substr(md5(coalesce(string_agg(t.relid::oid::text || ':' || "
         "pg_catalog.pg_relation_filenode(t.relid)::text, ',' ORDER BY t.relid::oid), '')), 1, 16) FROM (" +
         trees + ") t";
}

std::vector<SlotMarker> parse_slot_markers(const std::string& comment) {
  std::vector<SlotMarker> out;
  std::istringstream lines(comment);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(marker_key, 0) != 0) continue;
    std::istringstream words(line);
    std::string word;
    SlotMarker m;
    while (words >> word) {
      auto eq = word.find('=');
      if (eq == std::string::npos) continue;
      auto key = word.substr(0, eq), value = word.substr(eq + 1);
      if (key == "walrelay.slot") m.slot = value;
      else if (key == "created_lsn") m.created_lsn = pgoutput::Lsn::parse(value);
      else if (key == "created_at") m.created_at = value;
      else if (key == "system") m.system = value;
      else if (key == "snapshot") m.snapshot_pending = value == "pending";
      else if (key == "snapshot_xids" && is_pg_snapshot_text(value)) m.snapshot_xids = value;
      else if (key == "snapshot_files" && !value.empty() &&
               value.find_first_not_of("0123456789abcdef") == std::string::npos)
        m.snapshot_files = value;
      else if (key == "retention_floors")
        std::tie(m.retention_floors, m.retention_lineage) = parse_retention_floors(value);
      else if (key == "slot_view" && is_pg_snapshot_text(value)) m.slot_view = value;
      else if (key == "view_sent") m.view_sent = value == "true";
      else if (key == "snapshot_filtered") m.snapshot_filtered = value == "true";
      else if (key == "paused" && value.size() <= 32 &&
               value.find_first_not_of("0123456789-:TZ") == std::string::npos)
        m.paused_since = value;
    }
    if (!m.slot.empty()) out.push_back(std::move(m));
  }
  return out;
}

std::string with_slot_marker(const std::string& comment, const SlotMarker& marker) {
  std::string line = std::string(marker_key) + marker.slot;
  if (marker.created_lsn) line += " created_lsn=" + marker.created_lsn->to_string();
  if (!marker.created_at.empty()) line += " created_at=" + marker.created_at;
  if (!marker.system.empty()) line += " system=" + marker.system;
  if (marker.snapshot_pending) line += " snapshot=pending";
  if (marker.snapshot_pending && !marker.snapshot_xids.empty()) line += " snapshot_xids=" + marker.snapshot_xids;
  if (marker.snapshot_pending && !marker.snapshot_files.empty()) line += " snapshot_files=" + marker.snapshot_files;
  if (marker.snapshot_pending && marker.snapshot_filtered) line += " snapshot_filtered=true";
  if (!marker.retention_floors.empty()) {
    line += " retention_floors=";
    for (auto it = marker.retention_floors.begin(); it != marker.retention_floors.end(); ++it) {
      line += (it == marker.retention_floors.begin() ? "" : ",") + std::to_string(it->first) + ":" +
              std::to_string(it->second);
      if (auto lineage = marker.retention_lineage.find(it->first); lineage != marker.retention_lineage.end())
        line += ":" + std::to_string(lineage->second);
    }
  }
  if (!marker.slot_view.empty()) {
    line += " slot_view=" + marker.slot_view;
    if (marker.view_sent) line += " view_sent=true";
  }
  if (!marker.paused_since.empty()) line += " paused=" + marker.paused_since;
  std::vector<std::string> kept;
  std::istringstream lines(comment);
  std::string l;
  bool replaced = false;
  while (std::getline(lines, l)) {
    auto markers = parse_slot_markers(l);
    if (!markers.empty() && markers[0].slot == marker.slot) {
      if (!replaced) kept.push_back(line);
      replaced = true;
      continue;
    }
    kept.push_back(l);
  }
  if (!replaced) kept.push_back(line);
  return join(kept, "\n");
}

asio::awaitable<void> make_failover_slot(PgConnection& conn, const Config& config) {
  std::string sql = "ALTER_REPLICATION_SLOT " + conn.quote_identifier(config.slot_name) + " (FAILOVER true)";
  spdlog::info("slot={} made a failover slot: {}", config.slot_name, sql);
  co_await conn.query(sql);
}

namespace {

// A server parameter's value as SHOW gives it ("" when there is none).
asio::awaitable<std::string> show_parameter(PgConnection& c, const std::string& name) {
  auto r = co_await c.query("SHOW " + name);
  co_return r.rows.empty() ? std::string() : r.rows[0][0].value_or("");
}

// The primary's part of a failover slot: synchronized_standby_slots names
// the physical slots of the standbys, which must exist and be in use.
asio::awaitable<void> check_synchronized_standby_slots(PgConnection& conn, std::vector<std::string>& problems,
                                                       std::vector<std::string>& notes) {
  auto synchronized = co_await show_parameter(conn, "synchronized_standby_slots");
  if (synchronized.empty())
    problems.push_back("slot.failover: synchronized_standby_slots is empty on the primary: set it to the physical "
                       "slot of each standby that may be promoted, or walrelay may confirm changes a promoted "
                       "standby's copy of the slot has not reached");
  std::vector<std::string> names;
  std::string item;
  std::istringstream in(synchronized);
  while (std::getline(in, item, ',')) {
    item.erase(0, item.find_first_not_of(" \""));
    item.erase(item.find_last_not_of(" \"") + 1);
    if (!item.empty()) names.push_back(item);
  }
  for (auto& name : names) {
    auto slot = co_await conn.query("SELECT active FROM pg_catalog.pg_replication_slots WHERE slot_type = 'physical' "
                                    "AND slot_name = " + conn.quote_literal(name));
    if (slot.rows.empty())
      problems.push_back("slot.failover: synchronized_standby_slots names " + name +
                         ", which is not a physical slot on the primary");
    else if (slot.rows[0][0] != "t")
      notes.push_back("physical slot " + name + " of synchronized_standby_slots is not in use: its standby is not "
                      "streaming, and logical decoding waits for it");
  }
}

// A standby's part of a failover slot (one host of database.hostname, as
// `one` names it): the settings that synchronize the slot, and its copy.
// Counts the host in `standbys` when it is a standby.
asio::awaitable<void> check_failover_standby(PgConnection& conn, const Config& one, const Config& config,
                                             int& standbys, std::vector<std::string>& problems,
                                             std::vector<std::string>& notes) {
  const std::string where = one.database_hostname + ":" + one.database_port;
  PgConnection other(conn.io());
  try {
    co_await other.connect(one.conninfo(false), std::chrono::milliseconds(config.database_connect_timeout_ms));
    auto recovery = co_await other.query("SELECT pg_catalog.pg_is_in_recovery()");
    if (recovery.rows.empty() || recovery.rows[0][0] != "t") co_return;  // another primary? not a standby
    ++standbys;
    if (co_await show_parameter(other, "sync_replication_slots") != "on")
      problems.push_back("slot.failover: standby " + where + " has sync_replication_slots off");
    if (co_await show_parameter(other, "hot_standby_feedback") != "on")
      problems.push_back("slot.failover: standby " + where + " has hot_standby_feedback off");
    if ((co_await show_parameter(other, "primary_slot_name")).empty())
      problems.push_back("slot.failover: standby " + where + " has no primary_slot_name");
    if ((co_await show_parameter(other, "primary_conninfo")).find("dbname") == std::string::npos)
      problems.push_back("slot.failover: standby " + where + "'s primary_conninfo names no dbname");
    auto synced = co_await other.query("SELECT synced, temporary FROM pg_catalog.pg_replication_slots WHERE "
                                       "slot_name = " + other.quote_literal(config.slot_name));
    if (synced.rows.empty())
      notes.push_back("standby " + where + " has no copy of slot " + config.slot_name + " yet");
    else if (synced.rows[0][1] == "t")
      notes.push_back("standby " + where + "'s copy of slot " + config.slot_name +
                      " is still temporary: it survives a promotion once the primary's slot has been consumed past "
                      "a running-transactions record");
  } catch (const PgError& e) {
    problems.push_back("slot.failover: could not check host " + where + ": " + e.what());
  }
}

}  // namespace

asio::awaitable<void> check_failover_setup(PgConnection& conn, const Config& config, const ServerFacts& facts,
                                           std::vector<std::string>& problems, std::vector<std::string>& notes) {
  if (!config.slot_failover || facts.version < 170000 || facts.in_recovery) co_return;
  if (facts.slot.exists && !facts.slot.failover)
    notes.push_back("slot " + config.slot_name + " is not a failover slot yet: walrelay will make it one at start");
  co_await check_synchronized_standby_slots(conn, problems, notes);

  // The other hosts of database.hostname: the standbys that may be promoted.
  std::vector<std::string> hosts, ports;
  {
    std::string item;
    std::istringstream h(config.database_hostname), p(config.database_port);
    while (std::getline(h, item, ',')) hosts.push_back(item);
    while (std::getline(p, item, ',')) ports.push_back(item);
  }
  const char* here_host = conn.raw() ? PQhost(conn.raw()) : nullptr;
  const char* here_port = conn.raw() ? PQport(conn.raw()) : nullptr;
  int standbys = 0;
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    Config one = config;
    one.database_hostname = hosts[i];
    one.database_port = ports.size() == hosts.size() ? ports[i] : ports.front();
    one.database_target_session_attrs = "any";
    if (here_host && here_port && hosts[i] == here_host && one.database_port == here_port) continue;
    co_await check_failover_standby(conn, one, config, standbys, problems, notes);
  }
  if (standbys == 0)
    notes.push_back("slot.failover: database.hostname names no standby to check; list the failover candidates "
                    "after the primary so that walrelay finds the new primary by itself");
}

std::string marker_sql(const Config& config, const SlotMarker& marker) {
  // Adds the line to whatever the comment holds, as write_slot_marker does.
  std::string line = with_slot_marker("", marker);
  std::string pub = config.publication_name;
  auto literal = [](const std::string& v) {
    std::string out = "'";
    for (char ch : v) out += ch == '\'' ? std::string("''") : std::string(1, ch);
    return out + "'";
  };
  return "DO $walrelay$ BEGIN EXECUTE format('COMMENT ON PUBLICATION %I IS %L', " + literal(pub) +
         ", concat_ws(E'\\n', (SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = " +
         literal(pub) + "), " + literal(line) + ")); END $walrelay$;";
}

namespace {

// The server itself: its version, whether it is a standby, and wal_level,
// against what walrelay (and a failover slot) needs.
asio::awaitable<void> inspect_version(PgConnection& conn, const Config& config, ServerFacts& facts,
                                      std::vector<std::string>& problems) {
  if (facts.version < 140000)
    problems.push_back("PostgreSQL " + std::to_string(facts.version / 10000) +
                       " is not supported: walrelay needs 14 or later");

  auto recovery = co_await conn.query("SELECT pg_catalog.pg_is_in_recovery()");
  facts.in_recovery = !recovery.rows.empty() && recovery.rows[0][0] == "t";
  if (facts.in_recovery && facts.version < 160000)
    problems.push_back("database.hostname: the server is a standby, and PostgreSQL " +
                       std::to_string(facts.version / 10000) +
                       " cannot decode on a standby (16 and later can): point walrelay at the primary");
  if (config.slot_failover && facts.version < 170000)
    problems.push_back("slot.failover: failover slots need PostgreSQL 17 or later; this server is " +
                       std::to_string(facts.version / 10000));
  if (config.slot_failover && facts.in_recovery)
    problems.push_back("slot.failover: the server is a standby; a failover slot is made on the primary and "
                       "synchronized to the standbys (several hosts in database.hostname find the primary)");

  auto wal_level = co_await conn.query("SHOW wal_level");
  auto level = wal_level.rows.empty() ? std::string("?") : wal_level.rows[0][0].value_or("?");
  if (level != "logical")
    problems.push_back("wal_level is " + level + ": set wal_level = logical in postgresql.conf and restart the server");
}

// The relayed tables: each exists, is a table or a partitioned one, and
// has the mapped columns as columns pgoutput sends.
// Retention compares its time column with now(): a time it must be, or every
// run would fail on the server.
void check_retention_column(const Config& config, const TableName& table, const PgRows& cols,
                            std::vector<std::string>& problems) {
  if (config.retention_policy != RetentionPolicy::delete_rows || config.retention_ms == 0) return;
  const bool own_key = !config.retention_time_column.empty();
  const std::string key = own_key ? "table.retention.time.column" : "table.retention.time.column (unset: "
                                                                    "table.field.event.timestamp)";
  const std::string column = own_key ? config.retention_time_column : config.field_event_timestamp;
  if (column.empty()) return;  // a configuration error (config.cpp)
  auto it = std::find_if(cols.rows.begin(), cols.rows.end(), [&](auto& r) { return r[0] == column; });
  if (it == cols.rows.end()) {
    problems.push_back(key + ": table " + table.qualified() + " has no column \"" + column + "\"");
    return;
  }
  const std::string type = (*it)[2].value_or("");
  if (type != "timestamp with time zone" && type != "timestamp without time zone" && type != "date")
    problems.push_back(key + ": column \"" + column + "\" of " + table.qualified() + " is " + type +
                       ", not a timestamp or a date: retention cannot tell a row's age by it");
}

// drop-partitions judges a partition by where its range ends: the table must
// be partitioned by range on one time column.
asio::awaitable<void> check_retention_partitioning(PgConnection& conn, const Config& config, const TableName& table,
                                                   const std::string& oid, std::vector<std::string>& problems) {
  if (config.retention_policy != RetentionPolicy::drop_partitions) co_return;
  auto key = co_await conn.query(
      "SELECT p.partstrat::text, p.partnatts::text, a.attname, a.atttypid::regtype::text FROM "
      "pg_catalog.pg_partitioned_table p LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = p.partrelid AND "
      "a.attnum = p.partattrs[0] WHERE p.partrelid = " + oid);
  const std::string prefix = "table.retention.policy: drop-partitions needs tables partitioned by range on one time "
                             "column; " + table.qualified();
  if (key.rows.empty()) {
    problems.push_back(prefix + " is not partitioned");
    co_return;
  }
  const auto& row = key.rows[0];
  const std::string type = row[3].value_or("");
  if (row[0] != "r" || row[1] != "1" || !row[2])
    problems.push_back(prefix + " is partitioned otherwise (strategy " + row[0].value_or("?") + ", " +
                       row[1].value_or("?") + " key column(s) or an expression)");
  else if (type != "timestamp with time zone" && type != "timestamp without time zone" && type != "date")
    problems.push_back(prefix + " is partitioned by \"" + *row[2] + "\", a " + type + ", not a time");
}

// The archive schema takes what retention removes: whole partitions
// (drop-partitions), or each deleted row, moved into a table of the outbox
// table's name there in the statement that deletes it (delete). A row the
// archive table cannot hold would fail every run, so its columns are checked
// here: every outbox column, of the same type (more columns are welcome, such
// as an archived_at with a default).
asio::awaitable<void> check_retention_archive(PgConnection& conn, const Config& config, const TableName& table,
                                              const std::string& oid, std::vector<std::string>& problems) {
  if (config.retention_archive_schema.empty()) co_return;
  const std::string& schema = config.retention_archive_schema;
  // (A replication connection: no parameters.)
  auto found = co_await conn.query("SELECT count(*)::text AS n FROM pg_catalog.pg_namespace WHERE nspname = " +
                                   conn.quote_literal(schema));
  if (found.at(0, "n") == "0") {
    problems.push_back("table.retention.archive.schema: schema \"" + schema + "\" does not exist (retention moves " +
                       (config.retention_policy == RetentionPolicy::drop_partitions ? "expired partitions"
                                                                                    : "the deleted rows") +
                       " there)");
    co_return;
  }
  if (config.retention_policy != RetentionPolicy::delete_rows) co_return;
  const std::string archive = conn.quote_identifier(schema) + "." + conn.quote_identifier(table.name);
  auto archive_oid = co_await conn.query(
      "SELECT c.oid::text AS oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
      "WHERE n.nspname = " + conn.quote_literal(schema) + " AND c.relname = " + conn.quote_literal(table.name) +
      " AND c.relkind IN ('r', 'p')");
  if (archive_oid.rows.empty()) {
    problems.push_back("table.retention.archive.schema: table " + archive + " does not exist; the rows deleted from " +
                       table.qualified() + " are moved there (CREATE TABLE " + archive + " (LIKE " +
                       conn.quote_identifier(table.schema) + "." + conn.quote_identifier(table.name) + "))");
    co_return;
  }
  auto unfit = co_await conn.query(
      "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) AS outbox_type, (SELECT "
      "pg_catalog.format_type(b.atttypid, b.atttypmod) FROM pg_catalog.pg_attribute b WHERE b.attrelid = " +
      archive_oid.at(0, "oid").value_or("0") + " AND b.attname = a.attname AND NOT b.attisdropped) AS archive_type "
      "FROM pg_catalog.pg_attribute a WHERE a.attrelid = " + oid + " AND a.attnum > 0 AND NOT a.attisdropped");
  for (const auto& row : unfit.rows) {
    if (row[1] == row[2]) continue;
    const std::string column = "\"" + row[0].value_or("") + "\"";
    problems.push_back("table.retention.archive.schema: " + archive +
                       (row[2] ? "'s column " + column + " is " + *row[2] + ", not " + row[1].value_or("")
                               : " has no column " + column + " (" + row[1].value_or("") + ")") +
                       " as in " + table.qualified() + ": the deleted rows could not be moved there");
  }
  // Its own columns are filled by their defaults: one that must be set and
  // has none would refuse every row.
  auto own = co_await conn.query(
      "SELECT b.attname FROM pg_catalog.pg_attribute b WHERE b.attrelid = " + archive_oid.at(0, "oid").value_or("0") +
      " AND b.attnum > 0 AND NOT b.attisdropped AND b.attnotnull AND NOT b.atthasdef AND b.attidentity = '' AND "
      "b.attgenerated = '' AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a WHERE a.attrelid = " + oid +
      " AND a.attname = b.attname AND NOT a.attisdropped)");
  for (const auto& row : own.rows)
    problems.push_back("table.retention.archive.schema: " + archive + "'s column \"" + row[0].value_or("") +
                       "\" is NOT NULL without a default, and " + table.qualified() + " has no such column to fill it");
}

asio::awaitable<void> inspect_tables(PgConnection& conn, const Config& config,
                                     const std::vector<std::pair<std::string, std::string>>& mapped,
                                     ServerFacts& facts, std::vector<std::string>& problems) {
  for (auto& t : config.table_include_list) {
    auto rel = co_await conn.query(
        "SELECT c.oid, c.relkind, c.relispartition FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = " + conn.quote_literal(t.schema) +
        " AND c.relname = " + conn.quote_literal(t.name));
    if (rel.rows.empty()) {
      problems.push_back("table.include.list: table " + t.qualified() + " does not exist");
      continue;
    }
    const std::string oid = rel.rows[0][0].value_or("0");
    const std::string relkind = rel.rows[0][1].value_or("");
    if (relkind == "p") facts.partitioned_tables.push_back(t.qualified());
    else if (relkind != "r")
      problems.push_back("table.include.list: " + t.qualified() + " is not a table (relkind " + relkind +
                         "): only tables and partitioned tables are published");
    // (A domain's base type for retention's time column.)
    auto cols = co_await conn.query("SELECT a.attname, a.attgenerated, (SELECT CASE WHEN t.typtype = 'd' THEN "
                                    "t.typbasetype ELSE t.oid END FROM pg_catalog.pg_type t WHERE t.oid = "
                                    "a.atttypid)::regtype::text FROM pg_catalog.pg_attribute a WHERE a.attrelid = " +
                                    oid + " AND a.attnum > 0 AND NOT a.attisdropped");
    check_retention_column(config, t, cols, problems);
    co_await check_retention_partitioning(conn, config, t, oid, problems);
    co_await check_retention_archive(conn, config, t, oid, problems);
    for (auto& [key, column] : mapped) {
      auto it = std::find_if(cols.rows.begin(), cols.rows.end(), [&](auto& r) { return r[0] == column; });
      if (it == cols.rows.end()) {
        problems.push_back(key + ": table " + t.qualified() + " has no column \"" + column + "\"");
      } else if (!(*it)[1].value_or("").empty()) {
        // Before 18, pgoutput never sends generated columns: the mapped
        // column would be missing from every row. 18 sends them when the
        // publication says so.
        if (facts.version < 180000)
          problems.push_back(key + ": column \"" + column + "\" of " + t.qualified() +
                             " is a generated column, which PostgreSQL " + std::to_string(facts.version / 10000) +
                             " does not publish; map a stored column instead");
        else
          facts.generated_mapped.push_back(t.qualified() + " column \"" + column + "\"");
      }
    }
  }
}

// The publication as it is: its settings, the relayed tables it holds (and
// their column lists and row filters), and the slot's marker in its comment.
asio::awaitable<void> inspect_publication(PgConnection& conn, const Config& config,
                                          const std::vector<std::pair<std::string, std::string>>& mapped,
                                          ServerFacts& facts, std::vector<std::string>& warnings) {
  auto pub = co_await conn.query(
      std::string("SELECT p.pubviaroot, p.pubinsert, p.puballtables, obj_description(p.oid, 'pg_publication'), ") +
      (facts.version >= 180000 ? "p.pubgencols = 's'" : "false") +
      " FROM pg_catalog.pg_publication p WHERE p.pubname = " + conn.quote_literal(config.publication_name));
  auto& pf = facts.publication;
  pf.exists = !pub.rows.empty();
  if (!pf.exists) co_return;
  pf.via_root = pub.rows[0][0] == "t";
  pf.publishes_insert = pub.rows[0][1] == "t";
  pf.all_tables = pub.rows[0][2] == "t";
  pf.comment = pub.rows[0][3].value_or("");
  pf.publishes_generated = pub.rows[0][4] == "t";
  const bool has_column_lists = facts.version >= 150000;
  for (auto& t : config.table_include_list) {
    bool partitioned = std::find(facts.partitioned_tables.begin(), facts.partitioned_tables.end(),
                                 t.qualified()) != facts.partitioned_tables.end();
    if (partitioned && !pf.via_root) {
      // pg_publication_tables would list the leaves: the root's name never
      // reaches walrelay, and every row would arrive under a leaf's name.
      pf.leaf_named_tables.push_back(t.qualified());
      continue;
    }
    auto in = co_await conn.query(
        std::string("SELECT ") + (has_column_lists ? "array_to_string(attnames, ','), rowfilter" : "NULL, NULL") +
        " FROM pg_catalog.pg_publication_tables WHERE pubname = " + conn.quote_literal(config.publication_name) +
        " AND schemaname = " + conn.quote_literal(t.schema) + " AND tablename = " + conn.quote_literal(t.name));
    if (in.rows.empty()) {
      pf.missing_tables.push_back(t.qualified());
      continue;
    }
    if (auto& attnames = in.rows[0][0]) {
      std::string list = "," + *attnames + ",";
      for (auto& [key, column] : mapped)
        if (list.find("," + column + ",") == std::string::npos)
          pf.column_list_gaps.push_back(t.qualified() + " column \"" + column + "\" (" + key + ")");
    }
    if (auto& filter = in.rows[0][1]) {
      warnings.push_back("publication " + config.publication_name + " filters the rows of " + t.qualified() +
                         " (WHERE " + *filter + "): rows it leaves out are never relayed");
      pf.row_filtered.push_back(t.qualified() + " (WHERE " + *filter + ")");
    }
  }
  for (const auto& m : parse_slot_markers(pf.comment)) {
    if (m.slot != config.slot_name) continue;
    facts.paused_since = m.paused_since;
    if (m.records_slot()) facts.marker = m;  // a line holding only a pause says nothing of the slot
  }
}

// The slot as it is: whether it exists, is in use, still valid, and is a
// pgoutput slot of the configured database.
asio::awaitable<void> inspect_slot(PgConnection& conn, const Config& config, ServerFacts& facts,
                                   std::vector<std::string>& problems) {
  std::string slot_columns = "plugin, database, active_pid, wal_status, confirmed_flush_lsn";
  if (facts.version >= 160000) slot_columns += ", conflicting";
  if (facts.version >= 170000) slot_columns += ", invalidation_reason, failover";
  auto slot = co_await conn.query("SELECT " + slot_columns + " FROM pg_catalog.pg_replication_slots WHERE slot_name = " +
                                  conn.quote_literal(config.slot_name));
  auto& sf = facts.slot;
  if (slot.rows.empty()) co_return;
  sf.exists = true;
  sf.plugin = slot.at(0, "plugin");
  sf.database = slot.at(0, "database");
  if (auto& pid = slot.at(0, "active_pid")) sf.active_pid = std::stoi(*pid);
  sf.wal_status = slot.at(0, "wal_status");
  sf.confirmed_flush_lsn = parse_lsn(slot.at(0, "confirmed_flush_lsn"));
  sf.failover = slot.at(0, "failover") == "t";
  if (auto& reason = slot.at(0, "invalidation_reason")) sf.invalid_reason = *reason;
  else if (slot.at(0, "conflicting") == "t") sf.invalid_reason = "recovery conflict";
  else if (sf.wal_status == "lost") sf.invalid_reason = "wal_status lost: max_slot_wal_keep_size exceeded";
  if (sf.plugin != "pgoutput")
    problems.push_back("slot.name: slot " + config.slot_name + " uses plugin " + sf.plugin.value_or("(physical)") +
                       ", not pgoutput");
  if (sf.database != config.database_dbname)
    problems.push_back("slot.name: slot " + config.slot_name + " belongs to database " +
                       sf.database.value_or("?") + ", not " + config.database_dbname);
}

}  // namespace

asio::awaitable<ServerFacts> inspect_server(PgConnection& conn, const Config& config, std::string system,
                                            std::vector<std::string>& problems, std::vector<std::string>& warnings) {
  ServerFacts facts;
  facts.version = conn.server_version();
  facts.system = std::move(system);
  co_await inspect_version(conn, config, facts, problems);
  const auto mapped = mapped_columns(config);
  co_await inspect_tables(conn, config, mapped, facts, problems);
  co_await inspect_publication(conn, config, mapped, facts, warnings);
  // Retention deletes what the slot carried past: a row the filter left out
  // would go without ever having been sent.
  if (config.retention_policy != RetentionPolicy::none)
    for (const auto& filtered : facts.publication.row_filtered)
      problems.push_back("table.retention.policy: publication " + config.publication_name + " filters the rows of " +
                         filtered + ": the rows it leaves out are never relayed, and retention would delete them; "
                         "remove the filter, or set table.retention.policy=none");
  co_await inspect_slot(conn, config, facts, problems);
  co_return facts;
}

std::optional<std::string> slot_problem(const Config& config, const ServerFacts& facts) {
  const auto& sf = facts.slot;
  if (sf.exists && !sf.invalid_reason.empty())
    return "slot.name: replication slot " + config.slot_name + " has been invalidated (" + sf.invalid_reason +
           "): the events it held are gone. To accept the gap, run walrelay --reset-slot once: it drops the slot, "
           "creates a new one and logs the LSN range that was skipped";
  if (sf.exists || !facts.marker) return std::nullopt;
  if (mutation::active(mutation::Break::dropped_slot_recreated)) return std::nullopt;
  const SlotMarker& m = *facts.marker;
  // A snapshot that never made its slot: it is made and the snapshot taken
  // (see Relay::initial_snapshot). One whose slot existed (its point and
  // view recorded) and is gone (a failover before the slot was synchronized,
  // a drop) held the events since that point that leave no row: a new slot
  // would skip them.
  if (m.snapshot_pending && (!m.created_lsn || m.snapshot_xids.empty())) return std::nullopt;
  if (m.snapshot_pending)
    return "slot.name: replication slot " + config.slot_name + " is missing, but the initial snapshot begun on " +
           m.created_at + " made it at " + m.created_lsn->to_string() +
           " (marker in the comment of publication " + config.publication_name +
           "). The snapshot would be taken again, but a new slot would skip the events committed since " +
           m.created_lsn->to_string() +
           " that left no row (rows deleted since, logical messages). Recover those events if you need them, then "
           "run walrelay --reset-slot once: the next start takes the snapshot with a new slot";
  return "slot.name: replication slot " + config.slot_name + " is missing, but walrelay created it" +
         (m.created_lsn ? " at " + m.created_lsn->to_string() : std::string()) +
         (m.created_at.empty() ? std::string() : " on " + m.created_at) +
         (m.system.empty() || m.system == facts.system
              ? std::string()
              : " in another cluster (system identifier " + m.system + ", this one is " + facts.system +
                    ": restored, upgraded or failed over?)") +
         " (marker in the comment of publication " + config.publication_name +
         "). A new slot would skip every event committed since the old one's last confirmed position. Recover "
         "those events if you need them, then run walrelay --reset-slot once to create the slot and accept the gap";
}

std::vector<std::string> publication_problems(const Config& config, const ServerFacts& facts) {
  std::vector<std::string> out;
  const auto& pf = facts.publication;
  const std::string name = "publication " + config.publication_name;
  if (!pf.exists) {
    out.push_back("publication.name: " + name + " does not exist");
    return out;
  }
  if (!pf.publishes_insert) out.push_back("publication.name: " + name + " does not publish inserts");
  if (!pf.missing_tables.empty()) out.push_back("publication.name: " + name + " does not publish " + join(pf.missing_tables));
  if (!pf.leaf_named_tables.empty())
    out.push_back("publication.name: " + name + " publishes the partitioned table(s) " + join(pf.leaf_named_tables) +
                  " under their partitions' names, which walrelay would not recognise as outbox rows; run ALTER "
                  "PUBLICATION " + config.publication_name + " SET (publish_via_partition_root = true)");
  if (!pf.column_list_gaps.empty())
    out.push_back("publication.name: the column list of " + name + " leaves out " + join(pf.column_list_gaps));
  if (!facts.generated_mapped.empty() && !pf.publishes_generated)
    out.push_back("publication.name: " + name + " does not publish generated columns, and " +
                  join(facts.generated_mapped) + " is one; run ALTER PUBLICATION " + config.publication_name +
                  " SET (publish_generated_columns = stored)");
  return out;
}

namespace {

// The statements that make the publication fit, as filtered mode runs them.
std::vector<std::string> publication_statements(PgConnection& conn, const Config& config, const ServerFacts& facts) {
  std::vector<std::string> out;
  const auto& pf = facts.publication;
  const std::string name = conn.quote_identifier(config.publication_name);
  const std::string tables = quoted_tables(config, conn);
  if (!pf.exists) {
    // publish_via_partition_root: rows of a partitioned outbox carry the
    // root's name whatever partition they land in, also partitions attached
    // later.
    // Messages only (no table): a publication of nothing, which pgoutput
    // still needs to be named.
    std::string sql = "CREATE PUBLICATION " + name + (tables.empty() ? std::string() : " FOR TABLE " + tables) +
                      " WITH (publish = 'insert', publish_via_partition_root = true" +
                      (facts.generated_mapped.empty() ? "" : ", publish_generated_columns = stored") + ")";
    out.push_back(sql);
    return out;
  }
  if (!pf.all_tables && !tables.empty() && (!pf.missing_tables.empty() || !pf.column_list_gaps.empty() ||
                         !pf.leaf_named_tables.empty())) {
    // filtered: the publication covers exactly the configured tables, whole.
    std::string sql = "ALTER PUBLICATION " + name + " SET TABLE " + tables;
    out.push_back(sql);
  }
  std::vector<std::string> options;
  if (!pf.publishes_insert) options.push_back("publish = 'insert'");
  if (!pf.via_root && !facts.partitioned_tables.empty()) options.push_back("publish_via_partition_root = true");
  if (!pf.publishes_generated && !facts.generated_mapped.empty()) options.push_back("publish_generated_columns = stored");
  if (!options.empty()) {
    std::string sql = "ALTER PUBLICATION " + name + " SET (" + join(options) + ")";
    out.push_back(sql);
  }
  return out;
}

}  // namespace

asio::awaitable<void> ensure_publication(PgConnection& conn, const Config& config, const ServerFacts& facts) {
  auto statements = publication_statements(conn, config, facts);
  if (facts.in_recovery && !statements.empty())
    // A standby takes no DDL: the publication comes from the primary.
    throw PgError("publication.name: the server is a standby (read-only); run on the primary: " +
                      join(statements, "; "),
                  "25006");
  for (auto& sql : statements) {
    spdlog::info("publication: {}", sql);
    co_await conn.query(sql);
  }
}

namespace {

// In a transaction begun by the caller: the lock every writer of the slot
// markers takes, then the publication's comment as it is under it (a row
// with NULL for no comment, none for no publication).
asio::awaitable<PgRows> locked_publication_comment(PgConnection& conn, const Config& config) {
  const std::string name = conn.quote_literal(config.publication_name);
  co_await conn.query("SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('walrelay.publication.' || " +
                      name + "))");
  co_return co_await conn.query(
      "SELECT obj_description(oid, 'pg_publication') FROM pg_catalog.pg_publication WHERE pubname = " + name);
}

// A marker transaction that failed: rolled back (a ROLLBACK that fails too is
// the connection's end, said by the first error), then that first error.
asio::awaitable<void> roll_back_and_rethrow(PgConnection& conn, std::exception_ptr failure) {
  try {
    co_await conn.query("ROLLBACK");
  } catch (const PgError&) {
  }
  std::rethrow_exception(failure);
}

}  // namespace

namespace {

// Rewrites this slot's marker line in one transaction under the markers'
// lock: `change` gets the line as the comment holds it (nullopt: none yet)
// and returns the line to write.
asio::awaitable<void> rewrite_marker(PgConnection& conn, const Config& config,
                                     std::function<SlotMarker(std::optional<SlotMarker>)> change) {
  co_await conn.query("BEGIN");
  std::exception_ptr failure;
  try {
    auto current = co_await locked_publication_comment(conn, config);
    if (current.rows.empty()) throw PgError("publication " + config.publication_name + " does not exist", "42704");
    const std::string comment = current.rows[0][0].value_or("");
    std::optional<SlotMarker> line;
    for (auto& m : parse_slot_markers(comment))
      if (m.slot == config.slot_name) line = std::move(m);
    co_await conn.query("COMMENT ON PUBLICATION " + conn.quote_identifier(config.publication_name) + " IS " +
                        conn.quote_literal(with_slot_marker(comment, change(std::move(line)))));
    co_await conn.query("COMMIT");
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure) co_await roll_back_and_rethrow(conn, failure);
}

}  // namespace

asio::awaitable<void> write_slot_marker(PgConnection& conn, const Config& config, const SlotMarker& marker) {
  co_await rewrite_marker(conn, config, [&marker](std::optional<SlotMarker> current) {
    SlotMarker out = marker;
    out.paused_since = current ? current->paused_since : std::string();  // the pause is write_pause's alone
    return out;
  });
}

asio::awaitable<void> write_pause(PgConnection& conn, const Config& config, const std::string& paused_since) {
  co_await rewrite_marker(conn, config, [&](std::optional<SlotMarker> current) {
    SlotMarker out = current.value_or(SlotMarker{});
    out.slot = config.slot_name;
    out.paused_since = paused_since;
    return out;
  });
}

namespace {

// The leaf tables of the outbox: each table, or each partition (at any depth)
// of a partitioned one (rows live there, and `tableoid` on a row names it),
// with whether the publication publishes it, and the newest xid8 that made
// it so: the pg_inherits rows that attach it (up to any ancestor), the
// publication's row for it or an ancestor (or its schema, or the publication
// itself when it is FOR ALL TABLES). Rows written before that were not
// published, whatever a floor kept from earlier says (a partition detached and
// attached again, a table taken out of the publication and put back).
struct OutboxLeaf {
  std::uint32_t oid = 0;
  std::string name;
  bool published = false;
  std::uint64_t member_since = 0;  // as an xid8; right only for a row made lately
  std::uint32_t lineage = 0;       // a hash of those rows' xmins: another value, other rows
};

asio::awaitable<std::vector<OutboxLeaf>> outbox_leaves(PgConnection& conn, const Config& config) {
  std::string trees;
  for (const auto& t : config.table_include_list) {
    const std::string rel =
        conn.quote_literal(conn.quote_identifier(t.schema) + "." + conn.quote_identifier(t.name)) +
        "::pg_catalog.regclass";
    trees += std::string(trees.empty() ? "" : " UNION ") + "SELECT " + rel + " AS relid UNION SELECT relid FROM " +
             "pg_catalog.pg_partition_tree(" + rel + ")";
  }
  std::vector<OutboxLeaf> out;
  if (trees.empty()) co_return out;
  const std::string now = "(SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint)";
  const auto xid8 = [&](const std::string& column) {
    return "(" + now + " - ((" + now + " % 4294967296 - " + column + "::text::bigint + 4294967296) % 4294967296))";
  };
  const std::string lineage = "(SELECT relid FROM pg_catalog.pg_partition_ancestors(c.oid) UNION SELECT c.oid)";
  const std::string schema_rows =
      conn.server_version() >= 150000
          ? "FROM pg_catalog.pg_publication_namespace pn WHERE pn.pnpubid = p.oid AND pn.pnnspid IN (SELECT "
            "a.relnamespace FROM pg_catalog.pg_class a WHERE a.oid IN " + lineage + ")"
          : std::string("FROM (SELECT NULL::xid AS xmin, 0::oid AS pnnspid) pn WHERE false");
  const std::string rel_rows =
      "FROM pg_catalog.pg_publication_rel pr WHERE pr.prpubid = p.oid AND pr.prrelid IN " + lineage;
  const std::string inherit_rows = "FROM pg_catalog.pg_inherits i WHERE i.inhrelid IN " + lineage;
  // Published: logged (an UNLOGGED partition writes no WAL, so the slot
  // sees none of its rows) and in the publication. The lineage also holds
  // the publication's own row (publish, publish_via_partition_root changed
  // and back: the inserts in between were skipped) and the table's file and
  // persistence (a rewrite gives every row a new xmin; SET UNLOGGED and back).
  auto rows = co_await conn.query(
      "SELECT c.oid::text, c.oid::regclass::text, (c.relpersistence = 'p' AND (EXISTS (SELECT 1 " + rel_rows +
      ") OR EXISTS (SELECT 1 " + schema_rows + ") OR coalesce(p.puballtables, false)))::text, GREATEST((SELECT max(" +
      xid8("pr.xmin") + ") " + rel_rows + "), (SELECT max(" + xid8("pn.xmin") + ") " + schema_rows +
      "), (SELECT max(" + xid8("i.xmin") + ") " + inherit_rows + "), " + xid8("p.xmin") + ", " + xid8("c.xmin") +
      ")::text, pg_catalog.hashtext(concat_ws('/', coalesce((SELECT string_agg(pr.xmin::text, ',' ORDER BY "
      "pr.prrelid) " + rel_rows + "), ''), coalesce((SELECT string_agg(pn.xmin::text, ',' ORDER BY pn.pnnspid) " +
      schema_rows + "), ''), coalesce((SELECT string_agg(i.xmin::text, ',' ORDER BY i.inhrelid) " + inherit_rows +
      "), ''), coalesce(p.xmin::text, ''), c.relfilenode::text, c.relpersistence::text))::bigint::text FROM "
      "pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_publication p ON p.pubname = " +
      conn.quote_literal(config.publication_name) + " WHERE c.oid IN (" + trees +
      ") AND c.relkind = 'r' ORDER BY c.oid");
  for (auto& row : rows.rows) {
    OutboxLeaf leaf;
    leaf.oid = static_cast<std::uint32_t>(std::stoul(row[0].value_or("0")));
    leaf.name = row[1].value_or("?");
    leaf.published = row[2] == "true";
    leaf.member_since = row[3] ? std::stoull(*row[3]) : 0;
    leaf.lineage = static_cast<std::uint32_t>(std::stoll(row[4].value_or("0")) & 0xffffffffLL);
    out.push_back(std::move(leaf));
  }
  co_return out;
}

}  // namespace

asio::awaitable<RetentionFloors> settle_retention_floors(PgConnection& conn, const Config& config,
                                                         RetentionFloors known) {
  RetentionFloors settled;
  co_await conn.query("BEGIN");
  std::exception_ptr failure;
  try {
    auto current = co_await locked_publication_comment(conn, config);
    const std::string comment = current.rows.empty() ? std::string() : current.rows[0][0].value_or("");
    std::optional<SlotMarker> marker;
    for (auto& m : parse_slot_markers(comment))
      if (m.slot == config.slot_name) marker = m;
    if (marker)
      settled.slot_identity = (marker->created_lsn ? marker->created_lsn->to_string() : std::string("-")) + "@" +
                              marker->created_at;
    // A pending snapshot's marker vouches for nothing yet: its floors are
    // the view's, and the rows the view saw are not all sent (a walrelay that
    // could not record the snapshot's end, or that gave it up, streams on).
    const bool vouches = marker && !marker->snapshot_pending;
    if (vouches) settled.slot_view = marker->slot_view;
    // (Named: g++ 12 frees a temporary of a coroutine twice.)
    const auto leaves = co_await outbox_leaves(conn, config);
    // Taken after the marker and the leaves were read: a slot made, or a
    // partition attached, since was made before now.
    auto now =
        co_await conn.query("SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text AS xmax");
    const std::uint64_t candidate = std::stoull(now.at(0, "xmax").value_or("0"));
    for (const auto& leaf : leaves) {
      if (!leaf.published) continue;  // the slot carries none of its rows: none may go
      std::optional<std::uint64_t> floor;
      std::optional<std::uint32_t> lineage;
      const auto kept = [&](const std::map<std::uint32_t, std::uint64_t>& floors,
                            const std::map<std::uint32_t, std::uint32_t>& lineages) {
        if (!floors.count(leaf.oid)) return false;
        floor = floors.at(leaf.oid);
        if (lineages.count(leaf.oid)) lineage = lineages.at(leaf.oid);
        return true;
      };
      if (!(vouches && kept(marker->retention_floors, marker->retention_lineage)) &&
          known.slot_identity == settled.slot_identity)
        kept(known.floors, known.lineage);
      if (!floor) {
        floor = candidate;
        settled.added.push_back(leaf.name);
        settled.candidate = candidate;
      } else if (lineage != leaf.lineage) {
        // Attached again, or published again, since the floor was given:
        // rows from before that were not published. From now on, not from
        // the change's xid: a transaction with a higher xid may have written
        // a row and committed before the change did.
        floor = std::max(*floor, candidate);
      }
      settled.floors[leaf.oid] = *floor;
      settled.lineage[leaf.oid] = leaf.lineage;
    }
    if (!marker) {
      settled.refused = "publication " + config.publication_name + " holds no marker for slot " + config.slot_name;
    } else if (vouches &&
               (marker->retention_floors != settled.floors || marker->retention_lineage != settled.lineage)) {
      marker->retention_floors = settled.floors;
      marker->retention_lineage = settled.lineage;
      co_await conn.query("SAVEPOINT floors");
      try {
        co_await conn.query("COMMENT ON PUBLICATION " + conn.quote_identifier(config.publication_name) + " IS " +
                            conn.quote_literal(with_slot_marker(comment, *marker)));
      } catch (const PgError& e) {
        if (e.sqlstate() != "42501" && e.sqlstate() != "25006") throw;
        settled.refused = e.what();
      }
      if (settled.refused) co_await conn.query("ROLLBACK TO SAVEPOINT floors");
    }
    co_await conn.query("COMMIT");
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure) co_await roll_back_and_rethrow(conn, failure);
  co_return settled;
}

asio::awaitable<void> forget_other_floors(PgConnection& conn, const Config& config, const ServerFacts& facts) {
  if (!facts.marker || facts.marker->retention_floors.empty()) co_return;
  // (Named: g++ 12 frees a temporary of a coroutine twice.)
  const auto leaves = co_await outbox_leaves(conn, config);
  std::set<std::uint32_t> relayed;
  for (const auto& leaf : leaves)
    if (leaf.published) relayed.insert(leaf.oid);
  bool other = false;
  for (const auto& [oid, floor] : facts.marker->retention_floors) other = other || !relayed.count(oid);
  if (!other) co_return;
  co_await conn.query("BEGIN");
  std::exception_ptr failure;
  try {
    auto current = co_await locked_publication_comment(conn, config);
    const std::string comment = current.rows.empty() ? std::string() : current.rows[0][0].value_or("");
    for (auto& m : parse_slot_markers(comment)) {
      if (m.slot != config.slot_name) continue;
      std::erase_if(m.retention_floors, [&](const auto& entry) { return !relayed.count(entry.first); });
      std::erase_if(m.retention_lineage, [&](const auto& entry) { return !relayed.count(entry.first); });
      co_await conn.query("COMMENT ON PUBLICATION " + conn.quote_identifier(config.publication_name) + " IS " +
                          conn.quote_literal(with_slot_marker(comment, m)));
      break;
    }
    co_await conn.query("COMMIT");
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure) co_await roll_back_and_rethrow(conn, failure);
  spdlog::info("slot={} retention floors of tables this walrelay does not relay forgotten (their rows now are not "
               "sent: should they be relayed again, they start from a new floor)",
               config.slot_name);
}

asio::awaitable<pgoutput::Lsn> create_slot(PgConnection& conn, const Config& config, bool use_snapshot) {
  // NOEXPORT_SNAPSHOT and USE_SNAPSHOT are the spellings every supported
  // version accepts; a failover slot (17+) needs the option list of 15 and later.
  std::string sql = "CREATE_REPLICATION_SLOT " + conn.quote_identifier(config.slot_name) + " LOGICAL pgoutput " +
                    (config.slot_failover ? (use_snapshot ? "(SNAPSHOT 'use', FAILOVER true)"
                                                          : "(SNAPSHOT 'nothing', FAILOVER true)")
                                          : (use_snapshot ? "USE_SNAPSHOT" : "NOEXPORT_SNAPSHOT"));
  spdlog::info("slot={} creating: {}", config.slot_name, sql);

  // The server makes the slot consistent only once every transaction running
  // when it started has ended: one long transaction can hold it for hours. A
  // time-out would cancel it and start over forever; instead say what it
  // waits for.
  struct Watch {
    bool done = false;
    asio::steady_timer timer;
    explicit Watch(asio::io_context& io) : timer(io) {}
  };
  auto watch = std::make_shared<Watch>(conn.io());
  asio::co_spawn(
      conn.io(),
      [watch, &config, &io = conn.io()]() -> asio::awaitable<void> {
        PgConnection side(io);
        auto started = std::chrono::steady_clock::now();
        while (!watch->done) {
          watch->timer.expires_after(5s);
          boost::system::error_code ec;
          co_await watch->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
          if (watch->done) break;
          try {
            if (!side.connected())
              co_await side.connect(config.conninfo(false), std::chrono::milliseconds(config.database_connect_timeout_ms));
            auto rows = co_await side.query(
                "SELECT count(*), min(xact_start)::text, (array_agg(pid ORDER BY xact_start))[1], "
                "(array_agg(state ORDER BY xact_start))[1] FROM pg_catalog.pg_stat_activity "
                "WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() AND backend_type = 'client backend'");
            auto waited = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started);
            if (!watch->done && !rows.rows.empty())
              spdlog::warn("slot={} still being created after {} s: the server waits for the transactions that were "
                           "running when it started to end; {} transaction(s) with an xid are running now, the oldest "
                           "since {} (pid {}, {})",
                           config.slot_name, waited.count(), rows.rows[0][0].value_or("?"),
                           rows.rows[0][1].value_or("?"), rows.rows[0][2].value_or("?"), rows.rows[0][3].value_or("?"));
          } catch (const PgError& e) {
            spdlog::debug("slot={} could not look at running transactions: {}", config.slot_name, e.what());
            side.close();
          }
        }
      },
      asio::detached);
  struct Done {
    std::shared_ptr<Watch> w;
    ~Done() {
      w->done = true;
      w->timer.cancel();
    }
  } done{watch};
  auto created = co_await conn.query(sql, {}, std::chrono::hours(24 * 365));
  auto point = created.at(0, "consistent_point");
  auto lsn = point ? pgoutput::Lsn::parse(*point) : std::nullopt;
  if (!lsn) throw PgError("could not create the replication slot: no consistent point in the answer", "");
  spdlog::info("slot={} created at consistent point {}", config.slot_name, lsn->to_string());
  co_return *lsn;
}

namespace {

// Whether a pg_snapshot's text sees transaction `xid` (an xid8) as ended:
// below its xmin, or below its xmax and not listed.
bool snapshot_sees(const std::string& snapshot, std::uint64_t xid) {
  const auto parsed = parse_pg_snapshot(snapshot);
  if (!parsed) return false;
  const auto& numbers = *parsed;
  if (xid < numbers[0]) return true;
  if (xid >= numbers[1]) return false;
  return std::find(numbers.begin() + 2, numbers.end(), xid) == numbers.end();
}

}  // namespace

asio::awaitable<void> allow_long_transaction(PgConnection& conn) {
  if (conn.server_version() >= 170000) co_await conn.query("SET transaction_timeout = 0");
}

SlotMarker without_slot_view(SlotMarker marker) {
  marker.retention_floors.clear();
  marker.retention_lineage.clear();
  marker.slot_view.clear();
  marker.view_sent = false;
  return marker;
}

asio::awaitable<std::string> snapshot_now(PgConnection& conn) {
  auto rows = co_await conn.query("SELECT pg_catalog.pg_current_snapshot()::text");
  std::string snapshot = rows.rows.empty() ? "" : rows.rows[0][0].value_or("");
  if (!is_pg_snapshot_text(snapshot)) throw PgError("could not read a snapshot: '" + snapshot + "'", "");
  co_return snapshot;
}

asio::awaitable<SlotOrigin> slot_origin(PgConnection& conn, const Config& config, const std::string& view,
                                        const std::string& before) {
  SlotOrigin origin;
  const auto view_numbers = parse_pg_snapshot(view);
  if (!view_numbers || !is_pg_snapshot_text(before)) co_return origin;
  origin.view = view;
  const std::uint64_t view_xmin = view_numbers->front();
  // (Named: g++ 12 frees a temporary of a coroutine twice.)
  const auto leaves = co_await outbox_leaves(conn, config);
  for (const auto& leaf : leaves) {
    // A table put in the publication (or attached) while the slot was being
    // made: a transaction the slot streams may have written to it before.
    if (!leaf.published || !snapshot_sees(before, leaf.member_since)) continue;
    origin.floors[leaf.oid] = view_xmin;
    origin.lineage[leaf.oid] = leaf.lineage;
  }
  co_return origin;
}

SlotOrigin snapshot_sent(SlotOrigin origin) {
  // An override's WHERE may have left rows out: those tables keep the
  // view's floor, and a row the view saw stays (held) there.
  if (origin.view.empty() || origin.filtered) return origin;
  origin.view_sent = true;
  for (auto& [oid, floor] : origin.floors) floor = 0;
  return origin;
}

asio::awaitable<pgoutput::Lsn> create_slot_with_view(PgConnection& conn, const Config& config, bool in_recovery,
                                                     SlotOrigin& origin) {
  origin = {};
  if (in_recovery) co_return co_await create_slot(conn, config);
  const std::string before = co_await snapshot_now(conn);
  co_await allow_long_transaction(conn);
  co_await conn.query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  std::exception_ptr failure;
  std::optional<pgoutput::Lsn> point;
  std::string view, too_large;
  try {
    point = co_await create_slot(conn, config, true);
    auto rows = co_await conn.query("SELECT pg_catalog.pg_current_snapshot()::text");
    view = rows.rows.empty() ? "" : rows.rows[0][0].value_or("");
    co_await conn.query("COMMIT");
  } catch (const PgError& e) {
    // "initial slot snapshot too large": more unfinished transactions
    // (aborted ones, subtransactions) between the view's bounds than a
    // snapshot holds. The slot is not made; made without a view, it only
    // keeps more rows from retention.
    if (!point && e.sqlstate() == "40001") too_large = e.what();
    failure = std::current_exception();
  } catch (...) {
    failure = std::current_exception();
  }
  if (failure && too_large.empty()) co_await roll_back_and_rethrow(conn, failure);
  if (failure) {
    try {
      co_await conn.query("ROLLBACK");
    } catch (const PgError&) {
    }
    spdlog::warn("slot={} could not export its view at the consistent point ({}): making it without one; retention "
                 "then holds the rows committed before its first run",
                 config.slot_name, too_large);
    co_return co_await create_slot(conn, config);
  }
  if (!is_pg_snapshot_text(view)) {
    spdlog::warn("slot={} could not read its view at the consistent point ('{}')", config.slot_name, view);
    co_return *point;
  }
  origin = co_await slot_origin(conn, config, view, before);
  co_return *point;
}

asio::awaitable<void> mark_slot(PgConnection& conn, const Config& config, const ServerFacts& facts,
                                std::optional<pgoutput::Lsn> created_lsn, const SlotOrigin& origin) {
  SlotMarker marker{config.slot_name, created_lsn, utc_now_iso(), facts.system, false, {}, {}, {}, {}, {}, {}, false};
  if (created_lsn) {
    marker.slot_view = origin.view;
    marker.view_sent = origin.view_sent;
    marker.retention_floors = origin.floors;
    marker.retention_lineage = origin.lineage;
  }
  if (!created_lsn && facts.marker) marker = *facts.marker;  // keep what the first start recorded
  marker.system = facts.system;
  marker.snapshot_pending = false;
  try {
    co_await write_slot_marker(conn, config, marker);
  } catch (const PgError& e) {
    if (e.sqlstate() != "42501" && e.sqlstate() != "25006") throw;
    // Not the owner, or a standby (read-only): someone else writes it once.
    throw PgError("could not record slot " + config.slot_name + " in the comment of publication " +
                      config.publication_name + " (" + e.what() +
                      "). walrelay keeps this marker in the database so that a restart can tell a lost slot from a "
                      "first start. " +
                      (e.sqlstate() == "25006" ? std::string("On the primary, run once: ")
                                               : std::string("Make walrelay's user the publication's owner, or "
                                                             "have the owner run: ")) +
                      marker_sql(config, marker),
                  "42501");
  }
  spdlog::info("slot={} recorded in the comment of publication {}", config.slot_name, config.publication_name);
}

asio::awaitable<void> mark_snapshot_pending(PgConnection& conn, const Config& config, const ServerFacts& facts) {
  SlotMarker marker{config.slot_name, std::nullopt, utc_now_iso(), facts.system, true, {}, {}, {}, {}, {}, {}, false};
  try {
    co_await write_slot_marker(conn, config, marker);
  } catch (const PgError& e) {
    if (e.sqlstate() != "42501" && e.sqlstate() != "25006") throw;
    // Without the marker a crash in the middle of the snapshot would look,
    // at the next start, like a slot to stream from: the rest of the rows
    // would never be sent.
    throw PgError("snapshot.mode: the initial snapshot needs to record its progress in the comment of publication " +
                      config.publication_name + " (" + e.what() + ")" +
                      (e.sqlstate() == "25006"
                           ? std::string(": take the snapshot on the primary")
                           : std::string(": make walrelay's user the publication's owner")),
                  "42501");
  }
  spdlog::info("slot={} initial snapshot recorded as pending in the comment of publication {}", config.slot_name,
               config.publication_name);
}

asio::awaitable<void> record_snapshot_view(PgConnection& conn, const Config& config, const ServerFacts& facts,
                                           pgoutput::Lsn point, const std::string& files,
                                           const SlotOrigin& origin) {
  SlotMarker marker{config.slot_name, point, utc_now_iso(), facts.system, true, origin.view, files, {}, {}, {}, {}, false};
  marker.slot_view = origin.view;
  marker.snapshot_filtered = origin.filtered;
  marker.retention_floors = origin.floors;
  marker.retention_lineage = origin.lineage;
  co_await write_slot_marker(conn, config, marker);
  spdlog::info("slot={} the initial snapshot's view at {} recorded in the comment of publication {}", config.slot_name,
               point.to_string(), config.publication_name);
}

asio::awaitable<CheckReport> check_setup(asio::io_context& io, const Config& config, Sink& sink) {
  CheckReport report;
  PgConnection conn(io);
  try {
    co_await conn.connect(config.conninfo(true), std::chrono::milliseconds(config.database_connect_timeout_ms));
    auto ident = co_await conn.query("IDENTIFY_SYSTEM");
    auto facts = co_await inspect_server(conn, config, ident.at(0, "systemid").value_or(""), report.problems,
                                         report.notes);
    if (auto p = slot_problem(config, facts)) report.problems.push_back(*p);
    for (auto& p : publication_problems(config, facts)) {
      if (config.publication_autocreate == PublicationAutocreate::disabled)
        report.problems.push_back(p + " (publication.autocreate.mode=disabled)");
      else
        report.notes.push_back(p + ": walrelay will create or alter it (publication.autocreate.mode=filtered)");
    }
    const bool snapshot = config.snapshot_mode != SnapshotMode::no_data;
    if (facts.marker && facts.marker->snapshot_pending)
      report.notes.push_back("slot " + config.slot_name + ": an initial snapshot began on " + facts.marker->created_at +
                             " and did not finish" +
                             (snapshot ? std::string(": walrelay will take the snapshot again from the start (the rows "
                                                     "its view saw) and stream from the kept slot")
                                       : std::string(": snapshot.mode=no_data, so walrelay will stream from the slot "
                                                     "without it")));
    else if (!facts.slot.exists && !facts.marker)
      report.notes.push_back("slot " + config.slot_name + " does not exist yet: walrelay will create it" +
                             (snapshot ? " and send the rows the outbox holds first (snapshot.mode)" : ""));
    else if (facts.slot.active_pid)
      report.notes.push_back("slot " + config.slot_name + " is active for PID " +
                             std::to_string(*facts.slot.active_pid) + ": walrelay would wait as a standby");
    co_await check_failover_setup(conn, config, facts, report.problems, report.notes);
    if (facts.slot.exists && !facts.marker && facts.publication.exists)
      report.notes.push_back("slot " + config.slot_name + " is not yet recorded in the comment of publication " +
                             config.publication_name + ": walrelay will record it at start");
  } catch (const PgError& e) {
    report.problems.push_back(std::string("database: ") + e.what());
  }
  try {
    sink.check_connectivity(config.database_connect_timeout_ms);
  } catch (const std::exception& e) {
    // The key a reader looks at first for the sink's address.
    const SinkKind* kind = find_sink_kind(config.sink_type);
    report.problems.push_back(std::string(kind ? kind->address_key : "sink.type") + ": " + e.what());
  }
  co_return report;
}

asio::awaitable<int> reset_slot(asio::io_context& io, const Config& config) {
  PgConnection conn(io);
  try {
    co_await conn.connect(config.conninfo(true), std::chrono::milliseconds(config.database_connect_timeout_ms));
    auto ident = co_await conn.query("IDENTIFY_SYSTEM");
    std::vector<std::string> problems, notes;
    auto facts = co_await inspect_server(conn, config, ident.at(0, "systemid").value_or(""), problems, notes);
    for (auto& p : publication_problems(config, facts))
      if (config.publication_autocreate == PublicationAutocreate::disabled) problems.push_back(p);
    if (!problems.empty()) {
      for (auto& p : problems) spdlog::error("--reset-slot: {}", p);
      co_return exit_failure;
    }
    if (config.publication_autocreate == PublicationAutocreate::filtered) co_await ensure_publication(conn, config, facts);
    if (facts.slot.exists && facts.slot.invalid_reason.empty()) {
      spdlog::info("slot={} exists and can be streamed from: nothing to reset", config.slot_name);
      const SlotOrigin unknown;  // (named: g++ 12 frees a temporary argument of a coroutine twice)
      if (!facts.marker) co_await mark_slot(conn, config, facts, std::nullopt, unknown);
      co_return exit_ok;
    }
    if (facts.marker && (!facts.marker->retention_floors.empty() || !facts.marker->slot_view.empty())) {
      // Before the slot goes: should this stop half-way, the next try finds
      // a slot and keeps the marker, whose floors and view must not vouch
      // for it.
      const SlotMarker cleared = without_slot_view(*facts.marker);  // (named: g++ 12 frees a temporary twice)
      co_await write_slot_marker(conn, config, cleared);
    }
    std::string from;
    if (facts.slot.exists) {
      from = facts.slot.confirmed_flush_lsn ? facts.slot.confirmed_flush_lsn->to_string() : std::string("?");
      spdlog::warn("slot={} dropping the invalidated slot ({}), confirmed up to {}", config.slot_name,
                   facts.slot.invalid_reason, from);
      co_await conn.query("DROP_REPLICATION_SLOT " + conn.quote_identifier(config.slot_name));
    } else {
      from = facts.marker && facts.marker->created_lsn
                 ? "its last confirmed position (unknown once dropped; at or after " +
                       facts.marker->created_lsn->to_string() + ", where it was created)"
                 : "its last confirmed position (unknown once dropped)";
    }
    if (facts.marker && facts.marker->snapshot_pending) {
      // The snapshot never finished: its rows are still owed. The next start
      // makes the slot and takes the snapshot (snapshot.mode=initial).
      co_await mark_snapshot_pending(conn, config, facts);
      spdlog::warn("slot={} reset by the operator: the initial snapshot begun on {} did not finish; the next start "
                   "with snapshot.mode=initial makes a new slot and takes it; events committed after {} that left "
                   "no row in the outbox are not relayed",
                   config.slot_name, facts.marker->created_at, from);
      co_return exit_ok;
    }
    SlotOrigin origin;
    auto created = co_await create_slot_with_view(conn, config, facts.in_recovery, origin);
    co_await mark_slot(conn, config, facts, created, origin);
    spdlog::warn("slot={} reset by the operator: events committed after {} and before {} were not relayed",
                 config.slot_name, from, created.to_string());
    co_return exit_ok;
  } catch (const PgError& e) {
    spdlog::error("--reset-slot: {}", e.what());
    co_return exit_failure;
  }
}

namespace {

// The switch point at which `history` (a timeline history file) says
// timeline `tli` ended, when it lists it.
std::optional<pgoutput::Lsn> switch_point(const std::string& history, long tli) {
  std::istringstream in(history);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    long id = 0;
    std::string lsn;
    if (!(fields >> id >> lsn) || id != tli) continue;
    return pgoutput::Lsn::parse(lsn);
  }
  return std::nullopt;
}

}  // namespace

// Exactly once: a committed position this server's history does not contain
// would make the relay skip new transactions as if they were in Kafka. The
// system identifier survives a restore from backup and a failover, so the
// LSN and the timeline are checked as well.
std::optional<std::string> committed_position_problem(const Config& config, const CommittedPosition& committed,
                                                      std::optional<pgoutput::Lsn> xlogpos, const std::string& timeline,
                                                      const std::string& history) {
  const std::string where = "offsets.storage.topic: the position committed for " + config.transactional_id() +
                            ", " + committed.end_lsn.to_string() +
                            (committed.timeline.empty() ? "" : " on timeline " + committed.timeline);
  const std::string way_out =
      ". walrelay will not skip new transactions by a position from another history. Once you know which events "
      "are in Kafka, run walrelay --reset-offsets once (it forgets the position; events from the slot's confirmed "
      "position on are then sent again, so some may be duplicates), then start walrelay again";
  if (xlogpos && committed.end_lsn > *xlogpos)
    return where + ", lies past the end of this server's WAL (" + xlogpos->to_string() + " on timeline " + timeline +
           "): the database was restored to an earlier point, or failed over to a standby that had not received it" +
           way_out;
  if (committed.timeline.empty() || committed.timeline == timeline) return std::nullopt;
  char* end = nullptr;
  const long tli = std::strtol(committed.timeline.c_str(), &end, 10);
  const long current = std::strtol(timeline.c_str(), nullptr, 10);
  if (end == committed.timeline.c_str() || tli > current)
    return where + ", is from a timeline this server (timeline " + timeline + ") has not reached" + way_out;
  auto point = switch_point(history, tli);
  if (!point)
    return where + ", is from a timeline that this server's history (timeline " + timeline + ") does not list" +
           way_out;
  if (committed.end_lsn > *point)
    return where + ", lies past " + point->to_string() + ", where this server's history left timeline " +
           committed.timeline + " (it is now on timeline " + timeline +
           "): those transactions are not in this server's history" + way_out;
  return std::nullopt;
}

}  // namespace walrelay
