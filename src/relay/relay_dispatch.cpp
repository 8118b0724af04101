// What each replication message and each delivery report does: outbox rows
// become records for the sink, acknowledgements settle them in the ledger,
// failures go to the configured policy (see relay.hpp for the other files).
#include <spdlog/spdlog.h>

#include <algorithm>

#include "walrelay/sinks/dead_letter.hpp"
#include "walrelay/logging.hpp"
#include "walrelay/mutation.hpp"
#include "walrelay/relay/relay.hpp"

namespace walrelay {
using pgoutput::Lsn;

namespace {

// Seconds from a commit timestamp (PostgreSQL epoch micros, the server's
// clock) to now on ours; a sidecar shares the host's clock.
double seconds_since(std::int64_t commit_time_us) {
  return static_cast<double>(pgoutput::pg_epoch_micros_now() - commit_time_us) / 1e6;
}

}  // namespace

// One CopyData message: a keepalive, or XLogData carrying a pgoutput message.
Relay::Step Relay::handle_copy_data(std::span<const std::byte> data) {
  auto decoded = pgoutput::decode_replication_message(data);
  if (!decoded) {
    metrics_.decode_errors.Increment();
    halt(std::string("could not decode a replication message: ") + pgoutput::to_string(decoded.error().code) +
         " at byte " + std::to_string(decoded.error().offset) + " (" + std::string(decoded.error().detail) + ")", "stream");
    return Step::stop;
  }
  metrics_.messages_received.Increment();
  if (auto* ka = std::get_if<pgoutput::PrimaryKeepalive>(&decoded.value())) {
    stream_wal_end_ = std::max(stream_wal_end_, ka->wal_end);
    ledger_.server_position(ka->wal_end);
    if (ka->reply_requested) reply_requested_ = true;
    return Step::done;
  }
  return handle_message(std::get<pgoutput::XLogData>(decoded.value()));
}

// One pgoutput message: transactions open and commit in the ledger, outbox
// inserts become records, everything unasked-for halts.
Relay::Step Relay::handle_message(const pgoutput::XLogData& xlog) {
  stream_wal_end_ = std::max(stream_wal_end_, xlog.wal_end);
  auto decoded = decoder_.decode(xlog.payload);
  if (!decoded) {
    metrics_.decode_errors.Increment();
    halt("could not decode a pgoutput message at " + xlog.wal_start.to_string() + ": " +
         pgoutput::to_string(decoded.error().code) + " at byte " + std::to_string(decoded.error().offset) + " (" +
         std::string(decoded.error().detail) + ")", "stream");
    return Step::stop;
  }
  Step step = Step::done;
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, pgoutput::Begin>) {
          // Its commit record starts before the committed position ends:
          // this transaction is in Kafka already.
          skipping_txn_ = skip_until_ && m.final_lsn < *skip_until_;
          if (skipping_txn_) metrics_.exactly_once_skipped.Increment();
          txn_ = ledger_.open(m.commit_time, m.final_lsn);
          xid_ = m.xid;
          commit_time_ = m.commit_time;
          position_lsn_ = m.final_lsn.value;
          // Places count from the transaction's own first change: one sent
          // again after a reconnect may start at the change seen last.
          if (!mutation::active(mutation::Break::redis_place_not_reset)) {
            position_change_lsn_ = 0;
            position_rank_ = 0;
          }
        } else if constexpr (std::is_same_v<T, pgoutput::Commit>) {
          const bool had_records = txn_ && ledger_.had_records(*txn_);
          if (had_records) metrics_.commit_to_receive.Observe(seconds_since(commit_time_));
          if (txn_) ledger_.commit(*txn_, m.end_lsn);
          if (had_records && transactional_) transactional_->source_transaction_ended(m.end_lsn);
          skipping_txn_ = false;
          txn_.reset();
          last_commit_end_ = m.end_lsn;
          metrics_.transactions.Increment();
        } else if constexpr (std::is_same_v<T, pgoutput::Relation>) {
          bool outbox = mapper_.on_relation(m);
          spdlog::debug("{} relation {} oid={} outbox={}", context(), mapper_.table_name(m.oid), m.oid, outbox);
        } else if constexpr (std::is_same_v<T, pgoutput::Insert>) {
          if (skipping_txn_) return;
          const bool outbox = mapper_.is_outbox(m.relation_oid);
          if (outbox) at_change(xlog.wal_start);
          step = outbox ? relay_insert(m, xlog.wal_start) : skip_insert(m, xlog.wal_start);
          if (outbox && step != Step::retry) ++position_rank_;  // offered again: the same place
        } else if constexpr (std::is_same_v<T, pgoutput::LogicalMessage>) {
          if (!message_prefixes_.empty() && !m.xid) {
            at_change(xlog.wal_start);
            step = on_logical_message(m);
            if (step != Step::retry) ++position_rank_;
          } else {
            metrics_.decode_errors.Increment();
            halt("unexpected logical message at " + xlog.wal_start.to_string() +
                 (m.xid ? ": walrelay asked for committed transactions only"
                        : ": walrelay did not ask for messages (message.prefix.include.list is empty)"), "stream");
            step = Step::stop;
          }
        } else if constexpr (std::is_same_v<T, pgoutput::Update>) {
          // An outbox is a queue: an update of one of its rows is no event.
          // A publication of walrelay's own sends inserts only; one made by
          // hand may send updates too.
          if (!skipping_txn_ && mapper_.is_outbox(m.relation_oid)) step = invalid_operation(m.relation_oid, xlog.wal_start);
        } else if constexpr (std::is_same_v<T, pgoutput::Delete> ||
                             std::is_same_v<T, pgoutput::Truncate> || std::is_same_v<T, pgoutput::Type> ||
                             std::is_same_v<T, pgoutput::Origin>) {
          // Not outbox events: a publication that someone else widened.
        } else {
          // Streamed or prepared transactions and logical messages are never
          // requested; receiving one means the stream is not what the ledger
          // assumes (committed transactions only, each whole).
          metrics_.decode_errors.Increment();
          halt(std::string("unexpected ") + pgoutput::message_name(decoded.value()) + " message at " +
               xlog.wal_start.to_string() + ": walrelay asked for committed transactions only", "stream");
          step = Step::stop;
        }
      },
      decoded.value());
  if (step != Step::retry) received_lsn_ = std::max(received_lsn_, xlog.wal_start);
  return step;
}

