// AdminServer over real sockets: endpoints and status codes, /slot JSON,
// token auth, and hostile clients (garbage, huge headers and bodies, slow
// and idle connections). The server's io_context runs on its own thread; the
// client is a Beast stream on the test thread whose every operation has a
// deadline, so a broken server fails a check instead of hanging the run.
#include <catch2/catch.hpp>

#include <array>
#include <csignal>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <simdjson.h>

#include "walrelay/admin/admin_server.hpp"
#include "walrelay/admin/metrics.hpp"
#include "walrelay/admin/status.hpp"

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A StatusSource the test sets from its own thread while the loop reads it.
class FakeStatus : public walrelay::StatusSource {
 public:
  walrelay::StatusSnapshot status() const override {
    std::lock_guard lock(mutex_);
    return snapshot_;
  }
  void set(walrelay::StatusSnapshot snapshot) {
    std::lock_guard lock(mutex_);
    snapshot_ = std::move(snapshot);
  }

 private:
  mutable std::mutex mutex_;            // guards snapshot_
  walrelay::StatusSnapshot snapshot_;   // returned by status()
};

// A healthy, streaming relay.
walrelay::StatusSnapshot streaming() {
  walrelay::StatusSnapshot s;
  s.slot_name = "walrelay_slot";
  s.state = walrelay::RelayState::streaming;
  s.received_lsn.value = 0x16B374D848ULL;
  s.confirmed_flush_lsn.value = 0x16B3740000ULL;
  s.server_wal_end.value = 0x16B3750000ULL;
  s.lag_bytes = 0x10000;
  s.lag_seconds = 1.5;
  s.inflight_records = 7;
  s.inflight_bytes = 2048;
  return s;
}

walrelay::AdminOptions test_options() {
  walrelay::AdminOptions options;
  options.listen = "127.0.0.1:0";
  options.request_timeout_ms = 2000;
  return options;
}

// An AdminServer on a loop thread, with a real Metrics and a FakeStatus.
struct TestServer {
  explicit TestServer(walrelay::AdminOptions options = test_options())
      : admin(io, std::move(options), status, metrics) {
    std::signal(SIGPIPE, SIG_IGN);
    status.set(streaming());
    admin.start();
    loop = std::thread([this] { io.run(); });
  }
  ~TestServer() {
    work.reset();
    io.stop();
    loop.join();
  }
  TestServer(const TestServer&) = delete;
  TestServer& operator=(const TestServer&) = delete;

  // Runs fn on the loop thread and waits for it.
  void on_loop(std::function<void()> fn) {
    std::promise<void> done;
    net::post(io, [&] {
      fn();
      done.set_value();
    });
    REQUIRE(done.get_future().wait_for(5s) == std::future_status::ready);
  }

  unsigned short port() const { return admin.port(); }

  net::io_context io;                    // the "relay" loop
  walrelay::Metrics metrics;             // real metrics
  FakeStatus status;                     // what the relay reports
  walrelay::AdminServer admin;           // under test
  net::executor_work_guard<net::io_context::executor_type> work = net::make_work_guard(io);
  std::thread loop;                      // runs io
};

// What a client read: a response, or the error that ended the read.
struct Reply {
  error_code ec;                                  // set if no complete response arrived
  http::response<http::string_body> response;     // valid when !ec
};

// A blocking client where every operation has a deadline.
class Client {
 public:
  explicit Client(unsigned short port) {
    stream_.expires_after(5s);
    stream_.async_connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port),
                          [this](const error_code& ec) { connect_ec = ec; });
    run();
  }

  // Writes raw bytes.
  error_code send(std::string_view bytes, std::chrono::milliseconds timeout = 5s) {
    error_code result;
    stream_.expires_after(timeout);
    net::async_write(stream_, net::buffer(bytes.data(), bytes.size()),
                     [&](const error_code& ec, std::size_t) { result = ec; });
    run();
    return result;
  }

  // Reads one response (for a HEAD request, head = true: no body follows).
  Reply read(bool head = false, std::chrono::milliseconds timeout = 5s) {
    Reply reply;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 * 1024 * 1024);
    parser.skip(head);
    stream_.expires_after(timeout);
    http::async_read(stream_, buffer_, parser, [&](const error_code& ec, std::size_t) { reply.ec = ec; });
    run();
    if (!reply.ec) reply.response = parser.release();
    return reply;
  }

  // Sends a request and reads its response.
  Reply request(std::string_view raw, bool head = false) {
    if (const auto ec = send(raw)) return Reply{ec, {}};
    return read(head);
  }

  // Reads and discards until the server closes (eof or reset) or the
  // deadline passes; returns the error that ended it (timeout if never closed).
  error_code wait_closed(std::chrono::milliseconds timeout) {
    stream_.expires_after(timeout);
    error_code result;
    std::function<void()> read_more;
    read_more = [&] {
      stream_.async_read_some(net::buffer(scratch_), [&](const error_code& ec, std::size_t) {
        if (ec) {
          result = ec;
          return;
        }
        read_more();
      });
    };
    read_more();
    run();
    return result;
  }

  // Closes the client side.
  void close() {
    error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  beast::tcp_stream& stream() { return stream_; }
  void run() {
    io_.restart();
    io_.run();
  }

  error_code connect_ec;  // result of the connect in the constructor

 private:
  net::io_context io_;                   // the client's own loop
  beast::tcp_stream stream_{io_};        // connection with deadlines
  beast::flat_buffer buffer_;            // read buffer
  std::array<char, 65536> scratch_{};    // discarded bytes in wait_closed
};

