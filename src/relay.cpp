#include "walrelay/relay.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "walrelay/backoff.hpp"
#include "walrelay/catalog.hpp"
#include "walrelay/mutation.hpp"

namespace walrelay {
namespace asio = boost::asio;
using namespace std::chrono_literals;
using pgoutput::Lsn;

namespace {

// Seconds from a commit timestamp (PostgreSQL epoch micros, the server's
// clock) to now on ours; a sidecar shares the host's clock.
double seconds_since(std::int64_t commit_time_us) {
  return static_cast<double>(pgoutput::pg_epoch_micros_now() - commit_time_us) / 1e6;
}

// SQLSTATEs the session distinguishes.
constexpr const char* sqlstate_object_in_use = "55006";           // slot active for another PID
constexpr const char* sqlstate_undefined_object = "42704";        // slot does not exist
constexpr const char* sqlstate_prerequisite_state = "55000";      // slot invalidated

// A condition the session cannot recover from by reconnecting.
struct Fatal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (auto& i : items) out += (out.empty() ? "" : std::string(sep)) + i;
  return out;
}

// DDL that failed for want of a privilege or an object fails again on every
// retry: a halt that names the fix, not a reconnect loop.
asio::awaitable<void> ddl(asio::awaitable<void> op) {
  try {
    co_await std::move(op);
  } catch (const PgError& e) {
    if (e.sqlstate().rfind("42", 0) == 0) throw Fatal(e.what());
    throw;
  }
}

std::int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Relay::Relay(asio::io_context& io, const Config& config, Metrics& metrics, Sink& sink)
    : io_(io), config_(config), metrics_(metrics), sink_(sink), mapper_(config), conn_(io), wake_(io), tick_(io) {
  sink_.on_delivery([this](const Delivery& d) { on_delivery(d); });
  ledger_.on_retired([this](std::int64_t commit_time) { metrics_.commit_to_ack.Observe(seconds_since(commit_time)); });
  for (auto& t : config_.table_include_list) table_names_.push_back(t.qualified());
  relayed_counters_.resize(table_names_.size());
  record_.headers.reserve(4 + config_.additional_placement.size());
}

Relay::~Relay() { sink_.on_delivery(nullptr); }

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
  if (config_.slot_status_interval_ms > 0) asio::co_spawn(io_, slot_status_loop(), asio::detached);
}

void Relay::request_stop() {
  if (stop_requested_) return;
  spdlog::info("{} stop requested: finishing in-flight records", context());
  stop_requested_ = true;
  // One deadline for the whole shutdown, however many places wait on it.
  drain_deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(config_.shutdown_timeout_ms);
  wake_.cancel();
  conn_.cancel_wait();
}

std::string Relay::context() const {
  std::string s = "slot=" + config_.slot_name + " lsn=" + received_lsn_.to_string();
  if (txn_) s += " xid=" + std::to_string(xid_);
  return s;
}

void Relay::set_state(RelayState state, std::string reason) {
  if (state_ == RelayState::halted) return;  // final
  state_ = state;
  state_reason_ = std::move(reason);
  update_gauges();
}

void Relay::halt(std::string reason) {
  if (halt_reason_) return;
  spdlog::critical("{} halted: {}", context(), reason);
  halt_reason_ = reason;
  if (!drain_deadline_)
    drain_deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(config_.shutdown_timeout_ms);
  set_state(RelayState::halted, std::move(reason));
  metrics_.halted.Set(1);
  wake_.cancel();
  conn_.cancel_wait();
}

void Relay::replay(std::string reason) {
  if (halt_reason_ || stop_requested_ || replay_reason_) return;  // nothing past it is confirmed either way
  spdlog::error("{} {}; sending everything from the slot's confirmed position again once the records in flight "
                "have settled",
                context(), reason);
  replay_reason_ = std::move(reason);
  set_state(RelayState::reconnecting, "sending again after a delivery failure: " + *replay_reason_);
  wake_.cancel();
  conn_.cancel_wait();
}

void Relay::check_ledger() {
  if (auto& v = ledger_.violation(); v && !halt_reason_)
    halt("internal error: the LSN ledger's bookkeeping broke (" + *v +
         "); walrelay stops rather than confirm a position it cannot vouch for");
}

bool Relay::has_room() const {
  return ledger_.inflight_records() < static_cast<std::uint64_t>(config_.max_inflight_records) &&
         ledger_.inflight_bytes() < static_cast<std::uint64_t>(config_.max_inflight_bytes);
}

