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

}  // namespace

asio::awaitable<int> run_redrive(asio::io_context& io, const Config& config, Sink& sink, const RedriveOptions& o,
                                 const bool& stop) {
  const std::string& dlq = config.dlq_topic;
  if (dlq.empty()) {
    spdlog::critical("redrive: errors.deadletterqueue.topic.name is not set: there is no dead-letter topic to read");
    co_return exit_config;
  }
  const std::string group = o.group.empty() ? "walrelay-redrive." + config.slot_name : o.group;

  // The consumer: explicit assignment (no rebalance can move a partition
  // away mid-redrive), offsets committed by hand past what is settled.
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
    co_return exit_failure;
  }
  Consumer consumer(raw, [](rd_kafka_t* c) {
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
  });

  // The partitions and where each ends now: the redrive stops there, so the
  // records it writes back are left for the next one. Read committed, the end
  // is the last stable offset: a transaction still open is the next one's.
  std::map<int, std::int64_t> end;
  {
    rd_kafka_topic_t* rkt = rd_kafka_topic_new(consumer.get(), dlq.c_str(), nullptr);
    const rd_kafka_metadata_t* md = nullptr;
    auto e = rd_kafka_metadata(consumer.get(), 0, rkt, &md, 30000);
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 && !md->topics[0].err)
      for (int i = 0; i < md->topics[0].partition_cnt; ++i) end[md->topics[0].partitions[i].id] = 0;
    if (md) rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    if (end.empty()) {
      spdlog::critical("redrive: the dead-letter topic {} could not be read ({})", dlq,
                       e ? rd_kafka_err2str(e) : "it does not exist");
      co_return exit_failure;
    }
  }
  auto assignment = new_list(static_cast<int>(end.size()));
  for (auto& [p, high] : end) {
    std::int64_t low = 0;
    if (auto e = rd_kafka_query_watermark_offsets(consumer.get(), dlq.c_str(), p, &low, &high, 30000)) {
      spdlog::critical("redrive: the end of {} [{}] could not be read: {}", dlq, p, rd_kafka_err2str(e));
      co_return exit_failure;
    }
    rd_kafka_topic_partition_list_add(assignment.get(), dlq.c_str(), p);
  }
  if (auto e = rd_kafka_committed(consumer.get(), assignment.get(), 30000)) {
    spdlog::critical("redrive: the offsets of consumer group {} could not be read: {}", group, rd_kafka_err2str(e));
    co_return exit_failure;
  }
  std::map<int, std::int64_t> next;  // per partition: the next offset to settle
  std::uint64_t waiting = 0;
  for (int i = 0; i < assignment->cnt; ++i) {
    auto& tp = assignment->elems[i];
    if (tp.offset < 0) tp.offset = RD_KAFKA_OFFSET_BEGINNING;
    std::int64_t low = 0, high = 0;
    rd_kafka_query_watermark_offsets(consumer.get(), dlq.c_str(), tp.partition, &low, &high, 30000);
    next[tp.partition] = tp.offset >= 0 ? tp.offset : low;
    if (end[tp.partition] > next[tp.partition]) waiting += static_cast<std::uint64_t>(end[tp.partition] - next[tp.partition]);
  }
  spdlog::info("redrive: up to {} record(s) of {} to send again (consumer group {}; fewer when a transactional "
               "writer's markers or aborted records are among them)",
               waiting, dlq, group);
  if (waiting == 0) co_return exit_ok;
  if (auto e = rd_kafka_assign(consumer.get(), assignment.get())) {
    spdlog::critical("redrive: could not assign {}: {}", dlq, rd_kafka_err2str(e));
    co_return exit_failure;
  }

  OutboxMapper mapper(config);
  Metrics metrics;
  std::unique_ptr<SchemaEncoder> encoder;
  if (config.registry.format != RegistryFormat::none) encoder = std::make_unique<SchemaEncoder>(io, config, metrics);
  std::vector<std::regex> prefixes;
  for (auto& p : config.message_prefix_include_list) prefixes.emplace_back(p, std::regex::ECMAScript);
  // Tables are described once, on an ordinary connection, for their column types.
  PgConnection pg(io);
  std::map<std::string, TableRows> tables;
  pgoutput::Decoder decoder(1);
  pgoutput::MessageWriter writer;

  // What is in flight: token -> (partition, offset); per partition the
  // offsets not yet settled, so that the commit never passes one.
  struct Pending {
    int partition;
    std::int64_t offset;
    bool back_to_dlq;  // the copy is the dead-letter one: a failure now is a halt
  };
  std::unordered_map<std::uint64_t, Pending> pending;
  std::map<int, std::set<std::int64_t>> unsettled;
  // Per partition: how far it is read, one past the last record delivered,
  // or the end once the consumer reached it (past markers and aborted
  // records, which a read_committed consumer never delivers).
  std::map<int, std::int64_t> consumed = next;
  std::uint64_t next_token = 1, redriven = 0, returned = 0, read = 0;
  std::optional<std::string> failure;

  auto settle = [&](std::uint64_t token) {
    auto it = pending.find(token);
    if (it == pending.end()) return;
    unsettled[it->second.partition].erase(it->second.offset);
    pending.erase(it);
  };
  sink.on_delivery([&](const Delivery& d) {
    auto it = pending.find(d.token);
    if (it == pending.end()) return;
    if (d.ok) {
      (it->second.back_to_dlq ? returned : redriven)++;
      settle(d.token);
      return;
    }
    if (d.transient || d.denied || it->second.back_to_dlq) {
      // Not this record's fault, or its dead-letter copy refused too: stop
      // without committing past it; the next redrive sends it again.
      if (!failure)
        failure = "a record from " + dlq + " [" + std::to_string(it->second.partition) + "] offset " +
                  std::to_string(it->second.offset) + " could not be sent to " + std::string(d.topic) + ": " +
                  d.error_message;
      return;
    }
    // Refused again for its own reason: back to the dead-letter topic.
    spdlog::warn("redrive: refused again by {} ({}): back to {}", d.topic, d.error_message, dlq);
    it->second.back_to_dlq = true;
    DeadLetter dead = refused_record(d, config.dlq_context_headers);
    // A delivery report cannot wait for room: a full queue stops the redrive
    // before this record, which the next one sends again.
    if (sink.submit_dead_letter(dead.reason, dlq, dead.key, dead.value, dead.header_views(), d.token,
                                dead.size_bytes()) == SubmitStatus::queue_full &&
        !failure)
      failure = "the producer's queue was full for the dead-letter copy of the record from " + dlq + " [" +
                std::to_string(it->second.partition) + "] offset " + std::to_string(it->second.offset);
  });

  // Writes a dead letter back, with its attempts counted up.
  auto back_to_dlq = [&](DeadLetter dead, const Headers& before, std::uint64_t token) {
    int attempts = std::atoi(before.text(attempts_header).c_str()) + 1;
    std::erase_if(dead.headers, [](auto& h) { return h.first == attempts_header; });
    dead.headers.emplace_back(attempts_header, std::to_string(attempts));
    pending[token].back_to_dlq = true;
    // Called from catch blocks too, where a coroutine cannot wait: the queue
    // drains as the broker acknowledges, so wait in small sleeps, serving
    // reports, rather than spin.
    while (sink.submit_dead_letter(dead.reason, dlq, dead.key, dead.value, dead.header_views(), token,
                                   dead.size_bytes()) == SubmitStatus::queue_full) {
      sink.poll();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };

  auto last_commit = std::chrono::steady_clock::now();
  auto commit = [&](bool sync) {
    if (o.dry_run) return;
    auto list = new_list(static_cast<int>(next.size()));
    for (auto& [p, off] : consumed) {
      std::int64_t upto = unsettled[p].empty() ? off : *unsettled[p].begin();
      if (mutation::active(mutation::Break::redrive_commit_early)) upto = off;
      rd_kafka_topic_partition_list_add(list.get(), dlq.c_str(), p)->offset = upto;
    }
    if (auto e = rd_kafka_commit(consumer.get(), list.get(), sync ? 0 : 1))
      spdlog::warn("redrive: could not commit the offsets of {}: {}", group, rd_kafka_err2str(e));
    last_commit = std::chrono::steady_clock::now();
  };
  auto done_reading = [&] {
    for (auto& [p, e] : end)
      if (consumed[p] < e) return false;
    return true;
  };

  OutboxRecord record;
  while (!stop && !failure && !done_reading()) {
    sink.poll();
    // Every second, also while waiting for acknowledgements: what settled
    // is committed, so that a kill sends again only what had not.
    if (std::chrono::steady_clock::now() - last_commit >= 1s) {
      commit(false);
      spdlog::info("redrive: {} of {} read, {} sent on, {} back to {}", read, waiting, redriven, returned, dlq);
    }
    if (pending.size() >= static_cast<std::size_t>(config.max_inflight_records)) {
      co_await pause(io, 5ms);
      continue;
    }
    rd_kafka_message_t* m = rd_kafka_consumer_poll(consumer.get(), 0);
    if (!m) {
      co_await pause(io, 10ms);
      continue;
    }
    std::unique_ptr<rd_kafka_message_t, void (*)(rd_kafka_message_t*)> guard(m, &rd_kafka_message_destroy);
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
      // Its offset is the next one to fetch: everything before it was
      // delivered or is not to be (markers, aborted records). Never past the
      // end fixed at the start: what came since is the next redrive's.
      auto p = end.find(m->partition);
      if (p != end.end()) consumed[p->first] = std::max(consumed[p->first], std::min(m->offset, p->second));
      continue;
    }
    if (m->err) {
      spdlog::warn("redrive: reading {}: {}", dlq, rd_kafka_message_errstr(m));
      continue;
    }
    const int p = m->partition;
    if (m->offset >= end[p]) {
      // Written after the start: the next redrive's. Everything before the
      // end was delivered, in the partition's order, or is not to be.
      consumed[p] = std::max(consumed[p], end[p]);
      continue;
    }
    consumed[p] = m->offset + 1;
    ++read;
    const Headers h = headers_of(m);
    const std::optional<std::string_view> key =
        m->key ? std::optional<std::string_view>({static_cast<const char*>(m->key), m->key_len}) : std::nullopt;
    const std::optional<std::string_view> value =
        m->payload ? std::optional<std::string_view>({static_cast<const char*>(m->payload), m->len}) : std::nullopt;
    const std::string kind = h.text("__connect.errors.exception.class.name");
    const std::uint64_t token = next_token++;
    auto copy_back = [&](const std::string& reason, const std::string& why) {
      DeadLetter dead;
      dead.reason = reason;
      if (key) dead.key = std::string(*key);
      if (value) dead.value = std::string(*value);
      dead.headers = h.all;
      std::erase_if(dead.headers, [](auto& x) { return x.first == "__connect.errors.exception.message"; });
      dead.headers.emplace_back("__connect.errors.exception.message", why);
      return dead;
    };
    if (o.dry_run) {
      spdlog::info("redrive: --dry-run: {} [{}] offset {}: {} ({})", dlq, p, m->offset, kind.empty() ? "?" : kind,
                   h.text("walrelay.error.reason"));
      continue;
    }
    pending[token] = Pending{p, m->offset, false};
    unsettled[p].insert(m->offset);

    if (kind == "walrelay.DeliveryError" && h.find("__connect.errors.topic") &&
        !h.find("walrelay.value.dropped.bytes")) {
      // Refused by the broker: as it was, to the topic it was meant for.
      const std::string topic = h.text("__connect.errors.topic");
      std::vector<std::pair<std::string, std::optional<std::string>>> kept;
      for (auto& x : h.all)
        if (!context_header(x.first)) kept.push_back(x);
      record = OutboxRecord{};
      record.topic = topic;
      record.key = key;
      record.value = value;
      rd_kafka_timestamp_type_t ts_type;
      record.timestamp_ms = rd_kafka_message_timestamp(m, &ts_type);
      for (auto& [n, v] : kept) record.headers.push_back({n, v ? std::optional<std::string_view>(*v) : std::nullopt});
      if (auto* id = h.find("id"); id && *id) record.event_id = **id;
      co_await submit_when_taken(io, sink, record, token);
      continue;
    }

    std::optional<MapError> error;
    std::optional<pgoutput::Insert> insert_holder;
    if (kind == "walrelay.MappingError" && h.find("walrelay.source.table") && value) {
      // A row: the image the dead letter carries, mapped again.
      const std::string table_name = h.text("walrelay.source.table");
      auto t = tables.find(table_name);
      if (t == tables.end()) {
        auto dot = table_name.find('.');
        TableName name{table_name.substr(0, dot), dot == std::string::npos ? "" : table_name.substr(dot + 1)};
        try {
          if (!pg.connected())
            co_await pg.connect(config.conninfo(false), std::chrono::milliseconds(config.database_connect_timeout_ms));
          TableRows rows = co_await describe_table(pg, name);
          rows.relation(writer);
          auto rel = decoder.decode(writer.bytes());
          if (!rel || !mapper.on_relation(std::get<pgoutput::Relation>(rel.value())))
            throw PgError(table_name + " is not in table.include.list", "");
          t = tables.emplace(table_name, std::move(rows)).first;
        } catch (const PgError& e) {
          back_to_dlq(copy_back("redrive_failed", "redrive: " + std::string(e.what())), h, token);
          continue;
        }
      }
      Json row;
      try {
        row = Json::parse(*value);
      } catch (const std::exception& e) {
        back_to_dlq(copy_back("redrive_failed", "redrive: the row image is not JSON"), h, token);
        continue;
      }
      const TableRows& rows = t->second;
      writer.insert(rows.oid, static_cast<std::uint16_t>(rows.columns.size()));
      std::vector<std::string> texts;  // held while the Insert views them
      for (auto& c : rows.columns) {
        auto it = row.find(c.name);
        if (it == row.end() || it->is_null()) writer.null();
        else if (it->is_string()) writer.text(it->template get_ref<const std::string&>());
        else writer.text(texts.emplace_back(it->dump()));
      }
      auto decoded = decoder.decode(writer.bytes());
      if (!decoded || !std::holds_alternative<pgoutput::Insert>(decoded.value())) {
        back_to_dlq(copy_back("redrive_failed", "redrive: the row image could not be encoded"), h, token);
        continue;
      }
      const auto& insert = std::get<pgoutput::Insert>(decoded.value());
      error = mapper.map(insert, pgoutput::pg_epoch_micros_now(), record);
      if (!error) error = co_await encode_when_ready(io, encoder.get(), record, stop);
      if (error) {
        spdlog::warn("redrive: the row of {} with id {} still cannot be mapped ({}): back to {}", table_name,
                     h.text("id"), error->message, dlq);
        DeadLetter dead = unmappable_row(mapper, insert, *error, pgoutput::Lsn::parse(h.text("walrelay.source.lsn"))
                                                                      .value_or(pgoutput::Lsn{}),
                                         config.dlq_context_headers);
        back_to_dlq(std::move(dead), h, token);
        continue;
      }
    } else if (kind == "walrelay.MappingError" && h.find("walrelay.source.message.prefix") && value) {
      // A logical message: its content, mapped again.
      const std::string prefix = h.text("walrelay.source.message.prefix");
      int source = -1;
      for (std::size_t i = 0; i < prefixes.size() && source < 0; ++i)
        if (std::regex_match(prefix, prefixes[i])) source = static_cast<int>(i);
      if (source < 0 || h.text("walrelay.source.message.transactional") != "true") {
        back_to_dlq(copy_back("redrive_failed", source < 0 ? "redrive: prefix " + prefix +
                                                                 " matches no pattern of message.prefix.include.list"
                                                           : "redrive: a non-transactional message is never relayed"),
                    h, token);
        continue;
      }
      pgoutput::LogicalMessage message{std::nullopt, 1,
                                       pgoutput::Lsn::parse(h.text("walrelay.source.lsn")).value_or(pgoutput::Lsn{}),
                                       prefix,
                                       {reinterpret_cast<const std::byte*>(value->data()), value->size()}};
      error = mapper.map_message(message, pgoutput::pg_epoch_micros_now(),
                                 static_cast<std::uint16_t>(config.table_include_list.size() + source), record);
      if (!error) error = co_await encode_when_ready(io, encoder.get(), record, stop);
      if (error) {
        back_to_dlq(unmappable_message(message, *error, config.dlq_context_headers), h, token);
        continue;
      }
    } else {
      back_to_dlq(copy_back("not_redrivable",
                            kind.empty() ? "redrive: no context headers say where this record goes (set "
                                           "errors.deadletterqueue.context.headers.enable=true)"
                                         : "redrive: its value was not kept (" + h.text("walrelay.error.reason") +
                                               "), so it cannot be sent again"),
                  h, token);
      continue;
    }
    if (stop) break;  // a stop while the registry was waited for: unsent, so not committed past
    co_await submit_when_taken(io, sink, record, token);
  }
  // Everything sent settles before the last commit; a stop waits shutdown.timeout.ms.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(config.shutdown_timeout_ms);
  while (!pending.empty() && !failure && (!stop || std::chrono::steady_clock::now() < deadline)) {
    sink.poll();
    co_await pause(io, 20ms);
  }
  commit(true);
  spdlog::info("redrive: {} record(s) of {} read: {} sent on to their topics, {} back to {}{}", read, dlq, redriven,
               returned, dlq, o.dry_run ? " (--dry-run: nothing sent, nothing committed)" : "");
  if (failure) {
    spdlog::error("redrive: stopped: {}; the offsets are committed up to it: run redrive again", *failure);
    co_return exit_halted;
  }
  if (stop) {
    spdlog::warn("redrive: interrupted; the offsets are committed up to what was acknowledged: run it again");
    co_return exit_failure;
  }
  co_return exit_ok;
}

}  // namespace walrelay