// True for the errors that mean "the server closed the connection".
bool is_closed(const error_code& ec) {
  return ec == net::error::eof || ec == http::error::end_of_stream || ec == http::error::partial_message ||
         ec == net::error::connection_reset || ec == net::error::broken_pipe ||
         ec == net::error::connection_aborted;
}

std::string get(std::string_view target, std::string_view extra_headers = "", std::string_view method = "GET") {
  return std::string(method) + " " + std::string(target) + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
         std::string(extra_headers) + "\r\n";
}

// One request on a fresh connection.
Reply fetch(unsigned short port, std::string_view target, std::string_view extra_headers = "",
            std::string_view method = "GET") {
  Client client(port);
  if (client.connect_ec) return Reply{client.connect_ec, {}};
  return client.request(get(target, extra_headers, method), method == "HEAD");
}

std::string header(const http::response<http::string_body>& response, http::field field) {
  const auto value = response[field];
  return std::string(value.data(), value.size());
}

// Checks the headers every response carries.
void check_common_headers(const http::response<http::string_body>& response) {
  CHECK(header(response, http::field::server) == "walrelay");
  CHECK(header(response, http::field::cache_control) == "no-store");
  CHECK(response.has_content_length());
}

}  // namespace

TEST_CASE("relay states have lower-case names", "[admin]") {
  using walrelay::RelayState;
  CHECK(std::string(walrelay::to_string(RelayState::starting)) == "starting");
  CHECK(std::string(walrelay::to_string(RelayState::connecting)) == "connecting");
  CHECK(std::string(walrelay::to_string(RelayState::standby)) == "standby");
  CHECK(std::string(walrelay::to_string(RelayState::streaming)) == "streaming");
  CHECK(std::string(walrelay::to_string(RelayState::reconnecting)) == "reconnecting");
  CHECK(std::string(walrelay::to_string(RelayState::draining)) == "draining");
  CHECK(std::string(walrelay::to_string(RelayState::halted)) == "halted");
  CHECK(std::string(walrelay::to_string(RelayState::stopped)) == "stopped");
}

TEST_CASE("healthz and readyz follow the relay state", "[admin]") {
  TestServer server;
  REQUIRE(server.port() != 0);

  SECTION("streaming with a healthy producer is ready") {
    auto health = fetch(server.port(), "/healthz");
    REQUIRE_FALSE(health.ec);
    CHECK(health.response.result() == http::status::ok);
    CHECK(health.response.body() == "ok\n");
    check_common_headers(health.response);

    auto ready = fetch(server.port(), "/readyz");
    REQUIRE_FALSE(ready.ec);
    CHECK(ready.response.result() == http::status::ok);
    CHECK(ready.response.body() == "ready\n");
    check_common_headers(ready.response);
  }

  SECTION("connecting is alive but not ready, with the reason") {
    auto s = streaming();
    s.state = walrelay::RelayState::connecting;
    s.state_reason = "could not connect to server: Connection refused";
    server.status.set(s);

    auto ready = fetch(server.port(), "/readyz");
    REQUIRE_FALSE(ready.ec);
    CHECK(ready.response.result() == http::status::service_unavailable);
    CHECK(ready.response.body() == "connecting: could not connect to server: Connection refused\n");

    auto health = fetch(server.port(), "/healthz");
    REQUIRE_FALSE(health.ec);
    CHECK(health.response.result() == http::status::ok);
  }

  SECTION("an unhealthy producer is not ready") {
    auto s = streaming();
    s.producer_healthy = false;
    s.producer_error = "1/1 brokers are down";
    server.status.set(s);

    auto ready = fetch(server.port(), "/readyz");
    REQUIRE_FALSE(ready.ec);
    CHECK(ready.response.result() == http::status::service_unavailable);
    CHECK(ready.response.body() == "broker unreachable (kafka): 1/1 brokers are down\n");
  }

  SECTION("halted fails both, and a multi-line reason stays on one line") {
    auto s = streaming();
    s.state = walrelay::RelayState::halted;
    s.state_reason = "slot lost\nby the server";
    server.status.set(s);

    auto health = fetch(server.port(), "/healthz");
    REQUIRE_FALSE(health.ec);
    CHECK(health.response.result() == http::status::service_unavailable);
    CHECK(health.response.body() == "halted: slot lost by the server\n");

    auto ready = fetch(server.port(), "/readyz");
    REQUIRE_FALSE(ready.ec);
    CHECK(ready.response.result() == http::status::service_unavailable);
    CHECK(ready.response.body() == "halted: slot lost by the server\n");
  }

  SECTION("a query string is ignored") {
    auto health = fetch(server.port(), "/healthz?verbose=1&x=%20");
    REQUIRE_FALSE(health.ec);
    CHECK(health.response.result() == http::status::ok);
  }
}

