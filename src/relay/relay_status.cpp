// What the relay reports about itself: the gauges of /metrics and the
// snapshot behind /slot and /readyz (see relay.hpp for the other files).
#include <algorithm>

#include "walrelay/relay/relay.hpp"

namespace walrelay {

// The server's current WAL position and the slot's lag behind it: from the
// slot monitor when it has answered (the server's own view, which keeps moving
// while walrelay holds back), else from the stream.
Relay::Lag Relay::lag() const {
  Lag out;
  const auto& server = slot_monitor_.last();
  if (server && server->current_wal_lsn && server->confirmed_flush_lsn) {
    // The monitor's answer can be slot.status.interval.ms old while the
    // stream knows newer positions on either side: the newer of each.
    out.wal_end = std::max({*server->current_wal_lsn, stream_wal_end_, received_lsn_});
    auto confirmed = std::max(*server->confirmed_flush_lsn, sent_flushed_lsn_);
    out.bytes = out.wal_end.value > confirmed.value ? out.wal_end.value - confirmed.value : 0;
    if (server->restart_lsn && out.wal_end.value > server->restart_lsn->value)
      out.retained_bytes = out.wal_end.value - server->restart_lsn->value;
  } else {
    out.wal_end = std::max(stream_wal_end_, received_lsn_);
    out.bytes = out.wal_end.value > sent_flushed_lsn_.value ? out.wal_end.value - sent_flushed_lsn_.value : 0;
  }
  auto oldest = ledger_.oldest_unacked_commit_time();
  out.seconds = oldest ? std::max(0.0, (pgoutput::pg_epoch_micros_now() - *oldest) / 1e6) : 0.0;
  return out;
}

// The gauges of /metrics that follow the relay's state and positions.
void Relay::update_gauges() const {
  auto l = lag();
  metrics_.received_lsn.Set(static_cast<double>(received_lsn_.value));
  metrics_.flushed_lsn.Set(static_cast<double>(sent_flushed_lsn_.value));
  metrics_.server_wal_end.Set(static_cast<double>(l.wal_end.value));
  metrics_.lag_bytes.Set(static_cast<double>(l.bytes));
  metrics_.retained_wal_bytes.Set(static_cast<double>(l.retained_bytes));
  const auto& server = slot_monitor_.last();
  metrics_.set_safe_wal_size(server && server->safe_wal_size
                                 ? std::optional<double>(static_cast<double>(*server->safe_wal_size))
                                 : std::nullopt);
  metrics_.lag_seconds.Set(l.seconds);
  metrics_.inflight_records.Set(static_cast<double>(ledger_.inflight_records()));
  metrics_.inflight_bytes.Set(static_cast<double>(ledger_.inflight_bytes()));
  metrics_.ledger_transactions.Set(static_cast<double>(ledger_.pending_transactions()));
  metrics_.ready.Set(state_ == RelayState::streaming && !pause_.requested && sink_.healthy() &&
                             (!schema_encoder_ || schema_encoder_->problem().empty())
                         ? 1
                         : 0);
}

// What an operator does about the halt, by its cause.
std::string Relay::halt_action() const {
  const std::string restart = " then POST /restart (walrelay ctl restart): the next session starts from the slot's "
                              "confirmed position, which did not pass what halted";
  if (halt_cause_ == "record")
    return "A record could not be mapped or delivered and errors.tolerance=none halts on it: fix its cause (the reason "
           "names it), or set errors.tolerance=all with a dead-letter destination;" + restart;
  if (halt_cause_ == "slot")
    return "The replication slot is lost or unusable: docs/operations.md says how to recover the events it held; "
           "walrelay --reset-slot accepts the gap";
  if (halt_cause_ == "source")
    return "The database refused what walrelay needs (the reason names it): fix it," + restart;
  if (halt_cause_ == "producer")
    return "The broker refused the producer for good (the reason names it): fix it," + restart;
  if (halt_cause_ == "stream")
    return "The replication stream could not be decoded: report it with the log lines around it;" + restart;
  return "See walrelay's log around the halt;" + restart;
}

// /slot's and /readyz's view, built on the loop thread.
StatusSnapshot Relay::status() const {
  update_gauges();
  auto l = lag();
  StatusSnapshot s;
  s.slot_name = config_.slot_name;
  s.state = state_;
  s.state_reason = state_reason_;
  s.state_since_unix_ms = state_since_unix_ms_;
  s.worker_id = worker_id_;
  if (pause_.requested)
    s.pause = StatusSnapshot::Pause{pause_.reading_stopped, pause_.since, pause_.by, !pause_.unrecorded,
                                    pause_.record_error};
  if (state_ == RelayState::halted) s.failure = StatusSnapshot::Failure{halt_cause_, halt_where_, halt_action()};
  s.halt_stays = config_.halt_action == HaltAction::stay;
  s.received_lsn = received_lsn_;
  s.confirmed_flush_lsn = sent_flushed_lsn_;
  s.server_wal_end = l.wal_end;
  s.lag_bytes = l.bytes;
  s.retained_wal_bytes = l.retained_bytes;
  s.lag_seconds = l.seconds;
  s.inflight_records = ledger_.inflight_records();
  s.inflight_bytes = ledger_.inflight_bytes();
  s.sink = config_.sink_type;
  s.producer_healthy = sink_.healthy() && !sink_.fatal_error();
  s.producer_error = sink_.fatal_error().value_or(sink_.health_reason());
  s.server = slot_monitor_.last();
  s.retention = retention_.status();
  if (schema_encoder_) s.schema_registry_error = schema_encoder_->problem();
  if (transactional_) s.exactly_once = StatusSnapshot::ExactlyOnce{config_.transactional_id(), committed_lsn_};
  if (snapshot_) {
    auto& sn = s.snapshot.emplace();
    sn.done = snapshot_->done;
    sn.table = snapshot_->table;
    sn.rows_done = snapshot_->rows_done;
    sn.rows_estimated = snapshot_->rows_estimated;
    const auto end = snapshot_->done ? snapshot_->finished : std::chrono::steady_clock::now();
    sn.seconds = std::chrono::duration<double>(end - snapshot_->started).count();
    if (sn.seconds > 0) sn.rows_per_second = static_cast<double>(sn.rows_done) / sn.seconds;
    if (!sn.done && sn.rows_per_second > 0)
      sn.seconds_left = sn.rows_estimated > sn.rows_done
                            ? static_cast<double>(sn.rows_estimated - sn.rows_done) / sn.rows_per_second
                            : 0.0;
  }
  return s;
}

}  // namespace walrelay
