// Debezium's and Kafka Connect's configuration keys, read as walrelay's (see
// connect_config.hpp). Every key an outbox connector sets either means
// something here, is dropped with the reason it needs nothing, or is refused
// with what to do instead: never the generic "unknown key".
#include "walrelay/connect_config.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "walrelay/config.hpp"
#include "walrelay/sinks/rabbitmq/rabbitmq_config.hpp"

namespace walrelay {
namespace {

constexpr const char* kEventRouter = "io.debezium.transforms.outbox.EventRouter";
constexpr const char* kActivateTracingSpan = "io.debezium.transforms.tracing.ActivateTracingSpan";

// Keys with nothing to do here, whatever their value, and why.
const std::map<std::string, std::string>& ignored_keys() {
  static const std::string connect = "Kafka Connect's own setting; walrelay is one process with one slot";
  static const std::string topics =
      "names Debezium's change-event topics; the router's records go where route.topic.replacement says";
  static const std::string heartbeat =
      "not needed: walrelay confirms WAL that holds no outbox rows by itself (the slot follows the server while "
      "the outbox is idle), so no heartbeat has to move it";
  static const std::string queue =
      "tunes Debezium's internal queue; walrelay's flow control is max.inflight.records and max.inflight.bytes";
  static const std::string conversion =
      "converts column types in Debezium's change events; the router's record takes the outbox columns as they "
      "are, as walrelay's does";
  static const std::string offsets =
      "Connect's offset commits; walrelay's position is the slot's confirmed LSN (with exactly.once.support, the "
      "offsets topic, committed in each Kafka transaction)";
  static const std::map<std::string, std::string> keys = {
      {"name", connect},
      {"tasks.max", connect},
      {"topic.prefix", topics},
      {"database.server.name", topics},
      {"topic.naming.strategy", topics},
      {"topic.delimiter", topics},
      {"topic.heartbeat.prefix", heartbeat},
      {"heartbeat.interval.ms", heartbeat},
      {"heartbeat.action.query", heartbeat},
      {"heartbeat.topics.prefix", heartbeat},
      {"max.batch.size", queue},
      {"max.queue.size", queue},
      {"max.queue.size.in.bytes", queue},
      {"poll.interval.ms", queue},
      {"decimal.handling.mode", conversion},
      {"time.precision.mode", conversion},
      {"binary.handling.mode", conversion},
      {"hstore.handling.mode", conversion},
      {"interval.handling.mode", conversion},
      {"include.unknown.datatypes", conversion},
      {"money.fraction.digits", conversion},
      {"schema.name.adjustment.mode", conversion},
      {"field.name.adjustment.mode", conversion},
      {"include.schema.changes", "PostgreSQL's connector writes no schema-change topic"},
      {"include.schema.comments", conversion},
      {"tombstones.on.delete", "the router drops deletes, and walrelay relays inserts only"},
      {"skipped.operations", "walrelay relays inserts only; updates follow table.op.invalid.behavior"},
      {"offset.flush.interval.ms", offsets},
      {"offset.flush.timeout.ms", offsets},
      {"offset.storage", offsets},
      {"offset.storage.file.filename", offsets},
      {"offset.storage.topic", offsets},
      {"offset.storage.partitions", offsets},
      {"offset.storage.replication.factor", offsets},
      {"slot.max.retries",
       "walrelay retries a slot that another process holds with reconnect.backoff.ms, growing to "
       "reconnect.backoff.max.ms, without a limit"},
      {"slot.retry.delay.ms", "walrelay's delay between tries is reconnect.backoff.ms, growing to reconnect.backoff.max.ms"},
      {"database.tcpKeepAlive", "walrelay always sets TCP keepalives on its connections"},
      {"xmin.fetch.interval.ms", "walrelay does not read the slot's xmin"},
      {"errors.log.enable", "walrelay logs every record it cannot relay, naming it"},
      {"errors.log.include.messages", "walrelay logs every record it cannot relay, naming it"},
      {"extended.headers.enabled",
       "Debezium's extended headers are on change events; the router's records carry only the headers it places, "
       "as walrelay's do"},
      {"tracing.operation.name",
       "walrelay starts no span of its own: with tracing.enabled=true it passes the writer's trace context on as "
       "the traceparent header, so there is no operation to name"},
      {"tracing.with.context.field.only",
       "walrelay adds trace headers only to rows whose tracing.span.context.field is set, which is what true asks"},
      {"retriable.restart.connector.wait.ms",
       "walrelay starts its session again after a retriable failure with reconnect.backoff.ms, growing to "
       "reconnect.backoff.max.ms, without a limit"},
      {"offset.mismatch.strategy", "the slot's confirmed LSN is walrelay's only position, so there is nothing to "
                                   "reconcile with stored offsets"},
      {"header.converter",
       "walrelay writes each header's value as its text (the id, placed columns, trace context), as Connect's "
       "SimpleHeaderConverter does"},
      {"publish.via.partition.root",
       "the publication walrelay creates has publish_via_partition_root = true, and one it may not change must have "
       "it: a partitioned outbox's rows are read under the root's name; the router routes by route.by.field, so the "
       "topics are the same either way"},
      {"datatype.propagate.source.type", conversion},
      {"table.json.payload.empty.array.behavior",
       "it shapes the Connect schema Debezium infers for an expanded payload; walrelay writes the payload's JSON as "
       "it is, empty arrays included, with no schema"},
  };
  return keys;
}

// Families of keys with nothing to do here, whatever their value, and why
// (a key walrelay has itself is never one of them).
const std::vector<std::pair<std::string, std::string>>& ignored_prefixes() {
  static const std::vector<std::pair<std::string, std::string>> prefixes = {
      {"heartbeat.", "not needed: walrelay confirms WAL that holds no outbox rows by itself (the slot follows the "
                     "server while the outbox is idle), so no heartbeat has to move it"},
      {"offset.", "Connect's offsets; walrelay's position is the slot's confirmed LSN (with exactly.once.support, the "
                  "offsets topic, committed in each Kafka transaction)"},
      {"errors.log.", "walrelay logs every record it cannot relay, naming it"},
      {"errors.retry.", "walrelay retries what can be retried (a lost connection, a broker outage) without a limit, "
                        "with back-off up to reconnect.backoff.max.ms"},
  };
  return prefixes;
}

// Whether walrelay's configuration has the key.
bool known_key(const std::string& key) {
  static const std::set<std::string> keys = [] {
    auto list = config_keys();
    return std::set<std::string>(list.begin(), list.end());
  }();
  return keys.count(key) > 0;
}

// Keys walrelay does not do, and what to do instead.
const std::map<std::string, std::string>& refused_keys() {
  static const std::map<std::string, std::string> keys = {
      {"table.exclude.list",
       "walrelay relays the tables it is told to: name the outbox tables in table.include.list (the publication "
       "then holds only those)"},
      {"schema.exclude.list", "name the outbox tables, schema-qualified, in table.include.list"},
      {"column.include.list", "the router reads the columns it is configured with (table.field.event.*); no list is needed"},
      {"column.exclude.list", "the router reads the columns it is configured with (table.field.event.*); no list is needed"},
      {"message.prefix.exclude.list",
       "walrelay relays only the logical-message prefixes named in message.prefix.include.list and no others: name "
       "those instead"},
      {"message.key.columns", "the record's key is the column table.field.event.key names"},
      {"custom.metric.tags",
       "walrelay's Prometheus metrics carry no configured labels: add them where they are scraped (a scrape job's "
       "labels or relabel_configs, a ServiceMonitor's podTargetLabels)"},
      {"database.initial.statements",
       "walrelay runs no statements of its own choosing on its connections; set session parameters on its role "
       "(ALTER ROLE ... SET)"},
      {"converters", "custom converters change Debezium's change events; the router's record takes the columns as they are"},
      {"post.processors", "post processors change Debezium's change events; the router's record takes the columns as they are"},
      {"signal.data.collection",
       "ad hoc and incremental snapshots are not offered: walrelay relays what is inserted after its slot exists"},
      {"signal.enabled.channels", "signals drive Debezium's snapshots, which walrelay does not take"},
      {"database.sslpassword",
       "walrelay's TLS is libpq's, which reads the key file without asking for a passphrase: use an unencrypted key "
       "file readable only by walrelay's user (database.sslkey)"},
      {"database.sslfactory",
       "a JDBC setting; walrelay's TLS is libpq's: database.sslmode, database.sslrootcert, database.sslcert, "
       "database.sslkey"},
      {"slot.stream.params",
       "walrelay sets pgoutput's options itself (proto_version, publication_names, messages); no other is passed"},
      {"predicates",
       "predicates choose the records a transform applies to; walrelay's router applies to every row of the tables "
       "in table.include.list: name only the outbox tables there"},
  };
  return keys;
}

// The snapshot.* keys that walrelay takes as they are.
bool walrelay_snapshot_key(const std::string& k) {
  return k == "snapshot.mode" || k == "snapshot.fetch.size" || k == "snapshot.order.column" ||
         k == "snapshot.select.statement.overrides" || k.starts_with("snapshot.select.statement.overrides.");
}

// Prefixes of whole families that are refused, and why.
const std::vector<std::pair<std::string, std::string>>& refused_prefixes() {
  static const std::vector<std::pair<std::string, std::string>> prefixes = {
      {"column.", "the router reads the columns it is configured with (table.field.event.*)"},
      {"incremental.snapshot.", "incremental snapshots are not offered: walrelay relays what is inserted after its slot exists"},
      {"snapshot.",
       "walrelay's snapshot takes snapshot.mode (no_data, initial, initial_only), snapshot.fetch.size, "
       "snapshot.select.statement.overrides and snapshot.order.column; Debezium's other snapshot settings tune its "
       "own snapshotter (locks, threads, delays) and mean nothing here"},
      {"signal.", "signals drive Debezium's snapshots, which walrelay does not take"},
      {"notification.", "Debezium's notifications report snapshots, which walrelay does not take"},
      {"predicates.",
       "predicates choose the records a transform applies to; walrelay's router applies to every row of the tables "
       "in table.include.list: name only the outbox tables there"},
      {"schema.history.internal.", "PostgreSQL's connector keeps no schema history"},
  };
  return prefixes;
}

// Keys that mean nothing here with some values and are refused with others.
struct ValuedKey {
  std::set<std::string> accepted;
  std::string noted;    // why an accepted value needs nothing
  std::string refused;  // why the others are refused, and what to do
};
const std::map<std::string, ValuedKey>& valued_keys() {
  static const std::map<std::string, ValuedKey> keys = {
      {"connector.class",
       {{"io.debezium.connector.postgresql.PostgresConnector"}, "walrelay is PostgreSQL's outbox relay",
        "walrelay reads PostgreSQL's WAL only (io.debezium.connector.postgresql.PostgresConnector)"}},
      {"plugin.name",
       {{"pgoutput"}, "walrelay always decodes pgoutput",
        "walrelay decodes pgoutput, which PostgreSQL 10 and later have built in (no server extension to install); "
        "set plugin.name=pgoutput or drop it"}},
      {"slot.drop.on.stop",
       {{"false"}, "walrelay never drops its slot",
        "walrelay keeps its slot across stops: dropping it at each stop would lose every event written while "
        "walrelay is down. Drop a slot by hand (pg_drop_replication_slot) when retiring it"}},
      {"errors.max.retries",
       {{"-1"}, "walrelay retries without a limit, as -1 asks",
        "walrelay retries what can be retried (a lost connection, a broker outage) without a limit, with back-off "
        "up to reconnect.backoff.max.ms, holding the slot meanwhile: a limit would turn an outage into a halt. Alert "
        "on /readyz and walrelay_slot_lag_bytes instead; set -1 or drop it"}},
      {"provide.transaction.metadata",
       {{"false"}, "walrelay writes no transaction-metadata topic",
        "walrelay writes no transaction-metadata topic; for consumers that see whole source transactions, set "
        "exactly.once.support=required (a Kafka transaction holds whole PostgreSQL transactions)"}},
      {"event.processing.failure.handling.mode",
       {{"fail"}, "errors.tolerance=none, walrelay's default, halts on a row it cannot relay, as fail does",
        "walrelay never skips an event without a trace: errors.tolerance=all sends a row it cannot relay to the "
        "dead-letter topic, errors.tolerance=none (the default, like fail) halts on it"}},
      {"lsn.flush.mode",
       {{"connector", "connector_and_driver"}, "walrelay confirms the slot itself, only past what the broker acknowledged",
        "walrelay confirms the slot itself, only past what the broker acknowledged; a slot confirmed by someone else "
        "could pass events not yet sent. Set connector or drop it"}},
      {"flush.lsn.source",
       {{"true"}, "walrelay confirms the slot itself, only past what the broker acknowledged",
        "walrelay confirms the slot itself, only past what the broker acknowledged; a slot confirmed by someone else "
        "could pass events not yet sent. Set true or drop it"}},
      {"producer.acks",
       {{"all", "-1"}, "walrelay always produces with acks=all",
        "walrelay always produces with acks=all: a record is acknowledged only once every in-sync replica has it, "
        "which the slot's confirmation waits for"}},
      {"producer.enable.idempotence",
       {{"true"}, "walrelay's producer is always idempotent",
        "walrelay's producer is always idempotent: a retry never writes a record twice or out of order"}},
      {"table.json.payload.null.behavior",
       {{"ignore", "optional_bytes"},
        "it shapes the Connect schema Debezium infers for an expanded payload; walrelay writes the payload's JSON as "
        "it is, with no schema",
        "expected ignore or optional_bytes"}},
  };
  return keys;
}

// What a refused transform should be replaced by, where there is an answer.
std::string transform_advice(const std::string& type) {
  if (type.find("Filter") != std::string::npos)
    return "filter with a publication row filter (CREATE PUBLICATION ... FOR TABLE outbox WHERE (...), "
           "publication.autocreate.mode=disabled) or at the consumer";
  if (type.find("ExtractNewRecordState") != std::string::npos || type.find("UnwrapFromEnvelope") != std::string::npos)
    return "not needed: walrelay writes the router's output, not change events";
  if (type.find("RegexRouter") != std::string::npos || type.find("TimestampRouter") != std::string::npos ||
      type.find("ByLogicalTableRouter") != std::string::npos)
    return "route with route.by.field, route.topic.regex and route.topic.replacement";
  if (type.find("InsertHeader") != std::string::npos || type.find("HeaderFrom") != std::string::npos)
    return "place a column in a header with table.fields.additional.placement=<column>:header:<name>";
  return "walrelay runs no transform chain";
}

// A table.include.list entry as Debezium reads it (a regular expression
// matched against schema.table) made the table name walrelay needs, or the
// reason it cannot be: walrelay creates the publication for the tables it is
// given, so it must know them by name.
std::string literal_table(const std::string& key, const std::string& entry) {
  std::string out;
  for (std::size_t i = 0; i < entry.size(); ++i) {
    const char c = entry[i];
    // \. (a regular expression's literal dot), or \\. as a Java properties
    // file must write it.
    if (c == '\\') {
      auto j = entry.find_first_not_of('\\', i);
      if (j != std::string::npos && entry[j] == '.' && j - i <= 2) {
        out += '.';
        i = j;
        continue;
      }
    }
    if (std::string_view("[](){}*+?|^$\\").find(c) != std::string_view::npos)
      throw ConfigError(key, "\"" + entry +
                                 "\" is a pattern; walrelay creates the publication for the tables it relays, so it "
                                 "needs each one by name (schema.table, comma-separated)");
    out += c;
  }
  return out;
}

void refuse_value(const RawSetting& s, const std::string& why) {
  throw ConfigError(s.key, "\"" + s.value + "\" (" + s.origin + "): " + why);
}

// The settings being translated and the notes on what is dropped, which
// each family's step below reads and adds to.
struct Translation {
  std::vector<RawSetting>& settings;
  std::vector<std::string>& notes;

