// The JSON that walrelay writes (the dead-letter row, /slot, log.format=json)
// comes from one library, nlohmann/json, serialized with one policy.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

namespace walrelay {

// A JSON value whose object members keep the order they were added in.
using Json = nlohmann::ordered_json;

// The value as compact JSON text (no whitespace). Valid UTF-8 is written as
// it is; each invalid sequence becomes U+FFFD, so that row data or a log
// message in a wrong encoding still makes valid JSON.
std::string to_json_text(const Json& value);

}  // namespace walrelay
