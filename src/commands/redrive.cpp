// walrelay redrive (see redrive.hpp).
#include "walrelay/commands/redrive.hpp"

#include <librdkafka/rdkafka.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <thread>
#include <unordered_map>

#include <pgoutput/encode.hpp>

#include "walrelay/commands/command_support.hpp"
#include "walrelay/sinks/dead_letter.hpp"
#include "walrelay/exit_codes.hpp"
#include "walrelay/json.hpp"

#include <nlohmann/json.hpp>
#include "walrelay/admin/metrics.hpp"
#include "walrelay/mutation.hpp"
#include "walrelay/route/outbox_mapper.hpp"
#include "walrelay/source/pg_connection.hpp"
#include "walrelay/route/schema_registry.hpp"
#include "walrelay/sinks/kafka/kafka_sink.hpp"
#include "walrelay/source/table_rows.hpp"

namespace walrelay {
namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

constexpr const char* attempts_header = "walrelay.redrive.attempts";

using Consumer = std::unique_ptr<rd_kafka_t, void (*)(rd_kafka_t*)>;
using PartitionList = std::unique_ptr<rd_kafka_topic_partition_list_t, void (*)(rd_kafka_topic_partition_list_t*)>;

PartitionList new_list(int size) {
  return {rd_kafka_topic_partition_list_new(size), &rd_kafka_topic_partition_list_destroy};
}

// A dead-letter record's headers, copied out of librdkafka's message.
struct Headers {
  std::vector<std::pair<std::string, std::optional<std::string>>> all;
  const std::optional<std::string>* find(std::string_view name) const {
    const std::optional<std::string>* found = nullptr;
    for (auto& [n, v] : all)
      if (n == name) found = &v;  // the last one, as rd_kafka_header_get_last
    return found;
  }
  std::string text(std::string_view name) const {
    auto* v = find(name);
    return v && *v ? **v : std::string();
  }
};

Headers headers_of(rd_kafka_message_t* m) {
  Headers h;
  rd_kafka_headers_t* hdrs = nullptr;
  if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR) return h;
  const char* name;
  const void* value;
  std::size_t size;
  for (std::size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i)
    h.all.emplace_back(name, value ? std::optional<std::string>(std::string(static_cast<const char*>(value), size))
                                   : std::nullopt);
  return h;
}

// What a redriven record carries on: its own headers, not the dead letter's.
bool context_header(std::string_view name) {
  return name.starts_with("__connect.errors.") || name.starts_with("walrelay.");
}

void close_consumer(rd_kafka_t* c) {
  rd_kafka_consumer_close(c);
  rd_kafka_destroy(c);
}

// The consumer: explicit assignment (no rebalance can move a partition
// away mid-redrive), offsets committed by hand past what is settled. Null
// after saying why it could not be made.
Consumer new_consumer(const Config& config, const std::string& group) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  auto set = [&](const std::string& k, const std::string& v) {
    if (rd_kafka_conf_set(conf, k.c_str(), v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK)
      throw std::runtime_error("redrive consumer: " + k + ": " + err);
  };
  for (auto& [k, v] : config.kafka)
    if (shared_with_consumer(k)) set(k, v);
  set("group.id", group);
  set("enable.auto.commit", "false");
  set("enable.auto.offset.store", "false");
  // Committed records only: an aborted transaction's dead letters (a relay
  // in exactly-once mode killed or aborted mid-transaction) are not dead
  // letters at all, and are skipped with its markers.
  set("isolation.level",
      mutation::active(mutation::Break::redrive_read_uncommitted) ? "read_uncommitted" : "read_committed");
  // The end of a partition is known by reaching it, not by the offset of the
  // last record read: a transactional writer's partition ends with a control
  // record (its commit or abort marker) that is never delivered.
  set("enable.partition.eof", "true");
  set("auto.offset.reset", "earliest");
  set("log.queue", "true");  // never served: its logs stay off the loop's sinks
  rd_kafka_t* raw = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (!raw) {
    rd_kafka_conf_destroy(conf);
    spdlog::critical("redrive: could not create the consumer: {}", err);
  }
  return Consumer(raw, &close_consumer);
}

