// The writer's W3C trace context, carried from an outbox row to the Kafka
// record's traceparent and tracestate headers (the names OpenTelemetry's
// Kafka instrumentation reads), so that a trace continues from the writer to
// the consumer.
#pragma once

#include <string>
#include <string_view>

namespace walrelay {

// Reads a trace context written either as Debezium's router reads it (Java
// properties text: "traceparent=..." and "tracestate=..." lines, `#`
// comments, backslash escapes) or as a plain traceparent. On success
// `traceparent` holds a valid W3C traceparent and `tracestate` the
// tracestate or "" (a malformed tracestate is dropped, with `why` set).
// Returns false, with `why` naming the fault, when there is no valid
// traceparent. Blank text is no context: false with `why` empty.
bool parse_trace_context(std::string_view text, std::string& traceparent, std::string& tracestate, std::string& why);

// Whether `value` is a W3C traceparent this version of the specification
// accepts (version 00 exactly; a later version's first four fields).
bool valid_traceparent(std::string_view value);

}  // namespace walrelay
