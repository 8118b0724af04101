#include <catch2/catch.hpp>

#include "walrelay/config.hpp"

using namespace walrelay;

namespace {
Config parse(const std::string& text, std::vector<std::string> env = {}) {
  return parse_config("kafka.bootstrap.servers=127.0.0.1:9092\n" + text, "test.properties", env);
}
std::string error_key(const std::string& text, std::vector<std::string> env = {}) {
  try {
    parse(text, env);
  } catch (const ConfigError& e) {
    return e.key();
  }
  return "(no error)";
}
}  // namespace

TEST_CASE("config: Debezium's defaults", "[config]") {
  auto c = parse("");
  CHECK(c.table_include_list.size() == 1);
  CHECK(c.table_include_list[0].qualified() == "public.outbox");
  CHECK(c.field_event_id == "id");
  CHECK(c.field_event_key == "aggregateid");
  CHECK(c.field_event_payload == "payload");
  CHECK(c.route_by_field == "aggregatetype");
  CHECK(c.route_topic_replacement == "outbox.event.${routedByValue}");
  CHECK(c.slot_name == "walrelay");
  CHECK(c.admin_listen == "127.0.0.1:8080");
  CHECK(c.kafka.at("enable.idempotence") == "true");
  CHECK(c.kafka.at("acks") == "all");
  CHECK(c.kafka.at("partitioner") == "murmur2_random");
  // A batch that grows only while a request is outstanding (docs/benchmarks.md, "Sidecar cost").
  CHECK(c.kafka.at("linger.ms") == "0");
  CHECK(c.kafka.at("max.in.flight.requests.per.connection") == "1");
}

TEST_CASE("config: the producer's batching can be set, under either of librdkafka's names", "[config]") {
  auto c = parse("kafka.linger.ms=5\nkafka.max.in.flight=5\n");
  CHECK(c.kafka.at("linger.ms") == "5");
  CHECK(c.kafka.at("max.in.flight.requests.per.connection") == "5");
  CHECK(c.kafka.count("max.in.flight") == 0);
  CHECK(error_key("kafka.max.in.flight=2\nkafka.max.in.flight.requests.per.connection=3\n") == "kafka.max.in.flight");
}

TEST_CASE("config: keys, lists and comments", "[config]") {
  auto c = parse(
      "# comment\n! also a comment\n\n"
      "table.include.list = app.outbox, billing.events\n"
      "table.fields.additional.placement=type:header:eventType,tenant:header\n"
      "database.port=5433\nerrors.tolerance=all\nerrors.deadletterqueue.topic.name=dlq\n"
      "kafka.linger.ms=20\n");
  REQUIRE(c.table_include_list.size() == 2);
  CHECK(c.table_include_list[1].schema == "billing");
  REQUIRE(c.additional_placement.size() == 2);
  CHECK(c.additional_placement[0].alias == "eventType");
  CHECK(c.additional_placement[1].alias == "tenant");
  CHECK(c.database_port == "5433");
  CHECK(c.errors_tolerance == ErrorTolerance::all);
  CHECK(c.kafka.at("linger.ms") == "20");
}

