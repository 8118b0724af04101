#include "walrelay/source/pg_connection.hpp"

#include <algorithm>
#include <map>

#include <sys/socket.h>
#include <openssl/ssl.h>

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

namespace walrelay {
namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

// A result's rows as text, NULL as nullopt; none for a result without rows.
PgRows rows_of(const PgResultPtr& result) {
  PgRows rows;
  if (result && PQresultStatus(result.get()) == PGRES_TUPLES_OK) {
    int nf = PQnfields(result.get()), nt = PQntuples(result.get());
    for (int f = 0; f < nf; ++f) rows.columns.emplace_back(PQfname(result.get(), f));
    for (int t = 0; t < nt; ++t) {
      auto& row = rows.rows.emplace_back();
      for (int f = 0; f < nf; ++f)
        row.push_back(PQgetisnull(result.get(), t, f) ? std::nullopt
                                                       : std::optional<std::string>(PQgetvalue(result.get(), t, f)));
    }
  }
  return rows;
}

}  // namespace

std::string pg_message(PGconn* conn) {
  std::string m = conn ? PQerrorMessage(conn) : "out of memory";
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  return m;
}

const std::optional<std::string>& PgRows::at(std::size_t row, const std::string& column) const {
  static const std::optional<std::string> none;
  for (std::size_t c = 0; c < columns.size(); ++c)
    if (columns[c] == column) return row < rows.size() ? rows[row][c] : none;
  return none;
}

PgConnection::PgConnection(asio::io_context& io) : io_(io) {}

PgConnection::~PgConnection() { close(); }

void PgConnection::close() {
  if (socket_) {
    boost::system::error_code ec;
    socket_->cancel(ec);
    socket_->release();  // libpq owns the descriptor
    socket_.reset();
  }
  if (conn_) {
    PQfinish(conn_);
    conn_ = nullptr;
  }
  tls_held_noted_ = false;
}

void PgConnection::watch_socket(bool anew) {
  int fd = conn_ ? PQsocket(conn_) : -1;
  if (!anew && socket_ && socket_->native_handle() == fd) return;
  if (socket_) {
    boost::system::error_code ec;
    socket_->cancel(ec);
    socket_->release();
    socket_.reset();
  }
  if (fd >= 0) socket_ = std::make_shared<asio::posix::stream_descriptor>(io_, fd);
}

void PgConnection::throw_conn_error(const std::string& what) {
  std::string msg = what + ": " + pg_message(conn_);
  throw PgError(msg, "");
}

// Waits for the socket with a deadline. A wake-up without readiness (another
// coroutine's timeout cancelled the descriptor) is harmless: callers loop.
asio::awaitable<void> PgConnection::wait(asio::posix::stream_descriptor::wait_type type,
                                         std::chrono::steady_clock::time_point deadline, const char* what) {
  if (!socket_) throw PgError(std::string("could not ") + what + ": no connection", "");
  // Past the deadline already: a socket that is always ready would otherwise
  // complete before the timer every time, and the deadline never hold.
  if (std::chrono::steady_clock::now() >= deadline) throw PgError(std::string("timed out: ") + what, "");
  if (type == asio::posix::stream_descriptor::wait_read && tls_holds_input()) co_return;
  struct State {
    bool done = false;
    bool timed_out = false;
  };
  auto state = std::make_shared<State>();
  asio::steady_timer timer(io_);
  timer.expires_at(deadline);
  std::weak_ptr<asio::posix::stream_descriptor> weak = socket_;
  timer.async_wait([state, weak](boost::system::error_code ec) {
    if (ec || state->done) return;
    state->timed_out = true;
    boost::system::error_code ignored;
    if (auto sock = weak.lock()) sock->cancel(ignored);
  });
  boost::system::error_code ec;
  auto sock = socket_;  // kept alive while this coroutine waits on it
  co_await sock->async_wait(type, asio::redirect_error(asio::use_awaitable, ec));
  state->done = true;
  timer.cancel();
  if (state->timed_out) throw PgError(std::string("timed out: ") + what, "");
}

