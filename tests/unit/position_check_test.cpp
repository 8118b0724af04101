// Exactly once: a committed position from another history is refused
// (committed_position_problem), whatever keeps the system identifier.
#include <catch2/catch.hpp>

#include "walrelay/source/catalog.hpp"

using namespace walrelay;
using pgoutput::Lsn;

namespace {

CommittedPosition at(const char* lsn, const char* timeline) {
  return CommittedPosition{*Lsn::parse(lsn), "7000000000000000001", timeline};
}

Config eos() {
  Config c;
  c.slot_name = "walrelay";
  c.database_dbname = "app";
  return c;
}

// Timeline 3's history: 1 ended at 0/3000000, 2 at 0/5000000.
const std::string history = "1\t0/3000000\tno recovery target specified\n\n2\t0/5000000\tbefore 2026-12-01\n";

}  // namespace

TEST_CASE("position check: a position this server's history holds is trusted", "[unit]") {
  auto c = eos();
  CHECK_FALSE(committed_position_problem(c, at("0/2000000", "1"), Lsn::parse("0/6000000"), "3", history));
  CHECK_FALSE(committed_position_problem(c, at("0/3000000", "1"), Lsn::parse("0/6000000"), "3", history));
  CHECK_FALSE(committed_position_problem(c, at("0/4000000", "2"), Lsn::parse("0/6000000"), "3", history));
  CHECK_FALSE(committed_position_problem(c, at("0/5800000", "3"), Lsn::parse("0/6000000"), "3", history));
  // Written by a walrelay before the timeline was recorded.
  CHECK_FALSE(committed_position_problem(c, at("0/5800000", ""), Lsn::parse("0/6000000"), "3", history));
}

TEST_CASE("position check: past the WAL's end, past a switch point, or from an unknown timeline is refused",
          "[unit]") {
  auto c = eos();
  auto past_end = committed_position_problem(c, at("0/7000000", "3"), Lsn::parse("0/6000000"), "3", history);
  REQUIRE(past_end);
  CHECK_THAT(*past_end, Catch::Contains("lies past the end of this server's WAL (0/6000000 on timeline 3)"));
  CHECK_THAT(*past_end, Catch::Contains("walrelay --reset-offsets"));
  // A failover or a restore left timeline 1 at 0/3000000; the old primary
  // had gone on to 0/3500000, which this history never had.
  auto branch = committed_position_problem(c, at("0/3500000", "1"), Lsn::parse("0/6000000"), "3", history);
  REQUIRE(branch);
  CHECK_THAT(*branch, Catch::Contains("lies past 0/3000000, where this server's history left timeline 1"));
  auto ahead = committed_position_problem(c, at("0/100", "4"), Lsn::parse("0/6000000"), "3", history);
  REQUIRE(ahead);
  CHECK_THAT(*ahead, Catch::Contains("has not reached"));
  auto unlisted = committed_position_problem(c, at("0/100", "1"), Lsn::parse("0/6000000"), "2", "");
  REQUIRE(unlisted);
  CHECK_THAT(*unlisted, Catch::Contains("does not list"));
}
