// The admin HTTP endpoint on the relay's io_context (Boost.Beast, callback
// style after Beast's small HTTP server example): /healthz, /readyz,
// /metrics, /slot, /status, /replay, /pause, /resume and /restart. Every connection has a deadline and size limits, so a
// bad client costs one slot of max_connections and never blocks the loop.
#include "walrelay/admin/admin_server.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "walrelay/json.hpp"

namespace walrelay {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

// How long to wait before accepting again after accept() failed (e.g. EMFILE).
constexpr auto accept_retry_delay = std::chrono::milliseconds(100);
// After an error response: read and discard at most this much of what the
// client still sends, so that it sees the response rather than a reset.
constexpr std::size_t linger_max_bytes = 1 << 20;
// ... and for at most this long.
constexpr auto linger_max_time = std::chrono::milliseconds(1000);
// Slack over header + body limits for the read buffer (pipelined requests).
constexpr std::size_t read_buffer_slack = 64 * 1024;

constexpr std::string_view text_plain = "text/plain; charset=utf-8";
constexpr std::string_view metrics_content_type = "text/plain; version=0.0.4; charset=utf-8";
constexpr std::string_view json_content_type = "application/json";

// Beast 1.74 speaks boost::string_view; these convert at the boundary.
std::string_view to_std(beast::string_view s) { return {s.data(), s.size()}; }
beast::string_view to_beast(std::string_view s) { return {s.data(), s.size()}; }

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

// Sets a response's status, content type and body.
void reply(Response& response, http::status status, std::string_view content_type, std::string body) {
  response.result(status);
  response.set(http::field::content_type, to_beast(content_type));
  response.body() = std::move(body);
}

// Parses "host:port" or "[v6]:port" into an endpoint; host must be an IP
// literal or "localhost" (no name resolution on the loop); empty host is loopback.
tcp::endpoint parse_listen(const std::string& listen) {
  auto fail = [&listen](std::string_view why) -> std::runtime_error {
    return std::runtime_error(fmt::format("could not parse admin listen address \"{}\": {}", listen, why));
  };
  std::string_view text(listen);
  std::string_view host;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) throw fail("missing ']' after IPv6 address");
    host = text.substr(1, close - 1);
    if (close + 1 >= text.size() || text[close + 1] != ':') throw fail("expected ':' and a port after ']'");
    port_text = text.substr(close + 2);
    if (host.empty()) throw fail("empty IPv6 address");
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) throw fail("expected host:port");
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) throw fail("an IPv6 address must be written as [address]:port");
  }
  if (port_text.empty() || port_text.size() > 5) throw fail("port must be a number 0-65535");
  unsigned long port = 0;
  for (char c : port_text) {
    if (c < '0' || c > '9') throw fail("port must be a number 0-65535");
    port = port * 10 + static_cast<unsigned long>(c - '0');
  }
  if (port > 65535) throw fail("port must be a number 0-65535");

  net::ip::address address;
  if (host.empty() || host == "localhost") {
    address = net::ip::address_v4::loopback();
  } else {
    error_code ec;
    address = net::ip::make_address(std::string(host), ec);
    if (ec) throw fail("host must be an IP address");
  }
  return tcp::endpoint(address, static_cast<unsigned short>(port));
}

// Compares a presented credential with the secret in time that depends only
// on the secret's length, not on where the two first differ.
bool equal_constant_time(std::string_view presented, std::string_view secret) {
  std::size_t diff = presented.size() ^ secret.size();
  for (std::size_t i = 0; i < secret.size(); ++i) {
    const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= static_cast<std::size_t>(p ^ static_cast<unsigned char>(secret[i]));
  }
  return diff == 0;
}

// True if `header` is "Bearer <token>" (scheme case-insensitive).
bool bearer_matches(std::string_view header, std::string_view token) {
  constexpr std::string_view scheme = "bearer ";
  if (header.size() < scheme.size()) return false;
  for (std::size_t i = 0; i < scheme.size(); ++i) {
    char c = header[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != scheme[i]) return false;
  }
  std::string_view presented = header.substr(scheme.size());
  while (!presented.empty() && presented.front() == ' ') presented.remove_prefix(1);
  return equal_constant_time(presented, token);
}

// Whether the target's query holds `name=true` (the value in any case, as
// Kafka Connect reads its booleans).
bool query_flag(std::string_view target, std::string_view name) {
  const auto q = target.find('?');
  if (q == std::string_view::npos) return false;
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    const auto amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    const auto eq = pair.find('=');
    if (eq == std::string_view::npos || pair.substr(0, eq) != name) continue;
    std::string value(pair.substr(eq + 1));
    for (auto& c : value) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    return value == "true";
  }
  return false;
}

