// Security: a database password never shows in walrelay's log, /metrics or
// /slot; admin.token guards /metrics; TLS to PostgreSQL with
// sslmode=verify-full against a CA made by the test; SASL/PLAIN to a Kafka
// broker of the test's own.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <random>

#include <libpq-fe.h>

#include "test_util.hpp"

using namespace it;
namespace fs = std::filesystem;

namespace {

std::string random_secret(const std::string& prefix) {
  static std::mt19937_64 rng(std::random_device{}());
  static const char* alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789";
  std::string s = prefix;
  for (int i = 0; i < 20; ++i) s += alphabet[rng() % 57];
  return s;
}

// Runs a shell command; returns its stdout, REQUIREs exit status 0.
std::string sh(const std::string& cmd) {
  auto [status, out] = run_command(cmd);
  INFO("command: " << cmd << "\noutput: " << out);
  REQUIRE(status == 0);
  return out;
}

// True if `secret` appears anywhere walrelay shows things.
void check_not_shown(Walrelay& relay, const std::string& secret, const std::string& token = {}) {
  auto log = relay.log();
  CHECK(log.find(secret) == std::string::npos);
  for (auto path : {"/metrics", "/slot", "/healthz", "/readyz"}) {
    auto resp = relay.get(path, token);
    INFO(path << " -> " << resp.status);
    CHECK(resp.status != 0);
    CHECK(resp.body.find(secret) == std::string::npos);
  }
}

// A temporary directory removed at scope end.
struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/wr-fault-sec-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// In `d`: a CA (ca.crt), a server certificate for 127.0.0.1 signed by it
// (server.crt, server.key), and an unrelated CA (other.crt).
void make_certificates(const std::string& d) {
  sh("cd " + d + " && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 "
     "-subj '/CN=walrelay fault test CA' 2>&1 && openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key "
     "-out other.crt -days 2 -subj '/CN=another CA' 2>&1 && openssl req -newkey rsa:2048 -nodes -keyout server.key "
     "-out server.csr -subj '/CN=127.0.0.1' 2>&1 && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > ext && "
     "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 "
     "-extfile ext 2>&1");
}

// tests/integration/tls/proxy.py in front of the test's PostgreSQL: TLS to
// the client with the certificate of make_certificates(d), plain TCP to the
// server, in TLS records of 16 KiB.
struct TlsProxy {
  std::string dir, port;
  explicit TlsProxy(const std::string& d) : dir(d) {
    sh("cd " + d + " && { nohup " + test_python() + " " + WALRELAY_SOURCE_DIR +
       "/tests/integration/tls/proxy.py --cert server.crt --key server.key --upstream-port " +
       Services::get().pg_port + " --port-file proxy.port > proxy.log 2>&1 & echo $! > proxy.pid; }");
    if (!eventually([&] { return fs::exists(dir + "/proxy.port"); }, 30s, 50ms)) {
      const auto log = run_command("cat " + dir + "/proxy.log").output;
      stop();
      FAIL("the TLS proxy did not start: " << log);
    }
    port = sh("cat " + dir + "/proxy.port");
  }
  void stop() { run_command("kill $(cat " + dir + "/proxy.pid) 2>/dev/null"); }
  ~TlsProxy() { stop(); }
  TlsProxy(const TlsProxy&) = delete;
  TlsProxy& operator=(const TlsProxy&) = delete;
};

// A SASL/PLAIN broker of the test's own (scripts/fault/kafka-sasl.sh) for
// the life of the object; `env` is put before the script (its settings).
struct SaslBroker {
  std::string script, dir, bootstrap;
  SaslBroker(const TempDir& tmp, const std::string& user, const std::string& password, const std::string& env = "")
      : script(Services::get().scripts + "/fault/kafka-sasl.sh"), dir((tmp.path / "kafka").string()) {
    bootstrap = sh(env + script + " start " + dir + " " + user + " " + password);
    bootstrap.erase(bootstrap.find_last_not_of("\n") + 1);
  }
  ~SaslBroker() { run_command(script + " stop " + dir + " >/dev/null 2>&1"); }
  SaslBroker(const SaslBroker&) = delete;
  SaslBroker& operator=(const SaslBroker&) = delete;
};

}  // namespace

