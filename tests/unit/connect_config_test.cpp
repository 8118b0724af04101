// A Debezium connector's configuration, as users have it: the properties
// file or Kafka Connect's REST JSON, read as walrelay's own.
#include <catch2/catch.hpp>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "walrelay/config.hpp"

using namespace walrelay;

namespace {
const std::vector<std::string> kBroker{"WALRELAY_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092"};

Config parse(const std::string& text) { return parse_config(text, "connector.json", kBroker); }

// The ConfigError of `text`: its key and message.
std::pair<std::string, std::string> refusal(const std::string& text) {
  try {
    parse(text);
  } catch (const ConfigError& e) {
    return {e.key(), e.what()};
  }
  return {"(no error)", ""};
}

bool noted(const Config& c, const std::string& key) {
  for (auto& n : c.notes)
    if (n.rfind(key + "=", 0) == 0) return true;
  return false;
}
}  // namespace

// The shape of Debezium's own outbox example (debezium-examples, outbox/):
// a Connect REST body with Debezium 1.x list names, the router under
// transforms.outbox.*.
TEST_CASE("connect config: Kafka Connect's REST JSON with the router's keys under transforms.outbox", "[config]") {
  auto c = parse(R"({
    "name": "outbox-connector",
    "config": {
      "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
      "tasks.max": "1",
      "database.hostname": "order-db",
      "database.port": 5432,
      "database.user": "orders",
      "database.password": "s3cret",
      "database.dbname": "orderdb",
      "database.server.name": "dbserver1",
      "schema.whitelist": "inventory",
      "table.whitelist": "inventory.outboxevent",
      "tombstones.on.delete": false,
      "transforms": "outbox",
      "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
      "transforms.outbox.route.topic.replacement": "${routedByValue}.events",
      "transforms.outbox.table.field.event.timestamp": "timestamp"
    }
  })");
  CHECK(c.database_hostname == "order-db");
  CHECK(c.database_port == "5432");
  CHECK(c.database_password == "s3cret");
  REQUIRE(c.table_include_list.size() == 1);
  CHECK(c.table_include_list[0].qualified() == "inventory.outboxevent");
  CHECK(c.route_topic_replacement == "${routedByValue}.events");
  CHECK(c.field_event_timestamp == "timestamp");
  for (auto key : {"name", "connector.class", "tasks.max", "database.server.name", "schema.include.list",
                   "tombstones.on.delete", "transforms"})
    CHECK(noted(c, key));
  // Secrets stay out of the notes and of --print-config's comments.
  for (auto& n : c.notes) CHECK(n.find("s3cret") == std::string::npos);
  // Connect's request body takes name and config only.
  CHECK(refusal(R"({"name": "x", "config": {}, "tasks": []})").first == "tasks");
}

TEST_CASE("connect config: a properties file with the router, tracing's SMT and Connect's producer overrides",
          "[config]") {
  auto c = parse_config(
      "connector.class=io.debezium.connector.postgresql.PostgresConnector\n"
      "plugin.name=pgoutput\n"
      "topic.prefix=app\n"
      "snapshot.mode=no_data\n"
      "slot.name=outbox_slot\n"
      "table.include.list=public\\\\.outbox\n"
      "heartbeat.interval.ms=10000\n"
      "transforms=tracing,outbox\n"
      "transforms.tracing.type=io.debezium.transforms.tracing.ActivateTracingSpan\n"
      "transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n"
      "transforms.outbox.table.fields.additional.placement=type:header:eventType\n"
      "transforms.outbox.table.fields.additional.error.on.missing=false\n"
      "transforms.outbox.table.op.invalid.behavior=fatal\n"
      "transforms.outbox.tracing.operation.name=outbox-read\n"
      "value.converter=io.debezium.converters.BinaryDataConverter\n"
      "value.converter.delegate.converter.type=org.apache.kafka.connect.json.JsonConverter\n"
      "value.converter.delegate.converter.type.schemas.enable=false\n"
      "key.converter.schemas.enable=true\n"
      "producer.override.linger.ms=5\n",
      "connector.properties", kBroker);
  CHECK(c.slot_name == "outbox_slot");
  REQUIRE(c.table_include_list.size() == 1);
  CHECK(c.table_include_list[0].qualified() == "public.outbox");
  CHECK(c.tracing_enabled);
  REQUIRE(c.additional_placement.size() == 1);
  CHECK(c.additional_placement[0].alias == "eventType");
  CHECK_FALSE(c.additional_error_on_missing);
  CHECK(c.op_invalid_behavior == InvalidOperation::fatal);
  CHECK(c.kafka.at("linger.ms") == "5");
  CHECK(c.snapshot_mode == SnapshotMode::no_data);
  for (auto key : {"plugin.name", "topic.prefix", "heartbeat.interval.ms", "tracing.operation.name",
                   "value.converter.delegate.converter.type", "key.converter.schemas.enable"})
    CHECK(noted(c, key));
  // The file reads back as walrelay's own.
  CHECK(c.describe().find("tracing.enabled=true\n") != std::string::npos);
  CHECK(c.describe().find("table.op.invalid.behavior=fatal\n") != std::string::npos);
}