TEST_CASE("metrics endpoint serves the Prometheus text format", "[admin]") {
  TestServer server;
  server.metrics.events_relayed("public.outbox", "orders").Increment(5);

  auto reply = fetch(server.port(), "/metrics");
  REQUIRE_FALSE(reply.ec);
  CHECK(reply.response.result() == http::status::ok);
  CHECK(header(reply.response, http::field::content_type) == "text/plain; version=0.0.4; charset=utf-8");
  check_common_headers(reply.response);
  const std::string& body = reply.response.body();
  CHECK(body.find(R"(walrelay_events_relayed_total{table="public.outbox",topic="orders"} 5)") !=
        std::string::npos);
  CHECK(body.find("process_resident_memory_bytes ") != std::string::npos);
  CHECK(body.find("walrelay_start_time_seconds ") != std::string::npos);

  SECTION("HEAD gives the headers and no body") {
    auto head = fetch(server.port(), "/metrics", "", "HEAD");
    REQUIRE_FALSE(head.ec);
    CHECK(head.response.result() == http::status::ok);
    CHECK(head.response.body().empty());
    // Content-Length is that of the GET body, which is not sent.
    REQUIRE(head.response.has_content_length());
    CHECK(std::stoul(header(head.response, http::field::content_length)) > 100);
  }
}