TEST_CASE("fault: security: a scram password never appears in the log, /metrics or /slot - admin.token guards /metrics",
          "[fault][security][solo]") {
  Fixture f;
  const auto& svc = Services::get();
  const std::string role = "walrelay_pw";
  const std::string password = random_secret("Pw-");
  const std::string token = random_secret("Tok-");
  // Password authentication for this role only, above the trust lines,
  // for this test only.
  PgHbaLines scram("host replication " + role + " 127.0.0.1/32 scram-sha-256\nhost all " + role +
                   " 127.0.0.1/32 scram-sha-256\n");
  f.db().exec("DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '" + role + "') THEN CREATE ROLE " +
              role + " LOGIN REPLICATION; END IF; END$$; GRANT CREATE ON DATABASE " + svc.pg_database + " TO " + role +
              "; SET password_encryption = 'scram-sha-256'; ALTER ROLE " + role + " PASSWORD '" + password +
              "'; SELECT pg_reload_conf();");
  create_outbox(f.db(), f.table, "bigint");
  f.db().exec("ALTER TABLE " + f.table + " OWNER TO " + role);

  // The server does ask for the password: a wrong one is refused.
  std::string conninfo = "host=" + svc.pg_host + " port=" + svc.pg_port + " dbname=" + svc.pg_database + " user=" + role;
  REQUIRE(eventually(
      [&] {
        PGconn* c = PQconnectdb((conninfo + " password=wrong").c_str());
        bool refused = PQstatus(c) != CONNECTION_OK;
        PQfinish(c);
        return refused;
      },
      10s));

  Walrelay relay(with_key(f.config("database.password=" + password + "\nadmin.token=" + token + "\n"),
                          "database.user", role));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Sec", "k0", "jsonb_build_object('seq', 0)"));
  REQUIRE(read_topic(f.topic("Sec"), 1).size() == 1);
  // walrelay connected with the password (its walsender runs as the role).
  CHECK(f.db().scalar("SELECT usename FROM pg_stat_replication WHERE pid = (SELECT active_pid FROM "
                      "pg_replication_slots WHERE slot_name = '" + f.slot + "')") == role);

  CHECK(relay.get("/metrics").status == 401);
  CHECK(relay.get("/slot").status == 401);
  CHECK(relay.get("/metrics", "wrong-token").status == 401);
  CHECK(relay.get("/metrics", token).status == 200);
  CHECK(relay.get("/healthz").status == 200);
  check_not_shown(relay, password, token);
  check_not_shown(relay, token, token);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
  CHECK(relay.log().find(password) == std::string::npos);

  // The same from the environment (WALRELAY_DATABASE_PASSWORD).
  Walrelay from_env(with_key(f.config(), "database.user", role), {{"WALRELAY_DATABASE_PASSWORD", password}});
  from_env.start();
  from_env.wait_streaming();
  check_not_shown(from_env, password);
}

