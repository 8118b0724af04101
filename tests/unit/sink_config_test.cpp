// sink.type and the NATS JetStream sink's keys: Debezium Server's names,
// secrets from the environment, and each key a sink does not take refused
// naming it.
#include <catch2/catch.hpp>

#include "walrelay/config.hpp"
#include "walrelay/sinks/http/http_config.hpp"
#include "walrelay/sinks/nats/nats_config.hpp"
#include "walrelay/sinks/redis/redis_config.hpp"
#include "walrelay/sinks/sqs/sqs_config.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

using namespace walrelay;

namespace {
Config nats(const std::string& text, std::vector<std::string> env = {}) {
  return parse_config("sink.type=nats-jetstream\n" + text, "test.properties", env);
}
std::string error_of(const std::string& text) {
  try {
    parse_config(text, "test.properties", {});
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}
}  // namespace

TEST_CASE("sink config: kafka is the default, nats-jetstream takes Debezium Server's keys and needs no Kafka",
          "[config][sink]") {
  CHECK(parse_config("kafka.bootstrap.servers=x:1\n", "t", {}).sink_type == "kafka");
  auto c = nats("sink.nats-jetstream.url=nats://a:4222,nats://b:4222\nsink.nats-jetstream.create-stream=true\n"
                "sink.nats-jetstream.subjects=orders.>,dead\nsink.nats-jetstream.storage=memory\n"
                "sink.nats-jetstream.auth.user=relay\n",
                {"WALRELAY_SINK_NATS_JETSTREAM_AUTH_PASSWORD=s3cret"});
  auto n = nats_jetstream_config(c);
  CHECK(n.urls == std::vector<std::string>{"nats://a:4222", "nats://b:4222"});
  CHECK(n.create_stream);
  CHECK(n.subjects == std::vector<std::string>{"orders.>", "dead"});
  CHECK(n.storage == "memory");
  CHECK(n.user == "relay");
  CHECK(n.password == "s3cret");  // from the environment
  CHECK(c.describe().find("s3cret") == std::string::npos);
  CHECK(c.describe().find("sink.type=nats-jetstream") != std::string::npos);
  // Defaults: the router's default topics and the dead-letter subject.
  auto d = nats_jetstream_config(nats("errors.tolerance=all\nerrors.deadletterqueue.topic.name=outbox.dead\n"));
  CHECK(d.subjects == std::vector<std::string>{"outbox.event.>", "outbox.dead"});
  CHECK(d.urls == std::vector<std::string>{"nats://127.0.0.1:4222"});
  CHECK(d.max_pending == 4096);
  CHECK_FALSE(d.tls);
  CHECK(nats_jetstream_config(nats("sink.nats-jetstream.tls.ca.location=/ca.pem\n")).tls);
}

TEST_CASE("sink config: what a sink does not take is refused, naming the key and why", "[config][sink]") {
  CHECK(error_of("sink.type=rabbit\n").find("sink.type: expected kafka, nats-jetstream, rabbitmq, redis, http or sqs") !=
        std::string::npos);
  CHECK(error_of("sink.type=nats-jetstream\nkafka.bootstrap.servers=x:1\n")
            .find("kafka.bootstrap.servers: sink.type is nats-jetstream") != std::string::npos);
  CHECK(error_of("sink.type=nats-jetstream\nexactly.once.support=required\n").find("exactly.once.support:") !=
        std::string::npos);
  CHECK(error_of("sink.type=nats-jetstream\nsink.nats-jetstream.no.such=1\n")
            .find("sink.nats-jetstream.no.such: unknown key of the nats-jetstream sink") != std::string::npos);
  CHECK(error_of("kafka.bootstrap.servers=x:1\nsink.nats-jetstream.url=nats://x\n")
            .find("sink.nats-jetstream.url: sink.type is kafka") != std::string::npos);
  CHECK(error_of("sink.type=nats-jetstream\nsink.pulsar.url=x\n").find("sink.pulsar.url: unknown sink") !=
        std::string::npos);
  CHECK(error_of("sink.type=nats-jetstream\nsink.nats-jetstream.auth.jwt=eyJ\n")
            .find("auth.credentials.file") != std::string::npos);
  CHECK(error_of("sink.type=nats-jetstream\nsink.nats-jetstream.storage=disk\n")
            .find("sink.nats-jetstream.storage: expected file or memory") != std::string::npos);
  CHECK(error_of("sink.type=nats-jetstream\nsink.nats-jetstream.tls.certificate.location=/c.pem\n")
            .find("tls.key.location") != std::string::npos);
  CHECK(error_of("sink.type=nats-jetstream\nsink.nats-jetstream.max.pending=0\n")
            .find("sink.nats-jetstream.max.pending: value 0 out of range [1, 1000000]") != std::string::npos);
}

TEST_CASE("sink config: redis takes Debezium Server's keys (address, password from the environment, message.format) "
          "and walrelay's stream.template, and refuses TLS and the memory poll naming why",
          "[config][sink]") {
  auto c = parse_config("sink.type=redis\nsink.redis.address=cache.internal:6380\nsink.redis.user=relay\n"
                        "sink.redis.db.index=2\nsink.redis.stream.template=events:${topic}:v1\n"
                        "sink.redis.stream.maxlen=100000\nsink.redis.wait.enabled=true\n",
                        "t", {"WALRELAY_SINK_REDIS_PASSWORD=s3cret"});
  auto r = redis_config(c);
  CHECK(r.host == "cache.internal");
  CHECK(r.port == 6380);
  CHECK(r.user == "relay");
  CHECK(r.password == "s3cret");
  CHECK(c.describe().find("s3cret") == std::string::npos);
  CHECK(r.db_index == 2);
  CHECK(r.extended);
  CHECK(r.maxlen == 100000);
  CHECK(r.wait_enabled);
  CHECK(redis_stream_name(r, "outbox.event.Order") == "events:outbox.event.Order:v1");
  auto d = redis_config(parse_config("sink.type=redis\nsink.redis.message.format=compact\n", "t", {}));
  CHECK(d.host == "127.0.0.1");
  CHECK(d.port == 6379);
  CHECK_FALSE(d.extended);
  CHECK(redis_stream_name(d, "outbox.event.Order") == "outbox.event.Order");
  CHECK(redis_config(parse_config("sink.type=redis\nsink.redis.address=[::1]:7000\n", "t", {})).host == "::1");
  CHECK(error_of("sink.type=redis\nsink.redis.ssl.enabled=true\n").find("sink.redis.ssl.enabled: TLS to Redis") !=
        std::string::npos);
  CHECK(error_of("sink.type=redis\nsink.redis.memory.limit.mb=80\n").find("sink.redis.max.pending") !=
        std::string::npos);
  CHECK(error_of("sink.type=redis\nsink.redis.message.format=json\n")
            .find("sink.redis.message.format: expected extended or compact") != std::string::npos);
  CHECK(error_of("sink.type=redis\nsink.redis.address=x:0\n").find("sink.redis.address: value 0 out of range") !=
        std::string::npos);
  CHECK(error_of("sink.type=redis\nsink.redis.user=u\n").find("sink.redis.user: a user needs sink.redis.password") !=
        std::string::npos);
  CHECK(error_of("sink.type=redis\nexactly.once.support=required\n").find("exactly.once.support:") !=
        std::string::npos);
  // One stream for every topic is fine, unless dead-letter copies would join it.
  CHECK(redis_stream_name(redis_config(parse_config("sink.type=redis\nsink.redis.stream.template=outbox\n", "t", {})),
                          "a") == "outbox");
  CHECK(error_of("sink.type=redis\nsink.redis.stream.template=outbox\nerrors.tolerance=all\n"
                 "errors.deadletterqueue.topic.name=dlq\n")
            .find("sink.redis.stream.template: \"outbox\" has no ${topic}") != std::string::npos);
}

TEST_CASE("sink config: http takes Debezium Server's keys (url, timeout.ms, retries, headers.prefix, standard-webhooks) "
          "and walrelay's, credentials from the environment and masked, and refuses what it does not do naming why",
          "[config][sink]") {
  const std::string base = "sink.type=http\nsink.http.url=https://hooks.internal/in/${topic}\n";
  auto c = parse_config(base + "sink.http.authentication.type=bearer\nsink.http.retries=2\n", "t",
                        {"WALRELAY_SINK_HTTP_AUTHENTICATION_BEARER_TOKEN=t0k3n-s3cret"});
  auto h = http_config(c);
  CHECK(h.bearer_token == "t0k3n-s3cret");
  CHECK(c.describe().find("t0k3n-s3cret") == std::string::npos);
  CHECK(h.retries == 2);
  CHECK(h.timeout_ms == 60000);
  CHECK(h.headers_prefix == "X-DEBEZIUM-");
  CHECK(h.headers_encode_base64);
  CHECK(http_url(h, "outbox.event.Order") == "https://hooks.internal/in/outbox.event.Order");
  CHECK(http_url(h, "a/b c") == "https://hooks.internal/in/a%2Fb%20c");  // one path segment
  // Messages and --print-config show scheme, host and port: user info, path
  // and query may hold secrets (Slack's path, Azure Functions' ?code=).
  CHECK(http_url_for_log("https://user:pw@hooks.internal/in") == "https://***@hooks.internal/...");
  CHECK(http_url_for_log("https://us/er:p/w@hooks.internal:8443/in") == "https://***@hooks.internal:8443/...");
  CHECK(http_url_for_log("https://hooks.slack.com/services/T0/B0/XXXX") == "https://hooks.slack.com/...");
  CHECK(http_url_for_log("https://f.azurewebsites.net/api/in?code=abc") == "https://f.azurewebsites.net/...");
  CHECK(http_url_for_log("http://127.0.0.1:8080/") == "http://127.0.0.1:8080");
  auto shown = parse_config(base + "\n", "t", {}).describe();
  CHECK(shown.find("sink.http.url=https://hooks.internal/...") != std::string::npos);
  CHECK(shown.find("/in/") == std::string::npos);
  CHECK(error_of("sink.type=http\nsink.http.url=hooks.internal/s3cret\n").find("s3cret") == std::string::npos);
  CHECK(error_of("sink.type=http\n").find("sink.http.url: sink.type=http needs the URL") != std::string::npos);
  CHECK(error_of("sink.type=http\nsink.http.url=ftp://x/\n").find("sink.http.url: expected an http") !=
        std::string::npos);
  // Batches: off by default, Debezium Server's keys and default size.
  CHECK_FALSE(h.batch_enabled);
  CHECK(h.batch_max_size == 200);
  CHECK(h.batch_format == HttpBatchFormat::values);
  auto batched = http_config(parse_config(base + "sink.http.batch.enabled=true\nsink.http.batch.max-size=50\n"
                                                 "sink.http.batch.format=records\nsink.http.batch.max.bytes=65536\n", "t", {}));
  CHECK(batched.batch_enabled);
  CHECK(batched.batch_max_size == 50);
  CHECK(batched.batch_format == HttpBatchFormat::records);
  CHECK(batched.batch_max_bytes == 65536);
  CHECK(error_of(base + "sink.http.batch.format=ndjson\n").find("sink.http.batch.format: expected values") !=
        std::string::npos);
  CHECK(error_of(base + "sink.http.batch.max-size=0\n").find("sink.http.batch.max-size") != std::string::npos);
  CHECK(error_of(base + "sink.http.authentication.type=jwt\n").find("not in walrelay") != std::string::npos);
  CHECK(error_of(base + "sink.http.authentication.type=standard-webhooks\nsink.http.authentication.webhook.secret=x\n")
            .find("whsec_") != std::string::npos);
  CHECK(error_of(base + "sink.http.authentication.webhook.secret=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n")
            .find("nothing would be signed") != std::string::npos);
  CHECK(error_of(base + "sink.http.authentication.type=basic\nsink.http.authentication.basic.user=u\n")
            .find("sink.http.authentication.basic.password:") != std::string::npos);
  CHECK(error_of(base + "sink.http.headers.prefix=X Bad:\n").find("sink.http.headers.prefix") != std::string::npos);
  CHECK(error_of(base + "sink.http.headers.prefix=\n").find("sink.http.headers.prefix") != std::string::npos);
  // The webhook secret decoded at start (padding optional), never in the worker.
  auto signed_config = http_config(parse_config(base + "sink.http.authentication.type=standard-webhooks\n"
                                                "sink.http.authentication.webhook.secret=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n",
                                                "t", {}));
  CHECK(signed_config.webhook_key.size() == 24);
  CHECK(http_config(parse_config(base + "sink.http.authentication.type=standard-webhooks\n"
                                        "sink.http.authentication.webhook.secret=whsec_MDEyMzQ1Njc4OWFiY2RlZmdoaWo\n",
                                 "t", {})).webhook_key == "0123456789abcdefghij");
  CHECK(error_of(base + "sink.http.authentication.type=standard-webhooks\n"
                        "sink.http.authentication.webhook.secret=whsec_!!!!!!!!!!!!!!!!!!!!!!!!\n")
            .find("sink.http.authentication.webhook.secret: standard-webhooks needs") != std::string::npos);
  CHECK(error_of(base + "sink.http.ssl.key.location=/k.pem\n").find("sink.http.ssl.certificate.location") !=
        std::string::npos);
  CHECK(error_of(base + "sink.http.nonsense=1\n").find("sink.http.nonsense: unknown key of the http sink") !=
        std::string::npos);
}

// The process's AWS_* variables for one test, put back after.
struct AwsEnvironment {
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  explicit AwsEnvironment(std::vector<std::pair<std::string, std::string>> set) {
    for (const char* name : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                             "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"}) {
      const char* v = std::getenv(name);
      saved.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(name);
    }
    for (auto& [k, v] : set) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~AwsEnvironment() {
    for (auto& [k, v] : saved)
      if (v) ::setenv(k.c_str(), v->c_str(), 1);
      else ::unsetenv(k.c_str());
  }
};

TEST_CASE("sink config: sqs - the queue URL's ${topic} a queue name, the region from the host, credentials as the "
          "AWS CLI finds them, FIFO by the name, ids SQS takes",
          "[config][sink][sqs]") {
  const std::string base = "sink.type=sqs\nsink.sqs.queue.url=https://sqs.eu-west-1.amazonaws.com/123456789012/${topic}.fifo\n";
  {
    AwsEnvironment env({{"AWS_ACCESS_KEY_ID", "AKIDENV"}, {"AWS_SECRET_ACCESS_KEY", "s3cret-env"}, {"AWS_SESSION_TOKEN", "tok"}});
    auto s = sqs_config(parse_config(base, "t", {}));
    CHECK(s.region == "eu-west-1");
    CHECK(s.access_key_id == "AKIDENV");
    CHECK(s.secret_access_key == "s3cret-env");
    CHECK(s.session_token == "tok");
    CHECK(s.batch_size == 10);
    CHECK(s.batch_max_bytes == 262144);
    CHECK(sqs_queue_url(s, "outbox.event.Order") ==
          "https://sqs.eu-west-1.amazonaws.com/123456789012/outbox_event_Order.fifo");
    CHECK(sqs_is_fifo(sqs_queue_url(s, "x")));
    CHECK_FALSE(sqs_is_fifo("https://sqs.eu-west-1.amazonaws.com/1/plain"));
    CHECK(sqs_endpoint(sqs_queue_url(s, "x")) == "https://sqs.eu-west-1.amazonaws.com/");
    CHECK(sqs_endpoint("http://127.0.0.1:9324/000000000000/q") == "http://127.0.0.1:9324/");
    // Neither the credentials nor the secret key is shown.
    auto shown = parse_config(base, "t", {}).describe();
    CHECK(shown.find("s3cret-env") == std::string::npos);
    CHECK(error_of(base + "sink.sqs.batch.size=11\n").find("sink.sqs.batch.size") != std::string::npos);
    CHECK(error_of(base + "sink.sqs.endpoint=http://x\n").find("sink.sqs.endpoint: walrelay calls") != std::string::npos);
    CHECK(error_of(base + "sink.sqs.bogus=1\n").find("sink.sqs.bogus: unknown key of the sqs sink") != std::string::npos);
    CHECK(error_of("sink.type=sqs\n").find("sink.sqs.queue.url: sink.type=sqs needs the queue URL") != std::string::npos);
    // A host that names no region needs one.
    CHECK(error_of("sink.type=sqs\nsink.sqs.queue.url=http://127.0.0.1:9324/0/q\n").find("sink.sqs.region") !=
          std::string::npos);
    auto local = sqs_config(parse_config("sink.type=sqs\nsink.sqs.queue.url=http://127.0.0.1:9324/0/q\nsink.sqs.region=us-east-1\n", "t", {}));
    CHECK(local.region == "us-east-1");
  }
  {
    // A profile in the shared credentials file; named in the configuration,
    // it wins over the environment's keys.
    const std::string dir = "/tmp/walrelay-sqs-unit-" + std::to_string(::getpid());
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/credentials") << "[default]\naws_access_key_id = AKIDDEF\naws_secret_access_key = def\n"
                                           "# a comment\n[ops]\naws_access_key_id=AKIDOPS\naws_secret_access_key=ops-s3cret\n";
    std::ofstream(dir + "/config") << "[profile cfg]\naws_access_key_id=AKIDCFG\naws_secret_access_key=cfg\n";
    AwsEnvironment env({{"AWS_SHARED_CREDENTIALS_FILE", dir + "/credentials"}, {"AWS_CONFIG_FILE", dir + "/config"},
                        {"AWS_ACCESS_KEY_ID", "AKIDENV"}, {"AWS_SECRET_ACCESS_KEY", "env"}});
    auto ops = sqs_config(parse_config(base + "sink.sqs.credentials.profile=ops\n", "t", {}));
    CHECK(ops.access_key_id == "AKIDOPS");
    CHECK(ops.secret_access_key == "ops-s3cret");
    CHECK(ops.session_token.empty());
    auto cfg = sqs_config(parse_config(base + "sink.sqs.credentials.profile=cfg\n", "t", {}));
    CHECK(cfg.access_key_id == "AKIDCFG");
    CHECK(sqs_config(parse_config(base, "t", {})).access_key_id == "AKIDENV");
    auto missing = error_of(base + "sink.sqs.credentials.profile=nope\n");
    CHECK(missing.find("sink.sqs.credentials.profile: no AWS credentials") != std::string::npos);
    CHECK(missing.find("profile \"nope\"") != std::string::npos);
    std::filesystem::remove_all(dir);
  }
  // MessageGroupId and MessageDeduplicationId: as they are when SQS takes them.
  CHECK(sqs_id_of("order-42") == "order-42");
  CHECK(sqs_id_of("9c5b7b7e-1f2a-4d7c-9a0e-3b8c2f1d4e5a") == "9c5b7b7e-1f2a-4d7c-9a0e-3b8c2f1d4e5a");
  CHECK(sqs_id_of("with space").starts_with("sha256:"));
  CHECK(sqs_id_of(std::string(129, 'a')).size() == 7 + 64);
  CHECK(sqs_id_of("with space") == sqs_id_of("with space"));
  CHECK(sqs_id_of("") != "");
  // Messages show no user info and no account id, the queue's name.
  CHECK(sqs_url_for_log("https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo") ==
        "https://sqs.eu-west-1.amazonaws.com/.../orders.fifo");
  CHECK(sqs_url_for_log("http://user:pw@127.0.0.1:9324/000000000000/q") == "http://***@127.0.0.1:9324/.../q");
}
