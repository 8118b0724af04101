// The relay's lifecycle, its reconnect policy, and the replication session
// with its read loop (see relay.hpp for the other files of Relay).
#include "walrelay/relay/relay.hpp"

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "walrelay/backoff.hpp"
#include "walrelay/source/catalog.hpp"
#include "walrelay/mutation.hpp"

namespace walrelay {
namespace asio = boost::asio;
using namespace std::chrono_literals;
using pgoutput::Lsn;

namespace {

// SQLSTATEs the session distinguishes.
constexpr const char* sqlstate_object_in_use = "55006";           // slot active for another PID
constexpr const char* sqlstate_undefined_object = "42704";        // slot does not exist
constexpr const char* sqlstate_prerequisite_state = "55000";      // slot invalidated

// The items with `sep` between them.
std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (auto& i : items) out += (out.empty() ? "" : std::string(sep)) + i;
  return out;
}

// host:pid, as Kafka Connect names a worker in its status.
std::string worker_id() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return std::string(host[0] ? host : "localhost") + ":" + std::to_string(getpid());
}

// DDL that failed for want of a privilege or an object fails again on every
// retry: a halt that names the fix, not a reconnect loop.
asio::awaitable<void> ddl(asio::awaitable<void> op) {
  try {
    co_await std::move(op);
  } catch (const PgError& e) {
    // 42xxx: privilege, syntax, undefined object; 25006: a read-only standby.
    if (e.sqlstate().rfind("42", 0) == 0 || e.sqlstate() == "25006") throw Fatal(e.what());
    throw;
  }
}

}  // namespace

Relay::Relay(asio::io_context& io, const Config& config, Metrics& metrics, Sink& sink)
    : io_(io),
      config_(config),
      metrics_(metrics),
      sink_(sink),
      transactional_(sink.transactions()),
      mapper_(config),
      conn_(io),
      slot_monitor_(io, config),
      retention_(io, config, metrics),
      pause_retry_(io),
      wake_(io),
      tick_(io),
      dead_letter_retry_(io) {
  worker_id_ = worker_id();
  if (config.registry.format != RegistryFormat::none)
    schema_encoder_ = std::make_unique<SchemaEncoder>(io, config, metrics);
  metrics_.set_sink(config_.sink_type);
  sink_.on_delivery([this](const Delivery& d) { on_delivery(d); });
  if (transactional_) {
    transactional_->on_committed([this](Lsn end) {
      committed_lsn_ = end;
      metrics_.kafka_transactions("committed").Increment();
      metrics_.committed_lsn.Set(static_cast<double>(end.value));
      wake_.cancel();  // reads held back for the commit go on
      status_soon();   // the commit made a position confirmable
    });
    transactional_->on_aborted([this](std::string reason) {
      metrics_.kafka_transactions("aborted").Increment();
      replay("the Kafka transaction was aborted (" + reason + ")");
    });
  }
  sink_.on_fatal([this] {
    wake_.cancel();  // the read loop's next turn runs check_producer()
    conn_.cancel_wait();
  });
  ledger_.on_retired([this](std::int64_t commit_time) {
    metrics_.commit_to_ack.Observe(static_cast<double>(pgoutput::pg_epoch_micros_now() - commit_time) / 1e6);
  });
  for (auto& t : config_.table_include_list) table_names_.push_back(t.qualified());
  for (auto& p : config_.message_prefix_include_list) {
    message_prefixes_.emplace_back(p, std::regex::ECMAScript | std::regex::optimize);
    table_names_.push_back("message:" + p);  // the table label of events relayed from messages
  }
  relayed_counters_.resize(table_names_.size());
  record_.headers.reserve(4 + config_.additional_placement.size());
}

Relay::~Relay() {
  // The sink may outlive the relay (tests reuse one): nothing of it calls back here.
  sink_.on_delivery(nullptr);
  if (transactional_) {
    transactional_->on_committed(nullptr);
    transactional_->on_aborted(nullptr);
  }
  sink_.on_fatal(nullptr);
}

void Relay::HeldMessage::reset() {
  if (data) PQfreemem(data);
  data = nullptr;
  size = 0;
}

void Relay::start() {
  asio::co_spawn(io_, run(), [this](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      spdlog::critical("{} relay stopped on an unexpected error: {}", context(), ex.what());
    }
    exit_code_ = exit_failure;
    io_.stop();
  });
  slot_monitor_.start([this](std::string reason) {
    metrics_.slot_invalidated.Set(1);
    halt(std::move(reason), "slot");
  }, [this] { return state_ == RelayState::streaming; });
  // What the broker has acknowledged is what this walrelay confirmed, while
  // it streams (a standby, a snapshot or a halt vouch for nothing).
  retention_.start([this]() -> std::optional<Lsn> {
    if (state_ != RelayState::streaming || halt_reason_ || stop_requested_) return std::nullopt;
    return sent_flushed_lsn_;
  });
}

void Relay::request_stop() {
  if (restart_requested_) {
    // A signal during a restart's winding down: the process stops instead,
    // and says so (CI run 33 logged "session ended for the restart" last).
    restart_requested_ = false;
    spdlog::info("{} stop requested during the restart: no new session begins", context());
  }
  if (stop_requested_) return;
  spdlog::info("{} stop requested: finishing in-flight records", context());
  begin_stop();
}

void Relay::request_restart(const std::string& who) {
  if (stop_requested_) return;
  spdlog::warn("{} restart asked for by {}: this session ends as a stop does (records in flight settle within "
               "shutdown.timeout.ms), then a new one begins with new connections from the slot's confirmed position",
               context(), who);
  restart_requested_ = true;
  begin_stop();
}

// What a stop and a restart share: no more reads, one deadline for draining.
void Relay::begin_stop() {
  stop_requested_ = true;
  // One deadline for the whole shutdown, however many places wait on it.
  drain_deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(config_.shutdown_timeout_ms);
  if (transactional_) transactional_->stop_by(*drain_deadline_);
  slot_monitor_.stop();
  retention_.stop();
  wake_.cancel();
  conn_.cancel_wait();
}

// "slot=... lsn=... xid=..." for log lines.
std::string Relay::context() const {
  std::string s = "slot=" + config_.slot_name + " lsn=" + received_lsn_.to_string();
  if (txn_) s += " xid=" + std::to_string(xid_);
  return s;
}

// Changes the state /readyz and /slot report; halted is final.
void Relay::set_state(RelayState state, std::string reason) {
  if (state_ == RelayState::halted) return;
  if (state != state_ || state_since_unix_ms_ == 0) state_since_unix_ms_ = unix_ms_now();
  state_ = state;
  state_reason_ = std::move(reason);
  update_gauges();
}

