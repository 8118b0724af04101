// The Kafka sink: an idempotent librdkafka producer, transactional with
// exactly.once.support=required, whose events (delivery reports, errors,
// statistics, logs) are all served on the relay's io_context thread.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <vector>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include "walrelay/sinks/sink.hpp"

struct rd_kafka_s;
struct rd_kafka_message_s;
struct rd_kafka_topic_s;
struct rd_kafka_queue_s;

namespace walrelay {

// exactly.once.support=required: the producer is transactional. A Kafka
// transaction holds whole source transactions and, in the offsets topic, the
// end LSN of the last of them.
struct KafkaTransactions {
  std::string transactional_id;   // stable per database and slot: a takeover fences the old producer
  std::string offsets_topic;      // offsets.storage.topic (compacted, one partition)
  int boundary_interval_ms = 100; // transaction.boundary.interval.ms (0: commit at every source transaction)
  long boundary_max_records = 10000;
};

// What an authorization error from the broker asks for, in the words of
// Kafka's ACLs (docs/operations.md, "Kafka permissions"): `code` is
// Delivery::error_code's form (topic_authorization_failed ...).
// The producer's settings a consumer shares (where the brokers are, how to
// authenticate): the offsets reader's and walrelay redrive's.
bool shared_with_consumer(const std::string& key);

std::string kafka_permission_hint(std::string_view code, std::string_view topic, std::string_view transactional_id);

class KafkaSink final : public Sink, public TransactionalSink {
 public:
  // settings: librdkafka properties (kafka.* without the prefix). Throws
  // ConfigError naming the kafka.* key librdkafka rejects.
  KafkaSink(boost::asio::io_context& io, const std::map<std::string, std::string>& settings,
            std::optional<KafkaTransactions> transactions = std::nullopt);
  ~KafkaSink() override;
  KafkaSink(const KafkaSink&) = delete;
  KafkaSink& operator=(const KafkaSink&) = delete;

  SubmitStatus submit(const OutboxRecord& record, std::uint64_t token) override;
  SubmitStatus submit_dead_letter(std::string_view reason, std::string_view topic,
                                  std::optional<std::string_view> key,
                                  std::optional<std::string_view> value,
                                  const std::vector<OutboxRecord::Header>& headers, std::uint64_t token,
                                  std::size_t bytes) override;
  void poll() override;
  void abort_queued() override;
  // Not ready until a broker has answered (probe_brokers()), so a broker
  // that refuses walrelay from the start is never reported healthy.
  bool healthy() const override { return brokers_up_ > 0; }
  std::string health_reason() const override { return last_error_; }
  std::optional<std::string> fatal_error() const override { return fatal_; }
  void check_connectivity(int timeout_ms) override;
  TransactionalSink* transactions() override { return transactions_ ? this : nullptr; }

  // Exactly-once (kafka_transactions.cpp).
  bool fenced() const override { return fenced_; }
  bool timed_out() const override { return timed_out_; }
  bool taken_over() const override { return initialised_; }
  boost::asio::awaitable<std::optional<CommittedPosition>> recover(const SourceIdentity& source) override;
  // Also while a transaction commits: what comes meanwhile waits in the
  // sink (within the relay's in-flight limits) for the next one.
  bool accepting() const override { return txn_state_ != TxnState::aborting; }
  bool settling() const override;
  void source_transaction_ended(pgoutput::Lsn end_lsn) override;
  std::optional<pgoutput::Lsn> confirm_limit() const override;
  bool commit_position(pgoutput::Lsn end_lsn) override;
  void stop_by(std::chrono::steady_clock::time_point deadline) override { stop_by_ = deadline; }
  void abandon_transaction() override;
  void commit_now() override;
  // The Kafka transaction's time-out (kafka.transaction.timeout.ms).
  std::chrono::milliseconds transaction_timeout() const override;
  boost::asio::awaitable<bool> renew(std::string_view why) override;
  // walrelay --reset-offsets: takes over the transactional producer (fencing
  // a running walrelay) and commits a tombstone for the position, so the
  // next start skips nothing. Returns the position it forgot, if any.
  boost::asio::awaitable<std::optional<CommittedPosition>> forget_position();

  // Tests: makes librdkafka raise a fatal error as the idempotent producer
  // would (rd_kafka_test_fatal_error); it arrives through the event queue.
  void raise_fatal_error_for_test(const char* reason);

  // Called from librdkafka callbacks (on the polling thread).
  void handle_delivery(const rd_kafka_message_s* message);
  void handle_error(int err, const char* reason);
  void handle_stats(const char* json, std::size_t len);

