// Exactly-once into Kafka: the transactional side of KafkaSink.
//
// A Kafka transaction holds whole source transactions only, and, as its last
// record, one record in the compacted offsets topic with the end LSN of the
// last of them. The position travels in the same transaction as the events,
// so it is visible exactly when they are. At start, init_transactions fences
// any older producer with the same transactional.id (a zombie can never
// commit again) and aborts its open transaction; then the last committed
// position is read back, and the relay drops every source transaction at or
// below it. The slot is confirmed to the committed position and never past
// it: acknowledged records of an open or aborted transaction are not in Kafka
// for a read_committed consumer. With no event to commit, a transaction that
// holds only the position lets the slot follow the server.
#include <spdlog/spdlog.h>

#include <librdkafka/rdkafka.h>
#include <nlohmann/json.hpp>

#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <utility>

#include "walrelay/json.hpp"
#include "walrelay/sinks/kafka/kafka_sink.hpp"
#include "walrelay/mutation.hpp"

namespace walrelay {
namespace asio = boost::asio;
using pgoutput::Lsn;

bool shared_with_consumer(const std::string& key) {
  return key == "bootstrap.servers" || key == "client.id" || key.rfind("security.", 0) == 0 ||
         key.rfind("sasl.", 0) == 0 || key.rfind("ssl.", 0) == 0 || key == "broker.address.family";
}

namespace {

// The outcome of a transactional call, taken apart on the worker (the error
// object is freed there).
struct TxnResult {
  bool ok = true;
  bool retriable = false;
  bool requires_abort = false;
  bool fatal = false;
  int code = 0;  // rd_kafka_resp_err_t
  std::string message;
};

TxnResult result_of(rd_kafka_error_t* error) {
  TxnResult r;
  if (!error) return r;
  r.ok = false;
  r.retriable = rd_kafka_error_is_retriable(error);
  r.requires_abort = rd_kafka_error_txn_requires_abort(error);
  r.fatal = rd_kafka_error_is_fatal(error);
  r.code = rd_kafka_error_code(error);
  r.message = std::string(rd_kafka_error_name(error)) + ": " + rd_kafka_error_string(error);
  rd_kafka_error_destroy(error);
  return r;
}

// The offsets record's value: the position and where it was read.
std::string position_json(const CommittedPosition& p, const SourceIdentity& s) {
  Json doc = Json::object();
  doc["end_lsn"] = p.end_lsn.to_string();
  doc["system_identifier"] = s.system;
  doc["timeline"] = s.timeline;
  doc["database"] = s.database;
  doc["slot"] = s.slot;
  return to_json_text(doc);
}


// Whether the cluster knows `topic`, asked without creating it.
// A producer's metadata request for one topic lets the broker auto-create
// it (uncompacted): the list of all topics does not. Once per start.
bool topic_exists(rd_kafka_t* rk, const std::string& topic) {
  const rd_kafka_metadata_t* md = nullptr;
  bool exists = false;
  if (rd_kafka_metadata(rk, 1, nullptr, &md, 30000) == RD_KAFKA_RESP_ERR_NO_ERROR)
    for (int i = 0; i < md->topic_cnt && !exists; ++i)
      exists = topic == md->topics[i].topic && md->topics[i].err == RD_KAFKA_RESP_ERR_NO_ERROR &&
               md->topics[i].partition_cnt > 0;
  if (md) rd_kafka_metadata_destroy(md);
  return exists;
}

// Creates the offsets topic (compacted, one partition) unless it exists: a
// topic made by an operator (say, where walrelay may not create topics) is
// used as it is. Runs on the worker.
void create_offsets_topic(rd_kafka_t* rk, const std::string& topic) {
  if (topic_exists(rk, topic)) return;
  char err[512];
  rd_kafka_NewTopic_t* t = rd_kafka_NewTopic_new(topic.c_str(), 1, -1, err, sizeof err);
  if (!t) throw std::runtime_error("offsets.storage.topic: " + std::string(err));
  rd_kafka_NewTopic_set_config(t, "cleanup.policy", "compact");
  // Compaction never touches the active segment, and a start reads the topic
  // to its end: without a roll, a week of commits (segment.ms's default)
  // would be read at every start.
  rd_kafka_NewTopic_set_config(t, "segment.ms", "600000");
  rd_kafka_queue_t* q = rd_kafka_queue_new(rk);
  rd_kafka_CreateTopics(rk, &t, 1, nullptr, q);
  rd_kafka_event_t* ev = rd_kafka_queue_poll(q, 30000);
  std::string problem;
  if (!ev) {
    problem = "no answer within 30 s";
  } else if (rd_kafka_event_error(ev)) {
    problem = rd_kafka_event_error_string(ev);
  } else if (auto* res = rd_kafka_event_CreateTopics_result(ev)) {
    size_t n = 0;
    const rd_kafka_topic_result_t** results = rd_kafka_CreateTopics_result_topics(res, &n);
    for (size_t i = 0; i < n; ++i) {
      auto code = rd_kafka_topic_result_error(results[i]);
      if (code && code != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
        problem = rd_kafka_topic_result_error_string(results[i]);
    }
  }
  if (ev) rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(q);
  rd_kafka_NewTopic_destroy(t);
  if (!problem.empty())
    throw std::runtime_error("could not create offsets.storage.topic " + topic + ": " + problem +
                             " (walrelay's Kafka principal needs CREATE on topic " + topic +
                             ", or create it beforehand: compacted, one partition)");
}

// The offsets reader's consumer group: librdkafka requires one and looks
// its coordinator up, so the principal needs READ on it (docs/operations.md).
constexpr const char* offsets_reader_group = "walrelay-offsets-reader";

// A consumer closed and destroyed with its owner.
using OffsetsConsumer = std::unique_ptr<rd_kafka_t, void (*)(rd_kafka_t*)>;

// The consumer that reads the offsets topic: the producer's connection
// settings, committed records only, and the end of each partition reported.
OffsetsConsumer open_offsets_consumer(const std::map<std::string, std::string>& settings) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  auto set = [&](const char* k, const std::string& v) {
    if (rd_kafka_conf_set(conf, k, v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK)
      throw std::runtime_error(std::string("offsets consumer: ") + k + ": " + err);
  };
  for (auto& [k, v] : settings)
    if (shared_with_consumer(k)) set(k.c_str(), v);
  set("group.id", offsets_reader_group);  // required by librdkafka; no offsets are ever committed
  set("enable.auto.commit", "false");
  set("isolation.level", "read_committed");
  set("enable.partition.eof", "true");
  // The end is found when a fetch comes back empty; the broker holds an
  // empty fetch for fetch.wait.max.ms (500 ms by default), all of it added
  // to every exactly-once start.
  set("fetch.wait.max.ms", "10");
  set("log.queue", "true");  // never served: this consumer's logs stay off the loop's sinks
  rd_kafka_t* consumer = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (!consumer) {
    rd_kafka_conf_destroy(conf);
    throw std::runtime_error(std::string("could not create the offsets consumer: ") + err);
  }
  return OffsetsConsumer(consumer, [](rd_kafka_t* c) {
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
  });
}

// walrelay writes partition 0; a topic made by hand (or by auto-creation)
// may have more, and every partition is read: all are assigned from their
// beginning. Returns how many there are.
int assign_offsets_partitions(rd_kafka_t* consumer, const std::string& topic) {
  int partitions = 1;
  {
    rd_kafka_topic_t* rkt = rd_kafka_topic_new(consumer, topic.c_str(), nullptr);
    const rd_kafka_metadata_t* md = nullptr;
    if (rkt && rd_kafka_metadata(consumer, 0, rkt, &md, 30000) == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1)
      partitions = std::max(1, md->topics[0].partition_cnt);
    if (md) rd_kafka_metadata_destroy(md);
    if (rkt) rd_kafka_topic_destroy(rkt);
  }
  rd_kafka_topic_partition_list_t* parts = rd_kafka_topic_partition_list_new(partitions);
  for (int p = 0; p < partitions; ++p)
    rd_kafka_topic_partition_list_add(parts, topic.c_str(), p)->offset = RD_KAFKA_OFFSET_BEGINNING;
  auto assigned = rd_kafka_assign(consumer, parts);
  rd_kafka_topic_partition_list_destroy(parts);
  if (assigned) throw std::runtime_error(std::string("could not read the offsets topic: ") + rd_kafka_err2str(assigned));
  return partitions;
}

// The last record for a key in one partition of the offsets topic.
struct LastRecord {
  std::optional<std::string> value;  // nullopt: a tombstone (walrelay --reset-offsets)
  std::int64_t timestamp = -1;
};

// Per partition, the last record for `key` in offset order is the one in
// force (a timestamp is the producer's clock, which may go back): read
// every assigned partition to its end.
std::map<std::int32_t, LastRecord> read_last_records(rd_kafka_t* consumer, const std::string& topic,
                                                     const std::string& key, int partitions) {
  std::map<std::int32_t, LastRecord> last_of;
  int at_end = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (at_end < partitions) {
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("could not read the offsets topic " + topic + " to its end within 60 s");
    rd_kafka_message_t* m = rd_kafka_consumer_poll(consumer, 500);
    if (!m) continue;
    std::unique_ptr<rd_kafka_message_t, void (*)(rd_kafka_message_t*)> msg(m, rd_kafka_message_destroy);
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
      ++at_end;
      continue;
    }
    if (m->err) {
      if (m->err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC || m->err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) continue;
      throw std::runtime_error(
          "could not read the offsets topic " + topic + ": " + rd_kafka_message_errstr(m) +
          (m->err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED
               ? " (walrelay's Kafka principal needs READ on topic " + topic + ")"
           : m->err == RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED
               ? std::string(" (walrelay's Kafka principal needs READ on group ") + offsets_reader_group +
                     "; the reader commits no offsets)"
               : std::string()));
    }
    if (m->key && std::string_view(static_cast<const char*>(m->key), m->key_len) == key) {
      LastRecord& l = last_of[m->partition];
      l.value = m->payload ? std::optional<std::string>(std::string(static_cast<const char*>(m->payload), m->len))
                           : std::nullopt;
      l.timestamp = rd_kafka_message_timestamp(m, nullptr);
    }
  }
  return last_of;
}

// A committed position as the offsets topic holds it (JSON), read.
CommittedPosition parse_position(const std::string& topic, const std::string& key, const std::string& last) {
  auto doc = Json::parse(last, nullptr, false);
  if (doc.is_discarded() || !doc.contains("end_lsn"))
    throw std::runtime_error("the offsets topic " + topic + " holds an unreadable position for " + key + ": " + last);
  CommittedPosition p;
  auto lsn = Lsn::parse(doc["end_lsn"].get<std::string>());
  if (!lsn) throw std::runtime_error("the offsets topic " + topic + " holds an unreadable LSN for " + key);
  p.end_lsn = *lsn;
  p.system = doc.value("system_identifier", "");
  p.timeline = doc.value("timeline", "");
  return p;
}

// The last position committed for `key` in the offsets topic, read with
// isolation.level=read_committed from the start to the end. Runs on the worker.
std::optional<CommittedPosition> read_position(const std::map<std::string, std::string>& settings,
                                               const std::string& topic, const std::string& key) {
  OffsetsConsumer consumer = open_offsets_consumer(settings);
  const int partitions = assign_offsets_partitions(consumer.get(), topic);
  const auto last_of = read_last_records(consumer.get(), topic, key, partitions);
  // Across partitions, which only a topic made by hand has, the newest wins.
  const LastRecord* newest = nullptr;
  for (auto& [partition, l] : last_of)
    if (!newest || l.timestamp > newest->timestamp) newest = &l;
  if (!newest || !newest->value) return std::nullopt;
  return parse_position(topic, key, *newest->value);
}

}  // namespace

template <class F>
asio::awaitable<decltype(std::declval<F>()())> KafkaSink::on_worker(F f) {
  using R = decltype(f());
  // A timer that never expires, cancelled from the worker's completion on
  // the loop: the coroutine resumes on the loop thread.
  asio::steady_timer done(io_, std::chrono::steady_clock::time_point::max());
  std::optional<R> result;
  std::exception_ptr failure;
  asio::post(worker_, [&] {
    try {
      result.emplace(f());
    } catch (...) {
      failure = std::current_exception();
    }
    asio::post(io_, [&] { done.cancel(); });
  });
  boost::system::error_code ec;
  co_await done.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  if (failure) std::rethrow_exception(failure);
  co_return std::move(*result);
}

asio::awaitable<std::optional<CommittedPosition>> KafkaSink::recover(const SourceIdentity& source) {
  source_ = source;
  if (!recovered_) {
    const auto& t = *transactions_;
    spdlog::info("kafka: exactly once: taking over transactional.id {} (an older producer with it is fenced)",
                 t.transactional_id);
    // Once per producer: a second call is refused (_STATE), and the position
    // may have failed to load after a first one that succeeded.
    TxnResult init;
    if (!initialised_) init = co_await on_worker([rk = rk_] { return result_of(rd_kafka_init_transactions(rk, -1)); });
    if (init.ok) initialised_ = true;
    if (!init.ok) {
      std::string hint;
      if (init.code == RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED ||
          init.code == RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED)
        hint = " (" + kafka_permission_hint(init.code == RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED
                                                ? "cluster_authorization_failed"
                                                : "transactional_id_authorization_failed",
                                            "", t.transactional_id) + ")";
      throw std::runtime_error("could not initialise Kafka transactions: " + init.message + hint);
    }
    // The callables capture `this` only: settings_ and transactions_ do not
    // change after construction, and g++ 12 destroys a coroutine argument's
    // captured strings twice.
    co_await on_worker([this] {
      create_offsets_topic(rk_, transactions_->offsets_topic);
      return true;
    });
    committed_ = co_await on_worker([this] {
      return read_position(settings_, transactions_->offsets_topic, transactions_->transactional_id);
    });
    recovered_ = true;
    if (committed_)
      spdlog::info("kafka: exactly once: committed position {} (system identifier {}) in {}",
                   committed_->end_lsn.to_string(), committed_->system, t.offsets_topic);
    else
      spdlog::info("kafka: exactly once: no committed position in {} yet", t.offsets_topic);
  }
  co_return committed_;
}

bool KafkaSink::ensure_transaction() {
  if (txn_state_ == TxnState::open) return true;
  if (txn_state_ != TxnState::idle || fatal_ || !recovered_) return false;
  TxnResult r = result_of(rd_kafka_begin_transaction(rk_));
  if (!r.ok) {
    fail_fatally("could not begin a Kafka transaction: " + r.message);
    return false;
  }
  txn_state_ = TxnState::open;
  txn_began_ = txn_opened_ = std::chrono::steady_clock::now();
  txn_records_ = 0;
  txn_end_.reset();
  return true;
}

void KafkaSink::source_transaction_ended(Lsn end_lsn) {
  if (!transactions_) return;
  if (producing_waiting_) {
    // produce_waiting() decides once, after the last of them, whether a
    // commit is due: deciding at each would commit one source transaction
    // at a time (every waiting one is older than the interval).
    if (txn_state_ == TxnState::open) {
      txn_end_ = end_lsn;
      txn_partial_ = false;
    }
    return;
  }
  if (must_wait()) {
    Waiting e{};
    e.kind = Waiting::Kind::end;
    e.end_lsn = end_lsn;
    e.first_byte = static_cast<std::uint32_t>(waiting_bytes_.size());
    e.first_header = static_cast<std::uint32_t>(waiting_headers_.size());
    e.since = std::chrono::steady_clock::now();
    waiting_.push_back(e);
    return;
  }
  if (txn_state_ != TxnState::open) return;
  txn_end_ = end_lsn;
  txn_partial_ = false;
  commit_if_due();
}

void KafkaSink::commit_if_due() {
  const auto& t = *transactions_;
  bool due = std::chrono::steady_clock::now() - txn_began_ >= std::chrono::milliseconds(t.boundary_interval_ms) ||
             txn_records_ >= t.boundary_max_records;
  if (due) start_commit();
  else arm_boundary();
}

bool KafkaSink::must_wait() const {
  // Inside produce_waiting() the open transaction takes records at once: a
  // dead-letter copy made there must go in before the end that follows it.
  if (producing_waiting_) return false;
  return txn_state_ == TxnState::committing || waiting_next_ < waiting_.size();
}

bool KafkaSink::wait_record(std::string_view topic, std::optional<std::string_view> key,
                            std::optional<std::string_view> value, std::int64_t timestamp_ms,
                            const std::vector<OutboxRecord::Header>& headers, Pending* opaque,
                            std::int32_t partition) {
  std::size_t need = topic.size() + (key ? key->size() : 0) + (value ? value->size() : 0);
  for (const auto& h : headers) need += h.name.size() + 1 + (h.value ? h.value->size() : 0);
  if (waiting_bytes_.size() + need > std::numeric_limits<std::uint32_t>::max()) return false;
  auto append = [&](std::string_view v) {
    auto at = static_cast<std::uint32_t>(waiting_bytes_.size());
    waiting_bytes_.append(v);
    return at;
  };
  Waiting e{};
  e.kind = Waiting::Kind::record;
  e.first_byte = static_cast<std::uint32_t>(waiting_bytes_.size());
  e.first_header = static_cast<std::uint32_t>(waiting_headers_.size());
  e.topic = append(topic);
  e.topic_len = static_cast<std::uint32_t>(topic.size());
  if ((e.has_key = key.has_value())) {
    e.key = append(*key);
    e.key_len = static_cast<std::uint32_t>(key->size());
  }
  if ((e.has_value = value.has_value())) {
    e.value = append(*value);
    e.value_len = static_cast<std::uint32_t>(value->size());
  }
  for (const auto& h : headers) {
    WaitingHeader wh;
    wh.name = append(h.name);
    wh.name_len = static_cast<std::uint32_t>(h.name.size());
    waiting_bytes_.push_back('\0');  // librdkafka takes the name as a C string
    if ((wh.has_value = h.value.has_value())) {
      wh.value = append(*h.value);
      wh.value_len = static_cast<std::uint32_t>(h.value->size());
    }
    waiting_headers_.push_back(wh);
  }
  e.header_count = static_cast<std::uint32_t>(headers.size());
  e.timestamp_ms = timestamp_ms;
  e.partition = partition;
  e.opaque = opaque;
  e.since = std::chrono::steady_clock::now();
  waiting_.push_back(e);
  return true;
}

void KafkaSink::produce_waiting() {
  producing_waiting_ = true;
  bool queue_full = false;
  while (waiting_next_ < waiting_.size()) {
    if (txn_state_ != TxnState::idle && txn_state_ != TxnState::open) break;
    const Waiting e = waiting_[waiting_next_];
    if (e.kind == Waiting::Kind::end) {
      ++waiting_next_;
      source_transaction_ended(e.end_lsn);
      continue;
    }
    if (!ensure_transaction()) break;  // fatal_ is set: the relay halts or renews the producer
    // The boundary interval counts from the first record's arrival, not
    // from the commit that kept it waiting.
    if (e.since < txn_began_) txn_began_ = e.since;
    auto at = [this](std::uint32_t offset, std::uint32_t len) {
      return std::string_view(waiting_bytes_.data() + offset, len);
    };
    waiting_headers_of(e, waiting_bytes_, waiting_headers_, waiting_scratch_);
    ++waiting_next_;
    ++txn_records_;
    txn_partial_ = true;
    auto status = produce(at(e.topic, e.topic_len), e.has_key ? std::optional(at(e.key, e.key_len)) : std::nullopt,
                          e.has_value ? std::optional(at(e.value, e.value_len)) : std::nullopt, e.timestamp_ms,
                          waiting_scratch_, e.opaque, e.partition);
    if (status == SubmitStatus::queue_full) {
      --waiting_next_;
      --txn_records_;
      queue_full = true;
      break;
    }
  }
  producing_waiting_ = false;
  // Whole source transactions in: commit now if the interval (counted from
  // the first record's arrival) or the record limit says so, else at the
  // interval's end.
  if (txn_state_ == TxnState::open && !txn_partial_ && txn_end_) commit_if_due();
  if (waiting_next_ >= waiting_.size()) {
    waiting_.clear();  // capacity kept: the next commit's arrivals reuse it
    waiting_headers_.clear();
    waiting_bytes_.clear();
    waiting_next_ = 0;
  } else if (waiting_next_ > 0) {
    // Keep only what is left, so the buffer never outgrows what waits.
    const std::uint32_t bytes = waiting_[waiting_next_].first_byte;
    const std::uint32_t headers = waiting_[waiting_next_].first_header;
    waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(waiting_next_));
    waiting_headers_.erase(waiting_headers_.begin(), waiting_headers_.begin() + headers);
    waiting_bytes_.erase(0, bytes);
    waiting_next_ = 0;
    for (auto& e : waiting_) {
      e.first_byte -= bytes;
      e.first_header -= headers;
      if (e.kind == Waiting::Kind::record) {
        e.topic -= bytes;
        if (e.has_key) e.key -= bytes;
        if (e.has_value) e.value -= bytes;
      }
    }
    for (auto& h : waiting_headers_) {
      h.name -= bytes;
      if (h.has_value) h.value -= bytes;
    }
  }
  if (queue_full && !waiting_retry_armed_) {
    // librdkafka's own queue is full (its limits below walrelay's in-flight
    // ones): try again once some deliveries have been served.
    waiting_retry_armed_ = true;
    waiting_retry_.expires_after(std::chrono::milliseconds(5));
    waiting_retry_.async_wait([this](boost::system::error_code ec) {
      waiting_retry_armed_ = false;
      if (ec) return;
      poll();
      if (txn_state_ == TxnState::idle || txn_state_ == TxnState::open) produce_waiting();
    });
  }
}

