// How walrelay reaches PostgreSQL: host names resolved off the event loop,
// host lists with hosts that cannot be reached.
#include <csignal>
#include <regex>

#include "test_util.hpp"

using namespace it;

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
