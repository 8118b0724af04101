#include "harness.hpp"

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <librdkafka/rdkafka.h>
#include <simdjson.h>

#define CATCH_CONFIG_EXTERNAL_INTERFACES  // the listener interface
#include <catch2/catch.hpp>

#include <array>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>
#include <set>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace it {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

KcatRun kcat(const std::string& args, int timeout_s) {
  char err_path[] = "/tmp/walrelay-kcat-XXXXXX";
  int fd = mkstemp(err_path);
  if (fd < 0) throw std::runtime_error("kcat: no temporary file for its stderr");
  ::close(fd);
  auto r = run_command("timeout " + std::to_string(timeout_s) + " kcat -b " + Services::get().kafka + " " + args +
                       " 2>" + err_path);
  KcatRun k;
  k.code = WIFEXITED(r.status) ? WEXITSTATUS(r.status) : -1;
  k.out = std::move(r.output);
  k.err = read_file(err_path);
  k.args = args;
  ::unlink(err_path);
  return k;
}

namespace {

// The walrelays alive now, whose logs a failed assertion shows: a CI run
// keeps no temporary files, so the log is the only account of what walrelay did.
std::mutex live_mu;
std::set<const Walrelay*> live_relays;

// The directories (configuration and whole log) of the walrelays the
// running test case made: removed when it ends with no failed assertion,
// kept when it fails, the killed and replaced ones too (a main-suite run left
// some 900 of them in /tmp).
std::vector<std::string> case_dirs;

struct FailureLogs : Catch::TestEventListenerBase {
  explicit FailureLogs(Catch::ReporterConfig const& config) : TestEventListenerBase(config) {
    // backtrace() loads libgcc's unwinder at its first call, which
    // allocates: done here, not first in a signal handler.
    void* frame;
    (void)::backtrace(&frame, 1);
  }
  bool shown = false;
  void testCaseStarting(Catch::TestCaseInfo const& info) override {
    shown = false;
    TestEventListenerBase::testCaseStarting(info);
  }
  void testCaseEnded(Catch::TestCaseStats const& stats) override {
    std::vector<std::string> dirs;
    {
      std::lock_guard lock(live_mu);
      dirs.swap(case_dirs);
    }
    if (stats.totals.assertions.failed == 0)
      for (auto& dir : dirs) {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
      }
    TestEventListenerBase::testCaseEnded(stats);
  }
  bool assertionEnded(Catch::AssertionStats const& stats) override {
    if (stats.assertionResult.getResultType() == Catch::ResultWas::FatalErrorCondition) {
      // A signal in the test process (SIGSEGV ...), reported from Catch's
      // handler before it raises the signal again: the stack is the one
      // account of where it came from, and the heap may be broken, so
      // nothing here allocates and the walrelays' logs are not read.
      static const char head[] = "---- the test process's stack at the fatal signal ----\n";
      (void)!::write(2, head, sizeof head - 1);
      void* frames[64];
      ::backtrace_symbols_fd(frames, ::backtrace(frames, 64), 2);
      return true;
    }
    if (stats.assertionResult.succeeded() || shown) return true;
    shown = true;
    std::lock_guard lock(live_mu);
    for (auto* relay : live_relays) {
      std::string log = relay->this_run_log();
      std::size_t from = log.size(), lines = 0;
      while (from > 0 && lines < 60) if (log[--from] == '\n') ++lines;
      std::fprintf(stderr, "---- the last lines of walrelay's log (%s) ----\n%s\n----\n", relay->config_path().c_str(),
                   log.substr(from).c_str());
    }
    return true;
  }
};
CATCH_REGISTER_LISTENER(FailureLogs)

}  // namespace

CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("could not run " + cmd);
  std::array<char, 65536> buf;
  std::size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  r.status = pclose(p);
  return r;
}

