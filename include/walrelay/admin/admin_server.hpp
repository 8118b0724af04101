// The admin HTTP endpoint: /healthz, /readyz, /metrics, /slot, /status,
// /replay, and the operator's /pause, /resume and /restart (Boost.Beast).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>

#include "walrelay/admin/metrics.hpp"
#include "walrelay/admin/status.hpp"

namespace walrelay {

struct AdminOptions {
  std::string listen = "127.0.0.1:8080";   // host:port; [::1]:port for IPv6
  std::string token;                        // empty: no auth; else Bearer token on all reads but /healthz
  std::string replay_token;                 // POST /replay's Bearer token; empty: POST /replay is forbidden
  std::string control_token;                // pause, resume, restart (and POST /replay); empty: forbidden
  std::string connector_name;               // slot.name: Kafka Connect's /connectors/<name>/... paths answer too
  std::size_t max_connections = 64;         // at the cap, the longest-idle connection gives way to a new one
  std::size_t max_header_bytes = 8192;
  std::size_t max_body_bytes = 16 * 1024;   // POST /replay's JSON; a GET with a body is refused
  int header_timeout_ms = 2000;             // from waiting for a request to its complete header
  int request_timeout_ms = 5000;            // per connection deadline (slow clients)
  // A listening socket an earlier generation released (POST /restart), for
  // `inherited_listen`: kept, so that the port stays and no probe is refused
  // meanwhile; closed when listen changed. -1: none.
  int inherited_listener = -1;
  std::string inherited_listen;
};

// What POST /replay starts and GET /replay shows (replay_job.hpp). The
// endpoint accepts a POST only when admin.replay.token is set and presented;
// admin.token, the readers' (a Prometheus scraper's), never allows it.
struct AdminAnswer {
  unsigned status;   // HTTP status
  std::string body;  // a JSON document
};

class ReplayControl {
 public:
  using Answer = AdminAnswer;
  virtual ~ReplayControl() = default;
  virtual Answer start(std::string_view request_body) = 0;
  virtual std::string status_json() const = 0;
};

// POST (or PUT) /pause and /resume, POST /restart: the operator's hold on the
// relay, as Kafka Connect's REST API has it. Allowed only when
// admin.control.token is set and presented. `who` names the peer, for the
// log line each request leaves.
class RelayControl {
 public:
  using Answer = AdminAnswer;
  virtual ~RelayControl() = default;
  virtual Answer pause(const std::string& who) = 0;
  virtual Answer resume(const std::string& who) = 0;
  // only_failed: Kafka Connect's ?onlyFailed=true, a restart only of a
  // failed relay (204 otherwise).
  virtual Answer restart(const std::string& who, bool only_failed) = 0;
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
  // Stops, but hands the listening socket over (for AdminOptions'
  // inherited_listener); -1 when not listening.
  int release_listener();
  // Serves /replay from `replay` (not owned; it outlives the server).
  void set_replay(ReplayControl* replay);
  // Serves /pause, /resume and /restart from `control` (not owned).
  void set_control(RelayControl* control);
  // The bound port (useful with port 0 in tests).
  unsigned short port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace walrelay