void KafkaSink::waiting_headers_of(const Waiting& e, const std::string& bytes,
                                   const std::vector<WaitingHeader>& headers,
                                   std::vector<OutboxRecord::Header>& out) {
  auto at = [&](std::uint32_t offset, std::uint32_t len) { return std::string_view(bytes.data() + offset, len); };
  out.clear();
  for (std::uint32_t i = 0; i < e.header_count; ++i) {
    const WaitingHeader& h = headers[e.first_header + i];
    out.push_back({at(h.name, h.name_len),
                   h.has_value ? std::optional<std::string_view>(at(h.value, h.value_len)) : std::nullopt});
  }
}

void KafkaSink::fail_waiting(const std::string& why) {
  // Taken out first: a report can make the relay abandon the transaction,
  // which comes back here.
  std::vector<Waiting> entries;
  std::vector<WaitingHeader> headers;
  std::string bytes;
  entries.swap(waiting_);
  headers.swap(waiting_headers_);
  bytes.swap(waiting_bytes_);
  const std::size_t next = std::exchange(waiting_next_, 0);
  auto at = [&](std::uint32_t offset, std::uint32_t len) { return std::string_view(bytes.data() + offset, len); };
  for (std::size_t i = next; i < entries.size(); ++i) {
    const Waiting& e = entries[i];
    if (e.kind != Waiting::Kind::record) continue;
    Delivery d;
    d.ok = false;
    d.transient = true;
    d.error_code = "transaction_aborted";
    d.error_message = why;
    d.topic = at(e.topic, e.topic_len);
    if (e.has_key) d.key = at(e.key, e.key_len);
    if (e.has_value) d.value = at(e.value, e.value_len);
    waiting_headers_of(e, bytes, headers, d.headers);
    settle_opaque(d, e.opaque, std::size_t{e.key_len} + e.value_len);
    if (on_delivery_) on_delivery_(d);
  }
}