TEST_CASE("fault: security: TLS to PostgreSQL with sslmode=verify-full against a CA made by the test",
          "[fault][security][solo]") {
  Fixture f;
  TempDir tmp;
  const auto& svc = Services::get();
  auto d = tmp.path.string();
  make_certificates(d);
  auto data = fs::path(svc.pg_data);
  // Owned by whoever runs the server (postgres when the services run as root).
  std::string owner = "$(stat -c %U " + data.string() + ")";
  sh("install -o " + owner + " -m 600 " + d + "/server.key " + (data / "fault_server.key").string() +
     " && install -o " + owner + " -m 644 " + d + "/server.crt " + (data / "fault_server.crt").string());
  // TLS off again at the end, for the other tests.
  ServerSettings tls{{"ssl_cert_file", "fault_server.crt"}, {"ssl_key_file", "fault_server.key"}, {"ssl", "on"}};
  REQUIRE(eventually([&] { return Db().scalar("SHOW ssl") == "on"; }, 10s, 100ms));
  create_outbox(f.db(), f.table, "bigint");

  // A certificate from another CA is refused: walrelay never streams.
  {
    Walrelay wrong_ca(f.config("database.sslmode=verify-full\ndatabase.sslrootcert=" + d + "/other.crt\n"));
    wrong_ca.start();
    CHECK(eventually([&] { return wrong_ca.log().find("certificate verify failed") != std::string::npos; }, 20s));
    CHECK(wrong_ca.log().find("streaming: START_REPLICATION") == std::string::npos);
    CHECK(wrong_ca.running());  // a connection error is retried, not fatal
    wrong_ca.signal(SIGTERM);
    wrong_ca.wait_exit(30s);
  }
  Walrelay relay(f.config("database.sslmode=verify-full\ndatabase.sslrootcert=" + d + "/ca.crt\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Tls", "k0", "jsonb_build_object('seq', 0)"));
  REQUIRE(read_topic(f.topic("Tls"), 1).size() == 1);
  CHECK(f.db().scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = (SELECT active_pid FROM pg_replication_slots WHERE "
                      "slot_name = '" + f.slot + "')") == "t");
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}

// libpq reads no more of a TLS record than fits in its buffer; the rest waits
// inside OpenSSL, where a poll of the socket does not see it. PostgreSQL's
// records are small enough never to leave any, a TLS-terminating proxy's may
// not be: walrelay waited on the socket for bytes already read, at the end of
// the snapshot's COPY for ever, at the end of a burst until the walsender's
// next keepalive.
TEST_CASE("fault: security: TLS through a proxy that sends 16 KiB records - the snapshot ends and the last events "
          "of each burst arrive at once",
          "[fault][security]") {
  Fixture f;
  TempDir tmp;
  const auto d = tmp.path.string();
  make_certificates(d);
  TlsProxy proxy(d);
  create_outbox(f.db(), f.table, "bigint");
  const long rows = 20000;
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) SELECT 'Tls', 'k' || (g % 16), "
              "'x', jsonb_build_object('seq', g, 'pad', repeat('p', 50 + g % 200)) FROM generate_series(0, " +
              std::to_string(rows - 1) + ") g");
  // Through the proxy, which only speaks TLS after libpq asked for it:
  // verify-full proves the connections are TLS. Bulk reading off, and no
  // status update for a minute: nothing but the data wakes the loop.
  auto cfg = with_key(f.config("database.sslmode=verify-full\ndatabase.sslrootcert=" + d +
                               "/ca.crt\nsnapshot.mode=initial\nreplication.bulk.read=false\n"
                               "status.update.interval.ms=60000\n"),
                      "database.port", proxy.port);
  cfg = with_key(with_key(cfg, "database.hostname", "127.0.0.1"), "log.level", "debug");
  Walrelay relay(cfg);
  relay.start();
  auto relayed = [&] { return relay.metric("walrelay_events_relayed_total").value_or(0); };
  // Without the fix the snapshot never ends (the COPY's end stays in OpenSSL).
  REQUIRE(eventually(
      [&] { return relay.this_run_log().find("streaming:") != std::string::npos || !relay.running(); }, 60s,
      50ms));
  REQUIRE(relay.running());
  CHECK(relay.this_run_log().find("initial snapshot done") != std::string::npos);
  long want = rows;
  for (int burst = 0; burst < 3; ++burst) {
    // One transaction of events a few KiB each, then a lone event: every one
    // arrives long before the walsender's keepalive (wal_sender_timeout / 2).
    const long events = 300;
    f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) SELECT 'Tls', 'k' || "
                "(g % 16), 'x', jsonb_build_object('seq', g, 'pad', repeat('q', 1000 + (g * 37) % 3000)) FROM "
                "generate_series(" + std::to_string(want) + ", " + std::to_string(want + events - 1) + ") g");
    want += events;
    CHECK(eventually([&] { return relayed() >= static_cast<double>(want); }, 10s, 10ms));
    f.db().exec(insert_event(f.table, "Tls", "lone", "jsonb_build_object('seq', " + std::to_string(want) + ")"));
    ++want;
    CHECK(eventually([&] { return relayed() >= static_cast<double>(want); }, 10s, 10ms));
  }
  // The premise: OpenSSL did hold bytes that libpq had not read.
  CHECK(relay.log().find("wait inside OpenSSL") != std::string::npos);
  relay.signal(SIGTERM);
  REQUIRE(relay.wait_exit(30s) == 0);
  auto recs = read_topic(f.topic("Tls"), static_cast<std::size_t>(want), 60s);
  CHECK(ids_of(recs).count.size() == static_cast<std::size_t>(want));
}

