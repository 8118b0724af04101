#include "walrelay/sinks/kafka/kafka_sink.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <simdjson.h>
#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include <boost/asio/post.hpp>

#include "walrelay/config.hpp"
#include "walrelay/mutation.hpp"

namespace walrelay {

namespace {

// librdkafka's syslog levels: 0-3 error, 4 warning, 5-6 info, 7 debug.
// A line may name a URL with its user info (an OAUTHBEARER token endpoint's).
void log_line(int level, const char* fac, const char* buf) {
  const std::string line = redact_url(buf);
  if (level <= 3) spdlog::error("kafka: {}: {}", fac, line);
  else if (level == 4) spdlog::warn("kafka: {}: {}", fac, line);
  else if (level <= 6) spdlog::info("kafka: {}: {}", fac, line);
  else spdlog::debug("kafka: {}: {}", fac, line);
}

// Errors that belong to the record itself: sending it again would fail the
// same way, so errors.tolerance decides (halt, or the dead-letter topic).
// Everything else (time-outs, broker, network, authentication errors) says
// nothing about the record: it must be sent again, never dead-lettered.
bool is_record_error(rd_kafka_resp_err_t err) {
  switch (err) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
    case RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP:
      return true;
    default:
      return false;
  }
}

std::string error_code_name(rd_kafka_resp_err_t err) {
  std::string n = rd_kafka_err2name(err);
  for (auto& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  while (!n.empty() && n.front() == '_') n.erase(n.begin());
  return n;
}

}  // namespace

std::string kafka_permission_hint(std::string_view code, std::string_view topic, std::string_view transactional_id) {
  const std::string t(topic);
  if (code == "topic_authorization_failed")
    return "walrelay's Kafka principal needs WRITE on topic " + t +
           " (and CREATE on it where the broker creates topics on first use)";
  if (code == "transactional_id_authorization_failed")
    return "walrelay's Kafka principal needs WRITE on transactional.id " + std::string(transactional_id);
  if (code == "cluster_authorization_failed")
    return "walrelay's Kafka principal needs IDEMPOTENT_WRITE on the cluster (brokers before Kafka 3.0; later ones "
           "accept WRITE on the topic)";
  return "walrelay's Kafka principal lacks a permission (" + std::string(code) + ")";
}

KafkaSink::KafkaSink(boost::asio::io_context& io, const std::map<std::string, std::string>& settings,
                     std::optional<KafkaTransactions> transactions)
    : io_(io), settings_(settings), wake_(io), transactions_(std::move(transactions)), boundary_timer_(io),
      waiting_retry_(io), position_retry_(io), probe_retry_(io) {
  if (pipe2(wake_pipe_, O_NONBLOCK | O_CLOEXEC) != 0) throw std::runtime_error("could not create a pipe");
  wake_.assign(wake_pipe_[0]);
  try {
    create_producer();
  } catch (...) {
    ::close(wake_pipe_[1]);  // no destructor runs for a constructor that throws (wake_ closes the other end)
    throw;
  }
  watch_queue();
}

void KafkaSink::create_producer() {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[512];
  auto set = [&](const std::string& k, const std::string& v) {
    if (rd_kafka_conf_set(conf, k.c_str(), v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
      rd_kafka_conf_destroy(conf);
      throw ConfigError("kafka." + k, err);
    }
  };
  for (auto& [k, v] : settings_) set(k, v);
  if (!settings_.count("client.id")) set("client.id", "walrelay");
  // librdkafka logs from its own threads unless told to queue them; spdlog's
  // sinks here are single-threaded, so logs are served on the loop by poll(),
  // like delivery reports.
  set("log.queue", "true");
  // Everything comes back as events on the main queue, served by poll() on
  // the loop: delivery reports in batches, and never by librdkafka itself
  // (a transaction's commit flushes on another thread and must not run our
  // handlers there).
  rd_kafka_conf_set_events(conf, RD_KAFKA_EVENT_DR | RD_KAFKA_EVENT_ERROR | RD_KAFKA_EVENT_STATS |
                                     RD_KAFKA_EVENT_LOG);
  if (transactions_) set("transactional.id", transactions_->transactional_id);
  if (transactions_ && mutation::active(mutation::Break::zombie_not_fenced))
    set("transactional.id", transactions_->transactional_id + "-" + std::to_string(::getpid()));
  rk_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);  // takes conf on success
  if (!rk_) {
    rd_kafka_conf_destroy(conf);
    throw ConfigError("kafka.*", std::string("could not create the Kafka producer: ") + err);
  }
  queue_ = rd_kafka_queue_get_main(rk_);
  rd_kafka_set_log_queue(rk_, queue_);
  rd_kafka_queue_io_event_enable(queue_, wake_pipe_[1], "1", 1);
  // The pipe is written when the queue goes from empty to non-empty, and
  // rd_kafka_new has already queued its first log lines: empty it once.
  boost::asio::post(io_, [this] { poll(); });
  probe_now();
}

void KafkaSink::probe_brokers() {
  // Not once stopping: the destructor waits for the worker.
  if (probe_in_flight_ || probe_waiting_ || !rk_ || stop_by_) return;
  probe_in_flight_ = true;
  boost::asio::post(worker_, [this, rk = rk_, generation = generation_, epoch = down_epoch_, alive = alive_] {
    const rd_kafka_metadata_t* md = nullptr;
    int brokers = 0;
    if (rd_kafka_metadata(rk, 0, nullptr, &md, probe_timeout_ms) == RD_KAFKA_RESP_ERR_NO_ERROR) {
      brokers = md->broker_cnt;
      rd_kafka_metadata_destroy(md);
    }
    boost::asio::post(io_, [this, generation, epoch, brokers, alive] {
      if (!*alive) return;
      probe_in_flight_ = false;
      // Asked the producer renew() replaced, or answered before a report of
      // every broker down that came meanwhile: ask again.
      if (generation != generation_ || epoch != down_epoch_) return probe_brokers();
      // A broker that was up is counted down only on the second probe in a
      // row it misses (or at once by _ALL_BROKERS_DOWN): one slow answer
      // from a busy broker does not make /readyz flap.
      probe_misses_ = brokers > 0 ? 0 : probe_misses_ + 1;
      if (brokers > 0 || brokers_up_ == 0 || probe_misses_ >= 2) mark_brokers(brokers);
      // While up, now and then: a cluster whose brokers all went quiet
      // without librdkafka reporting them down still shows here.
      probe_waiting_ = true;
      probe_retry_.expires_after(brokers_up_ > 0 && probe_misses_ == 0 ? std::chrono::seconds(10)
                                                                        : std::chrono::seconds(1));
      probe_retry_.async_wait([this, alive](boost::system::error_code) {
        if (!*alive) return;
        probe_waiting_ = false;
        probe_brokers();
      });
    });
  });
}

// At once: ends a wait for the next probe, or starts one.
void KafkaSink::probe_now() {
  if (probe_waiting_) probe_retry_.cancel();  // its handler probes
  else probe_brokers();
}

// brokers: how many a probe found (0: none answered), or 1 for a delivery
// acknowledged; statistics, when set, pass how many they show up.
void KafkaSink::mark_brokers(int brokers) {
  if (brokers > 0) {
    if (brokers_up_ == 0) spdlog::info(seen_up_ ? "kafka: broker reachable again" : "kafka: broker reachable");
    seen_up_ = true;
    brokers_up_ = brokers;
    last_error_.clear();
    return;
  }
  if (brokers_up_ > 0) {
    last_error_ = "no broker answered a metadata request within " + std::to_string(probe_timeout_ms) + " ms";
    spdlog::warn("kafka: {}", last_error_);
  }
  brokers_up_ = 0;
}

KafkaSink::~KafkaSink() {
  boost::system::error_code ec;
  *alive_ = false;
  wake_.cancel(ec);
  boundary_timer_.cancel();
  probe_retry_.cancel();
  worker_.join();
  if (rk_) {
    rd_kafka_queue_io_event_enable(queue_, -1, nullptr, 0);
    rd_kafka_queue_destroy(queue_);
    for (auto& [name, rkt] : topics_) rd_kafka_topic_destroy(rkt);
    // Records still queued are delivered (or failed) by destroy's purge; any
    // Pending of a dead-letter record leaks here by design rather than
    // racing the callbacks.
    rd_kafka_destroy(rk_);
  }
  wake_.close(ec);  // closes wake_pipe_[0]
  if (wake_pipe_[1] >= 0) ::close(wake_pipe_[1]);
}

// Waits for librdkafka's queue to have events (its wake-up pipe), then polls.
// librdkafka writes to the pipe when the queue goes from empty to non-empty;
// poll() serves it until it is empty again, so no timer is needed besides.
void KafkaSink::watch_queue() {
  wake_.async_wait(boost::asio::posix::stream_descriptor::wait_read, [this](boost::system::error_code ec) {
    if (ec) return;
    std::array<char, 256> buf;
    while (::read(wake_pipe_[0], buf.data(), buf.size()) > 0) {
    }
    poll();
    watch_queue();
  });
}

// Serves delivery reports (a batch per event), errors, statistics and logs
// on this thread. Bounded so that one call cannot starve the replication
// socket; what is left is served after the loop's other handlers.
void KafkaSink::poll() {
  if (!queue_) return;  // between two producers (renew)
  if (mutation::active(mutation::Break::reorder_key) && held_ &&
      std::chrono::steady_clock::now() - held_->since > std::chrono::seconds(1))
    produce_held();
  for (int i = 0; i < 64; ++i) {
    rd_kafka_event_t* ev = rd_kafka_queue_poll(queue_, 0);
    if (!ev) return;
    switch (rd_kafka_event_type(ev)) {
      case RD_KAFKA_EVENT_DR:
        while (const rd_kafka_message_t* m = rd_kafka_event_message_next(ev)) handle_delivery(m);
        break;
      case RD_KAFKA_EVENT_ERROR:
        handle_error(rd_kafka_event_error_is_fatal(ev) ? RD_KAFKA_RESP_ERR__FATAL : rd_kafka_event_error(ev),
                     rd_kafka_event_error_string(ev));
        break;
      case RD_KAFKA_EVENT_STATS: {
        const char* json = rd_kafka_event_stats(ev);
        handle_stats(json, std::strlen(json));
        break;
      }
      case RD_KAFKA_EVENT_LOG: {
        const char *fac = nullptr, *text = nullptr;
        int level = 7;
        if (rd_kafka_event_log(ev, &fac, &text, &level) == 0) log_line(level, fac, text);
        break;
      }
      default:
        break;
    }
    rd_kafka_event_destroy(ev);
  }
  if (!repoll_posted_) {
    repoll_posted_ = true;
    boost::asio::post(io_, [this] {
      repoll_posted_ = false;
      poll();
    });
  }
}

// Fails the records still in librdkafka's queues; each reports _PURGE_QUEUE.
void KafkaSink::abort_queued() {
  if (!rk_) return;
  // Queued records only: a request already sent may still be acknowledged,
  // and its records are then duplicates of the replay, not losses.
  auto err = rd_kafka_purge(rk_, RD_KAFKA_PURGE_F_QUEUE);
  if (err) spdlog::warn("kafka: could not purge queued records: {}", rd_kafka_err2str(err));
}

// Hands one record to librdkafka, copied; a refusal is reported at once.
SubmitStatus KafkaSink::produce(std::string_view topic, std::optional<std::string_view> key,
                                std::optional<std::string_view> value, std::int64_t timestamp_ms,
                                const std::vector<OutboxRecord::Header>& headers, Pending* pending,
                                std::int32_t partition) {
  // Rejected before it entered the queue: reported like a failed delivery.
  auto reject = [&](std::string code, std::string message, bool transient) {
    Delivery d;
    d.ok = false;
    d.at_submit = true;
    d.transient = transient;
    d.error_code = std::move(code);
    d.error_message = std::move(message);
    d.topic = topic;
    d.key = key;
    d.value = value;
    d.headers = headers;
    settle_opaque(d, pending, (key ? key->size() : 0) + (value ? value->size() : 0));
    note_denial(d);
    if (on_delivery_) on_delivery_(d);
    return SubmitStatus::refused_reported;
  };
  rd_kafka_topic_t* rkt = topic_handle(topic);
  if (!rkt) return reject(error_code_name(rd_kafka_last_error()), "invalid topic name", false);
  std::array<rd_kafka_vu_t, 64> vus;
  std::size_t n = 0;
  vus[n].vtype = RD_KAFKA_VTYPE_RKT;
  vus[n++].u.rkt = rkt;
  if (key) {
    vus[n].vtype = RD_KAFKA_VTYPE_KEY;
    vus[n].u.mem.ptr = const_cast<char*>(key->data());
    vus[n++].u.mem.size = key->size();
  }
  if (value) {
    vus[n].vtype = RD_KAFKA_VTYPE_VALUE;
    vus[n].u.mem.ptr = const_cast<char*>(value->data());
    vus[n++].u.mem.size = value->size();
  }
  vus[n].vtype = RD_KAFKA_VTYPE_MSGFLAGS;
  vus[n++].u.i = RD_KAFKA_MSG_F_COPY;
  if (partition >= 0) {  // a partition placement; otherwise the partitioner's choice by key
    vus[n].vtype = RD_KAFKA_VTYPE_PARTITION;
    vus[n++].u.i32 = partition;
  }
  if (timestamp_ms > 0) {
    vus[n].vtype = RD_KAFKA_VTYPE_TIMESTAMP;
    vus[n++].u.i64 = timestamp_ms;
  }
  vus[n].vtype = RD_KAFKA_VTYPE_OPAQUE;
  vus[n++].u.ptr = pending;
  // Header names point at NUL-terminated storage (see OutboxRecord::Header);
  // librdkafka copies names and values into the message.
  if (n + headers.size() > vus.size())
    return reject("too_many_headers", "more than " + std::to_string(vus.size() - n) + " headers", false);
  for (const auto& h : headers) {
    vus[n].vtype = RD_KAFKA_VTYPE_HEADER;
    vus[n].u.header.name = h.name.data();
    vus[n].u.header.val = h.value ? h.value->data() : nullptr;
    vus[n++].u.header.size = h.value ? static_cast<ssize_t>(h.value->size()) : 0;
  }
  rd_kafka_error_t* error = rd_kafka_produceva(rk_, vus.data(), n);
  if (!error) return SubmitStatus::accepted;
  auto code = rd_kafka_error_code(error);
  std::string msg = rd_kafka_error_string(error);
  rd_kafka_error_destroy(error);
  if (code == RD_KAFKA_RESP_ERR__QUEUE_FULL) return SubmitStatus::queue_full;
  return reject(error_code_name(code), msg, !is_record_error(code));
}

// The topic's handle, made (and its metadata asked for) at its first record.
rd_kafka_topic_t* KafkaSink::topic_handle(std::string_view topic) {
  if (auto it = topics_.find(topic); it != topics_.end()) return it->second;
  if (topics_.size() >= max_topic_handles) {
    // Topics come from row data: keep the cache bounded. Records in flight
    // hold their own reference to their topic, so dropping ours is safe.
    spdlog::info("kafka: {} topic handles cached; releasing them all", topics_.size());
    for (auto& [name, rkt] : topics_) rd_kafka_topic_destroy(rkt);
    topics_.clear();
  }
  std::string name(topic);
  rd_kafka_topic_t* rkt = rd_kafka_topic_new(rk_, name.c_str(), nullptr);
  if (!rkt) return nullptr;
  spdlog::debug("kafka: first record for topic {}: metadata requested", name);
  topics_.emplace(std::move(name), rkt);
  return rkt;
}

// An outbox record; its token rides in the message opaque.
SubmitStatus KafkaSink::submit(const OutboxRecord& record, std::uint64_t token) {
  auto* opaque = reinterpret_cast<Pending*>(static_cast<std::uintptr_t>((token << 1) | 1));
  if (mutation::active(mutation::Break::drop_records) && mutation_count_++ % 10 == 2)
    return SubmitStatus::accepted;  // gone: no report, ever
  if (transactions_) {
    if (must_wait()) {
      if (!wait_record(record.topic, record.key, record.value, record.timestamp_ms, record.headers, opaque,
                       record.partition))
        return SubmitStatus::queue_full;
      return SubmitStatus::accepted;
    }
    if (!ensure_transaction()) return SubmitStatus::queue_full;
    ++txn_records_;
    txn_partial_ = true;
  }
  if (mutation::active(mutation::Break::reorder_key)) return submit_reordered(record, opaque);
  return produce(record.topic, record.key, record.value, record.timestamp_ms, record.headers, opaque, record.partition);
}

// reorder_key mutation: produces the record held back.
void KafkaSink::produce_held() {
  std::vector<OutboxRecord::Header> headers;
  for (auto& [name, value] : held_->headers)
    headers.push_back({name, value ? std::optional<std::string_view>(*value) : std::nullopt});
  produce(held_->topic, held_->key, held_->value, held_->timestamp_ms, headers, held_->opaque);
  held_.reset();
}

// reorder_key mutation: produces records out of order within a key.
SubmitStatus KafkaSink::submit_reordered(const OutboxRecord& record, Pending* opaque) {
  // Every fifth record waits for the next one of its key and goes after it;
  // one that waits for more than a second goes alone.
  if (held_ && held_->key == record.key) {
    auto r = produce(record.topic, record.key, record.value, record.timestamp_ms, record.headers, opaque, record.partition);
    produce_held();
    return r;
  }
  if (held_ && std::chrono::steady_clock::now() - held_->since > std::chrono::seconds(1)) produce_held();
  if (!held_ && mutation_count_++ % 5 == 4) {
    Held h{std::string(record.topic), record.key ? std::optional<std::string>(*record.key) : std::nullopt,
           record.value ? std::optional<std::string>(*record.value) : std::nullopt, record.timestamp_ms, {}, opaque,
           std::chrono::steady_clock::now()};
    for (auto& hd : record.headers)
      h.headers.emplace_back(std::string(hd.name), hd.value ? std::optional<std::string>(*hd.value) : std::nullopt);
    held_ = std::move(h);
    return SubmitStatus::accepted;
  }
  return produce(record.topic, record.key, record.value, record.timestamp_ms, record.headers, opaque, record.partition);
}

// A dead-letter record; a heap Pending carries its token, size and reason.
SubmitStatus KafkaSink::submit_dead_letter(std::string_view reason, std::string_view topic,
                                           std::optional<std::string_view> key,
                                           std::optional<std::string_view> value,
                                           const std::vector<OutboxRecord::Header>& headers, std::uint64_t token,
                                           std::size_t bytes) {
  if (transactions_ && must_wait()) {
    auto* pending = new Pending{token, bytes, std::string(reason)};
    if (wait_record(topic, key, value, 0, headers, pending, -1)) return SubmitStatus::accepted;
    delete pending;
    return SubmitStatus::queue_full;
  }
  if (transactions_) {
    if (!ensure_transaction()) return SubmitStatus::queue_full;
    ++txn_records_;
    txn_partial_ = true;
  }
  auto* pending = new Pending{token, bytes, std::string(reason)};
  auto status = produce(topic, key, value, 0, headers, pending);
  if (status == SubmitStatus::queue_full) delete pending;
  return status;
}

void KafkaSink::note_denial(Delivery& d) const {
  if (d.error_code.find("authorization_failed") == std::string::npos) return;
  d.denied = true;
  d.error_message += " (" + kafka_permission_hint(d.error_code, d.topic,
                                                  transactions_ ? transactions_->transactional_id : "") + ")";
}

void KafkaSink::settle_opaque(Delivery& d, Pending* opaque, std::size_t record_bytes) {
  auto bits = reinterpret_cast<std::uintptr_t>(opaque);
  if (bits & 1) {
    d.token = bits >> 1;
    d.bytes = record_bytes;
    return;
  }
  d.token = opaque->token;
  d.bytes = opaque->bytes;
  d.dead_lettered = true;
  d.dead_letter_reason = std::move(opaque->reason);
  delete opaque;
}

// One delivery report, turned into a Delivery for the relay.
void KafkaSink::handle_delivery(const rd_kafka_message_t* m) {
  if (!m->_private) {
    // The offsets record of a transaction: its commit reports for it.
    if (m->err) spdlog::warn("kafka: the offsets record of a transaction failed: {}", rd_kafka_err2str(m->err));
    return;
  }
  Delivery d;
  settle_opaque(d, static_cast<Pending*>(m->_private), m->key_len + m->len);
  d.topic = rd_kafka_topic_name(m->rkt);
  if (!m->err && brokers_up_ == 0) mark_brokers(1);
  if (m->err) {
    d.ok = false;
    d.transient = !is_record_error(m->err);
    d.error_code = error_code_name(m->err);
    d.error_message = rd_kafka_err2str(m->err);
    note_denial(d);
    if (m->key) d.key = std::string_view(static_cast<const char*>(m->key), m->key_len);
    if (m->payload) d.value = std::string_view(static_cast<const char*>(m->payload), m->len);
    rd_kafka_headers_t* hdrs = nullptr;
    if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR && hdrs) {
      const char* name;
      const void* val;
      size_t size;
      for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &val, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i)
        d.headers.push_back({name, val ? std::optional<std::string_view>(std::string_view(static_cast<const char*>(val), size))
                                       : std::nullopt});
    }
  }
  if (on_delivery_) on_delivery_(d);
}