void KafkaSink::forget_waiting() {
  for (std::size_t i = waiting_next_; i < waiting_.size(); ++i)
    if (waiting_[i].kind == Waiting::Kind::record && !(reinterpret_cast<std::uintptr_t>(waiting_[i].opaque) & 1))
      delete waiting_[i].opaque;
  waiting_.clear();
  waiting_headers_.clear();
  waiting_bytes_.clear();
  waiting_next_ = 0;
}

bool KafkaSink::settling() const {
  if (!transactions_) return false;
  return txn_state_ == TxnState::committing || txn_state_ == TxnState::aborting || waiting_next_ < waiting_.size() ||
         (txn_state_ == TxnState::open && !txn_partial_ && txn_end_);
}

void KafkaSink::arm_boundary() {
  if (boundary_armed_) return;
  boundary_armed_ = true;
  boundary_timer_.expires_at(txn_began_ + std::chrono::milliseconds(transactions_->boundary_interval_ms));
  boundary_timer_.async_wait([this](boost::system::error_code ec) {
    boundary_armed_ = false;
    if (ec) return;
    // Only at a source transaction's end: a Kafka transaction holds whole
    // ones. Otherwise the end of the one being read commits it.
    if (txn_state_ == TxnState::open && !txn_partial_ && txn_end_) start_commit();
  });
}

