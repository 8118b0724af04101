// sink.type and the NATS JetStream sink's keys: Debezium Server's names,
// secrets from the environment, and each key a sink does not take refused
// naming it.
#include <catch2/catch.hpp>

#include "walrelay/config.hpp"
#include "walrelay/sinks/nats/nats_config.hpp"

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
  CHECK(error_of("sink.type=rabbit\n").find("sink.type: expected kafka, nats-jetstream or rabbitmq") != std::string::npos);
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