TEST_CASE("connect config: Debezium Server's application.properties", "[config]") {
  auto c = parse_config(
      "debezium.sink.type=kafka\n"
      "debezium.sink.kafka.producer.bootstrap.servers=broker:9092\n"
      "debezium.source.connector.class=io.debezium.connector.postgresql.PostgresConnector\n"
      "debezium.source.database.hostname=db\n"
      "debezium.source.offset.storage.file.filename=data/offsets.dat\n"
      "debezium.transforms=outbox\n"
      "debezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n"
      "debezium.transforms.outbox.route.by.field=topic\n",
      "application.properties", {});
  CHECK(c.kafka.at("bootstrap.servers") == "broker:9092");
  CHECK(c.database_hostname == "db");
  CHECK(c.route_by_field == "topic");
  CHECK(noted(c, "offset.storage.file.filename"));
  CHECK(c.sink_type == "kafka");
  // The NATS JetStream and RabbitMQ sinks, Debezium Server's keys as they are.
  auto n = parse_config("debezium.sink.type=nats-jetstream\ndebezium.sink.nats-jetstream.url=nats://nats:4222\n"
                        "debezium.sink.nats-jetstream.create-stream=true\n"
                        "debezium.sink.nats-jetstream.subjects=event.*\n"
                        "debezium.sink.nats-jetstream.storage=memory\n",
                        "application.properties", {});
  CHECK(n.sink_type == "nats-jetstream");
  CHECK(n.sink_settings.at("sink.nats-jetstream.subjects") == "event.*");
  auto r = parse_config("debezium.sink.type=rabbitmq\ndebezium.sink.rabbitmq.connection.host=mq\n"
                        "debezium.sink.rabbitmq.exchange=outbox\n",
                        "application.properties", {});
  CHECK(r.sink_type == "rabbitmq");
  CHECK(r.sink_settings.at("sink.rabbitmq.exchange") == "outbox");
  // Redis and HTTP too (they were refused as unknown keys before).
  auto redis = parse_config("debezium.sink.type=redis\ndebezium.sink.redis.address=cache:6379\n",
                            "application.properties", {});
  CHECK(redis.sink_type == "redis");
  CHECK(redis.sink_settings.at("sink.redis.address") == "cache:6379");
  auto http = parse_config("debezium.sink.type=http\ndebezium.sink.http.url=https://hooks/in\n"
                           "debezium.sink.http.retries=3\ndebezium.sink.http.authentication.type=standard-webhooks\n"
                           "debezium.sink.http.authentication.webhook.secret=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n",
                           "application.properties", {});
  CHECK(http.sink_type == "http");
  CHECK(http.sink_settings.at("sink.http.retries") == "3");
  CHECK(http.describe().find("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") == std::string::npos);
}