asio::awaitable<void> Relay::sleep(std::chrono::milliseconds duration) {
  wake_.expires_after(duration);
  boost::system::error_code ec;
  co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

asio::awaitable<void> Relay::run() {
  Backoff backoff(std::chrono::milliseconds(config_.reconnect_backoff_ms),
                  std::chrono::milliseconds(config_.reconnect_backoff_max_ms));
  while (!stop_requested_ && !halt_reason_) {
    set_state(RelayState::connecting);
    int streamed_before = sessions_streamed_;
    bool standby = false;
    try {
      co_await session();
      backoff.reset();
    } catch (const Fatal& e) {
      if (!halt_reason_) halt(e.what());
    } catch (const PgError& e) {
      if (e.sqlstate() == sqlstate_object_in_use) {
        // Another walrelay holds the slot: wait as a standby, take over when it goes.
        set_state(RelayState::standby, e.what());
        spdlog::info("slot={} standby: {}", config_.slot_name, e.what());
        standby = true;
      } else {
        set_state(RelayState::reconnecting, e.what());
        spdlog::error("{} replication connection lost: {}", context(), e.what());
      }
    }
    if (standby) {
      conn_.close();
      co_await sleep(std::min<std::chrono::milliseconds>(2000ms, std::chrono::milliseconds(config_.reconnect_backoff_max_ms)));
      continue;
    }
    conn_.close();
    ledger_.abandon_open();
    txn_.reset();
    if (stop_requested_ || halt_reason_) break;
    if (replay_reason_) {
      // Every record still in flight must settle first: a late report must
      // never meet the fresh ledger.
      co_await drain(nullptr);
      if (stop_requested_ || halt_reason_) break;
      ledger_.reset();
      failed_records_ = 0;
      replay_reason_.reset();
      metrics_.replays.Increment();
      spdlog::info("slot={} every record has settled; replaying from the slot's confirmed position",
                   config_.slot_name);
    }
    metrics_.reconnects.Increment();
    if (sessions_streamed_ > streamed_before) backoff.reset();
    auto delay = backoff.next();
    spdlog::info("slot={} reconnecting in {} ms", config_.slot_name, delay.count());
    co_await sleep(delay);
  }
  // Shutdown or halt: let what is in flight land, confirm as far as it goes.
  co_await drain(nullptr);
  // A lost slot is a halt too: a restart would create a new slot and skip
  // events, so it must not look like a crash a supervisor retries.
  if (halt_reason_) exit_code_ = exit_halted;
  else set_state(RelayState::stopped);
  spdlog::info("slot={} stopped; confirmed_flush_lsn={} exit code {}", config_.slot_name,
               sent_flushed_lsn_.to_string(), exit_code_);
  io_.stop();
}

asio::awaitable<void> Relay::session() {
  spdlog::info("connecting: {}", config_.conninfo_redacted(true));
  co_await conn_.connect(config_.conninfo(true), std::chrono::milliseconds(config_.database_connect_timeout_ms));
  co_await prepare(conn_);
  sessions_streamed_++;
  co_await stream(conn_);
}

asio::awaitable<void> Relay::prepare(PgConnection& conn) {
  auto ident = co_await conn.query("IDENTIFY_SYSTEM");
  if (ident.rows.empty()) throw PgError("could not identify the system: empty answer", "");
  spdlog::info("connected: systemid={} timeline={} xlogpos={} dbname={} server_version={}",
               ident.at(0, "systemid").value_or("?"), ident.at(0, "timeline").value_or("?"),
               ident.at(0, "xlogpos").value_or("?"), ident.at(0, "dbname").value_or("?"), conn.server_version());
  if (conn.server_version() >= 190000)
    spdlog::warn("PostgreSQL {} is newer than walrelay has been tested with (14 to 18)", conn.server_version() / 10000);

  std::vector<std::string> problems, warnings;
  auto facts = co_await inspect_server(conn, config_, ident.at(0, "systemid").value_or(""), problems, warnings);
  for (auto& w : warnings) spdlog::warn("{}", w);
  if (!facts.slot.exists && sessions_streamed_ > 0) {
    metrics_.slot_invalidated.Set(1);
    problems.push_back("slot.name: replication slot " + config_.slot_name +
                       " was dropped while walrelay was using it; recreating it would skip events, so walrelay "
                       "stops. To accept the gap, run walrelay --reset-slot once, then start walrelay again.");
  } else if (auto p = slot_problem(config_, facts)) {
    metrics_.slot_invalidated.Set(1);
    problems.push_back(*p);
  }
  if (!problems.empty()) throw Fatal(join(problems, "; "));

  auto publication = publication_problems(config_, facts);
  if (!publication.empty()) {
    if (config_.publication_autocreate == PublicationAutocreate::disabled)
      throw Fatal(join(publication, "; ") + " (publication.autocreate.mode=disabled: walrelay does not change it)");
    co_await ddl(ensure_publication(conn, config_, facts));
  }

  if (!facts.slot.exists) {
    spdlog::warn("slot={} does not exist and walrelay has not created it before: creating it; outbox rows committed "
                 "before its consistent point are not relayed",
                 config_.slot_name);
    auto created = co_await create_slot(conn, config_);
    co_await ddl(mark_slot(conn, config_, facts, created));
  } else if (!facts.marker) {
    co_await ddl(mark_slot(conn, config_, facts, std::nullopt));
  }

  // Highest protocol the server speaks. Streaming and two-phase stay off: the
  // walsender then sends only committed transactions, in commit order, so an
  // event of a rolled-back transaction can never reach the sink.
  int version = conn.server_version();
  proto_version_ = version >= 160000 ? 4 : version >= 150000 ? 3 : 2;
  decoder_ = pgoutput::Decoder(proto_version_);
  std::string cmd = "START_REPLICATION SLOT " + conn.quote_identifier(config_.slot_name) + " LOGICAL 0/0 (" +
                    "proto_version '" + std::to_string(proto_version_) + "', publication_names " +
                    conn.quote_literal(conn.quote_identifier(config_.publication_name)) +
                    (config_.binary ? ", binary 'true'" : "") + ")";
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
  spdlog::info("slot={} streaming: {}", config_.slot_name, cmd);
  set_state(RelayState::streaming);
}

asio::awaitable<void> Relay::stream(PgConnection& conn) {
  const auto status_interval = std::chrono::milliseconds(config_.status_update_interval_ms);
  const auto timeout = std::chrono::milliseconds(config_.replication_timeout_ms);
  last_received_ = std::chrono::steady_clock::now();
  auto next_status = last_received_;
  bool pinged = false;
  bool drained_socket = false;  // a non-blocking read found nothing since the last message
  char* pending = nullptr;  // a message to retry (queue full), kept until handled
  int pending_len = 0;
  struct Free {
    char*& p;
    ~Free() {
      if (p) PQfreemem(p);
    }
  } free_pending{pending};

  while (!stop_requested_ && !halt_reason_ && !replay_reason_) {
    auto now = std::chrono::steady_clock::now();
    if (now >= next_status || reply_requested_) {
      bool ask = !pinged && now - last_received_ > timeout / 3;
      co_await send_status(conn, ask);
      pinged = pinged || ask;
      reply_requested_ = false;
      next_status = now + status_interval;
    }
    if (now - last_received_ > timeout)
      throw PgError("no message from the server for " + std::to_string(timeout.count()) +
                        " ms (replication.timeout.ms): connection declared dead", "");
    if (sink_.fatal_error()) {
      halt(*sink_.fatal_error());
      break;
    }

    // Backpressure: with the in-flight limits reached, stop reading. The
    // walsender then blocks on a full socket; memory stays bounded.
    if (!has_room() || pending) {
      if (!backpressured_) {
        backpressured_ = true;
        metrics_.backpressure.Set(1);
        spdlog::debug("{} backpressure: {} records, {} bytes in flight", context(), ledger_.inflight_records(),
                      ledger_.inflight_bytes());
      }
      sink_.poll();
      if (pending) {
        Step step = handle_copy_data({reinterpret_cast<const std::byte*>(pending), static_cast<std::size_t>(pending_len)});
        if (step != Step::retry) {
          PQfreemem(pending);
          pending = nullptr;
          if (step == Step::stop) break;
          continue;
        }
      }
      if (!has_room() || pending) {
        auto until = std::min(next_status, now + (pending ? 10ms : 200ms));
        co_await sleep(std::chrono::duration_cast<std::chrono::milliseconds>(until - now) + 1ms);
        // The socket is not read, yet the server is alive as far as we can
        // tell: silence while we hold back is ours, not the server's.
        last_received_ = std::max(last_received_, std::chrono::steady_clock::now() - timeout / 2);
        continue;
      }
    }
    if (backpressured_) {
      backpressured_ = false;
      metrics_.backpressure.Set(0);
    }

    // Read everything libpq has buffered, a bounded batch at a time so the
    // loop still serves delivery reports and the admin endpoint.
    int handled = 0;
    for (; handled < 2048 && has_room(); ++handled) {
      char* buf = nullptr;
      int n = conn.try_get_copy_data(&buf);
      if (n == 0) break;
      if (n == -1) conn.finish_copy();  // throws with the server's reason
      last_received_ = std::chrono::steady_clock::now();
      pinged = false;
      drained_socket = false;
      Step step = handle_copy_data({reinterpret_cast<const std::byte*>(buf), static_cast<std::size_t>(n)});
      if (step == Step::retry) {
        pending = buf;
        pending_len = n;
        break;
      }
      PQfreemem(buf);
      if (step == Step::stop) break;
    }
    if (stop_requested_ || halt_reason_ || replay_reason_) break;
    if (handled > 0 || pending) {
      sink_.poll();
      if (handled >= 2048) {
        // Let other handlers run before the next batch.
        co_await asio::post(io_, asio::use_awaitable);
      }
      continue;
    }
    // Under load the socket usually has data already: a non-blocking read
    // first saves a timer and an epoll registration per wake-up.
    if (!drained_socket) {
      conn.consume_input();
      drained_socket = true;
      continue;
    }
    drained_socket = false;
    if (!tick_armed_) {
      tick_armed_ = true;
      tick_.expires_at(std::min(next_status, now + 1000ms));
      tick_.async_wait([this](boost::system::error_code ec) {
        if (ec) return;  // only when the timer is destroyed with the relay
        tick_armed_ = false;
        conn_.cancel_wait();
      });
    }
    co_await conn.wait_readable();  // readable, or woken by tick_, a stop or a halt
    conn.consume_input();
  }
  co_await drain(&conn);
}

asio::awaitable<void> Relay::send_status(PgConnection& conn, bool reply_requested) {
  auto& msg = status_msg_;
  Lsn flushed = ledger_.flushed();
  if (mutation::active(mutation::Break::confirm_before_ack)) flushed = std::max(flushed, last_commit_end_);
  if (mutation::active(mutation::Break::sigterm_no_wait) && stop_requested_)
    flushed = std::max(flushed, last_commit_end_);
  Lsn written = std::max(received_lsn_, flushed);
  pgoutput::encode_standby_status_update(msg, written, flushed, flushed, pgoutput::pg_epoch_micros_now(),
                                         reply_requested);
  co_await conn.put_copy_data(msg);
  if (flushed != sent_flushed_lsn_) spdlog::debug("slot={} confirmed_flush_lsn -> {}", config_.slot_name, flushed.to_string());
  sent_flushed_lsn_ = flushed;
  metrics_.status_updates.Increment();
  update_gauges();
}

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
  if (settle_all) sink_.abort_queued();
  if (mutation::active(mutation::Break::sigterm_no_wait) && stop_requested_ && !halt_reason_)
    drain_deadline_ = std::chrono::steady_clock::now();
  // A record whose delivery failed for good is never acknowledged: waiting
  // for it would only spend the deadline.
  while (ledger_.inflight_records() > failed_records_ && !past_deadline() && !sink_.fatal_error()) {
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
    }
  }
}