std::vector<std::pair<std::string, std::string>> parse_conninfo(const std::string& conninfo) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), &error);
  if (!options) {
    std::string why = error ? error : "out of memory";
    if (error) PQfreemem(error);
    while (!why.empty() && why.back() == '\n') why.pop_back();
    throw PgError("could not parse the connection string: " + why, "");
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (PQconninfoOption* o = options; o->keyword; ++o)
    if (o->val) out.emplace_back(o->keyword, o->val);
  PQconninfoFree(options);
  return out;
}

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::string::size_type start = 0;
  for (;;) {
    auto comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

std::string join_commas(const std::vector<std::string>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
  return out;
}

std::string option(const std::vector<std::pair<std::string, std::string>>& options, const std::string& key) {
  for (auto& [k, v] : options)
    if (k == key) return v;
  return {};
}

void set_option(std::vector<std::pair<std::string, std::string>>& options, const std::string& key,
                const std::string& value) {
  for (auto& [k, v] : options)
    if (k == key) {
      v = value;
      return;
    }
  options.emplace_back(key, value);
}

}  // namespace

bool needs_resolving(const std::string& host) {
  if (host.empty() || host.front() == '/' || host.front() == '@') return false;  // socket directory, abstract socket
  boost::system::error_code ec;
  asio::ip::make_address(host, ec);
  return static_cast<bool>(ec);
}

std::vector<std::pair<std::string, std::string>> with_host_addresses(
    std::vector<std::pair<std::string, std::string>> options,
    const std::map<std::string, std::vector<std::string>>& addresses) {
  auto hosts = split_commas(option(options, "host"));
  auto ports = split_commas(option(options, "port"));
  std::vector<std::string> out_hosts, out_addrs, out_ports;
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    const std::string port = ports.size() == hosts.size() ? ports[i] : ports.front();
    auto it = addresses.find(hosts[i]);
    if (!needs_resolving(hosts[i]) || it == addresses.end()) {
      if (needs_resolving(hosts[i])) continue;  // unresolvable: libpq would only block on it again
      out_hosts.push_back(hosts[i]);
      out_addrs.emplace_back();  // empty: libpq uses the host itself
      out_ports.push_back(port);
      continue;
    }
    // One entry per address, each with the name, which TLS verifies against.
    for (auto& a : it->second) {
      out_hosts.push_back(hosts[i]);
      out_addrs.push_back(a);
      out_ports.push_back(port);
    }
  }
  set_option(options, "host", join_commas(out_hosts));
  set_option(options, "hostaddr", join_commas(out_addrs));
  set_option(options, "port", join_commas(out_ports));
  return options;
}

std::optional<std::vector<std::pair<std::string, std::string>>> hosts_after(
    std::vector<std::pair<std::string, std::string>> options, const std::string& host, const std::string& address,
    const std::string& port) {
  auto hosts = split_commas(option(options, "host"));
  auto addrs = split_commas(option(options, "hostaddr"));
  auto ports = split_commas(option(options, "port"));
  if (hosts.size() < 2 || addrs.size() != hosts.size() || ports.size() != hosts.size()) return std::nullopt;
  for (std::size_t i = 0; i + 1 < hosts.size(); ++i) {
    if (hosts[i] != host || ports[i] != port || (!addrs[i].empty() && addrs[i] != address)) continue;
    const auto from = static_cast<std::ptrdiff_t>(i + 1);
    set_option(options, "host", join_commas({hosts.begin() + from, hosts.end()}));
    set_option(options, "hostaddr", join_commas({addrs.begin() + from, addrs.end()}));
    set_option(options, "port", join_commas({ports.begin() + from, ports.end()}));
    return options;
  }
  return std::nullopt;
}