const Services& Services::get() {
  static Services s = [] {
    Services out;
    auto [status, env] = run_command(std::string(WALRELAY_SERVICES) + " env");
    if (status != 0) throw std::runtime_error("services are not running: run scripts/services.sh start");
    std::regex line(R"(export (\w+)='?([^'\n]*)'?)");
    std::map<std::string, std::string> vars;
    for (std::sregex_iterator i(env.begin(), env.end(), line), e; i != e; ++i) vars[(*i)[1]] = (*i)[2];
    out.pg_host = vars["WALRELAY_TEST_PGHOST"];
    out.pg_port = vars["WALRELAY_TEST_PGPORT"];
    out.pg_user = vars["WALRELAY_TEST_PGUSER"];
    out.pg_database = vars["WALRELAY_TEST_PGDATABASE"];
    out.pg_data = vars["WALRELAY_TEST_PGDATA"];
    out.kafka = vars["WALRELAY_TEST_KAFKA"];
    out.scripts = vars["WALRELAY_TEST_SCRIPTS"];
    if (out.pg_port.empty() || out.kafka.empty()) throw std::runtime_error("services env incomplete:\n" + env);
    return out;
  }();
  return s;
}

std::string Services::current(const std::string& name) {
  auto [status, env] = run_command(std::string(WALRELAY_SERVICES) + " env");
  std::regex line("export " + name + "='?([^'\\n]*)'?");
  std::smatch m;
  return status == 0 && std::regex_search(env, m, line) ? std::string(m[1]) : std::string();
}

int Services::pg_major() {
  static int major = [] {
    Db db;
    return std::stoi(db.scalar("SHOW server_version_num")) / 10000;
  }();
  return major;
}

void Services::control(const std::string& args) {
  // `start` without PG_MAJOR would bring back Debian's 15: keep the major
  // the services run.
  std::string major = std::getenv("PG_MAJOR") ? std::string() : current("WALRELAY_TEST_PGMAJOR");
  auto [status, out] = run_command((major.empty() ? std::string() : "PG_MAJOR=" + major + " ") +
                                   std::string(WALRELAY_SERVICES) + " " + args + " 2>&1");
  if (status != 0) throw std::runtime_error("services.sh " + args + " failed:\n" + out);
}

std::string unique_name(const std::string& prefix) {
  static std::mt19937_64 rng(std::random_device{}());
  static const char* alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::string s = prefix + "_";
  for (int i = 0; i < 8; ++i) s += alphabet[rng() % 36];
  return s;
}

Db::Db(const std::string& dbname, const std::string& port) {
  const auto& s = Services::get();
  std::string conninfo = "host=" + s.pg_host + " port=" + (port.empty() ? s.pg_port : port) + " user=" + s.pg_user +
                         " dbname=" + (dbname.empty() ? s.pg_database : dbname) + " client_encoding=UTF8";
  conn_ = PQconnectdb(conninfo.c_str());
  if (PQstatus(conn_) != CONNECTION_OK) throw std::runtime_error(std::string("could not connect: ") + PQerrorMessage(conn_));
}

Db::~Db() { PQfinish(conn_); }

std::vector<std::vector<std::optional<std::string>>> Db::exec(const std::string& sql) {
  if (!PQsendQuery(conn_, sql.c_str())) throw std::runtime_error(PQerrorMessage(conn_));
  std::vector<std::vector<std::optional<std::string>>> rows;
  std::string error;
  while (PGresult* r = PQgetResult(conn_)) {
    auto st = PQresultStatus(r);
    if (st == PGRES_FATAL_ERROR) error = PQresultErrorMessage(r);
    if (st == PGRES_TUPLES_OK) {
      rows.clear();
      for (int t = 0; t < PQntuples(r); ++t) {
        auto& row = rows.emplace_back();
        for (int f = 0; f < PQnfields(r); ++f)
          row.push_back(PQgetisnull(r, t, f) ? std::nullopt : std::optional<std::string>(PQgetvalue(r, t, f)));
      }
    }
    PQclear(r);
  }
  if (!error.empty()) throw std::runtime_error("SQL failed: " + error + "\n" + sql.substr(0, 300));
  return rows;
}