TEST_CASE("fault: security: SASL/PLAIN to Kafka - the SASL password is never shown - a wrong one is not ready",
          "[fault][security][sasl]") {
  Fixture f;
  TempDir tmp;
  const std::string user = "walrelay";
  const std::string password = random_secret("Sasl-");
  SaslBroker broker(tmp, user, password);
  const std::string& bootstrap = broker.bootstrap;
  create_outbox(f.db(), f.table, "bigint");
  auto sasl = [&](const std::string& pw) {
    return "kafka.security.protocol=SASL_PLAINTEXT\nkafka.sasl.mechanism=PLAIN\nkafka.sasl.username=" + user +
           "\nkafka.sasl.password=" + pw + "\n";
  };

  Walrelay relay(with_key(f.config(sasl(password)), "kafka.bootstrap.servers", bootstrap));
  relay.start();
  relay.wait_streaming();
  for (int i = 0; i < 10; ++i)
    f.db().exec(insert_event(f.table, "Sasl", "k0", "jsonb_build_object('seq', " + std::to_string(i) + ")"));
  std::string read = "kcat -b " + bootstrap + " -X security.protocol=SASL_PLAINTEXT -X sasl.mechanism=PLAIN -X "
                     "sasl.username=" + user + " -X sasl.password=" + password + " -C -t '" + f.topic("Sasl") +
                     "' -o beginning -e -q -f '%s\\n' 2>/dev/null || true";
  std::string values;
  CHECK(eventually([&] { return count_of(values = sh(read), "\"seq\"") >= 10; }, 60s, 500ms));
  INFO("values: " << values);
  CHECK(eventually([&] { return relay.get("/readyz").status == 200; }, 30s));
  check_not_shown(relay, password);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
  CHECK(relay.log().find(password) == std::string::npos);

  // A wrong password: the broker refuses it; walrelay says so and is not ready.
  Walrelay wrong(with_key(f.config(sasl("not-" + password)), "kafka.bootstrap.servers", bootstrap));
  wrong.start();
  wrong.wait_streaming();
  f.db().exec(insert_event(f.table, "Sasl", "k0", "jsonb_build_object('seq', 10)"));
  CHECK(eventually([&] { return wrong.log().find("uthentication") != std::string::npos; }, 30s, 200ms));
  // Readiness follows librdkafka's statistics (every second): not ready once they show no broker up.
  CHECK(eventually([&] { return wrong.get("/readyz").status == 503; }, 15s, 200ms));
  check_not_shown(wrong, password);
  wrong.signal(SIGTERM);
  CHECK(wrong.wait_exit() == 0);
  // With the right password the row arrives, once: it was neither lost nor
  // written while the broker refused walrelay (it would be there twice).
  relay.start();
  relay.wait_streaming();
  auto end = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, 30s));
  CHECK(count_of(sh(read), "\"seq\"") == 11);
}