// An outbox row: mapped to a record and handed to the sink, or a mapping
// error under errors.tolerance.
Relay::Step Relay::relay_insert(const pgoutput::Insert& insert, Lsn lsn) {
  if (!txn_) {
    halt("Insert outside a transaction at " + lsn.to_string(), "stream");
    return Step::stop;
  }
  if (auto error = mapper_.map(insert, commit_time_, record_)) {
    metrics_.mapping_errors(error->reason).Increment();
    return dead_letter_row(insert, *error, lsn);
  }
  Step pending = Step::done;
  if (auto error = encode_value(pending)) {
    metrics_.mapping_errors(error->reason).Increment();
    return dead_letter_row(insert, *error, lsn);
  }
  if (pending == Step::retry) return pending;
  record_.position = position_of_record();
  return submit_record();
}

// A change at `lsn` (rows of one WAL record share it).
void Relay::at_change(Lsn lsn) {
  if (lsn.value == position_change_lsn_) return;
  position_change_lsn_ = lsn.value;
  position_rank_ = 0;
}

// The record's place in the stream, none for an initial snapshot's rows: its
// transaction's commit LSN, and within it a number that rises with the
// change's own LSN and its rank in its WAL record. Made from the WAL alone,
// not from how many outbox rows came before, so the same event gets the same
// place whatever table.include.list or the publication said when it was
// first sent (a table added between a crash and the restart).
std::optional<OutboxRecord::Position> Relay::position_of_record() const {
  if (position_lsn_ == 0) return std::nullopt;
  // A transaction's changes lie within 2^47 bytes (128 TiB) before its commit.
  constexpr std::uint64_t span = std::uint64_t{1} << 47;
  const std::uint64_t back = std::min(position_lsn_ - std::min(position_change_lsn_, position_lsn_), span - 1);
  return OutboxRecord::Position{position_lsn_, ((span - back) << 16) | std::min<std::uint64_t>(position_rank_, 0xffff)};
}

