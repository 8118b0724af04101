// Guarantees broken on purpose, for tests/mutation/run.sh: it shows that the
// tests named for each break fail against it. Only the walrelay-mutation
// binary and the test executables are compiled with WALRELAY_MUTATION_TESTING;
// in walrelay itself every check below is a constant false and compiles away.
#pragma once

#include <string_view>

namespace walrelay::mutation {

enum class Break {
  none,
  confirm_before_ack,  // the slot confirmed as far as the newest Commit received, acknowledged or not
  drop_records,        // one record in ten accepted and never produced, with no delivery report
  reorder_key,         // a record held back and produced after the next record of the same key
  skip_dlq_wait,       // a record settled as soon as its dead-letter copy is queued
  sigterm_no_wait,     // SIGTERM confirms the newest Commit received at once, without draining
  confirm_past_abort,  // exactly once: with no Kafka transaction open, everything acknowledged is confirmable (0.2)
  registry_dead_letters,  // a record whose schema the registry does not give now is dead-lettered, not held
  nats_ack_at_publish,    // NATS JetStream: a record reported delivered once handed to nats.c, before its PubAck
  snapshot_resume_as_done,  // an interrupted initial snapshot's slot streamed from as if the snapshot had finished
  redrive_commit_early,     // redrive commits the dead-letter offsets as far as it has read, acknowledged or not
  snapshot_commit_chunks,   // exactly once: each chunk of the snapshot committed at the consistent point
  snapshot_retake_new_slot,   // an interrupted snapshot's slot dropped and made again (losing what it held)
  snapshot_retake_unfiltered, // an interrupted snapshot taken again with every row, not only those its view saw
  rabbitmq_keep_queued,     // RabbitMQ: a lost connection fails only the publishes in flight; queued ones go out next
  dead_letter_drop_when_full,  // a dead-letter copy that finds the sink's queue full is dropped, its record settled
  avro_decimal_rounds,      // an Avro decimal's digits past the schema's scale cut off instead of refused
  json_schema_draft4,       // every JSON Schema validated by draft 4's rules, whatever its $schema says
  ledger_unbounded,         // the ledger keeps every transaction acknowledged behind an unacknowledged one
  redrive_read_uncommitted, // redrive reads the dead-letter topic read_uncommitted: aborted transactions' copies too
  operator_sql_simple_protocol,  // replay's count and the snapshot's override sent as simple queries, unchecked
  dropped_slot_recreated,   // a slot walrelay created (its marker says so) and someone dropped is made again, the gap unsaid
  inflight_unbounded,       // max.inflight.records and max.inflight.bytes ignored: the source read whatever the sink owes
  snapshot_stream_overlap,  // the snapshot read in a transaction begun after the slot's consistent point, not at it
  secrets_shown,            // a secret setting shown as it is (--print-config, --check, the notes on a Connect file)
  zombie_not_fenced,        // exactly once: each producer a transactional.id of its own, so a new one fences no zombie
  redis_ack_at_submit,      // Redis: a record reported delivered once queued for the worker, before Redis answered
  http_retry_releases_key,  // HTTP: a request waiting to be tried again frees its key, so the key's later events pass it
  sqs_call_ok_is_delivered, // SQS: a call answered 200 counts every entry delivered, its Failed ones too
  http_batch_not_split,     // HTTP: a batch refused with a 4xx fails every record in it, not the one refused
  redis_place_not_reset,    // Redis: an entry's place in its transaction counted on from the change seen before a reconnect
  redis_mark_past_dead_letter,  // Redis: a stream's mark moves past an event whose dead-letter copy is not stored
};

#ifdef WALRELAY_MUTATION_TESTING
inline constexpr bool compiled_in = true;
// The break the environment's WALRELAY_MUTATION names (none when unset); an
// unknown name ends the process.
Break selected();
#else
inline constexpr bool compiled_in = false;
inline Break selected() { return Break::none; }
#endif

// Whether this process breaks `b`.
inline bool active(Break b) { return compiled_in && selected() == b; }
// The name of a break, as WALRELAY_MUTATION spells it.
std::string_view name(Break b);

}  // namespace walrelay::mutation
