// The relay: one replication session at a time, outbox rows to the sink, and
// the slot confirmed only as far as the ledger allows. Everything runs on one
// io_context thread, so none of it needs a lock.
#pragma once

#include <array>
#include <chrono>
#include <utility>  // before Boost 1.74 asio: its awaitable.hpp needs std::exchange
#include <cstdint>
#include <deque>
#include <optional>
#include <regex>
#include <stdexcept>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <pgoutput/pgoutput.hpp>

#include "walrelay/config.hpp"
#include "walrelay/sinks/dead_letter.hpp"
#include "walrelay/exit_codes.hpp"
#include "walrelay/lsn_ledger.hpp"
#include "walrelay/admin/metrics.hpp"
#include "walrelay/route/outbox_mapper.hpp"
#include "walrelay/source/pg_connection.hpp"
#include "walrelay/route/schema_registry.hpp"
#include "walrelay/sinks/sink.hpp"
#include "walrelay/source/outbox_retention.hpp"
#include "walrelay/source/slot_monitor.hpp"
#include "walrelay/admin/status.hpp"

namespace walrelay {

struct DeadLetter;
struct ServerFacts;

// A condition the replication session cannot recover from by reconnecting:
// the relay halts on it.
struct Fatal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The files that implement it, one job each:
//   relay.cpp           lifecycle, the reconnect policy, the replication session and its read loop
//   relay_dispatch.cpp  what each replication message and each delivery report does
//   relay_status.cpp    what the relay reports about itself (gauges, /slot, /readyz)
//   relay_snapshot.cpp  the initial snapshot: the rows already in the outbox, once
//   relay_control.cpp   the operator's pause and resume, and what a restart carries over
// with catalog.cpp (server checks, publication, slot marker), slot_monitor.cpp
// (the server's view of the slot) and dead_letter.cpp beside them.
class Relay final : public StatusSource {
 public:
  Relay(boost::asio::io_context& io, const Config& config, Metrics& metrics, Sink& sink);
  ~Relay() override;

  // Starts the replication session and the slot monitor on the io_context.
  void start();
  // SIGTERM/SIGINT: stop reading, wait for in-flight acks (bounded), send the
  // final status update, then stop the io_context.
  void request_stop();
  // Valid once the io_context has stopped.
  int exit_code() const { return exit_code_; }

  // POST /pause: no more WAL is read once the transaction being read ends;
  // what is in flight settles and is confirmed, status updates go on (the
  // walsender keeps the slot held and does not time out). Recorded in the
  // slot marker, so that a restart or a standby taking over stays paused. A
  // pause asked for before or in the initial snapshot waits for its end.
  // Both return why they are refused (a standby: the walrelay that holds
  // the slot decides), or nullopt.
  std::optional<std::string> pause(const std::string& who);
  // POST /resume: reading goes on from where it stopped.
  std::optional<std::string> resume(const std::string& who);
  // Why POST /restart is refused now (a lost slot: a new session would make
  // a new one and skip events), or nullopt.
  std::optional<std::string> restart_refused() const;
  bool failed() const { return state_ == RelayState::halted; }
  // POST /restart: ends this session as a stop does (in-flight records
  // settle up to shutdown.timeout.ms); the daemon then builds the next one,
  // with new connections, from the slot's (or offsets topic's) position.
  void request_restart(const std::string& who);
  bool restart_requested() const { return restart_requested_; }
  // The pause as one generation of the daemon hands it to the next.
  struct PauseRequest {
    bool paused = false;
    std::string since;       // ISO 8601 UTC
    std::string by;          // who asked
    bool unrecorded = false; // not in the slot marker yet: the next generation writes it
    // The slot this process streamed from ("database/slot"): a next
    // generation that finds it missing knows it was dropped, not new.
    std::string streamed_slot;
  };
  PauseRequest pause_request() const;
  void carry_pause(const PauseRequest& carried);

  StatusSnapshot status() const override;

 private:
  enum class Step { done, retry, stop };  // outcome of handling one CopyData message