std::string Db::scalar(const std::string& sql) {
  auto rows = exec(sql);
  if (rows.empty() || rows[0].empty() || !rows[0][0]) return "";
  return *rows[0][0];
}

std::uint64_t parse_lsn(const std::string& text) {
  auto slash = text.find('/');
  if (slash == std::string::npos) return 0;
  return (std::stoull(text.substr(0, slash), nullptr, 16) << 32) | std::stoull(text.substr(slash + 1), nullptr, 16);
}

std::uint64_t Db::confirmed_flush(const std::string& slot) {
  return parse_lsn(scalar("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '" + slot + "'"));
}

std::uint64_t Db::current_wal_lsn() { return parse_lsn(scalar("SELECT pg_current_wal_lsn()")); }

int Db::walsender_pid(const std::string& slot) {
  auto v = scalar("SELECT active_pid FROM pg_replication_slots WHERE slot_name = '" + slot + "'");
  return v.empty() ? 0 : std::stoi(v);
}

std::uint64_t Db::sent_lsn(const std::string& slot) {
  return parse_lsn(scalar("SELECT r.sent_lsn FROM pg_stat_replication r JOIN pg_replication_slots s ON "
                          "s.active_pid = r.pid WHERE s.slot_name = '" + slot + "'"));
}

std::optional<std::string> KafkaRecord::header(const std::string& name) const {
  for (auto& [k, v] : headers)
    if (k == name) return v;
  return std::nullopt;
}

namespace {


// A read from the beginning of a topic is sound when kcat reached the end, when
// the broker said the topic does not exist yet, or when kcat was stopped while
// reading a topic still being written (its -e may never see the end there);
// not when it stopped having read nothing for another reason.
bool read_is_sound(const KcatRun& k, bool read_something) {
  return k.ok() || k.unknown_topic() || (k.timed_out() && read_something);
}


// What the broker says of a topic a reader came short on, for the test's
// output: a topic never written and a reader that could not see what was
// written call for different fixes (the partitions' ends tell them apart).
void report_short_read(const std::string& topic, const std::string& what, const KcatRun& last,
                       const std::vector<KafkaRecord>& seen) {
  auto meta = kcat("-L -t '" + topic + "'", 10);
  auto ends = kcat("-Q -t '" + topic + ":0:-1' -t '" + topic + ":1:-1' -t '" + topic + ":2:-1'", 10);
  std::cerr << "reading " << topic << ": " << what << "; the last reader: " << last.failure() << "\nrecords seen:";
  for (const auto& r : seen) std::cerr << " [p" << r.partition << "@" << r.offset << " key=" << r.key.value_or("null") << "]";
  std::cerr << "\nkcat -L: " << meta.out << meta.err << "\nkcat -Q (ends): " << ends.out << ends.err << std::endl;
}

// What one bounded read of `topic` found; `failure` says why it cannot be
// trusted ("" when it can).
struct TopicRead {
  std::vector<KafkaRecord> recs;
  std::string failure;
  KcatRun run;
};

TopicRead consume_once(const std::string& topic) {
  // Bounded: on a topic still being written kcat's -e may never see the end.
  auto k = kcat("-C -t '" + topic + "' -o beginning -e -q -J -m 10 -X topic.metadata.refresh.interval.ms=1000", 30);
  const std::string& out = k.out;
  std::vector<KafkaRecord> recs;
  simdjson::ondemand::parser parser;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{') continue;
    simdjson::padded_string json(line);
    auto doc = parser.iterate(json);
    KafkaRecord r;
    // Fields in whatever order kcat writes them; absent ones (headers on a
    // record without any) are simply not there.
    for (auto field : doc.get_object()) {
      std::string_view k = field.unescaped_key().value();
      auto v = field.value();
      if (k == "topic") r.topic = std::string(std::string_view(v.get_string().value()));
      else if (k == "partition") r.partition = static_cast<int>(v.get_int64().value());
      else if (k == "offset") r.offset = v.get_int64().value();
      else if (k == "ts") r.timestamp_ms = v.get_int64().value();
      else if (k == "key" && !v.is_null()) r.key = std::string(std::string_view(v.get_string().value()));
      else if (k == "payload" && !v.is_null()) r.value = std::string(std::string_view(v.get_string().value()));
      else if (k == "headers" && !v.is_null()) {
        std::vector<std::string> flat;
        // A header without a value (kcat: null) reads as an empty one.
        for (auto h : v.get_array()) {
          bool null = false;
          if (!h.is_null().get(null) && null) flat.emplace_back();
          else flat.emplace_back(std::string_view(h.get_string().value()));
        }
        for (std::size_t i = 0; i + 1 < flat.size(); i += 2) r.headers.emplace_back(flat[i], flat[i + 1]);
      }
    }
    recs.push_back(std::move(r));
  }
  const bool sound = read_is_sound(k, !recs.empty());  // before recs is moved out
  std::string failure = sound ? std::string() : k.failure();
  return {std::move(recs), std::move(failure), std::move(k)};
}
}  // namespace