// Replaces CR and LF so that a reason stays on one line of a text response.
std::string one_line(std::string_view text) {
  std::string line(text);
  std::replace_if(line.begin(), line.end(), [](char c) { return c == '\r' || c == '\n'; }, ' ');
  return line;
}

// An optional value as JSON: the value, or null when absent.
template <class T>
Json or_null(const std::optional<T>& value) {
  return value ? Json(*value) : Json(nullptr);
}

// An optional LSN as JSON: its %X/%X text, or null when absent.
Json lsn_or_null(const std::optional<pgoutput::Lsn>& lsn) { return lsn ? Json(lsn->to_string()) : Json(nullptr); }

// The /slot document. LSNs are strings, as PostgreSQL prints them; a NaN or
// infinite lag_seconds is null. Built member by member: nlohmann's
// initializer lists copy every value again and made this three times slower.
std::string slot_json(const StatusSnapshot& s) {
  Json doc = Json::object();
  doc["slot_name"] = s.slot_name;
  doc["state"] = to_string(s.state);
  doc["state_reason"] = s.state_reason;
  doc["received_lsn"] = s.received_lsn.to_string();
  doc["confirmed_flush_lsn"] = s.confirmed_flush_lsn.to_string();
  doc["server_wal_end"] = s.server_wal_end.to_string();
  doc["lag_bytes"] = s.lag_bytes;
  doc["retained_wal_bytes"] = s.retained_wal_bytes;
  doc["lag_seconds"] = s.lag_seconds;
  doc["inflight_records"] = s.inflight_records;
  doc["inflight_bytes"] = s.inflight_bytes;
  doc["sink"] = s.sink;
  doc["producer_healthy"] = s.producer_healthy;
  Json& server = doc["server"];  // null unless the poller has answered
  if (s.server) {
    const ServerSlotInfo& info = *s.server;
    server["wal_status"] = info.wal_status;
    server["safe_wal_size"] = or_null(info.safe_wal_size);
    server["active_pid"] = or_null(info.active_pid);
    server["confirmed_flush_lsn"] = lsn_or_null(info.confirmed_flush_lsn);
    server["restart_lsn"] = lsn_or_null(info.restart_lsn);
    server["current_wal_lsn"] = lsn_or_null(info.current_wal_lsn);
    server["observed_at_unix_ms"] = info.observed_at_unix_ms;
  }
  Json& snapshot = doc["snapshot"];  // null unless this process took an initial snapshot
  if (s.snapshot) {
    const auto& sn = *s.snapshot;
    snapshot["state"] = sn.done ? "done" : "running";
    snapshot["table"] = sn.table;
    snapshot["rows_done"] = sn.rows_done;
    snapshot["rows_estimated"] = sn.rows_estimated;
    snapshot["rows_per_second"] = sn.rows_per_second;
    snapshot["seconds_left"] = or_null(sn.seconds_left);
    snapshot["seconds"] = sn.seconds;
  }
  Json& eos = doc["exactly_once"];  // null in at-least-once mode
  if (s.exactly_once) {
    eos["transactional_id"] = s.exactly_once->transactional_id;
    eos["committed_lsn"] = lsn_or_null(s.exactly_once->committed_lsn);
  }
  Json& retention = doc["retention"];  // null without table.retention.policy
  if (s.retention) {
    const auto& r = *s.retention;
    retention["policy"] = r.policy;
    retention["retention_ms"] = r.retention_ms;
    retention["last_run_unix_ms"] = r.last_run_unix_ms ? Json(r.last_run_unix_ms) : Json(nullptr);
    retention["last_outcome"] = r.last_outcome.empty() ? Json(nullptr) : Json(r.last_outcome);
    retention["last_error"] = r.last_error.empty() ? Json(nullptr) : Json(r.last_error);
    retention["partitions_removed"] = r.partitions_removed;
    Json& tables = retention["tables"] = Json::array();
    for (const auto& t : r.tables) {
      Json table = Json::object();
      table["table"] = t.name;
      table["bytes"] = or_null(t.bytes);
      table["rows_held"] = or_null(t.rows_held);
      table["rows_deleted"] = t.rows_deleted;
      table["oldest_row_age_seconds"] = or_null(t.oldest_row_age_seconds);
      tables.push_back(std::move(table));
    }
  }
  return to_json_text(doc) + '\n';
}