TEST_CASE("config: bad input names the key", "[config]") {
  CHECK(error_key("no.such.key=1\n") == "no.such.key");
  CHECK(error_key("slot.name=a\nslot.name=b\n") == "slot.name");
  CHECK(error_key("database.port=http\n") == "database.port");
  CHECK(error_key("database.port=70000\n") == "database.port");
  CHECK(error_key("slot.name=Bad-Name\n") == "slot.name");
  CHECK(error_key("errors.tolerance=some\n") == "errors.tolerance");
  CHECK(error_key("errors.tolerance=all\n") == "errors.deadletterqueue.topic.name");
  CHECK(error_key("kafka.acks=1\n") == "kafka.acks");
  CHECK(error_key("kafka.enable.idempotence=false\n") == "kafka.enable.idempotence");
  CHECK(error_key("table.fields.additional.placement=type:value\n") == "table.fields.additional.placement");
  CHECK(error_key("admin.listen=8080\n") == "admin.listen");
  CHECK(error_key("log.format=xml\n") == "log.format");
  CHECK(error_key("publication.autocreate.mode=all_tables\n") == "publication.autocreate.mode");
  CHECK(error_key("max.inflight.records=0\n") == "max.inflight.records");
  CHECK(error_key("errors.tolerance=all\nerrors.deadletterqueue.topic.name=dead letters\n") ==
        "errors.deadletterqueue.topic.name");
  CHECK(error_key("route.topic.replacement=outbox/${routedByValue}\n") == "route.topic.replacement");
  // librdkafka's other names for a property are checked like the first.
  CHECK(error_key("kafka.request.required.acks=1\n") == "kafka.acks");
  CHECK(error_key("kafka.acks=all\nkafka.request.required.acks=all\n") == "kafka.request.required.acks");
  CHECK(error_key("just a line\n") == "");
  CHECK_THROWS_AS(parse_config("", "x", {}), ConfigError);  // bootstrap servers required
}

TEST_CASE("config: the environment wins over the file", "[config]") {
  auto c = parse("database.hostname=file-host\n",
                 {"WALRELAY_DATABASE_HOSTNAME=env-host", "WALRELAY_KAFKA_CLIENT_ID=relay-7", "WALRELAY_TEST_X=1",
                  "PATH=/bin"});
  CHECK(c.database_hostname == "env-host");
  CHECK(c.kafka.at("client.id") == "relay-7");
  CHECK(c.origin.at("database.hostname") == "environment WALRELAY_DATABASE_HOSTNAME");
  CHECK(error_key("", {"WALRELAY_DATABASE_PORT=x"}) == "database.port");
}

TEST_CASE("config: secrets never appear in descriptions or redacted conninfo", "[config]") {
  auto c = parse("database.password=s3cr3t-pw\nadmin.token=tok-123\nkafka.sasl.password=kpw\n");
  CHECK(c.conninfo(true).find("s3cr3t-pw") != std::string::npos);
  CHECK(c.conninfo_redacted(true).find("s3cr3t-pw") == std::string::npos);
  auto d = c.describe();
  CHECK(d.find("s3cr3t-pw") == std::string::npos);
  CHECK(d.find("tok-123") == std::string::npos);
  CHECK(d.find("kpw") == std::string::npos);
  CHECK(d.find("database.password=********") != std::string::npos);
}

TEST_CASE("config: retention's deletes connect as table.retention.user when set, its password kept secret",
          "[config]") {
  auto same = parse("database.user=relay\ndatabase.password=s3cr3t-pw\n");
  CHECK(same.retention_conninfo() == same.conninfo(false));
  auto c = parse("database.user=relay\ndatabase.password=s3cr3t-pw\ntable.retention.user=cleaner\n"
                 "table.retention.password=cl34n-pw\n");
  CHECK(c.retention_conninfo().find("user='cleaner'") != std::string::npos);
  CHECK(c.retention_conninfo().find("password='cl34n-pw'") != std::string::npos);
  CHECK(c.retention_conninfo().find("s3cr3t-pw") == std::string::npos);
  CHECK(c.retention_conninfo().find("replication") == std::string::npos);
  CHECK(c.conninfo(false).find("user='relay'") != std::string::npos);
  auto d = c.describe();
  CHECK(d.find("cl34n-pw") == std::string::npos);
  CHECK(d.find("table.retention.password=********") != std::string::npos);
  CHECK(d.find("table.retention.user=cleaner") != std::string::npos);
}

TEST_CASE("config: conninfo quotes values", "[config]") {
  auto c = parse("database.password=it's\\x\n");
  CHECK(c.conninfo(false).find("password='it\\'s\\\\x'") != std::string::npos);
  CHECK(c.conninfo(true).find("replication=database") != std::string::npos);
}

