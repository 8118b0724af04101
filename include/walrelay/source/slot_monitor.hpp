// The server's own view of the slot: its row of pg_replication_slots and the
// server's WAL position, read on an ordinary connection every
// slot.status.interval.ms. It keeps moving while the relay holds back, which
// is when lag matters. Catalog reads only, never the outbox.
#pragma once

#include <cstdint>

#include <functional>
#include <optional>
#include <string>
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include "walrelay/config.hpp"
#include "walrelay/admin/status.hpp"

namespace walrelay {

// Milliseconds since the Unix epoch (observed_at_unix_ms, /status's since).
std::int64_t unix_ms_now();

class SlotMonitor {
 public:
  SlotMonitor(boost::asio::io_context& io, const Config& config);

  // Polls until stop(). `on_invalidated` is called once if the server
  // reports the slot lost; `streaming` says whether a missing slot is news.
  void start(std::function<void(std::string reason)> on_invalidated, std::function<bool()> streaming);
  void stop();
  // The last answer, if any.
  const std::optional<ServerSlotInfo>& last() const { return last_; }

 private:
  boost::asio::awaitable<void> poll_loop();

  boost::asio::io_context& io_;
  const Config& config_;
  boost::asio::steady_timer timer_;                      // between polls; cancelled by stop()
  std::function<void(std::string)> on_invalidated_;
  std::function<bool()> streaming_;
  std::optional<ServerSlotInfo> last_;
  bool stopped_ = false;
};

}  // namespace walrelay