TEST_CASE("slot endpoint returns the snapshot as JSON", "[admin]") {
  TestServer server;
  simdjson::dom::parser parser;

  SECTION("without server information") {
    auto s = streaming();
    s.slot_name = "slot \"q\" \\ \n\t\x01 caf\xC3\xA9";  // needs escaping; UTF-8 kept
    s.state_reason = "bad \xFF byte";                      // invalid UTF-8 is replaced
    server.status.set(s);

    auto reply = fetch(server.port(), "/slot");
    REQUIRE_FALSE(reply.ec);
    CHECK(reply.response.result() == http::status::ok);
    CHECK(header(reply.response, http::field::content_type) == "application/json");
    check_common_headers(reply.response);

    simdjson::dom::element doc;
    REQUIRE(parser.parse(reply.response.body()).get(doc) == simdjson::SUCCESS);
    CHECK(std::string(std::string_view(doc["slot_name"])) == s.slot_name);
    CHECK(std::string(std::string_view(doc["state"])) == "streaming");
    CHECK(std::string(std::string_view(doc["state_reason"])) == "bad \xEF\xBF\xBD byte");
    CHECK(std::string(std::string_view(doc["received_lsn"])) == "16/B374D848");
    CHECK(std::string(std::string_view(doc["confirmed_flush_lsn"])) == "16/B3740000");
    CHECK(std::string(std::string_view(doc["server_wal_end"])) == "16/B3750000");
    CHECK(std::uint64_t(doc["lag_bytes"]) == 0x10000);
    CHECK(double(doc["lag_seconds"]) == Approx(1.5));
    CHECK(std::uint64_t(doc["inflight_records"]) == 7);
    CHECK(std::uint64_t(doc["inflight_bytes"]) == 2048);
    CHECK(bool(doc["producer_healthy"]) == true);
    CHECK(doc["server"].is_null());
  }

  SECTION("with server information, some of it missing") {
    auto s = streaming();
    s.lag_bytes = UINT64_MAX;
    walrelay::ServerSlotInfo info;
    info.wal_status = "extended";
    info.safe_wal_size = -1024;
    info.confirmed_flush_lsn = pgoutput::Lsn{0x100000000ULL};
    info.observed_at_unix_ms = 1700000000123;
    s.server = info;
    s.producer_healthy = false;
    server.status.set(s);

    auto reply = fetch(server.port(), "/slot");
    REQUIRE_FALSE(reply.ec);
    simdjson::dom::element doc;
    REQUIRE(parser.parse(reply.response.body()).get(doc) == simdjson::SUCCESS);
    CHECK(std::uint64_t(doc["lag_bytes"]) == UINT64_MAX);
    CHECK(bool(doc["producer_healthy"]) == false);
    simdjson::dom::element srv = doc["server"];
    REQUIRE(srv.is_object());
    CHECK(std::string(std::string_view(srv["wal_status"])) == "extended");
    CHECK(std::int64_t(srv["safe_wal_size"]) == -1024);
    CHECK(srv["active_pid"].is_null());
    CHECK(std::string(std::string_view(srv["confirmed_flush_lsn"])) == "1/0");
    CHECK(srv["restart_lsn"].is_null());
    CHECK(std::int64_t(srv["observed_at_unix_ms"]) == 1700000000123);
  }

  SECTION("every member, in order, on one line; a NaN lag is null") {
    auto s = streaming();
    s.retained_wal_bytes = 1 << 20;
    s.lag_seconds = std::nan("");
    walrelay::ServerSlotInfo info;
    info.wal_status = "reserved";
    info.safe_wal_size = 4096;
    info.active_pid = 4242;
    info.confirmed_flush_lsn = pgoutput::Lsn{0x16B3740000ULL};
    info.restart_lsn = pgoutput::Lsn{0x16B3700000ULL};
    info.current_wal_lsn = pgoutput::Lsn{0x16B3750000ULL};
    info.observed_at_unix_ms = 1700000000123;
    s.server = info;
    server.status.set(s);

    auto reply = fetch(server.port(), "/slot");
    REQUIRE_FALSE(reply.ec);
    CHECK(reply.response.body() ==
          R"({"slot_name":"walrelay_slot","state":"streaming","state_reason":"","received_lsn":"16/B374D848",)"
          R"("confirmed_flush_lsn":"16/B3740000","server_wal_end":"16/B3750000","lag_bytes":65536,)"
          R"("retained_wal_bytes":1048576,"lag_seconds":null,"inflight_records":7,"inflight_bytes":2048,)"
          R"("sink":"kafka","producer_healthy":true,"server":{"wal_status":"reserved","safe_wal_size":4096,"active_pid":4242,)"
          R"("confirmed_flush_lsn":"16/B3740000","restart_lsn":"16/B3700000","current_wal_lsn":"16/B3750000",)"
          R"("observed_at_unix_ms":1700000000123},"snapshot":null,"exactly_once":null,"retention":null})"
          "\n");
  }

  SECTION("retention: its policy, last run and tables; what no run measured yet is null") {
    auto s = streaming();
    walrelay::RetentionStatus r;
    r.policy = "delete";
    r.retention_ms = 604800000;
    r.last_run_unix_ms = 1700000000123;
    r.last_outcome = "behind";
    r.tables.push_back({"public.outbox", 8192.0, 3.0, 120, 42.5});
    r.tables.push_back({"public.outbox2", std::nullopt, std::nullopt, 0, std::nullopt});
    s.retention = r;
    server.status.set(s);
    auto reply = fetch(server.port(), "/slot");
    REQUIRE_FALSE(reply.ec);
    CHECK(reply.response.body().find(
              R"("retention":{"policy":"delete","retention_ms":604800000,"last_run_unix_ms":1700000000123,)"
              R"("last_outcome":"behind","last_error":null,"partitions_removed":0,"tables":[{"table":"public.outbox",)"
              R"("bytes":8192.0,"rows_held":3.0,"rows_deleted":120,"oldest_row_age_seconds":42.5},)"
              R"({"table":"public.outbox2","bytes":null,"rows_held":null,"rows_deleted":0,)"
              R"("oldest_row_age_seconds":null}]})") != std::string::npos);
  }

  SECTION("the initial snapshot's progress; seconds_left null until there is a rate") {
    auto s = streaming();
    s.state = walrelay::RelayState::snapshot;
    walrelay::StatusSnapshot::Snapshot sn;
    sn.table = "public.outbox";
    sn.rows_done = 250;
    sn.rows_estimated = 1000;
    sn.rows_per_second = 125;
    sn.seconds_left = 6;
    sn.seconds = 2;
    s.snapshot = sn;
    server.status.set(s);
    auto reply = fetch(server.port(), "/slot");
    REQUIRE_FALSE(reply.ec);
    CHECK(reply.response.body().find(R"("state":"snapshot")") != std::string::npos);
    CHECK(reply.response.body().find(R"("snapshot":{"state":"running","table":"public.outbox","rows_done":250,)"
                                     R"("rows_estimated":1000,"rows_per_second":125.0,"seconds_left":6.0,)"
                                     R"("seconds":2.0})") != std::string::npos);
    auto ready = fetch(server.port(), "/readyz");
    CHECK(ready.response.result_int() == 503);
    CHECK(ready.response.body().rfind("snapshot", 0) == 0);
    sn.done = true;
    sn.seconds_left.reset();
    s.snapshot = sn;
    s.state = walrelay::RelayState::streaming;
    server.status.set(s);
    reply = fetch(server.port(), "/slot");
    CHECK(reply.response.body().find(R"("snapshot":{"state":"done","table":"public.outbox","rows_done":250,)"
                                     R"("rows_estimated":1000,"rows_per_second":125.0,"seconds_left":null,)") !=
          std::string::npos);
  }

  SECTION("exactly once: the transactional id and the committed position") {
    auto s = streaming();
    s.exactly_once = walrelay::StatusSnapshot::ExactlyOnce{"walrelay-db-slot", pgoutput::Lsn{0x16B3740000ULL}};
    server.status.set(s);
    auto reply = fetch(server.port(), "/slot");
    REQUIRE_FALSE(reply.ec);
    simdjson::dom::element doc;
    REQUIRE(parser.parse(reply.response.body()).get(doc) == simdjson::SUCCESS);
    simdjson::dom::element eos = doc["exactly_once"];
    REQUIRE(eos.is_object());
    CHECK(std::string(std::string_view(eos["transactional_id"])) == "walrelay-db-slot");
    CHECK(std::string(std::string_view(eos["committed_lsn"])) == "16/B3740000");

    s.exactly_once->committed_lsn.reset();  // nothing committed yet
    server.status.set(s);
    reply = fetch(server.port(), "/slot");
    REQUIRE(parser.parse(reply.response.body()).get(doc) == simdjson::SUCCESS);
    CHECK(doc["exactly_once"]["committed_lsn"].is_null());
  }
}

