// sink.type=redis: each record is appended to a Redis stream (XADD), the
// stream named from its topic (sink.redis.stream.template), and reported
// delivered once Redis has answered for it.
//
// Exactly once per stream, without a transaction: a record from the stream
// carries an entry id made of its transaction's commit LSN and its place in
// that transaction (<commit LSN>-<n>), so ids rise in commit order. A stream
// refuses an id at or below its last, so an event sent again after a crash or
// an outage is recognised: one Lua script per stream and batch appends each
// entry whose id is above the stream's last, and for one at or below it looks
// the entry up (the same event id there: delivered before). Not there, it was
// delivered before only when walrelay's mark beside the stream (a hash: the
// source - system, timeline, database, slot - and the highest id stored from
// it with nothing missing below) reaches it: trimmed or deleted since.
// Otherwise it is the record's error (id_conflict). Never counted delivered on
// the id alone. What the server stored is always a prefix of what was sent,
// per stream: one batch per stream in flight, a script stops at its first
// error, after a transient failure nothing more is sent until the relay has
// taken back what was queued (abort_queued) and sends it again from the slot,
// and after a refused entry the mark stays below it.
//
// Records with no such position (an initial snapshot's rows, walrelay replay,
// redrive) and dead-letter copies are appended after the stream's last entry
// (<its ms>-*): at least once.
//
// Threads: one worker thread owns the hiredis connection (blocking, with
// timeouts) and hands outcomes back through one queue, posting a wake-up to
// the loop, where everything else runs.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "walrelay/sinks/owned_record.hpp"
#include "walrelay/sinks/sink.hpp"
#include "walrelay/sinks/redis/redis_config.hpp"

struct redisContext;
struct redisReply;

namespace walrelay {

class RedisStreamsSink final : public Sink {
 public:
  RedisStreamsSink(boost::asio::io_context& io, RedisConfig config);
  ~RedisStreamsSink() override;
  RedisStreamsSink(const RedisStreamsSink&) = delete;
  RedisStreamsSink& operator=(const RedisStreamsSink&) = delete;

  SubmitStatus submit(const OutboxRecord& record, std::uint64_t token) override;
  SubmitStatus submit_dead_letter(std::string_view reason, std::string_view topic,
                                  std::optional<std::string_view> key, std::optional<std::string_view> value,
                                  const std::vector<OutboxRecord::Header>& headers, std::uint64_t token,
                                  std::size_t bytes) override;
  void poll() override;
  void abort_queued() override;
  bool healthy() const override;
  std::string health_reason() const override;
  std::optional<std::string> fatal_error() const override { return std::nullopt; }
  void check_connectivity(int timeout_ms) override;
  void source_identified(const SourceIdentity& source) override;

  // One XADD to be.
  struct Entry : OwnedRecord {
    std::uint64_t epoch = 0;       // abort_queued() counts these: older ones are not sent
    std::string stream;
    std::string id;                // <ms>-<seq>; empty: after the stream's last entry
    // The source when it was submitted: a queue that outlives a reconnection
    // (to a promoted standby, another cluster) keeps the old one.
    std::shared_ptr<const std::string> source;
    bool reported = false;         // (redis_ack_at_submit) reported already
    bool dead_letter = false;      // a dead-letter copy: every stream's mark waits for it
  };
  enum class Outcome { stored, duplicate, transient, record_error, denied };
  struct Done {
    Entry entry;
    Outcome outcome = Outcome::stored;
    std::string code, message;
  };
  // What the loop and the worker share, under mu.
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Entry> queue;
    std::vector<Done> done;
    bool stop = false;
    bool wake_posted = false;
    std::uint64_t taken_back = 0;  // entries of epochs up to this one are failed, not sent
    bool connected = false;
    std::string last_error = "no Redis connection yet";
    RedisStreamsSink* sink = nullptr;
  };

 private:
  // (Worker only.) The connection, and what carries from one batch to the next.
  struct Worker {
    redisContext* ctx = nullptr;
    std::string sha;  // the append script's
    std::chrono::milliseconds backoff{0};
    std::uint64_t poisoned = 0;  // entries of epochs up to this one fail: one before them failed
    std::vector<Done> out;       // outcomes not yet handed to the loop
  };
  void run_worker();
  bool wait_for_work(Worker& w, std::unique_lock<std::mutex>& lock);
  void connection_lost_locked(const std::string& why);
  std::string take_batch_locked(std::vector<Entry>& batch);
  void send_or_fail(Worker& w, std::vector<Entry>& batch, const std::string& source, std::uint64_t taken_back);
  void send_batch(Worker& w, const std::string& source, std::vector<Entry>& batch, bool marks_may_move);
  bool load_script(Worker& w, std::vector<Entry>& batch);
  std::vector<std::string> append_args(const std::string& sha, const std::string& stream,
                                       const std::vector<std::size_t>& indexes, const std::vector<Entry>& batch,
                                       const std::string& source, bool marks_may_move);
  Done verdict(Entry& e, const redisReply* reply, std::size_t k, const std::string& stream, std::string& sha);
  void wait_for_replicas(Worker& w, std::vector<std::pair<std::size_t, Done>>& results);
  void report(Done& d);
  SubmitStatus enqueue(Entry e);

  boost::asio::io_context& io_;
  RedisConfig config_;
  std::shared_ptr<Shared> shared_;
  std::uint64_t epoch_ = 1;
  std::shared_ptr<const std::string> source_ = std::make_shared<const std::string>();  // system/timeline/database/slot
  std::size_t outstanding_ = 0;  // submitted, not yet reported
  std::vector<Done> scratch_;
  // (Worker only.) Streams where an entry was refused for good, and the
  // epoch then: their mark stays below it until the relay has taken back
  // what followed (a halt's drain still sends what was queued behind it).
  std::map<std::string, std::uint64_t> refused_in_;
  // (Worker only.) The epoch of a dead-letter copy that failed: no stream's
  // mark moves in it until the relay has taken it back. The copy's event
  // is missing from the stream it would have gone to, and which stream that
  // is may change with the mapping (a route fixed before a restart): a mark
  // past it there would make it "gone" - counted delivered, stored nowhere.
  std::optional<std::uint64_t> marks_held_in_;
  std::thread worker_;
};

}  // namespace walrelay