Relay::Step Relay::handle_copy_data(std::span<const std::byte> data) {
  auto decoded = pgoutput::decode_replication_message(data);
  if (!decoded) {
    metrics_.decode_errors.Increment();
    halt(std::string("could not decode a replication message: ") + pgoutput::to_string(decoded.error().code) +
         " at byte " + std::to_string(decoded.error().offset) + " (" + std::string(decoded.error().detail) + ")");
    return Step::stop;
  }
  metrics_.messages_received.Increment();
  if (auto* ka = std::get_if<pgoutput::PrimaryKeepalive>(&decoded.value())) {
    stream_wal_end_ = std::max(stream_wal_end_, ka->wal_end);
    ledger_.server_position(ka->wal_end);
    if (ka->reply_requested) reply_requested_ = true;
    return Step::done;
  }
  return handle_message(std::get<pgoutput::XLogData>(decoded.value()));
}

Relay::Step Relay::handle_message(const pgoutput::XLogData& xlog) {
  stream_wal_end_ = std::max(stream_wal_end_, xlog.wal_end);
  auto decoded = decoder_.decode(xlog.payload);
  if (!decoded) {
    metrics_.decode_errors.Increment();
    halt("could not decode a pgoutput message at " + xlog.wal_start.to_string() + ": " +
         pgoutput::to_string(decoded.error().code) + " at byte " + std::to_string(decoded.error().offset) + " (" +
         std::string(decoded.error().detail) + ")");
    return Step::stop;
  }
  Step step = Step::done;
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, pgoutput::Begin>) {
          txn_ = ledger_.open(m.commit_time, m.final_lsn);
          xid_ = m.xid;
          commit_time_ = m.commit_time;
          txn_lsn_ = m.final_lsn;
        } else if constexpr (std::is_same_v<T, pgoutput::Commit>) {
          if (txn_ && ledger_.had_records(*txn_)) metrics_.commit_to_receive.Observe(seconds_since(commit_time_));
          if (txn_) ledger_.commit(*txn_, m.end_lsn);
          txn_.reset();
          last_commit_end_ = m.end_lsn;
          metrics_.transactions.Increment();
        } else if constexpr (std::is_same_v<T, pgoutput::Relation>) {
          bool outbox = mapper_.on_relation(m);
          spdlog::debug("{} relation {} oid={} outbox={}", context(), mapper_.table_name(m.oid), m.oid, outbox);
        } else if constexpr (std::is_same_v<T, pgoutput::Insert>) {
          step = mapper_.is_outbox(m.relation_oid) ? relay_insert(m, xlog.wal_start) : skip_insert(m, xlog.wal_start);
        } else if constexpr (std::is_same_v<T, pgoutput::Update> || std::is_same_v<T, pgoutput::Delete> ||
                             std::is_same_v<T, pgoutput::Truncate> || std::is_same_v<T, pgoutput::Type> ||
                             std::is_same_v<T, pgoutput::Origin>) {
          // Not outbox events: a publication that someone else widened.
        } else {
          // Streamed or prepared transactions and logical messages are never
          // requested; receiving one means the stream is not what the ledger
          // assumes (committed transactions only, each whole).
          metrics_.decode_errors.Increment();
          halt(std::string("unexpected ") + pgoutput::message_name(decoded.value()) + " message at " +
               xlog.wal_start.to_string() + ": walrelay asked for committed transactions only");
          step = Step::stop;
        }
      },
      decoded.value());
  if (step != Step::retry) received_lsn_ = std::max(received_lsn_, xlog.wal_start);
  return step;
}