void KafkaSink::start_commit() {
  txn_state_ = TxnState::committing;
  boundary_timer_.cancel();
  produce_position();
}

void KafkaSink::produce_position() {
  // The position, last in the transaction: visible exactly when the events are.
  CommittedPosition p{*txn_end_, source_ ? source_->system : "", source_ ? source_->timeline : ""};
  std::string value = position_json(p, source_.value_or(SourceIdentity{}));
  const std::string& key = transactions_->transactional_id;
  rd_kafka_resp_err_t err = rd_kafka_producev(
      rk_, RD_KAFKA_V_TOPIC(transactions_->offsets_topic.c_str()), RD_KAFKA_V_PARTITION(0),
      RD_KAFKA_V_KEY(key.data(), key.size()), RD_KAFKA_V_VALUE(value.data(), value.size()),
      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(nullptr), RD_KAFKA_V_END);
  if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
    // librdkafka's queue is full (its limits below walrelay's in-flight
    // ones): not a reason to abort. Try again once some deliveries have
    // been served; what comes meanwhile waits, as during the commit.
    position_retry_.expires_after(std::chrono::milliseconds(5));
    position_retry_.async_wait([this, generation = generation_](boost::system::error_code ec) {
      if (ec || generation != generation_ || txn_state_ != TxnState::committing) return;
      poll();
      produce_position();
    });
    return;
  }
  if (err) {
    start_abort(std::string("could not write the position to the offsets topic: ") + rd_kafka_err2str(err));
    return;
  }
  asio::co_spawn(io_, commit(), asio::detached);
}