// The /status document: Kafka Connect's shape (GET
// /connectors/<name>/status), so that what reads Connect's reads it, with
// walrelay's details beside it.
std::string status_json(const StatusSnapshot& s) {
  Json trace = nullptr;
  if (s.failure) trace = s.state_reason + " (" + s.failure->where + "). " + s.failure->action;
  Json worker = Json::object();
  worker["state"] = connect_state(s);
  worker["worker_id"] = s.worker_id;
  if (s.failure) worker["trace"] = trace;
  Json doc = Json::object();
  doc["name"] = s.slot_name;
  doc["connector"] = worker;
  Json task = worker;
  task["id"] = 0;
  doc["tasks"] = Json::array({task});
  doc["type"] = "source";
  Json& w = doc["walrelay"];
  w["phase"] = to_string(s.state);
  w["reason"] = s.state_reason;
  w["since_unix_ms"] = s.state_since_unix_ms;
  w["inflight_records"] = s.inflight_records;
  w["confirmed_flush_lsn"] = s.confirmed_flush_lsn.to_string();
  w["lag_bytes"] = s.lag_bytes;
  Json& pause = w["pause"];  // null unless asked for
  if (s.pause) {
    pause["reading_stopped"] = s.pause->reading_stopped;
    pause["since"] = s.pause->since;
    pause["by"] = s.pause->by;
    pause["recorded"] = s.pause->recorded;
    pause["record_error"] = s.pause->record_error;
  }
  Json& failure = w["failure"];  // null unless halted
  if (s.failure) {
    failure["cause"] = s.failure->cause;
    failure["reason"] = s.state_reason;
    failure["where"] = s.failure->where;
    failure["action"] = s.failure->action;
  }
  return to_json_text(doc) + '\n';
}

class Connection;

// State shared by the acceptor and all connections. Handlers hold it by
// shared_ptr, so it outlives the AdminServer that created it; once stopped,
// no handler touches status_ or metrics_ (their owners may be gone).
class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(net::io_context& io, AdminOptions options, const StatusSource& status, Metrics& metrics)
      : io_(io),
        options_(std::move(options)),
        status_(status),
        metrics_(metrics),
        acceptor_(io),
        retry_timer_(io) {}

  void start();
  void stop();
  int release_listener();
  unsigned short port() const { return port_; }

  // Builds the response to a complete, well-formed request from `peer`.
  Response handle(const Request& request, const std::string& peer);

  bool running() const { return running_; }
  const AdminOptions& options() const { return options_; }
  void set_replay(ReplayControl* replay) { replay_ = replay; }
  void set_control(RelayControl* control) { control_ = control; }
  std::list<std::weak_ptr<Connection>>& connections() { return connections_; }

 private:
  void do_accept();
  void on_accept(const error_code& ec, tcp::socket socket);

  // A read-only endpoint (GET or HEAD): fills the response.
  using Endpoint = void (Core::*)(Response&);
  // The operator's control requests.
  enum class Control { none, pause, resume, restart };
  // What a request asks for: an endpoint of the table, /replay, or control.
  struct Route {
    std::string_view path;
    Endpoint endpoint;  // null for /replay, a control request or an unknown path
    bool replay;        // /replay, when the daemon offers it
    bool post_replay;   // POST /replay
    Control control;    // /pause, /resume, /restart, when the daemon offers them
    bool control_method;// POST, or PUT for /pause and /resume (Kafka Connect's)
    bool get;           // GET or HEAD
  };
  static Endpoint endpoint(std::string_view path);
  std::string_view connect_alias(std::string_view path) const;
  Route route(const Request& request) const;
  bool refuse(const Request& request, const Route& route, Response& response) const;
  bool refuse_credential(const Request& request, const Route& route, Response& response) const;
  void answer(const Request& request, const Route& route, const std::string& who, Response& response);
  void get_status(Response& response);
  void get_healthz(Response& response);
  void get_readyz(Response& response);
  void get_metrics(Response& response);
  void get_slot(Response& response);

  net::io_context& io_;                               // the relay's loop
  AdminOptions options_;                              // limits, token, address
  const StatusSource& status_;                        // asked on every request
  Metrics& metrics_;                                  // serialized for /metrics
  ReplayControl* replay_ = nullptr;                   // /replay, when the daemon offers it
  RelayControl* control_ = nullptr;                   // /pause, /resume, /restart, when offered
  tcp::acceptor acceptor_;                            // listening socket
  net::steady_timer retry_timer_;                     // back-off after a failed accept
  std::list<std::weak_ptr<Connection>> connections_;  // live connections, to count and close
  bool running_ = false;                              // between start() and stop()
  unsigned short port_ = 0;                           // bound port
};