Relay::Step Relay::relay_insert(const pgoutput::Insert& insert, Lsn lsn) {
  if (!txn_) {
    halt("Insert outside a transaction at " + lsn.to_string());
    return Step::stop;
  }
  if (auto error = mapper_.map(insert, commit_time_, record_)) {
    metrics_.mapping_errors(error->reason).Increment();
    return dead_letter_row(insert, *error, lsn);
  }
  std::size_t bytes = record_.size_bytes();
  std::uint16_t table = record_.table_index;
  // Counted before submit: a synchronous rejection reports its delivery at once.
  ledger_.add_record(*txn_, bytes);
  check_ledger();
  switch (sink_.submit(record_, make_token(*txn_, table))) {
    case SubmitStatus::accepted:
    case SubmitStatus::failed:  // its Delivery has been handled already
      return halt_reason_ ? Step::stop : Step::done;
    case SubmitStatus::queue_full:
      ledger_.withdraw(*txn_, bytes);  // not taken: offered again later
      return Step::retry;
  }
  return Step::done;
}

Relay::Step Relay::skip_insert(const pgoutput::Insert& insert, Lsn lsn) {
  auto table = mapper_.table_name(insert.relation_oid);
  if (table.empty()) {
    metrics_.decode_errors.Increment();
    halt("Insert at " + lsn.to_string() + " for relation OID " + std::to_string(insert.relation_oid) +
         " that no Relation message described: the stream is not what walrelay expects");
    return Step::stop;
  }
  auto [it, first] = skipped_.try_emplace(insert.relation_oid, nullptr);
  if (first) {
    it->second = &metrics_.skipped_rows(table);
    spdlog::warn("{} the publication sends inserts into {}, which is not in table.include.list: its rows are "
                 "skipped and counted in walrelay_skipped_rows_total (a partition of a partitioned outbox? the "
                 "publication then needs publish_via_partition_root = true)",
                 context(), table);
  }
  it->second->Increment();
  return Step::done;
}