asio::awaitable<void> KafkaSink::commit() {
  const Lsn end = *txn_end_;
  const auto generation = generation_;
  for (;;) {
    // One call for the whole transaction time, not a second at a time: a
    // call that times out leaves librdkafka's intermediate results behind
    // (one per phase of the call, untagged), and the next API call can take
    // one as its own; a begin_transaction() that did nothing then returned
    // success (CI run 14: "Producing not allowed in transactional state
    // Ready"). The records are settled first, on the loop, so that the call
    // waits for EndTxn alone: a fatal error ends that wait, and would not
    // end the flush inside the call.
    if (!co_await settle_records(generation)) {
      if (generation == generation_) warn_left_to_coordinator(end);
      co_return;
    }
    TxnResult r = co_await on_worker([rk = rk_, limit = transaction_call_limit()] {
      return result_of(rd_kafka_commit_transaction(rk, limit.timeout_ms()));
    });
    if (generation != generation_) co_return;  // that producer is gone
    if (r.ok) break;
    if (r.retriable && r.code == RD_KAFKA_RESP_ERR__TIMED_OUT) {
      // Never resumed (see above). Stopping: the coordinator ends it. Else
      // the coordinator has aborted a transaction that old by now: a new
      // producer sends it again from the committed position, which it reads
      // once the coordinator has ended this one either way.
      if (stop_by_) {
        warn_left_to_coordinator(end);
        co_return;
      }
      timed_out_ = true;
      fail_fatally(fmt::format("the commit of the Kafka transaction up to {} had no answer within "
                               "kafka.transaction.timeout.ms={} ms",
                               end.to_string(), transaction_timeout().count()));
      co_return;
    }
    if (r.retriable) {
      spdlog::warn("kafka: committing a transaction: {}; trying again", r.message);
      continue;
    }
    if (r.requires_abort) {
      co_await abort("the Kafka transaction could not commit: " + r.message);
      co_return;
    }
    char why[256];
    auto cause = r.code == RD_KAFKA_RESP_ERR__FATAL ? rd_kafka_fatal_error(rk_, why, sizeof why) : r.code;
    fail_fatally("could not commit a Kafka transaction: " + r.message + classify_fatal(cause));
    co_return;
  }
  committed_ = CommittedPosition{end, source_ ? source_->system : "", source_ ? source_->timeline : ""};
  txn_state_ = TxnState::idle;
  txn_end_.reset();
  spdlog::debug("kafka: transaction committed up to {} ({} records)", end.to_string(), txn_records_);
  txn_records_ = 0;
  // What came meanwhile goes into the next transaction now (before the
  // relay hears of the commit, so its confirm limit already counts it).
  produce_waiting();
  if (on_committed_) on_committed_(end);
}

