// spdlog set-up: text or JSON lines on stderr.
#pragma once

#include <string>

#include "walrelay/config.hpp"

namespace walrelay {

// Configures the default logger; level names as in log.level.
void setup_logging(const std::string& level, LogFormat format);

// Text with every occurrence of `secret` replaced by ********; for messages
// that may echo user input (a connection error quoting its conninfo, ...).
std::string redact(std::string text, const std::string& secret);

}  // namespace walrelay
