// The relay: one replication session at a time, outbox rows to the sink, and
// the slot confirmed only as far as the ledger allows. Everything runs on one
// io_context thread, so none of it needs a lock.
#pragma once

#include <array>
#include <chrono>
#include <utility>  // before Boost 1.74 asio: its awaitable.hpp needs std::exchange
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <pgoutput/pgoutput.hpp>

#include "walrelay/config.hpp"
#include "walrelay/exit_codes.hpp"
#include "walrelay/lsn_ledger.hpp"
#include "walrelay/metrics.hpp"
#include "walrelay/outbox_mapper.hpp"
#include "walrelay/pg_connection.hpp"
#include "walrelay/sink.hpp"
#include "walrelay/status.hpp"

namespace walrelay {

class Relay final : public StatusSource {
 public:
  Relay(boost::asio::io_context& io, const Config& config, Metrics& metrics, Sink& sink);
  ~Relay() override;

  // Starts the replication session and the slot-status poller on the io_context.
  void start();
  // SIGTERM/SIGINT: stop reading, wait for in-flight acks (bounded), send the
  // final status update, then stop the io_context.
  void request_stop();
  // Valid once the io_context has stopped.
  int exit_code() const { return exit_code_; }

  StatusSnapshot status() const override;

 private:
  enum class Step { done, retry, stop };  // outcome of handling one CopyData message

  boost::asio::awaitable<void> run();
  boost::asio::awaitable<void> session();
  boost::asio::awaitable<void> prepare(PgConnection& conn);
  boost::asio::awaitable<void> stream(PgConnection& conn);
  boost::asio::awaitable<void> send_status(PgConnection& conn, bool reply_requested);
  boost::asio::awaitable<void> drain(PgConnection* conn);
  boost::asio::awaitable<void> slot_status_loop();
  boost::asio::awaitable<void> sleep(std::chrono::milliseconds duration);

  Step handle_copy_data(std::span<const std::byte> data);
  Step handle_message(const pgoutput::XLogData& xlog);
  Step relay_insert(const pgoutput::Insert& insert, pgoutput::Lsn lsn);
  Step skip_insert(const pgoutput::Insert& insert, pgoutput::Lsn lsn);
  Step dead_letter_row(const pgoutput::Insert& insert, const MapError& error, pgoutput::Lsn lsn);
  void on_delivery(const Delivery& delivery);
  void halt(std::string reason);
  // A delivery failed for a reason that is not the record's own: stop
  // reading, let every record in flight settle, then stream again from the
  // slot's confirmed position (at least once, in order).
  void replay(std::string reason);
  // Halts when the ledger reports a broken invariant.
  void check_ledger();
  void set_state(RelayState state, std::string reason = {});
  bool has_room() const;
  struct Lag {
    pgoutput::Lsn wal_end;            // the server's WAL position
    std::uint64_t bytes = 0;          // wal_end - the slot's confirmed_flush_lsn
    std::uint64_t retained_bytes = 0; // wal_end - the slot's restart_lsn (0 until the poller answers)
    double seconds = 0;               // age of the oldest unacknowledged commit
  };
  Lag lag() const;
  void update_gauges() const;
  prometheus::Counter& relayed_counter(std::uint16_t table, std::string_view topic);
  std::string context() const;  // "slot=... lsn=... xid=..." for log lines

  // A record's token: the ledger's transaction id and the table's index for
  // the per-table counter, so a delivery report needs no lookup structure.
  static std::uint64_t make_token(LsnLedger::TxnId txn, std::uint16_t table) { return (txn << 16) | table; }
  static LsnLedger::TxnId token_txn(std::uint64_t token) { return token >> 16; }
  static std::uint16_t token_table(std::uint64_t token) { return static_cast<std::uint16_t>(token & 0xffff); }
  // Marks the reports a mutation build ignores (tests/mutation/run.sh).
  static constexpr std::uint16_t mutation_ignored_table = 0xffff;

  boost::asio::io_context& io_;
  const Config& config_;
  Metrics& metrics_;
  Sink& sink_;
  OutboxMapper mapper_;
  OutboxRecord record_;                   // reused for every row
  LsnLedger ledger_;
  pgoutput::Decoder decoder_{1};
  PgConnection conn_;

  RelayState state_ = RelayState::starting;
  std::string state_reason_;
  bool stop_requested_ = false;
  std::optional<std::string> halt_reason_;
  std::optional<std::string> replay_reason_;  // set until the replay has started
  // Set by the stop request or the halt: the one deadline for draining.
  std::optional<std::chrono::steady_clock::time_point> drain_deadline_;
  std::uint64_t failed_records_ = 0;      // delivery failed for good, not dead-lettered: never acked
  int exit_code_ = exit_ok;
  int sessions_streamed_ = 0;             // > 0: the slot existed and we read from it
  int proto_version_ = 1;

  // Transaction being read
  std::optional<LsnLedger::TxnId> txn_;
  std::uint32_t xid_ = 0;
  std::int64_t commit_time_ = 0;
  pgoutput::Lsn txn_lsn_;

  // Positions
  pgoutput::Lsn received_lsn_;
  pgoutput::Lsn last_commit_end_;         // end LSN of the newest Commit received
  pgoutput::Lsn stream_wal_end_;          // newest WAL end the walsender reported (its decoding position)
  pgoutput::Lsn sent_flushed_lsn_;        // last flushed LSN reported to the server
  std::chrono::steady_clock::time_point last_received_;
  bool reply_requested_ = false;
  bool backpressured_ = false;
  boost::asio::steady_timer wake_;        // cancelled to wake the stream loop
  // Wakes the stream loop's socket wait for the next status update; armed
  // once per status interval (at most 1 s), not once per wait.
  boost::asio::steady_timer tick_;
  bool tick_armed_ = false;

  std::optional<ServerSlotInfo> server_info_;
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
  // Coroutine frames may not hold arrays with g++ 12; this one lives here.
  std::array<std::byte, pgoutput::standby_status_update_size> status_msg_{};
  std::string scratch_;                   // a dead-letter record's value (the row as JSON)
};

}  // namespace walrelay
