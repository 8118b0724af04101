// What walrelay reads from and writes to PostgreSQL's catalogs: the server
// checks shared by start-up and --check, the publication, and the slot
// marker. Catalog tables only, never the outbox; simple queries only, because
// a walsender in database mode speaks no other protocol.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string_view>
#include <string>
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it
#include <vector>

#include <boost/asio/awaitable.hpp>

#include <pgoutput/pgoutput.hpp>

#include "walrelay/config.hpp"
#include "walrelay/source/pg_connection.hpp"
#include "walrelay/sinks/sink.hpp"

namespace walrelay {

// A line of the publication's comment that records a slot walrelay created or
// used: `walrelay.slot=<name> created_lsn=<lsn> created_at=<time> system=<id>`.
// The marker lives in the database, not on the sidecar's disk, so that a
// restarted container can tell a lost slot from a first start.
struct SlotMarker {
  std::string slot;
  std::optional<pgoutput::Lsn> created_lsn;
  std::string created_at;   // ISO 8601, UTC
  std::string system;       // IDENTIFY_SYSTEM's systemid where it was written
  // `snapshot=pending`: an initial snapshot began and has not finished; the
  // slot, if there is one, is not yet safe to stream from alone.
  bool snapshot_pending = false;
  // `snapshot_xids=<xmin>:<xmax>:<xip,...>`: the pending snapshot's view of
  // the database at its consistent point (pg_current_snapshot()), recorded
  // as soon as the slot exists. A snapshot taken again reads only the rows
  // whose insert that view saw; the slot, kept, streams everything since.
  std::string snapshot_xids;
  // `snapshot_files=<hex>`: the outbox tables' files (pg_relation_filenode
  // of each table and partition) when the view was taken. A rewrite since
  // (ALTER TABLE ... TYPE, pg_repack, VACUUM FULL) gives rows new xmins,
  // which the view cannot judge.
  std::string snapshot_files;
  // `retention_floors=<oid>:<xid>,...`: per outbox table (a partition, for a
  // partitioned one; by pg_class oid), the xid from which on transactions
  // began while this slot was streamed, so that the slot carried their rows
  // (outbox_retention.hpp). Kept with the slot so that a restart or a
  // take-over may delete what an earlier run relayed; a new slot starts
  // without them.
  std::map<std::uint32_t, std::uint64_t> retention_floors;
  // `:<lineage>` after a floor: a hash of the xmins of the catalog rows that
  // put the table in the publication (pg_inherits, pg_publication_rel): when
  // it changes, the table was attached or published again since.
  std::map<std::uint32_t, std::uint32_t> retention_lineage;
  // `paused=<time>`: paused by an operator (POST /pause) at that time, ISO
  // 8601 UTC; kept here so that a restarted walrelay, or the standby that
  // takes the slot over, stays paused. Written only by write_pause.
  std::string paused_since;
  // `slot_view=<xmin>:<xmax>:<xip,...>`: the slot's view of the database at
  // its consistent point (pg_current_snapshot() in the transaction that
  // created it with USE_SNAPSHOT, kept for the slot's life). The slot streams
  // exactly the transactions that view does not see; the rows it sees were
  // committed before and were not streamed (the initial snapshot sends them,
  // if one is taken). The tables relayed when the slot was made get their
  // retention floors then (the view's xmin; 0 where an initial snapshot sent
  // every row the view saw), and a row the view sees is carried only in a
  // table whose floor is 0. Empty: not recorded (a slot made on a standby,
  // by an earlier version, or when the server could not export the view);
  // retention then gives tables floors from the time it first sees them.
  std::string slot_view;
  // `view_sent=true`: an initial snapshot sent every row slot_view sees, and
  // each was acknowledged (written when the snapshot finishes, unless a
  // snapshot.select.statement.overrides may have left rows out). Said for
  // the operator; the floors of 0 are what retention reads.
  bool view_sent = false;
  // `snapshot_filtered=true`, while pending: the snapshot reads its tables
  // through snapshot.select.statement.overrides, whose WHERE may leave rows
  // out. A start that finds it committed in Kafka knows so from here, not
  // from its own configuration.
  bool snapshot_filtered = false;