TEST_CASE("fault: security: Kafka ACLs - walrelay runs with exactly the documented permissions, at least once and "
          "exactly once, and a missing one is a clear error naming it",
          "[fault][security][sasl]") {
  Fixture f;
  TempDir tmp;
  const auto& svc = Services::get();
  const std::string password = random_secret("Acl-");
  const std::string admin_password = random_secret("Admin-");
  SaslBroker broker(tmp, "walrelay", password,
                    "KAFKA_SASL_AUTHORIZER=1 KAFKA_SASL_ADMIN_PASSWORD=" + admin_password + " ");
  const std::string& bootstrap = broker.bootstrap;
  create_outbox(f.db(), f.table, "bigint");
  const std::string sasl = "kafka.security.protocol=SASL_PLAINTEXT\nkafka.sasl.mechanism=PLAIN\n"
                           "kafka.sasl.username=walrelay\nkafka.sasl.password=" + password + "\n";
  const std::string config = with_key(f.config(sasl), "kafka.bootstrap.servers", bootstrap);
  const std::string offsets = f.slot + ".offsets";
  const std::string transactional_id = "walrelay-" + svc.pg_database + "-" + f.slot;
  // docs/operations.md, "Kafka permissions", given with Kafka's AclCommand.
  auto acl = [&](const std::string& args) {
    sh(broker.script + " acl " + bootstrap + " " + admin_password + " " + args + " --allow-principal User:walrelay");
  };
  // The outbox topics, by the route's prefix: WRITE and, where the broker
  // creates them, CREATE.
  const std::string outbox_topics = "--topic " + f.topic_prefix + " --resource-pattern-type prefixed";
  auto read = [&](const std::string& topic) {
    return "kcat -b " + bootstrap + " -X security.protocol=SASL_PLAINTEXT -X sasl.mechanism=PLAIN -X "
           "sasl.username=admin -X sasl.password=" + admin_password + " -C -t '" + topic +
           "' -o beginning -e -q -f '%s\\n' 2>/dev/null || true";
  };
  auto write = [&](const std::string& type, int n) {
    for (int i = 0; i < n; ++i)
      f.db().exec(insert_event(f.table, type, "k0", "jsonb_build_object('seq', " + std::to_string(i) + ")"));
  };
  acl("--add --operation Write --operation Create " + outbox_topics);

  SECTION("at least once") {
    Walrelay relay(config);
    relay.start();
    relay.wait_streaming();
    write("Acl", 5);
    CHECK(eventually([&] { return count_of(sh(read(f.topic("Acl"))), "\"seq\"") == 5; }, 60s, 500ms));
    // Without WRITE on the topics: a halt that names the topic and the right.
    acl("--remove --force --operation Write " + outbox_topics);
    write("Acl", 1);
    CHECK(relay.wait_exit(120s) == 3);
    auto log = relay.log();
    INFO(log.substr(log.size() > 3000 ? log.size() - 3000 : 0));
    CHECK(log.find("needs WRITE on topic " + f.topic("Acl")) != std::string::npos);
    CHECK(log.find("never a reason to dead-letter") != std::string::npos);
  }
  SECTION("exactly once") {
    // Exactly once adds the transactional.id, and the offsets topic: WRITE,
    // READ, and CREATE unless it is made beforehand.
    acl("--add --operation Write --transactional-id " + transactional_id);
    acl("--add --operation Write --operation Read --operation Create --topic " + offsets);
    // The offsets reader's group: librdkafka looks its coordinator up.
    acl("--add --operation Read --group walrelay-offsets-reader");
    const std::string eos = config + "exactly.once.support=required\noffsets.storage.topic=" + offsets + "\n";
    Walrelay relay(eos);
    relay.start();
    relay.wait_streaming();
    write("AclEos", 5);
    CHECK(eventually([&] { return count_of(sh(read(f.topic("AclEos"))), "\"seq\"") == 5; }, 60s, 500ms));
    relay.signal(SIGTERM);
    CHECK(relay.wait_exit(60s) == 0);
    // Without the transactional.id: each start says which right is missing.
    acl("--remove --force --operation Write --transactional-id " + transactional_id);
    relay.start();
    CHECK(eventually([&] { return relay.log().find("needs WRITE on transactional.id " + transactional_id) !=
                                  std::string::npos; }, 60s, 200ms));
    relay.signal(SIGTERM);
    relay.wait_exit(60s);
  }
}
