#include "walrelay/logging.hpp"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "walrelay/json.hpp"

namespace walrelay {
namespace {

// One JSON object a line: {"ts":..., "level":..., "msg":...}. Messages keep
// their "slot=... lsn=... xid=..." prefix, which log pipelines can split.
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    auto t = std::chrono::system_clock::to_time_t(msg.time);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(msg.time.time_since_epoch()).count() % 1000;
    std::tm tm{};
    gmtime_r(&t, &tm);
    char ts[80];
    std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                  tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
    const auto level = spdlog::level::to_string_view(msg.level);
    Json line = Json::object();  // member by member: initializer lists copy each value again
    line["ts"] = std::string_view(ts);
    line["level"] = std::string_view(level.data(), level.size());
    line["msg"] = std::string_view(msg.payload.data(), msg.payload.size());
    const std::string text = to_json_text(line);
    dest.append(text.data(), text.data() + text.size());
    dest.push_back('\n');
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }
};

}  // namespace

void setup_logging(const std::string& level, LogFormat format) {
  // Not registered by name: setting up again (tests, a reload) just replaces it.
  auto logger = std::make_shared<spdlog::logger>("walrelay", std::make_shared<spdlog::sinks::stderr_sink_st>());
  if (format == LogFormat::json) logger->set_formatter(std::make_unique<JsonFormatter>());
  else logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %^%l%$ %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

std::string redact(std::string text, const std::string& secret) {
  if (secret.empty()) return text;
  for (auto p = text.find(secret); p != std::string::npos; p = text.find(secret, p + 8)) text.replace(p, secret.size(), "********");
  return text;
}

std::string printable(std::string_view text, std::size_t limit) {
  std::string out;
  for (unsigned char c : text.substr(0, limit)) out += (c < 0x20 || c == 0x7f) ? '?' : static_cast<char>(c);
  return out;
}

}  // namespace walrelay