TEST_CASE("unknown paths and methods", "[admin]") {
  TestServer server;

  auto missing = fetch(server.port(), "/nope");
  REQUIRE_FALSE(missing.ec);
  CHECK(missing.response.result() == http::status::not_found);
  check_common_headers(missing.response);

  auto post = fetch(server.port(), "/healthz", "Content-Length: 0\r\n", "POST");
  REQUIRE_FALSE(post.ec);
  CHECK(post.response.result() == http::status::method_not_allowed);
  CHECK(header(post.response, http::field::allow) == "GET, HEAD");

  auto del = fetch(server.port(), "/slot", "", "DELETE");
  REQUIRE_FALSE(del.ec);
  CHECK(del.response.result() == http::status::method_not_allowed);
}

TEST_CASE("keep-alive serves several requests on one connection", "[admin]") {
  TestServer server;
  Client client(server.port());
  REQUIRE_FALSE(client.connect_ec);
  for (const char* target : {"/healthz", "/readyz", "/slot", "/metrics", "/healthz"}) {
    INFO(target);
    auto reply = client.request(get(target));
    REQUIRE_FALSE(reply.ec);
    CHECK(reply.response.result() == http::status::ok);
    CHECK(reply.response.keep_alive());
  }
  // HEAD sends no body, so the next response on the connection parses cleanly.
  auto head = client.request(get("/slot", "", "HEAD"), true);
  REQUIRE_FALSE(head.ec);
  CHECK(head.response.result() == http::status::ok);
  auto after_head = client.request(get("/healthz"));
  REQUIRE_FALSE(after_head.ec);
  CHECK(after_head.response.body() == "ok\n");

  // Two pipelined requests in one write.
  REQUIRE_FALSE(client.send(get("/healthz") + get("/readyz")));
  auto first = client.read();
  auto second = client.read();
  REQUIRE_FALSE(first.ec);
  REQUIRE_FALSE(second.ec);
  CHECK(first.response.body() == "ok\n");
  CHECK(second.response.body() == "ready\n");

  // Connection: close is honoured.
  auto last = client.request(get("/healthz", "Connection: close\r\n"));
  REQUIRE_FALSE(last.ec);
  CHECK_FALSE(last.response.keep_alive());
  CHECK(is_closed(client.wait_closed(2s)));
}

TEST_CASE("a token guards everything but healthz", "[admin]") {
  auto options = test_options();
  options.token = "s3cret-token";
  TestServer server(options);

  for (const char* target : {"/readyz", "/metrics", "/slot", "/nope"}) {
    INFO(target);
    auto bare = fetch(server.port(), target);
    REQUIRE_FALSE(bare.ec);
    CHECK(bare.response.result() == http::status::unauthorized);
    CHECK(header(bare.response, http::field::www_authenticate) == "Bearer");
    CHECK(bare.response.body().find("s3cret") == std::string::npos);

    auto wrong = fetch(server.port(), target, "Authorization: Bearer s3cret-tokeX\r\n");
    REQUIRE_FALSE(wrong.ec);
    CHECK(wrong.response.result() == http::status::unauthorized);

    auto prefix = fetch(server.port(), target, "Authorization: Bearer s3cret\r\n");
    REQUIRE_FALSE(prefix.ec);
    CHECK(prefix.response.result() == http::status::unauthorized);

    auto longer = fetch(server.port(), target, "Authorization: Bearer s3cret-token2\r\n");
    REQUIRE_FALSE(longer.ec);
    CHECK(longer.response.result() == http::status::unauthorized);

    auto basic = fetch(server.port(), target, "Authorization: Basic czNjcmV0LXRva2Vu\r\n");
    REQUIRE_FALSE(basic.ec);
    CHECK(basic.response.result() == http::status::unauthorized);
  }

  for (const char* target : {"/readyz", "/metrics", "/slot"}) {
    INFO(target);
    auto good = fetch(server.port(), target, "Authorization: Bearer s3cret-token\r\n");
    REQUIRE_FALSE(good.ec);
    CHECK(good.response.result() == http::status::ok);
  }
  auto missing = fetch(server.port(), "/nope", "Authorization: Bearer s3cret-token\r\n");
  REQUIRE_FALSE(missing.ec);
  CHECK(missing.response.result() == http::status::not_found);

  auto health = fetch(server.port(), "/healthz");
  REQUIRE_FALSE(health.ec);
  CHECK(health.response.result() == http::status::ok);
}