// One accepted socket: reads requests one at a time under a deadline and
// writes each response; kept alive by the handlers it has outstanding.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<Core> core, tcp::socket socket)
      : core_(std::move(core)),
        stream_(std::move(socket)),
        buffer_(core_->options().max_header_bytes + core_->options().max_body_bytes + read_buffer_slack) {}

  ~Connection() {
    if (registered_) core_->connections().erase(self_);
  }

  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Registers with the core (for counting and stop()) and reads the first request.
  void start() {
    self_ = core_->connections().insert(core_->connections().end(), weak_from_this());
    registered_ = true;
    do_read();
  }

  // Since when the connection has waited for a request, or nullopt while it
  // serves one (or is closed): what decides who gives way at the cap.
  std::optional<std::chrono::steady_clock::time_point> waiting_since() const { return waiting_since_; }

  // "address:port" of the client, for the log lines of control requests.
  std::string peer() {
    error_code ec;
    const auto remote = stream_.socket().remote_endpoint(ec);
    if (ec) return "an unknown peer";
    const std::string host = remote.address().to_string();
    return (remote.address().is_v6() ? "[" + host + "]" : host) + ":" + std::to_string(remote.port());
  }

  // Closes the socket at once; pending operations complete with operation_aborted.
  void close() {
    waiting_since_.reset();
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

 private:
  // Reads the next request under a fresh parser and deadline.
  void do_read() {
    const AdminOptions& options = core_->options();
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(std::min<std::size_t>(options.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(static_cast<std::uint64_t>(options.max_body_bytes));
    // A probe sends its whole request at once: a short header deadline keeps
    // slow or silent clients from holding connections.
    stream_.expires_after(std::chrono::milliseconds(std::min(options.header_timeout_ms, options.request_timeout_ms)));
    waiting_since_ = std::chrono::steady_clock::now();
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](const error_code& ec, std::size_t) { self->on_read(ec); });
  }

  // Serves a complete request, or maps the read error to a response or close.
  void on_read(const error_code& ec) {
    waiting_since_.reset();
    if (ec == net::error::operation_aborted || !core_->running()) return;
    if (ec) {
      on_read_error(ec);
      return;
    }
    http::response<http::string_body> response;
    try {
      response = core_->handle(parser_->get(), peer());
    } catch (const std::exception& e) {
      spdlog::debug("admin: could not serve {}: {}", to_std(parser_->get().target()), e.what());
      response = error_response(http::status::internal_server_error, "internal error\n", parser_->get().version());
      response.keep_alive(false);
    }
    write(std::move(response));
  }

  // Maps a failed read to an error response and close, or just a close.
  void on_read_error(const error_code& ec) {
    const unsigned version = parser_ && parser_->is_header_done() ? parser_->get().version() : 11;
    if (ec == http::error::end_of_stream) {
      // The client closed between requests.
      close_gracefully();
    } else if (ec == beast::error::timeout) {
      spdlog::debug("admin: closing connection: no complete request within {} ms",
                    core_->options().request_timeout_ms);
      close();
    } else if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      spdlog::debug("admin: refusing request: header larger than {} bytes", core_->options().max_header_bytes);
      write_and_close(error_response(http::status::request_header_fields_too_large, "header too large\n", version));
    } else if (ec == http::error::body_limit) {
      spdlog::debug("admin: refusing request: body larger than {} bytes", core_->options().max_body_bytes);
      write_and_close(error_response(http::status::payload_too_large, "request body too large\n", version));
    } else if (ec.category() == make_error_code(http::error::bad_method).category() &&
               ec != http::error::partial_message) {
      spdlog::debug("admin: refusing malformed request: {}", ec.message());
      write_and_close(error_response(http::status::bad_request, "bad request\n", version));
    } else {
      // Reset, EOF mid-request and the like: nobody to answer.
      spdlog::debug("admin: closing connection: {}", ec.message());
      close();
    }
  }

  // A small text/plain response for an error the connection cannot recover from.
  static http::response<http::string_body> error_response(http::status status, std::string body,
                                                          unsigned version) {
    http::response<http::string_body> response{status, version == 10 ? 10u : 11u};
    response.set(http::field::content_type, to_beast(text_plain));
    response.body() = std::move(body);
    return response;
  }

  // Sends the response with Connection: close, then closes.
  void write_and_close(http::response<http::string_body> response) {
    response.keep_alive(false);
    write(std::move(response));
  }

  // Adds the common headers and writes the response under the deadline.
  void write(http::response<http::string_body> response) {
    response.set(http::field::server, "walrelay");
    response.set(http::field::cache_control, "no-store");
    response_ = std::move(response);
    if (!response_->has_content_length()) response_->content_length(response_->body().size());
    stream_.expires_after(std::chrono::milliseconds(core_->options().request_timeout_ms));
    http::async_write(stream_, *response_,
                      [self = shared_from_this()](const error_code& ec, std::size_t) { self->on_write(ec); });
  }

  // After a response: read the next request or close.
  void on_write(const error_code& ec) {
    if (ec == net::error::operation_aborted || !core_->running()) return;
    if (ec) {
      spdlog::debug("admin: could not write response: {}", ec.message());
      close();
      return;
    }
    const bool keep_alive = response_->keep_alive();
    response_.reset();
    if (keep_alive) {
      do_read();
    } else {
      close_gracefully();
    }
  }

  // Sends FIN, then reads and discards what the client still sends (bounded
  // in bytes and time) so that it reads our response instead of a reset.
  void close_gracefully() {
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    const auto limit = std::min<std::chrono::milliseconds>(
        linger_max_time, std::chrono::milliseconds(core_->options().request_timeout_ms));
    stream_.expires_after(limit);
    do_linger();
  }

  // One discarding read of close_gracefully().
  void do_linger() {
    stream_.async_read_some(net::buffer(linger_buffer_),
                            [self = shared_from_this()](const error_code& ec, std::size_t n) {
                              self->lingered_ += n;
                              if (ec || self->lingered_ >= linger_max_bytes) {
                                self->close();
                                return;
                              }
                              self->do_linger();
                            });
  }

  std::shared_ptr<Core> core_;                                            // server state; outlives us
  beast::tcp_stream stream_;                                              // socket with the deadline
  beast::flat_buffer buffer_;                                             // read buffer, kept across requests
  std::optional<http::request_parser<http::string_body>> parser_;         // one per request
  std::optional<http::response<http::string_body>> response_;             // being written
  std::array<char, 4096> linger_buffer_{};                                // discarded input while closing
  std::size_t lingered_ = 0;                                              // bytes discarded so far
  std::list<std::weak_ptr<Connection>>::iterator self_;                   // our entry in the core's list
  bool registered_ = false;                                               // self_ is valid
  std::optional<std::chrono::steady_clock::time_point> waiting_since_;    // reading a request since
};