// Stops for a human: nothing past the cause is confirmed, what is in flight
// before it is drained (up to shutdown.timeout.ms); then exit code 3, or the
// halted state kept up (halt.action=stay).
void Relay::halt(std::string reason, std::string_view cause, int exit_code) {
  if (halt_reason_) return;
  spdlog::critical("{} halted: {}", context(), reason);
  halt_reason_ = reason;
  halt_cause_ = cause;
  halt_where_ = context();
  halt_exit_code_ = exit_code;
  if (!drain_deadline_)
    drain_deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(config_.shutdown_timeout_ms);
  if (transactional_) transactional_->stop_by(*drain_deadline_);
  set_state(RelayState::halted, std::move(reason));
  metrics_.set_halted(cause);
  // Staying up, the slot's lag and state go on being measured.
  if (config_.halt_action == HaltAction::exit) slot_monitor_.stop();
  wake_.cancel();
  conn_.cancel_wait();
}

// A delivery failed for a reason that is not the record's own: stop reading,
// let every record in flight settle, then stream again from the slot's
// confirmed position (at least once, in order).
void Relay::replay(std::string reason) {
  if (halt_reason_ || stop_requested_ || replay_reason_) return;  // nothing past it is confirmed either way
  spdlog::error("{} {}; sending everything from the slot's confirmed position again once the records in flight "
                "have settled",
                context(), reason);
  replay_reason_ = std::move(reason);
  // The slot gives their records again: copies waiting for room would only
  // settle entries of a ledger about to be reset.
  waiting_dead_letters_.clear();
  if (transactional_) transactional_->abandon_transaction();
  set_state(RelayState::reconnecting, "sending again after a delivery failure: " + *replay_reason_);
  wake_.cancel();
  conn_.cancel_wait();
}

// A fatal producer error halts, except in exactly-once mode when it is not a
// fence: nothing past the committed position was confirmed, so a new
// producer can take over from there (a transaction librdkafka could not end,
// a broker that lost the producer's state). A Kafka transaction that outlived
// its time-out is sent again once the same way: the broker may have been
// down longer than the time-out, and only a retry tells that from a source
// transaction too long for it. Timing out again with nothing committed
// since halts (exit 3): that transaction would time out every time.
void Relay::check_producer() {
  auto fatal = sink_.fatal_error();
  if (!fatal || halt_reason_) return;
  if (renew_producer_) return;  // this producer's replacement is under way (the replay renews it)
  if (transactional_ && !transactional_->fenced()) {
    const Lsn at = committed_lsn_.value_or(Lsn{});
    const bool timed_out = transactional_->timed_out();
    if (!timed_out || timed_out_at_ != at) {
      if (timed_out) {
        timed_out_at_ = at;
        // (Said here: a replay may be under way already, for the failed
        // records the outage left.)
        spdlog::warn("{} the Kafka transaction timed out; a new producer sends it again from the committed "
                     "position {}, once (timing out again with nothing committed since halts)",
                     context(), at.to_string());
      }
      renew_producer_ = true;
      replay("the Kafka producer failed: " + *fatal);
      return;
    }
  }
  halt(*fatal, "producer", transactional_ && transactional_->fenced() ? exit_failure : exit_halted);
}

// Whether another record may be handed to the sink (max.inflight.*).
bool Relay::has_room() const {
  if (!waiting_dead_letters_.empty()) return false;  // nothing overtakes a dead-letter copy waiting for room
  if (mutation::active(mutation::Break::inflight_unbounded)) return true;
  return ledger_.inflight_records() < static_cast<std::uint64_t>(config_.max_inflight_records) &&
         ledger_.inflight_bytes() < static_cast<std::uint64_t>(config_.max_inflight_bytes);
}