asio::awaitable<void> PgConnection::connect(const std::string& conninfo, std::chrono::milliseconds timeout) {
  close();
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto options = parse_conninfo(conninfo);
  // libpq resolves host names with a blocking getaddrinfo inside
  // PQconnectStart/PQconnectPoll; a slow DNS would stall the loop that also
  // answers the liveness probe. Resolve here, off the loop, and hand libpq
  // the addresses.
  if (option(options, "hostaddr").empty()) {
    std::map<std::string, std::vector<std::string>> addresses;
    std::string last_error;
    for (auto& host : split_commas(option(options, "host"))) {
      if (!needs_resolving(host) || addresses.count(host)) continue;
      asio::ip::tcp::resolver resolver(io_);
      asio::steady_timer timer(io_);
      timer.expires_at(deadline);
      timer.async_wait([&resolver](boost::system::error_code ec) {
        if (!ec) resolver.cancel();
      });
      boost::system::error_code ec;
      auto results = co_await resolver.async_resolve(host, "", asio::redirect_error(asio::use_awaitable, ec));
      timer.cancel();
      if (ec) {
        last_error = "could not resolve host \"" + host + "\": " + ec.message();
        continue;
      }
      auto& list = addresses[host];
      for (auto& r : results) {
        auto a = r.endpoint().address().to_string();
        if (std::find(list.begin(), list.end(), a) == list.end()) list.push_back(a);
      }
    }
    options = with_host_addresses(std::move(options), addresses);
    if (option(options, "host").empty()) throw PgError(last_error.empty() ? "could not connect: no host" : last_error, "");
  }
  // libpq moves to the next host when one refuses the connection, not when
  // one accepts it and then fails (closes it at once, answers no protocol, or
  // refuses the login): a port taken by another service, a proxy whose
  // server is down. The hosts after the one that failed are tried here.
  std::string failures;
  for (;;) {
    std::optional<ConnectFailure> failed;
    try {
      failed = co_await connect_once(options, deadline);
    } catch (const PgError& e) {
      if (failures.empty()) throw;
      throw PgError("could not connect: " + failures + "; " + e.what(), e.sqlstate());
    }
    if (!failed) break;
    failures += (failures.empty() ? "" : "; ") + failed->message;
    auto rest = hosts_after(options, failed->host, failed->address, failed->port);
    if (!rest) throw PgError("could not connect: " + failures, "");
    options = std::move(*rest);
  }
  watch_socket(true);
  if (PQsetnonblocking(conn_, 1) != 0) throw_conn_error("could not set the connection non-blocking");
}

// One attempt of libpq's over the hosts in `options`: nullopt once
// connected, else where and why it failed.
asio::awaitable<std::optional<PgConnection::ConnectFailure>> PgConnection::connect_once(
    const std::vector<std::pair<std::string, std::string>>& options, std::chrono::steady_clock::time_point deadline) {
  close();
  std::vector<const char*> keys, values;
  for (auto& [k, v] : options) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  conn_ = PQconnectStartParams(keys.data(), values.data(), 0);
  if (!conn_) throw PgError("could not connect: out of memory", "");
  for (;;) {
    // libpq reports authentication and privilege failures here; keep the
    // server's SQLSTATE-free text, it names the cause.
    const auto st = PQstatus(conn_) == CONNECTION_BAD ? PGRES_POLLING_FAILED : PQconnectPoll(conn_);
    if (st == PGRES_POLLING_OK) co_return std::nullopt;
    if (st == PGRES_POLLING_FAILED) {
      const char* host = PQhost(conn_);
      const char* address = PQhostaddr(conn_);
      const char* port = PQport(conn_);
      co_return ConnectFailure{pg_message(conn_), host ? host : "", address ? address : "", port ? port : ""};
    }
    // Each step may have closed the socket and opened another (the next
    // address, or a retry without TLS), possibly with the same number: watch
    // it anew every time.
    watch_socket(true);
    co_await wait(st == PGRES_POLLING_READING ? asio::posix::stream_descriptor::wait_read
                                              : asio::posix::stream_descriptor::wait_write,
                  deadline, "connecting to the server");
  }
}

asio::awaitable<PgResultPtr> PgConnection::last_result(std::chrono::steady_clock::time_point deadline) {
  while (PQflush(conn_) == 1) co_await wait(asio::posix::stream_descriptor::wait_write, deadline, "sending a query");
  PgResultPtr last(nullptr, &PQclear);
  for (;;) {
    while (PQisBusy(conn_)) {
      co_await wait(asio::posix::stream_descriptor::wait_read, deadline, "waiting for the server's answer");
      if (!PQconsumeInput(conn_)) throw_conn_error("could not read from the server");
    }
    PGresult* r = PQgetResult(conn_);
    if (!r) break;
    auto status = PQresultStatus(r);
    if (status == PGRES_COPY_BOTH || status == PGRES_COPY_OUT || status == PGRES_COPY_IN) {
      last.reset(r);
      break;  // the copy is under way; no further results until it ends
    }
    if (status == PGRES_FATAL_ERROR || status == PGRES_BAD_RESPONSE) {
      const char* state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
      const char* primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
      std::string msg = PQresultErrorMessage(r);
      while (!msg.empty() && msg.back() == '\n') msg.pop_back();
      std::string sqlstate = state ? state : "";
      std::string primary_message = primary ? primary : "";
      PQclear(r);
      // Drain the rest so the connection stays usable.
      while (PGresult* rest = PQgetResult(conn_)) PQclear(rest);
      throw PgError(msg, sqlstate, primary_message);
    }
    last.reset(r);
  }
  co_return last;
}