// Parses the address, binds, listens and starts accepting.
void Core::start() {
  if (running_) throw std::runtime_error("admin server already started");
  if (options_.request_timeout_ms <= 0) {
    throw std::runtime_error(fmt::format("could not start admin endpoint {}: request timeout must be positive, not {} ms",
                                         options_.listen, options_.request_timeout_ms));
  }
  if (options_.max_header_bytes == 0) {
    throw std::runtime_error(fmt::format("could not start admin endpoint {}: max header bytes must be positive",
                                         options_.listen));
  }
  const tcp::endpoint endpoint = parse_listen(options_.listen);
  auto fail = [this](std::string_view what, const error_code& ec) {
    error_code ignored;
    acceptor_.close(ignored);
    return std::runtime_error(
        fmt::format("could not {} admin endpoint {}: {}", what, options_.listen, ec.message()));
  };
  error_code ec;
  if (options_.inherited_listener >= 0 && options_.inherited_listen == options_.listen) {
    // An earlier generation's socket: still bound and listening.
    acceptor_.assign(endpoint.protocol(), options_.inherited_listener, ec);
    if (ec) throw fail("take over the listening socket of", ec);
  } else {
    acceptor_.open(endpoint.protocol(), ec);
    if (ec) throw fail("open socket for", ec);
    acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (ec) throw fail("set SO_REUSEADDR on", ec);
    acceptor_.bind(endpoint, ec);
    if (ec) throw fail("bind", ec);
    acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) throw fail("listen on", ec);
    // admin.listen changed: the earlier socket goes once this one listens
    // (on a failure above it stays the caller's, for the generation after).
    if (options_.inherited_listener >= 0) ::close(options_.inherited_listener);
  }
  options_.inherited_listener = -1;
  const tcp::endpoint bound = acceptor_.local_endpoint(ec);
  if (ec) throw fail("read the bound address of", ec);
  port_ = bound.port();
  running_ = true;
  const std::string host = bound.address().to_string();
  spdlog::info("admin endpoint listening on {}:{}", bound.address().is_v6() ? "[" + host + "]" : host, port_);
  do_accept();
}