// A dead letter as read: its headers copied out, its key and value viewing
// the message, which outlives it.
struct DeadRecord {
  rd_kafka_message_t* message;
  Headers headers;
  std::optional<std::string_view> key, value;
  std::string kind;  // __connect.errors.exception.class.name
  std::uint64_t token;

  // The dead letter as it came, to write back, with why it goes back.
  DeadLetter copy_back(const std::string& reason, const std::string& why) const {
    DeadLetter dead;
    dead.reason = reason;
    if (key) dead.key = std::string(*key);
    if (value) dead.value = std::string(*value);
    dead.headers = headers.all;
    std::erase_if(dead.headers, [](auto& x) { return x.first == "__connect.errors.exception.message"; });
    dead.headers.emplace_back("__connect.errors.exception.message", why);
    return dead;
  }
};

// The re-mapping of dead rows and messages under today's configuration, as
// the relay would map them; what still fails comes back as the dead letter
// to write again.
class Remapper {
 public:
  Remapper(asio::io_context& io, const Config& config, const bool& stop)
      : io_(io), config_(config), stop_(stop), mapping_(io, config) {
    for (auto& p : config.message_prefix_include_list) prefixes_.emplace_back(p, std::regex::ECMAScript);
  }

  OutboxRecord record;  // what row() or message() mapped

  // A row: the image the dead letter carries, mapped again into `record`;
  // nullopt when mapped, else the dead letter to write back.
  asio::awaitable<std::optional<DeadLetter>> row(const DeadRecord& r) {
    const std::string table_name = r.headers.text("walrelay.source.table");
    std::optional<DeadLetter> refused;
    const TableRows* rows = co_await table(table_name, r, refused);
    if (!rows) co_return refused;
    Json row;
    try {
      row = Json::parse(*r.value);
    } catch (const std::exception& e) {
      refused = r.copy_back("redrive_failed", "redrive: the row image is not JSON");
    }
    if (refused) co_return refused;
    mapping_.writer.insert(rows->oid, static_cast<std::uint16_t>(rows->columns.size()));
    std::vector<std::string> texts;  // held while the Insert views them
    for (auto& c : rows->columns) {
      auto it = row.find(c.name);
      if (it == row.end() || it->is_null()) mapping_.writer.null();
      else if (it->is_string()) mapping_.writer.text(it->template get_ref<const std::string&>());
      else mapping_.writer.text(texts.emplace_back(it->dump()));
    }
    auto decoded = mapping_.decoder.decode(mapping_.writer.bytes());
    if (!decoded || !std::holds_alternative<pgoutput::Insert>(decoded.value()))
      co_return r.copy_back("redrive_failed", "redrive: the row image could not be encoded");
    const auto& insert = std::get<pgoutput::Insert>(decoded.value());
    std::optional<MapError> error = mapping_.mapper.map(insert, pgoutput::pg_epoch_micros_now(), record);
    if (!error) error = co_await encode_when_ready(io_, mapping_.encoder.get(), record, stop_);
    if (!error) co_return std::nullopt;
    spdlog::warn("redrive: the row of {} with id {} still cannot be mapped ({}): back to {}", table_name,
                 r.headers.text("id"), error->message, config_.dlq_topic);
    co_return unmappable_row(mapping_.mapper, insert, *error,
                             pgoutput::Lsn::parse(r.headers.text("walrelay.source.lsn")).value_or(pgoutput::Lsn{}),
                             config_.dlq_context_headers);
  }