Relay::Step Relay::dead_letter_row(const pgoutput::Insert& insert, const MapError& error, Lsn lsn) {
  std::string where = "table " + std::string(mapper_.table_name(insert.relation_oid)) + " id " +
                      mapper_.event_id_of(insert) + " at LSN " + lsn.to_string() + " (xid " + std::to_string(xid_) + ")";
  if (config_.errors_tolerance == ErrorTolerance::none) {
    halt("could not map the outbox row of " + where + ": " + error.message +
         " (errors.tolerance=none; nothing past this row is confirmed)");
    return Step::stop;
  }
  spdlog::error("{} could not map the outbox row of {}: {}; sending it to {}", context(), where, error.message,
                config_.dlq_topic);
  scratch_ = mapper_.row_json(insert);
  const std::string table(mapper_.table_name(insert.relation_oid)), lsn_text = lsn.to_string(),
      id = mapper_.event_id_of(insert);
  std::vector<OutboxRecord::Header> headers;
  if (config_.dlq_context_headers) {
    headers.push_back({"__connect.errors.exception.class.name", std::string_view("walrelay.MappingError")});
    headers.push_back({"__connect.errors.exception.message", error.message});
    headers.push_back({"walrelay.error.reason", error.reason});
    headers.push_back({"walrelay.source.table", table});
    headers.push_back({"walrelay.source.lsn", lsn_text});
  }
  headers.push_back({"id", id});
  std::size_t bytes = scratch_.size();
  if (mutation::active(mutation::Break::skip_dlq_wait)) {
    // The row counts as settled at once; its copy's report is ignored.
    sink_.submit_dead_letter(error.reason, config_.dlq_topic, std::nullopt, scratch_, headers,
                             make_token(*txn_, mutation_ignored_table), bytes);
    return Step::done;
  }
  ledger_.add_record(*txn_, bytes);
  auto status = sink_.submit_dead_letter(error.reason, config_.dlq_topic, std::nullopt, scratch_, headers,
                                         make_token(*txn_, 0), bytes);
  if (status == SubmitStatus::queue_full) {
    ledger_.withdraw(*txn_, bytes);
    return Step::retry;
  }
  return halt_reason_ ? Step::stop : Step::done;
}