asio::awaitable<PgRows> PgConnection::query(const std::string& sql, const std::vector<std::string>& params,
                                            std::chrono::milliseconds timeout) {
  if (!conn_) throw PgError("could not run a query: not connected", "");
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int ok;
  if (params.empty()) {
    ok = PQsendQuery(conn_, sql.c_str());
  } else {
    std::vector<const char*> values;
    for (auto& p : params) values.push_back(p.c_str());
    ok = PQsendQueryParams(conn_, sql.c_str(), static_cast<int>(values.size()), nullptr, values.data(), nullptr,
                           nullptr, 0);
  }
  if (!ok) throw_conn_error("could not send a query");
  co_return rows_of(co_await last_result(deadline));
}

asio::awaitable<void> PgConnection::prepare(const std::string& sql, std::chrono::milliseconds timeout) {
  if (!conn_) throw PgError("could not prepare a statement: not connected", "");
  if (!PQsendPrepare(conn_, "", sql.c_str(), 0, nullptr)) throw_conn_error("could not send a statement to prepare");
  co_await last_result(std::chrono::steady_clock::now() + timeout);
}

asio::awaitable<PgRows> PgConnection::query_prepared(std::chrono::milliseconds timeout) {
  if (!conn_) throw PgError("could not run a query: not connected", "");
  if (!PQsendQueryPrepared(conn_, "", 0, nullptr, nullptr, nullptr, 0)) throw_conn_error("could not send a query");
  co_return rows_of(co_await last_result(std::chrono::steady_clock::now() + timeout));
}

asio::awaitable<PgRows> PgConnection::query_one(const std::string& sql, std::chrono::milliseconds timeout) {
  if (!conn_) throw PgError("could not run a query: not connected", "");
  // PQsendQueryParams even without parameters: the extended protocol.
  if (!PQsendQueryParams(conn_, sql.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 0))
    throw_conn_error("could not send a query");
  co_return rows_of(co_await last_result(std::chrono::steady_clock::now() + timeout));
}

asio::awaitable<PgResultPtr> PgConnection::query_result(const std::string& sql, std::chrono::milliseconds timeout) {
  if (!conn_) throw PgError("could not run a query: not connected", "");
  if (!PQsendQuery(conn_, sql.c_str())) throw_conn_error("could not send a query");
  co_return co_await last_result(std::chrono::steady_clock::now() + timeout);
}

asio::awaitable<void> PgConnection::start_copy_out(const std::string& command, std::chrono::milliseconds timeout) {
  if (!conn_) throw PgError("could not run a query: not connected", "");
  if (!PQsendQuery(conn_, command.c_str())) throw_conn_error("could not send a COPY");
  auto result = co_await last_result(std::chrono::steady_clock::now() + timeout);
  if (!result || PQresultStatus(result.get()) != PGRES_COPY_OUT)
    throw PgError("could not start a COPY: unexpected answer to " + command, "");
}

asio::awaitable<void> PgConnection::end_copy_out(std::chrono::milliseconds timeout) {
  // last_result throws the server's error, and drains what follows it.
  co_await last_result(std::chrono::steady_clock::now() + timeout);
}

asio::awaitable<void> PgConnection::start_copy_both(const std::string& command, std::chrono::milliseconds timeout) {
  if (!PQsendQuery(conn_, command.c_str())) throw_conn_error("could not send " + command);
  auto result = co_await last_result(std::chrono::steady_clock::now() + timeout);
  if (!result || PQresultStatus(result.get()) != PGRES_COPY_BOTH)
    throw PgError("could not start replication: unexpected answer to " + command, "");
}

int PgConnection::try_get_copy_data(char** buffer, const char* what) {
  int n = PQgetCopyData(conn_, buffer, 1);
  if (n == -2) throw_conn_error(what);
  return n;
}

void PgConnection::consume_input() {
  if (!PQconsumeInput(conn_)) throw_conn_error("could not receive data from the server");
}

asio::awaitable<void> PgConnection::wait_readable() {
  if (!socket_) throw PgError("could not wait for replication data: no connection", "");
  if (tls_holds_input()) co_return;
  auto sock = socket_;  // kept alive while this coroutine waits on it
  boost::system::error_code ec;
  co_await sock->async_wait(asio::posix::stream_descriptor::wait_read, asio::redirect_error(asio::use_awaitable, ec));
}

