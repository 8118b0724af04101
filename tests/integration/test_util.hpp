// Helpers shared by every integration and fault test, on top of the
// harness: the per-test fixture, a writer, a broker outage, the checks of
// ids and order, sizes scaled by WALRELAY_FAULT_SCALE. One of each: a test
// that needs something new adds it here.
#pragma once

#include <catch2/catch.hpp>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <initializer_list>
#include <utility>
#include <vector>

#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.hpp"

namespace it {

using namespace std::chrono_literals;

// The Python of the independent readers (scripts/py-venv.sh: confluent-kafka's
// deserializers, nats-py), made on first use.
inline std::string test_python() {
  static const std::string path = [] {
    auto r = run_command(std::string(WALRELAY_SOURCE_DIR) + "/scripts/py-venv.sh");
    if (r.status != 0) throw std::runtime_error("scripts/py-venv.sh failed");
    auto p = r.output;
    while (!p.empty() && (p.back() == '\n' || p.back() == ' ')) p.pop_back();
    return p;
  }();
  return path;
}

// True when WALRELAY_FAULT_SCALE=full: the sizes recorded in docs/reliability.md.
inline bool full_scale() {
  const char* s = std::getenv("WALRELAY_FAULT_SCALE");
  return s && std::string(s) == "full";
}

// `ci` in CI (the default), `full` with WALRELAY_FAULT_SCALE=full.
inline long scaled(long ci, long full) { return full_scale() ? full : ci; }

// A field of /proc/<pid>/status in kB (VmRSS, VmHWM); 0 when unreadable.
inline long proc_status_kb(pid_t pid, const std::string& field) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0) return std::atol(line.c_str() + field.size() + 1);
  return 0;
}

// One thread of a process (the first named `name`, e.g. walrelay's
// "wr-redis") held in one piece by ptrace (tests/campaign/hold_thread.py
// --until-released) until release() or the end of the object: what the
// loop hands it meanwhile waits in its queue, and it takes it all at once.
// It is held only while it sleeps in a futex - a condition variable, or a
// lock it does not hold - never inside a critical section, where it would
// hold the loop back too; otherwise it is let go and held again.
class ThreadHold {
 public:
  ThreadHold(pid_t pid, const std::string& name) {
    char tmpl[] = "/tmp/walrelay-hold-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    try {
      hold(pid, name);
    } catch (...) {
      // No destructor runs for a constructor that throws: a holder started
      // here must not keep the thread for its 120 s.
      release();
      run_command("rm -rf " + dir_);
      throw;
    }
  }
  ~ThreadHold() {
    release();
    run_command("rm -rf " + dir_);
  }
  ThreadHold(const ThreadHold&) = delete;
  ThreadHold& operator=(const ThreadHold&) = delete;

  // Lets it go, and waits until the holder has detached (it says so).
  void release() {
    if (!held_) return;
    held_ = false;
    run_command("touch " + dir_ + "/release");
    eventually([&] { return read_file(dir_ + "/hold.out").find("hold_thread:") != std::string::npos; }, 15s, 10ms);
  }

 private:
  void hold(pid_t pid, const std::string& name) {
    const std::string tid = thread_named(pid, name);
    if (tid.empty()) FAIL("no thread named " << name << " in process " << pid);
    for (int attempt = 0; attempt < 100; ++attempt) {
      run_command("rm -f " + dir_ + "/release " + dir_ + "/hold.out; ( while [ ! -e " + dir_ +
                  "/release ]; do sleep 0.02; done; echo go ) | python3 " + WALRELAY_SOURCE_DIR +
                  "/tests/campaign/hold_thread.py " + tid + " 120 --until-released > " + dir_ +
                  "/hold.out 2>&1 &");
      held_ = true;
      std::string out;
      REQUIRE(eventually([&] { return !(out = read_file(dir_ + "/hold.out")).empty(); }, 15s, 10ms));
      REQUIRE(out.rfind("held", 0) == 0);  // else: not permitted here, or the thread is gone
      // /proc/<tid>/syscall: the number of the call it sleeps in (a futex
      // wait, or its restart after the ptrace stop interrupted it).
      std::istringstream call(read_file("/proc/" + std::to_string(pid) + "/task/" + tid + "/syscall"));
      long nr = -1;
      call >> nr;
      if (nr == SYS_futex || nr == SYS_restart_syscall) return;
      release();
      std::this_thread::sleep_for(std::chrono::milliseconds(5 + attempt));
    }
    FAIL("thread " << name << " of process " << pid << " was never found asleep in a futex");
  }
  static std::string thread_named(pid_t pid, const std::string& name) {
    const std::string task = "/proc/" + std::to_string(pid) + "/task";
    auto r = run_command("grep -lx '" + name + "' " + task + "/*/comm 2>/dev/null | head -1");
    auto path = r.output;
    while (!path.empty() && path.back() == '\n') path.pop_back();
    if (path.empty()) return {};
    path.erase(path.size() - std::string("/comm").size());
    return path.substr(path.rfind('/') + 1);
  }
  std::string dir_;
  bool held_ = false;
};