std::vector<KafkaRecord> consume(const std::string& topic, std::size_t expected, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto read = consume_once(topic);
    bool late = std::chrono::steady_clock::now() > deadline;
    if (read.failure.empty() && late && read.recs.size() < expected)
      report_short_read(topic, std::to_string(read.recs.size()) + " of " + std::to_string(expected) + " records", read.run,
                        read.recs);
    if (read.failure.empty() && (read.recs.size() >= expected || late)) return std::move(read.recs);
    if (late) throw std::runtime_error("reading " + topic + " failed: " + read.failure);
    std::this_thread::sleep_for(200ms);
  }
}

std::vector<std::optional<std::string>> consume_values_raw(const std::string& topic, std::size_t expected,
                                                           std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::optional<std::string>> values;
  for (;;) {
    // %R: payload length as a big-endian int32 (-1 for NULL), then the bytes.
    auto k = kcat("-C -t '" + topic + "' -o beginning -e -q -f '%R%s'", 30);
    const std::string& out = k.out;
    values.clear();
    std::size_t p = 0;
    while (p + 4 <= out.size()) {
      auto b = [&](std::size_t i) { return static_cast<std::uint32_t>(static_cast<unsigned char>(out[p + i])); };
      auto len = static_cast<std::int32_t>((b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3));
      p += 4;
      if (len < 0) {
        values.push_back(std::nullopt);
        continue;
      }
      values.push_back(out.substr(p, static_cast<std::size_t>(len)));
      p += static_cast<std::size_t>(len);
    }
    bool sound = read_is_sound(k, !values.empty());
    bool late = std::chrono::steady_clock::now() > deadline;
    if (sound && (values.size() >= expected || late)) return values;
    if (late) throw std::runtime_error("reading " + topic + " failed: " + k.failure());
    std::this_thread::sleep_for(200ms);
  }
}

std::size_t count_records(const std::string& topic) {
  // Read to the end, or the broker's word that the topic does not exist; a
  // passing hiccup (a leader moving) is tried again, a reader that keeps
  // failing fails the test instead of counting 0.
  KcatRun k;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt) std::this_thread::sleep_for(1s);
    k = kcat("-C -t '" + topic + "' -o beginning -e -q -f '.'", 60);
    if (k.ok()) return k.out.size();
    if (k.unknown_topic()) return 0;
  }
  throw std::runtime_error("counting the records of " + topic + " failed: " + k.failure());
}

bool wait_first_record(const std::string& topic, std::chrono::milliseconds timeout) {
  // No record yet is kcat waiting for one (stopped by timeout) or a topic not
  // there yet; anything else, still so at the deadline, is a failed reader.
  KcatRun k;
  bool found = eventually(
      [&] {
        k = kcat("-C -t '" + topic + "' -o beginning -c 1 -q -f '.' -X topic.metadata.refresh.interval.ms=1000", 10);
        return !k.out.empty();
      },
      timeout, 200ms);
  if (!found && !k.ok() && !k.timed_out() && !k.unknown_topic())
    throw std::runtime_error("waiting for a record of " + topic + " failed: " + k.failure());
  if (!found) report_short_read(topic, "no record within " + std::to_string(timeout.count()) + " ms", k, {});
  return found;
}

