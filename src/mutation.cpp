// Which guarantee a mutation-testing build breaks (see mutation.hpp).
#include "walrelay/mutation.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace walrelay::mutation {

std::string_view name(Break b) {
  switch (b) {
    case Break::none: return "none";
    case Break::confirm_before_ack: return "confirm_before_ack";
    case Break::drop_records: return "drop_records";
    case Break::reorder_key: return "reorder_key";
    case Break::skip_dlq_wait: return "skip_dlq_wait";
    case Break::sigterm_no_wait: return "sigterm_no_wait";
    case Break::confirm_past_abort: return "confirm_past_abort";
    case Break::registry_dead_letters: return "registry_dead_letters";
    case Break::nats_ack_at_publish: return "nats_ack_at_publish";
    case Break::snapshot_resume_as_done: return "snapshot_resume_as_done";
    case Break::redrive_commit_early: return "redrive_commit_early";
    case Break::snapshot_commit_chunks: return "snapshot_commit_chunks";
    case Break::snapshot_retake_new_slot: return "snapshot_retake_new_slot";
    case Break::snapshot_retake_unfiltered: return "snapshot_retake_unfiltered";
    case Break::rabbitmq_keep_queued: return "rabbitmq_keep_queued";
    case Break::dead_letter_drop_when_full: return "dead_letter_drop_when_full";
    case Break::avro_decimal_rounds: return "avro_decimal_rounds";
    case Break::json_schema_draft4: return "json_schema_draft4";
    case Break::ledger_unbounded: return "ledger_unbounded";
    case Break::redrive_read_uncommitted: return "redrive_read_uncommitted";
    case Break::operator_sql_simple_protocol: return "operator_sql_simple_protocol";
    case Break::dropped_slot_recreated: return "dropped_slot_recreated";
    case Break::inflight_unbounded: return "inflight_unbounded";
    case Break::snapshot_stream_overlap: return "snapshot_stream_overlap";
    case Break::secrets_shown: return "secrets_shown";
    case Break::zombie_not_fenced: return "zombie_not_fenced";
    case Break::redis_ack_at_submit: return "redis_ack_at_submit";
    case Break::http_retry_releases_key: return "http_retry_releases_key";
    case Break::sqs_call_ok_is_delivered: return "sqs_call_ok_is_delivered";
    case Break::http_batch_not_split: return "http_batch_not_split";
    case Break::redis_place_not_reset: return "redis_place_not_reset";
    case Break::redis_mark_past_dead_letter: return "redis_mark_past_dead_letter";
  }
  return "?";
}

#ifdef WALRELAY_MUTATION_TESTING
Break selected() {
  static const Break chosen = [] {
    const char* env = std::getenv("WALRELAY_MUTATION");
    if (!env || !*env) return Break::none;
    // Every break in turn, up to the first value name() does not know.
    for (int i = 1; name(static_cast<Break>(i)) != "?"; ++i)
      if (name(static_cast<Break>(i)) == env) return static_cast<Break>(i);
    std::fprintf(stderr, "WALRELAY_MUTATION=%s: no such break\n", env);
    std::exit(2);
  }();
  return chosen;
}
#endif

}  // namespace walrelay::mutation