  // A logical message: its content, mapped again into `record`; nullopt when
  // mapped, else the dead letter to write back.
  asio::awaitable<std::optional<DeadLetter>> message(const DeadRecord& r) {
    const std::string prefix = r.headers.text("walrelay.source.message.prefix");
    int source = -1;
    for (std::size_t i = 0; i < prefixes_.size() && source < 0; ++i)
      if (std::regex_match(prefix, prefixes_[i])) source = static_cast<int>(i);
    if (source < 0 || r.headers.text("walrelay.source.message.transactional") != "true")
      co_return r.copy_back("redrive_failed", source < 0 ? "redrive: prefix " + prefix +
                                                               " matches no pattern of message.prefix.include.list"
                                                         : "redrive: a non-transactional message is never relayed");
    pgoutput::LogicalMessage message{
        std::nullopt, 1, pgoutput::Lsn::parse(r.headers.text("walrelay.source.lsn")).value_or(pgoutput::Lsn{}),
        prefix, {reinterpret_cast<const std::byte*>(r.value->data()), r.value->size()}};
    std::optional<MapError> error =
        mapping_.mapper.map_message(message, pgoutput::pg_epoch_micros_now(),
                                    static_cast<std::uint16_t>(config_.table_include_list.size() + source), record);
    if (!error) error = co_await encode_when_ready(io_, mapping_.encoder.get(), record, stop_);
    if (!error) co_return std::nullopt;
    co_return unmappable_message(message, *error, config_.dlq_context_headers);
  }

 private:
  // A dead row's table, described on its first dead letter (on an ordinary
  // connection, for its column types) and announced to the mapper; null
  // with `refused` set when it cannot be.
  asio::awaitable<const TableRows*> table(const std::string& table_name, const DeadRecord& r,
                                          std::optional<DeadLetter>& refused) {
    if (auto t = tables_.find(table_name); t != tables_.end()) co_return &t->second;
    auto dot = table_name.find('.');
    TableName name{table_name.substr(0, dot), dot == std::string::npos ? "" : table_name.substr(dot + 1)};
    try {
      if (!pg_.connected())
        co_await pg_.connect(config_.conninfo(false), std::chrono::milliseconds(config_.database_connect_timeout_ms));
      TableRows rows = co_await describe_table(pg_, name);
      if (!mapping_.announce(rows)) throw PgError(table_name + " is not in table.include.list", "");
      co_return &tables_.emplace(table_name, std::move(rows)).first->second;
    } catch (const PgError& e) {
      refused = r.copy_back("redrive_failed", "redrive: " + std::string(e.what()));
    }
    co_return nullptr;
  }

  asio::io_context& io_;
  const Config& config_;
  const bool& stop_;
  RowMapping mapping_;
  std::vector<std::regex> prefixes_;
  PgConnection pg_{io_};
  std::map<std::string, TableRows> tables_;
};

// One redrive: reads the dead-letter topic up to where it ended at the
// start, sends each record on (or back), and commits the consumer group's
// offsets only past what the broker acknowledged.
class Redrive {
 public:
  Redrive(asio::io_context& io, const Config& config, Sink& sink, const RedriveOptions& o, const bool& stop)
      : io_(io), config_(config), sink_(sink), o_(o), stop_(stop), dlq_(config.dlq_topic),
        group_(o.group.empty() ? "walrelay-redrive." + config.slot_name : o.group) {}

  // The whole redrive: the consumer set up, the records read and sent, the
  // offsets committed; the exit code.
  asio::awaitable<int> run() {
    if (dlq_.empty()) {
      spdlog::critical("redrive: errors.deadletterqueue.topic.name is not set: there is no dead-letter topic to read");
      co_return exit_config;
    }
    consumer_ = new_consumer(config_, group_);
    if (!consumer_) co_return exit_failure;
    auto assignment = new_list(0);
    if (!read_ends(assignment) || !start_from_committed(assignment)) co_return exit_failure;
    spdlog::info("redrive: up to {} record(s) of {} to send again (consumer group {}; fewer when a transactional "
                 "writer's markers or aborted records are among them)",
                 waiting_, dlq_, group_);
    if (waiting_ == 0) co_return exit_ok;
    if (auto e = rd_kafka_assign(consumer_.get(), assignment.get())) {
      spdlog::critical("redrive: could not assign {}: {}", dlq_, rd_kafka_err2str(e));
      co_return exit_failure;
    }
    Remapper remapper(io_, config_, stop_);
    sink_.on_delivery([this](const Delivery& d) { on_delivery(d); });
    co_await read_all(remapper);
    co_return co_await finish();
  }