  // What the read loop does next. The three waits are the only places it
  // blocks, and each says what it waits for.
  enum class ReadState {
    buffered,          // read what libpq has buffered
    refill,            // the buffer was empty: read the socket once without blocking
    buffered_refilled, // read the buffer again after that read
    await_socket,      // nothing to read: until the socket is readable or the status tick
    await_acks,        // max.inflight.records or .bytes reached: until deliveries make room
    await_queue,       // the producer's queue refused a record: offer it again shortly
    await_resume,      // paused (POST /pause) at a transaction boundary: until resumed
  };
  // A replication message the producer refused (queue full), kept to offer again.
  struct HeldMessage {
    char* data = nullptr;
    int size = 0;
    HeldMessage() = default;
    HeldMessage(const HeldMessage&) = delete;
    HeldMessage& operator=(const HeldMessage&) = delete;
    ~HeldMessage() { reset(); }
    explicit operator bool() const { return data != nullptr; }
    std::span<const std::byte> bytes() const { return {reinterpret_cast<const std::byte*>(data), std::size_t(size)}; }
    void reset();
  };
  // When the session last heard from the server and owes it a status update.
  struct SessionClock {
    std::chrono::steady_clock::time_point next_status;
    std::chrono::steady_clock::time_point pinged_at{};    // the last update that asked for a reply
    std::chrono::steady_clock::time_point last_status{};  // the last update sent
  };

  // relay.cpp
  boost::asio::awaitable<void> run();
  boost::asio::awaitable<void> session();
  boost::asio::awaitable<void> renew_taken_over_producer();
  void replay_after_session(bool streamed);
  boost::asio::awaitable<void> prepare(PgConnection& conn);
  boost::asio::awaitable<ServerFacts> check_source(PgConnection& conn, const std::string& system);
  void rebase_on_new_server(const SourceIdentity& source, const ServerFacts& facts);
  boost::asio::awaitable<bool> prepare_slot(PgConnection& conn, const ServerFacts& facts, const SourceIdentity& source,
                                            std::optional<pgoutput::Lsn>& wal_reached);
  boost::asio::awaitable<std::string> start_replication(PgConnection& conn);
  boost::asio::awaitable<std::optional<pgoutput::Lsn>> wal_end_now();
  boost::asio::awaitable<void> take_over_position(PgConnection& conn, const SourceIdentity& source,
                                                  const ServerFacts& facts, std::optional<pgoutput::Lsn> wal_reached,
                                                  const std::string& history);
  boost::asio::awaitable<void> stream(PgConnection& conn);
  boost::asio::awaitable<std::optional<CommittedPosition>> recover_position(PgConnection& conn,
                                                                            const SourceIdentity& source);
  void slot_ahead_of(const ServerFacts& facts, const CommittedPosition& committed);
  void commit_position_if_behind(std::chrono::steady_clock::time_point now);
  boost::asio::awaitable<void> record_slot(PgConnection& conn, const ServerFacts& facts,
                                           std::optional<pgoutput::Lsn> created_lsn, const SlotOrigin& origin);
  boost::asio::awaitable<void> forget_floors(PgConnection& conn, const ServerFacts& facts);
  boost::asio::awaitable<void> keep_alive(PgConnection& conn);
  int read_buffered(PgConnection& conn, HeldMessage& held);
  boost::asio::awaitable<void> await_socket(PgConnection& conn);
  void note_messages(PgConnection& conn, int handled);
  void arm_tick(std::chrono::steady_clock::time_point at);
  void status_soon();
  boost::asio::awaitable<void> hold_back(std::chrono::milliseconds at_most);
  void note_backpressure(bool on);
  boost::asio::awaitable<void> send_status(PgConnection& conn, bool reply_requested);
  pgoutput::Lsn confirmable() const;
  boost::asio::awaitable<void> drain(PgConnection* conn);
  boost::asio::awaitable<void> sleep(std::chrono::milliseconds duration);
  // cause: walrelay_halted's reason label (record, stream, slot, source,
  // producer, internal).
  void halt(std::string reason, std::string_view cause, int exit_code = exit_halted);
  boost::asio::awaitable<void> stay_halted();
  void begin_stop();
  // The pause: whether reads stop before the next message, its record in
  // the slot marker, and the marker's pause adopted at a session's start.
  bool paused_now() const { return pause_.requested && !txn_; }
  void record_pause();
  boost::asio::awaitable<void> persist_pause();
  void adopt_pause(const std::string& marked_since);
  void note_paused();
  boost::asio::awaitable<void> wind_down();
  // A fatal producer error halts; a fence (another walrelay took over the
  // transactional producer) stops with exit 1, to come back as a standby.
  void check_producer();
  void replay(std::string reason);
  void set_state(RelayState state, std::string reason = {});
  bool has_room() const;
  // Whether the sink takes records now: a transactional one not while it aborts.
  bool sink_accepting() const { return !transactional_ || transactional_->accepting(); }
  std::string context() const;

