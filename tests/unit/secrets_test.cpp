// Secrets in what walrelay prints or writes: one rule (is_secret_key for a
// key, redact_url for every URL's user info) used by --print-config, the
// notes on a translated configuration, the sinks' errors, and mirrored by
// the container's entry point, which must agree with it on every key.
#include <catch2/catch.hpp>

#include <array>
#include <cstdio>
#include <memory>
#include <sstream>

#include "walrelay/config.hpp"
#include "walrelay/sinks/sink_table.hpp"

using namespace walrelay;

namespace {

Config parse(const std::string& text, std::vector<std::string> env = {}) {
  return parse_config("kafka.bootstrap.servers=127.0.0.1:9092\n" + text, "test.properties", env);
}

// What walrelay shows of a setting: the rule the entry point mirrors.
std::string shown(const std::string& key, const std::string& value) {
  if (is_secret_key(key)) return value.empty() ? value : "********";
  return redact_url(value);
}

// The key the entry point derives from a variable's name: WALRELAY_ removed,
// lower case, underscores to dots (so sink.nats-jetstream.url is
// sink.nats.jetstream.url there).
std::string entrypoint_key(const std::string& key) {
  std::string out;
  for (char c : key) out += (c == '-' || c == '_') ? '.' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string run(const std::string& command) {
  std::unique_ptr<FILE, decltype(&pclose)> pipe(popen(command.c_str(), "r"), &pclose);
  REQUIRE(pipe);
  std::string out;
  std::array<char, 4096> buffer{};
  while (std::size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe.get())) out.append(buffer.data(), n);
  return out;
}

}  // namespace

TEST_CASE("secrets: redact_url masks a URL's user info whatever its password holds", "[secrets]") {
  CHECK(redact_url("nats://user:pass@nats.internal:4222") == "nats://********@nats.internal:4222");
  // A '/' in the password: the first '/' is not where the user info ends.
  CHECK(redact_url("nats://user:pa/ss@nats.internal:4222") == "nats://********@nats.internal:4222");
  CHECK(redact_url("https://u:p/a@ss@registry:8081/subjects") == "https://********@registry:8081/subjects");
  CHECK(redact_url("nats://user:p?w#d@h") == "nats://********@h");
  // Several URLs (a list, or an error naming them): each one's.
  CHECK(redact_url("nats://a:one@h1:4222,nats://h2:4222,nats://c:two@h3:4222") ==
        "nats://********@h1:4222,nats://h2:4222,nats://********@h3:4222");
  CHECK(redact_url("could not connect to https://u:pw@reg:8081: refused") ==
        "could not connect to https://********@reg:8081: refused");
  // Nothing to mask.
  CHECK(redact_url("https://registry:8081/subjects") == "https://registry:8081/subjects");
  CHECK(redact_url("k1:9092,k2:9092") == "k1:9092,k2:9092");
  CHECK(redact_url("") == "");
}

TEST_CASE("secrets: --print-config masks every secret and every URL's user info", "[secrets]") {
  auto nats = parse_config("sink.type=nats-jetstream\n"
                           "sink.nats-jetstream.url=nats://relay:nats-pw@nats1:4222,nats://relay:nats/pw2@nats2:4222\n"
                           "admin.token=reader-tok\n"
                           "admin.replay.token=replay-tok\n",
                           "test.properties", {"WALRELAY_SINK_NATS_JETSTREAM_AUTH_PASSWORD=nats-auth-pw"});
  auto kafka = parse("value.converter=io.confluent.connect.avro.AvroConverter\n"
                     "value.converter.schema.registry.url=https://reg-user:reg/pw@registry:8081\n"
                     "kafka.sasl.oauthbearer.token.endpoint.url=https://client:oauth-pw@idp/token\n",
                     {"WALRELAY_VALUE_CONVERTER_BASIC_AUTH_USER_INFO=bob:basic-pw"});
  const std::string text = nats.describe() + kafka.describe();
  INFO(text);
  for (const char* secret : {"nats-pw", "nats/pw2", "reg/pw", "reader-tok", "replay-tok", "oauth-pw", "basic-pw",
                             "bob:", "nats-auth-pw"})
    CHECK(text.find(secret) == std::string::npos);
  CHECK(text.find("sink.nats-jetstream.url=nats://********@nats1:4222,nats://********@nats2:4222\n") !=
        std::string::npos);
  CHECK(text.find("value.converter.schema.registry.url=https://********@registry:8081\n") != std::string::npos);
  CHECK(text.find("value.converter.basic.auth.user.info=********\n") != std::string::npos);
  CHECK(text.find("admin.replay.token=********\n") != std::string::npos);
  // Its key holds "token": the whole value is masked.
  CHECK(text.find("kafka.sasl.oauthbearer.token.endpoint.url=********\n") != std::string::npos);
}

