// How walrelay reaches PostgreSQL: host names resolved off the event loop,
// host lists with hosts that cannot be reached.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <regex>
#include <thread>

#include "test_util.hpp"

using namespace it;

namespace {

// A port on loopback that accepts each connection and closes it at once, as
// a port taken by another service, or a proxy whose server is down, does.
class ClosingPort {
 public:
  ClosingPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0);
    REQUIRE(::listen(fd_, 16) == 0);
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) continue;
        ++accepted_;
        ::close(c);
      }
    });
  }
  ~ClosingPort() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  int accepted() const { return accepted_; }

 private:
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE("relay: database.hostname as names - an unresolvable one is skipped, localhost found by its addresses",
          "[relay][connect]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(with_key(f.config(), "database.hostname", "walrelay-no-such-host.invalid,localhost"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Name", "k", "'{}'"));
  REQUIRE(read_topic(f.topic("Name"), 1).size() == 1);
  // Liveness is served by the loop that resolved the names.
  CHECK(relay.get("/healthz").status == 200);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}

TEST_CASE("relay: the database unreachable - reconnects with growing, capped, jittered delays, and SIGTERM still stops it",
          "[relay][connect]") {
  Fixture f;
  // Nothing listens on port 1: each attempt is refused at once.
  Walrelay relay(with_key(with_key(f.config(), "database.port", "1"), "reconnect.backoff.ms", "100") +
                 "reconnect.backoff.max.ms=800\n");
  relay.start();
  std::regex line(R"(reconnecting in (\d+) ms)");
  std::vector<long> delays;
  REQUIRE(eventually(
      [&] {
        auto log = relay.log();
        delays.clear();
        for (std::sregex_iterator i(log.begin(), log.end(), line), e; i != e; ++i) delays.push_back(std::stol((*i)[1]));
        return delays.size() >= 6;
      },
      30s, 100ms));
  long base = 100;
  for (std::size_t i = 0; i < delays.size(); ++i) {
    INFO("attempt " << i << " waited " << delays[i] << " ms, base " << base);
    CHECK(delays[i] >= base);
    CHECK(delays[i] <= base + base / 4);
    base = std::min(base * 2, 800L);
  }
  auto ready = relay.get("/readyz");
  CHECK(ready.status == 503);
  CHECK(ready.body.rfind("reconnecting: ", 0) == 0);
  CHECK(relay.get("/healthz").status == 200);  // alive: the loop turns between attempts
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit(10s) == 0);
}

TEST_CASE("relay: database.hostname with a first host that accepts the connection and closes it - the next host is "
          "tried (libpq stops at such a host) - the relay streams, walrelay replay and --check connect",
          "[relay][connect]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  ClosingPort closing;
  const auto& s = Services::get();
  const std::string config = with_key(with_key(f.config(), "database.hostname", s.pg_host + "," + s.pg_host),
                                       "database.port", std::to_string(closing.port()) + "," + s.pg_port);
  Walrelay relay(config);
  relay.start();
  relay.wait_streaming();
  CHECK(closing.accepted() >= 2);  // the catalog's connection and the replication one at least
  f.db().exec(insert_event(f.table, "Closing", "k", "jsonb_build_object('seq', 1)"));
  REQUIRE(read_topic(f.topic("Closing"), 1).size() == 1);
  const int before = closing.accepted();
  auto replay = run_command(std::string(WALRELAY_BINARY) + " replay --config " + relay.config_path() +
                            " --time-column created_at --since 2000-01-01 --yes < /dev/null 2>&1");
  replay.status = exit_code(replay);
  INFO(replay.output);
  CHECK(replay.status == 0);
  CHECK(closing.accepted() > before);
  REQUIRE(eventually([&] { return count_records(f.topic("Closing")) == 2; }, 30s, 100ms));
  auto check = walrelay_check(relay.config_path());
  INFO(check.output);
  CHECK(check.status == 0);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}