  // relay_snapshot.cpp
  // Exactly once: commits the snapshot's Kafka transaction at `point`.
  void commit_snapshot_transaction(pgoutput::Lsn point);
  // Exactly once: a Fatal once the snapshot nears the transaction time-out.
  void check_snapshot_deadline();
  // Creates the slot inside a REPEATABLE READ transaction that uses its
  // snapshot, sends every row of the outbox tables that the snapshot sees,
  // and waits until each is acknowledged. nullopt: stopped or halted first.
  // `source` names the committed position in exactly-once mode.
  boost::asio::awaitable<std::optional<pgoutput::Lsn>> initial_snapshot(PgConnection& conn, const ServerFacts& facts,
                                                                        const SourceIdentity& source);
  struct SnapshotTable;  // relay_snapshot.cpp
  boost::asio::awaitable<std::string> lock_snapshot(PgConnection& conn, const ServerFacts& facts);
  boost::asio::awaitable<std::optional<pgoutput::Lsn>> snapshot_in_kafka(PgConnection& conn, const ServerFacts& facts,
                                                                         const SourceIdentity& source,
                                                                         const std::string& lock_key);
  boost::asio::awaitable<std::string> begin_snapshot_retake(PgConnection& conn, const ServerFacts& facts,
                                                            pgoutput::Lsn point);
  boost::asio::awaitable<std::string> first_view_unusable(PgConnection& conn, const ServerFacts& facts);
  boost::asio::awaitable<pgoutput::Lsn> begin_snapshot_with_slot(PgConnection& conn, const ServerFacts& facts);
  boost::asio::awaitable<std::string> first_view_filter(PgConnection& conn, const std::string& first_view);
  boost::asio::awaitable<void> plan_snapshot(PgConnection& conn, const std::string& visible_at_point,
                                             std::vector<SnapshotTable>& tables);
  void snapshot_select(PgConnection& conn, const TableName& name, const std::string& visible_at_point,
                       SnapshotTable& t) const;
  void start_snapshot_progress(pgoutput::Lsn point, const std::vector<SnapshotTable>& tables);
  boost::asio::awaitable<void> send_snapshot(PgConnection& conn, const std::vector<SnapshotTable>& tables,
                                             pgoutput::Lsn point);
  boost::asio::awaitable<std::optional<pgoutput::Lsn>> finish_snapshot(PgConnection& conn, const ServerFacts& facts,
                                                                       pgoutput::Lsn point,
                                                                       const std::string& lock_key);
  boost::asio::awaitable<void> snapshot_table(PgConnection& conn, const SnapshotTable& table, pgoutput::Lsn point);
  // Hands one decoded snapshot row to the mapper and the sink, waiting for
  // room as the stream does. false: stopped, halted or replaying.
  boost::asio::awaitable<bool> snapshot_row(std::span<const std::byte> insert, pgoutput::Lsn point);
  void log_snapshot_progress(bool force);