TEST_CASE("config: a copied Kafka Connect delivery.timeout.ms is honoured and warned about", "[config]") {
  auto c = parse_config("kafka.bootstrap.servers=x:1\nkafka.delivery.timeout.ms=300000\n", "t", {});
  CHECK(c.kafka.at("message.timeout.ms") == "300000");
  CHECK(c.kafka.count("delivery.timeout.ms") == 0);
  auto warnings = config_warnings(c);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("kafka.message.timeout.ms=300000") != std::string::npos);
  CHECK(config_warnings(parse_config("kafka.bootstrap.servers=x:1\n", "t", {})).empty());
}

TEST_CASE("config: several hosts, a port each or one for all, and the primary found by default", "[config]") {
  auto one = parse("database.hostname=db1\n");
  CHECK(one.conninfo(false).find("target_session_attrs") == std::string::npos);
  auto two = parse("database.hostname=db1,db2\ndatabase.port=5432, 5433\n");
  CHECK(two.database_port == "5432,5433");
  CHECK(two.conninfo(false).find("host='db1,db2' port='5432,5433'") != std::string::npos);
  CHECK(two.conninfo(false).find("target_session_attrs=read-write") != std::string::npos);
  auto standby = parse("database.hostname=db1,db2\ndatabase.target.session.attrs=standby\n");
  CHECK(standby.conninfo(false).find("target_session_attrs=standby") != std::string::npos);
  CHECK(error_key("database.hostname=a,b,c\ndatabase.port=1,2\n") == "database.port");
  CHECK(error_key("database.target.session.attrs=writable\n") == "database.target.session.attrs");
  CHECK(parse("slot.failover=true\n").slot_failover);
  CHECK_FALSE(parse("").slot_failover);
}

TEST_CASE("config: the boundary interval is checked against librdkafka's transaction time-out when it is not set",
          "[config]") {
  CHECK(error_key("exactly.once.support=required\ntransaction.boundary.interval.ms=40000\n") ==
        "transaction.boundary.interval.ms");
  CHECK(error_key("exactly.once.support=required\ntransaction.boundary.interval.ms=30000\n") == "(no error)");
  CHECK(error_key("exactly.once.support=required\ntransaction.boundary.interval.ms=40000\n"
                  "kafka.transaction.timeout.ms=90000\n") == "(no error)");
}

TEST_CASE("config: --print-config prints every key, secrets masked", "[config]") {
  auto c = parse("database.password=s3cret\n");
  const std::string text = "\n" + c.describe();
  for (auto& key : config_keys()) {
    INFO(key);
    CHECK(text.find("\n" + key + "=") != std::string::npos);
  }
  CHECK(text.find("s3cret") == std::string::npos);
  CHECK(text.find("database.password=********") != std::string::npos);
}