std::optional<MapError> Relay::encode_value(Step& pending) {
  if (!schema_encoder_) return std::nullopt;
  MapError error;
  switch (schema_encoder_->encode(record_, error)) {
    case SchemaEncoder::Status::encoded: break;
    case SchemaEncoder::Status::pending:
      if (mutation::active(mutation::Break::registry_dead_letters) && !schema_encoder_->problem().empty())
        return MapError{"schema_unavailable", schema_encoder_->problem()};
      // The schema is being fetched, or the registry does not answer: the
      // row is offered again (the stream waits; nothing is dead-lettered).
      pending = Step::retry;
      break;
    case SchemaEncoder::Status::failed: return error;
  }
  return std::nullopt;
}

Relay::Step Relay::submit_record() {
  if (!mapper_.trace_problem().empty()) {
    // The event goes out without trace headers: a trace is worth a warning,
    // never an event.
    metrics_.trace_context_errors.Increment();
    const auto n = static_cast<std::uint64_t>(metrics_.trace_context_errors.Value());
    if (n <= 10 || n % 1000 == 0)
      spdlog::warn("{} an event's trace context ({}) was left out: {} (walrelay_trace_context_errors_total={})",
                   context(), config_.tracing_span_context_field, mapper_.trace_problem(), n);
  }
  std::size_t bytes = record_.size_bytes();
  std::uint16_t table = record_.table_index;
  // Counted before submit: a synchronous rejection reports its delivery at once.
  ledger_.add_record(*txn_, bytes);
  check_ledger();
  switch (sink_.submit(record_, make_token(*txn_, table))) {
    case SubmitStatus::accepted:
    case SubmitStatus::refused_reported:  // on_delivery has run already, inside submit()
      return halt_reason_ ? Step::stop : Step::done;
    case SubmitStatus::queue_full:
      ledger_.withdraw(*txn_, bytes);  // not taken: offered again later
      return Step::retry;
  }
  return Step::done;
}

// An UPDATE of an outbox row: skipped and counted, logged as
// table.op.invalid.behavior says (Debezium's router: warn or error and go
// on, or fatal), or a halt before it.
Relay::Step Relay::invalid_operation(std::uint32_t relation_oid, Lsn lsn) {
  const std::string table(mapper_.table_name(relation_oid));
  const std::string what = "an UPDATE of a row of outbox table " + table + " at " + lsn.to_string() +
                           ": an outbox takes inserts only";
  if (config_.op_invalid_behavior == InvalidOperation::fatal) {
    halt(what + " (table.op.invalid.behavior=fatal; publish inserts only: ALTER PUBLICATION " +
         config_.publication_name + " SET (publish = 'insert'))", "record");
    return Step::stop;
  }
  // The counter is found once per table, as skip_insert's: no label hashing per row.
  auto [it, first] = invalid_operations_.try_emplace(relation_oid, nullptr);
  if (first) it->second = &metrics_.invalid_operations(table);
  it->second->Increment();
  if (config_.op_invalid_behavior == InvalidOperation::warn)
    spdlog::warn("{} {}; skipped (table.op.invalid.behavior=warn), counted in walrelay_invalid_operations_total",
                 context(), what);
  else
    spdlog::error("{} {}; skipped (table.op.invalid.behavior=error), counted in walrelay_invalid_operations_total",
                  context(), what);
  return Step::done;
}

