// walrelay replay: the rows an outbox table keeps, sent again beside a
// running walrelay, chosen by time range, id range or condition; exactly the
// matching rows, with their original id header. Read back with kcat.
#include <map>

#include "test_util.hpp"

using namespace it;

namespace {

// The replay command's exit code and output (its log goes to stderr).
CommandResult replay(Walrelay& relay, const std::string& args, const std::string& stdin_text = "") {
  std::string cmd = std::string(WALRELAY_BINARY) + " replay --config " + relay.config_path() + " " + args;
  if (!stdin_text.empty()) cmd = "printf '" + stdin_text + "' | " + cmd;
  else cmd += " < /dev/null";
  auto r = run_command(cmd + " 2>&1");
  r.status = exit_code(r);
  return r;
}

}  // namespace

TEST_CASE("replay: a time range sends exactly the matching rows again\\, with their id headers\\, beside a running "
          "walrelay",
          "[replay]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config("table.field.event.timestamp=created_at\n"));
  relay.start();
  relay.wait_streaming();
  // Three months of events, 300 each; the relay sends each once.
  for (int month = 1; month <= 3; ++month)
    f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload, created_at) SELECT 'Rep', "
                "'k' || (g % 16), 'x', jsonb_build_object('seq', g), '2026-0" + std::to_string(month) +
                "-01'::timestamptz + g * interval '1 minute' FROM generate_series(0, 299) g");
  auto first = read_all(f, f.topic("Rep"), 60s);
  REQUIRE(ids_of(first).count.size() == 900);
  REQUIRE(ids_of(first).duplicates() == 0);

  // February, by the configured timestamp column.
  auto r = replay(relay, "--since 2026-02-01 --until 2026-03-01 --yes");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.find("300 row(s)") != std::string::npos);
  auto feb = f.db().exec("SELECT id::text FROM " + f.table + " WHERE created_at >= '2026-02-01' AND created_at < "
                         "'2026-03-01'");
  REQUIRE(feb.size() == 300);
  auto all = read_topic(f.topic("Rep"), 1200, 60s);
  auto seen = ids_of(all);
  CHECK(seen.records == 1200);
  std::size_t twice = 0;
  for (auto& row : feb) twice += seen.count[*row[0]] == 2 ? 1 : 0;
  CHECK(twice == 300);            // every February row sent again
  CHECK(seen.duplicates() == 300);  // and nothing else
  // The running walrelay carries on as before.
  CHECK(relay.running());
  f.db().exec(insert_event(f.table, "Rep", "after", "jsonb_build_object('seq', 1000)"));
  CHECK(read_topic(f.topic("Rep"), 1201, 60s).size() == 1201);
}

TEST_CASE("replay: an id range\\, a condition\\, the confirmation above a count\\, and refusals that name what is "
          "wrong",
          "[replay]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config(""));
  relay.start();
  relay.wait_streaming();
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) SELECT 'Ids', 'k' || (g % 4), "
              "CASE WHEN g % 10 = 0 THEN 'Refund' ELSE 'Order' END, jsonb_build_object('seq', g) "
              "FROM generate_series(0, 1999) g");
  REQUIRE(read_all(f, f.topic("Ids"), 60s).size() == 2000);
  const std::string lo = f.db().scalar("SELECT min(id) + 100 FROM " + f.table);
  const std::string hi = f.db().scalar("SELECT min(id) + 149 FROM " + f.table);

  auto r = replay(relay, "--from-id " + lo + " --to-id " + hi);
  INFO(r.output);
  CHECK(r.status == 0);  // 50 rows: under --confirm-above, no question
  r = replay(relay, "--where \"type = 'Refund'\" --dry-run");
  CHECK(r.status == 0);
  CHECK(r.output.find("200 row(s)") != std::string::npos);
  // 2,000 rows: above the default 1,000, and no terminal to ask: refused, nothing sent.
  r = replay(relay, "--where true");
  CHECK(r.status == 1);
  CHECK(r.output.find("--yes") != std::string::npos);
  r = replay(relay, "--where \"type = 'Refund'\" --confirm-above 10 --yes");
  CHECK(r.status == 0);

  auto recs = read_topic(f.topic("Ids"), 2250, 60s);
  auto seen = ids_of(recs);
  CHECK(seen.records == 2250);
  std::size_t wrong = 0;
  for (auto& [id, n] : seen.count) {
    const long g = std::stol(id) - std::stol(lo) + 100;  // the row's number in the insert
    const bool in_range = g >= 100 && g <= 149;
    const bool refund = g % 10 == 0;
    // Once from the relay, once more for each replay that selected it.
    if (static_cast<long>(n) != 1 + (in_range ? 1 : 0) + (refund ? 1 : 0)) ++wrong;
  }
  CHECK(seen.count.size() == 2000);
  CHECK(wrong == 0);

  // Refusals, each naming what is wrong; nothing sent.
  r = replay(relay, "");
  CHECK(r.status == 2);
  CHECK(r.output.find("--where") != std::string::npos);
  r = replay(relay, "--since 2026-01-01");
  CHECK(r.status == 2);
  CHECK(r.output.find("--time-column") != std::string::npos);
  r = replay(relay, "--where \"no_such_column > 0\"");
  CHECK(r.status == 2);
  CHECK(r.output.find("no_such_column") != std::string::npos);
  r = replay(relay, "--table public.other --where true");
  CHECK(r.status == 2);
  CHECK(r.output.find("table.include.list") != std::string::npos);
  CHECK(count_records(f.topic("Ids")) == 2250);
}