 private:
  void fail_fatally(std::string reason);
  // Whether a broker answers: a metadata request (it blocks, so on the
  // worker thread) when the producer starts, then every 10 s while one does
  // and every second while none does; librdkafka's _ALL_BROKERS_DOWN starts
  // one at once, and an acknowledged delivery says a broker is up. Reading
  // librdkafka's statistics once a second for this cost an idle walrelay a
  // third of its CPU (docs/benchmarks.md, "Idle CPU").
  void probe_brokers();
  void probe_now();
  void mark_brokers(int brokers);
  // A probe's wait for an answer: the destructor and a commit queued behind
  // it on the worker wait at most this long.
  static constexpr int probe_timeout_ms = 1000;
  // Dead-letter records are rare: they carry a heap Pending as their opaque.
  // Ordinary records carry (token << 1) | 1, so a delivery report tells them
  // apart by the low bit and the hot path allocates nothing of its own.
  struct Pending {
    std::uint64_t token;
    std::size_t bytes;
    std::string reason;  // why it is being dead-lettered
  };
  // Fills d's token and size from a record's opaque (record_bytes: key +
  // value, for ordinary records) and, for a dead-letter copy, its reason;
  // frees the heap Pending.
  static void settle_opaque(Delivery& d, Pending* opaque, std::size_t record_bytes);
  // Marks a failed delivery whose error is a missing permission, and names
  // the permission in its message.
  void note_denial(Delivery& d) const;
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // Creates rk_ and queue_ from settings_ and wires the queue to the wake-up pipe.
  void create_producer();
  void watch_queue();
  // Whether a (fatal) error means another producer took the transactional.id over.
  static bool is_fence(int err);
  // Sets fenced_ or timed_out_ for a fatal error `code` and returns what to
  // add to its message: a fence met by a transaction older than
  // transaction.timeout.ms is the coordinator's time-out, not a takeover.
  std::string classify_fatal(int code);
  // Whether a blocking transactional call should stop retrying: past the
  // shutdown's deadline.
  bool past_stop_deadline() const;
  // Waits on the loop, serving delivery reports, until librdkafka holds no
  // record (each acknowledged or failed) or a fatal error came: true. False
  // when the call must not be made: a stop's deadline passed, or the
  // producer of `generation` was replaced.
  boost::asio::awaitable<bool> settle_records(std::uint64_t generation);
  void warn_left_to_coordinator(pgoutput::Lsn end) const;
  // The time-out of one commit or abort call (librdkafka blocks that long).
  struct CallLimit {
    std::chrono::milliseconds transaction_timeout;
    std::optional<std::chrono::steady_clock::time_point> stop_by;
    int timeout_ms() const;  // computed when the call starts, on the worker
  };
  CallLimit transaction_call_limit() const;
  rd_kafka_topic_s* topic_handle(std::string_view topic);
  // reorder_key mutation (tests/mutation/run.sh) only.
  SubmitStatus submit_reordered(const OutboxRecord& record, Pending* opaque);
  void produce_held();
  SubmitStatus produce(std::string_view topic, std::optional<std::string_view> key,
                       std::optional<std::string_view> value, std::int64_t timestamp_ms,
                       const std::vector<OutboxRecord::Header>& headers, Pending* pending,
                       std::int32_t partition = -1);

  enum class TxnState {
    idle,        // no Kafka transaction open
    open,        // begun; records go into it
    committing,  // commit_transaction running on the worker
    aborting,    // abort_transaction running on the worker
  };
  // Runs a blocking librdkafka call on the worker thread; the coroutine
  // resumes on the loop. librdkafka's transactional calls block, and the
  // loop must go on serving delivery reports meanwhile.
  template <class F>
  boost::asio::awaitable<decltype(std::declval<F>()())> on_worker(F f);
  // Begins a Kafka transaction before the first record of one.
  bool ensure_transaction();
  // Commits the open transaction with its position (the offsets record).
  void start_commit();
  // Produces the offsets record, then commits (on a full queue, later).
  void produce_position();
  boost::asio::awaitable<void> commit();
  boost::asio::awaitable<void> abort(std::string reason);
  // Marks the open transaction aborting now (so nothing begins a commit
  // meanwhile) and aborts it on the worker.
  void start_abort(std::string reason);
  void arm_boundary();
  // At a source transaction's end: commits when the interval or the record
  // limit is reached, else arms the interval's timer.
  void commit_if_due();
  // What comes while a commit runs: librdkafka takes no record between
  // commit_transaction and the next begin_transaction, and stopping the read
  // loop for every commit cost a third of the throughput. Records, dead-letter
  // copies and source transaction ends keep their order in one queue, copied
  // into one buffer (no allocation per record once it has grown).
  struct Waiting {
    enum class Kind : std::uint8_t { record, end } kind;
    std::uint32_t topic = 0, key = 0, value = 0;  // offsets into waiting_bytes_
    std::uint32_t topic_len = 0, key_len = 0, value_len = 0;
    bool has_key = false, has_value = false;
    std::int32_t partition = -1;
    std::int64_t timestamp_ms = 0;
    std::uint32_t first_byte = 0;                     // waiting_bytes_.size() when it came
    std::uint32_t first_header = 0, header_count = 0;  // into waiting_headers_
    Pending* opaque = nullptr;
    pgoutput::Lsn end_lsn;                           // Kind::end
    std::chrono::steady_clock::time_point since;     // when it came
  };
  struct WaitingHeader {
    std::uint32_t name = 0, name_len = 0, value = 0, value_len = 0;  // the name is stored NUL-terminated
    bool has_value = false;
  };
  // The headers of a waiting record, as views into `bytes`.
  static void waiting_headers_of(const Waiting& e, const std::string& bytes,
                                 const std::vector<WaitingHeader>& headers, std::vector<OutboxRecord::Header>& out);
  // Whether a record must wait instead of going into the open transaction.
  bool must_wait() const;
  // False when the buffer cannot take it (offsets are 32 bits): try again later.
  bool wait_record(std::string_view topic, std::optional<std::string_view> key, std::optional<std::string_view> value,
                   std::int64_t timestamp_ms, const std::vector<OutboxRecord::Header>& headers, Pending* opaque,
                   std::int32_t partition);
  // After a commit: produces what waited into the next transaction, in
  // order, until an end makes a commit due again.
  void produce_waiting();
  // Reports every waiting record as a transient failure (an abort: the
  // relay replays from the committed position) and empties the queue.
  void fail_waiting(const std::string& why);
  // Empties the queue without reports (a new producer, a fresh ledger).
  void forget_waiting();

