// POST /replay's body: the members walrelay replay's options have, each
// checked for its type, and a refusal that names what is wrong.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>

#include "walrelay/commands/replay_job.hpp"

using walrelay::parse_replay_request;

namespace {

std::string refusal(const std::string& body) {
  try {
    parse_replay_request(body);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("replay request: every member of the command's options", "[replay]") {
  auto o = parse_replay_request(R"({"table": "public.outbox", "where": "type = 'Refund'", "from_id": 100,
      "to_id": "200", "since": "2026-02-01", "until": "2026-03-01", "time_column": "created_at",
      "confirm_above": 50, "yes": true, "dry_run": false})");
  CHECK(o.table == "public.outbox");
  CHECK(o.where == "type = 'Refund'");
  CHECK(o.from_id == "100");
  CHECK(o.to_id == "200");
  CHECK(o.since == "2026-02-01");
  CHECK(o.until == "2026-03-01");
  CHECK(o.time_column == "created_at");
  CHECK(o.confirm_above == 50);
  CHECK(o.yes);
  CHECK_FALSE(o.dry_run);
  CHECK_FALSE(o.may_ask);  // no terminal behind an HTTP request
  auto defaults = parse_replay_request(R"({"where": "true"})");
  CHECK(defaults.confirm_above == 1000);
  CHECK_FALSE(defaults.yes);
}

TEST_CASE("replay request: what is refused names the member", "[replay]") {
  CHECK(refusal("not json").find("not JSON") != std::string::npos);
  CHECK(refusal("[1, 2]").find("JSON object") != std::string::npos);
  CHECK(refusal(R"({"wher": "true"})").find("unknown member \"wher\"") != std::string::npos);
  CHECK(refusal(R"({"where": 1})").find("\"where\" must be a string") != std::string::npos);
  CHECK(refusal(R"({"from_id": 1.5})").find("\"from_id\" must be a string or an integer") != std::string::npos);
  CHECK(refusal(R"({"yes": "yes"})").find("\"yes\" must be true or false") != std::string::npos);
  CHECK(refusal(R"({"confirm_above": -1})").find("\"confirm_above\" must be a whole number") != std::string::npos);
  CHECK(refusal(R"({"where": "true"})").empty());
}

TEST_CASE("replay: the functions a condition calls are read from its text, quotes and comments skipped",
          "[replay]") {
  using walrelay::called_function_names;
  using V = std::vector<std::string>;
  CHECK(called_function_names("created_at > now() - interval '1 day'") == V{"now"});
  CHECK(called_function_names("true) OR pg_catalog.pg_replication_slot_advance('s', pg_current_wal_lsn()) IS NULL "
                              "OR (true") == V{"or", "pg_current_wal_lsn", "pg_replication_slot_advance"});
  CHECK(called_function_names("\"PG_SLEEP\"(1) IS NULL AND Pg_Sleep (2) IS NULL") == V{"PG_SLEEP", "pg_sleep"});
  CHECK(called_function_names("payload->>'pg_sleep(1)' = 'x' -- pg_terminate_backend(1)\n AND /* pg_sleep( */ "
                              "id IN (1, 2)") == V{"in"});
  CHECK(called_function_names("$q$ pg_sleep(1) $q$ = E'\\' pg_sleep(2)' AND schema . \"fn\" (3) > 0") == V{"fn"});
  CHECK(called_function_names("type = 'it''s pg_sleep(1)'") == V{});
  CHECK_FALSE(called_function_names("U&\"\\0070g_sleep\"(1) IS NULL"));
}