asio::awaitable<void> KafkaSink::abort(std::string reason) {
  txn_state_ = TxnState::aborting;
  const auto generation = generation_;
  spdlog::error("kafka: {}; aborting the transaction", reason);
  // What is still queued goes with the transaction: waiting for it to be
  // sent could wait for ever (a partition without a leader, records retried
  // for ever). What is on the wire is answered, or times out, on the loop,
  // as in commit(). (This purge does not move the producer's sequence base
  // as abort_transaction's own does: no matter, for the relay replays after
  // every abort, and every replay's session replaces the producer.)
  abort_queued();
  for (;;) {
    if (!co_await settle_records(generation)) {
      if (generation == generation_)
        spdlog::warn("kafka: the aborted Kafka transaction had not ended by shutdown.timeout.ms; left to its "
                     "coordinator");
      co_return;
    }
    TxnResult r = co_await on_worker([rk = rk_, limit = transaction_call_limit()] {  // one call: see commit()
      return result_of(rd_kafka_abort_transaction(rk, limit.timeout_ms()));
    });
    if (generation != generation_) co_return;
    if (r.ok) break;
    if (r.retriable && (r.code == RD_KAFKA_RESP_ERR__TIMED_OUT || stop_by_)) {
      // Never resumed (see commit()): stopping, the coordinator ends it; else
      // a new producer takes over, which the coordinator's end of this
      // transaction lets in.
      if (stop_by_) {
        spdlog::warn("kafka: the aborted Kafka transaction had not ended by shutdown.timeout.ms; left to its "
                     "coordinator");
        co_return;
      }
      fail_fatally("the abort of a Kafka transaction had no answer within kafka.transaction.timeout.ms=" +
                   std::to_string(transaction_timeout().count()) + " ms");
      co_return;
    }
    if (r.retriable) continue;
    char why[256];
    auto cause = r.code == RD_KAFKA_RESP_ERR__FATAL ? rd_kafka_fatal_error(rk_, why, sizeof why) : r.code;
    fail_fatally("could not abort a Kafka transaction: " + r.message + classify_fatal(cause));
    co_return;
  }
  txn_state_ = TxnState::idle;
  txn_end_.reset();
  txn_partial_ = false;
  if (on_aborted_) on_aborted_(reason);
  // What waited for the aborted commit is sent again by the replay.
  fail_waiting("held back while a Kafka transaction that was then aborted committed (" + reason + ")");
}