prometheus::Counter& Relay::relayed_counter(std::uint16_t table, std::string_view topic) {
  auto& by_topic = relayed_counters_.at(table);
  auto it = by_topic.find(topic);  // heterogeneous: no string built per ack
  if (it != by_topic.end()) return *it->second;
  // Topics come from row data: past a bound, new ones share one series whose
  // label no Kafka topic can have, so the scrape stays small.
  std::size_t series = 0;
  for (auto& t : relayed_counters_) series += t.size();
  if (series >= max_topic_series) {
    auto other = by_topic.find(other_topics_label);
    if (other != by_topic.end()) return *other->second;
    spdlog::warn("{} events for more than {} topics: further topics are counted under topic=\"{}\"", context(),
                 max_topic_series, other_topics_label);
    topic = other_topics_label;
  }
  auto& c = metrics_.events_relayed(table_names_.at(table), topic);
  by_topic.emplace(std::string(topic), &c);
  return c;
}

void Relay::on_delivery(const Delivery& d) {
  if (mutation::active(mutation::Break::skip_dlq_wait) && token_table(d.token) == mutation_ignored_table) return;
  auto txn = token_txn(d.token);
  if (d.ok) {
    ledger_.ack(txn, d.bytes);
    check_ledger();
    if (d.dead_lettered) {
      metrics_.dead_lettered(d.dead_letter_reason).Increment();
    } else {
      relayed_counter(token_table(d.token), d.topic).Increment();
      metrics_.bytes_relayed.Increment(static_cast<double>(d.bytes));
    }
    if (backpressured_ && has_room()) wake_.cancel();
    return;
  }
  metrics_.delivery_errors(d.error_code).Increment();
  ++failed_records_;  // stays in the ledger: nothing at or past it is confirmed
  auto lsn = ledger_.commit_lsn_of(txn);
  std::string id;
  for (auto& h : d.headers)
    if (h.name == "id" && h.value) id = std::string(*h.value);
  std::string where = "record for topic " + std::string(d.topic) + " (table " +
                      table_names_.at(token_table(d.token)) + ", id " + id + ", transaction commit LSN " +
                      (lsn ? lsn->to_string() : std::string("?")) + ")";
  if (d.transient) {
    // Not the record's fault: it is sent again, never dead-lettered. Sending
    // it alone would overtake nothing but could be overtaken; the slot gives
    // every record from the first unacknowledged one again, in order.
    replay("could not deliver the " + where + ": " + d.error_message + " (" + d.error_code + ", transient)");
    return;
  }
  if (d.dead_lettered) {
    halt("could not write to the dead-letter topic " + config_.dlq_topic + ": " + d.error_message + " (" + where + ")");
    return;
  }
  if (config_.errors_tolerance == ErrorTolerance::none) {
    halt("could not deliver the " + where + ": " + d.error_message + " (" + d.error_code +
         "; errors.tolerance=none; nothing past this record is confirmed)");
    return;
  }
  spdlog::error("{} could not deliver the {}: {} ({}); sending it to {}", context(), where, d.error_message,
                d.error_code, config_.dlq_topic);
  // The dead-letter copy keeps the original key and headers. A record the
  // broker refused for its size goes without its value, or it would be
  // refused again; the headers say where the row is.
  const std::string value_size = std::to_string(d.value ? d.value->size() : 0);
  std::vector<OutboxRecord::Header> headers = d.headers;
  bool drop_value = d.error_code == "msg_size_too_large" || d.error_code == "record_list_too_large" ||
                    d.error_code == "invalid_record";
  if (config_.dlq_context_headers) {
    headers.push_back({"__connect.errors.topic", d.topic});
    headers.push_back({"__connect.errors.exception.class.name", std::string_view("walrelay.DeliveryError")});
    headers.push_back({"__connect.errors.exception.message", d.error_message});
    headers.push_back({"walrelay.error.reason", d.error_code});
    if (drop_value) headers.push_back({"walrelay.value.dropped.bytes", value_size});
  }
  // This record's ledger entry stays counted until the copy is acknowledged.
  --failed_records_;  // handed on: its dead-letter copy settles it
  if (mutation::active(mutation::Break::skip_dlq_wait)) {
    ledger_.ack(txn, d.bytes);
    sink_.submit_dead_letter(d.error_code, config_.dlq_topic, d.key, drop_value ? std::nullopt : d.value, headers,
                             make_token(txn, mutation_ignored_table), d.bytes);
    return;
  }
  auto status = sink_.submit_dead_letter(d.error_code, config_.dlq_topic, d.key, drop_value ? std::nullopt : d.value,
                                         headers, d.token, d.bytes);
  if (status == SubmitStatus::queue_full) {
    ++failed_records_;  // the copy was not taken: the record stays unsettled
    halt("could not queue the dead-letter copy of the " + where + ": producer queue full");
  }
}