// A metric of walrelay's, read once it is `expected` (or at the deadline:
// then whatever it is, for the test's CHECK to show). walrelay counts what
// the database or the broker has already done a moment after it is done
// (a retention batch once its statement returns, a dead-lettered record once
// its delivery report is served), so a test that has just seen the outcome
// itself could read the metric one step short.
inline double metric_at(Walrelay& relay, const std::string& name, double expected) {
  double value = -1;
  eventually([&] { return (value = relay.metric(name).value_or(-1)) == expected; }, 15s, 20ms);
  return value;
}

// Number of times `needle` occurs in `hay`.
inline std::size_t count_of(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

// A command's exit code as a shell says it (run_command gives the wait
// status); -1 when it did not exit.
inline int exit_code(const CommandResult& r) {
  return r.status >= 0 && WIFEXITED(r.status) ? WEXITSTATUS(r.status) : -1;
}

// `walrelay --check` on a configuration file: its exit code (in status) and
// what it printed.
inline CommandResult walrelay_check(const std::string& config_path) {
  auto r = run_command(std::string(WALRELAY_BINARY) + " --check --config " + config_path + " < /dev/null 2>&1");
  r.status = exit_code(r);
  return r;
}

// Per-test slot, publication, outbox table and topic prefix, all named after
// the slot. The Db connection can be reopened after a server restart. At the
// end the fixture drops what it made (the slot once it is released, the
// publication, every table named <slot>_...), so that PostgreSQL's data,
// which outlives a test run, never carries one test's leftovers into another.
struct Fixture {
  std::unique_ptr<Db> db_ = std::make_unique<Db>();
  std::string slot = unique_name("it");
  std::string table = "public." + slot + "_outbox";
  std::string topic_prefix = slot + ".";

  Db& db() { return *db_; }
  // A new connection, retried while the server comes back.
  void reconnect() {
    db_.reset();
    REQUIRE(eventually(
        [&] {
          try {
            db_ = std::make_unique<Db>();
            return true;
          } catch (...) {
            return false;
          }
        },
        60s, 200ms));
  }
  std::string config(const std::string& extra = "") const {
    return base_config(slot) + "table.include.list=" + table + "\nroute.topic.replacement=" + topic_prefix +
           "${routedByValue}\n" + extra;
  }
  std::string topic(const std::string& type) const { return topic_prefix + type; }
  ~Fixture() {
    try {
      Db db;
      // A killed walrelay's slot is released a moment later.
      eventually(
          [&] {
            return db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + slot +
                             "' AND active") == "0";
          },
          10s, 100ms);
      db.exec("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '" + slot +
              "' AND NOT active");
      db.exec("DROP PUBLICATION IF EXISTS " + slot);
      for (auto& row : db.exec("SELECT format('%I.%I', schemaname, tablename) FROM pg_tables WHERE tablename LIKE '" +
                               slot + "\\_%'"))
        db.exec("DROP TABLE IF EXISTS " + *row[0] + " CASCADE");
    } catch (...) {
    }
  }
};

// A login role with REPLICATION for the test, dropped at the end with what it
// owns and was granted.
// (Through the fixture, whose connection may be reopened meanwhile.)
struct TemporaryRole {
  Fixture& f;
  std::string name;
  TemporaryRole(Fixture& fixture, std::string n) : f(fixture), name(std::move(n)) {
    f.db().exec("CREATE ROLE " + name + " LOGIN REPLICATION");
  }
  ~TemporaryRole() {
    try {
      f.db().exec("DROP OWNED BY " + name + "; DROP ROLE IF EXISTS " + name);
    } catch (...) {
    }
  }
};

