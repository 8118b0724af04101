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

// POST /replay with curl: the status code, then the body.
HttpResponse post_replay(Walrelay& relay, const std::string& json, const std::string& token) {
  std::string quoted;  // for the shell's single quotes: ' as '\''
  for (char c : json) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  auto r = run_command("curl -s -o /dev/stdout -w '\\n%{http_code}' -X POST -H 'Content-Type: application/json' " +
                       (token.empty() ? std::string() : "-H 'Authorization: Bearer " + token + "' ") + "--data '" +
                       quoted + "' http://127.0.0.1:" + std::to_string(relay.admin_port()) + "/replay");
  HttpResponse resp;
  const auto nl = r.output.rfind('\n');
  if (nl == std::string::npos) return resp;
  resp.status = std::atoi(r.output.c_str() + nl + 1);
  resp.body = r.output.substr(0, nl);
  return resp;
}

// GET /replay until the job is no longer running; its last document.
std::string replay_finished(Walrelay& relay, const std::string& token) {
  std::string body;
  REQUIRE(eventually([&] {
    body = relay.get("/replay", token).body;
    return body.find("\"state\":\"running\"") == std::string::npos;
  }, 120s, 100ms));
  return body;
}

}  // namespace

TEST_CASE("replay: a time range sends exactly the matching rows again, with their id headers, beside a running "
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

TEST_CASE("replay: an id range, a condition, the confirmation above a count, and refusals that name what is "
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
  // On a terminal (script(1) gives it one) it asks: anything but "yes" sends
  // nothing, "yes" sends them.
  auto on_terminal = [&](const std::string& answer) {
    auto t = run_command("printf '" + answer + "\\n' | script -qec \"" + std::string(WALRELAY_BINARY) +
                         " replay --config " + relay.config_path() + " --from-id " + lo + " --to-id " + hi +
                         " --confirm-above 10\" /dev/null 2>&1");
    t.status = exit_code(t);
    return t;
  };
  r = on_terminal("no");
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK(r.output.find("Type yes to go on") != std::string::npos);
  CHECK(r.output.find("not confirmed") != std::string::npos);
  r = on_terminal("yes");
  INFO(r.output);
  CHECK(r.status == 0);

  auto recs = read_topic(f.topic("Ids"), 2300, 60s);
  auto seen = ids_of(recs);
  CHECK(seen.records == 2300);
  std::size_t wrong = 0;
  for (auto& [id, n] : seen.count) {
    const long g = std::stol(id) - std::stol(lo) + 100;  // the row's number in the insert
    const bool in_range = g >= 100 && g <= 149;
    const bool refund = g % 10 == 0;
    // Once from the relay, once more for each replay that selected it (the
    // id range twice: with --from-id, and confirmed on the terminal).
    if (static_cast<long>(n) != 1 + (in_range ? 2 : 0) + (refund ? 1 : 0)) ++wrong;
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
  CHECK(count_records(f.topic("Ids")) == 2300);
}

TEST_CASE("replay: POST /replay with admin.replay.token sends a time range again, one job at a time, and is refused "
          "without the token, above the count without yes, or with a bad body",
          "[replay]") {
  const std::string token = "replay-t0ken";
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config("table.field.event.timestamp=created_at\nadmin.replay.token=" + token + "\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload, created_at) SELECT 'Post', "
              "'k' || (g % 16), 'x', jsonb_build_object('seq', g), '2026-01-01'::timestamptz + g * interval '1 "
              "minute' FROM generate_series(0, 29999) g");
  REQUIRE(read_all(f, f.topic("Post"), 60s).size() == 30000);
  CHECK(relay.get("/replay", token).body == "{\"state\":\"none\"}\n");

  // Refusals: no token, a bad body, a selection without a time column.
  auto r = post_replay(relay, R"({"since": "2026-01-01"})", "");
  CHECK(r.status == 401);
  r = post_replay(relay, R"({"since": "2026-01-01", "limit": 5})", token);
  CHECK(r.status == 400);
  CHECK(r.body.find(R"(unknown member \"limit\")") != std::string::npos);  // quoted inside the JSON string
  r = post_replay(relay, R"({"table": "public.other", "where": "true"})", token);
  CHECK(r.status == 400);
  CHECK(r.body.find("table.include.list") != std::string::npos);

  // Above confirm_above without yes: the job counts, refuses and sends nothing.
  r = post_replay(relay, R"({"where": "true"})", token);
  CHECK(r.status == 202);
  auto done = replay_finished(relay, token);
  INFO(done);
  CHECK(done.find("\"state\":\"refused\"") != std::string::npos);
  CHECK(done.find("\"rows_matched\":30000") != std::string::npos);
  CHECK(done.find("confirm with yes") != std::string::npos);

  // 20,000 rows (the first 20,000 minutes), confirmed; a second POST while it runs is a 409.
  r = post_replay(relay, R"({"since": "2026-01-01", "until": "2026-01-14 21:20", "yes": true})", token);
  CHECK(r.status == 202);
  auto second = post_replay(relay, R"({"where": "true", "yes": true})", token);
  CHECK(second.status == 409);
  done = replay_finished(relay, token);
  CHECK(done.find("\"state\":\"done\"") != std::string::npos);
  CHECK(done.find("\"rows_matched\":20000") != std::string::npos);
  CHECK(done.find("\"rows_acknowledged\":20000") != std::string::npos);
  CHECK(done.find("\"exit_code\":0") != std::string::npos);
  CHECK(relay.metric("walrelay_replay_job_rows_total", token) == 20000);
  CHECK(relay.metric("walrelay_replay_job_running", token) == 0);

  // What arrived, read with kcat: each of those 20,000 once more, nothing else.
  auto seen = ids_of(read_topic(f.topic("Post"), 50000, 60s));
  CHECK(seen.records == 50000);
  CHECK(seen.count.size() == 30000);
  auto first = f.db().exec("SELECT id::text FROM " + f.table + " WHERE created_at < '2026-01-14 21:20'");
  REQUIRE(first.size() == 20000);
  std::size_t twice = 0;
  for (auto& row : first) twice += seen.count[*row[0]] == 2 ? 1 : 0;
  CHECK(twice == 20000);
  CHECK(seen.duplicates() == 20000);
  CHECK(relay.running());
  CHECK(relay.get("/readyz", token).status == 200);
}

TEST_CASE("replay: without admin.replay.token POST /replay is forbidden and says what to set", "[replay]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config(""));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "NoTok", "k", "jsonb_build_object('seq', 1)"));
  REQUIRE(read_all(f, f.topic("NoTok"), 60s).size() == 1);
  auto r = post_replay(relay, R"({"where": "true", "yes": true})", "");
  CHECK(r.status == 403);
  CHECK(r.body.find("admin.replay.token") != std::string::npos);
  CHECK(relay.get("/replay").body == "{\"state\":\"none\"}\n");
  CHECK(count_records(f.topic("NoTok")) == 1);
}

TEST_CASE("replay: POST /replay's where cannot leave its read-only transaction - a second statement is refused and "
          "nothing is deleted",
          "[replay]") {
  const std::string reader = "scraper-t0ken", operator_token = "operator-t0ken";
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config("admin.token=" + reader + "\nadmin.replay.token=" + operator_token + "\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) SELECT 'Inj', 'k', 'x', "
              "jsonb_build_object('seq', g) FROM generate_series(0, 9) g");
  REQUIRE(read_all(f, f.topic("Inj"), 60s).size() == 10);
  REQUIRE(f.db().scalar("SELECT count(*) FROM " + f.table) == "10");

  // The condition closes its parenthesis, commits the READ ONLY transaction
  // and deletes as walrelay's role (the simple protocol ran all four).
  const std::string injection = "true); COMMIT; DELETE FROM " + f.table + "; SELECT (1";
  auto r = post_replay(relay, R"({"where": ")" + injection + R"(", "dry_run": true})", operator_token);
  INFO(r.body);
  if (r.status == 202) {
    auto done = replay_finished(relay, operator_token);
    INFO(done);
    CHECK(done.find("\"state\":\"refused\"") != std::string::npos);
    CHECK(done.find("\"rows_matched\":null") != std::string::npos);
    CHECK(done.find("one statement") != std::string::npos);
  } else {
    CHECK(r.status == 400);
    CHECK(r.body.find("one statement") != std::string::npos);
  }
  CHECK(f.db().scalar("SELECT count(*) FROM " + f.table) == "10");

  // Within one statement, a volatile function is refused before it runs:
  // a write (nextval), and what read only does not stop, run as walrelay's
  // role with REPLICATION: ending walrelay's walsender, moving its slot.
  f.db().exec("CREATE SEQUENCE IF NOT EXISTS walrelay_replay_probe");
  r = post_replay(relay, R"({"where": "nextval('walrelay_replay_probe') > 0", "dry_run": true})", operator_token);
  REQUIRE(r.status == 202);
  auto done = replay_finished(relay, operator_token);
  INFO(done);
  CHECK(done.find("\"state\":\"refused\"") != std::string::npos);
  CHECK(done.find("volatile function(s) nextval") != std::string::npos);
  CHECK(f.db().scalar("SELECT last_value FROM walrelay_replay_probe") == "1");
  CHECK(f.db().scalar("SELECT is_called::text FROM walrelay_replay_probe") == "false");
  f.db().exec("DROP SEQUENCE walrelay_replay_probe");
  const auto starts = count_of(relay.log(), "streaming: START_REPLICATION");
  const auto confirmed = f.db().confirmed_flush(f.slot);
  r = post_replay(relay,
                  R"x({"where": "false) OR (pg_catalog.pg_terminate_backend((SELECT active_pid FROM )x"
                  R"x(pg_replication_slots WHERE slot_name = ')x" + f.slot + R"x('))", "dry_run": true})x",
                  operator_token);
  REQUIRE(r.status == 202);
  done = replay_finished(relay, operator_token);
  INFO(done);
  CHECK(done.find("\"state\":\"refused\"") != std::string::npos);
  CHECK(done.find("volatile function(s) pg_terminate_backend") != std::string::npos);
  CHECK(count_of(relay.log(), "streaming: START_REPLICATION") == starts);
  CHECK(f.db().confirmed_flush(f.slot) >= confirmed);

  // A sound condition after both: counted as before.
  r = post_replay(relay, R"({"where": "payload->>'seq' = '3'", "dry_run": true})", operator_token);
  REQUIRE(r.status == 202);
  done = replay_finished(relay, operator_token);
  CHECK(done.find("\"rows_matched\":1") != std::string::npos);
  CHECK(relay.running());
}

TEST_CASE("replay: the token of the read endpoints cannot start a replay - admin.replay.token can", "[replay]") {
  const std::string reader = "scraper-t0ken", operator_token = "operator-t0ken";
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  {
    // admin.token alone: the reads work with it, POST /replay is forbidden
    // and names the key to set.
    Walrelay relay(f.config("admin.token=" + reader + "\n"));
    relay.start();
    relay.wait_streaming();
    CHECK(relay.get("/replay", reader).status == 200);
    auto r = post_replay(relay, R"({"where": "true", "dry_run": true})", reader);
    CHECK(r.status == 403);
    CHECK(r.body.find("admin.replay.token") != std::string::npos);
    CHECK(relay.get("/replay", reader).body == "{\"state\":\"none\"}\n");
  }
  Walrelay relay(f.config("admin.token=" + reader + "\nadmin.replay.token=" + operator_token + "\n"));
  relay.start();
  relay.wait_streaming();
  // Both tokens set: the scraper's is refused for POST, the replay token starts it.
  auto r = post_replay(relay, R"({"where": "true", "dry_run": true})", reader);
  CHECK(r.status == 401);
  r = post_replay(relay, R"({"where": "true", "dry_run": true})", "");
  CHECK(r.status == 401);
  CHECK(relay.get("/replay", reader).body == "{\"state\":\"none\"}\n");
  CHECK(relay.metric("walrelay_replay_job_rows_total", reader) == 0);
  r = post_replay(relay, R"({"where": "true", "dry_run": true})", operator_token);
  CHECK(r.status == 202);
  auto done = replay_finished(relay, reader);  // the job is read with the read token
  CHECK(done.find("\"state\":\"done\"") != std::string::npos);
}

TEST_CASE("replay: GET /replay's message names a failing condition's SQLSTATE without the data it read",
          "[replay]") {
  const std::string operator_token = "operator-t0ken";
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(f.config("admin.replay.token=" + operator_token + "\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Err", "k", "jsonb_build_object('secret', 'hunter2-in-a-row')"));
  REQUIRE(read_all(f, f.topic("Err"), 60s).size() == 1);
  // A cast of a value the role reads: the server's message quotes the value.
  auto r = post_replay(relay, R"({"where": "(payload->>'secret')::int > 0", "dry_run": true})", operator_token);
  REQUIRE(r.status == 202);
  auto done = replay_finished(relay, operator_token);
  INFO(done);
  CHECK(done.find("\"state\":\"refused\"") != std::string::npos);
  CHECK(done.find("22P02") != std::string::npos);
  CHECK(done.find("hunter2") == std::string::npos);
  // A mistake in the condition's own text is named as the server names it.
  r = post_replay(relay, R"({"where": "no_such_column = 1", "dry_run": true})", operator_token);
  REQUIRE(r.status == 202);
  done = replay_finished(relay, operator_token);
  CHECK(done.find("42703") != std::string::npos);
  CHECK(done.find("no_such_column") != std::string::npos);
  // And the relay's log does not carry the value either.
  CHECK(relay.log().find("hunter2") == std::string::npos);
}