// Stops accepting and closes every live connection.
void Core::stop() {
  if (!running_) return;
  running_ = false;
  error_code ignored;
  acceptor_.close(ignored);
  retry_timer_.cancel();
  // Copy first: closing may not destroy a connection now, but be safe anyway.
  std::vector<std::shared_ptr<Connection>> live;
  for (const auto& weak : connections_) {
    if (auto connection = weak.lock()) live.push_back(std::move(connection));
  }
  for (const auto& connection : live) connection->close();
  spdlog::debug("admin endpoint stopped; closed {} connection(s)", live.size());
}

// The listening socket handed over, then a stop.
int Core::release_listener() {
  if (!running_) return -1;
  error_code ec;
  const int fd = acceptor_.release(ec);
  stop();
  return ec ? -1 : fd;
}

// Waits for the next connection.
void Core::do_accept() {
  acceptor_.async_accept([self = shared_from_this()](const error_code& ec, tcp::socket socket) {
    self->on_accept(ec, std::move(socket));
  });
}

// Starts a connection, or closes it at once beyond max_connections.
void Core::on_accept(const error_code& ec, tcp::socket socket) {
  if (!running_ || ec == net::error::operation_aborted) return;
  if (ec) {
    // Out of descriptors or similar: try again a little later rather than spin.
    spdlog::debug("admin: could not accept a connection: {}", ec.message());
    retry_timer_.expires_after(accept_retry_delay);
    retry_timer_.async_wait([self = shared_from_this()](const error_code& wait_ec) {
      if (!wait_ec && self->running_) self->do_accept();
    });
    return;
  }
  bool admit = true;
  std::shared_ptr<Connection> longest_waiting;
  for (const auto& weak : connections_) {
    auto c = weak.lock();
    if (!c || !c->waiting_since()) continue;
    if (!longest_waiting || *c->waiting_since() < *longest_waiting->waiting_since()) longest_waiting = c;
  }
  if (connections_.size() >= options_.max_connections) {
    // At the cap, the connection that has waited longest for a request gives
    // way: half-open or idle clients can never lock a liveness probe out.
    if (longest_waiting) {
      spdlog::debug("admin: {} connections open (max {}): closing one idle for the longest", connections_.size(),
                    options_.max_connections);
      longest_waiting->close();
    } else {
      admit = false;  // every one is being answered: they will be done soon
    }
  }
  if (admit) {
    std::make_shared<Connection>(shared_from_this(), std::move(socket))->start();
  } else {
    spdlog::debug("admin: refusing connection: {} connections busy (max {})", connections_.size(),
                  options_.max_connections);
    error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
  }
  do_accept();
}

// Routes one request: token check, path, method, then the endpoint.
Response Core::handle(const Request& request, const std::string& peer) {
  const unsigned version = request.version() == 10 ? 10u : 11u;
  Response response{http::status::ok, version};
  response.keep_alive(request.keep_alive());
  const Route r = route(request);
  // The client's own words, on one line and short: they reach the log.
  const std::string who =
      peer + " (User-Agent: " + one_line(to_std(request[http::field::user_agent]).substr(0, 120)) + ")";
  const bool refused = refuse(request, r, response);
  if (!refused) answer(request, r, who, response);
  if (r.control != Control::none || r.post_replay) {
    // Every state-changing request leaves a line: who asked what, and the answer.
    if (refused)
      spdlog::warn("admin: refused {} {} from {}: {}", to_std(request.method_string()), r.path, who,
                   static_cast<unsigned>(response.result_int()));
    else
      spdlog::info("admin: {} {} from {} with the operator's token: {}", to_std(request.method_string()), r.path, who,
                   static_cast<unsigned>(response.result_int()));
  }
  if (response.result() == http::status::no_content) {
    response.erase(http::field::content_type);  // a 204 has no body, nor headers for one
  } else {
    response.content_length(response.body().size());
  }
  if (request.method() == http::verb::head) response.body().clear();
  spdlog::debug("admin: {} {} -> {}", to_std(request.method_string()), r.path,
                static_cast<unsigned>(response.result_int()));
  return response;
}