// Sleeps, or less when wake_ is cancelled (a stop, a halt, room in flight).
asio::awaitable<void> Relay::sleep(std::chrono::milliseconds duration) {
  wake_.expires_after(duration);
  boost::system::error_code ec;
  co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

// Sessions until a stop or a halt: reconnects with backoff, waits as a
// standby while another walrelay holds the slot, replays after a transient
// delivery failure; then drains and stops the loop.
asio::awaitable<void> Relay::run() {
  Backoff backoff(std::chrono::milliseconds(config_.reconnect_backoff_ms),
                  std::chrono::milliseconds(config_.reconnect_backoff_max_ms));
  while (!stop_requested_ && !halt_reason_) {
    set_state(RelayState::connecting);
    int streamed_before = sessions_streamed_;
    bool standby = false;
    try {
      co_await session();
    } catch (const Fatal& e) {
      if (!halt_reason_) halt(e.what(), metrics_.slot_invalidated.Value() == 1 ? "slot" : "source");
    } catch (const PgError& e) {
      if (e.sqlstate() == sqlstate_object_in_use) {
        // Another walrelay holds the slot: wait as a standby, take over when it goes.
        set_state(RelayState::standby, e.what());
        holds_slot_ = false;
        spdlog::info("slot={} standby: {}", config_.slot_name, e.what());
        standby = true;
      } else {
        set_state(RelayState::reconnecting, e.what());
        spdlog::error("{} replication connection lost: {}", context(), e.what());
      }
    }
    check_producer();
    if (standby) {
      conn_.close();
      co_await sleep(std::min<std::chrono::milliseconds>(2000ms, std::chrono::milliseconds(config_.reconnect_backoff_max_ms)));
      continue;
    }
    conn_.close();
    ledger_.abandon_open();
    txn_.reset();
    message_txn_ = false;
    if (stop_requested_ || halt_reason_) break;
    if (transactional_ && !replay_reason_) replay_after_session(sessions_streamed_ > streamed_before);
    const bool replayed = replay_reason_.has_value();
    if (replay_reason_) {
      // Every record still in flight must settle first: a late report must
      // never meet the fresh ledger.
      co_await drain(nullptr);
      check_producer();  // a fatal error the drain ended on counts for this replay
      if (stop_requested_ || halt_reason_) break;
      if (renew_producer_) {
        renew_producer_ = false;
        if (!transactional_ || !co_await transactional_->renew("it failed")) {
          halt(sink_.fatal_error().value_or("the Kafka producer failed"), "producer", exit_halted);
          break;
        }
        metrics_.producer_replacements.Increment();
      }
      // Exactly once: what was acknowledged into an aborted Kafka transaction
      // vouches for nothing; only the committed position does.
      if (transactional_) ledger_.reset(committed_lsn_.value_or(Lsn{}));
      else ledger_.reset();
      failed_records_ = 0;
      replay_reason_.reset();
      metrics_.replays.Increment();
      spdlog::info("slot={} every record has settled; replaying from the slot's confirmed position",
                   config_.slot_name);
    }
    metrics_.reconnects.Increment();
    // A replay that follows another with nothing delivered in between (a
    // missing stream or exchange, a broker refusing everything for now)
    // backs off as a lost connection does, rather than restart the
    // replication as fast as the server answers.
    const bool progressed = delivered_ != delivered_at_replay_;
    if (sessions_streamed_ > streamed_before && (!replayed || progressed)) backoff.reset();
    if (replayed) delivered_at_replay_ = delivered_;
    auto delay = backoff.next();
    spdlog::info("slot={} reconnecting in {} ms", config_.slot_name, delay.count());
    co_await sleep(delay);
  }
  co_await wind_down();
}

// Exactly once, a session ended: the server sends again from the slot. What
// is whole in the open Kafka transaction commits; a source transaction cut
// in the middle is aborted, and the relay resumes from what committed. Cut
// in the initial snapshot (not streamed), its records in flight settle and
// its transaction is aborted (never committed: it is not whole) before the
// next session replaces the producer, whose reports they would never get.
void Relay::replay_after_session(bool streamed) {
  if (streamed) {
    replay_reason_ = "the replication connection ended";
    transactional_->commit_now();
    transactional_->abandon_transaction();
  } else if (ledger_.inflight_records() > 0 || transactional_->settling()) {
    replay_reason_ = "the replication connection ended in the initial snapshot";
    transactional_->abandon_transaction();
  }
}

// Shutdown or halt: lets what is in flight land and confirms as far as it
// goes, stays up when halted with halt.action=stay, then ends the loop with
// the exit code the halt or the stop calls for.
asio::awaitable<void> Relay::wind_down() {
  co_await drain(nullptr);
  // A fenced producer (exit 1) is no halt for a human: another walrelay took
  // over, and this one comes back as its standby.
  if (halt_reason_ && halt_exit_code_ == exit_halted && config_.halt_action == HaltAction::stay && !stop_requested_)
    co_await stay_halted();
  // A lost slot is a halt too: a restart would create a new slot and skip
  // events, so it must not look like a crash a supervisor retries.
  if (halt_reason_) exit_code_ = halt_exit_code_;
  else set_state(RelayState::stopped);
  if (restart_requested_)
    spdlog::info("slot={} session ended for the restart; confirmed_flush_lsn={}", config_.slot_name,
                 sent_flushed_lsn_.to_string());
  else
    spdlog::info("slot={} stopped; confirmed_flush_lsn={} exit code {}", config_.slot_name,
                 sent_flushed_lsn_.to_string(), exit_code_);
  io_.stop();
}

// halt.action=stay: the process and its admin endpoint stay up in the halted
// state (walrelay_halted 1 with its reason, /readyz 503 naming it, /healthz
// 200: the process is alive and a restart would halt again) until a stop.
// The replication connection is closed, so a standby may take the slot; the
// slot's lag keeps being measured, as it keeps growing.
asio::awaitable<void> Relay::stay_halted() {
  spdlog::critical("slot={} halted, staying up (halt.action=stay) with the admin endpoint on: {}; fix the cause, then "
                   "POST /restart (walrelay ctl restart), or restart walrelay (SIGTERM exits with code {})",
                   config_.slot_name, *halt_reason_, halt_exit_code_);
  // Records still queued would land whenever the broker comes back (no
  // message time-out by default), after what a standby that took the slot
  // sent since for the same keys: they are dropped, the slot gives them
  // again. (Exactly once: the open Kafka transaction takes them with it.)
  if (!transactional_) sink_.abort_queued();
  note_backpressure(false);  // no read waits for room any more
  // Nothing to do on a timer: a scrape of /metrics or /slot refreshes the
  // gauges from the slot monitor's last answer, and request_stop() (or a
  // restart's) cancels the sleep.
  while (!stop_requested_) co_await sleep(std::chrono::hours(1));
}

// One replication connection: connect, check and prepare, stream.
asio::awaitable<void> Relay::session() {
  co_await renew_taken_over_producer();
  if (stop_requested_ || halt_reason_) co_return;
  spdlog::info("connecting: {}", config_.conninfo_redacted(true));
  co_await conn_.connect(config_.conninfo(true), std::chrono::milliseconds(config_.database_connect_timeout_ms));
  co_await prepare(conn_);
  if (snapshot_only_done_ && !stop_requested_) {
    // snapshot.mode=initial_only: done, a clean stop (exit 0).
    spdlog::info("slot={} stopping after the initial snapshot (snapshot.mode=initial_only)", config_.slot_name);
    stop_requested_ = true;
  }
  if (stop_requested_ || halt_reason_) co_return;
  sessions_streamed_++;
  co_await stream(conn_);
}

// Exactly once: each session takes the transactional.id over anew. Since the
// last one another walrelay may have held the slot (this one its standby, or
// slower to reconnect), fencing this producer and committing past the
// position it read: kept, the producer would fail at its first commit (exit
// 1, a restart) and skip by a stale position. Nothing is in flight between
// sessions (a replay drains first, after a snapshot cut too). (One
// if-block, no early co_return: g++ 12 made that a crash at the first
// session.)
asio::awaitable<void> Relay::renew_taken_over_producer() {
  if (transactional_ && transactional_->taken_over()) {
    const bool renewed = co_await transactional_->renew("a new session takes the transactional.id over again");
    if (!renewed) throw PgError("exactly once: the Kafka producer could not be replaced for the new session", "");
  }
}

// Checks the server, the publication and the slot (catalog.cpp), creates what
// filtered mode and a first start allow, and enters START_REPLICATION.
asio::awaitable<void> Relay::prepare(PgConnection& conn) {
  auto ident = co_await conn.query("IDENTIFY_SYSTEM");
  if (ident.rows.empty()) throw PgError("could not identify the system: empty answer", "");
  spdlog::info("connected: systemid={} timeline={} xlogpos={} dbname={} server_version={}",
               ident.at(0, "systemid").value_or("?"), ident.at(0, "timeline").value_or("?"),
               ident.at(0, "xlogpos").value_or("?"), ident.at(0, "dbname").value_or("?"), conn.server_version());
  if (conn.server_version() >= 190000)
    spdlog::warn("PostgreSQL {} is newer than walrelay has been tested with (14 to 18)", conn.server_version() / 10000);
  const std::string timeline = ident.at(0, "timeline").value_or("");
  const SourceIdentity source{ident.at(0, "systemid").value_or(""), timeline, config_.database_dbname,
                              config_.slot_name};
  sink_.source_identified(source);
  auto facts = co_await check_source(conn, source.system);
  rebase_on_new_server(source, facts);

  // The server's WAL reaches at least here: IDENTIFY_SYSTEM's position, or
  // past it the consistent point of a slot made since (where an exactly-once
  // snapshot commits its position).
  std::optional<Lsn> wal_reached = Lsn::parse(ident.at(0, "xlogpos").value_or(""));
  if (!co_await prepare_slot(conn, facts, source, wal_reached)) co_return;
  if (config_.slot_failover && facts.slot.exists && !facts.slot.failover) co_await ddl(make_failover_slot(conn, config_));

  // Exactly once: the history of this server's timeline, to check the
  // committed position against (read before COPY BOTH, which takes no
  // other command).
  std::string history;
  if (transactional_ && !timeline.empty() && timeline != "1") {
    auto h = co_await conn.query("TIMELINE_HISTORY " + timeline);
    history = h.at(0, "content").value_or("");
  }
  const std::string cmd = co_await start_replication(conn);
  if (transactional_) co_await take_over_position(conn, source, facts, wal_reached, history);
  spdlog::info("slot={} streaming: {}", config_.slot_name, cmd);
  holds_slot_ = true;
  set_state(RelayState::streaming);
}

// At least once, a session on another server than the last one's in this
// process: a promoted standby (a new timeline), or another system behind the
// same address. The ledger's position is the old server's. After an
// asynchronous failover the new timeline forks below it, and the first
// status update would confirm the new server's slot past transactions it is
// about to send: a crash, a replay or a cleaning of the outbox then loses
// them. So every record in flight settles first (a replay, as after a
// delivery failure; the next session comes back here), then the ledger
// starts from the new slot's confirmed position. Exactly once checks its
// committed position against the new timeline's history instead
// (take_over_position).
void Relay::rebase_on_new_server(const SourceIdentity& source, const ServerFacts& facts) {
  const bool changed =
      last_source_ && (last_source_->system != source.system || last_source_->timeline != source.timeline);
  if (changed && !transactional_) {
    const std::string what = "walrelay is connected to another server than before (systemid " +
                             last_source_->system + " timeline " + last_source_->timeline + ", now systemid " +
                             source.system + " timeline " + source.timeline + ")";
    if (ledger_.inflight_records() > 0) {
      replay(what + ": positions of the old one mean nothing here");
      throw PgError(what + "; every record in flight settles before it streams", "");
    }
    const Lsn start = facts.slot.confirmed_flush_lsn.value_or(Lsn{});
    spdlog::warn("slot={} {}: confirming from this server's slot position {}, not from {}, the old server's",
                 config_.slot_name, what, start.to_string(), ledger_.flushed().to_string());
    ledger_.reset(start);
    // What was received from the old server is no position on this one
    // (status updates' write field, walrelay_received_lsn, the lag).
    received_lsn_ = start;
    stream_wal_end_ = start;
  }
  last_source_ = source;
}

// The catalog's checks (the server, the tables, the slot) that stop the
// relay, and the publication made what filtered mode wants.
asio::awaitable<ServerFacts> Relay::check_source(PgConnection& conn, const std::string& system) {
  std::vector<std::string> problems, warnings;
  const std::uint64_t pause_epoch = pause_.epoch;
  auto facts = co_await inspect_server(conn, config_, system, problems, warnings);
  for (auto& w : warnings) spdlog::warn("{}", w);
  // Unless this process paused or resumed since the marker was read.
  if (pause_.epoch == pause_epoch) adopt_pause(facts.paused_since);
  if (auto p = slot_problem(config_, facts)) {
    metrics_.slot_invalidated.Set(1);
    problems.push_back(*p);
  } else if (!facts.slot.exists && sessions_streamed_ > 0) {
    // Streamed from, and its marker gone with the publication as well.
    metrics_.slot_invalidated.Set(1);
    problems.push_back("slot.name: replication slot " + config_.slot_name +
                       " was dropped while walrelay was using it; recreating it would skip events, so walrelay "
                       "stops. To accept the gap, run walrelay --reset-slot once, then start walrelay again.");
  }
  if (!problems.empty()) throw Fatal(join(problems, "; "));

  auto publication = publication_problems(config_, facts);
  if (!publication.empty()) {
    if (config_.publication_autocreate == PublicationAutocreate::disabled)
      throw Fatal(join(publication, "; ") + " (publication.autocreate.mode=disabled: walrelay does not change it)");
    co_await ddl(ensure_publication(conn, config_, facts));
  }
  co_return facts;
}

// The slot to stream from: the initial snapshot that creates it, a slot
// created without one, or the existing slot (an interrupted snapshot taken
// again). false: nothing to stream (stopped, halted, or initial_only done).
asio::awaitable<bool> Relay::prepare_slot(PgConnection& conn, const ServerFacts& facts, const SourceIdentity& source,
                                          std::optional<Lsn>& wal_reached) {
  const bool snapshot = config_.snapshot_mode != SnapshotMode::no_data;
  const bool interrupted = facts.marker && facts.marker->snapshot_pending &&
                           !mutation::active(mutation::Break::snapshot_resume_as_done);
  if (snapshot && (!facts.slot.exists || interrupted)) {
    // The rows already in the outbox first, then the stream from the
    // snapshot's consistent point (relay_snapshot.cpp). A pause waits for
    // its end: waiting before it would hold no slot, and the events that
    // leave no row would be lost meanwhile.
    auto point = co_await initial_snapshot(conn, facts, source);
    if (!point) co_return false;  // stopped or halted: the next start takes it again
    if (!wal_reached || *wal_reached < *point) wal_reached = point;
    if (config_.snapshot_mode == SnapshotMode::initial_only) {
      spdlog::warn("slot={} snapshot.mode=initial_only: the snapshot is sent; walrelay stops without streaming. The "
                   "slot is kept at {} and holds WAL from there: start walrelay with snapshot.mode=initial or no_data "
                   "to stream what follows with no gap, or drop the slot",
                   config_.slot_name, point->to_string());
      snapshot_only_done_ = true;
      co_return false;
    }
  } else if (!facts.slot.exists) {
    if (interrupted)
      spdlog::warn("slot={} an initial snapshot begun on {} did not finish, and snapshot.mode=no_data: creating the "
                   "slot without it",
                   config_.slot_name, facts.marker->created_at);
    spdlog::warn("slot={} does not exist and walrelay has not created it before: creating it; outbox rows committed "
                 "before its consistent point are not relayed{}",
                 config_.slot_name, snapshot ? "" : " (snapshot.mode=initial sends them first)");
    // An interrupted snapshot's marker: its view and floors are another
    // slot's, and must not vouch for this one should walrelay stop before
    // recording it.
    if (facts.marker && (!facts.marker->slot_view.empty() || !facts.marker->retention_floors.empty())) {
      const SlotMarker cleared = without_slot_view(*facts.marker);  // (named: g++ 12, as above)
      co_await write_slot_marker(conn, config_, cleared);
    }
    SlotOrigin origin;
    auto created = co_await create_slot_with_view(conn, config_, facts.in_recovery, origin);
    retention_.slot_created();
    co_await record_slot(conn, facts, created, origin);
  } else {
    if (interrupted)
      spdlog::warn("slot={} an initial snapshot begun on {} did not finish, and snapshot.mode=no_data: streaming from "
                   "the slot without the rest of it",
                   config_.slot_name, facts.marker->created_at);
    if (snapshot && sessions_streamed_ == 0)
      spdlog::info("slot={} exists: no initial snapshot (snapshot.mode={} takes one only when walrelay creates the "
                   "slot; use walrelay replay to send kept rows again)",
                   config_.slot_name, config_.snapshot_mode == SnapshotMode::initial ? "initial" : "initial_only");
    if (config_.snapshot_mode == SnapshotMode::initial_only) {
      spdlog::warn("slot={} snapshot.mode=initial_only and the slot exists (its snapshot was taken): nothing to do; "
                   "start with snapshot.mode=initial or no_data to stream",
                   config_.slot_name);
      snapshot_only_done_ = true;
      co_return false;
    }
    const SlotOrigin kept;  // the marker's (named: g++ 12 frees a temporary argument of a coroutine twice)
    if (!facts.marker || interrupted) co_await record_slot(conn, facts, std::nullopt, kept);
    co_await forget_floors(conn, facts);
  }
  co_return true;
}

// forget_other_floors (catalog.hpp); a role that may not write the marker
// leaves them, as it leaves the marker.
asio::awaitable<void> Relay::forget_floors(PgConnection& conn, const ServerFacts& facts) {
  std::optional<std::string> refused;
  try {
    co_await forget_other_floors(conn, config_, facts);
  } catch (const PgError& e) {
    if (e.sqlstate() != "42501" && e.sqlstate() != "25006") throw;
    refused = e.what();
  }
  if (refused)
    spdlog::warn("slot={} could not drop the retention floors of tables it no longer relays ({}): should one be "
                 "relayed again with table.retention.policy=delete, its rows from the time between may be deleted "
                 "unsent; remove retention_floors from the walrelay.slot= line of publication {}'s comment",
                 config_.slot_name, *refused, config_.publication_name);
}

// START_REPLICATION at the highest protocol the server speaks; returns the
// command. Streaming and two-phase stay off: the walsender then sends only
// committed transactions, in commit order, so an event of a rolled-back
// transaction can never reach the sink.
asio::awaitable<std::string> Relay::start_replication(PgConnection& conn) {
  int version = conn.server_version();
  const int proto_version = version >= 160000 ? 4 : version >= 150000 ? 3 : 2;
  decoder_ = pgoutput::Decoder(proto_version);
  std::string cmd = "START_REPLICATION SLOT " + conn.quote_identifier(config_.slot_name) + " LOGICAL 0/0 (" +
                    "proto_version '" + std::to_string(proto_version) + "', publication_names " +
                    conn.quote_literal(conn.quote_identifier(config_.publication_name)) +
                    (config_.binary ? ", binary 'true'" : "") +
                    (message_prefixes_.empty() ? "" : ", messages 'true'") + ")";
  try {
    co_await conn.start_copy_both(cmd, std::chrono::milliseconds(config_.database_connect_timeout_ms));
  } catch (const PgError& e) {
    if (e.sqlstate() == sqlstate_undefined_object) {
      metrics_.slot_invalidated.Set(1);
      throw Fatal(std::string("slot.name: ") + e.what());
    }
    if (e.sqlstate() == sqlstate_prerequisite_state) {
      // Invalidated between the catalog check and START_REPLICATION: the
      // same condition, the same words.
      metrics_.slot_invalidated.Set(1);
      throw Fatal("slot.name: replication slot " + config_.slot_name + " has been invalidated (" + e.what() +
                  "): the events it held are gone. To accept the gap, run walrelay --reset-slot once");
    }
    throw;
  }
  co_return cmd;
}

// Exactly once: the slot is ours now: take over the transactional producer
// (a zombie holding it is fenced) and start after what the output already
// holds, once the committed position is checked against this server.
asio::awaitable<void> Relay::take_over_position(PgConnection& conn, const SourceIdentity& source,
                                                const ServerFacts& facts, std::optional<Lsn> wal_reached,
                                                const std::string& history) {
  // The WAL end as it is now that the slot is ours: IDENTIFY_SYSTEM's was
  // read before, and the walrelay that held the slot until then (a standby
  // of this one taking over) may have committed a later position meanwhile;
  // all it was ever sent lies below this. Read before the position (which
  // can take seconds), so that a database restored on the same timeline
  // cannot write its way past a position it does not hold in the meantime.
  const std::optional<Lsn> now = co_await wal_end_now();
  if (now && (!wal_reached || *now > *wal_reached)) wal_reached = now;
  std::optional<CommittedPosition> committed = co_await recover_position(conn, source);
  if (committed && !committed->system.empty() && committed->system != source.system)
    throw Fatal("offsets.storage.topic: the position committed for " + config_.transactional_id() +
                " was written for the database with system identifier " + committed->system + ", this one is " +
                source.system + " (a restore, a new cluster, or another database under the same name?): "
                "walrelay will not skip events by another cluster's position. Use a new "
                "kafka.transactional.id, or delete the position, once you know which events are in Kafka");
  if (committed) {
    if (auto problem = committed_position_problem(config_, *committed, wal_reached, source.timeline, history))
      throw Fatal(*problem);
    slot_ahead_of(facts, *committed);
  }
  skip_until_ = committed ? std::optional<Lsn>(committed->end_lsn) : std::nullopt;
  committed_lsn_ = skip_until_;
  if (committed) {
    metrics_.committed_lsn.Set(static_cast<double>(committed->end_lsn.value));
    spdlog::info("slot={} exactly once: source transactions ending at or before {} are in Kafka already: skipped",
                 config_.slot_name, committed->end_lsn.to_string());
  }
}

// The end of the server's WAL now (flushed, or received on a standby), from
// a connection of its own: the replication connection is in COPY BOTH.
// nullopt when it cannot be read; the caller keeps what it had.
asio::awaitable<std::optional<Lsn>> Relay::wal_end_now() {
  std::optional<Lsn> end;
  try {
    PgConnection side(io_);
    co_await side.connect(config_.conninfo(false), std::chrono::milliseconds(config_.database_connect_timeout_ms));
    auto r = co_await side.query(
        "SELECT (CASE WHEN pg_catalog.pg_is_in_recovery() THEN GREATEST(pg_catalog.pg_last_wal_receive_lsn(), "
        "pg_catalog.pg_last_wal_replay_lsn()) ELSE pg_catalog.pg_current_wal_flush_lsn() END)::text");
    end = Lsn::parse(r.rows.empty() ? std::string() : r.rows[0][0].value_or(""));
    side.close();
  } catch (const PgError& e) {
    spdlog::warn("slot={} could not read the end of the server's WAL again: {}", config_.slot_name, e.what());
  }
  co_return end;
}

// Exactly once: takes over the transactional producer and reads the committed
// position, which can take a while (the offsets topic read to its end);
// meanwhile the walsender hears from us, or wal_sender_timeout ends a slow start.
asio::awaitable<std::optional<CommittedPosition>> Relay::recover_position(PgConnection& conn,
                                                                           const SourceIdentity& source) {
  struct Outcome {
    bool done = false;
    std::optional<CommittedPosition> position;
    std::exception_ptr failure;
  };
  auto outcome = std::make_shared<Outcome>();
  auto wake = std::make_shared<asio::steady_timer>(io_);
  asio::co_spawn(io_, transactional_->recover(source),
                 [outcome, wake](std::exception_ptr e, std::optional<CommittedPosition> p) {
                   outcome->done = true;
                   outcome->failure = e;
                   outcome->position = std::move(p);
                   wake->cancel();
                 });
  const auto interval = std::clamp(std::chrono::milliseconds(config_.status_update_interval_ms),
                                   std::chrono::milliseconds(100), std::chrono::milliseconds(10000));
  bool connected = true;
  // Until recover() returns, whatever happens to the connection: it refers
  // to `source`, which lives in the caller's frame.
  while (!outcome->done) {
    wake->expires_after(interval);
    boost::system::error_code ec;
    co_await wake->async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (outcome->done || !connected) continue;
    try {
      co_await send_status(conn, false);
    } catch (const PgError& e) {
      connected = false;  // the read loop finds out; recover() still has to end
    }
  }
  if (outcome->failure) {
    try {
      std::rethrow_exception(outcome->failure);
    } catch (const std::exception& e) {
      throw PgError(std::string("exactly once: ") + e.what(), "");  // retried with backoff
    }
  }
  co_return outcome->position;
}

// Exactly once: a slot confirmed past the committed position confirmed events
// that are not in Kafka for a read_committed consumer (walrelay 0.2 could,
// after an aborted Kafka transaction), or was moved by hand or by an
// at-least-once run. They are not sent again; say so once, with the gap.
void Relay::slot_ahead_of(const ServerFacts& facts, const CommittedPosition& committed) {
  const auto slot = facts.slot.confirmed_flush_lsn;
  const std::uint64_t gap = slot && *slot > committed.end_lsn ? slot->value - committed.end_lsn.value : 0;
  metrics_.exactly_once_slot_ahead.Set(static_cast<double>(gap));
  if (gap == 0) return;
  spdlog::warn("slot={} exactly once: the slot is confirmed to {}, {} bytes of WAL past the position committed in "
               "Kafka ({}): outbox events committed in between were confirmed without being visible to "
               "read_committed consumers (an aborted Kafka transaction under walrelay 0.2), or the slot was "
               "advanced by hand or by an at-least-once run. They are not sent again: compare the outbox rows "
               "committed between these positions with the topics",
               config_.slot_name, slot->to_string(), gap, committed.end_lsn.to_string());
}

// Exactly once: with no event waiting, the slot follows the server (WAL of
// other tables, keepalives) only as far as a committed position says, so a
// Kafka transaction holding only the position is committed, at most once per
// second.
void Relay::commit_position_if_behind(std::chrono::steady_clock::time_point now) {
  if (replay_reason_ || halt_reason_ || stop_requested_ || state_ != RelayState::streaming) return;
  if (ledger_.flushed() <= committed_lsn_.value_or(Lsn{})) return;
  const auto spacing = std::max(std::chrono::milliseconds(config_.status_update_interval_ms), 1000ms);
  if (now - last_position_commit_ < spacing) return;
  if (transactional_->commit_position(ledger_.flushed())) last_position_commit_ = now;
}

// The slot marker (catalog.cpp). A role that may not write it (not the
// publication's owner) still relays: the marker only lets a later start tell
// a lost slot from a first one, so it is a warning and a metric, never a
// reason to stop. On a standby nothing can be written and the primary must
// record it once: a halt that names the SQL.
asio::awaitable<void> Relay::record_slot(PgConnection& conn, const ServerFacts& facts,
                                         std::optional<Lsn> created_lsn, const SlotOrigin& origin) {
  std::optional<std::string> refused;
  try {
    co_await mark_slot(conn, config_, facts, created_lsn, origin);
  } catch (const PgError& e) {
    if (e.sqlstate() != "42501" || facts.in_recovery) {
      if (e.sqlstate().rfind("42", 0) == 0 || e.sqlstate() == "25006") throw Fatal(e.what());
      throw;
    }
    refused = e.what();
  }
  metrics_.slot_marker_missing.Set(refused ? 1 : 0);
  if (refused)
    spdlog::warn("slot={} {}; walrelay relays without the marker, but if the slot is lost a later start cannot tell "
                 "that from a first start and creates a new slot, skipping the events in between",
                 config_.slot_name, *refused);
}

// The read loop. Each turn keeps the session alive, then does what the
// state says: read, refill, or wait for one named reason.
asio::awaitable<void> Relay::stream(PgConnection& conn) {
  last_received_ = std::chrono::steady_clock::now();
  clock_ = SessionClock{last_received_};
  HeldMessage held;
  ReadState state = ReadState::buffered;
  int since_read = 0;  // messages handled since the socket was last read
  bulk_read_ = false;  // a new connection's socket: any byte wakes the loop
  window_messages_ = 0;
  window_start_ = last_received_;
  while (!stop_requested_ && !halt_reason_ && !replay_reason_) {
    co_await keep_alive(conn);
    check_producer();
    if (halt_reason_) break;
    // Backpressure: at the in-flight limits, or with a record the producer
    // refused, stop reading. The walsender then blocks on a full socket, so
    // memory stays bounded and the WAL waits on the server.
    // Paused (POST /pause): the same hold, at a transaction boundary.
    if (held) state = ReadState::await_queue;
    else if (paused_now()) state = ReadState::await_resume;
    else if (!has_room() || !sink_accepting()) state = ReadState::await_acks;
    else if (state == ReadState::await_queue || state == ReadState::await_acks || state == ReadState::await_resume)
      state = ReadState::buffered;
    note_backpressure(state == ReadState::await_queue || state == ReadState::await_acks);
    pause_.reading_stopped = state == ReadState::await_resume;

    switch (state) {
      case ReadState::buffered:
      case ReadState::buffered_refilled: {
        int handled = read_buffered(conn, held);
        since_read += handled;
        note_messages(conn, handled);
        if (handled > 0) status_soon();
        if (stop_requested_ || halt_reason_ || replay_reason_) break;
        if (handled > 0 || held) {
          sink_.poll();
          // A full batch: let other handlers (reports, admin) run first.
          if (handled >= read_batch) co_await asio::post(io_, asio::use_awaitable);
          state = ReadState::buffered;
        } else {
          // Under load the socket usually has data already: a non-blocking
          // read first saves an epoll wait and re-registration per wake-up.
          // After a short read (a lone transaction or two: everyday rates) it
          // would only find the socket empty, a system call per event for
          // nothing: wait at once.
          state = state == ReadState::buffered && since_read >= busy_read ? ReadState::refill
                                                                          : ReadState::await_socket;
        }
        break;
      }
      case ReadState::refill:
        conn.consume_input();
        since_read = 0;
        state = ReadState::buffered_refilled;
        break;
      case ReadState::await_socket:
        co_await await_socket(conn);
        since_read = 0;
        state = ReadState::buffered;
        break;
      case ReadState::await_acks:
        sink_.poll();
        // Woken early by a delivery that makes room, or a commit.
        if (!has_room() || !sink_accepting()) co_await hold_back(200ms);
        break;
      case ReadState::await_resume:
        sink_.poll();
        // Woken early by the resume; the status updates go on meanwhile.
        co_await hold_back(1000ms);
        break;
      case ReadState::await_queue: {
        sink_.poll();
        Step step = handle_copy_data(held.bytes());
        if (step == Step::retry) {
          co_await hold_back(10ms);
        } else {
          held.reset();
          if (step == Step::stop) break;
        }
        break;
      }
    }
  }
  pause_.reading_stopped = false;
  // The end of the copy (drain's end_copy) waits on the socket with no tick:
  // the walsender's last bytes are fewer than the low-water mark (helper-44).
  if (bulk_read_) {
    bulk_read_ = false;
    conn.set_receive_low_water(1);
  }
  co_await drain(&conn);
}

// Sends the status update when it is due (or asked for), pings a quiet
// server, and declares the connection dead after replication.timeout.ms of
// silence.
asio::awaitable<void> Relay::keep_alive(PgConnection& conn) {
  auto& clock = clock_;
  const auto timeout = std::chrono::milliseconds(config_.replication_timeout_ms);
  auto now = std::chrono::steady_clock::now();
  if (now >= clock.next_status || reply_requested_) {
    // Asks for a reply once per silence: a reply (any message) starts a new one.
    bool ask = now - last_received_ > timeout / 3 && clock.pinged_at <= last_received_;
    if (transactional_) commit_position_if_behind(now);
    // Idle (nothing in flight, nothing open) with the position already
    // reported: the update would repeat the last one and is skipped, but one
    // goes at least every 10 s (pg_recvlogical's interval). An idle walrelay
    // and its walsender then sleep instead of waking each other every interval.
    const Lsn flushed = confirmable();
    bool repeat = ledger_.idle() && flushed == sent_flushed_lsn_ &&
                  std::max(received_lsn_, flushed) == sent_written_lsn_ && now - clock.last_status < 10s;
    const auto interval = std::chrono::milliseconds(config_.status_update_interval_ms);
    const bool requested = std::exchange(reply_requested_, false);
    if (ask || requested || !repeat) {
      co_await send_status(conn, ask);
      clock.last_status = now;
      if (ask) clock.pinged_at = now;
      clock.next_status = now + interval;
    } else {
      // Idle: nothing to do until the update that goes every 10 s, the
      // ping of a quiet server or its time-out, unless an event or a commit
      // (status_soon) comes first. The gauges of /metrics are refreshed
      // when it is read, so no timer ticks meanwhile.
      auto quiet = last_received_ + (clock.pinged_at > last_received_ ? timeout : timeout / 3) + 1ms;
      clock.next_status = std::max(now + interval, std::min(clock.last_status + 10s, quiet));
    }
  }
  if (now - last_received_ > timeout)
    throw PgError("no message from the server for " + std::to_string(timeout.count()) +
                      " ms (replication.timeout.ms): connection declared dead",
                  "");
}

// Handles what libpq has buffered, up to read_batch messages and while there
// is room in flight; a message the producer refuses is kept in `held`.
// Returns how many were handled.
int Relay::read_buffered(PgConnection& conn, HeldMessage& held) {
  int handled = 0;
  for (; handled < read_batch && has_room() && !paused_now(); ++handled) {
    char* buf = nullptr;
    int n = conn.try_get_copy_data(&buf);
    if (n == 0) break;
    if (n == -1) conn.finish_copy();  // throws with the server's reason
    last_received_ = std::chrono::steady_clock::now();
    Step step = handle_copy_data({reinterpret_cast<const std::byte*>(buf), static_cast<std::size_t>(n)});
    if (step == Step::retry) {
      held.data = buf;
      held.size = n;
      break;
    }
    PQfreemem(buf);
    if (step == Step::stop) break;
  }
  return handled;
}

// Waits until the socket is readable, or the status tick, a stop or a halt
// wakes the wait; then reads what arrived into libpq's buffer.
asio::awaitable<void> Relay::await_socket(PgConnection& conn) {
  auto at = clock_.next_status;
  if (bulk_read_) at = std::min(at, std::chrono::steady_clock::now() + bulk_delay);
  arm_tick(at);
  co_await conn.wait_readable();
  conn.consume_input();
}

// Counts the messages of the current window; at its end, turns bulk reading
// on or off by the window's rate. Called after every read of libpq's buffer,
// an empty one too, so a stream gone quiet turns it off within a window.
void Relay::note_messages(PgConnection& conn, int handled) {
  window_messages_ += handled;
  const auto now = std::chrono::steady_clock::now();
  const auto elapsed = now - window_start_;
  if (elapsed < bulk_window) return;
  // A rate: a window a quiet spell stretched counts its length (one large
  // transaction after an idle minute is no bulk).
  bool bulk = config_.bulk_read && static_cast<double>(window_messages_) * static_cast<double>(bulk_window.count()) >=
                                       static_cast<double>(bulk_messages) *
                                           std::chrono::duration<double, std::milli>(elapsed).count();
  window_start_ = now;
  window_messages_ = 0;
  if (bulk == bulk_read_) return;
  // A Unix-domain socket has no low-water mark for poll: every byte wakes
  // the loop whatever is set, and the ticks would only add wake-ups.
  if (bulk && !conn.is_tcp()) return;
  bulk_read_ = bulk;
  conn.set_receive_low_water(bulk ? bulk_low_water : 1);
  spdlog::debug("{} bulk reading {}", context(), bulk ? "on" : "off");
}

// The tick wakes the socket wait when the next status update is due. Set
// again only when that comes earlier than the tick already armed.
void Relay::arm_tick(std::chrono::steady_clock::time_point at) {
  if (tick_armed_ && tick_.expiry() <= at) return;
  tick_armed_ = true;
  tick_.expires_at(at);  // a later wait ends with operation_aborted
  tick_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;  // re-armed earlier, or the timer destroyed with the relay
    tick_armed_ = false;
    conn_.cancel_wait();
  });
}