asio::awaitable<bool> KafkaSink::settle_records(std::uint64_t generation) {
  asio::steady_timer tick(io_);
  // rd_kafka_flush(rk, 0): whether a record is still unsettled, without
  // waiting and without serving the queue (event mode); it counts records
  // only, not the log and statistics events rd_kafka_outq_len() counts too.
  while (rd_kafka_flush(rk_, 0) == RD_KAFKA_RESP_ERR__TIMED_OUT) {
    if (fatal_) co_return true;  // the call returns the fatal error at once
    if (past_stop_deadline()) co_return false;
    poll();
    tick.expires_after(std::chrono::milliseconds(2));
    boost::system::error_code ec;
    co_await tick.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (generation != generation_) co_return false;  // that producer is gone
  }
  co_return true;
}

void KafkaSink::warn_left_to_coordinator(Lsn end) const {
  spdlog::warn("kafka: the Kafka transaction up to {} had not committed by shutdown.timeout.ms; left to its "
               "coordinator (committed or aborted there; nothing past the committed position {} was confirmed)",
               end.to_string(), committed_ ? committed_->end_lsn.to_string() : std::string("(none)"));
}

void KafkaSink::commit_now() {
  if (transactions_ && txn_state_ == TxnState::open && !txn_partial_ && txn_end_) start_commit();
}

void KafkaSink::start_abort(std::string reason) {
  // Now, not when the coroutine first runs: a commit_now() in between must
  // find the transaction taken.
  txn_state_ = TxnState::aborting;
  asio::co_spawn(io_, abort(std::move(reason)), asio::detached);
}

void KafkaSink::abandon_transaction() {
  if (!transactions_) return;
  if (txn_state_ == TxnState::open) start_abort("the relay replays from the committed position");
  // A commit under way ends as it ends; what waits for it is replayed.
  else fail_waiting("held back while a Kafka transaction committed; the relay replays from the committed position");
}

asio::awaitable<bool> KafkaSink::renew(std::string_view why) {
  if (!transactions_ || fenced_ || !rk_) co_return false;
  spdlog::log(fatal_ ? spdlog::level::warn : spdlog::level::info,
              "kafka: exactly once: replacing the producer ({}{}); the new one resumes from the committed position",
              why, fatal_ ? ": " + *fatal_ : std::string());
  ++generation_;
  boundary_timer_.cancel();
  boundary_armed_ = false;
  waiting_retry_.cancel();
  position_retry_.cancel();
  forget_waiting();  // the relay's ledger is reset with the producer
  // The old producer's events are never served: its delivery reports belong
  // to a ledger the relay is about to reset, and its open transaction is
  // aborted by the coordinator when the new one calls init_transactions.
  rd_kafka_queue_io_event_enable(queue_, -1, nullptr, 0);
  rd_kafka_queue_destroy(queue_);
  queue_ = nullptr;
  for (auto& [name, rkt] : topics_) rd_kafka_topic_destroy(rkt);
  topics_.clear();
  rd_kafka_t* old = rk_;
  rk_ = nullptr;
  // After whatever the worker still runs on the old producer.
  co_await on_worker([old] {
    rd_kafka_destroy(old);
    return true;
  });
  fatal_.reset();
  timed_out_ = false;
  last_error_ = "no broker connection yet";
  brokers_up_ = 0;
  recovered_ = false;
  initialised_ = false;
  txn_state_ = TxnState::idle;
  txn_end_.reset();
  txn_partial_ = false;
  txn_records_ = 0;
  create_producer();
  co_return true;
}