// The server's current WAL position and the slot's lag behind it: from the
// slot poller when it has answered (the server's own view, which keeps moving
// while walrelay holds back), else from the stream.
Relay::Lag Relay::lag() const {
  Lag out;
  if (server_info_ && server_info_->current_wal_lsn && server_info_->confirmed_flush_lsn) {
    out.wal_end = *server_info_->current_wal_lsn;
    auto confirmed = *server_info_->confirmed_flush_lsn;
    out.bytes = out.wal_end.value > confirmed.value ? out.wal_end.value - confirmed.value : 0;
    if (server_info_->restart_lsn && out.wal_end.value > server_info_->restart_lsn->value)
      out.retained_bytes = out.wal_end.value - server_info_->restart_lsn->value;
  } else {
    out.wal_end = std::max(stream_wal_end_, received_lsn_);
    out.bytes = out.wal_end.value > sent_flushed_lsn_.value ? out.wal_end.value - sent_flushed_lsn_.value : 0;
  }
  auto oldest = ledger_.oldest_unacked_commit_time();
  out.seconds = oldest ? std::max(0.0, (pgoutput::pg_epoch_micros_now() - *oldest) / 1e6) : 0.0;
  return out;
}

void Relay::update_gauges() const {
  auto l = lag();
  metrics_.received_lsn.Set(static_cast<double>(received_lsn_.value));
  metrics_.flushed_lsn.Set(static_cast<double>(sent_flushed_lsn_.value));
  metrics_.server_wal_end.Set(static_cast<double>(l.wal_end.value));
  metrics_.lag_bytes.Set(static_cast<double>(l.bytes));
  metrics_.retained_wal_bytes.Set(static_cast<double>(l.retained_bytes));
  metrics_.set_safe_wal_size(server_info_ && server_info_->safe_wal_size
                                 ? std::optional<double>(static_cast<double>(*server_info_->safe_wal_size))
                                 : std::nullopt);
  metrics_.lag_seconds.Set(l.seconds);
  metrics_.inflight_records.Set(static_cast<double>(ledger_.inflight_records()));
  metrics_.inflight_bytes.Set(static_cast<double>(ledger_.inflight_bytes()));
  metrics_.ready.Set(state_ == RelayState::streaming && sink_.healthy() ? 1 : 0);
}