  RawSetting* find(const std::string& key) {
    for (auto& s : settings)
      if (s.key == key) return &s;
    return nullptr;
  }
  void note(const RawSetting& s, const std::string& why) {
    notes.push_back(s.key + "=" + shown_setting(s.key, s.value) + " (" + s.origin + ") is not used: " + why);
  }
};

// Debezium Server's application.properties: debezium.source.* are the
// connector's keys, debezium.transforms* the chain, debezium.sink.kafka.
// producer.* the producer's, debezium.sink.type and the other sinks' keys
// walrelay's sink.* (checked there). Returns the RabbitMQ connection keys
// Debezium Server passed on (debezium.sink.rabbitmq.connection.*), renamed.
std::set<std::string> unwrap_debezium_server(Translation& tr) {
  std::vector<RawSetting> kept;
  for (auto& s : tr.settings) {
    if (s.key.starts_with("debezium.format.")) {
      if (s.value != "json")
        refuse_value(s, "Debezium Server's format of change events; the router's records take the payload as it is");
      tr.note(s, "the router's records take the payload as it is");
      continue;
    }
    if (s.key.starts_with("quarkus.")) {
      tr.note(s, "Debezium Server's runtime (Quarkus) setting");
      continue;
    }
    kept.push_back(s);
  }
  tr.settings = std::move(kept);
  std::set<std::string> server_rabbitmq_connection;
  for (auto& s : tr.settings) {
    if (s.key.starts_with("debezium.sink.rabbitmq.connection.")) server_rabbitmq_connection.insert(s.key.substr(9));
    if (s.key.starts_with("debezium.source.")) s.key = s.key.substr(16);
    else if (s.key.starts_with("debezium.transforms")) s.key = s.key.substr(9);
    else if (s.key.starts_with("debezium.sink.kafka.producer.")) s.key = "kafka." + s.key.substr(29);
    else if (s.key == "debezium.sink.type" || s.key.starts_with("debezium.sink.nats-jetstream.") ||
             s.key.starts_with("debezium.sink.rabbitmq.") || s.key.starts_with("debezium.sink.redis.") ||
             s.key.starts_with("debezium.sink.http."))
      s.key = s.key.substr(9);
    else if (s.key.starts_with("producer.override.")) s.key = "kafka." + s.key.substr(18);
  }
  return server_rabbitmq_connection;
}

// Keys Kafka Connect and Debezium 1.x name otherwise, renamed to walrelay's.
void rename_connect_keys(Translation& tr) {
  // Connect's names for what walrelay has under its own.
  static const std::pair<const char*, const char*> connect_names[] = {
      {"delivery.timeout.ms", "kafka.message.timeout.ms"},
      {"task.shutdown.graceful.timeout.ms", "shutdown.timeout.ms"},
  };
  for (auto& [connect_name, name] : connect_names)
    if (auto* s = tr.find(connect_name)) {
      if (tr.find(name))
        throw ConfigError(connect_name, std::string("conflicting or redundant: set both as ") + name + " and as " +
                                            connect_name + " (" + s->origin + ")");
      s->origin += std::string(", Kafka Connect's ") + connect_name;
      s->key = name;
    }

  // Kafka Connect's worker names the brokers, not the connector: a worker's
  // bootstrap.servers is taken as walrelay's kafka.bootstrap.servers.
  if (auto* b = tr.find("bootstrap.servers")) {
    if (tr.find("kafka.bootstrap.servers"))
      throw ConfigError("bootstrap.servers", "conflicting or redundant: set both as kafka.bootstrap.servers and as "
                                             "the Kafka Connect worker's bootstrap.servers (" + b->origin + ")");
    b->origin += ", the Kafka Connect worker's bootstrap.servers";
    b->key = "kafka.bootstrap.servers";
  }

  // Debezium 1.x's names, renamed in 1.3 and gone in 2.0, still in older
  // examples.
  static const std::pair<const char*, const char*> old_names[] = {
      {"table.whitelist", "table.include.list"},   {"table.blacklist", "table.exclude.list"},
      {"schema.whitelist", "schema.include.list"}, {"schema.blacklist", "schema.exclude.list"},
      {"column.whitelist", "column.include.list"}, {"column.blacklist", "column.exclude.list"},
  };
  for (auto& s : tr.settings)
    for (auto& [old_name, name] : old_names)
      if (s.key == old_name) {
        if (tr.find(name)) throw ConfigError(name, std::string("conflicting or redundant: set both as ") + name + " and as " + old_name);
        s.origin += ", under Debezium 1.x's name " + s.key;
        s.key = name;
      }
}

// The transform chain as its list names it.
struct Chain {
  std::set<std::string> names;
  std::string router;                 // the outbox router's name
  std::optional<RawSetting> tracing;  // tracing.enabled, when tracing's SMT is in the chain
};

// The transforms list read: one outbox router, tracing's SMT, and any other
// transform refused naming what to do instead.
Chain read_chain(Translation& tr) {
  Chain chain;
  auto* t = tr.find("transforms");
  if (!t) return chain;
  for (auto& name : split_list(t->value)) {
    if (name == "...")
      throw ConfigError("transforms", "\"" + t->value + "\" (" + t->origin +
                                          "): \"...\" stands for the rest of a chain in Debezium's documentation; "
                                          "list the transforms themselves (walrelay applies the outbox router only)");
    chain.names.insert(name);
    auto* type = tr.find("transforms." + name + ".type");
    if (!type) throw ConfigError("transforms." + name + ".type", "transform \"" + name + "\" has no type");
    if (type->value == kEventRouter) {
      if (!chain.router.empty())
        throw ConfigError(type->key, "a second outbox router (\"" + chain.router + "\" is one): walrelay applies one");
      chain.router = name;
    } else if (type->value == kActivateTracingSpan) {
      // Debezium's way to turn tracing on for a connector.
      chain.tracing = RawSetting{"tracing.enabled", "true", type->origin};
    } else {
      throw ConfigError(type->key, "\"" + type->value + "\" (" + type->origin +
                                       "): walrelay applies Debezium's outbox router (" + kEventRouter +
                                       ") and nothing else in the chain; for transform \"" + name +
                                       "\": " + transform_advice(type->value));
    }
  }
  tr.note(*t, "walrelay applies the router it names itself");
  return chain;
}

// The transform chain: the router's keys lose their prefix, tracing's SMT
// turns tracing on, anything else is refused naming it.
void unfold_transform_chain(Translation& tr) {
  Chain chain = read_chain(tr);
  if (chain.tracing) tr.settings.push_back(*chain.tracing);
  std::vector<RawSetting> out;
  for (auto& s : tr.settings) {
    if (s.key == "transforms") continue;
    if (!s.key.starts_with("transforms.")) {
      out.push_back(s);
      continue;
    }
    auto rest = s.key.substr(11);
    auto dot = rest.find('.');
    auto name = rest.substr(0, dot);
    if (!chain.names.count(name))
      throw ConfigError(s.key, "transform \"" + name + "\" is not in the transforms list (" + s.origin + ")");
    auto sub = dot == std::string::npos ? std::string() : rest.substr(dot + 1);
    if (sub == "type") continue;
    if (sub == "predicate" || sub == "negate")
      throw ConfigError(s.key, "\"" + s.value + "\" (" + s.origin +
                                   "): predicates choose the records a transform applies to; walrelay's router "
                                   "applies to every row of the tables in table.include.list: name only the outbox "
                                   "tables there");
    if (name == chain.router) {
      if (tr.find(sub))
        throw ConfigError(sub, "conflicting or redundant: set both as " + sub + " and as " + s.key + " (" + s.origin +
                                   ")");
      out.push_back({sub, s.value, s.origin});
    } else if (sub.starts_with("tracing.")) {  // ActivateTracingSpan's own keys
      out.push_back({sub, s.value, s.origin});
    } else {
      throw ConfigError(s.key, "not a key of transform \"" + name + "\" that walrelay reads (" + s.origin + ")");
    }
  }
  tr.settings = std::move(out);
}

// Whether a key means nothing here (noted as such): the ignored keys and
// families, and RabbitMQ connection settings walrelay's client does not need.
bool ignored_setting(Translation& tr, const RawSetting& s, const std::set<std::string>& server_rabbitmq_connection) {
  const auto& k = s.key;
  if (auto it = ignored_keys().find(k); it != ignored_keys().end()) {
    tr.note(s, it->second);
    return true;
  }
  if (known_key(k)) return false;
  auto family = std::find_if(ignored_prefixes().begin(), ignored_prefixes().end(),
                             [&](auto& p) { return k.starts_with(p.first); });
  if (family != ignored_prefixes().end()) {
    tr.note(s, family->second);
    return true;
  }
  // RabbitMQ's Java ConnectionFactory settings that Debezium Server
  // passes on (debezium.sink.rabbitmq.connection.*) and walrelay's
  // client has no use for.
  const auto rabbitmq = rabbitmq_keys();
  if (server_rabbitmq_connection.count(k) &&
      std::find(rabbitmq.begin(), rabbitmq.end(), std::string_view(k).substr(14)) == rabbitmq.end()) {
    tr.note(s, "a setting of RabbitMQ's Java ConnectionFactory that walrelay's client does not need: it reconnects "
               "by itself (reconnect.backoff.ms), takes the broker's channel and frame limits, and reads the "
               "connection keys in docs/configuration.md");
    return true;
  }
  return false;
}

// Refuses the refused keys and families; whether a key whose meaning
// depends on its value was accepted (and noted).
bool valued_setting(Translation& tr, const RawSetting& s) {
  const auto& k = s.key;
  if (auto it = refused_keys().find(k); it != refused_keys().end()) refuse_value(s, it->second);
  for (auto& [prefix, why] : refused_prefixes())
    if (k.starts_with(prefix) && !walrelay_snapshot_key(k)) refuse_value(s, why);
  auto it = valued_keys().find(k);
  if (it == valued_keys().end()) return false;
  const ValuedKey& rule = it->second;
  if (!rule.accepted.count(s.value)) refuse_value(s, rule.refused);
  tr.note(s, rule.noted);
  return true;
}

// The converters the settings name, which decide what the converters' own
// keys mean.
struct Converters {
  const RawSetting* key = nullptr;
  const RawSetting* value = nullptr;
  bool registry = false;  // value is a schema-registry converter
};

// Whether a key of JsonConverter or BinaryDataConverter, or a schema's
// version, means nothing with these converters (noted as such).
bool unused_converter_setting(Translation& tr, const RawSetting& s, const Converters& conv) {
  const auto& k = s.key;
  if (k == "key.converter.schemas.enable" || k == "value.converter.schemas.enable") {
    const auto* c = k[0] == 'k' ? conv.key : conv.value;
    if (!c || c->value != "org.apache.kafka.connect.json.JsonConverter") {
      tr.note(s, "it applies to JsonConverter only, and the converter here is " +
                     (c ? c->value : std::string("StringConverter, walrelay's default")));
      return true;
    }
  }
  if (k.starts_with("key.converter.delegate.") || k.starts_with("value.converter.delegate.")) {
    tr.note(s, "BinaryDataConverter's delegate serializes Debezium's heartbeat, transaction and schema-change events, "
               "which walrelay does not write");
    return true;
  }
  if (k == "table.field.event.schema.version" && !conv.registry) {
    tr.note(s, "it selects a schema's version for a schema-registry converter, and value.converter is not one");
    return true;
  }
  return false;
}

// A schema-registry converter's keys walrelay does not read: those that
// shape the schema Connect derives from its data (walrelay encodes by the
// registered schema) or tune Apicurio's client are noted, the others refused.
bool registry_converter_setting(Translation& tr, const RawSetting& s, const Converters& conv) {
  const auto& k = s.key;
  if (!conv.registry || !k.starts_with("value.converter.") || known_key(k)) return false;
  static const std::vector<std::string> schema_shaping = {
      "enhanced.avro.schema.support", "connect.meta.data", "schemas.cache.config", "scrub.invalid.names",
      "avro.", "json.", "protobuf.", "generalized.sum.type.support", "normalize.schemas", "ignore.default.for.nullables",
      "decimal.format", "enhanced.protobuf.schema.support", "optional.for.nullables", "wrapper.for.nullables",
      "int.for.enums", "schemas.cache.size", "object.additional.properties", "use.optional.for.nonrequired"};
  const auto sub = k.substr(16);
  if (std::any_of(schema_shaping.begin(), schema_shaping.end(), [&](auto& p) { return sub.starts_with(p); })) {
    tr.note(s, "it shapes the schema Kafka Connect derives from a record; walrelay encodes the payload by the "
               "subject's registered schema");
    return true;
  }
  if (sub.starts_with("schema.registry.ssl.truststore.") || sub.starts_with("schema.registry.ssl.keystore."))
    refuse_value(s, "Java key stores are not read: give PEM files in value.converter.schema.registry.ssl.ca.location, "
                    "...ssl.certificate.location and ...ssl.key.location");
  if (sub.starts_with("apicurio.registry.request.") || sub.starts_with("apicurio.registry.check-period") ||
      sub.starts_with("apicurio.registry.cache-latest") || sub.starts_with("apicurio.registry.retry") ||
      sub == "apicurio.registry.dereference-schema") {
    tr.note(s, "it tunes Apicurio's Java client; walrelay fetches a subject's schema once and retries with backoff");
    return true;
  }
  if (sub.starts_with("apicurio."))
    refuse_value(s, "a key of Apicurio's serdes that walrelay does not read; what it writes is Apicurio 3's "
                    "default framing (docs/configuration.md, schema registry)");
  if (sub == "key.subject.name.strategy")
    refuse_value(s, "the key is the aggregate id as a string (key.converter=StringConverter); it has no subject");
  return false;
}

// Debezium's CloudEventsConverter's own keys: noted where walrelay's
// CloudEvents already are what they ask, refused otherwise.
bool cloudevents_converter_setting(Translation& tr, const RawSetting& s, const Converters& conv) {
  const auto& k = s.key;
  if (!k.starts_with("value.converter.") || !conv.value ||
      conv.value->value != "io.debezium.converters.CloudEventsConverter" || k == "value.converter.schemas.enable")
    return false;
  const auto sub = k.substr(16);
  if (sub == "serializer.type" || sub == "data.serializer.type") {
    if (s.value != "json")
      refuse_value(s, "walrelay writes structured CloudEvents and their data as JSON; for a schema registry use "
                      "cloudevents.mode=binary (the attributes in headers) with value.converter="
                      "io.confluent.connect.avro.AvroConverter");
    tr.note(s, "walrelay writes CloudEvents as JSON");
    return true;
  }
  if (sub == "metadata.source" || sub == "extension.attributes.enable" || sub.starts_with("schema.") ||
      sub.starts_with("json.") || sub == "opentelemetry.tracing.attributes.enable") {
    tr.note(s, "walrelay builds the event from the outbox columns: id, type (table.field.event.type), the key as "
               "subject, the record's time, and cloudevents.source; it adds no Debezium extension attributes");
    return true;
  }
  refuse_value(s, "not a key of CloudEventsConverter that walrelay reads");
  return false;  // not reached
}

// Whether a table key was taken under walrelay's reading of its value
// (added to out): the tables by name, and the newer spelling of
// table.fields.additional.error.on.missing.
bool table_setting(const RawSetting& s, std::vector<RawSetting>& out) {
  const auto& k = s.key;
  if (k == "table.include.list") {
    std::string tables;
    for (auto& entry : split_list(s.value)) tables += (tables.empty() ? "" : ",") + literal_table(k, entry);
    out.push_back({k, tables, s.origin});
    return true;
  }
  if (k != "table.field.additional.missing") return false;
  std::string v = s.value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "error" || v == "fail" || v == "true")
    out.push_back({"table.fields.additional.error.on.missing", "true", s.origin});
  else if (v == "skip" || v == "ignore" || v == "warn" || v == "false")
    out.push_back({"table.fields.additional.error.on.missing", "false", s.origin});
  else
    refuse_value(s, "expected error (a missing additional column is the row's mapping error) or skip (the field "
                    "is left out)");
  return true;
}

// A schema list beside the tables adds nothing when it holds each table's
// schema; walrelay needs the tables by name, so it refuses one that would
// have to choose tables itself.
void check_schema_list(Translation& tr, const RawSetting& schemas, const std::vector<RawSetting>& out) {
  auto listed = split_list(schemas.value);
  std::string tables = "public.outbox";
  for (auto& o : out)
    if (o.key == "table.include.list") tables = o.value;
  for (auto& t : split_list(tables)) {
    auto dot = t.find('.');
    auto schema = dot == std::string::npos ? std::string("public") : t.substr(0, dot);
    if (std::find(listed.begin(), listed.end(), schema) == listed.end())
      refuse_value(schemas, "table " + t + " is not in these schemas; walrelay relays the tables named in "
                            "table.include.list (schema-qualified) and needs no schema list");
  }
  tr.note(schemas, "every table of table.include.list is in these schemas");
}

// Key by key: what means nothing here, what needs a look at the value,
// and what is refused.
void translate_each_key(Translation& tr, const std::set<std::string>& server_rabbitmq_connection) {
  Converters conv;
  conv.value = tr.find("value.converter");
  conv.key = tr.find("key.converter");
  conv.registry = conv.value && ((conv.value->value.starts_with("io.confluent.connect.") &&
                                  conv.value->value != "io.confluent.connect.json.JsonConverter") ||
                                 conv.value->value.starts_with("io.apicurio.registry.utils.converter."));
  const RawSetting* schemas = nullptr;
  std::vector<RawSetting> out;
  for (auto& s : tr.settings) {
    if (ignored_setting(tr, s, server_rabbitmq_connection) || valued_setting(tr, s) ||
        unused_converter_setting(tr, s, conv) || registry_converter_setting(tr, s, conv))
      continue;
    if (s.key == "schema.include.list") {
      schemas = &s;
      continue;
    }
    if (cloudevents_converter_setting(tr, s, conv) || table_setting(s, out)) continue;
    out.push_back(s);
  }
  if (schemas) check_schema_list(tr, *schemas, out);
  tr.settings = std::move(out);
}

}  // namespace

