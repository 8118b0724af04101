#include "walrelay/pg_connection.hpp"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace walrelay {
namespace asio = boost::asio;
using namespace std::chrono_literals;

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
}

void PgConnection::watch_socket() {
  int fd = conn_ ? PQsocket(conn_) : -1;
  if (socket_ && socket_->native_handle() == fd) return;
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

asio::awaitable<void> PgConnection::connect(const std::string& conninfo, std::chrono::milliseconds timeout) {
  close();
  auto deadline = std::chrono::steady_clock::now() + timeout;
  conn_ = PQconnectStart(conninfo.c_str());
  if (!conn_) throw PgError("could not connect: out of memory", "");
  if (PQstatus(conn_) == CONNECTION_BAD) throw_conn_error("could not connect");
  for (;;) {
    auto st = PQconnectPoll(conn_);
    if (st == PGRES_POLLING_OK) break;
    if (st == PGRES_POLLING_FAILED) {
      // libpq reports authentication and privilege failures here; keep the
      // server's SQLSTATE-free text, it names the cause.
      throw_conn_error("could not connect");
    }
    watch_socket();
    co_await wait(st == PGRES_POLLING_READING ? asio::posix::stream_descriptor::wait_read
                                              : asio::posix::stream_descriptor::wait_write,
                  deadline, "connecting to the server");
  }
  watch_socket();
  if (PQsetnonblocking(conn_, 1) != 0) throw_conn_error("could not set the connection non-blocking");
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
      std::string msg = PQresultErrorMessage(r);
      while (!msg.empty() && msg.back() == '\n') msg.pop_back();
      std::string sqlstate = state ? state : "";
      PQclear(r);
      // Drain the rest so the connection stays usable.
      while (PGresult* rest = PQgetResult(conn_)) PQclear(rest);
      throw PgError(msg, sqlstate);
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
  auto result = co_await last_result(deadline);
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
  co_return rows;
}

asio::awaitable<void> PgConnection::start_copy_both(const std::string& command, std::chrono::milliseconds timeout) {
  if (!PQsendQuery(conn_, command.c_str())) throw_conn_error("could not send " + command);
  auto result = co_await last_result(std::chrono::steady_clock::now() + timeout);
  if (!result || PQresultStatus(result.get()) != PGRES_COPY_BOTH)
    throw PgError("could not start replication: unexpected answer to " + command, "");
}

int PgConnection::try_get_copy_data(char** buffer) {
  int n = PQgetCopyData(conn_, buffer, 1);
  if (n == -2) throw_conn_error("could not read replication data");
  return n;
}

void PgConnection::consume_input() {
  if (!PQconsumeInput(conn_)) throw_conn_error("could not receive data from the server");
}

asio::awaitable<void> PgConnection::wait_readable() {
  if (!socket_) throw PgError("could not wait for replication data: no connection", "");
  auto sock = socket_;  // kept alive while this coroutine waits on it
  boost::system::error_code ec;
  co_await sock->async_wait(asio::posix::stream_descriptor::wait_read, asio::redirect_error(asio::use_awaitable, ec));
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
