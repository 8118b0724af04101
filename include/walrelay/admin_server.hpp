// The admin HTTP endpoint: /healthz, /readyz, /metrics, /slot (Boost.Beast).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>

#include "walrelay/metrics.hpp"
#include "walrelay/status.hpp"

namespace walrelay {

struct AdminOptions {
  std::string listen = "127.0.0.1:8080";   // host:port; [::1]:port for IPv6
  std::string token;                        // empty: no auth; else Bearer token on all but /healthz
  std::size_t max_connections = 64;         // at the cap, the longest-idle connection gives way to a new one
  std::size_t max_header_bytes = 8192;
  std::size_t max_body_bytes = 0;           // GET only: any body is refused
  int header_timeout_ms = 2000;             // from waiting for a request to its complete header
  int request_timeout_ms = 5000;            // per connection deadline (slow clients)
};

// Runs on the relay's io_context; never blocks it. Bad requests get a 4xx or
// a closed connection and never disturb relaying.
class AdminServer {
 public:
  AdminServer(boost::asio::io_context& io, AdminOptions options, const StatusSource& status, Metrics& metrics);
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // Binds and starts accepting; throws std::runtime_error naming the address on failure.
  void start();
  void stop();
  // The bound port (useful with port 0 in tests).
  unsigned short port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace walrelay