std::vector<KafkaRecord> read_topic(const std::string& topic, std::size_t expected, std::chrono::milliseconds timeout) {
  if (!wait_first_record(topic, timeout)) return {};
  return consume(topic, expected, timeout);
}

std::optional<double> metric_value(const std::string& exposition, const std::string& name) {
  std::istringstream in(exposition);
  std::string line;
  std::optional<double> sum;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    char next = line[name.size()];
    if (next != ' ' && next != '{') continue;
    sum = sum.value_or(0) + std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds timeout, std::chrono::milliseconds every) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(every);
  }
  return cond();
}

HttpResponse http_get(int port, const std::string& path, const std::string& bearer) {
  return http_request(port, "GET", path, bearer);
}

HttpResponse http_request(int port, const std::string& method, const std::string& path, const std::string& bearer) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  HttpResponse resp;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return resp;
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (method == "POST" || method == "PUT") req += "Content-Length: 0\r\n";
  if (!bearer.empty()) req += "Authorization: Bearer " + bearer + "\r\n";
  req += "\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string raw;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) raw.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  if (raw.size() > 12 && raw.rfind("HTTP/1.1 ", 0) == 0) resp.status = std::stoi(raw.substr(9, 3));
  auto body = raw.find("\r\n\r\n");
  if (body != std::string::npos) resp.body = raw.substr(body + 4);
  return resp;
}

std::string base_config(const std::string& slot) {
  const auto& s = Services::get();
  return "database.hostname=" + s.pg_host + "\ndatabase.port=" + s.pg_port + "\ndatabase.user=" + s.pg_user +
         "\ndatabase.dbname=" + s.pg_database + "\nkafka.bootstrap.servers=" + s.kafka + "\nslot.name=" + slot +
         "\npublication.name=" + slot + "\nadmin.listen=127.0.0.1:0\nlog.level=debug\nslot.status.interval.ms=1000\n";
}

void create_outbox(Db& db, const std::string& table, const std::string& id_type, const std::string& payload_type) {
  std::string id_default = id_type == "uuid" ? " DEFAULT gen_random_uuid()" : " GENERATED ALWAYS AS IDENTITY";
  db.exec("CREATE TABLE " + table + " (id " + id_type + " PRIMARY KEY" + id_default +
          ", aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload " + payload_type +
          ", created_at timestamptz NOT NULL DEFAULT now())");
}

Walrelay::Walrelay(const std::string& config, std::map<std::string, std::string> env) : env_(std::move(env)) {
  char tmpl[] = "/tmp/walrelay-test-XXXXXX";
  dir_ = mkdtemp(tmpl);
  config_path_ = dir_ + "/walrelay.properties";
  log_path_ = dir_ + "/walrelay.log";
  std::ofstream(config_path_) << config;
  std::lock_guard lock(live_mu);
  live_relays.insert(this);
  case_dirs.push_back(dir_);
}

Walrelay::~Walrelay() {
  {
    std::lock_guard lock(live_mu);
    live_relays.erase(this);
  }
  if (pid_ > 0 && exit_code_ < 0) {
    ::kill(pid_, SIGKILL);
    int st;
    waitpid(pid_, &st, 0);
  }
}

void Walrelay::start() { start({"--config", config_path_}); }