// Every record of `topic`, read once the slot is confirmed past everything
// written so far: walrelay confirms only what Kafka acknowledged, so then
// every record it produced is there. (Waiting for a count instead returns
// early when duplicates from a replay make up the number.)
inline std::vector<KafkaRecord> read_all(Fixture& f, const std::string& topic, std::chrono::milliseconds timeout = 120s) {
  auto end = f.db().current_wal_lsn();
  if (!eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, timeout, 100ms))
    FAIL("the slot was not confirmed past " << end << " in time (confirmed " << f.db().confirmed_flush(f.slot) << ")");
  return read_topic(topic, 1, 30s);
}

// A process frozen (SIGSTOP) for the life of the object and continued at its
// end (or earlier with thaw()), also when an assertion fails in between: a
// frozen walrelay, walsender or broker left behind stalls the tests after.
class Frozen {
 public:
  explicit Frozen(pid_t pid) : pid_(pid) {
    REQUIRE(pid_ > 0);
    REQUIRE(::kill(pid_, SIGSTOP) == 0);
  }
  // A walrelay: continued through Walrelay::signal, which signals no process
  // once it has been reaped (its pid may be another's by then).
  explicit Frozen(Walrelay& relay) : relay_(&relay) {
    REQUIRE(relay.running());
    relay.signal(SIGSTOP);
  }
  ~Frozen() { thaw(); }
  Frozen(const Frozen&) = delete;
  Frozen& operator=(const Frozen&) = delete;
  void thaw() {
    if (relay_) relay_->signal(SIGCONT);
    else if (pid_ > 0) ::kill(pid_, SIGCONT);
    relay_ = nullptr;
    pid_ = 0;
  }

 private:
  Walrelay* relay_ = nullptr;
  pid_t pid_ = 0;
};

// The broker frozen for the life of the object: connections stay open and
// every request waits, as in a long GC pause or a stalled disk.
class BrokerFreeze : public Frozen {
 public:
  BrokerFreeze() : Frozen(broker_pid()) {}

 private:
  static pid_t broker_pid() {
    std::ifstream in(Services::current("WALRELAY_RUN_DIR") + "/kafka/pid");
    pid_t pid = 0;
    in >> pid;
    REQUIRE(pid > 0);
    return pid;
  }
};

// Server settings changed with ALTER SYSTEM for the life of the object and
// put back at its end as postgresql.auto.conf had them (or removed from it),
// also when an assertion fails in between or a step here fails: the server
// outlives the test, and the tests after it must not run on its settings.
class ServerSettings {
 public:
  // ServerSettings s{{"name", "value"}, ...}
  explicit ServerSettings(std::initializer_list<std::pair<std::string, std::string>> settings) {
    try {
      Db db;
      for (auto& [name, value] : settings) {
        auto before = db.exec("SELECT setting FROM pg_file_settings WHERE name = '" + name +
                              "' AND sourcefile LIKE '%/postgresql.auto.conf' ORDER BY seqno DESC LIMIT 1");
        saved_.emplace_back(name, before.empty() ? std::nullopt : before[0][0]);
        db.exec("ALTER SYSTEM SET " + name + " = " + quoted(value));  // one statement a call: not in a transaction
      }
      db.exec("SELECT pg_reload_conf()");
    } catch (...) {
      restore();
      throw;
    }
  }
  ~ServerSettings() { restore(); }
  ServerSettings(const ServerSettings&) = delete;
  ServerSettings& operator=(const ServerSettings&) = delete;