// The read-only endpoints, by path (null: none).
Core::Endpoint Core::endpoint(std::string_view path) {
  static const std::pair<std::string_view, Endpoint> endpoints[] = {
      {"/healthz", &Core::get_healthz},
      {"/readyz", &Core::get_readyz},
      {"/metrics", &Core::get_metrics},
      {"/slot", &Core::get_slot},
      {"/status", &Core::get_status},
  };
  for (const auto& [p, e] : endpoints)
    if (p == path) return e;
  return nullptr;
}

// Kafka Connect's /connectors/<slot.name>/{status,pause,resume,restart} as
// walrelay's own path, so that tools written for Connect's REST API work.
std::string_view Core::connect_alias(std::string_view path) const {
  static constexpr std::string_view prefix = "/connectors/";
  static constexpr std::string_view verbs[] = {"/status", "/pause", "/resume", "/restart"};
  if (options_.connector_name.empty() || path.substr(0, prefix.size()) != prefix) return path;
  std::string_view rest = path.substr(prefix.size());
  if (rest.substr(0, options_.connector_name.size()) != options_.connector_name) return path;
  rest.remove_prefix(options_.connector_name.size());
  for (auto verb : verbs)
    if (rest == verb) return verb;
  return path;
}

// What the request's target and method ask for.
Core::Route Core::route(const Request& request) const {
  const std::string_view target = to_std(request.target());
  const auto method = request.method();
  Route r;
  r.path = connect_alias(target.substr(0, target.find('?')));
  r.endpoint = endpoint(r.path);
  r.replay = r.path == "/replay" && replay_ != nullptr;
  r.post_replay = r.replay && method == http::verb::post;
  r.control = control_ == nullptr      ? Control::none
              : r.path == "/pause"   ? Control::pause
              : r.path == "/resume"  ? Control::resume
              : r.path == "/restart" ? Control::restart
                                     : Control::none;
  r.control_method = method == http::verb::post || (method == http::verb::put && r.control != Control::restart);
  r.get = method == http::verb::get || method == http::verb::head;
  return r;
}

// Refuses a request whose credential does not allow it (401, or 403 when
// the operator's token it needs is not configured); whether it did.
bool Core::refuse_credential(const Request& request, const Route& route, Response& response) const {
  const std::string_view authorization = to_std(request[http::field::authorization]);
  auto holds = [&](const std::string& token) { return !token.empty() && bearer_matches(authorization, token); };
  const bool control = route.control != Control::none;
  if (control && options_.control_token.empty()) {
    // Holding the relay is an operator's act: never on an endpoint that
    // anyone on the network path, or a scraper's credential, may call.
    reply(response, http::status::forbidden, text_plain,
          fmt::format("{} needs admin.control.token: set it (not admin.token, which the readers of /metrics hold), "
                      "and send Authorization: Bearer <token> (walrelay ctl does)\n",
                      route.path));
    return true;
  }
  if (route.post_replay && options_.replay_token.empty() && options_.control_token.empty()) {
    reply(response, http::status::forbidden, text_plain,
          "POST /replay needs admin.replay.token (or admin.control.token): set it (not admin.token, which the readers "
          "of /metrics hold), and send Authorization: Bearer <token> (or run walrelay replay beside the relay)\n");
    return true;
  }
  // The readers' token (a Prometheus scraper's) allows reads only; the
  // operators' tokens allow them too.
  const bool reader = options_.token.empty() || holds(options_.token) || holds(options_.replay_token) ||
                      holds(options_.control_token);
  const bool allowed = control             ? holds(options_.control_token)
                       : route.post_replay ? holds(options_.replay_token) || holds(options_.control_token)
                                           : route.path == "/healthz" || reader;
  if (allowed) return false;
  reply(response, http::status::unauthorized, text_plain, "unauthorized\n");
  response.set(http::field::www_authenticate, "Bearer");
  return true;
}

// Refuses what the request may not ask (its token, path, method or body)
// into the response; whether it did.
bool Core::refuse(const Request& request, const Route& route, Response& response) const {
  const bool control = route.control != Control::none;
  const bool known = route.replay || route.endpoint != nullptr || control;
  if (refuse_credential(request, route, response)) {
    return true;
  } else if (!known) {
    reply(response, http::status::not_found, text_plain, "not found\n");
  } else if (control ? !route.control_method : !route.get && !route.post_replay) {
    reply(response, http::status::method_not_allowed, text_plain, "method not allowed\n");
    response.set(http::field::allow, control                        ? (route.control == Control::restart ? "POST" : "POST, PUT")
                                     : route.replay ? "GET, HEAD, POST"
                                                    : "GET, HEAD");
  } else if (route.get && !request.body().empty()) {
    reply(response, http::status::payload_too_large, text_plain, "request body not allowed\n");
    response.keep_alive(false);
  } else {
    return false;
  }
  return true;
}