// A row of a table that is not an outbox table: counted, warned about once.
Relay::Step Relay::skip_insert(const pgoutput::Insert& insert, Lsn lsn) {
  auto table = mapper_.table_name(insert.relation_oid);
  if (table.empty()) {
    metrics_.decode_errors.Increment();
    halt("Insert at " + lsn.to_string() + " for relation OID " + std::to_string(insert.relation_oid) +
         " that no Relation message described: the stream is not what walrelay expects", "stream");
    return Step::stop;
  }
  auto [it, first] = skipped_.try_emplace(insert.relation_oid, nullptr);
  if (first) {
    it->second = &metrics_.skipped_rows(table);
    spdlog::warn("{} the publication sends inserts into {}, which is not in table.include.list: its rows are "
                 "skipped and counted in walrelay_skipped_rows_total (a partition of a partitioned outbox? the "
                 "publication then needs publish_via_partition_root = true)",
                 context(), table);
  }
  it->second->Increment();
  return Step::done;
}

// A row that cannot be mapped: a halt (errors.tolerance=none) or its
// dead-letter copy, which settles it once acknowledged.
Relay::Step Relay::dead_letter_row(const pgoutput::Insert& insert, const MapError& error, Lsn lsn) {
  std::string where = "table " + std::string(mapper_.table_name(insert.relation_oid)) + " id " +
                      mapper_.event_id_of(insert) + " at LSN " + lsn.to_string() + " (xid " + std::to_string(xid_) + ")";
  if (!tolerate("map the outbox row of " + where, "this row", error)) return Step::stop;
  const DeadLetter dead = unmappable_row(mapper_, insert, error, lsn, config_.dlq_context_headers);
  if (mutation::active(mutation::Break::skip_dlq_wait)) {
    // The row counts as settled at once; its copy's report is ignored.
    sink_.submit_dead_letter(dead.reason, config_.dlq_topic, dead.key, dead.value, dead.header_views(),
                             make_token(*txn_, mutation_ignored_table), dead.size_bytes());
    return Step::done;
  }
  return submit_dead_letter(dead);
}

// errors.tolerance for an event that cannot be relayed: none halts (false),
// all logs where its dead-letter copy goes (true).
bool Relay::tolerate(const std::string& what, std::string_view subject, const MapError& error) {
  if (config_.errors_tolerance == ErrorTolerance::none) {
    halt("could not " + what + ": " + error.message + " (errors.tolerance=none; nothing past " + std::string(subject) +
         " is confirmed)", "record");
    return false;
  }
  spdlog::error("{} could not {}: {}; sending it to {}", context(), what, error.message, config_.dlq_topic);
  return true;
}

// A dead-letter copy inside the open transaction; it settles the event once
// acknowledged.
Relay::Step Relay::submit_dead_letter(const DeadLetter& dead) {
  if (!waiting_dead_letters_.empty()) return Step::retry;  // behind the copies that wait for room
  const std::size_t bytes = dead.size_bytes();
  ledger_.add_record(*txn_, bytes);
  auto status = sink_.submit_dead_letter(dead.reason, config_.dlq_topic, dead.key, dead.value, dead.header_views(),
                                         make_token(*txn_, 0), bytes);
  if (status == SubmitStatus::queue_full) {
    ledger_.withdraw(*txn_, bytes);
    return Step::retry;  // offered again with the same ledger entry
  }
  return halt_reason_ ? Step::stop : Step::done;
}

// The include-list entry of a prefix, looked up by regular expression once
// per distinct prefix (past a bound, every time).
Relay::PrefixSource& Relay::prefix_source(std::string_view prefix) {
  if (auto it = prefix_sources_.find(prefix); it != prefix_sources_.end()) return it->second;
  static thread_local PrefixSource uncached;
  PrefixSource found;
  const std::string name(prefix);
  for (std::size_t i = 0; i < message_prefixes_.size() && found.source < 0; ++i)
    if (std::regex_match(name, message_prefixes_[i])) found.source = static_cast<int>(i);
  if (prefix_sources_.size() >= max_prefix_entries) {
    uncached = found;
    if (found.source < 0) uncached.skipped = &metrics_.skipped_messages(other_topics_label);
    return uncached;
  }
  if (found.source < 0) {
    found.skipped = &metrics_.skipped_messages(name);
    spdlog::warn("{} logical messages with prefix \"{}\" match no pattern of message.prefix.include.list: they "
                 "are skipped and counted in walrelay_skipped_messages_total",
                 context(), name);
  }
  return prefix_sources_.emplace(name, found).first->second;
}