// Brings the next status update to one interval from now at the latest
// (an event arrived, a commit made a position confirmable), when an idle
// session had put it further off.
void Relay::status_soon() {
  auto at = std::chrono::steady_clock::now() + std::chrono::milliseconds(config_.status_update_interval_ms);
  if (at >= clock_.next_status) return;
  clock_.next_status = at;
  if (tick_armed_) arm_tick(at);
}

// Waits while reads are held back, at most `at_most` and never past the next
// status update; woken early by wake_ (a delivery that makes room, a stop).
asio::awaitable<void> Relay::hold_back(std::chrono::milliseconds at_most) {
  auto now = std::chrono::steady_clock::now();
  auto until = std::min(clock_.next_status, now + at_most);
  co_await sleep(std::chrono::duration_cast<std::chrono::milliseconds>(until - now) + 1ms);
  // The socket is not read, yet the server is alive as far as we can tell:
  // silence while we hold back is ours, not the server's.
  const auto timeout = std::chrono::milliseconds(config_.replication_timeout_ms);
  last_received_ = std::max(last_received_, std::chrono::steady_clock::now() - timeout / 2);
}

// walrelay_backpressure, and a debug line when reads pause.
void Relay::note_backpressure(bool on) {
  if (on == backpressured_) return;
  backpressured_ = on;
  metrics_.backpressure.Set(on ? 1 : 0);
  if (on)
    spdlog::debug("{} backpressure: {} records, {} bytes in flight", context(), ledger_.inflight_records(),
                  ledger_.inflight_bytes());
}

