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
  }
  return "?";
}

#ifdef WALRELAY_MUTATION_TESTING
Break selected() {
  static const Break chosen = [] {
    const char* env = std::getenv("WALRELAY_MUTATION");
    if (!env || !*env) return Break::none;
    for (Break b : {Break::confirm_before_ack, Break::drop_records, Break::reorder_key, Break::skip_dlq_wait,
                    Break::sigterm_no_wait, Break::confirm_past_abort,
                    Break::registry_dead_letters, Break::nats_ack_at_publish, Break::snapshot_resume_as_done,
                    Break::redrive_commit_early, Break::snapshot_commit_chunks, Break::snapshot_retake_new_slot,
                    Break::snapshot_retake_unfiltered, Break::rabbitmq_keep_queued,
                    Break::dead_letter_drop_when_full, Break::avro_decimal_rounds, Break::json_schema_draft4,
                    Break::ledger_unbounded, Break::redrive_read_uncommitted, Break::operator_sql_simple_protocol})
      if (name(b) == env) return b;
    std::fprintf(stderr, "WALRELAY_MUTATION=%s: no such break\n", env);
    std::exit(2);
  }();
  return chosen;
}
#endif

}  // namespace walrelay::mutation