TEST_CASE("connect config: the documentation's placeholder, other transforms and predicates are refused naming them",
          "[config]") {
  // Debezium's router page writes "transforms=outbox,..." in every example.
  auto [key, why] = refusal("transforms=outbox,...\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n");
  CHECK(key == "transforms");
  CHECK_THAT(why, Catch::Contains("stands for the rest of a chain"));

  std::tie(key, why) = refusal(
      "transforms=outbox,filter\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n"
      "transforms.filter.type=io.debezium.transforms.Filter\ntransforms.filter.condition=x\n");
  CHECK(key == "transforms.filter.type");
  CHECK_THAT(why, Catch::Contains("publication row filter"));

  std::tie(key, why) = refusal(
      "transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n"
      "transforms.outbox.predicate=isOutbox\npredicates=isOutbox\n"
      "predicates.isOutbox.type=org.apache.kafka.connect.transforms.predicates.TopicNameMatches\n");
  CHECK((key == "transforms.outbox.predicate" || key == "predicates" || key.rfind("predicates.", 0) == 0));
  CHECK_THAT(why, Catch::Contains("table.include.list"));

  CHECK(refusal("transforms=outbox\n").first == "transforms.outbox.type");
  CHECK(refusal("transforms=a\ntransforms.a.type=io.debezium.transforms.outbox.EventRouter\n"
                "transforms.b.route.by.field=x\n")
            .first == "transforms.b.route.by.field");
  CHECK(refusal("transforms=a,b\ntransforms.a.type=io.debezium.transforms.outbox.EventRouter\n"
                "transforms.b.type=io.debezium.transforms.outbox.EventRouter\n")
            .first == "transforms.b.type");
  // The same key at the top level and under the router is one key twice.
  CHECK(refusal("route.by.field=a\ntransforms=o\ntransforms.o.type=io.debezium.transforms.outbox.EventRouter\n"
                "transforms.o.route.by.field=b\n")
            .first == "route.by.field");
}

TEST_CASE("connect config: every Debezium outbox key is implemented, noted or refused with a reason", "[config]") {
  // Refused: what walrelay does not do, each with what to do instead.
  const std::pair<const char*, const char*> refused[] = {
      {"connector.class=io.debezium.connector.mysql.MySqlConnector", "PostgreSQL"},
      {"plugin.name=decoderbufs", "pgoutput"},
      {"plugin.name=wal2json", "pgoutput"},
      {"snapshot.mode=always", "once"},
      {"snapshot.mode=configuration_based", "initial or initial_only"},
      {"slot.drop.on.stop=true", "lose"},
      {"publication.autocreate.mode=all_tables", "all_tables"},
      {"table.include.list=public.outbox_.*", "by name"},
      {"table.exclude.list=public.audit", "table.include.list"},
      {"schema.include.list=other", "not in these schemas"},
      {"message.prefix.exclude.list=audit", "message.prefix.include.list"},
      {"errors.max.retries=5", "without a limit"},
      {"custom.metric.tags=env=prod", "relabel"},
      {"provide.transaction.metadata=true", "exactly.once.support"},
      {"event.processing.failure.handling.mode=skip", "dead-letter"},
      {"snapshot.select.statement.overrides=public.outbox", "is not set"},
      {"snapshot.locking.mode=none", "mean nothing here"},
      {"signal.data.collection=public.signals", "snapshots"},
      {"column.exclude.list=public.outbox.secret", "columns"},
      {"table.op.invalid.behavior=ignore", "warn, error or fatal"},
      {"table.json.payload.null.behavior=drop", "ignore or optional_bytes"},
      {"table.field.additional.missing=maybe", "skip"},
  };
  for (auto& [line, reason] : refused) {
    INFO(line);
    auto [key, why] = refusal(std::string(line) + "\n");
    CHECK(key == std::string(line).substr(0, std::string(line).find('=')));
    CHECK_THAT(why, Catch::Contains(reason));
    CHECK_THAT(why, !Catch::Contains("unknown configuration key"));
  }
  // Noted: nothing to do here, and said why.
  const char* noted_lines[] = {
      "heartbeat.interval.ms=5000",       "heartbeat.action.query=INSERT INTO hb VALUES (now())",
      "slot.drop.on.stop=false",          "errors.max.retries=-1",
      "provide.transaction.metadata=false", "extended.headers.enabled=true",
      "tracing.operation.name=x",         "tracing.with.context.field.only=true",
      "table.json.payload.null.behavior=optional_bytes", "table.json.payload.empty.array.behavior=ignore",
      "table.field.event.schema.version=version", "decimal.handling.mode=string",
      "max.batch.size=8192",              "event.processing.failure.handling.mode=fail",
  };
  for (auto line : noted_lines) {
    INFO(line);
    auto c = parse(std::string(line) + "\n");
    CHECK(noted(c, std::string(line).substr(0, std::string(line).find('='))));
  }
  // Implemented.
  CHECK(parse("table.fields.additional.error.on.missing=false\n").additional_error_on_missing == false);
  CHECK(parse("table.field.additional.missing=skip\n").additional_error_on_missing == false);
  CHECK(parse("table.field.additional.missing=error\n").additional_error_on_missing == true);
  CHECK(parse("table.op.invalid.behavior=error\n").op_invalid_behavior == InvalidOperation::error);
  CHECK(parse("").op_invalid_behavior == InvalidOperation::warn);
  CHECK(parse("table.include.list=app\\.outbox, public.outbox\n").table_include_list.size() == 2);
  CHECK(parse("schema.include.list=public\n").table_include_list[0].qualified() == "public.outbox");
}