// What the slot may be confirmed to now: what the ledger allows, never more.
Lsn Relay::confirmable() const {
  Lsn flushed = ledger_.flushed();
  // Exactly once: records in an open Kafka transaction are acknowledged but
  // not yet visible; the slot waits for the commit. Never backwards.
  if (auto limit = transactional_ ? transactional_->confirm_limit() : std::nullopt) flushed = std::max(sent_flushed_lsn_, std::min(flushed, *limit));
  if (mutation::active(mutation::Break::confirm_before_ack)) flushed = std::max(flushed, last_commit_end_);
  if (mutation::active(mutation::Break::sigterm_no_wait) && stop_requested_)
    flushed = std::max(flushed, last_commit_end_);
  return flushed;
}

// A standby status update.
asio::awaitable<void> Relay::send_status(PgConnection& conn, bool reply_requested) {
  auto& msg = status_msg_;
  Lsn flushed = confirmable();
  Lsn written = std::max(received_lsn_, flushed);
  pgoutput::encode_standby_status_update(msg, written, flushed, flushed, pgoutput::pg_epoch_micros_now(),
                                         reply_requested);
  co_await conn.put_copy_data(msg);
  if (flushed != sent_flushed_lsn_) spdlog::debug("slot={} confirmed_flush_lsn -> {}", config_.slot_name, flushed.to_string());
  sent_flushed_lsn_ = flushed;
  sent_written_lsn_ = written;
  metrics_.status_updates.Increment();
  update_gauges();
}

