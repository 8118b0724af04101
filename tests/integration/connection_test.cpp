// How walrelay reaches PostgreSQL: host names resolved off the event loop,
// host lists with hosts that cannot be reached.
#include <csignal>

#include "fault_util.hpp"

using namespace fault;

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