TEST_CASE("secrets: a configuration line without '=' is not echoed when it names a secret", "[secrets]") {
  try {
    parse("database.password hunter2\n");
    FAIL("parsed");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("hunter2") == std::string::npos);
    CHECK(std::string(e.what()).find("expected key=value") != std::string::npos);
  }
}

TEST_CASE("secrets: deploy/docker/entrypoint.sh shows every key as walrelay does", "[secrets]") {
  CHECK(is_secret_key("sink.nats-jetstream.auth.seed"));
  CHECK(is_secret_key("sink.nats-jetstream.auth.jwt"));
  // Every key walrelay knows, the sinks' and some of librdkafka's, each with
  // a value holding URLs with user info and one without.
  std::vector<std::string> keys = config_keys();
  for (auto& kind : sink_kinds())
    for (auto k : kind.keys) keys.push_back("sink." + std::string(kind.name) + "." + std::string(k));
  for (const char* k : {"kafka.sasl.password", "kafka.sasl.jaas.config", "kafka.sasl.oauthbearer.config",
                        "kafka.sasl.oauthbearer.client.secret", "kafka.ssl.key.pem", "kafka.ssl.key.password",
                        "kafka.ssl.keystore.password", "kafka.bootstrap.servers",
                        "kafka.sasl.oauthbearer.token.endpoint.url",
                        // Refused keys of Debezium Server's NATS sink, which
                        // the entry point writes before walrelay reads them.
                        "sink.nats-jetstream.auth.seed", "sink.nats-jetstream.auth.jwt"})
    keys.push_back(k);
  const std::vector<std::string> values = {"plain-value", "nats://u:p/w@h1:4222,nats://h2:4222,https://a:b@c/d"};
  std::ostringstream script;
  script << "set -euo pipefail\n"
         << "source <(sed -n '/^is_secret()/,/^}/p; /^redact_urls()/,/^}/p; /^shown_setting()/,/^}/p' "
         << WALRELAY_SOURCE_DIR << "/deploy/docker/entrypoint.sh)\n";
  std::vector<std::string> expected;
  for (auto& key : keys)
    for (auto& value : values) {
      script << "printf '%s=%s\\n' '" << key << "' \"$(shown_setting '" << entrypoint_key(key) << "' '" << value
             << "')\"\n";
      expected.push_back(key + "=" + shown(key, value));
    }
  const std::string out = run("bash -c \"$(cat <<'WALRELAY_SCRIPT'\n" + script.str() + "WALRELAY_SCRIPT\n)\" 2>&1");
  std::istringstream lines(out);
  std::string line;
  std::size_t i = 0;
  while (std::getline(lines, line)) {
    REQUIRE(i < expected.size());
    CHECK(line == expected[i]);
    ++i;
  }
  CHECK(i == expected.size());
  // The rule itself: a key named with any of the words is secret.
  CHECK(is_secret_key("value.converter.basic.auth.user.info"));
  CHECK(is_secret_key("admin.replay.token"));
  CHECK_FALSE(is_secret_key("sink.nats-jetstream.url"));
}