void Walrelay::start(const std::vector<std::string>& args) {
  exit_code_ = -1;
  admin_port_ = 0;
  log_offset_ = read_file(log_path_).size();  // a restart appends: look only at what this run writes
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (kv.rfind("WALRELAY_", 0) == 0) continue;  // only what the test says
    envs.push_back(kv);
  }
  // A mutation run (tests/mutation/run.sh) names the break it tests.
  if (const char* m = std::getenv("WALRELAY_MUTATION")) envs.push_back(std::string("WALRELAY_MUTATION=") + m);
  for (auto& [k, v] : env_) envs.push_back(k + "=" + v);
  // halt.action=exit unless the test says otherwise: the tests of halts wait
  // for exit code 3 (a file that names the key keeps its value; a Kafka
  // Connect file takes it from the environment too).
  if (!env_.count("WALRELAY_HALT_ACTION") && read_file(config_path_).find("halt.action") == std::string::npos)
    envs.push_back("WALRELAY_HALT_ACTION=exit");
  std::vector<char*> envp;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&fa, 1, log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  const char* binary = std::getenv("WALRELAY_TEST_BINARY");
  std::vector<std::string> argv_s{binary && *binary ? binary : WALRELAY_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  int rc = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("could not start walrelay");
}

int Walrelay::run(const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
  start(args);
  return wait_exit(timeout);
}

bool Walrelay::running() {
  if (pid_ <= 0 || exit_code_ >= 0) return false;
  int st;
  pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return false;
  }
  return true;
}

void Walrelay::signal(int sig) {
  if (pid_ > 0 && exit_code_ < 0) ::kill(pid_, sig);
}

int Walrelay::wait_exit(std::chrono::milliseconds timeout) {
  eventually([&] { return !running(); }, timeout, 20ms);
  return exit_code_;
}

void Walrelay::wait_streaming(std::chrono::milliseconds timeout) {
  if (!eventually([&] { return this_run_log().find("streaming: START_REPLICATION") != std::string::npos || !running(); },
                  timeout))
    throw std::runtime_error("walrelay did not start streaming in time; log:\n" + log());
  if (!running()) throw std::runtime_error("walrelay exited; log:\n" + log());
}

std::string Walrelay::log() const { return read_file(log_path_); }

std::string Walrelay::this_run_log() const {
  std::string all = read_file(log_path_);
  return log_offset_ <= all.size() ? all.substr(log_offset_) : all;
}

int Walrelay::admin_port() {
  if (admin_port_) return admin_port_;
  // The line is near the top; a debug log grows large, and std::regex is
  // slow on long input, so look at the head only.
  std::regex re(R"(admin endpoint listening on [^ \n]*:(\d+))");
  eventually([&] {
    std::smatch m;
    std::string head = this_run_log().substr(0, 16384);
    if (std::regex_search(head, m, re)) admin_port_ = std::stoi(m[1]);
    return admin_port_ != 0;
  }, 10s);
  return admin_port_;
}

HttpResponse Walrelay::get(const std::string& path, const std::string& bearer) {
  return http_get(admin_port(), path, bearer);
}

HttpResponse Walrelay::request(const std::string& method, const std::string& path, const std::string& bearer) {
  return http_request(admin_port(), method, path, bearer);
}

std::optional<double> Walrelay::metric(const std::string& name, const std::string& bearer) {
  // A dead endpoint must not read as an absent metric (a `value_or(0) == 0`
  // would pass): no answer throws. A loaded machine can hold one answer past
  // http_get's 5 s, so a silent endpoint of a running walrelay is asked again.
  HttpResponse resp;
  eventually([&] { return (resp = get("/metrics", bearer)).status != 0 || !running(); }, 15s, 200ms);
  if (resp.status == 200) return metric_value(resp.body, name);
  std::string what = resp.status ? "answered " + std::to_string(resp.status) + ": " + resp.body.substr(0, 300)
                     : !running()  ? "did not answer: walrelay exited with " + std::to_string(exit_code_)
                     : admin_port_ ? "did not answer on port " + std::to_string(admin_port_)
                                   : "is not known: no \"admin endpoint listening\" in the log";
  throw std::runtime_error("reading " + name + ": the /metrics of the walrelay of " + config_path_ + " " + what);
}

}  // namespace it