// A logical message. A transactional one arrives inside its transaction, in
// commit order, and only if it committed: mapped like a row. One that is not
// transactional was written whether or not its transaction committed, so it
// is refused (errors.tolerance: a halt, or the dead-letter topic).
Relay::Step Relay::on_logical_message(const pgoutput::LogicalMessage& message) {
  PrefixSource& source = prefix_source(message.prefix);
  if (source.source < 0) {
    source.skipped->Increment();
    return Step::done;
  }
  if (!message.transactional()) {
    // Exactly once: in Kafka already if at or below the committed position.
    if (skip_until_ && message.lsn <= *skip_until_) return Step::done;
    // Sent as decoded, so between transactions, never inside one (a retry
    // of this very message excepted).
    if (txn_ && !message_txn_) {
      halt("non-transactional logical message at " + message.lsn.to_string() +
           " inside a transaction: the stream is not what walrelay expects", "stream");
      return Step::stop;
    }
    metrics_.mapping_errors("non_transactional").Increment();
    return dead_letter_message(
        message, MapError{"non_transactional",
                          "the message was emitted with transactional=false: it is written at once, whether or not "
                          "the transaction around it commits, so relaying it could publish an event of a rolled-back "
                          "transaction; emit outbox messages with pg_logical_emit_message(true, ...)"});
  }
  if (skipping_txn_) return Step::done;
  if (!txn_) {
    halt("transactional logical message outside a transaction at " + message.lsn.to_string(), "stream");
    return Step::stop;
  }
  const auto index = static_cast<std::uint16_t>(config_.table_include_list.size() + static_cast<std::size_t>(source.source));
  if (auto error = mapper_.map_message(message, commit_time_, index, record_)) {
    metrics_.mapping_errors(error->reason).Increment();
    return dead_letter_message(message, *error);
  }
  Step pending = Step::done;
  if (auto error = encode_value(pending)) {
    metrics_.mapping_errors(error->reason).Increment();
    return dead_letter_message(message, *error);
  }
  if (pending == Step::retry) return pending;
  record_.position = position_of_record();
  return submit_record();
}

// A message that cannot be relayed: a halt (errors.tolerance=none) or its
// dead-letter copy. A non-transactional message has no transaction of its
// own in the ledger: it gets one, at its LSN.
Relay::Step Relay::dead_letter_message(const pgoutput::LogicalMessage& message, const MapError& error) {
  std::string where = "logical message with prefix \"" + printable(message.prefix, 100) + "\" at LSN " +
                      message.lsn.to_string() +
                      (message.transactional() ? " (xid " + std::to_string(xid_) + ")" : " (not transactional)");
  if (!tolerate("relay the " + where, "it", error)) return Step::stop;
  const DeadLetter dead = unmappable_message(message, error, config_.dlq_context_headers);
  const bool own_txn = !message.transactional();
  if (own_txn && !txn_) {
    txn_ = ledger_.open(pgoutput::pg_epoch_micros_now(), message.lsn);
    message_txn_ = true;
  }
  const Step step = submit_dead_letter(dead);
  if (step == Step::retry) return step;
  if (own_txn) {
    ledger_.commit(*txn_, message.lsn);
    if (transactional_) transactional_->source_transaction_ended(message.lsn);
    txn_.reset();
    message_txn_ = false;
  }
  return step;
}

// Halts when the ledger reports a broken invariant.
void Relay::check_ledger() {
  if (auto& v = ledger_.violation(); v && !halt_reason_)
    halt("internal error: the LSN ledger's bookkeeping broke (" + *v +
         "); walrelay stops rather than confirm a position it cannot vouch for", "internal");
}

