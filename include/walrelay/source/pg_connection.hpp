// A libpq connection driven by the relay's io_context: the socket is watched
// by Asio and never read with a blocking call. RAII for every libpq handle.
#pragma once

#include <chrono>
#include <map>
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include <libpq-fe.h>

namespace walrelay {

// A server or connection error with its SQLSTATE ("" when libpq made it up).
class PgError : public std::runtime_error {
 public:
  PgError(std::string message, std::string sqlstate, std::string primary = {})
      : std::runtime_error(std::move(message)), sqlstate_(std::move(sqlstate)), primary_(std::move(primary)) {}
  const std::string& sqlstate() const { return sqlstate_; }
  // The server's primary message alone (no DETAIL, HINT or the query's
  // text); "" when libpq made the error up.
  const std::string& primary() const { return primary_; }

 private:
  std::string sqlstate_;
  std::string primary_;
};

using PgResultPtr = std::unique_ptr<PGresult, decltype(&PQclear)>;

// Rows of a simple query as text (NULL as nullopt); enough for catalog reads.
struct PgRows {
  std::vector<std::string> columns;
  std::vector<std::vector<std::optional<std::string>>> rows;
  const std::optional<std::string>& at(std::size_t row, const std::string& column) const;
};

class PgConnection {
 public:
  explicit PgConnection(boost::asio::io_context& io);
  ~PgConnection();
  PgConnection(const PgConnection&) = delete;
  PgConnection& operator=(const PgConnection&) = delete;

