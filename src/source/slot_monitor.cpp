// The slot poller (see slot_monitor.hpp).
#include "walrelay/source/slot_monitor.hpp"

#include <spdlog/spdlog.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "walrelay/source/pg_connection.hpp"

namespace walrelay {
namespace asio = boost::asio;
using namespace std::chrono_literals;
using pgoutput::Lsn;

std::int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

SlotMonitor::SlotMonitor(asio::io_context& io, const Config& config) : io_(io), config_(config), timer_(io) {}

void SlotMonitor::start(std::function<void(std::string)> on_invalidated, std::function<bool()> streaming) {
  on_invalidated_ = std::move(on_invalidated);
  streaming_ = std::move(streaming);
  if (config_.slot_status_interval_ms > 0) asio::co_spawn(io_, poll_loop(), asio::detached);
}

void SlotMonitor::stop() {
  stopped_ = true;
  timer_.cancel();
}

asio::awaitable<void> SlotMonitor::poll_loop() {
  PgConnection conn(io_);
  const auto interval = std::chrono::milliseconds(config_.slot_status_interval_ms);
  // g++ 12 cannot keep an initializer_list's array in a coroutine frame.
  std::vector<std::string> params;
  params.push_back(config_.slot_name);
  while (!stopped_) {
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
        last_.reset();
        if (streaming_ && streaming_()) spdlog::warn("slot={} is not in pg_replication_slots", config_.slot_name);
      } else {
        ServerSlotInfo info;
        info.wal_status = rows.at(0, "wal_status").value_or("");
        if (auto& v = rows.at(0, "safe_wal_size")) info.safe_wal_size = std::stoll(*v);
        if (auto& v = rows.at(0, "active_pid")) info.active_pid = std::stoi(*v);
        if (auto& v = rows.at(0, "confirmed_flush_lsn")) info.confirmed_flush_lsn = Lsn::parse(*v);
        if (auto& v = rows.at(0, "restart_lsn")) info.restart_lsn = Lsn::parse(*v);
        if (auto& v = rows.at(0, "current_wal_lsn")) info.current_wal_lsn = Lsn::parse(*v);
        info.observed_at_unix_ms = unix_ms_now();
        bool lost = info.wal_status == "lost";
        last_ = std::move(info);
        if (lost && on_invalidated_) {
          auto report = std::move(on_invalidated_);  // once
          on_invalidated_ = nullptr;
          report("slot.name: replication slot " + config_.slot_name +
                 " has been invalidated (wal_status lost: max_slot_wal_keep_size exceeded): the events it held are "
                 "gone. To accept the gap, run walrelay --reset-slot once");
        }
      }
    } catch (const PgError& e) {
      spdlog::warn("slot={} could not read pg_replication_slots: {}", config_.slot_name, e.what());
      conn.close();
    }
    if (stopped_) break;
    timer_.expires_after(interval);
    boost::system::error_code ec;
    co_await timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

}  // namespace walrelay