std::optional<std::vector<RawSetting>> parse_connect_json(const std::string& text, const std::string& source_name) {
  auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] != '{') return std::nullopt;
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError("", source_name + ": not valid JSON: " + e.what());
  }
  // Connect's REST body: {"name": ..., "config": {...}}; or the settings alone.
  const nlohmann::json* settings = &doc;
  std::vector<RawSetting> out;
  if (doc.contains("config") && doc["config"].is_object()) {
    settings = &doc["config"];
    for (auto& [k, v] : doc.items())
      if (k != "config" && k != "name")
        throw ConfigError(k, source_name + ": a member of Kafka Connect's request body other than name and config");
    if (doc.contains("name") && doc["name"].is_string())
      out.push_back({"name", doc["name"].get<std::string>(), source_name + ": name"});
  }
  for (auto& [k, v] : settings->items()) {
    std::string value;
    if (v.is_string()) value = v.get<std::string>();
    else if (v.is_boolean()) value = v.get<bool>() ? "true" : "false";
    else if (v.is_number()) value = v.dump();
    else
      throw ConfigError(k, source_name + ": expected a string, number or boolean, got " + std::string(v.type_name()));
    if (auto same = std::find_if(out.begin(), out.end(), [&](const RawSetting& s) { return s.key == k; });
        same != out.end()) {
      if (k == "name" && same->value == value) continue;  // Connect allows the name in both places
      throw ConfigError(k, "conflicting or redundant: set twice in " + source_name);
    }
    out.push_back({k, value, source_name + ": \"" + k + "\""});
  }
  return out;
}

void translate_connect_keys(std::vector<RawSetting>& settings, std::vector<std::string>& notes) {
  Translation tr{settings, notes};
  const auto server_rabbitmq_connection = unwrap_debezium_server(tr);
  rename_connect_keys(tr);
  unfold_transform_chain(tr);
  translate_each_key(tr, server_rabbitmq_connection);
}

}  // namespace walrelay