asio::awaitable<std::optional<CommittedPosition>> KafkaSink::forget_position() {
  // A named object: g++ 12 frees a temporary argument of a coroutine twice.
  const SourceIdentity none;
  auto forgotten = co_await recover(none);
  if (!forgotten) co_return forgotten;
  // A tombstone, in a transaction of its own: read_committed readers see it
  // exactly when it commits, and compaction removes the key in time.
  auto done = co_await on_worker([this] {
    TxnResult r = result_of(rd_kafka_begin_transaction(rk_));
    if (!r.ok) return r;
    const std::string& key = transactions_->transactional_id;
    rd_kafka_resp_err_t err = rd_kafka_producev(
        rk_, RD_KAFKA_V_TOPIC(transactions_->offsets_topic.c_str()), RD_KAFKA_V_PARTITION(0),
        RD_KAFKA_V_KEY(key.data(), key.size()), RD_KAFKA_V_VALUE(nullptr, 0), RD_KAFKA_V_OPAQUE(nullptr),
        RD_KAFKA_V_END);
    if (err) {
      TxnResult failed;
      failed.ok = false;
      failed.message = rd_kafka_err2str(err);
      rd_kafka_error_destroy(rd_kafka_abort_transaction(rk_, 30000));
      return failed;
    }
    return result_of(rd_kafka_commit_transaction(rk_, -1));
  });
  if (!done.ok) throw std::runtime_error("could not write the tombstone to " + transactions_->offsets_topic + ": " +
                                         done.message);
  committed_.reset();
  co_return forgotten;
}

std::optional<Lsn> KafkaSink::confirm_limit() const {
  if (!transactions_) return std::nullopt;
  // Only what a commit made visible, whatever the state: an acknowledgement
  // says a record is in an open transaction, which an abort (a refused
  // record, a time-out, an abortable EndTxn) takes back. Idle after an abort
  // is not idle after a commit.
  if (mutation::active(mutation::Break::confirm_past_abort) && txn_state_ == TxnState::idle) return std::nullopt;
  return committed_ ? committed_->end_lsn : Lsn{};
}

bool KafkaSink::commit_position(Lsn end_lsn) {
  if (!transactions_ || !recovered_ || fatal_ || txn_state_ != TxnState::idle || waiting_next_ < waiting_.size())
    return false;
  if (committed_ && end_lsn <= committed_->end_lsn) return false;
  if (!ensure_transaction()) return false;
  txn_end_ = end_lsn;
  txn_partial_ = false;
  start_commit();
  return true;
}

std::chrono::milliseconds KafkaSink::transaction_timeout() const {
  auto it = settings_.find("transaction.timeout.ms");
  long ms = 60000;  // librdkafka's default
  if (it != settings_.end()) ms = std::strtol(it->second.c_str(), nullptr, 10);
  return std::chrono::milliseconds(ms);
}

KafkaSink::CallLimit KafkaSink::transaction_call_limit() const { return {transaction_timeout(), stop_by_}; }

int KafkaSink::CallLimit::timeout_ms() const {
  // The transaction's own time-out: past it the coordinator has aborted the
  // transaction anyway. Once a stop is under way, no later than its deadline
  // (a call made before the stop is waited for: at most this time-out, and
  // only while the coordinator does not answer). Taken when the call starts:
  // it may have waited on the worker behind a broker probe.
  auto timeout = transaction_timeout;
  if (stop_by) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*stop_by - std::chrono::steady_clock::now());
    timeout = std::clamp(left, std::chrono::milliseconds(1), timeout);
  }
  return static_cast<int>(timeout.count());
}

bool KafkaSink::past_stop_deadline() const { return stop_by_ && std::chrono::steady_clock::now() >= *stop_by_; }

std::string KafkaSink::classify_fatal(int code) {
  if (!transactions_ || !is_fence(code)) return {};
  const auto age = std::chrono::steady_clock::now() - txn_opened_;
  if (txn_state_ != TxnState::idle && age >= transaction_timeout()) {
    // The coordinator aborts a transaction older than its time-out and bumps
    // the producer's epoch; the broker then answers this producer as it
    // would a zombie. A takeover needs no old transaction, this does.
    timed_out_ = true;
    std::string held = txn_end_ ? "source transactions up to " + txn_end_->to_string() : std::string();
    if (txn_partial_) held += std::string(held.empty() ? "" : " and ") + "one not yet ended";
    return fmt::format(
        " (the Kafka transaction holding {} was open for {:.1f} s, past kafka.transaction.timeout.ms={}: its "
        "coordinator aborted it and bumped the producer epoch, which the broker reports as a fence. That is a "
        "time-out, not another walrelay taking over. Nothing of it became visible or was confirmed. Raise "
        "kafka.transaction.timeout.ms (the broker caps it at transaction.max.timeout.ms) or find what held walrelay "
        "up that long, then restart)",
        held.empty() ? "no record yet" : held, std::chrono::duration<double>(age).count(),
        transaction_timeout().count());
  }
  fenced_ = true;
  return " (another walrelay with transactional.id " + transactions_->transactional_id + " took over)";
}

}  // namespace walrelay
