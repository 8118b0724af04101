#include "walrelay/json.hpp"

#include <nlohmann/json.hpp>

namespace walrelay {

std::string to_json_text(const Json& value) {
  // indent -1: one line; ensure_ascii false: UTF-8 stays UTF-8, not \u escapes.
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace walrelay