  // relay_dispatch.cpp
  Step handle_copy_data(std::span<const std::byte> data);
  Step handle_message(const pgoutput::XLogData& xlog);
  Step relay_insert(const pgoutput::Insert& insert, pgoutput::Lsn lsn);
  Step skip_insert(const pgoutput::Insert& insert, pgoutput::Lsn lsn);
  Step invalid_operation(std::uint32_t relation_oid, pgoutput::Lsn lsn);
  Step dead_letter_row(const pgoutput::Insert& insert, const MapError& error, pgoutput::Lsn lsn);
  // Hands record_ (mapped) to the sink inside the open transaction.
  Step submit_record();
  // A logical message: an outbox event if its prefix is included.
  Step on_logical_message(const pgoutput::LogicalMessage& message);
  Step dead_letter_message(const pgoutput::LogicalMessage& message, const MapError& error);
  // record_'s value by its registered schema: nullopt when encoded (or no
  // registry), Step::retry while the schema is not here, or the mapping error.
  std::optional<MapError> encode_value(Step& pending);
  // errors.tolerance: halts (false) or logs where the dead-letter copy goes.
  bool tolerate(const std::string& what, std::string_view subject, const MapError& error);
  // Hands a dead-letter copy to the sink inside the open transaction.
  Step submit_dead_letter(const DeadLetter& dead);
  // The include-list entry for a message prefix (counting the skipped ones).
  struct PrefixSource {
    int source = -1;                        // index in message_prefixes_, -1: not an outbox prefix
    prometheus::Counter* skipped = nullptr; // walrelay_skipped_messages_total{prefix}
  };
  PrefixSource& prefix_source(std::string_view prefix);
  void on_delivery(const Delivery& delivery);
  // A record failed for good and errors.tolerance does not take it: halts,
  // and in exactly-once mode aborts the open Kafka transaction, whose later
  // source transactions would otherwise commit past the record.
  void halt_on_record(std::string reason);
  void dead_letter_refused(const Delivery& delivery, const std::string& where);
  // Hands the waiting dead-letter copies to the sink, in order, as far as it
  // takes them; tries again shortly while some wait.
  void send_waiting_dead_letters();
  void check_ledger();
  prometheus::Counter& relayed_counter(std::uint16_t table, std::string_view topic);

  // relay_status.cpp
  struct Lag {
    pgoutput::Lsn wal_end;            // the server's WAL position
    std::uint64_t bytes = 0;          // wal_end - the slot's confirmed_flush_lsn
    std::uint64_t retained_bytes = 0; // wal_end - the slot's restart_lsn (0 until the monitor answers)
    double seconds = 0;               // age of the oldest unacknowledged commit
  };
  Lag lag() const;
  void update_gauges() const;
  std::string halt_action() const;

  // A record's token: the ledger's transaction id and the table's index for
  // the per-table counter, so a delivery report needs no lookup structure.
  static std::uint64_t make_token(LsnLedger::TxnId txn, std::uint16_t table) { return (txn << 16) | table; }
  static LsnLedger::TxnId token_txn(std::uint64_t token) { return token >> 16; }
  static std::uint16_t token_table(std::uint64_t token) { return static_cast<std::uint16_t>(token & 0xffff); }
  // Marks the reports a mutation build ignores (tests/mutation/run.sh).
  static constexpr std::uint16_t mutation_ignored_table = 0xffff;
  // Records handled in one go before the loop lets other handlers run.
  static constexpr int read_batch = 2048;
  // Messages from one socket read above which the next read is tried before
  // waiting (a one-row transaction is 3 or 4: Begin, Relation, Insert, Commit).
  static constexpr int busy_read = 16;
  // Bulk reading: while bulk_messages or more arrive per bulk_window (a
  // rate, over TCP), the socket wakes the loop only once bulk_low_water bytes
  // are queued, and the tick within bulk_delay at the latest. A walsender sends each change as
  // soon as it is decoded, so a loop that keeps up is woken for a few events
  // at a time, and both ends pay for every wake-up (docs/benchmarks.md,
  // "Wake-ups: where the swing comes from"). Below that rate (6,400 messages/s: some
  // 2,000 one-row transactions) nothing waits.
  static constexpr int bulk_messages = 64;
  static constexpr std::chrono::milliseconds bulk_window{10};
  static constexpr std::chrono::microseconds bulk_delay{1000};
  static constexpr int bulk_low_water = 16 * 1024;

