// The operator's hold on the relay: pause and resume (kept in the slot
// marker), the restart's hand-over of the pause (see relay.hpp for the
// other files of Relay).
#include <spdlog/spdlog.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "walrelay/relay/relay.hpp"
#include "walrelay/source/catalog.hpp"

namespace walrelay {
namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

// The slot as a generation hands it on: its database and name.
std::string slot_identity(const Config& config) { return config.database_dbname + "/" + config.slot_name; }

// What a walrelay that does not hold the slot answers: the one that does
// decides (a standby between its tries is not always in the standby state).
std::string standby_refusal() {
  return "this walrelay does not hold the slot (a standby, or not streaming yet): pause and resume the one that "
         "streams it (GET /status there), which records it for the others";
}

}  // namespace

std::optional<std::string> Relay::pause(const std::string& who) {
  if (!holds_slot_) return standby_refusal();
  ++pause_.epoch;
  if (pause_.requested) {
    // The first request's time and author stand; the marker is written
    // again all the same (it may have lost it).
    pause_.unrecorded = true;
    record_pause();
    return std::nullopt;
  }
  pause_.requested = true;
  pause_.since = utc_now_iso();
  pause_.by = who;
  pause_.unrecorded = true;
  spdlog::warn("{} paused by {}: no more WAL is read once the transaction being read ends; records in flight settle "
               "and are confirmed; the slot stays held",
               context(), who);
  note_paused();
  record_pause();
  // The read loop, waiting on the socket or for room, looks again now.
  if (state_ == RelayState::streaming) {
    wake_.cancel();
    conn_.cancel_wait();
  }
  return std::nullopt;
}

std::optional<std::string> Relay::resume(const std::string& who) {
  if (!holds_slot_) return standby_refusal();
  ++pause_.epoch;
  pause_.unrecorded = true;  // written even when not paused here: the marker may hold a pause
  record_pause();
  if (!pause_.requested) return std::nullopt;
  pause_.requested = false;
  spdlog::info("{} resumed by {} (paused since {} by {})", context(), who, pause_.since, pause_.by);
  note_paused();
  if (state_ == RelayState::streaming) wake_.cancel();
  return std::nullopt;
}

std::optional<std::string> Relay::restart_refused() const {
  if (state_ == RelayState::halted && halt_cause_ == "slot")
    return "the replication slot is lost: a new session would create a new one and skip the events in between. "
           "Recover them, then run walrelay --reset-slot and start walrelay again (docs/operations.md)";
  return std::nullopt;
}

Relay::PauseRequest Relay::pause_request() const {
  return {pause_.requested, pause_.since, pause_.by, pause_.unrecorded,
          sessions_streamed_ > 0 ? slot_identity(config_) : std::string()};
}

// A restart keeps what the operator asked: paused stays paused, and a
// request the marker does not hold yet is written by this generation.
void Relay::carry_pause(const PauseRequest& carried) {
  pause_.requested = carried.paused;
  pause_.since = carried.since;
  pause_.by = carried.by;
  pause_.unrecorded = carried.unrecorded;
  // The same slot streamed by the generation before: one found missing now
  // was dropped, not never made (check_source halts rather than make it).
  if (!carried.streamed_slot.empty() && carried.streamed_slot == slot_identity(config_)) sessions_streamed_ = 1;
  note_paused();
  if (pause_.unrecorded) record_pause();
}

// Starts the slot marker's writer unless it runs already (it writes the
// newest request before it ends).
void Relay::record_pause() {
  if (pause_.writer_running) return;
  pause_.writer_running = true;
  asio::co_spawn(io_, persist_pause(), asio::detached);
}

// Writes the pause into the slot marker on a connection of its own (the
// replication connection takes no SQL while it streams), until the marker
// holds the newest request; tries again every 5 s while it cannot, saying
// why in the log and in /status.
asio::awaitable<void> Relay::persist_pause() {
  while (pause_.unrecorded && !stop_requested_) {
    // Named, not temporaries of the co_await expressions: g++ 12 destroyed
    // a conditional's temporary there twice.
    const bool paused = pause_.requested;
    const std::uint64_t epoch = pause_.epoch;
    const std::string what = paused ? "pause" : "resume";
    const std::string since = paused ? pause_.since : std::string();
    const std::string conninfo = config_.conninfo(false);
    try {
      PgConnection conn(io_);
      co_await conn.connect(conninfo, std::chrono::milliseconds(config_.database_connect_timeout_ms));
      co_await write_pause(conn, config_, since);
      if (pause_.epoch == epoch) pause_.unrecorded = false;  // else a newer request is written next
      pause_.record_error.clear();
      spdlog::info("slot={} {} recorded in the comment of publication {}", config_.slot_name, what,
                   config_.publication_name);
    } catch (const PgError& e) {
      pause_.record_error = e.what();
      // Not the publication's owner: no retry helps.
      if (e.sqlstate() == "42501") {
        spdlog::warn("slot={} could not record the {} in the comment of publication {} ({}): it holds in this "
                     "process only, and a restart would not know it",
                     config_.slot_name, what, config_.publication_name, pause_.record_error);
        break;
      }
    } catch (const std::exception& e) {
      pause_.record_error = e.what();
    }
    if (!pause_.record_error.empty()) {
      spdlog::warn("slot={} could not record the {} in the comment of publication {} ({}): it holds in this process, "
                   "but a restart would not know it; trying again in 5 s",
                   config_.slot_name, what, config_.publication_name, pause_.record_error);
      pause_retry_.expires_after(5s);
      boost::system::error_code ec;
      co_await pause_retry_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
  }
  pause_.writer_running = false;
}

// At each session's start: the pause the slot marker holds, unless this
// process has a request of its own on its way there. A restarted walrelay,
// or a standby taking the slot over, stays paused this way.
void Relay::adopt_pause(const std::string& marked_since) {
  if (pause_.unrecorded) return;
  const bool marked = !marked_since.empty();
  if (marked == pause_.requested && (!marked || marked_since == pause_.since)) return;
  pause_.requested = marked;
  pause_.since = marked_since;
  pause_.by = "the slot marker";
  if (marked)
    spdlog::warn("slot={} paused since {} (recorded in the comment of publication {}): no WAL is read until POST "
                 "/resume (walrelay ctl resume)",
                 config_.slot_name, marked_since, config_.publication_name);
  else
    spdlog::info("slot={} the slot marker holds no pause any more: reading", config_.slot_name);
  note_paused();
}

// walrelay_paused: 1 while a pause is asked for.
void Relay::note_paused() { metrics_.paused.Set(pause_.requested ? 1 : 0); }

}  // namespace walrelay