TEST_CASE("connect config: tracing is a choice - off by default, as Debezium's stock router", "[config]") {
  CHECK_FALSE(parse("").tracing_enabled);
  CHECK(parse("tracing.enabled=true\n").tracing_enabled);
  CHECK(parse_config("", "(no file)", {"WALRELAY_KAFKA_BOOTSTRAP_SERVERS=x:1", "WALRELAY_TRACING_ENABLED=true"})
            .tracing_enabled);
}

TEST_CASE("connect config: JSON that is not a configuration is a clear error", "[config]") {
  CHECK_THAT(refusal("{\"a\": ").second, Catch::Contains("not valid JSON"));
  CHECK(refusal(R"({"config": {"slot.name": ["a"]}})").first == "slot.name");
  CHECK(refusal(R"({"config": {"nonsense.key": "1"}})").first == "nonsense.key");
}

// Debezium's outbox with Confluent's Avro converter, as its docs and users
// write it: the converter's keys carried over, the schema-shaping ones noted.
TEST_CASE("connect config: a Debezium outbox with Confluent's AvroConverter and its keys", "[config]") {
  auto c = parse(R"({
    "name": "outbox-avro",
    "config": {
      "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
      "topic.prefix": "app",
      "table.include.list": "public.outbox",
      "transforms": "outbox",
      "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
      "transforms.outbox.table.expand.json.payload": "true",
      "transforms.outbox.table.field.event.schema.version": "schema_version",
      "key.converter": "org.apache.kafka.connect.storage.StringConverter",
      "value.converter": "io.confluent.connect.avro.AvroConverter",
      "value.converter.schema.registry.url": "https://registry-a:8081,https://registry-b:8081",
      "value.converter.basic.auth.credentials.source": "USER_INFO",
      "value.converter.basic.auth.user.info": "svc:pa55",
      "value.converter.auto.register.schemas": "false",
      "value.converter.use.latest.version": "true",
      "value.converter.enhanced.avro.schema.support": "true",
      "value.converter.connect.meta.data": "false",
      "value.converter.value.subject.name.strategy": "io.confluent.kafka.serializers.subject.TopicRecordNameStrategy"
    }
  })");
  CHECK(c.registry.format == RegistryFormat::avro);
  CHECK(c.registry.urls == std::vector<std::string>{"https://registry-a:8081", "https://registry-b:8081"});
  CHECK(c.registry.basic_auth_user_info == "svc:pa55");
  CHECK(c.registry.subject_strategy == SubjectNameStrategy::topic_record);
  CHECK(c.field_event_schema_version == "schema_version");
  CHECK(noted(c, "value.converter.enhanced.avro.schema.support"));
  CHECK(noted(c, "value.converter.connect.meta.data"));
  // The credentials are a secret: masked in --print-config, never in a note.
  CHECK(c.describe().find("pa55") == std::string::npos);
  for (auto& n : c.notes) CHECK(n.find("pa55") == std::string::npos);

  // Java stores, another subject for the key, the key through a registry,
  // Apicurio's own converter: each refused with its reason.
  auto with = [](const std::string& extra) {
    return refusal(R"({"config": {"value.converter": "io.confluent.connect.avro.AvroConverter",
      "value.converter.schema.registry.url": "http://r:8081")" + extra + "}}");
  };
  auto truststore = with(R"(, "value.converter.schema.registry.ssl.truststore.location": "/etc/ts.jks")");
  CHECK(truststore.first == "value.converter.schema.registry.ssl.truststore.location");
  CHECK_THAT(truststore.second, Catch::Contains("PEM"));
  auto key = with(R"(, "key.converter": "io.confluent.connect.avro.AvroConverter")");
  CHECK(key.first == "key.converter");
  CHECK_THAT(key.second, Catch::Contains("StringConverter"));
  auto ext_json = refusal(R"({"config": {"value.converter": "io.apicurio.registry.utils.converter.ExtJsonConverter"}})");
  CHECK(ext_json.first == "value.converter");
  CHECK_THAT(ext_json.second, Catch::Contains("schema inside"));
  CHECK(refusal(R"({"config": {"value.converter": "io.confluent.connect.avro.AvroConverter"}})").first ==
        "value.converter.schema.registry.url");
  // Without a registry converter, Debezium's schema.version key is noted (it
  // shaped a Connect schema there), and a registry URL alone is refused.
  CHECK(noted(parse(R"({"config": {"transforms": "o", "transforms.o.type": "io.debezium.transforms.outbox.EventRouter",
                        "transforms.o.table.field.event.schema.version": "v"}})"),
              "table.field.event.schema.version"));
  CHECK(refusal("value.converter.schema.registry.url=http://r:8081\n").first == "value.converter.schema.registry.url");
}