TEST_CASE("hostile clients get a 4xx or a closed connection, and the server carries on", "[admin]") {
  auto options = test_options();
  options.request_timeout_ms = 300;
  options.max_connections = 4;
  TestServer server(options);

  SECTION("garbage bytes") {
    const std::vector<std::string> inputs = {
        std::string("\x00\x01\x02\xff\xfe garbage\r\n\r\n", 17),
        "GET /healthz HTTP/1.1\r\nHost: x\r\nbad header without colon\r\n\r\n",
        "GET /healthz HTTP/7.3\r\n\r\n",
        "G@T /healthz HTTP/1.1\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    };
    for (const auto& input : inputs) {
      INFO(input);
      Client client(server.port());
      REQUIRE_FALSE(client.connect_ec);
      REQUIRE_FALSE(client.send(input));
      auto reply = client.read();
      if (!reply.ec) {
        CHECK(reply.response.result() == http::status::bad_request);
        CHECK_FALSE(reply.response.keep_alive());
      }
      CHECK(is_closed(reply.ec ? reply.ec : client.wait_closed(2s)));
    }
  }

  SECTION("a 100 KB header") {
    Client client(server.port());
    REQUIRE_FALSE(client.connect_ec);
    const std::string request = "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(100 * 1024, 'a') + "\r\n\r\n";
    const auto send_ec = client.send(request);
    auto reply = send_ec ? Reply{send_ec, {}} : client.read();
    if (!reply.ec) {
      CHECK(reply.response.result() == http::status::request_header_fields_too_large);
      CHECK(is_closed(client.wait_closed(2s)));
    } else {
      CHECK(is_closed(reply.ec));
    }
  }

  SECTION("a small body on GET") {
    Client client(server.port());
    REQUIRE_FALSE(client.connect_ec);
    auto reply = client.request(get("/healthz", "Content-Length: 5\r\n") + "hello");
    REQUIRE_FALSE(reply.ec);
    CHECK(reply.response.result() == http::status::payload_too_large);
    CHECK(is_closed(client.wait_closed(2s)));
  }

  SECTION("a chunked body on GET") {
    Client client(server.port());
    REQUIRE_FALSE(client.connect_ec);
    auto reply = client.request(get("/healthz", "Transfer-Encoding: chunked\r\n") + "5\r\nhello\r\n0\r\n\r\n");
    REQUIRE_FALSE(reply.ec);
    CHECK(reply.response.result() == http::status::payload_too_large);
  }

  SECTION("a 10 MB body") {
    Client client(server.port());
    REQUIRE_FALSE(client.connect_ec);
    REQUIRE_FALSE(client.send(get("/slot", "Content-Length: 10485760\r\n")));
    // Write the body and read the answer at the same time: the server
    // answers after the header and stops reading.
    const std::string body(10 * 1024 * 1024, 'x');
    error_code write_ec;
    error_code read_ec;
    bool write_done = false;
    bool read_done = false;
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    client.stream().expires_after(10s);
    net::async_write(client.stream(), net::buffer(body), [&](const error_code& ec, std::size_t) {
      write_ec = ec;
      write_done = true;
    });
    http::async_read(client.stream(), buffer, parser, [&](const error_code& ec, std::size_t) {
      read_ec = ec;
      read_done = true;
    });
    client.run();
    REQUIRE(write_done);
    REQUIRE(read_done);
    CHECK(read_ec != beast::error::timeout);
    if (!read_ec) {
      CHECK(parser.get().result() == http::status::payload_too_large);
    } else {
      CHECK(is_closed(read_ec));
    }
    // The server closed or reset: the 10 MB did not all get in.
    CHECK(write_ec);
  }

  SECTION("a slow client is cut off at the deadline") {
    Client client(server.port());
    REQUIRE_FALSE(client.connect_ec);
    const auto started = Clock::now();
    REQUIRE_FALSE(client.send("GET /healthz HTTP/1.1\r\nHost: 127.0"));
    const auto ec = client.wait_closed(5s);
    const auto elapsed = Clock::now() - started;
    CHECK(is_closed(ec));
    CHECK(elapsed >= 250ms);
    CHECK(elapsed < 4s);
  }

  SECTION("an idle keep-alive connection is cut off at the deadline") {
    Client client(server.port());
    REQUIRE_FALSE(client.connect_ec);
    auto reply = client.request(get("/healthz"));
    REQUIRE_FALSE(reply.ec);
    CHECK(is_closed(client.wait_closed(5s)));
  }

  SECTION("at max_connections the connection idle for the longest gives way to a new one") {
    auto big = test_options();
    big.request_timeout_ms = 10000;  // idle ones would stay for 10 s
    big.header_timeout_ms = 10000;
    big.max_connections = 4;
    TestServer patient(big);

    std::vector<std::unique_ptr<Client>> idle;
    for (int i = 0; i < 4; ++i) {
      idle.push_back(std::make_unique<Client>(patient.port()));
      REQUIRE_FALSE(idle.back()->connect_ec);
      std::this_thread::sleep_for(20ms);  // accepted in this order
    }
    // A fifth is served at once, and the first (idle the longest) is closed.
    const auto started = Clock::now();
    auto reply = fetch(patient.port(), "/healthz");
    REQUIRE_FALSE(reply.ec);
    CHECK(reply.response.result() == http::status::ok);
    CHECK(Clock::now() - started < 2s);
    CHECK(is_closed(idle.front()->wait_closed(5s)));
    for (auto& client : idle) client->close();
  }

  // After each kind of abuse a fresh, ordinary request works.
  auto health = fetch(server.port(), "/healthz");
  REQUIRE_FALSE(health.ec);
  CHECK(health.response.result() == http::status::ok);
  CHECK(health.response.body() == "ok\n");
}

TEST_CASE("stop closes live connections and the listener", "[admin]") {
  TestServer server;
  Client idle(server.port());
  REQUIRE_FALSE(idle.connect_ec);
  // Make sure the server has accepted it before stopping.
  auto reply = idle.request(get("/healthz"));
  REQUIRE_FALSE(reply.ec);

  const auto port = server.port();
  server.on_loop([&] { server.admin.stop(); });
  CHECK(is_closed(idle.wait_closed(2s)));
  Client late(port);
  CHECK(late.connect_ec);
}

TEST_CASE("listen addresses", "[admin]") {
  net::io_context io;
  walrelay::Metrics metrics;
  FakeStatus status;

  SECTION("bad addresses are refused with the address in the message") {
    for (const char* listen : {"nohost", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:80a",
                               "::1:80", "[::1]80", "[::1", "example.invalid:80", ":-1"}) {
      INFO(listen);
      auto options = test_options();
      options.listen = listen;
      walrelay::AdminServer admin(io, options, status, metrics);
      try {
        admin.start();
        FAIL("start() accepted " << listen);
      } catch (const std::runtime_error& e) {
        CHECK(std::string(e.what()).find(listen) != std::string::npos);
      }
    }
  }

  SECTION("limits that would refuse every request are refused") {
    auto options = test_options();
    options.request_timeout_ms = 0;
    walrelay::AdminServer no_time(io, options, status, metrics);
    CHECK_THROWS_WITH(no_time.start(), Catch::Contains("request timeout"));
    options = test_options();
    options.max_header_bytes = 0;
    walrelay::AdminServer no_header(io, options, status, metrics);
    CHECK_THROWS_WITH(no_header.start(), Catch::Contains("header"));
  }

  SECTION("a port in use is an error naming the address") {
    walrelay::AdminServer first(io, test_options(), status, metrics);
    first.start();
    auto options = test_options();
    options.listen = "127.0.0.1:" + std::to_string(first.port());
    walrelay::AdminServer second(io, options, status, metrics);
    CHECK_THROWS_WITH(second.start(), Catch::Contains(options.listen));
  }

  SECTION("IPv6 loopback") {
    auto options = test_options();
    options.listen = "[::1]:0";
    walrelay::AdminServer admin(io, options, status, metrics);
    try {
      admin.start();
    } catch (const std::runtime_error& e) {
      WARN("IPv6 not available here: " << e.what());
      return;
    }
    CHECK(admin.port() != 0);
  }
}

TEST_CASE("400 half-open connections never keep /healthz from answering", "[admin]") {
  // A slowloris: each client sends part of a header and then nothing. With
  // the defaults (64 connections, 2 s header deadline) a liveness probe must
  // still get its answer at once.
  walrelay::AdminOptions defaults;
  defaults.listen = "127.0.0.1:0";
  TestServer server(defaults);
  std::vector<std::unique_ptr<Client>> slow;
  for (int i = 0; i < 400; ++i) {
    slow.push_back(std::make_unique<Client>(server.port()));
    if (!slow.back()->connect_ec) (void)slow.back()->send("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ");
  }
  for (int probe = 0; probe < 5; ++probe) {
    const auto started = Clock::now();
    auto reply = fetch(server.port(), "/healthz");
    const auto took = Clock::now() - started;
    INFO("probe " << probe << " took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
    REQUIRE_FALSE(reply.ec);
    CHECK(reply.response.result() == http::status::ok);
    CHECK(took < 500ms);
  }
  for (auto& c : slow) c->close();
}

namespace {

// A ReplayControl that records what it was asked and answers as told.
class FakeReplay : public walrelay::ReplayControl {
 public:
  Answer start(std::string_view body) override {
    std::lock_guard lock(mutex_);
    bodies_.emplace_back(body);
    return answer_;
  }
  std::string status_json() const override { return "{\"state\":\"none\"}\n"; }
  std::vector<std::string> bodies() const {
    std::lock_guard lock(mutex_);
    return bodies_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> bodies_;
  Answer answer_{202, "{\"state\":\"running\"}\n"};
};

std::string post(std::string_view target, std::string_view body, std::string_view extra_headers = "") {
  return "POST " + std::string(target) + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n" + std::string(extra_headers) + "\r\n" +
         std::string(body);
}

}  // namespace

TEST_CASE("POST /replay needs admin.replay.token set and presented - GET /replay shows the job", "[admin]") {
  const std::string body = R"({"since": "2026-02-01", "until": "2026-03-01"})";
  SECTION("without any token: 403 saying what to set, and nothing started") {
    TestServer server;
    FakeReplay replay;
    server.on_loop([&] { server.admin.set_replay(&replay); });
    Client client(server.port());
    REQUIRE_FALSE(client.connect_ec);
    auto reply = client.request(post("/replay", body));
    REQUIRE_FALSE(reply.ec);
    CHECK(reply.response.result() == http::status::forbidden);
    CHECK(reply.response.body().find("admin.replay.token") != std::string::npos);
    CHECK(replay.bodies().empty());
    // Reading the job's state is like /slot: allowed without a token.
    auto state = fetch(server.port(), "/replay");
    REQUIRE_FALSE(state.ec);
    CHECK(state.response.result() == http::status::ok);
    CHECK(state.response.body() == "{\"state\":\"none\"}\n");
  }
  SECTION("admin.token alone (a scraper's): POST /replay is forbidden, naming admin.replay.token") {
    auto options = test_options();
    options.token = "scraper-token";
    TestServer server(options);
    FakeReplay replay;
    server.on_loop([&] { server.admin.set_replay(&replay); });
    Client client(server.port());
    REQUIRE_FALSE(client.connect_ec);
    auto with_reader = client.request(post("/replay", body, "Authorization: Bearer scraper-token\r\n"));
    REQUIRE_FALSE(with_reader.ec);
    CHECK(with_reader.response.result() == http::status::forbidden);
    CHECK(with_reader.response.body().find("admin.replay.token") != std::string::npos);
    CHECK(replay.bodies().empty());
    auto state = fetch(server.port(), "/replay", "Authorization: Bearer scraper-token\r\n");
    REQUIRE_FALSE(state.ec);
    CHECK(state.response.result() == http::status::ok);
  }
  SECTION("both tokens: the readers' token is refused for POST /replay, the replay token reads and posts") {
    auto options = test_options();
    options.token = "scraper-token";
    options.replay_token = "s3cret-token";
    TestServer server(options);
    FakeReplay replay;
    server.on_loop([&] { server.admin.set_replay(&replay); });
    Client client(server.port());
    REQUIRE_FALSE(client.connect_ec);
    auto with_reader = client.request(post("/replay", body, "Authorization: Bearer scraper-token\r\n"));
    REQUIRE_FALSE(with_reader.ec);
    CHECK(with_reader.response.result() == http::status::unauthorized);
    CHECK(replay.bodies().empty());
    auto good = client.request(post("/replay", body, "Authorization: Bearer s3cret-token\r\n"));
    REQUIRE_FALSE(good.ec);
    CHECK(good.response.result() == http::status::accepted);
    CHECK(replay.bodies().size() == 1);
    for (const char* token : {"scraper-token", "s3cret-token"}) {
      auto state = fetch(server.port(), "/replay", std::string("Authorization: Bearer ") + token + "\r\n");
      REQUIRE_FALSE(state.ec);
      CHECK(state.response.result() == http::status::ok);
    }
    auto metrics = fetch(server.port(), "/metrics", "Authorization: Bearer nope\r\n");
    REQUIRE_FALSE(metrics.ec);
    CHECK(metrics.response.result() == http::status::unauthorized);
  }
  SECTION("with admin.replay.token: 401 without it or with a wrong one, the job's answer with it") {
    auto options = test_options();
    options.replay_token = "s3cret-token";
    TestServer server(options);
    FakeReplay replay;
    server.on_loop([&] { server.admin.set_replay(&replay); });
    Client client(server.port());
    REQUIRE_FALSE(client.connect_ec);
    auto bare = client.request(post("/replay", body));
    REQUIRE_FALSE(bare.ec);
    CHECK(bare.response.result() == http::status::unauthorized);
    auto wrong = client.request(post("/replay", body, "Authorization: Bearer nope\r\n"));
    REQUIRE_FALSE(wrong.ec);
    CHECK(wrong.response.result() == http::status::unauthorized);
    CHECK(replay.bodies().empty());
    auto good = client.request(post("/replay", body, "Authorization: Bearer s3cret-token\r\n"));
    REQUIRE_FALSE(good.ec);
    CHECK(good.response.result() == http::status::accepted);
    CHECK(header(good.response, http::field::content_type) == "application/json");
    CHECK(good.response.body() == "{\"state\":\"running\"}\n");
    REQUIRE(replay.bodies().size() == 1);
    CHECK(replay.bodies()[0] == body);
    auto put = client.request(get("/replay", "Authorization: Bearer s3cret-token\r\n", "PUT"));
    REQUIRE_FALSE(put.ec);
    CHECK(put.response.result() == http::status::method_not_allowed);
    CHECK(header(put.response, http::field::allow) == "GET, HEAD, POST");
  }
  SECTION("a body over the limit is refused before it reaches the job") {
    auto options = test_options();
    options.replay_token = "t";
    TestServer server(options);
    FakeReplay replay;
    server.on_loop([&] { server.admin.set_replay(&replay); });
    Client client(server.port());
    REQUIRE_FALSE(client.connect_ec);
    auto reply = client.request(post("/replay", std::string(64 * 1024, ' '), "Authorization: Bearer t\r\n"));
    if (!reply.ec) CHECK(reply.response.result() == http::status::payload_too_large);
    CHECK(replay.bodies().empty());
  }
  SECTION("a daemon that offers no replay: /replay is not found") {
    TestServer server;
    auto reply = fetch(server.port(), "/replay");
    REQUIRE_FALSE(reply.ec);
    CHECK(reply.response.result() == http::status::not_found);
  }
}
