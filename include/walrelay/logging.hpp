// spdlog set-up: text or JSON lines on stderr.
#pragma once

#include <string>
#include <string_view>

#include "walrelay/config.hpp"

namespace walrelay {

// Configures the default logger; level names as in log.level.
void setup_logging(const std::string& level, LogFormat format);

// Text with every occurrence of `secret` replaced by ********; for messages
// that may echo user input (a connection error quoting its conninfo, ...).
std::string redact(std::string text, const std::string& secret);

// Event data for a log line or an error message: its first `limit` bytes,
// control characters as '?', so that it never breaks a line.
std::string printable(std::string_view text, std::size_t limit);

}  // namespace walrelay
