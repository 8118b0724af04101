#include <catch2/catch.hpp>

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <simdjson.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "walrelay/logging.hpp"

using namespace walrelay;

namespace {
// Captures what the default logger writes to stderr while fn runs.
template <class F>
std::string capture_stderr(F fn) {
  std::fflush(stderr);
  int saved = dup(2);
  char path[] = "/tmp/walrelay-log-XXXXXX";
  int fd = mkstemp(path);
  dup2(fd, 2);
  fn();
  spdlog::default_logger()->flush();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string out;
  lseek(fd, 0, SEEK_SET);
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  close(fd);
  unlink(path);
  return out;
}
}  // namespace

TEST_CASE("logging: json format writes one valid object a line", "[logging]") {
  auto out = capture_stderr([] {
    setup_logging("info", LogFormat::json);
    spdlog::info("slot={} lsn={} said \"hi\"\n\tand a control char \x01", "walrelay", "0/16B3748");
    spdlog::debug("not shown at info");
  });
  setup_logging("info", LogFormat::text);
  REQUIRE(!out.empty());
  CHECK(out.find("not shown") == std::string::npos);
  CHECK(std::count(out.begin(), out.end(), '\n') == 1);
  simdjson::ondemand::parser parser;
  simdjson::padded_string json(out);
  auto doc = parser.iterate(json);
  std::string_view level = doc["level"].get_string().value();
  CHECK(level == "info");
  std::string_view msg = doc["msg"].get_string().value();
  CHECK(msg.find("slot=walrelay lsn=0/16B3748 said \"hi\"") == 0);
  CHECK(msg.find('\x01') != std::string_view::npos);
}

TEST_CASE("logging: json format replaces invalid UTF-8 and keeps its member order", "[logging]") {
  auto out = capture_stderr([] {
    setup_logging("info", LogFormat::json);
    spdlog::warn("bad \xFF byte, caf\xC3\xA9, cut \xE2\x82");
  });
  setup_logging("info", LogFormat::text);
  INFO(out);
  // {"ts":"2026-12-01T10:00:00.123Z","level":...: the order log pipelines have seen.
  REQUIRE(out.size() > 40);
  CHECK(out.rfind("{\"ts\":\"", 0) == 0);
  CHECK(out.substr(30, 12) == "Z\",\"level\":\"");
  simdjson::ondemand::parser parser;
  simdjson::padded_string json(out);
  auto doc = parser.iterate(json);
  std::string_view msg = doc["msg"].get_string().value();
  CHECK(msg == "bad \xEF\xBF\xBD byte, caf\xC3\xA9, cut \xEF\xBF\xBD");
}

TEST_CASE("logging: redact masks every occurrence of a secret", "[logging]") {
  CHECK(redact("password=pw and again pw", "pw") == "password=******** and again ********");
  CHECK(redact("nothing here", "") == "nothing here");
}