  boost::asio::io_context& io_;
  const Config& config_;
  Metrics& metrics_;
  Sink& sink_;
  TransactionalSink* transactional_;  // sink_'s exactly-once side, or null
  OutboxMapper mapper_;
  // value.converter naming a schema registry's converter: encodes record_'s value.
  std::unique_ptr<SchemaEncoder> schema_encoder_;
  OutboxRecord record_;                   // reused for every row
  LsnLedger ledger_;
  pgoutput::Decoder decoder_{1};
  PgConnection conn_;
  SlotMonitor slot_monitor_;
  OutboxRetention retention_;  // table.retention.policy: cleans while this walrelay streams

  RelayState state_ = RelayState::starting;
  std::string state_reason_;
  bool stop_requested_ = false;
  std::optional<std::string> halt_reason_;
  std::string halt_cause_;                // walrelay_halted's reason label
  std::string halt_where_;                // context() when it halted
  int halt_exit_code_ = exit_halted;
  bool restart_requested_ = false;        // POST /restart: the stop ends in the next generation
  bool holds_slot_ = false;               // streamed since the last standby wait: pause and resume are ours
  std::int64_t state_since_unix_ms_ = 0;  // when state_ last changed (/status)
  std::string worker_id_;                 // host:pid (/status)
  struct Pause {
    bool requested = false;               // asked for (or adopted from the slot marker)
    std::string since, by;
    bool unrecorded = false;              // the slot marker does not hold the request yet
    std::string record_error;             // why the last write failed
    bool writer_running = false;          // persist_pause() is under way
    bool reading_stopped = false;         // the read loop holds at a transaction boundary
    std::uint64_t epoch = 0;              // counts this process's requests: a marker read before one is stale
  } pause_;
  boost::asio::steady_timer pause_retry_; // persist_pause()'s wait between tries
  std::optional<std::string> replay_reason_;  // set until the replay has started
  bool renew_producer_ = false;               // the replay starts with a new producer (exactly once)
  // Exactly once: the committed position when a Kafka transaction last timed
  // out. A second time-out with nothing committed since halts.
  std::optional<pgoutput::Lsn> timed_out_at_;
  // Set by the stop request or the halt: the one deadline for draining.
  std::optional<std::chrono::steady_clock::time_point> drain_deadline_;
  std::uint64_t failed_records_ = 0;      // delivery failed for good, not dead-lettered: never acked
  int exit_code_ = exit_ok;
  int sessions_streamed_ = 0;             // > 0: the slot existed and we read from it
  std::optional<SourceIdentity> last_source_;  // the server of the last session (rebase_on_new_server)
  // The initial snapshot's progress (/slot), kept once done.
  struct SnapshotProgress {
    bool done = false;
    std::string table;
    std::uint64_t rows_done = 0;
    std::uint64_t rows_estimated = 0;
    std::chrono::steady_clock::time_point started{}, finished{}, logged{};
    // Exactly once: the snapshot is one Kafka transaction, which must commit
    // before the coordinator's time-out aborts it.
    std::optional<std::chrono::steady_clock::time_point> end_by;
  };
  std::optional<SnapshotProgress> snapshot_;
  bool snapshot_only_done_ = false;       // initial_only: taken, so the session ends
  SlotOrigin snapshot_origin_;            // the snapshot's slot: its view, for the marker once sent
  std::uint64_t snapshot_polls_ = 0;      // snapshot rows handled, to serve reports between batches
  std::uint64_t delivered_ = 0;           // records the broker acknowledged, ever
  std::uint64_t delivered_at_replay_ = 0; // delivered_ at the last replay