// Waits for records in flight (until the stop's or halt's deadline, or for a
// replay until each has settled), keeping the walsender informed, then sends
// the final status update.
asio::awaitable<void> Relay::drain(PgConnection* conn) {
  // A replay waits for every record to settle, however long the broker takes
  // (each either lands or fails, within kafka.message.timeout.ms); a
  // shutdown or a halt waits up to the one deadline set when it began.
  const bool settle_all = replay_reason_ && !stop_requested_ && !halt_reason_;
  if (!settle_all)
    set_state(halt_reason_ ? RelayState::halted : RelayState::draining, halt_reason_.value_or("shutting down"));
  auto past_deadline = [&] {
    if (settle_all) return stop_requested_ || halt_reason_.has_value();
    return !drain_deadline_ || std::chrono::steady_clock::now() >= *drain_deadline_;
  };
  // Nothing queued behind a failed record may land before it is sent again.
  // (Exactly once: the aborted transaction takes its queue with it, and a
  // purge would break a commit of what is whole.)
  if (settle_all && !transactional_) sink_.abort_queued();
  if (mutation::active(mutation::Break::sigterm_no_wait) && stop_requested_ && !halt_reason_)
    drain_deadline_ = std::chrono::steady_clock::now();
  // A record whose delivery failed for good is never acknowledged: waiting
  // for it would only spend the deadline.
  while (true) {
    // Exactly once: what is whole in the open Kafka transaction becomes
    // visible; each turn, for what waited for a commit under way goes into a
    // next transaction when that returns.
    if (!settle_all && transactional_) transactional_->commit_now();
    if (!(ledger_.inflight_records() > failed_records_ || (transactional_ && transactional_->settling())) || past_deadline() || sink_.fatal_error())
      break;
    sink_.poll();
    co_await sleep(20ms);
    if (conn && conn->connected() && std::chrono::steady_clock::now() - last_received_ > 1s) {
      // keep the walsender from timing us out while we wait
      try {
        co_await send_status(*conn, false);
      } catch (const PgError&) {
        conn = nullptr;
      }
      last_received_ = std::chrono::steady_clock::now();
    }
  }
  if (!settle_all && ledger_.inflight_records() > failed_records_)
    spdlog::warn("{} {} records still unacknowledged at shutdown; they will be sent again on restart", context(),
                 ledger_.inflight_records() - failed_records_);
  if (conn && conn->connected()) {
    try {
      co_await send_status(*conn, false);
      spdlog::info("slot={} final status update: confirmed_flush_lsn={}", config_.slot_name,
                   sent_flushed_lsn_.to_string());
    } catch (const PgError& e) {
      spdlog::warn("slot={} could not send the final status update: {}", config_.slot_name, e.what());
      co_return;
    }
    // Ended with the walsender's answer, so that it has applied the update
    // before walrelay exits: a restart, a standby taking over or an operator
    // reading pg_replication_slots sees it. Within the stop's deadline when
    // one is set (at most 2 s), for the walsender may be mid-transaction.
    auto now = std::chrono::steady_clock::now();
    auto deadline = now + 2s;
    if (drain_deadline_) deadline = std::min(deadline, std::max(*drain_deadline_, now + 250ms));
    try {
      co_await conn->end_copy(deadline);
      spdlog::debug("slot={} replication ended; the walsender has the final status update", config_.slot_name);
    } catch (const PgError& e) {
      spdlog::warn("slot={} the walsender did not end replication ({}): the final status update may not be applied, "
                   "and a restart may send again what it confirmed",
                   config_.slot_name, e.what());
    }
  }
}

}  // namespace walrelay