  boost::asio::io_context& io_;
  std::map<std::string, std::string> settings_;  // as given: the offsets consumer shares some
  rd_kafka_s* rk_ = nullptr;
  rd_kafka_queue_s* queue_ = nullptr;            // the main queue: every event walrelay serves
  bool repoll_posted_ = false;                   // a poll() is queued to serve what is left
  int wake_pipe_[2] = {-1, -1};                  // librdkafka writes here when its queue has events
  boost::asio::posix::stream_descriptor wake_;   // watches wake_pipe_[0]
  int brokers_up_ = 0;
  bool seen_up_ = false;                         // a broker has been up since start
  std::string last_error_ = "no broker connection yet";
  std::optional<std::string> fatal_;
  bool fenced_ = false;
  bool timed_out_ = false;
  std::optional<std::chrono::steady_clock::time_point> stop_by_;
  // One handle per topic, created on first use. rd_kafka_topic_new asks the
  // broker for a new topic's metadata at once; producing by name would leave
  // it to librdkafka's 1 s topic scan, and the first records would wait.
  std::unordered_map<std::string, rd_kafka_topic_s*, NameHash, std::equal_to<>> topics_;
  static constexpr std::size_t max_topic_handles = 4096;
  // State of the mutation builds (tests/mutation/run.sh); unused otherwise.
  struct Held {
    std::string topic;
    std::optional<std::string> key, value;
    std::int64_t timestamp_ms;
    std::vector<std::pair<std::string, std::optional<std::string>>> headers;
    Pending* opaque;
    std::chrono::steady_clock::time_point since;
  };
  std::optional<Held> held_;
  std::uint64_t mutation_count_ = 0;

  // Exactly-once state, all on the loop thread.
  std::optional<KafkaTransactions> transactions_;
  std::optional<SourceIdentity> source_;          // written beside each position
  bool recovered_ = false;                        // init_transactions done, position read
  bool initialised_ = false;                      // init_transactions done on this producer
  std::uint64_t generation_ = 0;                  // bumped by renew(): the old producer's calls end quietly
  std::optional<CommittedPosition> committed_;    // what the last commit (or the offsets topic) holds
  TxnState txn_state_ = TxnState::idle;
  std::chrono::steady_clock::time_point txn_began_;   // the boundary interval counts from here
  std::chrono::steady_clock::time_point txn_opened_;  // begin_transaction: the coordinator's time-out counts from about here
  long txn_records_ = 0;                          // records submitted into the open transaction
  bool txn_partial_ = false;                      // records of a source transaction not yet ended
  std::optional<pgoutput::Lsn> txn_end_;          // end of the last source transaction in the open one
  boost::asio::steady_timer boundary_timer_;      // the interval's end, while a transaction waits for it
  bool boundary_armed_ = false;
  std::vector<Waiting> waiting_;
  std::vector<WaitingHeader> waiting_headers_;
  std::string waiting_bytes_;
  std::size_t waiting_next_ = 0;                  // the first entry not produced yet
  bool producing_waiting_ = false;                // inside produce_waiting(): a dead-letter copy goes in at once
  std::vector<OutboxRecord::Header> waiting_scratch_;
  boost::asio::steady_timer waiting_retry_;       // the producer's queue was full while producing what waited
  bool waiting_retry_armed_ = false;
  boost::asio::steady_timer position_retry_;      // the producer's queue was full for the offsets record
  boost::asio::steady_timer probe_retry_;         // the next probe_brokers()
  bool probe_in_flight_ = false;                  // a probe is on the worker
  bool probe_waiting_ = false;                    // probe_retry_ is armed
  std::uint64_t down_epoch_ = 0;                  // _ALL_BROKERS_DOWN reports so far
  int probe_misses_ = 0;                          // probes in a row no broker answered
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // false once destroyed: for the worker's replies
  boost::asio::thread_pool worker_{1};            // the blocking calls: transactional ones, the broker probe
};

}  // namespace walrelay