 private:
  static std::string quoted(const std::string& value) {
    std::string out = "'";
    for (char c : value) out += c == '\'' ? std::string("''") : std::string(1, c);
    return out + "'";
  }
  void restore() noexcept {
    if (saved_.empty()) return;
    try {
      Db db;
      for (auto it = saved_.rbegin(); it != saved_.rend(); ++it)
        db.exec(it->second ? "ALTER SYSTEM SET " + it->first + " = " + quoted(*it->second)
                           : "ALTER SYSTEM RESET " + it->first);
      db.exec("SELECT pg_reload_conf()");
    } catch (const std::exception& e) {
      std::cerr << "could not put the server's settings back: " << e.what() << "\n";
    }
    saved_.clear();
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Lines put at the top of the server's pg_hba.conf (the first match wins)
// for the life of the object, and the file as it was at its end, reloaded
// both times, also when an assertion fails in between.
class PgHbaLines {
 public:
  explicit PgHbaLines(const std::string& lines) : path_(Services::get().pg_data + "/pg_hba.conf") {
    std::ifstream in(path_);
    std::stringstream text;
    text << in.rdbuf();
    original_ = text.str();
    REQUIRE_FALSE(original_.empty());
    write(lines + original_);
  }
  ~PgHbaLines() {
    try {
      write(original_);
    } catch (const std::exception& e) {
      std::cerr << "could not put " << path_ << " back: " << e.what() << "\n";
    }
  }
  PgHbaLines(const PgHbaLines&) = delete;
  PgHbaLines& operator=(const PgHbaLines&) = delete;

 private:
  void write(const std::string& text) {
    {
      std::ofstream out(path_, std::ios::trunc);  // rewritten in place: its owner and mode stay
      out << text;
      if (!out.flush()) throw std::runtime_error("could not write " + path_);
    }
    Db().exec("SELECT pg_reload_conf()");
  }
  std::string path_, original_;
};

// The broker stopped for the life of the object and started again at its
// end (or earlier with restart()), also when an assertion fails in between.
class BrokerOutage {
 public:
  BrokerOutage() { Services::control("kafka-stop"); }
  ~BrokerOutage() {
    if (down_) try {
        Services::control("kafka-start");
      } catch (...) {
      }
  }
  BrokerOutage(const BrokerOutage&) = delete;
  BrokerOutage& operator=(const BrokerOutage&) = delete;
  void restart() {
    Services::control("kafka-start");
    down_ = false;
  }

 private:
  bool down_ = true;
};

// A configuration with one key's line replaced (a repeated key is a config error).
inline std::string with_key(std::string config, const std::string& key, const std::string& value) {
  auto p = config.find(key + "=");
  if (p != std::string::npos) config.erase(p, config.find('\n', p) - p + 1);
  return config + key + "=" + value + "\n";
}

// An outbox INSERT statement.
inline std::string insert_event(const std::string& table, const std::string& type, const std::string& key,
                                const std::string& payload_sql) {
  return "INSERT INTO " + table + " (aggregatetype, aggregateid, type, payload) VALUES ('" + type + "', '" + key +
         "', 'Created', " + payload_sql + ");";
}

// Waits until walrelay has logged "streaming: START_REPLICATION" more than
// `before` times (the log is kept across restarts of one Walrelay).
inline void wait_streaming_after(Walrelay& relay, std::size_t before, std::chrono::milliseconds timeout = 60s) {
  const std::string mark = "streaming: START_REPLICATION";
  bool ok = eventually([&] { return count_of(relay.log(), mark) > before || !relay.running(); }, timeout, 50ms);
  if (!ok || !relay.running()) FAIL("walrelay did not (re)start streaming; log tail:\n" << relay.log().substr(relay.log().size() > 4000 ? relay.log().size() - 4000 : 0));
}

// The `id` header of every record, and how many records carried each.
struct IdCount {
  std::map<std::string, int> count;
  std::size_t records = 0;
  std::size_t duplicates() const { return records - count.size(); }
};
inline IdCount ids_of(const std::vector<KafkaRecord>& recs) {
  IdCount out;
  for (auto& r : recs) {
    auto id = r.header("id");
    if (!id) continue;
    out.count[*id]++;
    out.records++;
  }
  return out;
}

// Every id in the outbox table that is not in `seen`.
inline std::vector<std::string> missing_ids(Db& db, const std::string& table, const IdCount& seen) {
  std::vector<std::string> missing;
  for (auto& row : db.exec("SELECT id::text FROM " + table))
    if (!seen.count.count(*row[0])) missing.push_back(*row[0]);
  return missing;
}

// A writer thread that keeps inserting outbox rows in small transactions,
// reconnecting when the server goes away, until stopped or `total` rows are
// committed. Each row's payload carries its key's sequence number so order per
// key can be checked: {"k": key, "seq": n}.
class Writer {
 public:
  // pad_sql: an SQL text expression added to each payload as "pad".
  // first_seq: the sequence number of the first row, to go on after rows
  // written before (the initial snapshot's tests).
  Writer(std::string table, std::string type, long total, int per_txn, std::chrono::milliseconds pause, int keys = 16,
         std::string pad_sql = "", long first_seq = 0)
      : table_(std::move(table)), type_(std::move(type)), total_(total), per_txn_(per_txn), pause_(pause), keys_(keys),
        pad_sql_(std::move(pad_sql)), first_seq_(first_seq) {
    thread_ = std::jthread([this](std::stop_token st) { run(st); });
  }
  ~Writer() { stop(); }
  void stop() {
    if (thread_.joinable()) {
      thread_.request_stop();
      thread_.join();
    }
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  long committed() const { return committed_.load(); }
  // Statements that failed (a lost connection: the transaction may or may not
  // have committed). A test without a database fault expects none.
  long failures() const { return failures_.load(); }
  // The first few distinct errors, for the test's message.
  std::string errors() const {
    std::lock_guard lock(mutex_);
    std::string out;
    for (auto& e : errors_) out += e + "\n";
    return out;
  }

 private:
  void run(std::stop_token st) {
    std::unique_ptr<Db> db;
    long n = 0;
    while (!st.stop_requested() && n < total_) {
      try {
        if (!db) db = std::make_unique<Db>();
        int rows = static_cast<int>(std::min<long>(per_txn_, total_ - n));
        // seq = the global row number; keys take turns, so per key the
        // sequence grows with commit order (one writer).
        const std::string at = std::to_string(first_seq_ + n);
        db->exec("INSERT INTO " + table_ + " (aggregatetype, aggregateid, type, payload) SELECT '" + type_ +
                 "', 'k' || ((" + at + " + g) % " + std::to_string(keys_) + "), 'x', jsonb_build_object('seq', " +
                 at + " + g" +
                 (pad_sql_.empty() ? "" : ", 'pad', " + pad_sql_) + ") FROM generate_series(0, " +
                 std::to_string(rows - 1) + ") g");
        n += rows;
        committed_ = n;
      } catch (const std::exception& e) {
        // Lost connection: the transaction may or may not have committed;
        // the table is the truth at the end. Start the next one fresh.
        failures_++;
        {
          std::lock_guard lock(mutex_);
          if (errors_.size() < 5 && std::find(errors_.begin(), errors_.end(), e.what()) == errors_.end())
            errors_.emplace_back(e.what());
        }
        db.reset();
        std::this_thread::sleep_for(100ms);
        continue;
      }
      if (pause_.count()) std::this_thread::sleep_for(pause_);
    }
  }
  std::string table_, type_;
  long total_;
  int per_txn_;
  std::chrono::milliseconds pause_;
  int keys_;
  std::string pad_sql_;
  long first_seq_ = 0;
  std::atomic<long> committed_{0};
  std::atomic<long> failures_{0};
  mutable std::mutex mutex_;
  std::vector<std::string> errors_;
  std::jthread thread_;
};

// Checks that per key the `seq` in the payloads never goes backwards in
// partition offset order, ignoring redelivered duplicates (an at-least-once
// replay restarts an older run of sequence numbers; the first delivery of
// each seq must still be in order).
// Every key also stays on one partition (the producer's partitioner), or
// offsets would not order it.
inline void check_order_per_key(const std::vector<KafkaRecord>& recs) {
  std::map<std::string, std::vector<std::pair<std::int64_t, long>>> by_key;  // key -> (offset, seq)
  std::map<std::string, int> partition_of;
  for (auto& r : recs) {
    REQUIRE(r.key);
    REQUIRE(r.value);
    auto p = r.value->find("\"seq\": ");
    REQUIRE(p != std::string::npos);
    by_key[*r.key].push_back({r.offset, std::stol(r.value->substr(p + 7))});
    auto [it, first] = partition_of.try_emplace(*r.key, r.partition);
    INFO("key " << *r.key);
    REQUIRE(it->second == r.partition);
  }
  for (auto& [key, v] : by_key) {
    std::sort(v.begin(), v.end());
    long high = std::numeric_limits<long>::min();
    std::set<long> seen;
    for (auto& [offset, seq] : v) {
      if (seen.count(seq)) continue;  // a duplicate from a replay
      INFO("key " << key << " offset " << offset << " seq " << seq << " after " << high);
      REQUIRE(seq > high);
      high = seq;
      seen.insert(seq);
    }
  }
}

}  // namespace it