bool KafkaSink::is_fence(int err) {
  return err == RD_KAFKA_RESP_ERR__FENCED || err == RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH ||
         err == RD_KAFKA_RESP_ERR_PRODUCER_FENCED;
}

// The producer can go no further: fatal_error() says why from now on, and the
// relay is told at once (it may be waiting idle for the next event).
void KafkaSink::fail_fatally(std::string reason) {
  fatal_ = std::move(reason);
  spdlog::critical("kafka: {}", *fatal_);
  if (on_fatal_) on_fatal_();
}

void KafkaSink::raise_fatal_error_for_test(const char* reason) {
  rd_kafka_test_fatal_error(rk_, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, reason);
}

// librdkafka's error callback: fatal errors stop the sink, others are health.
void KafkaSink::handle_error(int err, const char* reason) {
  auto code = static_cast<rd_kafka_resp_err_t>(err);
  if (code == RD_KAFKA_RESP_ERR__FATAL) {
    char buf[512];
    auto cause = rd_kafka_fatal_error(rk_, buf, sizeof buf);
    if (fatal_) return;  // the first one says why
    std::string hint;
    if (cause == RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED ||
        cause == RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
      hint = " (" + kafka_permission_hint(error_code_name(cause), "",
                                          transactions_ ? transactions_->transactional_id : "") + ")";
    fail_fatally(std::string("fatal producer error: ") + buf + hint + classify_fatal(cause));
    return;
  }
  last_error_ = std::string(rd_kafka_err2name(code)) + ": " + reason;
  spdlog::warn("kafka: {}", last_error_);
  if (code == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
    brokers_up_ = 0;
    ++down_epoch_;  // a probe answered before this does not count
    probe_now();    // then once a second until one answers
  }
}

// librdkafka's statistics, when kafka.statistics.interval.ms asks for them
// (off by default: probe_brokers()): broker reachability for /readyz.
void KafkaSink::handle_stats(const char* json, std::size_t len) {
  // A broker in state "UP" means the producer can deliver.
  static thread_local simdjson::ondemand::parser parser;
  simdjson::padded_string doc(json, len);
  int up = 0;
  auto parsed = parser.iterate(doc);
  if (parsed.error()) return;
  simdjson::ondemand::object brokers;
  if (parsed["brokers"].get_object().get(brokers)) return;
  for (auto field : brokers) {
    simdjson::ondemand::object b;
    if (field.value().get_object().get(b)) continue;
    std::int64_t nodeid = -1;
    std::string_view state;
    for (auto f : b) {
      std::string_view k;
      if (f.unescaped_key().get(k)) continue;
      if (k == "nodeid") { if (f.value().get_int64().get(nodeid)) nodeid = -1; }
      else if (k == "state") { if (f.value().get_string().get(state)) state = {}; }
    }
    if (nodeid >= 0 && state == "UP") ++up;
  }
  // Only ever a broker up: down is _ALL_BROKERS_DOWN's and the probe's to
  // say (a bootstrap broker the probe reached shows with no node id here).
  if (up > 0) mark_brokers(up);
}

// --check: a metadata round trip to the cluster.
void KafkaSink::check_connectivity(int timeout_ms) {
  const rd_kafka_metadata_t* md = nullptr;
  auto err = rd_kafka_metadata(rk_, 0, nullptr, &md, timeout_ms);
  if (err) throw std::runtime_error(std::string("could not reach the Kafka cluster: ") + rd_kafka_err2str(err));
  int brokers = md->broker_cnt;
  rd_kafka_metadata_destroy(md);
  if (brokers == 0) throw std::runtime_error("the Kafka cluster reports no brokers");
}

}  // namespace walrelay