StatusSnapshot Relay::status() const {
  update_gauges();
  auto l = lag();
  StatusSnapshot s;
  s.slot_name = config_.slot_name;
  s.state = state_;
  s.state_reason = state_reason_;
  s.received_lsn = received_lsn_;
  s.confirmed_flush_lsn = sent_flushed_lsn_;
  s.server_wal_end = l.wal_end;
  s.lag_bytes = l.bytes;
  s.retained_wal_bytes = l.retained_bytes;
  s.lag_seconds = l.seconds;
  s.inflight_records = ledger_.inflight_records();
  s.inflight_bytes = ledger_.inflight_bytes();
  s.producer_healthy = sink_.healthy() && !sink_.fatal_error();
  s.producer_error = sink_.fatal_error().value_or(sink_.health_reason());
  s.server = server_info_;
  return s;
}

asio::awaitable<void> Relay::slot_status_loop() {
  // The server's own view of the slot on an ordinary connection: catalog
  // reads only, never the outbox.
  PgConnection conn(io_);
  const auto interval = std::chrono::milliseconds(config_.slot_status_interval_ms);
  // g++ 12 cannot keep an initializer_list's array in a coroutine frame.
  std::vector<std::string> params;
  params.push_back(config_.slot_name);
  while (!stop_requested_ && !halt_reason_) {
    try {
      if (!conn.connected())
        co_await conn.connect(config_.conninfo(false), std::chrono::milliseconds(config_.database_connect_timeout_ms));
      // On a standby (decoding there needs 16+) the WAL received is the end
      // the slot can reach, so its lag includes the standby's replay lag.
      auto rows = co_await conn.query(
          "SELECT wal_status, safe_wal_size, active_pid, confirmed_flush_lsn, restart_lsn, "
          "CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_receive_lsn() "
          "ELSE pg_catalog.pg_current_wal_lsn() END AS current_wal_lsn "
          "FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
          params, 10s);
      if (rows.rows.empty()) {
        server_info_.reset();
        if (state_ == RelayState::streaming)
          spdlog::warn("slot={} is not in pg_replication_slots", config_.slot_name);
      } else {
        ServerSlotInfo info;
        info.wal_status = rows.at(0, "wal_status").value_or("");
        if (auto& v = rows.at(0, "safe_wal_size")) info.safe_wal_size = std::stoll(*v);
        if (auto& v = rows.at(0, "active_pid")) info.active_pid = std::stoi(*v);
        if (auto& v = rows.at(0, "confirmed_flush_lsn")) info.confirmed_flush_lsn = Lsn::parse(*v);
        if (auto& v = rows.at(0, "restart_lsn")) info.restart_lsn = Lsn::parse(*v);
        if (auto& v = rows.at(0, "current_wal_lsn")) info.current_wal_lsn = Lsn::parse(*v);
        info.observed_at_unix_ms = unix_ms_now();
        if (info.wal_status == "lost" && !halt_reason_) {
          metrics_.slot_invalidated.Set(1);
          halt("slot.name: replication slot " + config_.slot_name +
               " has been invalidated (wal_status lost: max_slot_wal_keep_size exceeded): the events it held are "
               "gone. To accept the gap, run walrelay --reset-slot once");
        }
        server_info_ = std::move(info);
      }
    } catch (const PgError& e) {
      spdlog::warn("slot={} could not read pg_replication_slots: {}", config_.slot_name, e.what());
      conn.close();
    }
    asio::steady_timer timer(io_, interval);
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

}  // namespace walrelay