// Debezium's documentation pairs the outbox with Apicurio's own converter:
// Apicurio 3's serdes write Confluent's framing with the content id, which
// is the id of Apicurio's Confluent-compatible API.
TEST_CASE("connect config: Apicurio's converters, as Debezium's docs configure them", "[config]") {
  auto c = parse(R"({"config": {
      "value.converter": "io.apicurio.registry.utils.converter.AvroConverter",
      "value.converter.apicurio.registry.url": "http://apicurio:8080/apis/registry/v2",
      "value.converter.apicurio.registry.auto-register": "true",
      "value.converter.apicurio.registry.find-latest": "true",
      "value.converter.apicurio.auth.username": "svc",
      "value.converter.apicurio.auth.password": "pw"}})");
  CHECK(c.registry.format == RegistryFormat::avro);
  CHECK(c.registry.apicurio);
  CHECK(c.registry.urls == std::vector<std::string>{"http://apicurio:8080/apis/ccompat/v7"});
  CHECK(c.registry.basic_auth_user_info == "svc:pw");
  CHECK(c.describe().find("=pw") == std::string::npos);

  auto serde = parse(R"({"config": {
      "value.converter": "io.apicurio.registry.utils.converter.SerdeBasedConverter",
      "value.converter.apicurio.registry.converter.serializer": "io.apicurio.registry.serde.protobuf.ProtobufKafkaSerializer",
      "value.converter.apicurio.registry.url": "https://registry.example/apis/registry/v3"}})");
  CHECK(serde.registry.format == RegistryFormat::protobuf);
  CHECK(serde.registry.urls == std::vector<std::string>{"https://registry.example/apis/ccompat/v7"});

  auto with = [](const std::string& extra) {
    return refusal(R"({"config": {"value.converter": "io.apicurio.registry.utils.converter.AvroConverter",
      "value.converter.apicurio.registry.url": "http://r:8080/apis/registry/v3")" + extra + "}}");
  };
  // Framings walrelay does not write, each named.
  CHECK(with(R"(, "value.converter.apicurio.registry.headers.enabled": "true")").first ==
        "value.converter.apicurio.registry.headers.enabled");
  CHECK(with(R"(, "value.converter.apicurio.registry.use-id": "globalId")").first ==
        "value.converter.apicurio.registry.use-id");
  CHECK(with(R"(, "value.converter.apicurio.registry.avro.encoding": "JSON")").first ==
        "value.converter.apicurio.registry.avro.encoding");
  CHECK(with(R"(, "value.converter.apicurio.registry.artifact-resolver-strategy": "x.RecordIdStrategy")").first ==
        "value.converter.apicurio.registry.artifact-resolver-strategy");
  CHECK(refusal(R"({"config": {"value.converter": "io.apicurio.registry.utils.converter.SerdeBasedConverter",
                   "value.converter.apicurio.registry.url": "http://r:8080"}})").first ==
        "value.converter.apicurio.registry.converter.serializer");
  CHECK(refusal(R"({"config": {"value.converter": "io.apicurio.registry.utils.converter.AvroConverter"}})").first ==
        "value.converter.apicurio.registry.url");
}