  // Exactly once: source transactions ending at or before this are in Kafka
  // already (the committed position); they are read and dropped.
  std::optional<pgoutput::Lsn> skip_until_;
  bool skipping_txn_ = false;
  std::optional<pgoutput::Lsn> committed_lsn_;  // the last Kafka transaction's position (/slot)
  std::chrono::steady_clock::time_point last_position_commit_{};  // the last commit of a position only

  // Transaction being read
  std::optional<LsnLedger::TxnId> txn_;
  bool message_txn_ = false;              // txn_ is a non-transactional message's own (dead-lettered)
  std::uint32_t xid_ = 0;
  std::int64_t commit_time_ = 0;
  // The records' positions (OutboxRecord::position): the transaction's
  // commit LSN; the change's own LSN, and its rank among the rows of one WAL
  // record (a COPY writes several with one LSN).
  std::uint64_t position_lsn_ = 0;  // 0: none (an initial snapshot's rows)
  std::uint64_t position_change_lsn_ = 0;
  std::uint64_t position_rank_ = 0;
  std::optional<OutboxRecord::Position> position_of_record() const;
  void at_change(pgoutput::Lsn lsn);

  // Positions
  pgoutput::Lsn received_lsn_;
  pgoutput::Lsn last_commit_end_;         // end LSN of the newest Commit received
  pgoutput::Lsn stream_wal_end_;          // newest WAL end the walsender reported (its decoding position)
  pgoutput::Lsn sent_flushed_lsn_;        // last flushed LSN reported to the server
  pgoutput::Lsn sent_written_lsn_;        // last written LSN reported to the server
  std::chrono::steady_clock::time_point last_received_;
  bool reply_requested_ = false;
  bool backpressured_ = false;            // reads paused (walrelay_backpressure)
  boost::asio::steady_timer wake_;        // cancelled to wake a hold_back or a drain
  // Wakes the socket wait for the next status update; armed once per update
  // (idle: up to 10 s apart), not once per wait, and re-armed only earlier.
  boost::asio::steady_timer tick_;
  bool tick_armed_ = false;
  // Dead-letter copies of refused records that found the sink's queue full
  // (RabbitMQ and NATS while their connection is down): each record stays
  // unsettled, counted in failed_records_, while its copy waits here; no
  // record is read meanwhile (has_room), and a replay drops them (the slot
  // gives the records again).
  struct WaitingDeadLetter {
    DeadLetter dead;
    std::uint64_t token;
    std::size_t bytes;
    std::string where;
  };
  std::deque<WaitingDeadLetter> waiting_dead_letters_;
  boost::asio::steady_timer dead_letter_retry_;
  bool dead_letter_retry_armed_ = false;
  SessionClock clock_;  // the streaming session's: reset by stream(), pulled in by status_soon()
  // Bulk reading (see bulk_messages): the session's state.
  bool bulk_read_ = false;
  int window_messages_ = 0;
  std::chrono::steady_clock::time_point window_start_;

  // Lets a counter map be searched by string_view without building a string.
  struct TopicHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using CounterByTopic = std::unordered_map<std::string, prometheus::Counter*, TopicHash, std::equal_to<>>;
  std::vector<std::string> table_names_;  // index = token table (table.include.list order)
  std::vector<CounterByTopic> relayed_counters_;
  static constexpr std::size_t max_topic_series = 1000;
  static constexpr std::string_view other_topics_label = "(other)";
  std::unordered_map<std::uint32_t, prometheus::Counter*> skipped_;  // by relation OID: rows not of the outbox
  std::unordered_map<std::uint32_t, prometheus::Counter*> invalid_operations_;  // by relation OID: outbox UPDATEs
  // message.prefix.include.list, compiled; a prefix's match is looked up once.
  std::vector<std::regex> message_prefixes_;
  std::unordered_map<std::string, PrefixSource, TopicHash, std::equal_to<>> prefix_sources_;
  static constexpr std::size_t max_prefix_entries = 1000;
  // Coroutine frames may not hold arrays with g++ 12; this one lives here.
  std::array<std::byte, pgoutput::standby_status_update_size> status_msg_{};
};

}  // namespace walrelay