// libpq reads one TLS record at a time, and no more of it than fits in its
// buffer (at least 8 KiB free). PostgreSQL writes at most 8 KiB at a time, but
// a TLS-terminating proxy or pooler may send records of 16 KiB: the rest of
// one then waits decrypted inside OpenSSL, where a poll of the socket does not
// see it. libpq's own blocking waits ask OpenSSL first (pqSocketCheck); so
// does every wait here, else the end of a COPY or of an answer that sits there
// is waited for until the next byte the server happens to send, or forever.
bool PgConnection::tls_holds_input() {
  if (!conn_) return false;
  auto* ssl = static_cast<SSL*>(PQsslStruct(conn_, "OpenSSL"));
  const int held = ssl ? SSL_pending(ssl) : 0;
  if (held > 0 && !tls_held_noted_) {
    tls_held_noted_ = true;
    spdlog::debug("{} bytes of a TLS record wait inside OpenSSL, unseen by the socket: read without waiting (noted "
                  "once per connection)",
                  held);
  }
  return held > 0;
}

void PgConnection::set_receive_low_water(int bytes) {
  // Best effort: it changes only how often the loop wakes, never what it reads.
  const int fd = conn_ ? PQsocket(conn_) : -1;
  if (fd >= 0) (void)::setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof bytes);
}

bool PgConnection::is_tcp() const {
  const int fd = conn_ ? PQsocket(conn_) : -1;
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (fd < 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return false;
  return addr.ss_family == AF_INET || addr.ss_family == AF_INET6;
}

void PgConnection::cancel_wait() {
  boost::system::error_code ec;
  if (socket_) socket_->cancel(ec);
}

void PgConnection::finish_copy() {
  PgResultPtr r(PQgetResult(conn_), &PQclear);
  if (r && PQresultStatus(r.get()) == PGRES_FATAL_ERROR) {
    const char* state = PQresultErrorField(r.get(), PG_DIAG_SQLSTATE);
    std::string msg = PQresultErrorMessage(r.get());
    while (!msg.empty() && msg.back() == '\n') msg.pop_back();
    throw PgError(msg, state ? state : "");
  }
  throw PgError("the server ended replication", "");
}

asio::awaitable<void> PgConnection::end_copy(std::chrono::steady_clock::time_point deadline) {
  using wait_type = asio::posix::stream_descriptor::wait_type;
  int sent;
  while ((sent = PQputCopyEnd(conn_, nullptr)) == 0) co_await wait(wait_type::wait_write, deadline, "ending replication");
  if (sent < 0) throw_conn_error("could not end replication");
  // Its CopyDone is the answer: the walsender sends it when it reads ours,
  // after every message before. What follows (the command's end) may wait
  // for the transaction it is decoding to be sent in full: not waited for.
  for (;;) {
    if (std::chrono::steady_clock::now() >= deadline) throw PgError("timed out: ending replication", "");
    char* buffer = nullptr;
    int n = PQgetCopyData(conn_, &buffer, 1);
    if (n > 0) {
      PQfreemem(buffer);  // WAL the walsender sent before it saw the CopyDone
      continue;
    }
    if (n == -1) co_return;  // its CopyDone
    if (n == -2) throw_conn_error("could not end replication");
    co_await wait(wait_type::wait_read, deadline, "ending replication");
    if (!PQconsumeInput(conn_)) throw_conn_error("could not end replication");
  }
}

asio::awaitable<void> PgConnection::put_copy_data(std::span<const std::byte> data) {
  auto deadline = std::chrono::steady_clock::now() + 30s;
  for (;;) {
    int r = PQputCopyData(conn_, reinterpret_cast<const char*>(data.data()), static_cast<int>(data.size()));
    if (r == 1) break;
    if (r < 0) throw_conn_error("could not send a status update");
    co_await wait(asio::posix::stream_descriptor::wait_write, deadline, "sending a status update");
  }
  for (;;) {
    int r = PQflush(conn_);
    if (r == 0) break;
    if (r < 0) throw_conn_error("could not send a status update");
    co_await wait(asio::posix::stream_descriptor::wait_write, deadline, "sending a status update");
  }
}

std::string PgConnection::quote_identifier(const std::string& name) {
  char* q = PQescapeIdentifier(conn_, name.c_str(), name.size());
  if (!q) throw_conn_error("could not quote an identifier");
  std::string out(q);
  PQfreemem(q);
  return out;
}

std::string PgConnection::quote_literal(const std::string& value) {
  char* q = PQescapeLiteral(conn_, value.c_str(), value.size());
  if (!q) throw_conn_error("could not quote a literal");
  std::string out(q);
  PQfreemem(q);
  return out;
}

}  // namespace walrelay