  // Whether the line records a slot (made, used or being snapshotted), not
  // just a pause asked for before walrelay ever recorded the slot.
  bool records_slot() const { return created_lsn || !created_at.empty() || snapshot_pending; }
};

// Now as the slot marker keeps times: ISO 8601, UTC, to the second.
std::string utc_now_iso();

// A pg_snapshot's text form (digits, two colons, commas) as its numbers:
// xmin, xmax, then the listed xids; nullopt when it is not one.
std::optional<std::vector<std::uint64_t>> parse_pg_snapshot(std::string_view text);
// Whether `text` is a pg_snapshot's text form, the only text a marker's
// snapshot_xids may hold.
bool is_pg_snapshot_text(std::string_view text);

// Parses the markers in a publication comment; other lines are the owner's.
std::vector<SlotMarker> parse_slot_markers(const std::string& comment);
// The comment with the marker for marker.slot added or replaced, every other
// line kept as it was.
std::string with_slot_marker(const std::string& comment, const SlotMarker& marker);

// Retention's floors (SlotMarker::retention_floors) for the outbox tables as
// they are now, and the slot incarnation they belong to.
struct RetentionFloors {
  std::map<std::uint32_t, std::uint64_t> floors;  // per table, or per partition of a partitioned one
  std::map<std::uint32_t, std::uint32_t> lineage;  // SlotMarker::retention_lineage
  std::string slot_identity;  // the marker's created_lsn and created_at ("": no marker)
  // The slot's view (SlotMarker::slot_view): a row it sees is carried only
  // in a table whose floor is 0. "": none.
  std::string slot_view;
  std::vector<std::string> added;       // the tables given a floor by this call,
  std::uint64_t candidate = 0;          // which is this xid
  std::optional<std::string> refused;   // why they could not be kept in the marker
};

// In one transaction under the marker's lock: each outbox table (each leaf
// partition) keeps the marker's floor (given when the slot was made, or by an
// earlier call), else `known`'s when it belongs to the same slot, else gets
// the xmax of a snapshot taken now (transactions from there on begin while
// the slot exists and is streamed by the caller); the
// marker is rewritten when that differs from what it holds. A role that may
// not write it gets the floors all the same, with `refused` set.
boost::asio::awaitable<RetentionFloors> settle_retention_floors(PgConnection& conn, const Config& config,
                                                                RetentionFloors known);

struct PublicationFacts {
  bool exists = false;
  bool via_root = false;                       // publish_via_partition_root
  bool publishes_insert = false;
  bool all_tables = false;                     // FOR ALL TABLES
  std::string comment;                         // where the slot markers live
  std::vector<std::string> missing_tables;     // configured tables it does not publish
  std::vector<std::string> leaf_named_tables;  // partitioned tables it would send under their leaves' names
  std::vector<std::string> column_list_gaps;   // "table: column" a column list leaves out (15+)
  std::vector<std::string> row_filtered;       // "table (WHERE ...)": a row filter on a relayed table (15+)
  bool publishes_generated = false;            // publish_generated_columns = stored (18+)
};

struct SlotFacts {
  bool exists = false;
  std::optional<std::string> plugin, database, wal_status;
  std::optional<pgoutput::Lsn> confirmed_flush_lsn;
  std::optional<std::int32_t> active_pid;
  bool failover = false;                       // a failover slot, synchronized to standbys (17+)
  // Why the server will not stream from it: wal_status lost (14+), a
  // recovery conflict (16+) or invalidation_reason (17+). Empty when usable.
  std::string invalid_reason;
};

struct ServerFacts {
  int version = 0;                             // PQserverVersion, e.g. 150010
  std::string system;                          // system identifier
  bool in_recovery = false;                    // a standby (decoding there needs 16+)
  std::vector<std::string> partitioned_tables; // configured tables that are partitioned
  std::vector<std::string> generated_mapped;   // "table column": mapped columns that are generated (18+)
  PublicationFacts publication;
  SlotFacts slot;
  std::optional<SlotMarker> marker;            // this slot's marker on the publication, when it records the slot
  std::string paused_since;                    // the marker's pause (SlotMarker::paused_since), or empty
};

// Reads the server, tables, publication, slot and marker. What prevents
// relaying every event is added to `problems`, naming the key and the fix;
// notes (`warnings`) do not prevent a start. `system` is the systemid from
// IDENTIFY_SYSTEM (empty on an ordinary connection).
boost::asio::awaitable<ServerFacts> inspect_server(PgConnection& conn, const Config& config, std::string system,
                                                   std::vector<std::string>& problems,
                                                   std::vector<std::string>& warnings);

// The publication problems that publication.autocreate.mode=filtered would
// repair, as messages; empty when the publication is fit to use as it is.
std::vector<std::string> publication_problems(const Config& config, const ServerFacts& facts);

// Why the slot cannot be streamed from as it is (invalidated, or missing
// although its marker says walrelay created it): what --reset-slot repairs.
std::optional<std::string> slot_problem(const Config& config, const ServerFacts& facts);

// publication.autocreate.mode=filtered: creates the publication, or alters it
// to publish exactly the configured tables, inserts, and partitioned tables
// under their root's name. No-op when it is fit already.
boost::asio::awaitable<void> ensure_publication(PgConnection& conn, const Config& config, const ServerFacts& facts);

// Adds or refreshes this slot's marker in the publication's comment, under an
// advisory lock so that two walrelays on one publication do not lose each
// other's lines. Throws PgError (SQLSTATE 42501 when walrelay's user does not
// own the publication).
boost::asio::awaitable<void> write_slot_marker(PgConnection& conn, const Config& config, const SlotMarker& marker);

// Records the operator's pause in this slot's marker (`paused_since`, empty
// for none), every other field kept as the comment holds it under the same
// lock; write_slot_marker in turn keeps the pause. Throws PgError as
// write_slot_marker does.
boost::asio::awaitable<void> write_pause(PgConnection& conn, const Config& config, const std::string& paused_since);

// At each session's start, whatever the retention policy: the marker's floors
// of tables this walrelay does not relay (taken out of table.include.list, or
// of the publication) are dropped. Their rows are not sent from now on; a
// floor kept would let those rows go once the table is relayed again.
boost::asio::awaitable<void> forget_other_floors(PgConnection& conn, const Config& config, const ServerFacts& facts);

// CREATE_REPLICATION_SLOT, with no time-out: the server waits for every
// running transaction to end before the slot is consistent. While it waits, a
// second connection logs what it waits for every few seconds. Returns the
// consistent point. use_snapshot: inside the caller's REPEATABLE READ
// transaction, which then sees the database as of that point (USE_SNAPSHOT).
boost::asio::awaitable<pgoutput::Lsn> create_slot(PgConnection& conn, const Config& config, bool use_snapshot = false);

// Where a slot began, for its marker: its view (SlotMarker::slot_view) and
// the floors it gives the tables relayed when it was made.
struct SlotOrigin {
  std::string view;
  bool view_sent = false;  // an initial snapshot sent the rows the view sees
  bool filtered = false;   // the snapshot read through an override's WHERE
  std::map<std::uint32_t, std::uint64_t> floors;   // SlotMarker::retention_floors
  std::map<std::uint32_t, std::uint32_t> lineage;  // SlotMarker::retention_lineage
};

// The marker without what vouches for a slot's rows (its view and the
// floors): written before a slot is made again, so that a stop half-way
// leaves nothing of the old slot's to judge the new one's rows by.
SlotMarker without_slot_view(SlotMarker marker);

// transaction_timeout (17+) off for this session: a slot's creation waits, in
// a transaction, for every transaction running when it began to end, and an
// initial snapshot reads in one transaction; cut by a time-out, the next try
// would only wait again.
boost::asio::awaitable<void> allow_long_transaction(PgConnection& conn);

// pg_current_snapshot() now, on a connection outside a transaction: taken
// before a slot is made, it tells the catalog changes (a table put in the
// publication) committed before the slot's creation began.
boost::asio::awaitable<std::string> snapshot_now(PgConnection& conn);

// The floors of a slot whose view is `view`, made after `before` was taken:
// each table (leaf partition) walrelay relays whose place in the publication
// `before` sees gets the view's xmin (the slot streamed every transaction of
// it the view does not see). Others get none here (retention gives them one
// when it first sees them).
boost::asio::awaitable<SlotOrigin> slot_origin(PgConnection& conn, const Config& config, const std::string& view,
                                               const std::string& before);

// origin once an initial snapshot sent the rows its view sees: floors of 0
// (every row of those tables carried), unless it read through a
// snapshot.select.statement.overrides (origin.filtered), which may have left
// rows out.
SlotOrigin snapshot_sent(SlotOrigin origin);

// create_slot on a primary, in a REPEATABLE READ READ ONLY transaction of its
// own with USE_SNAPSHOT, to read the slot's view at its consistent point
// (committed at once: no row is read). On a standby (in_recovery), or when
// the server cannot export the view (more unfinished transactions than a
// snapshot holds), the slot without it. Returns the consistent point;
// `origin` gets the view and the floors.
boost::asio::awaitable<pgoutput::Lsn> create_slot_with_view(PgConnection& conn, const Config& config, bool in_recovery,
                                                             SlotOrigin& origin);

// slot.failover on an existing slot made without it (17+):
// ALTER_REPLICATION_SLOT ... (FAILOVER true).
boost::asio::awaitable<void> make_failover_slot(PgConnection& conn, const Config& config);

// With slot.failover: whether the servers are set up to keep the slot across
// a failover. Asks the primary (synchronized_standby_slots) and each other
// host of database.hostname that is a standby (sync_replication_slots,
// hot_standby_feedback, primary_slot_name, dbname in primary_conninfo, the
// slot synchronized). What is missing goes to `problems`, what is not yet
// done to `notes`.
boost::asio::awaitable<void> check_failover_setup(PgConnection& conn, const Config& config, const ServerFacts& facts,
                                                  std::vector<std::string>& problems,
                                                  std::vector<std::string>& notes);

// The SQL that adds the marker by hand, for a user who owns the publication
// (or the primary's, when walrelay reads a standby); other lines are kept.
std::string marker_sql(const Config& config, const SlotMarker& marker);

// Records, before the slot is created for an initial snapshot, that a
// snapshot is under way (snapshot=pending), so that a start after a crash
// takes it again rather than stream from a slot whose snapshot is half sent.
boost::asio::awaitable<void> mark_snapshot_pending(PgConnection& conn, const Config& config, const ServerFacts& facts);
// Records, once the pending snapshot's slot exists, its consistent point and
// its view (pg_current_snapshot() in the snapshot's transaction).
boost::asio::awaitable<void> record_snapshot_view(PgConnection& conn, const Config& config, const ServerFacts& facts,
                                                  pgoutput::Lsn point, const std::string& files,
                                                  const SlotOrigin& origin);
// The SQL whose one value is the outbox tables' files now (a digest of
// pg_relation_filenode over each configured table and its partitions).
std::string table_files_sql(PgConnection& conn, const Config& config);

// Records this slot in the publication's comment; a missing privilege becomes
// an error that says how the owner can add the marker by hand. created_lsn:
// a slot just made (or whose snapshot just finished), where it began in
// `origin`; nullopt: the marker as facts hold it, or a new one.
boost::asio::awaitable<void> mark_slot(PgConnection& conn, const Config& config, const ServerFacts& facts,
                                       std::optional<pgoutput::Lsn> created_lsn, const SlotOrigin& origin);

// What --check found: problems prevent a start; notes say what a start would do.
struct CheckReport {
  std::vector<std::string> problems;
  std::vector<std::string> notes;
};

// --check: server settings, tables, publication, slot and broker metadata,
// without creating or changing anything.
boost::asio::awaitable<CheckReport> check_setup(boost::asio::io_context& io, const Config& config, Sink& sink);

// --reset-slot: the operator's explicit consent to a gap. Drops an
// invalidated slot, creates the slot anew and records it, and logs the LSN
// range whose events were skipped. A usable slot is left alone. Returns the
// process exit code.
// Exactly once: why a committed position cannot be trusted on this server,
// if it cannot: past the end of its WAL (xlogpos), or on a timeline that its
// history (TIMELINE_HISTORY's file, empty on timeline 1) left before it. The
// system identifier survives a restore from backup and a failover; LSNs do not.
std::optional<std::string> committed_position_problem(const Config& config, const CommittedPosition& committed,
                                                      std::optional<pgoutput::Lsn> xlogpos,
                                                      const std::string& timeline, const std::string& history);

boost::asio::awaitable<int> reset_slot(boost::asio::io_context& io, const Config& config);

}  // namespace walrelay