TEST_CASE("config: the snapshot takes Debezium's keys - a mode, a fetch size, an override per table, as a SELECT or a "
          "condition",
          "[config]") {
  auto d = parse("");
  CHECK(d.snapshot_mode == SnapshotMode::no_data);
  CHECK(d.snapshot_fetch_size == 10240);
  CHECK(parse("snapshot.mode=never\n").snapshot_mode == SnapshotMode::no_data);
  CHECK(parse("snapshot.mode=initial_only\n").snapshot_mode == SnapshotMode::initial_only);
  auto c = parse(
      "snapshot.mode=initial\nsnapshot.fetch.size=500\ntable.include.list=public.outbox,app.events\n"
      "snapshot.select.statement.overrides=public.outbox,app.events\n"
      "snapshot.select.statement.overrides.public.outbox=SELECT * FROM public.outbox WHERE sent_at IS NULL\n"
      "snapshot.select.statement.overrides.app.events=  WHERE created > now() - interval '1 day'\n"
      "snapshot.order.column=seq\n");
  CHECK(c.snapshot_mode == SnapshotMode::initial);
  CHECK(c.snapshot_fetch_size == 500);
  CHECK(c.snapshot_order_column == "seq");
  CHECK(c.snapshot_select_overrides.at("public.outbox") == "SELECT * FROM public.outbox WHERE sent_at IS NULL");
  CHECK(c.snapshot_select_overrides.at("app.events") == "WHERE created > now() - interval '1 day'");
  CHECK(c.describe().find("snapshot.mode=initial\n") != std::string::npos);
  CHECK(c.describe().find("snapshot.order.column=seq\n") != std::string::npos);
  // Each mistake names its key.
  CHECK(error_key("snapshot.mode=always\n") == "snapshot.mode");
  CHECK(error_key("snapshot.mode=sometimes\n") == "snapshot.mode");
  CHECK(error_key("snapshot.fetch.size=0\n") == "snapshot.fetch.size");
  // Retention: a policy it has, and a row's age read from a column of its own.
  CHECK(error_key("table.retention.policy=truncate\n") == "table.retention.policy");
  CHECK(error_key("table.retention.policy=delete\n") == "table.retention.ms");
  CHECK(error_key("table.retention.policy=delete\ntable.retention.ms=0\n") == "(no error)");
  CHECK(error_key("table.retention.policy=delete\ntable.field.event.timestamp=created_at\n") == "(no error)");
  CHECK(error_key("table.retention.policy=delete\ntable.retention.time.column=created_at\n") == "(no error)");
  CHECK(error_key("table.retention.policy=delete\ntable.retention.ms=0\ntable.include.list=\n"
                  "message.prefix.include.list=outbox\n") == "table.retention.policy");
  CHECK(error_key("table.retention.interval.ms=10\n") == "table.retention.interval.ms");
  // drop-partitions reads the age from the partitions' ranges; both policies
  // archive (whole partitions, or the deleted rows), none without a policy.
  CHECK(error_key("table.retention.policy=drop-partitions\n") == "(no error)");
  CHECK(error_key("table.retention.policy=drop-partitions\ntable.retention.archive.schema=outbox_archive\n") ==
        "(no error)");
  CHECK(error_key("table.retention.policy=delete\ntable.retention.ms=0\ntable.retention.archive.schema=a\n") ==
        "(no error)");
  CHECK(error_key("table.retention.archive.schema=a\n") == "table.retention.archive.schema");
  // Deleted rows go to the archive table of their table's name: not the
  // table itself, and not one table for two.
  CHECK(error_key("table.retention.policy=delete\ntable.retention.ms=0\ntable.retention.archive.schema=public\n") ==
        "table.retention.archive.schema");
  CHECK(error_key("table.retention.policy=delete\ntable.retention.ms=0\ntable.retention.archive.schema=a\n"
                  "table.include.list=s1.outbox,s2.outbox\n") == "table.retention.archive.schema");
  CHECK(error_key("table.retention.policy=delete\ntable.retention.ms=0\ntable.retention.password=x\n") ==
        "table.retention.password");
  CHECK(error_key("snapshot.mode=initial\nsnapshot.select.statement.overrides.public.other=WHERE true\n") ==
        "snapshot.select.statement.overrides.public.other");
  CHECK(error_key("snapshot.select.statement.overrides.public.outbox=WHERE true\n") ==
        "snapshot.select.statement.overrides.public.outbox");  // no snapshot to use it
  CHECK(error_key("snapshot.mode=initial\nsnapshot.select.statement.overrides=public.outbox\n") ==
        "snapshot.select.statement.overrides");  // listed, not given
  CHECK(error_key("snapshot.mode=initial\nsnapshot.select.statement.overrides.public.outbox=\n") ==
        "snapshot.select.statement.overrides.public.outbox");
  CHECK(error_key("snapshot.mode=initial\nsnapshot.order.column=\n") == "snapshot.order.column");
  // Under exactly once the snapshot is one Kafka transaction (relay_snapshot.cpp).
  CHECK(error_key("snapshot.mode=initial\nexactly.once.support=required\nkafka.transactional.id=t\n") ==
        "(no error)");
}