// walrelay_events_relayed_total's series for a table and topic, made once.
prometheus::Counter& Relay::relayed_counter(std::uint16_t table, std::string_view topic) {
  auto& by_topic = relayed_counters_.at(table);
  auto it = by_topic.find(topic);  // heterogeneous: no string built per ack
  if (it != by_topic.end()) return *it->second;
  // Topics come from row data: past a bound, new ones share one series whose
  // label no Kafka topic can have, so the scrape stays small.
  std::size_t series = 0;
  for (auto& t : relayed_counters_) series += t.size();
  if (series >= max_topic_series) {
    auto other = by_topic.find(other_topics_label);
    if (other != by_topic.end()) return *other->second;
    spdlog::warn("{} events for more than {} topics: further topics are counted under topic=\"{}\"", context(),
                 max_topic_series, other_topics_label);
    topic = other_topics_label;
  }
  auto& c = metrics_.events_relayed(table_names_.at(table), topic);
  by_topic.emplace(std::string(topic), &c);
  return c;
}

// One delivery report: an acknowledgement settles the record in the ledger;
// a failure that is not the record's own replays, one that is goes to
// errors.tolerance (a halt, or the dead-letter topic).
void Relay::on_delivery(const Delivery& d) {
  if (mutation::active(mutation::Break::skip_dlq_wait) && token_table(d.token) == mutation_ignored_table) return;
  auto txn = token_txn(d.token);
  if (d.ok) {
    ++delivered_;
    ledger_.ack(txn, d.bytes);
    check_ledger();
    if (d.dead_lettered) {
      metrics_.dead_lettered(d.dead_letter_reason).Increment();
    } else {
      relayed_counter(token_table(d.token), d.topic).Increment();
      metrics_.bytes_relayed.Increment(static_cast<double>(d.bytes));
    }
    if (backpressured_ && has_room()) wake_.cancel();
    return;
  }
  metrics_.delivery_errors(d.error_code).Increment();
  ++failed_records_;  // stays in the ledger: nothing at or past it is confirmed
  auto lsn = ledger_.commit_lsn_of(txn);
  std::string id;
  for (auto& h : d.headers)
    if (h.name == "id" && h.value) id = std::string(*h.value);
  std::string where = "record for topic " + std::string(d.topic) + " (table " +
                      table_names_.at(token_table(d.token)) + ", id " + id + ", transaction commit LSN " +
                      (lsn ? lsn->to_string() : std::string("?")) + ")";
  if (d.denied) {
    // Never a dead letter: every event would go there until the permission
    // is granted.
    halt_on_record("could not deliver the " + where + ": " + d.error_message + " (" + d.error_code +
                   "). A missing permission is never a reason to dead-letter: grant it, then restart");
    return;
  }
  if (d.transient) {
    // Not the record's fault: it is sent again, never dead-lettered. Sending
    // it alone would overtake nothing but could be overtaken; the slot gives
    // every record from the first unacknowledged one again, in order.
    replay("could not deliver the " + where + ": " + d.error_message + " (" + d.error_code + ", transient)");
    return;
  }
  if (transactional_ && !d.at_submit) {
    // The broker refused it inside a Kafka transaction, which can no longer
    // commit; its dead-letter copy would go down with it, and a replay would
    // meet the same refusal.
    halt_on_record("could not deliver the " + where + ": " + d.error_message + " (" + d.error_code +
                   "); in exactly-once mode a record the broker refuses fails its whole Kafka transaction. Make the "
                   "producer refuse such records before they are sent (kafka.message.max.bytes no larger than the "
                   "topic's max.message.bytes), or fix the topic, then restart");
    return;
  }
  if (d.dead_lettered) {
    halt_on_record("could not write to the dead-letter topic " + config_.dlq_topic + ": " + d.error_message + " (" +
                   where + ")");
    return;
  }
  if (config_.errors_tolerance == ErrorTolerance::none) {
    halt_on_record("could not deliver the " + where + ": " + d.error_message + " (" + d.error_code +
                   "; errors.tolerance=none; nothing past this record is confirmed)");
    return;
  }
  dead_letter_refused(d, where);
}

void Relay::halt_on_record(std::string reason) {
  halt(std::move(reason), "record");
  // A record refused at submit never reached the Kafka transaction, which
  // could still commit, with the source transactions queued behind it and a
  // position past the record. Aborting takes them all back; the committed
  // position is where a restart resumes.
  if (transactional_) transactional_->abandon_transaction();
}

