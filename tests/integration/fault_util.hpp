// Helpers shared by the [fault] tests: sizes scaled by WALRELAY_FAULT_SCALE,
// a fixture that survives database restarts, /proc and /metrics readers.
// Header-only so that harness.hpp/.cpp (shared with the integration tests)
// stay as they are.
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "harness.hpp"

namespace fault {

using namespace it;
using namespace std::chrono_literals;

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

// Sum of every sample of a Prometheus metric (all label sets); nullopt when
// the endpoint does not answer or the metric is absent.
inline std::optional<double> metric(Walrelay& relay, const std::string& name, const std::string& bearer = {}) {
  auto resp = relay.get("/metrics", bearer);
  if (resp.status != 200) return std::nullopt;
  std::istringstream in(resp.body);
  std::string line;
  std::optional<double> sum;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    char next = line[name.size()];
    if (next != ' ' && next != '{') continue;
    auto sp = line.rfind(' ');
    sum = sum.value_or(0) + std::atof(line.c_str() + sp + 1);
  }
  return sum;
}

// Number of times `needle` occurs in `hay`.
inline std::size_t count_of(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

// Per-test slot, publication, outbox table and topic prefix. The Db
// connection can be reopened after a server restart.
struct Fixture {
  std::unique_ptr<Db> db_ = std::make_unique<Db>();
  std::string slot = unique_name("fault");
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
    // The slot is released a moment after walrelay is killed; then drop it.
    try {
      Db db;
      eventually(
          [&] {
            return db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + slot +
                             "' AND active") == "0";
          },
          10s, 100ms);
      db.exec("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '" + slot +
              "' AND NOT active");
    } catch (...) {
    }
  }
};

// kcat's consumer can hang for good when it starts while the broker is still
// creating the topic (seen once in ~50 runs: `-e` never fired). Every read
// here is bounded by `timeout`, and a topic is read in full only once a
// first record of it could be read.
inline std::string shell_output(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[65536];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// True once one record of `topic` can be read (the topic exists and has a leader).
inline bool wait_first_record(const std::string& topic, std::chrono::milliseconds timeout = 60s) {
  return eventually(
      [&] {
        return !shell_output("timeout 10 kcat -b " + Services::get().kafka + " -C -t '" + topic +
                             "' -o beginning -c 1 -q -f '.' 2>/dev/null")
                    .empty();
      },
      timeout, 200ms);
}

// Records in `topic` now (0 when it does not exist yet), read with a time limit.
inline std::size_t count_records(const std::string& topic) {
  auto out = shell_output("timeout 60 kcat -b " + Services::get().kafka + " -C -t '" + topic +
                          "' -o beginning -e -q -f '.' 2>/dev/null");
  return out.size();
}

// it::consume, once the topic can be read (see above).
inline std::vector<KafkaRecord> read_topic(const std::string& topic, std::size_t expected,
                                           std::chrono::milliseconds timeout = 60s) {
  if (!wait_first_record(topic, timeout)) return {};
  return consume(topic, expected, timeout);
}

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
  Writer(std::string table, std::string type, long total, int per_txn, std::chrono::milliseconds pause, int keys = 16)
      : table_(std::move(table)), type_(std::move(type)), total_(total), per_txn_(per_txn), pause_(pause), keys_(keys) {
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
  long failures() const { return failures_.load(); }

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
        db->exec("INSERT INTO " + table_ + " (aggregatetype, aggregateid, type, payload) SELECT '" + type_ +
                 "', 'k' || ((" + std::to_string(n) + " + g) % " + std::to_string(keys_) +
                 "), 'x', jsonb_build_object('seq', " + std::to_string(n) + " + g) FROM generate_series(0, " +
                 std::to_string(rows - 1) + ") g");
        n += rows;
        committed_ = n;
      } catch (...) {
        // Lost connection: the transaction may or may not have committed;
        // the table is the truth at the end. Start the next one fresh.
        failures_++;
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
  std::atomic<long> committed_{0};
  std::atomic<long> failures_{0};
  std::jthread thread_;
};

// Checks that per key the `seq` in the payloads never goes backwards in
// partition offset order, ignoring redelivered duplicates (an at-least-once
// replay restarts an older run of sequence numbers; the first delivery of
// each seq must still be in order).
inline void check_order_per_key(const std::vector<KafkaRecord>& recs) {
  std::map<std::string, std::vector<std::pair<std::int64_t, long>>> by_key;  // key -> (offset, seq)
  for (auto& r : recs) {
    REQUIRE(r.key);
    REQUIRE(r.value);
    auto p = r.value->find("\"seq\": ");
    REQUIRE(p != std::string::npos);
    by_key[*r.key].push_back({r.offset, std::stol(r.value->substr(p + 7))});
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

}  // namespace fault