// A request allowed: a control request, /replay's POST or GET, or a
// read-only endpoint.
void Core::answer(const Request& request, const Route& route, const std::string& who, Response& response) {
  if (route.control != Control::none) {
    const bool only_failed = query_flag(to_std(request.target()), "onlyFailed");
    auto answer = route.control == Control::pause    ? control_->pause(who)
                  : route.control == Control::resume ? control_->resume(who)
                                                     : control_->restart(who, only_failed);
    reply(response, static_cast<http::status>(answer.status), json_content_type, std::move(answer.body));
  } else if (route.post_replay) {
    auto answer = replay_->start(to_std(request.body()));
    reply(response, static_cast<http::status>(answer.status), json_content_type, std::move(answer.body));
  } else if (route.replay) {
    reply(response, http::status::ok, json_content_type, replay_->status_json());
  } else {
    (this->*route.endpoint)(response);
  }
}

// /healthz: alive, unless halted in a way a restart may cure.
void Core::get_healthz(Response& response) {
  const StatusSnapshot status = status_.status();
  if (status.state == RelayState::halted && status.halt_stays) {
    // Alive: a restart would only halt again. /readyz (behind the token:
    // the reason can quote a row's values) and walrelay_halted say why.
    reply(response, http::status::ok, text_plain, "ok, halted (halt.action=stay): see /readyz\n");
  } else if (status.state == RelayState::halted) {
    reply(response, http::status::service_unavailable, text_plain,
          fmt::format("halted: {}\n", one_line(status.state_reason)));
  } else {
    reply(response, http::status::ok, text_plain, "ok\n");
  }
}

// /readyz: streaming, with the registry and the broker reachable.
void Core::get_readyz(Response& response) {
  const StatusSnapshot status = status_.status();
  if (status.pause && status.state != RelayState::halted) {
    // Paused by an operator: not ready, whatever the phase beneath.
    reply(response, http::status::service_unavailable, text_plain,
          fmt::format("paused since {} by {}\n", status.pause->since, one_line(status.pause->by)));
  } else if (status.state != RelayState::streaming) {
    std::string line = to_string(status.state);
    if (!status.state_reason.empty()) line += ": " + one_line(status.state_reason);
    reply(response, http::status::service_unavailable, text_plain, line + "\n");
  } else if (!status.schema_registry_error.empty()) {
    // First: records wait on it, so the producer may not even have
    // connected yet.
    reply(response, http::status::service_unavailable, text_plain,
          fmt::format("schema registry: {}\n", one_line(status.schema_registry_error)));
  } else if (!status.producer_healthy) {
    reply(response, http::status::service_unavailable, text_plain,
          fmt::format("broker unreachable ({}): {}\n", status.sink, one_line(status.producer_error)));
  } else {
    reply(response, http::status::ok, text_plain, "ready\n");
  }
}

// /metrics: the relay's gauges are refreshed here, not by a timer: an idle
// relay does not wake every second to update what nobody may read.
void Core::get_metrics(Response& response) {
  status_.status();
  reply(response, http::status::ok, metrics_content_type, metrics_.serialize());
}

// /status: the state in Kafka Connect's shape, with the trace of a halt.
void Core::get_status(Response& response) {
  reply(response, http::status::ok, json_content_type, status_json(status_.status()));
}

// /slot: the slot's positions as JSON.
void Core::get_slot(Response& response) { reply(response, http::status::ok, json_content_type, slot_json(status_.status())); }

}  // namespace

struct AdminServer::Impl {
  std::shared_ptr<Core> core;  // shared with in-flight handlers
};

AdminServer::AdminServer(boost::asio::io_context& io, AdminOptions options, const StatusSource& status,
                         Metrics& metrics)
    : impl_(std::make_unique<Impl>(Impl{std::make_shared<Core>(io, std::move(options), status, metrics)})) {}

AdminServer::~AdminServer() { stop(); }

void AdminServer::start() { impl_->core->start(); }

void AdminServer::stop() { impl_->core->stop(); }

int AdminServer::release_listener() { return impl_->core->release_listener(); }

void AdminServer::set_replay(ReplayControl* replay) { impl_->core->set_replay(replay); }

void AdminServer::set_control(RelayControl* control) { impl_->core->set_control(control); }

unsigned short AdminServer::port() const { return impl_->core->port(); }

}  // namespace walrelay