// A record the broker refused for its own reason, under errors.tolerance=all:
// its dead-letter copy takes over its ledger entry.
void Relay::dead_letter_refused(const Delivery& d, const std::string& where) {
  if (replay_reason_) {
    // Everything from the slot's confirmed position is about to be sent
    // again, this record too, and the ledger is reset: a copy queued now
    // would outlive the reset. It stays failed; the broker refuses it again
    // after the replay, and then it is dead-lettered.
    spdlog::error("{} could not deliver the {}: {} ({}); a replay is under way, which sends it again", context(),
                  where, d.error_message, d.error_code);
    return;
  }
  spdlog::error("{} could not deliver the {}: {} ({}); sending it to {}", context(), where, d.error_message,
                d.error_code, config_.dlq_topic);
  const DeadLetter dead = refused_record(d, config_.dlq_context_headers);
  auto txn = token_txn(d.token);
  --failed_records_;  // handed on: its dead-letter copy settles it
  if (mutation::active(mutation::Break::skip_dlq_wait)) {
    ledger_.ack(txn, d.bytes);
    sink_.submit_dead_letter(dead.reason, config_.dlq_topic, dead.key, dead.value, dead.header_views(),
                             make_token(txn, mutation_ignored_table), d.bytes);
    return;
  }
  if (waiting_dead_letters_.empty()) {
    auto status = sink_.submit_dead_letter(dead.reason, config_.dlq_topic, dead.key, dead.value, dead.header_views(),
                                           d.token, d.bytes);
    if (status != SubmitStatus::queue_full) return;
  }
  if (transactional_) {
    // Exactly once: the open Kafka transaction may commit a position past
    // the record's source transaction before a waiting copy joins it, so it
    // is aborted instead.
    ++failed_records_;
    halt_on_record("could not queue the dead-letter copy of the " + where + ": producer queue full");
    return;
  }
  // No room now (the broker's connection is down, the producer's queue
  // full): a transient state, so the copy waits and is handed over once
  // there is room. Never dropped, and nothing past the record is confirmed
  // meanwhile: it stays unsettled.
  if (mutation::active(mutation::Break::dead_letter_drop_when_full)) {
    ledger_.ack(txn, d.bytes);  // the copy dropped, the record settled as if it had landed
    return;
  }
  ++failed_records_;
  spdlog::warn("{} the dead-letter copy of the {} waits for room in the sink ({}); nothing is read meanwhile",
               context(), where, sink_.healthy() ? "its queue is full" : sink_.health_reason());
  waiting_dead_letters_.push_back(WaitingDeadLetter{dead, d.token, d.bytes, where});
  send_waiting_dead_letters();
}

void Relay::send_waiting_dead_letters() {
  while (!waiting_dead_letters_.empty()) {
    // Out of the queue first: a report inside submit may start a replay, which empties it.
    WaitingDeadLetter w = std::move(waiting_dead_letters_.front());
    waiting_dead_letters_.pop_front();
    auto status = sink_.submit_dead_letter(w.dead.reason, config_.dlq_topic, w.dead.key, w.dead.value,
                                           w.dead.header_views(), w.token, w.bytes);
    if (status == SubmitStatus::queue_full) {
      waiting_dead_letters_.push_front(std::move(w));
      break;
    }
    // Taken (or refused at once, reported already): its report settles it.
    --failed_records_;
    spdlog::info("{} the dead-letter copy of the {} is handed over", context(), w.where);
    if (waiting_dead_letters_.empty()) wake_.cancel();  // reads held back for it go on
  }
  if (waiting_dead_letters_.empty() || dead_letter_retry_armed_) return;
  dead_letter_retry_armed_ = true;
  dead_letter_retry_.expires_after(std::chrono::milliseconds(20));
  dead_letter_retry_.async_wait([this](boost::system::error_code ec) {
    if (ec) return;  // the timer destroyed with the relay
    dead_letter_retry_armed_ = false;
    send_waiting_dead_letters();
  });
}

}  // namespace walrelay