// Every key migration-from-debezium.md's tables name in their first column
// (Debezium's, Kafka Connect's, Debezium Server's), set alone with a few
// values: each is read, noted or refused with a reason, never "unknown".
TEST_CASE("connect config: no key the migration guide names is an unknown key", "[config]") {
  std::ifstream in(std::string(WALRELAY_SOURCE_DIR) + "/docs/migration-from-debezium.md");
  REQUIRE(in);
  std::stringstream text;
  text << in.rdbuf();
  std::set<std::string> keys;
  std::istringstream lines(text.str());
  std::string line;
  const std::regex code("`([^`]+)`");
  const std::regex key_shape("[a-z][a-zA-Z0-9_-]*(\\.[a-zA-Z0-9_-]+)+");
  while (std::getline(lines, line)) {
    if (line.rfind("| ", 0) != 0 || line.rfind("|---", 0) == 0) continue;
    const std::string first = line.substr(2, line.find(" | ") - 2);
    for (std::sregex_iterator m(first.begin(), first.end(), code), end; m != end; ++m) {
      const std::string k = (*m)[1];
      if (std::regex_match(k, key_shape)) keys.insert(k);
    }
  }
  INFO(keys.size() << " keys");
  REQUIRE(keys.size() > 60);
  for (const auto& k : keys)
    for (const char* value : {"true", "1", "x"}) {
      INFO(k << "=" << value);
      auto [key, why] = refusal(k + "=" + value + "\n");
      CHECK_THAT(why, !Catch::Contains("unknown configuration key"));
    }
}

TEST_CASE("connect config: a connector configuration names no broker - the error says so, and the worker's "
          "bootstrap.servers is taken",
          "[config]") {
  try {
    parse_config("connector.class=io.debezium.connector.postgresql.PostgresConnector\n", "connector.properties", {});
    FAIL("no error without a broker");
  } catch (const ConfigError& e) {
    CHECK(e.key() == "kafka.bootstrap.servers");
    CHECK_THAT(std::string(e.what()), Catch::Contains("Kafka Connect's worker"));
  }
  auto c = parse_config("bootstrap.servers=broker:9092\n", "connector.properties", {});
  CHECK(c.kafka.at("bootstrap.servers") == "broker:9092");
  auto [key, why] = refusal("bootstrap.servers=a:9092\nkafka.bootstrap.servers=b:9092\n");
  CHECK(key == "bootstrap.servers");
  CHECK_THAT(why, Catch::Contains("conflicting"));
}

TEST_CASE("connect config: the keys and families a Debezium configuration carries are noted, and what would let "
          "another confirm the slot is refused",
          "[config]") {
  for (const char* line : {"publish.via.partition.root=true", "lsn.flush.mode=connector", "flush.lsn.source=true",
                           "retriable.restart.connector.wait.ms=10000", "offset.mismatch.strategy=no_validation",
                           "header.converter=org.apache.kafka.connect.storage.SimpleHeaderConverter",
                           "heartbeat.some.new.key=1", "offset.flush.some.key=1", "errors.log.some.key=1",
                           "errors.retry.timeout=0"}) {
    INFO(line);
    auto c = parse(std::string(line) + "\n");
    CHECK(noted(c, std::string(line).substr(0, std::string(line).find('='))));
  }
  CHECK_THAT(refusal("lsn.flush.mode=manual\n").second, Catch::Contains("could pass events not yet sent"));
  CHECK_THAT(refusal("flush.lsn.source=false\n").second, Catch::Contains("could pass events not yet sent"));
  // Debezium Server's RabbitMQ ConnectionFactory keys: walrelay's are read,
  // the factory's others noted; the same key written as walrelay's own is
  // checked as walrelay's (a typo stays an error).
  auto c = parse_config("debezium.sink.type=rabbitmq\ndebezium.sink.rabbitmq.connection.host=mq\n"
                        "debezium.sink.rabbitmq.connection.automatic.recovery.enabled=true\n",
                        "application.properties", {});
  CHECK(noted(c, "sink.rabbitmq.connection.automatic.recovery.enabled"));
  CHECK_FALSE(noted(c, "sink.rabbitmq.connection.host"));
  CHECK_THAT(refusal("sink.type=rabbitmq\nsink.rabbitmq.connection.automatic.recovery.enabled=true\n").second,
             Catch::Contains("unknown"));
  // Connect's names for walrelay's keys.
  CHECK(parse("delivery.timeout.ms=120000\n").kafka.at("message.timeout.ms") == "120000");
}