namespace it {

namespace {

// One admin request's result event, or a throw naming what failed.
rd_kafka_event_t* admin_wait(rd_kafka_queue_t* q, const std::string& what) {
  rd_kafka_event_t* ev = rd_kafka_queue_poll(q, 30000);
  if (!ev) throw std::runtime_error(what + ": no answer within 30 s");
  if (rd_kafka_event_error(ev)) {
    std::string e = rd_kafka_event_error_string(ev);
    rd_kafka_event_destroy(ev);
    throw std::runtime_error(what + ": " + e);
  }
  return ev;
}

}  // namespace

void configure_topic(const std::string& topic, int partitions, const std::map<std::string, std::string>& configs) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", Services::get().kafka.c_str(), err, sizeof err);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (!rk) throw std::runtime_error(std::string("admin client: ") + err);
  rd_kafka_queue_t* q = rd_kafka_queue_new(rk);
  std::string problem;
  rd_kafka_NewTopic_t* t = rd_kafka_NewTopic_new(topic.c_str(), partitions, 1, err, sizeof err);
  for (auto& [k, v] : configs) rd_kafka_NewTopic_set_config(t, k.c_str(), v.c_str());
  rd_kafka_CreateTopics(rk, &t, 1, nullptr, q);
  bool exists = false;
  try {
    rd_kafka_event_t* ev = admin_wait(q, "create topic " + topic);
    std::size_t n = 0;
    auto** res = rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
    for (std::size_t i = 0; i < n; ++i) {
      auto code = rd_kafka_topic_result_error(res[i]);
      if (code == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) exists = true;
      else if (code) problem = rd_kafka_topic_result_error_string(res[i]);
    }
    rd_kafka_event_destroy(ev);
    if (exists && problem.empty()) {
      rd_kafka_ConfigResource_t* r = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic.c_str());
      for (auto& [k, v] : configs) rd_kafka_ConfigResource_set_config(r, k.c_str(), v.c_str());
      rd_kafka_AlterConfigs(rk, &r, 1, nullptr, q);
      ev = admin_wait(q, "alter topic " + topic);
      std::size_t m = 0;
      auto** rs = rd_kafka_AlterConfigs_result_resources(rd_kafka_event_AlterConfigs_result(ev), &m);
      for (std::size_t i = 0; i < m; ++i)
        if (rd_kafka_ConfigResource_error(rs[i])) problem = rd_kafka_ConfigResource_error_string(rs[i]);
      rd_kafka_event_destroy(ev);
      rd_kafka_ConfigResource_destroy(r);
    }
  } catch (const std::exception& e) {
    problem = e.what();
  }
  rd_kafka_NewTopic_destroy(t);
  rd_kafka_queue_destroy(q);
  rd_kafka_destroy(rk);
  if (!problem.empty()) throw std::runtime_error("topic " + topic + ": " + problem);
}

void produce_record(const std::string& topic, const std::string& key, const std::string& value,
                    std::int64_t timestamp_ms, const std::vector<std::pair<std::string, std::string>>& headers) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  rd_kafka_conf_set(conf, "bootstrap.servers", Services::get().kafka.c_str(), err, sizeof err);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (!rk) throw std::runtime_error(std::string("producer: ") + err);
  rd_kafka_headers_t* hdrs = rd_kafka_headers_new(headers.size());
  for (auto& [n, v] : headers) rd_kafka_header_add(hdrs, n.c_str(), -1, v.data(), static_cast<ssize_t>(v.size()));
  auto e = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(0),
                             RD_KAFKA_V_KEY(key.data(), key.size()),
                             RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                             RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_TIMESTAMP(timestamp_ms),
                             RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_END);
  if (e) rd_kafka_headers_destroy(hdrs);  // taken by producev only on success
  auto flushed = e ? e : rd_kafka_flush(rk, 30000);
  rd_kafka_destroy(rk);
  if (flushed) throw std::runtime_error("produce to " + topic + ": " + rd_kafka_err2str(flushed));
}

}  // namespace it