 private:
  // What is in flight: per token, where it came from.
  struct Pending {
    int partition;
    std::int64_t offset;
    bool back_to_dlq;  // the copy is the dead-letter one: a failure now is a halt
  };

  // The partitions and where each ends now, into end_ and `assignment`: the
  // redrive stops there, so the records it writes back are left for the next
  // one. Read committed, the end is the last stable offset: a transaction
  // still open is the next one's. False after saying why not.
  bool read_ends(PartitionList& assignment) {
    rd_kafka_topic_t* rkt = rd_kafka_topic_new(consumer_.get(), dlq_.c_str(), nullptr);
    const rd_kafka_metadata_t* md = nullptr;
    auto e = rd_kafka_metadata(consumer_.get(), 0, rkt, &md, 30000);
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 && !md->topics[0].err)
      for (int i = 0; i < md->topics[0].partition_cnt; ++i) end_[md->topics[0].partitions[i].id] = 0;
    if (md) rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    if (end_.empty()) {
      spdlog::critical("redrive: the dead-letter topic {} could not be read ({})", dlq_,
                       e ? rd_kafka_err2str(e) : "it does not exist");
      return false;
    }
    assignment = new_list(static_cast<int>(end_.size()));
    for (auto& [p, high] : end_) {
      std::int64_t low = 0;
      if (auto e = rd_kafka_query_watermark_offsets(consumer_.get(), dlq_.c_str(), p, &low, &high, 30000)) {
        spdlog::critical("redrive: the end of {} [{}] could not be read: {}", dlq_, p, rd_kafka_err2str(e));
        return false;
      }
      rd_kafka_topic_partition_list_add(assignment.get(), dlq_.c_str(), p);
    }
    return true;
  }

  // Where each partition starts: the consumer group's committed offset, else
  // the partition's beginning; counts what waits. False after saying why not.
  bool start_from_committed(PartitionList& assignment) {
    if (auto e = rd_kafka_committed(consumer_.get(), assignment.get(), 30000)) {
      spdlog::critical("redrive: the offsets of consumer group {} could not be read: {}", group_, rd_kafka_err2str(e));
      return false;
    }
    for (int i = 0; i < assignment->cnt; ++i) {
      auto& tp = assignment->elems[i];
      if (tp.offset < 0) tp.offset = RD_KAFKA_OFFSET_BEGINNING;
      std::int64_t low = 0, high = 0;
      rd_kafka_query_watermark_offsets(consumer_.get(), dlq_.c_str(), tp.partition, &low, &high, 30000);
      next_[tp.partition] = tp.offset >= 0 ? tp.offset : low;
      if (end_[tp.partition] > next_[tp.partition])
        waiting_ += static_cast<std::uint64_t>(end_[tp.partition] - next_[tp.partition]);
    }
    consumed_ = next_;
    return true;
  }

  // The read loop: one record at a time, as many in flight as the relay
  // allows, committing every second what settled.
  asio::awaitable<void> read_all(Remapper& remapper) {
    last_commit_ = std::chrono::steady_clock::now();
    while (!stop_ && !failure_ && !done_reading()) {
      sink_.poll();
      // Every second, also while waiting for acknowledgements: what settled
      // is committed, so that a kill sends again only what had not.
      // Waited for (up to 2 s): once the progress line is out, the commit
      // it follows is at the broker, and a kill right after it finds the
      // offsets it names rather than one still on its way.
      if (std::chrono::steady_clock::now() - last_commit_ >= 1s) {
        commit(false, 2s);
        spdlog::info("redrive: {} of {} read, {} sent on, {} back to {}", read_, waiting_, redriven_, returned_, dlq_);
      }
      if (pending_.size() >= static_cast<std::size_t>(config_.max_inflight_records)) {
        co_await pause(io_, 5ms);
        continue;
      }
      rd_kafka_message_t* m = rd_kafka_consumer_poll(consumer_.get(), 0);
      if (!m) {
        co_await pause(io_, 10ms);
        continue;
      }
      std::unique_ptr<rd_kafka_message_t, void (*)(rd_kafka_message_t*)> guard(m, &rd_kafka_message_destroy);
      if (take(m)) co_await redrive(m, remapper);
    }
  }

  // Moves the partition's read position past what the consumer returned;
  // whether it is a dead letter to redrive.
  bool take(const rd_kafka_message_t* m) {
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
      // Its offset is the next one to fetch: everything before it was
      // delivered or is not to be (markers, aborted records). Never past the
      // end fixed at the start: what came since is the next redrive's.
      auto p = end_.find(m->partition);
      if (p != end_.end()) consumed_[p->first] = std::max(consumed_[p->first], std::min(m->offset, p->second));
      return false;
    }
    if (m->err) {
      spdlog::warn("redrive: reading {}: {}", dlq_, rd_kafka_message_errstr(m));
      return false;
    }
    const int p = m->partition;
    if (m->offset >= end_[p]) {
      // Written after the start: the next redrive's. Everything before the
      // end was delivered, in the partition's order, or is not to be.
      consumed_[p] = std::max(consumed_[p], end_[p]);
      return false;
    }
    consumed_[p] = m->offset + 1;
    ++read_;
    return true;
  }

  // One dead letter: sent as it was, mapped again, or written back.
  asio::awaitable<void> redrive(rd_kafka_message_t* m, Remapper& remapper) {
    const int p = m->partition;
    DeadRecord r{m, headers_of(m), std::nullopt, std::nullopt, {}, 0};
    if (m->key) r.key = std::string_view(static_cast<const char*>(m->key), m->key_len);
    if (m->payload) r.value = std::string_view(static_cast<const char*>(m->payload), m->len);
    r.kind = r.headers.text("__connect.errors.exception.class.name");
    r.token = next_token_++;
    if (o_.dry_run) {
      spdlog::info("redrive: --dry-run: {} [{}] offset {}: {} ({})", dlq_, p, m->offset,
                   r.kind.empty() ? "?" : r.kind, r.headers.text("walrelay.error.reason"));
      co_return;
    }
    pending_[r.token] = Pending{p, m->offset, false};
    unsettled_[p].insert(m->offset);
    const Headers& h = r.headers;
    if (r.kind == "walrelay.DeliveryError" && h.find("__connect.errors.topic") &&
        !h.find("walrelay.value.dropped.bytes")) {
      co_await resend_refused(r, remapper.record);
      co_return;
    }
    std::optional<DeadLetter> back;
    if (r.kind == "walrelay.MappingError" && h.find("walrelay.source.table") && r.value) {
      back = co_await remapper.row(r);
    } else if (r.kind == "walrelay.MappingError" && h.find("walrelay.source.message.prefix") && r.value) {
      back = co_await remapper.message(r);
    } else {
      back = r.copy_back("not_redrivable",
                         r.kind.empty() ? "redrive: no context headers say where this record goes (set "
                                          "errors.deadletterqueue.context.headers.enable=true)"
                                        : "redrive: its value was not kept (" + h.text("walrelay.error.reason") +
                                              "), so it cannot be sent again");
    }
    if (back) {
      back_to_dlq(std::move(*back), h, r.token);
      co_return;
    }
    if (stop_) co_return;  // a stop while the registry was waited for: unsent, so not committed past
    co_await submit_when_taken(io_, sink_, remapper.record, r.token);
  }

  // Refused by the broker: as it was, to the topic it was meant for (in the
  // record the remapper maps into: one record, whichever way it goes).
  asio::awaitable<void> resend_refused(const DeadRecord& r, OutboxRecord& record) {
    const std::string topic = r.headers.text("__connect.errors.topic");
    std::vector<std::pair<std::string, std::optional<std::string>>> kept;
    for (auto& x : r.headers.all)
      if (!context_header(x.first)) kept.push_back(x);
    record = OutboxRecord{};
    record.topic = topic;
    record.key = r.key;
    record.value = r.value;
    rd_kafka_timestamp_type_t ts_type;
    record.timestamp_ms = rd_kafka_message_timestamp(r.message, &ts_type);
    for (auto& [n, v] : kept) record.headers.push_back({n, v ? std::optional<std::string_view>(*v) : std::nullopt});
    if (auto* id = r.headers.find("id"); id && *id) record.event_id = **id;
    co_await submit_when_taken(io_, sink_, record, r.token);
  }

  // A delivery report: a copy acknowledged settles its record; a refusal
  // sends the record back to the dead-letter topic, or stops the redrive.
  void on_delivery(const Delivery& d) {
    auto it = pending_.find(d.token);
    if (it == pending_.end()) return;
    if (d.ok) {
      (it->second.back_to_dlq ? returned_ : redriven_)++;
      settle(d.token);
      return;
    }
    if (d.transient || d.denied || it->second.back_to_dlq) {
      // Not this record's fault, or its dead-letter copy refused too: stop
      // without committing past it; the next redrive sends it again.
      if (!failure_)
        failure_ = "a record from " + dlq_ + " [" + std::to_string(it->second.partition) + "] offset " +
                   std::to_string(it->second.offset) + " could not be sent to " + std::string(d.topic) + ": " +
                   d.error_message;
      return;
    }
    // Refused again for its own reason: back to the dead-letter topic.
    spdlog::warn("redrive: refused again by {} ({}): back to {}", d.topic, d.error_message, dlq_);
    it->second.back_to_dlq = true;
    DeadLetter dead = refused_record(d, config_.dlq_context_headers);
    // A delivery report cannot wait for room: a full queue stops the redrive
    // before this record, which the next one sends again.
    if (sink_.submit_dead_letter(dead.reason, dlq_, dead.key, dead.value, dead.header_views(), d.token,
                                 dead.size_bytes()) == SubmitStatus::queue_full &&
        !failure_)
      failure_ = "the producer's queue was full for the dead-letter copy of the record from " + dlq_ + " [" +
                 std::to_string(it->second.partition) + "] offset " + std::to_string(it->second.offset);
  }

  // An acknowledged record: no longer holds its partition's commit back.
  void settle(std::uint64_t token) {
    auto it = pending_.find(token);
    if (it == pending_.end()) return;
    unsettled_[it->second.partition].erase(it->second.offset);
    pending_.erase(it);
  }

  // Writes a dead letter back, with its attempts counted up.
  void back_to_dlq(DeadLetter dead, const Headers& before, std::uint64_t token) {
    int attempts = std::atoi(before.text(attempts_header).c_str()) + 1;
    std::erase_if(dead.headers, [](auto& h) { return h.first == attempts_header; });
    dead.headers.emplace_back(attempts_header, std::to_string(attempts));
    pending_[token].back_to_dlq = true;
    // The queue drains as the broker acknowledges: wait in small sleeps,
    // serving reports, rather than spin.
    while (sink_.submit_dead_letter(dead.reason, dlq_, dead.key, dead.value, dead.header_views(), token,
                                    dead.size_bytes()) == SubmitStatus::queue_full) {
      sink_.poll();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  // Commits each partition's offset up to its first unsettled record, never
  // past it: a kill sends again only what was not acknowledged. `sync`
  // waits for the answer however long it takes (the last commit); else up to
  // `wait` (a broker that does not answer never stalls the loop for long:
  // the commit goes on in the background, and a later one supersedes it).
  void commit(bool sync, std::chrono::milliseconds wait = {}) {
    if (o_.dry_run) return;
    auto list = new_list(static_cast<int>(next_.size()));
    for (auto& [p, off] : consumed_) {
      std::int64_t upto = unsettled_[p].empty() ? off : *unsettled_[p].begin();
      if (mutation::active(mutation::Break::redrive_commit_early)) upto = off;
      rd_kafka_topic_partition_list_add(list.get(), dlq_.c_str(), p)->offset = upto;
    }
    last_commit_ = std::chrono::steady_clock::now();
    if (sync) {
      if (auto e = rd_kafka_commit(consumer_.get(), list.get(), 0))
        spdlog::warn("redrive: could not commit the offsets of {}: {}", group_, rd_kafka_err2str(e));
      return;
    }
    rd_kafka_queue_t* answers = rd_kafka_queue_new(consumer_.get());
    if (auto e = rd_kafka_commit_queue(consumer_.get(), list.get(), answers, nullptr, nullptr)) {
      if (e != RD_KAFKA_RESP_ERR__NO_OFFSET)
        spdlog::warn("redrive: could not commit the offsets of {}: {}", group_, rd_kafka_err2str(e));
    } else if (rd_kafka_event_t* ev = rd_kafka_queue_poll(answers, static_cast<int>(wait.count()))) {
      const auto err = rd_kafka_event_error(ev);
      if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET)
        spdlog::warn("redrive: could not commit the offsets of {}: {}", group_, rd_kafka_event_error_string(ev));
      rd_kafka_event_destroy(ev);
    } else {
      spdlog::warn("redrive: the broker has not answered a commit of {}'s offsets within {} ms; it goes on in the "
                   "background", group_, wait.count());
    }
    rd_kafka_queue_destroy(answers);
  }

  // Whether every partition is read up to where it ended at the start.
  bool done_reading() {
    for (auto& [p, e] : end_)
      if (consumed_[p] < e) return false;
    return true;
  }

  // Waits for what is in flight, commits last, and says how it went.
  asio::awaitable<int> finish() {
    // Everything sent settles before the last commit; a stop waits shutdown.timeout.ms.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(config_.shutdown_timeout_ms);
    while (!pending_.empty() && !failure_ && (!stop_ || std::chrono::steady_clock::now() < deadline)) {
      sink_.poll();
      co_await pause(io_, 20ms);
    }
    commit(true);
    spdlog::info("redrive: {} record(s) of {} read: {} sent on to their topics, {} back to {}{}", read_, dlq_,
                 redriven_, returned_, dlq_, o_.dry_run ? " (--dry-run: nothing sent, nothing committed)" : "");
    if (failure_) {
      spdlog::error("redrive: stopped: {}; the offsets are committed up to it: run redrive again", *failure_);
      co_return exit_halted;
    }
    if (stop_) {
      spdlog::warn("redrive: interrupted; the offsets are committed up to what was acknowledged: run it again");
      co_return exit_failure;
    }
    co_return exit_ok;
  }

  asio::io_context& io_;
  const Config& config_;
  Sink& sink_;
  const RedriveOptions& o_;
  const bool& stop_;
  const std::string& dlq_;
  const std::string group_;
  Consumer consumer_{nullptr, &close_consumer};
  std::map<int, std::int64_t> end_;   // per partition: where it ended at the start
  std::map<int, std::int64_t> next_;  // per partition: the next offset to settle
  std::uint64_t waiting_ = 0;
  // What is in flight, by token; per partition the offsets not yet settled,
  // so that the commit never passes one.
  std::unordered_map<std::uint64_t, Pending> pending_;
  std::map<int, std::set<std::int64_t>> unsettled_;
  // Per partition: how far it is read, one past the last record delivered,
  // or the end once the consumer reached it (past markers and aborted
  // records, which a read_committed consumer never delivers).
  std::map<int, std::int64_t> consumed_;
  std::uint64_t next_token_ = 1, redriven_ = 0, returned_ = 0, read_ = 0;
  std::optional<std::string> failure_;
  std::chrono::steady_clock::time_point last_commit_;
};

}  // namespace

asio::awaitable<int> run_redrive(asio::io_context& io, const Config& config, Sink& sink, const RedriveOptions& o,
                                 const bool& stop) {
  Redrive redrive(io, config, sink, o, stop);
  co_return co_await redrive.run();
}

}  // namespace walrelay