  // PQconnectStart + PQconnectPoll, waiting on the socket; PgError on failure or timeout.
  boost::asio::awaitable<void> connect(const std::string& conninfo, std::chrono::milliseconds timeout);
  // Runs one statement; PgError with the server's SQLSTATE on failure.
  boost::asio::awaitable<PgRows> query(const std::string& sql, const std::vector<std::string>& params = {},
                                       std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // Runs one statement and hands over libpq's result as it is: for reading
  // many rows without a copy of each value (the initial snapshot's FETCH).
  boost::asio::awaitable<PgResultPtr> query_result(const std::string& sql, std::chrono::milliseconds timeout);
  // The extended protocol, for SQL that carries text walrelay did not write
  // (an operator's condition): the server takes exactly one statement, so
  // nothing in the text can end the transaction or run a second statement
  // after it. Not on a walsender connection, which takes simple queries only.
  // prepare parses and analyses `sql` as the unnamed statement without
  // running it; query_prepared runs it; query_one does both at once.
  boost::asio::awaitable<void> prepare(const std::string& sql, std::chrono::milliseconds timeout);
  boost::asio::awaitable<PgRows> query_prepared(std::chrono::milliseconds timeout);
  boost::asio::awaitable<PgRows> query_one(const std::string& sql, std::chrono::milliseconds timeout);
  // Inside a transaction block that has not failed (libpq's view after the
  // last answer).
  bool in_transaction() const { return conn_ && PQtransactionStatus(conn_) == PQTRANS_INTRANS; }
  // Sends a COPY ... TO STDOUT and waits until the server begins it; its
  // rows then come through try_get_copy_data, and end_copy_out reads the
  // command's outcome once that returned -1.
  boost::asio::awaitable<void> start_copy_out(const std::string& command, std::chrono::milliseconds timeout);
  // PgError when the COPY failed (the server's message and SQLSTATE).
  boost::asio::awaitable<void> end_copy_out(std::chrono::milliseconds timeout);
  // Sends START_REPLICATION (or any command entering COPY BOTH) and waits for it.
  boost::asio::awaitable<void> start_copy_both(const std::string& command, std::chrono::milliseconds timeout);

  // COPY BOTH or OUT, non-blocking: > 0 a message (free with PQfreemem), 0
  // nothing buffered (wait_readable), -1 the server ended the copy, throws on
  // error.
  int try_get_copy_data(char** buffer, const char* what = "could not read replication data");
  // Waits until the socket is readable or cancel_wait() is called. No timer
  // of its own: the replication loop waits once per message burst, and a
  // deadline timer armed per wait costs a timerfd update each time.
  boost::asio::awaitable<void> wait_readable();
  void cancel_wait();
  // The socket counts as readable for wait_readable only once this many
  // bytes are queued (1: any); a read still takes whatever is there.
  void set_receive_low_water(int bytes);
  // Whether the connection is TCP (a low-water mark works), not a Unix-domain socket.
  bool is_tcp() const;
  // Input decrypted by OpenSSL that libpq has not read: the socket may never
  // become readable for it, so the waits return at once.
  bool tls_holds_input();
  // Reads what the socket has into libpq's buffer; throws on a broken connection.
  void consume_input();
  // Queues a CopyData message and flushes without blocking the loop.
  boost::asio::awaitable<void> put_copy_data(std::span<const std::byte> data);
  // The error that ended the copy, after try_get_copy_data returned -1.
  void finish_copy();
  // Ends COPY BOTH as the protocol means it: CopyDone, then what the server
  // still sends read and dropped until its own CopyDone. The walsender
  // handles messages in order, so once it answers it has applied every status
  // update sent before: the slot holds the position walrelay sent, not one a
  // closed socket may have lost. Throws on a broken connection or at the
  // deadline; the connection is then only fit to close.
  boost::asio::awaitable<void> end_copy(std::chrono::steady_clock::time_point deadline);

  void close();
  bool connected() const { return conn_ != nullptr; }
  int server_version() const { return conn_ ? PQserverVersion(conn_) : 0; }
  PGconn* raw() { return conn_; }
  boost::asio::io_context& io() const { return io_; }
  std::string quote_identifier(const std::string& name);
  std::string quote_literal(const std::string& value);

 private:
  boost::asio::awaitable<void> wait(boost::asio::posix::stream_descriptor::wait_type type,
                                    std::chrono::steady_clock::time_point deadline, const char* what);
  boost::asio::awaitable<PgResultPtr> last_result(std::chrono::steady_clock::time_point deadline);
  [[noreturn]] void throw_conn_error(const std::string& what);
  struct ConnectFailure {
    std::string message, host, address, port;  // libpq's, and the host it failed at
  };
  boost::asio::awaitable<std::optional<ConnectFailure>> connect_once(
      const std::vector<std::pair<std::string, std::string>>& options, std::chrono::steady_clock::time_point deadline);
  void watch_socket(bool anew = false);

  boost::asio::io_context& io_;
  PGconn* conn_ = nullptr;
  // Watches libpq's socket; released, never closed, because libpq owns the fd.
  std::shared_ptr<boost::asio::posix::stream_descriptor> socket_;
  bool tls_held_noted_ = false;  // tls_holds_input() logged it on this connection
};

// "could not X: <first line of libpq's message>"
std::string pg_message(PGconn* conn);

// The keyword/value pairs of a libpq connection string; PgError when it does not parse.
std::vector<std::pair<std::string, std::string>> parse_conninfo(const std::string& conninfo);
// Whether libpq would resolve `host` by name (not an IP literal or a socket directory).
bool needs_resolving(const std::string& host);
// The options with each host name replaced by one entry per resolved address
// (host keeps the name for TLS, hostaddr gets the address, port follows);
// names without addresses are left out.
std::vector<std::pair<std::string, std::string>> with_host_addresses(
    std::vector<std::pair<std::string, std::string>> options,
    const std::map<std::string, std::vector<std::string>>& addresses);
// The connection options from the host after the one a connection failed at
// (its name, the address libpq used, its port) on; nullopt when it was the
// last, or cannot be told apart.
std::optional<std::vector<std::pair<std::string, std::string>>> hosts_after(
    std::vector<std::pair<std::string, std::string>> options, const std::string& host, const std::string& address,
    const std::string& port);

}  // namespace walrelay
