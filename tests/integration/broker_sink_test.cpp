// The brokers beside Kafka, each against its real server started by
// scripts/services.sh and read back with its own Python client, never with
// walrelay's code: NATS JetStream (nats-server, nats-py:
// tests/integration/nats/read.py) and RabbitMQ (rabbitmq-server, pika:
// tests/integration/rabbitmq/read.py). Each guarantee is one test template,
// run for each broker.
//
// NATS JetStream drops what a restart sends again by its Nats-Msg-Id (the
// stream's duplicate window, 2 min by default): there the stream must hold
// every event exactly once. RabbitMQ keeps repeats (consumers deduplicate by
// message_id): there every event at least once, each repeat within the
// in-flight bound.
#include <algorithm>
#include <csignal>
#include <set>
#include <fstream>
#include <future>

#include <nlohmann/json.hpp>

#include "in_process.hpp"
#include "test_util.hpp"
#include "walrelay/sinks/rabbitmq/rabbitmq_sink.hpp"

using namespace it;
using nlohmann::json;

namespace {

// Runs a reader script; its JSON lines as records: the subject or routing
// key as topic, the stream sequence (or arrival order) as offset on one
// "partition", the `key` header as key.
std::vector<KafkaRecord> records_of(const CommandResult& r) {
  INFO(r.output.substr(0, 2000));
  REQUIRE(r.status == 0);
  std::vector<KafkaRecord> out;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    auto j = json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    KafkaRecord rec;
    rec.topic = j.contains("subject") ? j["subject"] : j["routing_key"];
    rec.partition = 0;
    rec.offset = j["seq"];
    rec.value = j["data"].get<std::string>();
    for (auto& [name, value] : j["headers"].items()) {
      rec.headers.emplace_back(name, value.is_string() ? value.get<std::string>() : value.dump());
      if (name == "key") rec.key = value.get<std::string>();
    }
    if (j.contains("message_id") && j["message_id"].is_string())
      rec.headers.emplace_back("message_id", j["message_id"].get<std::string>());
    if (j.contains("delivery_mode") && j["delivery_mode"].is_number())
      rec.headers.emplace_back("delivery_mode", std::to_string(j["delivery_mode"].get<int>()));
    out.push_back(std::move(rec));
  }
  return out;
}

// The fixture's configuration without its kafka.* line, plus `extra`.
std::string without_kafka(Fixture& f, const std::string& extra) {
  auto c = f.config(extra);
  auto p = c.find("kafka.bootstrap.servers=");
  REQUIRE(p != std::string::npos);
  c.erase(p, c.find('\n', p) - p + 1);
  return c;
}

struct Nats {
  static constexpr bool deduplicates = true;
  static constexpr double retries_in_place_s = 0;
  static constexpr bool reads_consume = false;  // a stream: every read sees everything
  static constexpr const char* sink = "nats-jetstream";
  static constexpr const char* message_id_header = "Nats-Msg-Id";
  static constexpr const char* ack_timeout_key = "ack.timeout.ms";
  static std::string url() {
    static const bool started = [] {
      Services::control("start nats");
      return true;
    }();
    (void)started;
    auto u = Services::current("WALRELAY_TEST_NATS");
    REQUIRE_FALSE(u.empty());
    return u;
  }
  static CommandResult py(const std::string& args) {
    return run_command(test_python() + " " + WALRELAY_SOURCE_DIR + "/tests/integration/nats/read.py --url " + url() +
                       " " + args + " 2>&1");
  }
  // Where records land: a stream over `subjects` (a pattern of the
  // fixture's topics, or the dead-letter subject); `max_bytes`: its
  // max_msg_size (0: none).
  class Destination {
   public:
    Destination(std::string name, const std::string& subjects, long max_bytes = 0) : name_(std::move(name)) {
      auto r = py("stream-add --name " + name_ + " --subjects '" + subjects + "'" +
                  (max_bytes ? " --max-msg-size " + std::to_string(max_bytes) : ""));
      INFO(r.output);
      REQUIRE(r.status == 0);
    }
    ~Destination() { py("stream-delete --name " + name_); }
    Destination(const Destination&) = delete;
    Destination& operator=(const Destination&) = delete;
    std::vector<KafkaRecord> read(std::size_t at_least = 0, int timeout_s = 60) const {
      return records_of(py("read --name " + name_ + " --count " + std::to_string(at_least) + " --timeout " +
                           std::to_string(timeout_s)));
    }

   private:
    std::string name_;
  };
  // Every topic of the fixture, and its dead-letter destination.
  static std::unique_ptr<Destination> topics(Fixture& f, long max_bytes = 0) {
    return std::make_unique<Destination>(f.slot, f.topic_prefix + ">", max_bytes);
  }
  static std::string dead_letter_topic(Fixture& f) { return f.slot + "_dead"; }
  static std::unique_ptr<Destination> dead_letters(Fixture& f) {
    return std::make_unique<Destination>(f.slot + "_dlq", dead_letter_topic(f));
  }
  static std::string config(Fixture& f, const std::string& extra = "") {
    return without_kafka(f, "sink.type=nats-jetstream\nsink.nats-jetstream.url=" + url() + "\n" + extra);
  }
  static std::string pid_file() { return Services::current("WALRELAY_RUN_DIR") + "/nats/pid"; }
  static void stop() { Services::control("nats-stop"); }
  static void start() { Services::control("nats-start"); }
};

struct RabbitMq {
  static constexpr bool deduplicates = false;
  static constexpr double retries_in_place_s = 0;
  static constexpr bool reads_consume = true;  // a queue: a read takes what it read
  static constexpr const char* sink = "rabbitmq";
  static constexpr const char* message_id_header = "message_id";
  static constexpr const char* ack_timeout_key = "ackTimeout";
  static std::string address() {
    static const bool started = [] {
      Services::control("start rabbitmq");
      return true;
    }();
    (void)started;
    auto a = Services::current("WALRELAY_TEST_RABBITMQ");
    REQUIRE_FALSE(a.empty());
    return a;
  }
  static CommandResult py(const std::string& args) {
    return run_command(test_python() + " " + WALRELAY_SOURCE_DIR + "/tests/integration/rabbitmq/read.py --url " +
                       address() + " " + args + " 2>&1");
  }
  // A durable queue bound to the fixture's exchange by `binding`.
  class Destination {
   public:
    Destination(std::string exchange, std::string queue, const std::string& binding)
        : exchange_(std::move(exchange)), queue_(std::move(queue)) {
      auto r = py("declare --exchange " + exchange_ + " --queue " + queue_ + " --binding '" + binding + "'");
      INFO(r.output);
      REQUIRE(r.status == 0);
    }
    ~Destination() { py("delete --exchange " + exchange_ + " --queue " + queue_); }
    Destination(const Destination&) = delete;
    Destination& operator=(const Destination&) = delete;
    std::vector<KafkaRecord> read(std::size_t at_least = 0, int timeout_s = 60) const {
      return records_of(py("read --queue " + queue_ + " --count " + std::to_string(at_least) + " --timeout " +
                           std::to_string(timeout_s)));
    }

   private:
    std::string exchange_, queue_;
  };
  static std::string exchange(Fixture& f) { return f.slot + "_x"; }
  // `binding`: the routing keys of the fixture's topics the queue takes
  // (all by default: a topic exchange's pattern).
  static std::unique_ptr<Destination> topics(Fixture& f, const std::string& binding = "") {
    return std::make_unique<Destination>(exchange(f), f.slot + "_q", binding.empty() ? f.topic_prefix + "#" : binding);
  }
  static std::string dead_letter_topic(Fixture& f) { return f.slot + "_dead"; }
  static std::unique_ptr<Destination> dead_letters(Fixture& f) {
    return std::make_unique<Destination>(exchange(f), f.slot + "_dlq", dead_letter_topic(f));
  }
  static std::string config(Fixture& f, const std::string& extra = "") {
    auto a = address();
    auto colon = a.rfind(':');
    return without_kafka(f, "sink.type=rabbitmq\nsink.rabbitmq.connection.host=" + a.substr(0, colon) +
                                "\nsink.rabbitmq.connection.port=" + a.substr(colon + 1) +
                                "\nsink.rabbitmq.exchange=" + exchange(f) + "\n" + extra);
  }
  static std::string pid_file() { return Services::current("WALRELAY_RUN_DIR") + "/rabbitmq/pid"; }
  static void stop() { Services::control("rabbitmq-stop"); }
  static void start() { Services::control("rabbitmq-start"); }
};

struct Redis {
  static constexpr bool deduplicates = true;    // entry ids from the commit LSN: exactly once per stream
  static constexpr double retries_in_place_s = 0;
  static constexpr bool reads_consume = false;  // a stream: every read sees everything
  static constexpr const char* sink = "redis";
  static constexpr const char* message_id_header = "entry_event_id";  // the entry's id field (read.py)
  static constexpr const char* ack_timeout_key = "socket.timeout.ms";
  static std::string address() {
    static const bool started = [] {
      Services::control("start redis");
      return true;
    }();
    (void)started;
    auto a = Services::current("WALRELAY_TEST_REDIS");
    REQUIRE_FALSE(a.empty());
    return a;
  }
  static CommandResult py(const std::string& args) {
    return run_command(test_python() + " " + WALRELAY_SOURCE_DIR + "/tests/integration/redis/read.py --url " +
                       address() + " " + args + " 2>&1");
  }
  // The streams whose names start with `prefix` (Redis makes a stream at
  // its first XADD: nothing to make here).
  class Destination {
   public:
    explicit Destination(std::string prefix) : prefix_(std::move(prefix)) {}
    ~Destination() { py("delete --prefix '" + prefix_ + "'"); }
    Destination(const Destination&) = delete;
    Destination& operator=(const Destination&) = delete;
    std::vector<KafkaRecord> read(std::size_t at_least = 0, int timeout_s = 60) const {
      return records_of(py("read --prefix '" + prefix_ + "' --count " + std::to_string(at_least) + " --timeout " +
                           std::to_string(timeout_s)));
    }

   private:
    std::string prefix_;
  };
  static std::unique_ptr<Destination> topics(Fixture& f) { return std::make_unique<Destination>(f.topic_prefix); }
  static std::string dead_letter_topic(Fixture& f) { return f.slot + "_dead"; }
  static std::unique_ptr<Destination> dead_letters(Fixture& f) {
    return std::make_unique<Destination>(dead_letter_topic(f));
  }
  static std::string config(Fixture& f, const std::string& extra = "") {
    return without_kafka(f, "sink.type=redis\nsink.redis.address=" + address() + "\n" + extra);
  }
  // redis-cli against the server, ready for a command.
  static std::string cli() {
    const auto a = address();
    return "redis-cli -h " + a.substr(0, a.rfind(':')) + " -p " + a.substr(a.rfind(':') + 1) + " ";
  }
  static std::string pid_file() { return Services::current("WALRELAY_RUN_DIR") + "/redis/pid"; }
  static void stop() { Services::control("redis-stop"); }
  static void start() { Services::control("redis-start"); }
};

// The http sink: tests/integration/http/receiver.py (started by
// scripts/services.sh) stores each POST it answers 2xx, by the path's topic;
// read.py reads the store (at least once: receivers deduplicate by
// Idempotency-Key).
struct Http {
  static constexpr bool deduplicates = false;
  static constexpr double retries_in_place_s = 6;  // retries=5 x retry.interval.ms=1000, after the first
  static constexpr bool reads_consume = false;  // a store: every read sees everything
  static constexpr const char* sink = "http";
  static constexpr const char* message_id_header = "message_id";  // Idempotency-Key (read.py)
  static constexpr const char* ack_timeout_key = "timeout.ms";
  static std::string address() {
    static const bool started = [] {
      Services::control("start http");
      return true;
    }();
    (void)started;
    auto a = Services::current("WALRELAY_TEST_HTTP");
    REQUIRE_FALSE(a.empty());
    return a;
  }
  static CommandResult py(const std::string& args) {
    (void)address();
    return run_command(test_python() + " " + WALRELAY_SOURCE_DIR + "/tests/integration/http/read.py " + args +
                       " --store '" + Services::current("WALRELAY_RUN_DIR") + "/http/store' 2>&1");
  }
  // What reached the paths whose topic starts with `prefix`.
  // (batches: a request's JSON array read as its records; see HttpBatch.)
  class Destination {
   public:
    explicit Destination(std::string prefix, bool batches = false) : prefix_(std::move(prefix)), batches_(batches) {}
    ~Destination() { py("delete --prefix '" + prefix_ + "'"); }
    Destination(const Destination&) = delete;
    Destination& operator=(const Destination&) = delete;
    std::vector<KafkaRecord> read(std::size_t at_least = 0, int timeout_s = 60) const {
      return records_of(py("read --prefix '" + prefix_ + "' --count " + std::to_string(at_least) + " --timeout " +
                           std::to_string(timeout_s) + (batches_ ? " --batches" : "")));
    }

   private:
    std::string prefix_;
    bool batches_;
  };
  static std::unique_ptr<Destination> topics(Fixture& f) { return std::make_unique<Destination>(f.topic_prefix); }
  static std::string dead_letter_topic(Fixture& f) { return f.slot + "_dead"; }
  static std::unique_ptr<Destination> dead_letters(Fixture& f) {
    return std::make_unique<Destination>(dead_letter_topic(f));
  }
  static std::string config(Fixture& f, const std::string& extra = "") {
    return without_kafka(f, "sink.type=http\nsink.http.url=http://" + address() + "/${topic}\n" + extra);
  }
  // A fault the receiver answers for the topics starting with `prefix`.
  static void fault(const std::string& prefix, const std::string& args) {
    auto r = py("fault --prefix '" + prefix + "' " + args);
    INFO(r.output);
    REQUIRE(r.status == 0);
  }
  static std::string pid_file() { return Services::current("WALRELAY_RUN_DIR") + "/http/pid"; }
  static void stop() { Services::control("http-stop"); }
  static void start() { Services::control("http-start"); }
};

// The HTTP sink with batches (sink.http.batch.enabled): a request carries
// the waiting records of one URL, one per key, as a JSON array of records
// with their id, key and headers (batch.format=records); read back element
// by element, in the array's order.
struct HttpBatch : Http {
  static std::unique_ptr<Destination> topics(Fixture& f) {
    return std::make_unique<Destination>(f.topic_prefix, true);
  }
  static std::unique_ptr<Destination> dead_letters(Fixture& f) {
    return std::make_unique<Destination>(dead_letter_topic(f), true);
  }
  static std::string config(Fixture& f, const std::string& extra = "") {
    return Http::config(f, "sink.http.batch.enabled=true\nsink.http.batch.format=records\n"
                           "sink.http.batch.max-size=50\n" + extra);
  }
};

// Amazon SQS: ElasticMQ (started by scripts/services.sh), read back with
// boto3 (tests/integration/sqs/read.py), into FIFO queues made beforehand
// (SQS makes none at a send): each key's order kept by its message group,
// and what a restart sends again within 5 minutes dropped by its
// MessageDeduplicationId, the event id: exactly once there.
struct Sqs {
  static constexpr bool deduplicates = true;
  static constexpr double retries_in_place_s = 0;
  static constexpr bool reads_consume = false;  // read.py keeps what it takes in a store
  static constexpr const char* sink = "sqs";
  static constexpr const char* message_id_header = "message_id";  // MessageDeduplicationId (read.py)
  static constexpr const char* ack_timeout_key = "timeout.ms";
  static std::string endpoint() {
    static const bool started = [] {
      Services::control("start sqs");
      // As the AWS CLI reads them; ElasticMQ takes any.
      ::setenv("AWS_ACCESS_KEY_ID", "walrelay-test", 1);
      ::setenv("AWS_SECRET_ACCESS_KEY", "walrelay-test-secret", 1);
      return true;
    }();
    (void)started;
    auto a = Services::current("WALRELAY_TEST_SQS");
    REQUIRE_FALSE(a.empty());
    return a;
  }
  static CommandResult py(const std::string& args) {
    return run_command(test_python() + " " + WALRELAY_SOURCE_DIR + "/tests/integration/sqs/read.py --endpoint " +
                       endpoint() + " --store '" + Services::current("WALRELAY_RUN_DIR") + "/sqs/store' " + args +
                       " 2>&1");
  }
  // A topic's queue name, as walrelay makes it ('.' as '_').
  static std::string queue_name(const std::string& topic) {
    std::string out = topic;
    for (auto& c : out)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) c = '_';
    return out;
  }
  // The FIFO queues of `topic_prefix` + each of `types`, made now, deleted at the end.
  class Destination {
   public:
    Destination(std::string topic_prefix, const std::vector<std::string>& types, long max_size = 0)
        : subject_prefix_(std::move(topic_prefix)), prefix_(queue_name(subject_prefix_)) {
      std::string names;
      for (auto& t : types) names += " '" + prefix_ + queue_name(t) + ".fifo'";
      auto r = py("create --queue" + names + (max_size ? " --max-size " + std::to_string(max_size) : ""));
      INFO(r.output);
      REQUIRE(r.status == 0);
    }
    ~Destination() { py("delete --prefix '" + prefix_ + "'"); }
    Destination(const Destination&) = delete;
    Destination& operator=(const Destination&) = delete;
    std::vector<KafkaRecord> read(std::size_t at_least = 0, int timeout_s = 60) const {
      return records_of(py("read --prefix '" + prefix_ + "' --subject-prefix '" + subject_prefix_ + "' --count " +
                           std::to_string(at_least) + " --timeout " + std::to_string(timeout_s)));
    }

   private:
    std::string subject_prefix_, prefix_;
  };
  // The types the templates route to.
  static std::unique_ptr<Destination> topics(Fixture& f, long max_size = 0) {
    return std::make_unique<Destination>(
        f.topic_prefix, std::vector<std::string>{"Order", "Crash", "Outage", "Freeze", "Standby", "Pause", "Lost", "Stray"},
        max_size);
  }
  static std::string dead_letter_topic(Fixture& f) { return f.slot + "-dead"; }
  static std::unique_ptr<Destination> dead_letters(Fixture& f) {
    return std::make_unique<Destination>(dead_letter_topic(f), std::vector<std::string>{""});
  }
  static std::string config(Fixture& f, const std::string& extra = "") {
    return without_kafka(f, "sink.type=sqs\nsink.sqs.queue.url=" + endpoint() +
                                "/000000000000/${topic}.fifo\nsink.sqs.region=us-east-1\n" + extra);
  }
  static std::string pid_file() { return Services::current("WALRELAY_RUN_DIR") + "/sqs/pid"; }
  static void stop() { Services::control("sqs-stop"); }
  static void start() { Services::control("sqs-start"); }
};

// SQS behind a gate of the test's own (socat, forwarding a port of its own to
// ElasticMQ): stop() closes it and every connection through it, start()
// opens it again. For the restart-and-outage template: a cloud queue's
// outage is the network's, and ElasticMQ itself loses messages it answered
// when stopped under load (see that template). Readers go to ElasticMQ
// directly.
struct SqsNetwork : Sqs {
  static int gate_port() {
    static const int port = [] {
      (void)endpoint();
      auto r = run_command("python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); "
                           "print(s.getsockname()[1])'");
      REQUIRE(r.status == 0);
      return std::stoi(r.output);
    }();
    return port;
  }
  static std::string gate_pattern() { return "TCP-LISTEN:" + std::to_string(gate_port()) + ","; }
  static void start() {
    const std::string upstream = endpoint().substr(std::string("http://").size());
    REQUIRE(run_command("socat " + gate_pattern() + "bind=127.0.0.1,reuseaddr,fork TCP:" + upstream +
                        " >/dev/null 2>&1 &").status == 0);
    REQUIRE(eventually(
        [] { return run_command("socat -u /dev/null TCP:127.0.0.1:" + std::to_string(gate_port()) + " 2>/dev/null").status == 0; }, 10s,
        20ms));
  }
  static void stop() {
    // The listener and each connection's process: a refused connection, and a reset for those under way.
    run_command("pkill -KILL -f '^socat " + gate_pattern() + "'");
    REQUIRE(eventually([] { return run_command("pgrep -f '^socat " + gate_pattern() + "'").status != 0; }, 10s, 20ms));
  }
  static std::string config(Fixture& f, const std::string& extra = "") {
    static const bool opened = [] {
      start();
      return true;
    }();
    (void)opened;
    return without_kafka(f, "sink.type=sqs\nsink.sqs.queue.url=http://127.0.0.1:" + std::to_string(gate_port()) +
                                "/000000000000/${topic}.fifo\nsink.sqs.region=us-east-1\n" + extra);
  }
};

// Kafka in the same shape, for the tests of every sink: the fixture's
// "Pause" topic, read with kcat (every read sees everything).
struct Kafka {
  static constexpr bool deduplicates = false;
  static constexpr bool reads_consume = false;
  static constexpr const char* sink = "kafka";
  class Destination {
   public:
    explicit Destination(std::string topic) : topic_(std::move(topic)) {}
    std::vector<KafkaRecord> read(std::size_t at_least = 0, int timeout_s = 60) const {
      return consume(topic_, at_least, std::chrono::seconds(timeout_s));
    }

   private:
    std::string topic_;
  };
  static std::unique_ptr<Destination> topics(Fixture& f) { return std::make_unique<Destination>(f.topic("Pause")); }
  static std::string config(Fixture& f, const std::string& extra = "") { return f.config(extra); }
};

// What a destination holds so far: each read's records (a queue's reads
// take them) or the last read (a stream's and a topic's see everything).
template <class Broker, class Destination>
class Collected {
 public:
  explicit Collected(const Destination& d) : d_(d) {}
  const std::vector<KafkaRecord>& read(std::size_t at_least = 0, int timeout_s = 5) {
    auto got = d_.read(at_least, timeout_s);
    if (Broker::reads_consume) {
      // Arrival order across the reads (each read counts from 0).
      for (auto& r : got) {
        r.offset = static_cast<std::int64_t>(records_.size());
        records_.push_back(std::move(r));
      }
    } else {
      records_ = std::move(got);
    }
    return records_;
  }

 private:
  const Destination& d_;
  std::vector<KafkaRecord> records_;
};

// The broker down for the life of the object, back at the end or at restart().
template <class Broker>
class Outage {
 public:
  Outage() { Broker::stop(); }
  ~Outage() {
    if (down_) try {
        Broker::start();
      } catch (...) {
      }
  }
  Outage(const Outage&) = delete;
  Outage& operator=(const Outage&) = delete;
  void restart() {
    Broker::start();
    down_ = false;
  }

 private:
  bool down_ = true;
};

// Everything, once the slot is confirmed past what was written so far:
// walrelay confirms only what the broker acknowledged.
template <class Destination>
std::vector<KafkaRecord> read_settled(Fixture& f, const Destination& d, std::chrono::milliseconds timeout = 120s) {
  auto end = f.db().current_wal_lsn();
  if (!eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, timeout, 100ms))
    FAIL("the slot was not confirmed past " << end << " in time (confirmed " << f.db().confirmed_flush(f.slot) << ")");
  return d.read();
}

// Every id of the table there, in order per key; exactly once where the
// broker deduplicates, else each repeat within `repeat_bound`.
template <class Broker>
void check_delivered(Fixture& f, const std::vector<KafkaRecord>& recs, std::size_t rows, std::size_t repeat_bound = 0) {
  auto seen = ids_of(recs);
  CHECK(missing_ids(f.db(), f.table, seen).empty());
  CHECK(seen.count.size() == rows);
  if (Broker::deduplicates) CHECK(seen.duplicates() == 0);
  else CHECK(seen.duplicates() <= repeat_bound);
  check_order_per_key(recs);
}

// A RabbitMQ user of the test's own, allowed everything: what the test does
// to its connections (close them, refuse its login) touches no other test's.
struct RabbitMqUser {
  std::string name, password = "own-s3cret";
  explicit RabbitMqUser(Fixture& f) : name(f.slot + "_own") {
    (void)RabbitMq::address();  // the node runs
    create();
  }
  ~RabbitMqUser() { drop(); }
  RabbitMqUser(const RabbitMqUser&) = delete;
  RabbitMqUser& operator=(const RabbitMqUser&) = delete;
  void create() {
    Services::control("rabbitmqctl add_user " + name + " " + password);
    Services::control("rabbitmqctl set_permissions -p / " + name + " '.*' '.*' '.*'");
  }
  // Deleting the user closes its connections and refuses its logins until create().
  void drop() {
    try {
      Services::control("rabbitmqctl delete_user " + name);
    } catch (...) {
    }
  }
  std::string config() const {
    return "sink.rabbitmq.connection.username=" + name + "\nsink.rabbitmq.connection.password=" + password + "\n";
  }
  // The user's connections open now.
  std::size_t connections() const {
    auto r = run_command(Services::get().scripts + "/services.sh rabbitmqctl -q list_connections user 2>&1");
    INFO(r.output);
    REQUIRE(r.status == 0);
    std::size_t n = 0;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);)
      if (line == name) ++n;
    return n;
  }
};

// The LSN inside a transaction that writes one event, before its commit.
std::uint64_t event_inside(Fixture& f, const std::string& type, const std::string& key) {
  return parse_lsn(f.db().scalar("BEGIN;" + insert_event(f.table, type, key, "jsonb_build_object('seq', -1)") +
                                 "SELECT pg_current_wal_insert_lsn(); COMMIT;"));
}

}  // namespace

TEMPLATE_TEST_CASE("sinks: every committed event reaches the broker, in commit order per key, with the event id as "
                   "the message id, its key and headers, persistent - never a rolled-back one - and /slot, /readyz "
                   "and /metrics name the sink",
                   "[nats][rabbitmq][redis][http][sqs]", Nats, RabbitMq, Redis, Http, HttpBatch, Sqs) {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = TestType::topics(f);
  Walrelay relay(TestType::config(f));
  relay.start();
  relay.wait_streaming();
  REQUIRE(eventually([&] { return relay.get("/readyz").status == 200; }, 20s));
  f.db().exec("BEGIN; " + insert_event(f.table, "Order", "rolled-back", "jsonb_build_object('seq', -1)") + " ROLLBACK");
  const long rows = 3000;
  Writer writer(f.table, "Order", rows, 10, 0ms);
  writer.join();
  REQUIRE(writer.committed() == rows);
  auto recs = read_settled(f, *to);
  check_delivered<TestType>(f, recs, rows);
  for (auto& r : recs) {
    INFO(r.topic << " " << r.value.value_or(""));
    CHECK(r.topic == f.topic("Order"));
    CHECK(r.header(TestType::message_id_header) == r.header("id"));
    if constexpr (std::is_same_v<TestType, RabbitMq>) CHECK(r.header("delivery_mode") == "2");
    CHECK(r.key.has_value());
    CHECK(r.value->find("rolled-back") == std::string::npos);
  }
  CHECK(relay.get("/slot").body.find("\"sink\":\"" + std::string(TestType::sink) + "\"") != std::string::npos);
  CHECK(relay.metric("walrelay_events_relayed_total").value_or(0) == rows);
  CHECK(relay.metric("walrelay_sink_info{sink=\"" + std::string(TestType::sink) + "\"}") == std::optional<double>(1));
}

TEMPLATE_TEST_CASE("sinks: kill -9 under load, again and again - every committed event arrives, in order per key",
                   "[nats][rabbitmq][redis][http][sqs][fault]", Nats, RabbitMq, Redis, Http, HttpBatch, Sqs) {
  const long total = scaled(8000, 40000);
  const int kills = static_cast<int>(scaled(3, 8));
  const long inflight_limit = 500;
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = TestType::topics(f);
  const std::string cfg =
      TestType::config(f, "max.inflight.records=" + std::to_string(inflight_limit) + "\nstatus.update.interval.ms=200\n");
  auto relay = std::make_unique<Walrelay>(cfg);
  relay->start();
  relay->wait_streaming();
  // Writing until the kills are behind (a kill after the writer ended would
  // find nothing in flight), then stopped: see fault_crash_test.cpp.
  const auto wal_start = f.db().current_wal_lsn();
  Writer writer(f.table, "Crash", 10 * total, 20, 10ms);
  int landed_in_flight = 0;
  std::uint64_t unconfirmed_bytes = 0;  // WAL walrelay had read past the slot's confirmed position, at each kill
  const auto started = std::chrono::steady_clock::now();
  for (int k = 0; k < kills; ++k) {
    REQUIRE(eventually([&] { return writer.committed() >= total * (k + 1) / (kills + 1); }, 120s, 10ms));
    bool in_flight = eventually([&] { return relay->metric("walrelay_inflight_records").value_or(0) > 0; }, 5s, 1ms);
    auto slot = json::parse(relay->get("/slot").body, nullptr, false);
    auto confirmed = f.db().confirmed_flush(f.slot), wal = f.db().current_wal_lsn();
    relay->signal(SIGKILL);
    if (in_flight && confirmed < wal) ++landed_in_flight;
    // What the killed process may have sent lies below what it had read.
    const auto received = slot.is_object() ? parse_lsn(slot.value("received_lsn", "0/0")) : wal;
    unconfirmed_bytes += received > confirmed ? received - confirmed : 0;
    REQUIRE(relay->wait_exit(10s) == 128 + SIGKILL);
    relay = std::make_unique<Walrelay>(cfg);
    relay->start();
    wait_streaming_after(*relay, 0);
  }
  REQUIRE(eventually([&] { return writer.committed() >= total; }, 300s, 1ms));
  writer.stop();
  REQUIRE(writer.failures() == 0);
  const long written = writer.committed();
  CHECK(landed_in_flight == kills);  // the premise: each kill left records unacknowledged
  const double rate = written / std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const double wal_per_event = static_cast<double>(f.db().current_wal_lsn() - wal_start) / static_cast<double>(written);
  auto recs = read_settled(f, *to, 180s);
  // A kill sends again what was in flight and what was acknowledged since
  // the last status update (as the Kafka crash test bounds it). Where records
  // of different keys are acknowledged out of order (HTTP's requests per
  // key, side by side), the acknowledged ones behind a slow one wait for it,
  // and all of them are sent again: then the bound is what walrelay had read
  // past the slot's confirmed position at the kills (/slot's received_lsn),
  // counted in events by the WAL per event of the whole run (which other
  // tests' WAL on the shared server makes uneven: three times it), and what
  // it read between its answer and the kill (at most what fits in flight).
  const double by_rate = kills * (inflight_limit + 3 * rate * 0.2);
  const double by_slot = 3 * static_cast<double>(unconfirmed_bytes) / wal_per_event + kills * inflight_limit;
  const auto repeat_bound = static_cast<std::size_t>(std::max(by_rate, by_slot));
  std::cout << "sinks crash (" << TestType::sink << "): events=" << written << " kills=" << kills
            << " records=" << recs.size() << " repeats allowed=" << repeat_bound << " (by rate " << by_rate
            << ", by the slot " << by_slot << ")\n";
  check_delivered<TestType>(f, recs, static_cast<std::size_t>(written), repeat_bound);
}

// (SQS as SqsNetwork: the network to it cut, not ElasticMQ stopped.
// ElasticMQ loses messages it answered Successful when it is stopped under
// load - CI run 35 missed 3 of 12,001 with 4 repeats, its deduplication ids
// forgotten too - so its restart cannot tell walrelay's loss from the
// server's.)
TEMPLATE_TEST_CASE("sinks: the broker restarted, then down 30 s under load - the slot holds below an event written "
                   "meanwhile, /readyz names the sink, and afterwards every event is there, in order",
                   "[nats][rabbitmq][redis][http][sqs][fault][solo]", Nats, RabbitMq, Redis, Http, SqsNetwork) {
  const long inflight_limit = 500;
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = TestType::topics(f);
  Walrelay relay(TestType::config(f, "max.inflight.records=" + std::to_string(inflight_limit) + "\n"));
  relay.start();
  relay.wait_streaming();
  const long rows = 12000;
  const auto started = std::chrono::steady_clock::now();
  Writer writer(f.table, "Outage", rows, 20, 5ms);
  REQUIRE(eventually([&] { return writer.committed() >= rows / 4; }, 60s, 10ms));
  {
    Outage<TestType> restart;
    restart.restart();
  }
  REQUIRE(eventually([&] { return writer.committed() >= rows / 2; }, 60s, 10ms));
  Outage<TestType> outage;
  auto in_outage = event_inside(f, "Outage", "k-outage");
  auto down_at = std::chrono::steady_clock::now();
  double inflight_peak = 0;
  bool said_unreachable = false;
  while (std::chrono::steady_clock::now() - down_at < std::chrono::seconds(scaled(30, 60))) {
    REQUIRE(relay.running());
    REQUIRE(f.db().confirmed_flush(f.slot) < in_outage);
    auto ready = relay.get("/readyz");
    if (ready.status == 503 &&
        ready.body.find("broker unreachable (" + std::string(TestType::sink) + ")") != std::string::npos)
      said_unreachable = true;
    inflight_peak = std::max(inflight_peak, relay.metric("walrelay_inflight_records").value_or(0));
    std::this_thread::sleep_for(250ms);
  }
  outage.restart();
  writer.join();
  REQUIRE(writer.failures() == 0);
  const double rate = rows / std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  auto recs = read_settled(f, *to, 180s);
  std::cout << "sinks outage (" << TestType::sink << "): rows=" << rows << " records=" << recs.size()
            << " inflight_peak=" << inflight_peak << "\n";
  CHECK(said_unreachable);
  CHECK(inflight_peak <= inflight_limit);
  // A replay sends again what was acknowledged past the record that
  // failed: the in-flight window, and, where a record is tried again in
  // place (HTTP: `retries` x `retry.interval.ms`, 6 s), what the other keys
  // delivered meanwhile. CI run 33 saw 1,529 repeats over 4 replays.
  std::size_t repeat_bound = 2 * inflight_limit;
  if constexpr (TestType::retries_in_place_s > 0) {
    const double replays = relay.metric("walrelay_replays_total").value_or(0);
    repeat_bound = static_cast<std::size_t>(std::max(1.0, replays) * (inflight_limit + rate * TestType::retries_in_place_s));
  }
  INFO("rate " << rate << "/s, repeats allowed " << repeat_bound);
  check_delivered<TestType>(f, recs, rows + 1, repeat_bound);
  CHECK(eventually([&] { return relay.get("/readyz").status == 200; }, 30s));
}

TEMPLATE_TEST_CASE("sinks: a frozen broker (SIGSTOP) - at most max.pending publishes wait while the walsender is "
                   "held back and RSS stays flat - thawed, everything arrives",
                   "[nats][rabbitmq][redis][http][sqs][fault][solo]", Nats, RabbitMq, Redis, Http, HttpBatch, Sqs) {
  const int max_pending = 200;
  const std::string pad = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 31))";
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = TestType::topics(f);
  const std::string prefix = std::string("sink.") + TestType::sink + ".";
  Walrelay relay(TestType::config(f, prefix + "max.pending=" + std::to_string(max_pending) + "\n" + prefix +
                                         TestType::ack_timeout_key + "=120000\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Freeze", "k0", "jsonb_build_object('seq', -1)"));
  REQUIRE(eventually([&] { return relay.metric("walrelay_events_relayed_total").value_or(0) == 1; }, 30s));
  long rss_before = proc_status_kb(relay.pid(), "VmRSS");
  const std::string pid = TestType::pid_file();
  const long rows = 20000;  // 1 KB each: 20 MB, a hundred times the bound's worth
  REQUIRE(run_command("kill -STOP $(cat " + pid + ")").status == 0);
  struct Thaw {
    std::string pid;
    ~Thaw() { run_command("kill -CONT $(cat " + pid + ")"); }
  } thaw{pid};
  Writer writer(f.table, "Freeze", rows, 100, 0ms, 16, pad);
  writer.join();
  REQUIRE(writer.committed() == rows);
  double inflight_peak = 0;
  long rss_peak = rss_before;
  for (int i = 0; i < 20; ++i) {
    inflight_peak = std::max(inflight_peak, relay.metric("walrelay_inflight_records").value_or(0));
    rss_peak = std::max(rss_peak, proc_status_kb(relay.pid(), "VmRSS"));
    std::this_thread::sleep_for(250ms);
  }
  auto sent = f.db().sent_lsn(f.slot), wal = f.db().current_wal_lsn();
  INFO("walsender sent " << sent << " of " << wal);
  CHECK(wal - sent > 10ull * 1024 * 1024);
  CHECK(inflight_peak == max_pending);
  CHECK(relay.metric("walrelay_backpressure") == std::optional<double>(1));
  CHECK(rss_peak - rss_before < 16 * 1024);
  REQUIRE(run_command("kill -CONT $(cat " + pid + ")").status == 0);
  auto recs = read_settled(f, *to, 180s);
  std::cout << "sinks freeze (" << TestType::sink << "): rows=" << rows << " inflight_peak=" << inflight_peak
            << " rss_before=" << rss_before / 1024 << "MB rss_peak=" << rss_peak / 1024 << "MB\n";
  check_delivered<TestType>(f, recs, rows + 1, 2 * max_pending);
}

TEMPLATE_TEST_CASE("sinks: a destination that does not exist (no stream, no exchange) holds the slot with the name on "
                   "/readyz and dead-letters nothing, and once it exists every event arrives",
                   "[nats][rabbitmq][fault]", Nats, RabbitMq) {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto dead = TestType::dead_letters(f);  // for RabbitMQ, this makes the exchange: the queue of the topics is missing
  std::unique_ptr<typename TestType::Destination> to;
  std::string expect;
  std::string extra = "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" + TestType::dead_letter_topic(f) + "\n";
  if (TestType::deduplicates) {
    expect = "no JetStream stream takes subject \"" + f.topic("Lost") + "\"";
  } else {
    // No such exchange: a second one, named in the configuration, never made.
    extra = with_key(extra, "sink.rabbitmq.exchange", f.slot + "_missing");
    expect = "no exchange '" + f.slot + "_missing'";
  }
  auto cfg = TestType::config(f, extra);
  if (!TestType::deduplicates) {  // the exchange line as the test wants it
    auto p = cfg.find("sink.rabbitmq.exchange=" + RabbitMq::exchange(f) + "\n");
    REQUIRE(p != std::string::npos);
    cfg.erase(p, cfg.find('\n', p) - p + 1);
  }
  Walrelay relay(cfg);
  relay.start();
  relay.wait_streaming();
  auto in_first = event_inside(f, "Lost", "k");
  for (int i = 0; i < 3; ++i)
    f.db().exec(insert_event(f.table, "Lost", "k" + std::to_string(i), "jsonb_build_object('seq', " + std::to_string(i) + ")"));
  HttpResponse ready;
  REQUIRE(eventually([&] { return (ready = relay.get("/readyz")).body.find(expect) != std::string::npos; }, 20s));
  INFO(ready.body);
  CHECK(ready.status == 503);
  CHECK(relay.log().find(expect) != std::string::npos);
  CHECK(f.db().confirmed_flush(f.slot) < in_first);
  if constexpr (TestType::deduplicates) {
    auto to_made = TestType::topics(f);
    auto recs = read_settled(f, *to_made);
    check_delivered<TestType>(f, recs, 4);
  } else {
    // The exchange made, and a queue bound to it, while walrelay is stopped:
    // a publish between the exchange and its binding would come back
    // unroutable, rightly a dead letter, which is not what this test is about.
    relay.signal(SIGSTOP);
    std::optional<typename TestType::Destination> made_now;
    try {
      made_now.emplace(f.slot + "_missing", f.slot + "_q2", f.topic_prefix + "#");
    } catch (...) {
      relay.signal(SIGCONT);
      throw;
    }
    relay.signal(SIGCONT);
    auto& made = *made_now;
    auto recs = read_settled(f, made);
    check_delivered<TestType>(f, recs, 4, 4);
  }
  CHECK(dead->read().empty());
  CHECK(eventually([&] { return relay.get("/readyz").status == 200; }, 20s));
}

TEMPLATE_TEST_CASE("sinks: a message the broker refuses for good (over the stream's size, unroutable) goes to the "
                   "dead-letter destination with its id and the reason, the others go on in order",
                   "[nats][rabbitmq][fault]", Nats, RabbitMq) {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  // NATS: a stream with a small max_msg_size; RabbitMQ: a queue bound to
  // Order only, so that Stray comes back unroutable.
  std::unique_ptr<typename TestType::Destination> to;
  if constexpr (TestType::deduplicates) to = TestType::topics(f, 600);
  else to = TestType::topics(f, f.topic("Order"));
  auto dead = TestType::dead_letters(f);
  Walrelay relay(TestType::config(f, "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" +
                                         TestType::dead_letter_topic(f) + "\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Order", "a", "jsonb_build_object('seq', 1)"));
  if (TestType::deduplicates)
    f.db().exec(insert_event(f.table, "Order", "a", "jsonb_build_object('seq', 2, 'pad', repeat('x', 2000))"));
  else
    f.db().exec(insert_event(f.table, "Stray", "a", "jsonb_build_object('seq', 2)"));
  f.db().exec(insert_event(f.table, "Order", "a", "jsonb_build_object('seq', 3)"));
  auto refused_id = f.db().scalar("SELECT id FROM " + f.table + " WHERE payload->>'seq' = '2'");
  auto recs = read_settled(f, *to);
  REQUIRE(recs.size() == 2);
  CHECK(recs[0].value->find("\"seq\": 1") != std::string::npos);
  CHECK(recs[1].value->find("\"seq\": 3") != std::string::npos);
  auto dead_recs = dead->read(1);
  REQUIRE(dead_recs.size() == 1);
  INFO("dead letter: " << dead_recs[0].value.value_or("(none)").substr(0, 300));
  CHECK(dead_recs[0].header("id") == refused_id);
  CHECK(dead_recs[0].key == std::optional<std::string>("a"));
  if (TestType::deduplicates) {
    CHECK(dead_recs[0].header("walrelay.error.reason") == std::optional<std::string>("msg_size_too_large"));
    // Too large for the stream, so too large to copy: dropped, its size named (as for Kafka).
    CHECK(dead_recs[0].value == std::optional<std::string>(""));
    CHECK(std::stol(dead_recs[0].header("walrelay.value.dropped.bytes").value_or("0")) > 2000);
    CHECK(dead_recs[0].header("__connect.errors.topic") == f.topic("Order"));
  } else {
    CHECK(dead_recs[0].header("walrelay.error.reason") == std::optional<std::string>("unroutable"));
    CHECK(dead_recs[0].value->find("\"seq\": 2") != std::string::npos);
    CHECK(dead_recs[0].header("__connect.errors.topic") == f.topic("Stray"));
    CHECK(dead_recs[0].header("__connect.errors.exception.message").value_or("").find("NO_ROUTE") != std::string::npos);
  }
  CHECK(metric_at(relay, "walrelay_dead_lettered_total", 1) == 1);
}

TEMPLATE_TEST_CASE("sinks: a second walrelay on the slot waits as standby and takes over after kill -9, losing nothing",
                   "[nats][rabbitmq][redis][http][sqs][fault]", Nats, RabbitMq, Redis, Http, Sqs) {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = TestType::topics(f);
  Walrelay first(TestType::config(f));
  first.start();
  first.wait_streaming();
  Walrelay second(TestType::config(f));
  second.start();
  REQUIRE(eventually([&] { return second.get("/slot").body.find("\"standby\"") != std::string::npos; }, 20s));
  CHECK(second.get("/readyz").status == 503);
  const long rows = scaled(4000, 20000);
  Writer writer(f.table, "Standby", rows, 10, 10ms);
  REQUIRE(eventually([&] { return first.metric("walrelay_events_relayed_total").value_or(0) > 500; }, 60s, 100ms));
  first.signal(SIGKILL);
  REQUIRE(first.wait_exit(10s) == 128 + SIGKILL);
  wait_streaming_after(second, 0, 30s);
  CHECK(eventually([&] { return second.get("/readyz").status == 200; }, 10s));
  writer.join();
  REQUIRE(writer.committed() == rows);
  check_delivered<TestType>(f, read_settled(f, *to), rows, 2048);
}

namespace {

// A free TCP port on loopback (bound, then released).
int free_port() {
  auto r = run_command("python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1])'");
  REQUIRE(r.status == 0);
  return std::stoi(r.output);
}

// A nats-server of the test's own: TLS with a CA made here (the server's
// certificate for localhost), a user and password, JetStream.
class SecureNats {
 public:
  SecureNats() {
    char tmpl[] = "/tmp/walrelay-nats-tls-XXXXXX";
    dir_ = mkdtemp(tmpl);
    const std::string ssl = "cd " + dir_ + " && openssl ";
    REQUIRE(run_command(ssl + "req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=walrelay-test-ca -keyout ca.key "
                              "-out ca.pem 2>&1").status == 0);
    REQUIRE(run_command(ssl + "req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr "
                              "2>&1").status == 0);
    REQUIRE(run_command("cd " + dir_ + " && printf 'subjectAltName=DNS:localhost\\n' > san.ext && openssl x509 -req "
                        "-in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile san.ext "
                        "-out server.pem 2>&1").status == 0);
    port_ = free_port();
    REQUIRE(run_command("nats-server -a 127.0.0.1 -p " + std::to_string(port_) + " -js -sd " + dir_ +
                        "/store --tls --tlscert " + dir_ + "/server.pem --tlskey " + dir_ + "/server.key --user " +
                        user + " --pass " + password + " -P " + dir_ + "/pid -l " + dir_ +
                        "/nats.log >/dev/null 2>&1 &").status == 0);
    REQUIRE(eventually([&] { return run_command("grep -qs 'Server is ready' " + dir_ + "/nats.log").status == 0; },
                       10s, 50ms));
  }
  ~SecureNats() { run_command("kill $(cat " + dir_ + "/pid) 2>/dev/null; sleep 0.3; rm -rf " + dir_); }
  SecureNats(const SecureNats&) = delete;
  SecureNats& operator=(const SecureNats&) = delete;
  std::string url() const { return "tls://localhost:" + std::to_string(port_); }
  std::string ca() const { return dir_ + "/ca.pem"; }
  CommandResult py(const std::string& args) const {
    return run_command(test_python() + " " + WALRELAY_SOURCE_DIR + "/tests/integration/nats/read.py --url tls://" +
                       std::string(user) + ":" + password + "@localhost:" + std::to_string(port_) + " --ca " + ca() +
                       " " + args + " 2>&1");
  }
  static constexpr const char* user = "relay";
  static constexpr const char* password = "n4ts-s3cret";

 private:
  std::string dir_;
  int port_ = 0;
};

// A nats-server of the test's own with two users: "admin" may do anything
// (the test's reader), "relay" may publish anything but the denied subjects.
// grant() lifts the denial by a configuration reload (SIGHUP), as an
// operator would.
class RestrictedNats {
 public:
  explicit RestrictedNats(std::string denied) : denied_(std::move(denied)) {
    char tmpl[] = "/tmp/walrelay-nats-perm-XXXXXX";
    dir_ = mkdtemp(tmpl);
    port_ = free_port();
    write_config(true);
    REQUIRE(run_command("nats-server -c " + dir_ + "/nats.conf -P " + dir_ + "/pid -l " + dir_ +
                        "/nats.log >/dev/null 2>&1 &").status == 0);
    REQUIRE(eventually([&] { return run_command("grep -qs 'Server is ready' " + dir_ + "/nats.log").status == 0; },
                       10s, 50ms));
  }
  ~RestrictedNats() { run_command("kill $(cat " + dir_ + "/pid) 2>/dev/null; sleep 0.3; rm -rf " + dir_); }
  RestrictedNats(const RestrictedNats&) = delete;
  RestrictedNats& operator=(const RestrictedNats&) = delete;
  void grant() {
    write_config(false);
    REQUIRE(run_command("kill -HUP $(cat " + dir_ + "/pid)").status == 0);
    REQUIRE(eventually([&] { return run_command("grep -qs 'Reloaded server configuration' " + dir_ + "/nats.log").status == 0; },
                       10s, 50ms));
  }
  std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }
  CommandResult py(const std::string& args) const {
    return run_command(test_python() + " " + WALRELAY_SOURCE_DIR + "/tests/integration/nats/read.py --url nats://admin:" +
                       "admin-pw@127.0.0.1:" + std::to_string(port_) + " " + args + " 2>&1");
  }
  static constexpr const char* password = "relay-pw";

 private:
  void write_config(bool deny) {
    std::ofstream conf(dir_ + "/nats.conf");
    conf << "listen: \"127.0.0.1:" << port_ << "\"\njetstream { store_dir: \"" << dir_ << "/store\" }\n"
         << "authorization {\n  users = [\n    { user: \"admin\", password: \"admin-pw\" }\n"
         << "    { user: \"relay\", password: \"" << password << "\", permissions: { publish: { allow: [\">\"]"
         << (deny ? ", deny: [\"" + denied_ + "\"]" : std::string()) << " } } }\n  ]\n}\n";
  }
  std::string denied_;
  std::string dir_;
  int port_ = 0;
};

// A plain nats-server of the test's own (JetStream on a store that outlives
// a restart), to kill -9 and start again on the same port without touching
// the shared one.
class OwnNats {
 public:
  OwnNats() {
    char tmpl[] = "/tmp/walrelay-nats-own-XXXXXX";
    dir_ = mkdtemp(tmpl);
    port_ = free_port();
    start();
  }
  ~OwnNats() { run_command("kill $(cat " + dir_ + "/pid) 2>/dev/null; sleep 0.3; rm -rf " + dir_); }
  OwnNats(const OwnNats&) = delete;
  OwnNats& operator=(const OwnNats&) = delete;
  void start() {
    run_command("rm -f " + dir_ + "/nats.log");
    REQUIRE(run_command("nats-server -a 127.0.0.1 -p " + std::to_string(port_) + " -js -sd " + dir_ + "/store -P " +
                        dir_ + "/pid -l " + dir_ + "/nats.log >/dev/null 2>&1 &").status == 0);
    REQUIRE(eventually([&] { return run_command("grep -qs 'Server is ready' " + dir_ + "/nats.log").status == 0; },
                       10s, 50ms));
  }
  void kill9() { REQUIRE(run_command("kill -9 $(cat " + dir_ + "/pid)").status == 0); }
  std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }
  CommandResult py(const std::string& args) const {
    return run_command(test_python() + " " + WALRELAY_SOURCE_DIR + "/tests/integration/nats/read.py --url " + url() +
                       " " + args + " 2>&1");
  }

 private:
  std::string dir_;
  int port_ = 0;
};

}  // namespace

// Found by the fault campaign (a standby's NATS connection killed): nats.c's
// js_PublishAsyncGetPendingList dereferences the pending map that only the
// first asynchronous publish creates, so asking it for the pending list of a
// connection that never published crashed walrelay (SIGSEGV) under a
// supervisor that restarts it: a crash loop on every broker restart.
TEST_CASE("sinks: NATS - the connection lost before walrelay published anything (an idle relay, a standby) - no "
          "crash, it connects again and every event arrives",
          "[nats][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  OwnNats server;
  REQUIRE(server.py("stream-add --name " + f.slot + " --subjects '" + f.topic_prefix + ">'").status == 0);
  Walrelay relay(without_kafka(f, "sink.type=nats-jetstream\nsink.nats-jetstream.url=" + server.url() + "\n"));
  relay.start();
  relay.wait_streaming();
  // A standby beside it: its connection never publishes either.
  Walrelay standby(without_kafka(f, "sink.type=nats-jetstream\nsink.nats-jetstream.url=" + server.url() + "\n"));
  standby.start();
  REQUIRE(eventually([&] { return standby.get("/slot").body.find("\"standby\"") != std::string::npos; }, 20s));
  REQUIRE(eventually([&] { return standby.log().find("nats: connected") != std::string::npos; }, 20s));
  server.kill9();
  // Both notice, say so, and stay up.
  for (auto* r : {&relay, &standby}) {
    INFO(r->log());
    CHECK(eventually([&] { return r->log().find("nats: the connection to NATS closed") != std::string::npos; },
                     30s, 50ms));
    CHECK(r->running());
  }
  server.start();
  const long rows = 50;
  Writer writer(f.table, "Idle", rows, 2, 0ms);
  writer.join();
  REQUIRE(writer.committed() == rows);
  auto end = f.db().current_wal_lsn();
  INFO(relay.log());
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, 60s, 100ms));
  check_delivered<Nats>(f, records_of(server.py("read --name " + f.slot)), rows);
  CHECK(relay.running());
  CHECK(standby.running());
}

TEST_CASE("sinks: NATS over TLS (the server checked against a CA file) with a user and a password from the "
          "environment - events arrive, a wrong password holds the slot with the server's reason on /readyz, and "
          "no password reaches the log",
          "[nats][fault]") {
  SecureNats server;
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  REQUIRE(server.py("stream-add --name " + f.slot + " --subjects '" + f.topic_prefix + ">'").status == 0);
  const std::string cfg = without_kafka(f, "sink.type=nats-jetstream\nsink.nats-jetstream.url=" + server.url() +
                                               "\nsink.nats-jetstream.tls.ca.location=" + server.ca() +
                                               "\nsink.nats-jetstream.auth.user=" + SecureNats::user + "\n");
  {
    Walrelay wrong(cfg, {{"WALRELAY_SINK_NATS_JETSTREAM_AUTH_PASSWORD", "not-the-password"}});
    wrong.start();
    wrong.wait_streaming();
    auto in_first = event_inside(f, "Secure", "k");
    HttpResponse ready;
    REQUIRE(eventually([&] { return (ready = wrong.get("/readyz")).body.find("uthorization") != std::string::npos; },
                       20s));
    CHECK(ready.status == 503);
    CHECK(f.db().confirmed_flush(f.slot) < in_first);
    CHECK(wrong.log().find("not-the-password") == std::string::npos);
    wrong.signal(SIGTERM);
    CHECK(wrong.wait_exit(30s) == 0);
  }
  Walrelay relay(cfg, {{"WALRELAY_SINK_NATS_JETSTREAM_AUTH_PASSWORD", SecureNats::password}});
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Secure", "k", "jsonb_build_object('seq', 0)"));
  auto end = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, 30s, 100ms));
  auto recs = records_of(server.py("read --name " + f.slot));
  check_delivered<Nats>(f, recs, 2);
  CHECK(relay.log().find(SecureNats::password) == std::string::npos);
  CHECK(relay.get("/readyz").status == 200);
}

TEST_CASE("sinks: RabbitMQ with a password from the environment - a wrong one holds the slot with the broker's "
          "ACCESS_REFUSED on /readyz and never reaches the log, the right one relays",
          "[rabbitmq][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = RabbitMq::topics(f);
  auto cfg = RabbitMq::config(f);
  {
    Walrelay wrong(cfg, {{"WALRELAY_SINK_RABBITMQ_CONNECTION_PASSWORD", "not-the-password"}});
    wrong.start();
    wrong.wait_streaming();
    auto in_first = event_inside(f, "Secure", "k");
    HttpResponse ready;
    REQUIRE(eventually([&] { return (ready = wrong.get("/readyz")).body.find("ACCESS_REFUSED") != std::string::npos; },
                       20s));
    CHECK(ready.status == 503);
    CHECK(f.db().confirmed_flush(f.slot) < in_first);
    CHECK(wrong.log().find("not-the-password") == std::string::npos);
    wrong.signal(SIGTERM);
    CHECK(wrong.wait_exit(30s) == 0);
  }
  Walrelay relay(cfg, {{"WALRELAY_SINK_RABBITMQ_CONNECTION_PASSWORD", "guest"}});
  relay.start();
  relay.wait_streaming();
  check_delivered<RabbitMq>(f, read_settled(f, *to), 1);
}

TEST_CASE("sinks: NATS refuses walrelay's user the right to publish on the outbox subjects - the slot holds with "
          "the server's Permissions Violation on /readyz, nothing is dead-lettered, and after a reload that grants "
          "it every event arrives once",
          "[nats][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  RestrictedNats server(f.topic_prefix + ">");
  REQUIRE(server.py("stream-add --name " + f.slot + " --subjects '" + f.topic_prefix + ">'").status == 0);
  REQUIRE(server.py("stream-add --name " + f.slot + "_dlq --subjects '" + f.slot + "_dead'").status == 0);
  Walrelay relay(without_kafka(f, "sink.type=nats-jetstream\nsink.nats-jetstream.url=" + server.url() +
                                      "\nsink.nats-jetstream.auth.user=relay\nerrors.tolerance=all\n"
                                      "errors.deadletterqueue.topic.name=" + f.slot + "_dead\n"),
                 {{"WALRELAY_SINK_NATS_JETSTREAM_AUTH_PASSWORD", RestrictedNats::password}});
  relay.start();
  relay.wait_streaming();
  const long rows = 200;
  auto in_first = event_inside(f, "Denied", "k-first");
  Writer writer(f.table, "Denied", rows, 4, 0ms);
  writer.join();
  HttpResponse ready;
  const bool said = eventually(
      [&] { return (ready = relay.get("/readyz")).body.find("Permissions Violation") != std::string::npos; }, 30s);
  INFO(ready.body);
  INFO(relay.log());
  REQUIRE(said);
  CHECK(ready.status == 503);
  for (int i = 0; i < 12; ++i) {
    REQUIRE(relay.running());
    CHECK(f.db().confirmed_flush(f.slot) < in_first);
    std::this_thread::sleep_for(250ms);
  }
  CHECK(relay.metric("walrelay_dead_lettered_total").value_or(0) == 0);
  CHECK(relay.log().find(RestrictedNats::password) == std::string::npos);

  server.grant();
  auto end = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, 120s, 100ms));
  check_delivered<Nats>(f, records_of(server.py("read --name " + f.slot)), rows + 1);
  CHECK(records_of(server.py("read --name " + f.slot + "_dlq")).empty());
  CHECK(eventually([&] { return relay.get("/readyz").status == 200; }, 30s));
}

TEST_CASE("sinks: RabbitMQ refuses walrelay's user the right to publish - the slot holds with the broker's "
          "ACCESS_REFUSED on /readyz, nothing is dead-lettered, and once granted every event arrives",
          "[rabbitmq][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = RabbitMq::topics(f);
  auto dlq = RabbitMq::dead_letters(f);
  (void)RabbitMq::address();  // the node runs
  // A user that may configure and read everything, and write nothing.
  const std::string user = f.slot + "_user";
  Services::control("rabbitmqctl add_user " + user + " pub-s3cret");
  struct DropUser {
    std::string user;
    ~DropUser() {
      try {
        Services::control("rabbitmqctl delete_user " + user);
      } catch (...) {
      }
    }
  } drop{user};
  Services::control("rabbitmqctl set_permissions -p / " + user + " '.*' '^$' '.*'");
  Walrelay relay(RabbitMq::config(f, "sink.rabbitmq.connection.username=" + user + "\nerrors.tolerance=all\n"
                                     "errors.deadletterqueue.topic.name=" + RabbitMq::dead_letter_topic(f) + "\n"),
                 {{"WALRELAY_SINK_RABBITMQ_CONNECTION_PASSWORD", "pub-s3cret"}});
  relay.start();
  relay.wait_streaming();
  const long rows = 200;
  auto in_first = event_inside(f, "Denied", "k-first");
  Writer writer(f.table, "Denied", rows, 4, 0ms);
  writer.join();
  HttpResponse ready;
  REQUIRE(eventually([&] { return (ready = relay.get("/readyz")).body.find("ACCESS_REFUSED") != std::string::npos; },
                     30s));
  CHECK(ready.status == 503);
  // Held for a while: the slot below the first event, nothing in either queue.
  for (int i = 0; i < 12; ++i) {
    REQUIRE(relay.running());
    CHECK(f.db().confirmed_flush(f.slot) < in_first);
    std::this_thread::sleep_for(250ms);
  }
  CHECK(relay.metric("walrelay_dead_lettered_total").value_or(0) == 0);
  CHECK(relay.log().find("pub-s3cret") == std::string::npos);

  Services::control("rabbitmqctl set_permissions -p / " + user + " '.*' '.*' '.*'");
  auto recs = read_settled(f, *to, 120s);
  check_delivered<RabbitMq>(f, recs, rows + 1);
  CHECK(dlq->read().empty());
  CHECK(eventually([&] { return relay.get("/readyz").status == 200; }, 30s));
}

TEMPLATE_TEST_CASE("sinks: --check connects to the broker - ok when it answers, and a broker that does not answer is a "
                   "problem named by the sink's own key",
                   "[nats][rabbitmq]", Nats, RabbitMq) {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = TestType::topics(f);  // a stream for NATS's check
  {
    Walrelay check(TestType::config(f));
    CHECK(check.run({"--check", "--config", check.config_path()}) == 0);
    INFO(check.log());
    CHECK(check.log().find("ok: configuration, database and broker checked") != std::string::npos);
  }
  // The same sink pointed at a closed port.
  std::string cfg = TestType::config(f);
  const std::string key = TestType::deduplicates ? "sink.nats-jetstream.url" : "sink.rabbitmq.connection.port";
  cfg = with_key(cfg, key, TestType::deduplicates ? "nats://127.0.0.1:1" : "1");
  Walrelay check(cfg);
  CHECK(check.run({"--check", "--config", check.config_path()}) == 1);
  INFO(check.log());
  const std::string named = TestType::deduplicates ? "problem: sink.nats-jetstream.url: could not connect to NATS"
                                                   : "problem: sink.rabbitmq.connection.host: could not connect to RabbitMQ";
  CHECK(check.log().find(named) != std::string::npos);
  CHECK(check.log().find("kafka") == std::string::npos);
}

// RabbitMQ's connection thread takes records from a queue the loop fills. A
// lost connection must fail every record not confirmed, in flight or still
// queued: one still queued would otherwise go out first on the next
// connection, ahead of the failed ones the relay sends again from the slot.
// The sink runs in the test's process so that the test can hold its thread
// at each step (limit_taking_for_test, pause_for_test); the broker is real.
TEST_CASE("sinks: RabbitMQ - a connection lost with records still queued behind the ones on the wire fails them all - "
          "the first copy of each event arrives in commit order per key, none lost",
          "[rabbitmq][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = RabbitMq::topics(f);
  RabbitMqUser user(f);
  auto config = walrelay::parse_config(
      with_key(RabbitMq::config(f, user.config() +
                                       "status.update.interval.ms=100\nreconnect.backoff.ms=100\nshutdown.timeout.ms=2000\n"),
               "slot.status.interval.ms", "0"),
      "rabbitmq_reconnect_test", {});
  InProcessRelay<walrelay::RabbitMqSink> p(config, [](boost::asio::io_context& io, const walrelay::Config& c) {
    return std::make_unique<walrelay::RabbitMqSink>(io, walrelay::rabbitmq_config(c));
  });
  REQUIRE(eventually([&] { return p.status().state == walrelay::RelayState::streaming; }, 30s, 20ms));
  f.db().exec(insert_event(f.table, "Order", "k0", "jsonb_build_object('seq', 0)"));
  auto warm = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= warm; }, 30s, 20ms));
  REQUIRE(user.connections() == 1);

  // Ten events on two keys, each its own transaction; the thread takes none.
  p.sink->limit_taking_for_test(0);
  const int events = 10, on_the_wire = 5;
  for (int seq = 1; seq <= events; ++seq)
    f.db().exec(insert_event(f.table, "Order", "k" + std::to_string(seq % 2),
                             "jsonb_build_object('seq', " + std::to_string(seq) + ")"));
  REQUIRE(eventually([&] { return p.status().inflight_records == static_cast<std::uint64_t>(events); }, 30s, 20ms));
  // The server closes the connection while the thread is paused: it has not seen that yet.
  p.sink->pause_for_test(true);
  Services::control("rabbitmqctl close_all_user_connections " + user.name + " walrelay-test");
  REQUIRE(eventually([&] { return user.connections() == 0; }, 30s, 50ms));
  // The loop is held from here until every record has an outcome, so that
  // nothing it does on seeing the failures (the replay's abort_queued) can
  // stand in for the connection's thread failing what is queued.
  std::promise<void> held, release;
  auto released = release.get_future();
  boost::asio::post(p.io, [&] {
    held.set_value();
    released.wait();
  });
  struct Release {
    std::promise<void>& p;
    bool done = false;
    ~Release() {
      if (!done) p.set_value();
    }
  } unhold{release};
  held.get_future().wait();
  // The first five go out on the closed connection and fail; the other five stay queued.
  p.sink->limit_taking_for_test(on_the_wire);
  p.sink->pause_for_test(false);
  REQUIRE(eventually([&] { return user.connections() == 1; }, 30s, 50ms));  // connected again
  // Whatever is still queued may go now, on the new connection.
  p.sink->limit_taking_for_test(std::nullopt);
  // Each record has its outcome: the five on the wire failed, and the five
  // queued failed with them (or, wrongly, were confirmed on the new connection).
  REQUIRE(eventually([&] { return p.sink->outcomes_waiting_for_test() == static_cast<std::size_t>(events); }, 30s,
                     10ms));
  unhold.done = true;
  release.set_value();
  auto& lost = p.metrics.delivery_errors("connection_lost");
  REQUIRE(eventually([&] { return lost.Value() >= on_the_wire; }, 30s, 20ms));  // the premise

  auto recs = read_settled(f, *to);
  check_delivered<RabbitMq>(f, recs, events + 1, 2 * events);
  CHECK(p.metrics.replays.Value() >= 1);
  CHECK(p.stop() == walrelay::exit_ok);
}

// An unroutable record (basic.return) reported just before the connection
// drops: its dead-letter copy finds the sink disconnected (hand_over says
// queue_full). A transient state: the copy waits and goes once connected
// again, never a halt, never dropped, nothing confirmed past the record.
// The loop is held while the thread reports the return and the connection
// goes (its user deleted, so no new one is let in), so that the loop sees
// both in one poll.
TEST_CASE("sinks: RabbitMQ - an unroutable record whose dead-letter copy finds the connection down waits for the "
          "broker - no halt, the copy arrives once, nothing confirmed past it meanwhile",
          "[rabbitmq][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = RabbitMq::topics(f, f.topic("Routed"));  // f.topic("Lost") has no queue: unroutable
  auto dead = RabbitMq::dead_letters(f);
  RabbitMqUser user(f);
  auto config = walrelay::parse_config(
      with_key(RabbitMq::config(f, user.config() +
                                       "status.update.interval.ms=100\nreconnect.backoff.ms=100\nshutdown.timeout.ms=2000\n"
                                   "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" +
                                       RabbitMq::dead_letter_topic(f) + "\n"),
               "slot.status.interval.ms", "0"),
      "rabbitmq_dead_letter_wait_test", {});
  InProcessRelay<walrelay::RabbitMqSink> p(config, [](boost::asio::io_context& io, const walrelay::Config& c) {
    return std::make_unique<walrelay::RabbitMqSink>(io, walrelay::rabbitmq_config(c));
  });
  REQUIRE(eventually([&] { return p.status().state == walrelay::RelayState::streaming; }, 30s, 20ms));
  f.db().exec(insert_event(f.table, "Routed", "k", "jsonb_build_object('seq', 1)"));
  auto warm = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= warm; }, 30s, 20ms));

  // The unroutable record waits in the queue; then the loop is held.
  p.sink->pause_for_test(true);
  auto in_lost = event_inside(f, "Lost", "k");
  REQUIRE(eventually([&] { return p.status().inflight_records == 1; }, 30s, 20ms));
  std::promise<void> held, release;
  auto released = release.get_future();
  boost::asio::post(p.io, [&] {
    held.set_value();
    released.wait();
  });
  struct Release {
    std::promise<void>& p;
    bool done = false;
    ~Release() {
      if (!done) p.set_value();
    }
  } unhold{release};
  held.get_future().wait();
  // The thread publishes it and reports the return; the loop has not seen it.
  p.sink->pause_for_test(false);
  REQUIRE(eventually([&] { return p.sink->outcomes_waiting_for_test() == 1; }, 30s, 10ms));
  {
    // The connection goes, and no new one is let in until create() below.
    user.drop();
    // The thread has seen the connection go (it tries again meanwhile).
    REQUIRE(eventually(
        [&] {
          try {
            p.sink->check_connectivity(0);
            return false;
          } catch (const std::runtime_error&) {
            return true;
          }
        },
        30s, 50ms));
    unhold.done = true;
    release.set_value();
    // status() runs on the loop after the poll the return's report posted.
    CHECK(p.status().state != walrelay::RelayState::halted);
    p.wait_status_updates_or(10, [&] { return f.db().confirmed_flush(f.slot) >= in_lost; });
    CHECK(p.status().state != walrelay::RelayState::halted);
    CHECK(f.db().confirmed_flush(f.slot) < in_lost);
    CHECK(p.metrics.delivery_errors("unroutable").Value() == 1);
    user.create();
  }
  f.db().exec(insert_event(f.table, "Routed", "k", "jsonb_build_object('seq', 3)"));
  auto recs = read_settled(f, *to);
  CHECK(recs.size() == 2);  // Routed 1 and 3
  auto copies = dead->read(1);
  REQUIRE(copies.size() == 1);
  CHECK(copies[0].header("id") == f.db().scalar("SELECT id FROM " + f.table + " WHERE aggregatetype = 'Lost'"));
  CHECK(copies[0].header("walrelay.error.reason") == std::optional<std::string>("unroutable"));
  CHECK(p.stop() == walrelay::exit_ok);
}

namespace {

const std::string control_token = "ctl-token-4711";

// /status's members a test waits on.
struct StatusView {
  std::string state;               // connector.state
  std::uint64_t inflight = 0;
  bool recorded = false;           // the pause is in the slot marker
  std::string paused_by;
  std::uint64_t lag_bytes = 0;
};

StatusView status_of(Walrelay& relay) {
  auto r = relay.get("/status");
  StatusView v;
  auto j = json::parse(r.body, nullptr, false);
  if (r.status != 200 || !j.is_object()) return v;
  v.state = j["connector"]["state"];
  v.inflight = j["walrelay"]["inflight_records"];
  v.lag_bytes = j["walrelay"]["lag_bytes"];
  if (j["walrelay"]["pause"].is_object()) {
    v.recorded = j["walrelay"]["pause"]["recorded"];
    v.paused_by = j["walrelay"]["pause"]["by"];
  }
  return v;
}

// Paused, reads stopped, nothing in flight, the pause in the slot marker,
// and the server holding walrelay's last confirmed position: what a kill
// then leaves is exactly what was sent.
void wait_paused_settled(Fixture& f, Walrelay& relay) {
  REQUIRE(eventually([&] {
    auto s = status_of(relay);
    return s.state == "PAUSED" && s.inflight == 0 && s.recorded;
  }, 60s, 100ms));
  std::uint64_t last = 0;
  REQUIRE(eventually([&] {
    auto slot = json::parse(relay.get("/slot").body, nullptr, false);
    if (!slot.is_object()) return false;
    const auto confirmed = parse_lsn(slot["confirmed_flush_lsn"].get<std::string>());
    const bool stable = confirmed == last && f.db().confirmed_flush(f.slot) == confirmed;
    last = confirmed;
    return stable;
  }, 30s, 1500ms));
}

}  // namespace

TEMPLATE_TEST_CASE("control: paused 60 s under load - nothing sent - the slot held by the same walsender (no time-out) - "
                   "the lag shown growing - killed (-9) and started again still paused - resumed with walrelay ctl "
                   "every event once and in order per key",
                   "[control][rabbitmq]", Kafka, RabbitMq) {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = TestType::topics(f);
  Collected<TestType, typename TestType::Destination> collected(*to);
  const std::string cfg = TestType::config(f, "admin.control.token=" + control_token + "\nstatus.update.interval.ms=1000\n");
  auto relay = std::make_unique<Walrelay>(cfg);
  relay->start();
  relay->wait_streaming();
  Writer writer(f.table, "Pause", 1000000, 5, 20ms, 8);
  REQUIRE(eventually([&] { return writer.committed() >= 500; }, 60s));
  CHECK(relay->request("POST", "/pause", control_token).status == 202);
  wait_paused_settled(f, *relay);
  const auto at_pause = collected.read().size();
  const long written_at_pause = writer.committed();
  const int walsender = f.db().walsender_pid(f.slot);
  REQUIRE(walsender != 0);
  const auto reconnects = relay->metric("walrelay_reconnects_total");
  const auto lag_at_pause = status_of(*relay).lag_bytes;
  // 60 s: longer than wal_sender_timeout's default, so the walsender would
  // have ended the connection were walrelay silent.
  for (int i = 0; i < 6; ++i) {
    std::this_thread::sleep_for(10s);
    CHECK(f.db().walsender_pid(f.slot) == walsender);
  }
  CHECK(writer.committed() > written_at_pause + 2000);  // the load went on
  CHECK(collected.read().size() == at_pause);           // nothing sent while paused
  CHECK(status_of(*relay).lag_bytes > lag_at_pause);
  CHECK(relay->metric("walrelay_reconnects_total") == reconnects);
  CHECK(relay->metric("walrelay_paused") == std::optional<double>(1));
  auto ready = relay->get("/readyz");
  CHECK((ready.status == 503 && ready.body.find("paused") != std::string::npos));
  writer.stop();

  // A pod-style kill: the next process reads the pause from the slot marker.
  relay->signal(SIGKILL);
  REQUIRE(relay->wait_exit(10s) == 128 + SIGKILL);
  relay = std::make_unique<Walrelay>(cfg);
  relay->start();
  REQUIRE(eventually([&] { return status_of(*relay).state == "PAUSED"; }, 60s, 100ms));
  CHECK(status_of(*relay).paused_by == "the slot marker");
  std::this_thread::sleep_for(3s);
  CHECK(collected.read().size() == at_pause);

  Walrelay ctl(cfg);
  const int rc = ctl.run({"ctl", "--config", relay->config_path(), "--url",
                          "http://127.0.0.1:" + std::to_string(relay->admin_port()), "resume"},
                         30s);
  INFO("walrelay ctl: " << ctl.log());
  REQUIRE(rc == 0);
  REQUIRE(eventually([&] { return status_of(*relay).state == "RUNNING"; }, 30s, 100ms));
  const auto end = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, 120s, 100ms));
  auto recs = collected.read();
  check_delivered<TestType>(f, recs, static_cast<std::size_t>(writer.committed()));
  CHECK(ids_of(recs).duplicates() == 0);
}

TEST_CASE("control: RabbitMQ - an unroutable record halts and stays up FAILED with its trace - the queue bound then "
          "POST /restart relays it and what came after - then a restart while the broker is down - every event "
          "arrives once it is back and in order per key",
          "[control][rabbitmq][fault][solo]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = RabbitMq::topics(f, f.topic("Order"));  // Stray has no queue: unroutable
  Collected<RabbitMq, RabbitMq::Destination> orders(*to);
  Walrelay relay(RabbitMq::config(f, "errors.tolerance=none\nhalt.action=stay\nadmin.control.token=" + control_token +
                                         "\nmax.inflight.records=200\nshutdown.timeout.ms=2000\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Order", "a", "jsonb_build_object('seq', 1)"));
  f.db().exec(insert_event(f.table, "Stray", "a", "jsonb_build_object('seq', 2)"));
  const auto after_stray = f.db().current_wal_lsn();
  f.db().exec(insert_event(f.table, "Order", "a", "jsonb_build_object('seq', 3)"));
  REQUIRE(eventually([&] { return status_of(relay).state == "FAILED"; }, 60s, 100ms));
  auto failed = json::parse(relay.get("/status").body);
  CHECK(failed["walrelay"]["failure"]["cause"] == "record");
  CHECK(failed["connector"]["trace"].get<std::string>().find("POST /restart") != std::string::npos);
  CHECK(relay.metric("walrelay_halted") == std::optional<double>(1));
  CHECK(f.db().confirmed_flush(f.slot) < after_stray);

  // The fix: a queue for Stray. The restart relays it and what came after.
  RabbitMq::Destination strays(RabbitMq::exchange(f), f.slot + "_stray", f.topic("Stray"));
  CHECK(relay.request("POST", "/restart", control_token).status == 202);
  REQUIRE(eventually([&] { return status_of(relay).state == "RUNNING"; }, 60s, 100ms));
  CHECK(relay.metric("walrelay_halted") == std::optional<double>(0));
  auto stray = strays.read(1);
  REQUIRE(stray.size() == 1);
  CHECK(stray[0].value->find("\"seq\": 2") != std::string::npos);

  // The broker gone: a restart meanwhile, then every event once it is back.
  {
    Outage<RabbitMq> outage;
    Writer writer(f.table, "Order", 400, 10, 5ms, 16, "", 10);
    REQUIRE(eventually([&] { return relay.get("/readyz").body.find("broker unreachable") != std::string::npos; },
                       60s, 200ms));
    CHECK(relay.request("POST", "/restart", control_token).status == 202);
    REQUIRE(eventually([&] { return count_of(relay.log(), "session ended for the restart") >= 2; }, 60s, 100ms));
    CHECK(relay.running());
    writer.join();
    REQUIRE(writer.failures() == 0);
    outage.restart();
  }
  const auto end = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, 180s, 200ms));
  const auto order_recs = orders.read();
  check_order_per_key(order_recs);  // per queue: Stray's own is another
  auto recs = order_recs;
  recs.insert(recs.end(), stray.begin(), stray.end());
  auto seen = ids_of(recs);
  CHECK(missing_ids(f.db(), f.table, seen).empty());
  CHECK(seen.count.size() == 403);
  // Each repeat within what a restart may send again (in flight, and what
  // was acknowledged since the last status update).
  CHECK(seen.duplicates() <= 600);
  CHECK(relay.running());
}

TEST_CASE("sinks: Redis - an entry's id is its transaction's commit LSN and its place in it - a stream name that "
          "holds another type dead-letters with the reason, the others go on in order",
          "[redis][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = Redis::topics(f);
  auto dead = Redis::dead_letters(f);
  // Taken: a plain string where the stream of the "Taken" topic would be.
  auto taken = Redis::py("set --key '" + f.topic("Taken") + "' --value not-a-stream");
  INFO(taken.output);
  REQUIRE(taken.status == 0);
  Walrelay relay(Redis::config(f, "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" +
                                      Redis::dead_letter_topic(f) + "\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Order", "a", "jsonb_build_object('seq', 1)"));
  // Three events in one transaction, between two positions of the WAL.
  const auto before = parse_lsn(f.db().scalar("SELECT pg_current_wal_insert_lsn()"));
  f.db().exec("BEGIN; " + insert_event(f.table, "Order", "b", "jsonb_build_object('seq', 2)") +
              insert_event(f.table, "Order", "c", "jsonb_build_object('seq', 3)") +
              insert_event(f.table, "Order", "d", "jsonb_build_object('seq', 4)") + " COMMIT");
  const auto after = parse_lsn(f.db().scalar("SELECT pg_current_wal_insert_lsn()"));
  f.db().exec(insert_event(f.table, "Taken", "a", "jsonb_build_object('seq', 5)"));
  f.db().exec(insert_event(f.table, "Order", "a", "jsonb_build_object('seq', 6)"));
  auto refused_id = f.db().scalar("SELECT id FROM " + f.table + " WHERE payload->>'seq' = '5'");
  auto recs = read_settled(f, *to);
  REQUIRE(recs.size() == 5);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ids;
  for (auto& r : recs) {
    INFO(r.value.value_or(""));
    CHECK(r.topic == f.topic("Order"));
    auto id = r.header("entry_event_id");
    REQUIRE(id);
    CHECK(id == r.header("id"));
  }
  // The entry ids, from the reader's raw output: <commit LSN>-<place>.
  auto raw = Redis::py("read --prefix '" + f.topic("Order") + "' --count 5 --timeout 10");
  REQUIRE(raw.status == 0);
  std::istringstream lines(raw.output);
  for (std::string line; std::getline(lines, line);) {
    auto j = json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    const std::string entry = j["entry_id"];
    const auto dash = entry.find('-');
    ids.emplace_back(std::stoull(entry.substr(0, dash)), std::stoull(entry.substr(dash + 1)));
  }
  REQUIRE(ids.size() == 5);
  // One transaction: one commit LSN, places rising with the changes' LSNs.
  CHECK(ids[1].first == ids[2].first);
  CHECK(ids[2].first == ids[3].first);
  CHECK((ids[1].second < ids[2].second && ids[2].second < ids[3].second));
  CHECK(ids[1].first > before);
  CHECK(ids[1].first < after);
  CHECK(ids[0].first < ids[1].first);
  CHECK(ids[3].first < ids[4].first);
  auto dead_recs = dead->read(1);
  REQUIRE(dead_recs.size() == 1);
  CHECK(dead_recs[0].header("id") == refused_id);
  CHECK(dead_recs[0].key == std::optional<std::string>("a"));
  CHECK(dead_recs[0].header("walrelay.error.reason") == std::optional<std::string>("wrong_type"));
  CHECK(dead_recs[0].header("__connect.errors.topic") == f.topic("Taken"));
  CHECK(dead_recs[0].value->find("\"seq\": 5") != std::string::npos);
  CHECK(metric_at(relay, "walrelay_dead_lettered_total", 1) == 1);
}

TEST_CASE("sinks: Redis - entries already in the stream (walrelay stopped before it confirmed them) are found by id "
          "and event and counted delivered, also once trimmed by MAXLEN - and another writer's entry past an event's "
          "id is that event's error, not a loss",
          "[redis][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = Redis::topics(f);
  auto dead = Redis::dead_letters(f);
  // Confirmed only every minute: a stop sends the final update, a kill does not.
  const std::string cfg = Redis::config(f, "status.update.interval.ms=60000\nsink.redis.stream.maxlen=1\n"
                                           "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" +
                                           Redis::dead_letter_topic(f) + "\n");
  auto relay = std::make_unique<Walrelay>(cfg);
  relay->start();
  relay->wait_streaming();
  for (int i = 0; i < 5; ++i)
    f.db().exec(insert_event(f.table, "Again", "k", "jsonb_build_object('seq', " + std::to_string(i) + ")"));
  REQUIRE(eventually([&] { return relay->metric("walrelay_events_relayed_total").value_or(0) == 5; }, 30s));
  relay->signal(SIGKILL);
  REQUIRE(relay->wait_exit(10s) == 128 + SIGKILL);
  // The first four trimmed away (XTRIM exact: MAXLEN ~ keeps a stream this small whole).
  const std::string cli = Redis::cli();
  REQUIRE(run_command(cli + "XTRIM '" + f.topic("Again") + "' MAXLEN 1").status == 0);
  relay = std::make_unique<Walrelay>(cfg);
  relay->start();
  wait_streaming_after(*relay, 0);
  // The premise: all five sent again (the slot was confirmed before them).
  INFO(relay->log().substr(relay->log().size() > 6000 ? relay->log().size() - 6000 : 0));
  REQUIRE(eventually([&] { return relay->metric("walrelay_events_relayed_total").value_or(0) == 5; }, 30s));
  auto recs = to->read(1);
  REQUIRE(recs.size() == 1);  // none written again
  CHECK(recs.back().value->find("\"seq\": 4") != std::string::npos);
  CHECK(dead->read().empty());
  // Another writer's entry with an id past every LSN: the next event cannot
  // go in commit order, and is dead-lettered (errors.tolerance=all) with why.
  REQUIRE(run_command(cli + "XADD '" + f.topic("Again") + "' 18446744073709551000-0 foreign 1").status == 0);
  f.db().exec(insert_event(f.table, "Again", "k", "jsonb_build_object('seq', 5)"));
  auto dead_recs = dead->read(1);
  REQUIRE(dead_recs.size() == 1);
  CHECK(dead_recs[0].header("walrelay.error.reason") == std::optional<std::string>("id_conflict"));
  CHECK(dead_recs[0].value->find("\"seq\": 5") != std::string::npos);
  relay->signal(SIGTERM);
  REQUIRE(relay->wait_exit(30s) == 0);
}

// CI run 45's campaign found one event twice in a Redis stream: the
// walsender's connection lost in the same process, and the transaction sent
// again from its start, its first change at the same LSN as the last change
// walrelay had seen - so the place within the transaction, counted from that
// change, was not reset, and the entry got a second id.
TEST_CASE("sinks: Redis - a transaction the walsender sends again after a lost connection (the same process) gets "
          "the same entry ids - its events are found in the stream, not written twice",
          "[redis][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = Redis::topics(f);
  // Confirmed only every minute: after the walsender's end the server sends
  // again what walrelay had acknowledged; a stop confirms it.
  const std::string cfg = Redis::config(f, "status.update.interval.ms=60000\n");
  // One event alone; then three in one WAL record (COPY inserts rows in
  // batches): each time the last change walrelay saw is the first one sent again.
  const std::vector<std::string> transactions = {
      insert_event(f.table, "Again", "k", "jsonb_build_object('seq', 0)"),
      "COPY " + f.table + " (aggregatetype, aggregateid, type, payload) FROM PROGRAM $$printf '"
          "Again\\tk\\tE\\t{\"seq\": 1}\\nAgain\\tk\\tE\\t{\"seq\": 2}\\nAgain\\tk\\tE\\t{\"seq\": 3}\\n'$$"};
  for (const auto& sql : transactions) {
    INFO(sql);
    Walrelay relay(cfg);
    relay.start();
    relay.wait_streaming();
    const auto before = f.db().confirmed_flush(f.slot);
    const auto rows_before = std::stod(f.db().scalar("SELECT count(*) FROM " + f.table));
    f.db().exec(sql);
    const double added = std::stod(f.db().scalar("SELECT count(*) FROM " + f.table)) - rows_before;
    REQUIRE(eventually([&] { return relay.metric("walrelay_events_relayed_total").value_or(0) == added; }, 30s));
    // The premise: the server still holds the slot before the transaction.
    REQUIRE(f.db().confirmed_flush(f.slot) == before);
    auto streams = count_of(relay.log(), "streaming: START_REPLICATION");
    REQUIRE(f.db().scalar("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '" +
                          f.slot + "'") == "t");
    wait_streaming_after(relay, streams, 60s);
    // Sent again: counted relayed again once found in the stream.
    REQUIRE(eventually([&] { return relay.metric("walrelay_events_relayed_total").value_or(0) == 2 * added; }, 30s));
    relay.signal(SIGTERM);
    REQUIRE(relay.wait_exit(30s) == 0);
  }
  auto recs = to->read(4);
  CHECK(recs.size() == 4);
  check_delivered<Redis>(f, recs, 4);
}

// helper-43's review: a later event of the transaction moved the stream's
// mark past an event whose dead-letter copy then failed; the mapping fixed
// before the restart, that event was "gone" (below the mark, not there) -
// counted delivered, stored nowhere.
TEST_CASE("sinks: Redis - an event whose dead-letter copy failed stays below every stream's mark - with its route "
          "fixed before the restart it is dead-lettered (it cannot go before the events stored after it), never "
          "counted delivered unstored",
          "[redis][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = Redis::topics(f);
  auto dead = Redis::dead_letters(f);
  const std::string cli = Redis::cli();
  const std::string user = f.slot + "_dlq";
  // The topics' streams and walrelay's marks, not the dead-letter stream.
  REQUIRE(run_command(cli + "ACL SETUSER " + user + " on '>dlq-s3cret' '~" + f.topic_prefix + "*' '~walrelay:mark:*' '+@all'")
              .status == 0);
  struct DropUser {
    std::string cli, user;
    ~DropUser() { run_command(cli + "ACL DELUSER " + user); }
  } drop{cli, user};
  const std::map<std::string, std::string> env{{"WALRELAY_SINK_REDIS_PASSWORD", "dlq-s3cret"}};
  const std::string cfg = Redis::config(f, "sink.redis.user=" + user + "\nerrors.tolerance=all\n"
                                           "errors.deadletterqueue.topic.name=" + Redis::dead_letter_topic(f) +
                                           "\nstatus.update.interval.ms=60000\n");
  Walrelay relay(cfg, env);
  relay.start();
  relay.wait_streaming();
  // x: a route no topic may have (a mapping error: its copy to the
  // dead-letter stream, refused); y after it, stored. The sink's thread is
  // held until both wait in its queue, so that they go in one round trip:
  // otherwise the refusal of x's copy, sent alone, may halt walrelay before
  // y is handed to the sink (CI run 53), and the premise fails.
  {
    ThreadHold hold(relay.pid(), "wr-redis");
    f.db().exec("BEGIN; " + insert_event(f.table, "Bad Route!", "x", "jsonb_build_object('seq', 1)") +
                insert_event(f.table, "Order", "y", "jsonb_build_object('seq', 2)") + " COMMIT");
    REQUIRE(eventually([&] { return relay.metric("walrelay_inflight_records").value_or(0) >= 2; }, 30s, 10ms));
    // (held indeed: nothing sent yet)
    REQUIRE(run_command(cli + "EXISTS '" + f.topic("Order") + "'").output.find('0') == 0);
  }
  const auto x_id = f.db().scalar("SELECT id FROM " + f.table + " WHERE aggregateid = 'x'");
  CHECK(relay.wait_exit(60s) == 3);
  CHECK(relay.log().find("NOPERM") != std::string::npos);
  auto stored = to->read(1, 20);
  REQUIRE(stored.size() == 1);  // the premise: y is in its stream
  REQUIRE(stored[0].key == std::optional<std::string>("y"));
  auto y_entry = run_command(cli + "XREVRANGE '" + f.topic("Order") + "' + - COUNT 1");
  REQUIRE(y_entry.status == 0);
  const std::string y_entry_id = y_entry.output.substr(0, y_entry.output.find('\n'));
  auto mark = run_command(cli + "HGET 'walrelay:mark:{" + f.topic("Order") + "}' id");
  INFO("y's entry " << y_entry_id << ", the stream's mark: " << mark.output);
  REQUIRE(y_entry_id.find('-') != std::string::npos);
  CHECK(mark.output.find(y_entry_id) == std::string::npos);
  // Granted, and x's route fixed: every event to the Order stream.
  REQUIRE(run_command(cli + "ACL SETUSER " + user + " '~*'").status == 0);
  Walrelay again(with_key(cfg, "route.topic.replacement", f.topic("Order")), env);
  again.start();
  again.wait_streaming();
  INFO(again.log().substr(again.log().size() > 4000 ? again.log().size() - 4000 : 0));
  std::vector<KafkaRecord> dead_recs;
  CHECK(eventually([&] { return (dead_recs = dead->read()).size() == 1; }, 30s, 500ms));
  REQUIRE(dead_recs.size() == 1);
  CHECK(dead_recs[0].header("id") == x_id);
  CHECK(dead_recs[0].header("walrelay.error.reason") == std::optional<std::string>("id_conflict"));
  auto recs = read_settled(f, *to);
  CHECK(recs.size() == 1);
  CHECK(again.running());
}

TEST_CASE("sinks: Redis - an event another writer's entry blocks halts, and stays held after that entry is deleted "
          "(never stored, so never counted delivered) - once the stream is free it arrives",
          "[redis][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = Redis::topics(f);
  const std::string cli = Redis::cli();
  const std::string stream = f.topic("Blocked");
  const std::string cfg = Redis::config(f);
  auto relay = std::make_unique<Walrelay>(cfg);
  relay->start();
  relay->wait_streaming();
  f.db().exec(insert_event(f.table, "Blocked", "k", "jsonb_build_object('seq', 1)"));
  REQUIRE(to->read(1).size() == 1);
  // Another writer, past every LSN walrelay will write.
  REQUIRE(run_command(cli + "XADD '" + stream + "' 18446744073709551000-0 foreign 1").status == 0);
  auto in_blocked = event_inside(f, "Blocked", "k");
  CHECK(relay->wait_exit(60s) == 3);
  CHECK(relay->log().find("id_conflict") != std::string::npos);
  // The operator deletes the foreign entry: the stream's last id stays
  // there, the event was never stored.
  REQUIRE(run_command(cli + "XDEL '" + stream + "' 18446744073709551000-0").status == 0);
  relay = std::make_unique<Walrelay>(cfg);
  relay->start();
  CHECK(relay->wait_exit(60s) == 3);
  CHECK(f.db().confirmed_flush(f.slot) < in_blocked);
  CHECK(to->read(1).size() == 1);
  // The stream made again (deleted, as the halt's message suggests): the event arrives.
  REQUIRE(run_command(cli + "DEL '" + stream + "'").status == 0);
  relay = std::make_unique<Walrelay>(cfg);
  relay->start();
  auto recs = to->read(1);
  REQUIRE(recs.size() == 1);
  CHECK(recs[0].value->find("\"seq\": -1") != std::string::npos);
}

TEST_CASE("sinks: Redis - a user whose ACL does not reach the streams halts naming the refusal, even with a "
          "dead-letter stream, and dead-letters nothing - granted, every event arrives",
          "[redis][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = Redis::topics(f);
  auto dead = Redis::dead_letters(f);
  const std::string cli = Redis::cli();
  const std::string user = f.slot + "_acl";
  // Every command, on keys of another prefix only.
  REQUIRE(run_command(cli + "ACL SETUSER " + user + " on '>acl-s3cret' '~elsewhere:*' '+@all'").status == 0);
  struct DropUser {
    std::string cli, user;
    ~DropUser() { run_command(cli + "ACL DELUSER " + user); }
  } drop{cli, user};
  const std::string cfg = Redis::config(f, "sink.redis.user=" + user + "\nerrors.tolerance=all\n"
                                           "errors.deadletterqueue.topic.name=" + Redis::dead_letter_topic(f) + "\n");
  Walrelay relay(cfg, {{"WALRELAY_SINK_REDIS_PASSWORD", "acl-s3cret"}});
  relay.start();
  relay.wait_streaming();
  auto in_first = event_inside(f, "Acl", "k");
  CHECK(relay.wait_exit(60s) == 3);
  CHECK(relay.log().find("NOPERM") != std::string::npos);
  CHECK(relay.log().find("acl-s3cret") == std::string::npos);
  CHECK(f.db().confirmed_flush(f.slot) < in_first);
  CHECK(dead->read().empty());
  REQUIRE(run_command(cli + "ACL SETUSER " + user + " '~*'").status == 0);
  Walrelay again(cfg, {{"WALRELAY_SINK_REDIS_PASSWORD", "acl-s3cret"}});
  again.start();
  auto recs = to->read(1);
  REQUIRE(recs.size() == 1);
  CHECK(recs[0].key == std::optional<std::string>("k"));
}

namespace {

// A Redis primary and its replica of the test's own (AOF on both): what
// sink.redis.wait.enabled waits for, and a replica the test can freeze.
class RedisWithReplica {
 public:
  RedisWithReplica() {
    char tmpl[] = "/tmp/walrelay-redis-pair-XXXXXX";
    dir_ = mkdtemp(tmpl);
    primary_ = free_port();
    replica_ = free_port();
    start("primary", primary_, "");
    start("replica", replica_, "--replicaof 127.0.0.1 " + std::to_string(primary_));
    REQUIRE(eventually([&] {
      return run_command(cli(replica_) + "INFO replication").output.find("master_link_status:up") != std::string::npos;
    }, 20s, 100ms));
  }
  ~RedisWithReplica() {
    thaw_replica();
    run_command("kill $(cat " + dir_ + "/primary.pid " + dir_ + "/replica.pid) 2>/dev/null; sleep 0.3; rm -rf " + dir_);
  }
  RedisWithReplica(const RedisWithReplica&) = delete;
  RedisWithReplica& operator=(const RedisWithReplica&) = delete;
  std::string address() const { return "127.0.0.1:" + std::to_string(primary_); }
  void freeze_replica() { REQUIRE(run_command("kill -STOP $(cat " + dir_ + "/replica.pid)").status == 0); }
  void thaw_replica() { run_command("kill -CONT $(cat " + dir_ + "/replica.pid) 2>/dev/null"); }
  std::vector<KafkaRecord> read(const std::string& prefix, std::size_t at_least, int timeout_s = 60) const {
    return records_of(run_command(test_python() + " " + WALRELAY_SOURCE_DIR + "/tests/integration/redis/read.py --url " +
                                  address() + " read --prefix '" + prefix + "' --count " + std::to_string(at_least) +
                                  " --timeout " + std::to_string(timeout_s) + " 2>&1"));
  }

 private:
  static std::string cli(int port) { return "redis-cli -h 127.0.0.1 -p " + std::to_string(port) + " "; }
  void start(const std::string& name, int port, const std::string& extra) {
    const std::string d = dir_ + "/" + name;
    REQUIRE(run_command("mkdir -p " + d).status == 0);
    REQUIRE(run_command("redis-server --bind 127.0.0.1 --port " + std::to_string(port) + " --dir " + d +
                        " --appendonly yes --save '' --daemonize yes --pidfile " + dir_ + "/" + name + ".pid --logfile " +
                        d + "/redis.log " + extra).status == 0);
    REQUIRE(eventually([&] { return run_command(cli(port) + "ping").output.find("PONG") != std::string::npos; },
                       10s, 50ms));
  }
  std::string dir_;
  int primary_ = 0, replica_ = 0;
};

}  // namespace

TEST_CASE("sinks: Redis with sink.redis.wait.enabled - an entry counts as stored once a replica has it: the replica "
          "frozen holds the slot, thawed every event is there once",
          "[redis][fault]") {
  RedisWithReplica redis;
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  Walrelay relay(without_kafka(f, "sink.type=redis\nsink.redis.address=" + redis.address() +
                                      "\nsink.redis.wait.enabled=true\nsink.redis.wait.timeout.ms=300\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Wait", "k", "jsonb_build_object('seq', 1)"));
  REQUIRE(redis.read(f.topic_prefix, 1).size() == 1);
  REQUIRE(eventually([&] { return relay.metric("walrelay_events_relayed_total").value_or(0) == 1; }, 30s));
  redis.freeze_replica();
  auto in_frozen = event_inside(f, "Wait", "k-frozen");
  for (int i = 2; i <= 5; ++i)
    f.db().exec(insert_event(f.table, "Wait", "k", "jsonb_build_object('seq', " + std::to_string(i) + ")"));
  // On the primary, not acknowledged by the replica: failed, sent again, held.
  REQUIRE(eventually([&] { return relay.metric("walrelay_delivery_errors_total{reason=\"wait_timeout\"}").value_or(0) > 0; },
                     30s));
  CHECK(f.db().confirmed_flush(f.slot) < in_frozen);
  CHECK(relay.metric("walrelay_events_relayed_total").value_or(0) == 1);
  redis.thaw_replica();
  const auto end = f.db().current_wal_lsn();
  REQUIRE(eventually([&] { return f.db().confirmed_flush(f.slot) >= end; }, 60s, 100ms));
  auto all = redis.read(f.topic_prefix, 6);
  auto seen = ids_of(all);
  CHECK(all.size() == 6);
  CHECK(seen.duplicates() == 0);
  CHECK(missing_ids(f.db(), f.table, seen).empty());
  check_order_per_key(all);
}

TEST_CASE("sinks: Redis - entries trimmed away count as stored only under walrelay's mark of the same source: a mark "
          "another database wrote holds the event as a conflict, never delivered",
          "[redis][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = Redis::topics(f);
  const std::string cli = Redis::cli();
  const std::string stream = f.topic("Source");
  const std::string cfg = Redis::config(f, "status.update.interval.ms=60000\n");
  auto relay = std::make_unique<Walrelay>(cfg);
  relay->start();
  relay->wait_streaming();
  auto first = event_inside(f, "Source", "k");
  REQUIRE(eventually([&] { return relay->metric("walrelay_events_relayed_total").value_or(0) == 1; }, 30s));
  relay->signal(SIGKILL);
  REQUIRE(relay->wait_exit(10s) == 128 + SIGKILL);
  // The mark is this slot's; trimmed, the entry would count as stored.
  auto mark = run_command(cli + "HGET 'walrelay:mark:{" + stream + "}' source");
  INFO(mark.output);
  CHECK(mark.output.find("/" + f.slot) != std::string::npos);
  REQUIRE(run_command(cli + "XTRIM '" + stream + "' MAXLEN 0").status == 0);
  // Another database's mark now (a restore elsewhere, a second cluster).
  REQUIRE(run_command(cli + "HSET 'walrelay:mark:{" + stream + "}' source other/1/db/slot").status == 0);
  relay = std::make_unique<Walrelay>(cfg);
  relay->start();
  CHECK(relay->wait_exit(60s) == 3);
  CHECK(relay->log().find("id_conflict") != std::string::npos);
  CHECK(f.db().confirmed_flush(f.slot) < first);
}

TEST_CASE("sinks: Redis with message.format=compact - one field per entry, the key, whose value is the record's "
          "(Debezium Server's compact format)",
          "[redis]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = Redis::topics(f);
  const std::string cli = Redis::cli();
  Walrelay relay(Redis::config(f, "sink.redis.message.format=compact\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "Compact", "k1", "jsonb_build_object('seq', 1)"));
  f.db().exec(insert_event(f.table, "Compact", "k2", "jsonb_build_object('seq', 2)"));
  REQUIRE(eventually([&] { return relay.metric("walrelay_events_relayed_total").value_or(0) == 2; }, 30s));
  auto out = run_command(cli + "--no-raw XRANGE '" + f.topic("Compact") + "' - +");
  INFO(out.output);
  CHECK(out.output.find("\"k1\"") != std::string::npos);
  CHECK(out.output.find("\"k2\"") != std::string::npos);
  CHECK(out.output.find("seq") != std::string::npos);
  CHECK(out.output.find("\"headers\"") == std::string::npos);
}

TEST_CASE("sinks: Redis - events a configuration change adds to a transaction sent before (a table added to "
          "table.include.list between a kill and the restart) are not counted stored under the old mark",
          "[redis][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  const std::string other = f.table + "_b";
  create_outbox(f.db(), other, "bigint");
  auto to = Redis::topics(f);
  const std::string cli = Redis::cli();
  // One publication of both tables, made by hand; walrelay relays the first only.
  f.db().exec("CREATE PUBLICATION " + f.slot + " FOR TABLE " + f.table + ", " + other +
              " WITH (publish = 'insert')");
  const std::string first_cfg =
      Redis::config(f, "publication.autocreate.mode=disabled\nstatus.update.interval.ms=60000\n");
  auto relay = std::make_unique<Walrelay>(first_cfg);
  relay->start();
  relay->wait_streaming();
  // One transaction: the other table's event first, then this table's.
  const auto before = f.db().current_wal_lsn();
  f.db().exec("BEGIN; " + insert_event(other, "Added", "k", "jsonb_build_object('seq', 1)") +
              insert_event(f.table, "Added", "k", "jsonb_build_object('seq', 2)") + " COMMIT");
  REQUIRE(eventually([&] { return relay->metric("walrelay_events_relayed_total").value_or(0) == 1; }, 30s));
  relay->signal(SIGKILL);
  REQUIRE(relay->wait_exit(10s) == 128 + SIGKILL);
  REQUIRE(run_command(cli + "XTRIM '" + f.topic("Added") + "' MAXLEN 0").status == 0);
  // Both tables now: the other table's event was never sent, whatever the mark says.
  auto both = with_key(first_cfg, "table.include.list", f.table + "," + other);
  relay = std::make_unique<Walrelay>(both);
  relay->start();
  CHECK(relay->wait_exit(60s) == 3);
  CHECK(relay->log().find("id_conflict") != std::string::npos);
  CHECK(f.db().confirmed_flush(f.slot) <= before);
}

namespace {

// read.py's lines for the topics starting with `prefix`, as JSON.
std::vector<json> http_lines(const std::string& command, const std::string& prefix, const std::string& extra = "") {
  auto r = Http::py(command + " --prefix '" + prefix + "' " + extra);
  INFO(r.output.substr(0, 2000));
  REQUIRE(r.status == 0);
  std::vector<json> out;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

}  // namespace

TEST_CASE("http: batches (sink.http.batch.enabled) - Debezium Server's JSON array of the values, at most "
          "batch.max-size and one record per key in a request - a batch refused for one record is sent again record by "
          "record and only that one is dead-lettered, the others in order - a value that is not JSON goes alone",
          "[http][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint", "text");
  auto to = Http::topics(f);
  auto dead = Http::dead_letters(f);
  Http::fault(f.topic("Order"), "--status 400 --match poison --reply 'poison: refused'");
  // The first request answered late, one request at a time: everything else
  // waits behind it and forms full batches.
  Http::fault(f.topic("Order"), "--status 200 --delay-ms 1000 --count 1");
  Walrelay relay(Http::config(f, "sink.http.batch.enabled=true\nsink.http.batch.max-size=3\n"
                                 "sink.http.max.inflight.requests=1\nerrors.tolerance=all\n"
                                 "errors.deadletterqueue.topic.name=" + Http::dead_letter_topic(f) + "\n"));
  relay.start();
  relay.wait_streaming();
  // The poison after the second round of keys: whatever the first request
  // took, its batch has company.
  std::string values;
  for (int seq = 1; seq <= 4; ++seq) {
    for (std::string key : {"a", "b", "c", "d"})
      values += std::string(values.empty() ? "" : ",") + "('Order', '" + key + "', 'E', '{\"key\": \"" + key +
                "\", \"seq\": " + std::to_string(seq) + "}')";
    if (seq == 2) values += ",('Order', 'p', 'E', '{\"key\": \"p\", \"seq\": 1, \"note\": \"poison\"}')";
  }
  values += ",('Order', 'x', 'E', 'not json')";
  for (std::string key : {"a", "b", "c", "d"})
    values += ",('Order', '" + key + "', 'E', '{\"key\": \"" + key + "\", \"seq\": 5}')";
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES " + values);
  read_settled(f, *to);
  const auto requests = http_lines("read", f.topic("Order"));  // each request as the receiver stored it
  std::map<std::string, int> last_seq;
  std::size_t elements = 0, largest = 0;
  bool plain_seen = false;
  for (auto& req : requests) {
    const std::string body = req["data"];
    INFO(body);
    if (body == "not json") {  // alone, as without batches: its id and key in the headers
      plain_seen = true;
      CHECK(req["headers"]["key"] == "x");
      CHECK(req["message_id"] == f.db().scalar("SELECT id FROM " + f.table + " WHERE payload = 'not json'"));
      continue;
    }
    auto array = json::parse(body, nullptr, false);
    REQUIRE(array.is_array());
    CHECK(req["message_id"].get<std::string>().rfind("batch-", 0) == 0);
    std::set<std::string> keys;
    for (auto& v : array) {
      CHECK(v["key"] != "p");  // the poison never stored
      CHECK(keys.insert(v["key"]).second);  // one record per key in a request
      CHECK(v["seq"].get<int>() == last_seq[v["key"]] + 1);  // each once, in order per key
      last_seq[v["key"]] = v["seq"];
    }
    elements += array.size();
    largest = std::max(largest, array.size());
  }
  CHECK(plain_seen);
  CHECK(elements == 20);
  CHECK(largest == 3);
  for (std::string key : {"a", "b", "c", "d"}) CHECK(last_seq[key] == 5);
  // The batch holding the poison was refused whole, then sent record by record.
  auto attempts = http_lines("attempts", f.topic("Order"));
  CHECK(std::count_if(attempts.begin(), attempts.end(), [](auto& a) { return a["status"] == 400; }) >= 2);
  auto dead_recs = dead->read(1);
  REQUIRE(dead_recs.size() == 1);
  CHECK(dead_recs[0].value->find("poison") != std::string::npos);
  CHECK(dead_recs[0].header("walrelay.error.reason") == std::optional<std::string>("http_400"));
  CHECK(metric_at(relay, "walrelay_dead_lettered_total", 1) == 1);
}

TEST_CASE("http: batches of records - a header name that comes twice keeps both, a value behind a byte order mark "
          "goes alone, records without an id get a key no restart repeats, and a batch tried again in place is the "
          "same request with the same Idempotency-Key",
          "[http][fault]") {
  Fixture f;
  f.db().exec("CREATE TABLE " + f.table + " (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, eid text, "
              "aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload text, hdrs text)");
  auto to = Http::topics(f);
  const std::string config = Http::config(
      f, "sink.http.batch.enabled=true\nsink.http.batch.format=records\nsink.http.max.inflight.requests=1\n"
         "sink.http.timeout.ms=1000\nsink.http.retry.interval.ms=200\ntable.field.event.id=eid\n"
         "table.field.event.headers=hdrs\n");
  auto insert = [&](const std::string& eid, const std::string& key, const std::string& payload,
                    const std::string& hdrs = "NULL") {
    return "INSERT INTO " + f.table + " (eid, aggregatetype, aggregateid, type, payload, hdrs) VALUES (" + eid +
           ", 'Order', '" + key + "', 'E', " + payload + ", " + hdrs + ");";
  };
  auto bodies = [&] {
    std::vector<std::pair<std::string, std::string>> out;  // (Idempotency-Key, body), in arrival order
    for (auto& r : http_lines("read", f.topic("Order"))) out.emplace_back(r["message_id"], r["data"]);
    return out;
  };
  {
    Walrelay relay(config);
    relay.start();
    relay.wait_streaming();
    // Two headers named h, after the router's id; a value behind a BOM; a record with no id.
    f.db().exec("BEGIN;" + insert("'e-1'", "a", "'{\"seq\": 1}'", "'{\"id\": \"other\", \"h\": \"1\", \"h\": \"2\"}'") +
                insert("'e-2'", "b", "U&'\\FEFF{\"seq\": 1}'") + insert("''", "c", "'{\"seq\": 1}'") + "COMMIT");
    read_settled(f, *to);
    relay.signal(SIGTERM);
    CHECK(relay.wait_exit(30s) == 0);
  }
  auto first = bodies();
  std::string element_a, bom_body, key_c1;
  for (auto& [key, body] : first) {
    if (body.find("\"a\"") != std::string::npos) element_a = body;
    if (body.rfind("\xEF\xBB\xBF", 0) == 0) bom_body = body;
    if (body.find("\"c\"") != std::string::npos) key_c1 = key;
  }
  INFO(element_a);
  auto array = json::parse(element_a, nullptr, false);
  REQUIRE(array.is_array());
  CHECK(array[0]["id"] == "e-1");
  CHECK(array[0]["headers"] == json::parse(R"([["id", "e-1"], ["id", "other"], ["h", "1"], ["h", "2"]])"));
  CHECK(bom_body == "\xEF\xBB\xBF{\"seq\": 1}");  // alone, as it is: not in an array
  CHECK(key_c1.rfind("walrelay-", 0) == 0);
  {
    // A restart: another record without an id gets another key.
    Walrelay relay(config);
    relay.start();
    relay.wait_streaming();
    f.db().exec(insert("''", "c", "'{\"seq\": 2}'"));
    read_settled(f, *to);
    std::string key_c2;
    for (auto& [key, body] : bodies())
      if (body.find("\"seq\": 2") != std::string::npos) key_c2 = key;
    CHECK(key_c2.rfind("walrelay-", 0) == 0);
    CHECK(key_c2 != key_c1);
    // The receiver stores the next request but answers it after walrelay's time-out: tried again in place while
    // other records wait, it goes again as it was.
    Http::fault(f.topic("Order"), "--status 200 --delay-ms 1500 --count 1");
    f.db().exec(insert("'e-10'", "k1", "'{\"seq\": 10}'"));
    REQUIRE(eventually([&] { return http_lines("attempts", f.topic("Order")).size() >= first.size() + 2; }, 30s, 10ms));
    f.db().exec("BEGIN;" + insert("'e-11'", "k2", "'{\"seq\": 11}'") + insert("'e-12'", "k3", "'{\"seq\": 12}'") +
                "COMMIT");
    f.db().exec("BEGIN;" + insert("'e-13'", "k4", "'{\"seq\": 13}'") + insert("'e-14'", "k5", "'{\"seq\": 14}'") +
                "COMMIT");
    read_settled(f, *to);
  }
  std::vector<std::pair<std::string, std::string>> k1;
  for (auto& [key, body] : bodies())
    if (body.find("\"seq\": 10") != std::string::npos) k1.emplace_back(key, body);
  REQUIRE(k1.size() == 2);  // stored, timed out, sent again
  CHECK(k1[1] == k1[0]);
}

TEST_CASE("http: 503 and 429 are tried again in place - the key's later events wait behind, the Retry-After is "
          "honoured, nothing is lost, nothing sent twice, and the slot waits for the 2xx",
          "[http][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = Http::topics(f);
  // Two 503s, then a 429 asking for 2 s, for the first requests of the topic.
  Http::fault(f.topic("Retry"), "--status 503 --count 2");
  Http::fault(f.topic("Retry"), "--status 429 --count 1 --retry-after 2");
  Walrelay relay(Http::config(f, "sink.http.retry.interval.ms=200\n"));
  relay.start();
  relay.wait_streaming();
  const auto before = f.db().current_wal_lsn();
  for (int seq = 1; seq <= 3; ++seq)
    f.db().exec(insert_event(f.table, "Retry", "a", "jsonb_build_object('seq', " + std::to_string(seq) + ")"));
  // While the first event waits out its Retry-After, nothing is confirmed past it.
  REQUIRE(eventually([&] { return http_lines("attempts", f.topic("Retry")).size() >= 3; }, 30s, 50ms));
  CHECK(f.db().confirmed_flush(f.slot) <= before);
  auto recs = read_settled(f, *to);
  check_delivered<Http>(f, recs, 3);
  REQUIRE(recs.size() == 3);
  for (int i = 0; i < 3; ++i) CHECK(recs[i].value->find("\"seq\": " + std::to_string(i + 1)) != std::string::npos);
  // The attempts: 503, 503, 429, then the three 200s, one at a time.
  auto attempts = http_lines("attempts", f.topic("Retry"));
  REQUIRE(attempts.size() == 6);
  std::vector<int> statuses;
  for (auto& a : attempts) statuses.push_back(a["status"].get<int>());
  CHECK(statuses == std::vector<int>{503, 503, 429, 200, 200, 200});
  for (int i = 0; i < 4; ++i)  // the first event's four attempts carry one Idempotency-Key
    CHECK(attempts[i]["headers"]["Idempotency-Key"] == attempts[0]["headers"]["Idempotency-Key"]);
  CHECK(attempts[3]["t"].get<double>() - attempts[2]["t"].get<double>() >= 1.9);  // Retry-After: 2
  CHECK(attempts[1]["t"].get<double>() - attempts[0]["t"].get<double>() >= 0.19);  // retry.interval.ms
  CHECK(relay.metric("walrelay_dead_lettered_total").value_or(0) == 0);
}

TEST_CASE("http: a 4xx is the record's own - dead-lettered to the dead-letter topic's URL with the status and the "
          "answer, the others go on in order - a 401 halts naming it, never dead-lettered",
          "[http][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = Http::topics(f);
  auto dead = Http::dead_letters(f);
  Http::fault(f.topic("Order"), "--status 422 --match '\"seq\": 2' --reply 'amount: not a number'");
  Walrelay relay(Http::config(f, "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" +
                                     Http::dead_letter_topic(f) + "\n"));
  relay.start();
  relay.wait_streaming();
  for (int seq = 1; seq <= 3; ++seq)
    f.db().exec(insert_event(f.table, "Order", "a", "jsonb_build_object('seq', " + std::to_string(seq) + ")"));
  auto refused_id = f.db().scalar("SELECT id FROM " + f.table + " WHERE payload->>'seq' = '2'");
  auto recs = read_settled(f, *to);
  REQUIRE(recs.size() == 2);
  CHECK(recs[0].value->find("\"seq\": 1") != std::string::npos);
  CHECK(recs[1].value->find("\"seq\": 3") != std::string::npos);
  auto dead_recs = dead->read(1);
  REQUIRE(dead_recs.size() == 1);
  CHECK(dead_recs[0].header("id") == refused_id);
  CHECK(dead_recs[0].key == std::optional<std::string>("a"));
  CHECK(dead_recs[0].value->find("\"seq\": 2") != std::string::npos);
  CHECK(dead_recs[0].header("walrelay.error.reason") == std::optional<std::string>("http_422"));
  CHECK(dead_recs[0].header("__connect.errors.exception.message").value_or("").find("answered 422: amount: not a "
                                                                                      "number") != std::string::npos);
  CHECK(metric_at(relay, "walrelay_dead_lettered_total", 1) == 1);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);

  // Walrelay's credentials refused: a halt that names the answer, no copy.
  Http::fault(f.topic("Denied"), "--status 401 --reply 'bad token'");
  Walrelay denied(Http::config(f, "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" +
                                      Http::dead_letter_topic(f) + "\n"));
  denied.start();
  denied.wait_streaming();
  const auto before = f.db().current_wal_lsn();
  f.db().exec(insert_event(f.table, "Denied", "a", "jsonb_build_object('seq', 4)"));
  CHECK(denied.wait_exit(60s) != 0);
  CHECK(denied.log().find("answered 401: bad token") != std::string::npos);
  CHECK(f.db().confirmed_flush(f.slot) <= before);
  CHECK(dead->read().size() == 1);
}

TEST_CASE("http: Standard Webhooks signatures that the receiver's own HMAC check accepts, the event id as "
          "Idempotency-Key and webhook-id, CloudEvents binary attributes as ce- headers, the record's headers "
          "under the prefix - and --check reaches the endpoint or says why not",
          "[http]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = Http::topics(f);
  const std::string secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
  Walrelay relay(Http::config(f, "sink.http.authentication.type=standard-webhooks\n"
                                 "sink.http.authentication.webhook.secret=" + secret + "\ncloudevents.mode=binary\n"
                                 "cloudevents.source=/orders\nsink.http.headers.prefix=X-Outbox-\n"
                                 "sink.http.headers.encode.base64=false\n"));
  CHECK(relay.run({"--check", "--config", relay.config_path()}) == 0);
  relay.start();
  relay.wait_streaming();
  for (int seq = 1; seq <= 5; ++seq)
    f.db().exec(insert_event(f.table, "Signed", "k" + std::to_string(seq % 2),
                             "jsonb_build_object('seq', " + std::to_string(seq) + ")"));
  (void)read_settled(f, *to);
  auto lines = http_lines("read", f.topic("Signed"), "--count 5 --secret " + secret);
  REQUIRE(lines.size() == 5);
  for (auto& l : lines) {
    INFO(l.dump());
    CHECK(l["signature_ok"] == true);
    auto& h = l["headers"];
    CHECK(h["webhook-id"] == l["message_id"]);
    CHECK(h["ce_id"] == l["message_id"]);
    CHECK(h["ce_source"] == "/orders");
    CHECK(h["ce_type"] == "Created");
    CHECK(h["ce_specversion"] == "1.0");
    CHECK(h["content-type"].get<std::string>().find("application/json") == 0);
    CHECK(h["x-outbox-key"].get<std::string>().rfind("k", 0) == 0);
    CHECK(h["x-outbox-id"] == l["message_id"]);
  }
  // A body changed on the way fails the same check.
  {
    const std::string stored = Services::current("WALRELAY_RUN_DIR") + "/http/store/" + f.topic("Signed") + ".jsonl";
    std::ifstream in(stored);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const std::string from = "\\\"seq\\\": ", to = "\\\"seq\\\": 9";  // in each body's JSON text
    for (auto at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
    std::ofstream(stored, std::ios::trunc) << text;
  }
  for (auto& l : http_lines("read", f.topic("Signed"), "--secret " + secret)) CHECK(l["signature_ok"] == false);
  // Nothing listening: --check says where and why.
  Walrelay nowhere(with_key(Http::config(f), "sink.http.url", "http://127.0.0.1:1/${topic}"));
  CHECK(nowhere.run({"--check", "--config", nowhere.config_path()}) != 0);
  CHECK(nowhere.log().find("HEAD http://127.0.0.1:1/...: ") != std::string::npos);
}

namespace {

// User and system CPU of `pid` so far, in seconds (/proc/<pid>/stat).
double cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string skip;
  for (int i = 0; i < 11; ++i) fields >> skip;  // state .. cmajflt
  long utime = 0, stime = 0;
  fields >> utime >> stime;
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace

TEST_CASE("http: an endpoint that is not there (404) holds the slot and dead-letters nothing, /readyz names it, and "
          "once it answers every event arrives in order",
          "[http][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = Http::topics(f);
  auto dead = Http::dead_letters(f);
  Http::fault(f.topic("Missing"), "--status 404 --count 12 --reply 'no such route'");
  Walrelay relay(Http::config(f, "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" +
                                     Http::dead_letter_topic(f) + "\nsink.http.retry.interval.ms=100\n"
                                     "sink.http.retries=2\n"));
  relay.start();
  relay.wait_streaming();
  auto in_first = event_inside(f, "Missing", "k");
  for (int seq = 1; seq <= 3; ++seq)
    f.db().exec(insert_event(f.table, "Missing", "k", "jsonb_build_object('seq', " + std::to_string(seq) + ")"));
  HttpResponse ready;
  REQUIRE(eventually([&] { return (ready = relay.get("/readyz")).body.find("answered 404") != std::string::npos; },
                     30s, 50ms));
  CHECK(ready.status == 503);
  CHECK(f.db().confirmed_flush(f.slot) < in_first);
  auto recs = read_settled(f, *to);
  check_delivered<Http>(f, recs, 4, 4);
  CHECK(dead->read().empty());
  CHECK(relay.metric("walrelay_dead_lettered_total").value_or(0) == 0);
  CHECK(eventually([&] { return relay.get("/readyz").status == 200; }, 30s));
}

TEST_CASE("http: headers from the rows cannot become the request's own - a placed header named Content-Length stays "
          "under the prefix, a key with a line break is percent-encoded - and the body arrives whole",
          "[http]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = Http::topics(f);
  Walrelay relay(Http::config(f, "sink.http.headers.encode.base64=false\n"
                                 "table.fields.additional.placement=type:header:Content-Length\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec("INSERT INTO " + f.table + " (aggregatetype, aggregateid, type, payload) VALUES ('Inject', "
              "E'a\\r\\nX-Injected: 1', '0', jsonb_build_object('seq', 1, 'pad', repeat('x', 100)))");
  auto recs = read_settled(f, *to);
  REQUIRE(recs.size() == 1);
  CHECK(recs[0].value->find(std::string(100, 'x')) != std::string::npos);  // the whole body
  CHECK(recs[0].header("Content-Length") == std::optional<std::string>("0"));  // X-DEBEZIUM-Content-Length
  CHECK(recs[0].key == std::optional<std::string>("a%0D%0AX-Injected: 1"));
  CHECK_FALSE(recs[0].header("x-injected").has_value());
}

TEST_CASE("http: a retry that is due while every request place is taken waits without spinning", "[http][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = Http::topics(f);
  // One place: A's 429 asks for a second; B's answer takes three.
  Http::fault(f.topic("A"), "--status 429 --count 1 --retry-after 1");
  Http::fault(f.topic("B"), "--status 200 --count 1 --delay-ms 3000");
  Walrelay relay(Http::config(f, "sink.http.max.inflight.requests=1\nsink.http.retry.interval.ms=100\n"));
  relay.start();
  relay.wait_streaming();
  f.db().exec(insert_event(f.table, "A", "a", "jsonb_build_object('seq', 1)"));
  REQUIRE(eventually([&] { return !http_lines("attempts", f.topic("A")).empty(); }, 30s, 20ms));
  f.db().exec(insert_event(f.table, "B", "b", "jsonb_build_object('seq', 1)"));
  REQUIRE(eventually([&] { return !http_lines("attempts", f.topic("B")).empty(); }, 30s, 20ms));
  const double before = cpu_seconds(relay.pid());
  std::this_thread::sleep_for(2500ms);  // the measured window: B's answer not back, A's retry due
  const double used = cpu_seconds(relay.pid()) - before;
  INFO("walrelay's CPU over 2.5 s: " << used << " s");
  CHECK(used < 0.5);
  (void)read_settled(f, *to);
  CHECK(http_lines("read", f.topic("A")).size() == 1);
}

TEST_CASE("sqs: a queue that is not there holds the slot with QueueDoesNotExist on /readyz and dead-letters "
          "nothing - once it is made every event arrives, in order per key",
          "[sqs][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto dead = Sqs::dead_letters(f);
  Walrelay relay(Sqs::config(f, "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" + Sqs::dead_letter_topic(f) +
                                    "\nsink.sqs.retry.interval.ms=200\n"));
  relay.start();
  relay.wait_streaming();
  auto in_first = event_inside(f, "Later", "k");
  for (int i = 0; i < 3; ++i)
    f.db().exec(insert_event(f.table, "Later", "k" + std::to_string(i % 2), "jsonb_build_object('seq', " + std::to_string(i) + ")"));
  HttpResponse ready;
  REQUIRE(eventually([&] { return (ready = relay.get("/readyz")).body.find("QueueDoesNotExist") != std::string::npos; }, 30s));
  INFO(ready.body);
  CHECK(ready.status == 503);
  CHECK(ready.body.find("broker unreachable (sqs)") != std::string::npos);
  CHECK(f.db().confirmed_flush(f.slot) < in_first);
  Sqs::Destination later(f.topic_prefix, {"Later"});
  auto recs = read_settled(f, later);
  check_delivered<Sqs>(f, recs, 4);
  for (auto& r : recs) CHECK(r.topic == f.topic("Later"));
  CHECK(dead->read().empty());
  CHECK(relay.metric("walrelay_dead_lettered_total").value_or(0) == 0);
  CHECK(eventually([&] { return relay.get("/readyz").status == 200; }, 20s));
}

TEST_CASE("sqs: a message SQS refuses fails on its own - one over the size limit, one with a character SQS does "
          "not take - dead-lettered without the value its queue would refuse too, with the reason, its id and key, "
          "the others on in order - a standard queue takes every event, attributes as the headers",
          "[sqs][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  auto to = Sqs::topics(f);
  auto dead = Sqs::dead_letters(f);
  Walrelay relay(Sqs::config(f, "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" +
                                    Sqs::dead_letter_topic(f) + "\nerrors.deadletterqueue.context.headers.enable=true\n"));
  relay.start();
  relay.wait_streaming();
  // One transaction: its records go in one call, the refused one (U+FFFF, a
  // character SQS refuses in a body) in its middle, answered as that entry's
  // own failure; then one over 256 KiB, refused whole, alone.
  f.db().exec("BEGIN; " + insert_event(f.table, "Order", "a", "jsonb_build_object('seq', 1)") + "; " +
              insert_event(f.table, "Order", "b", "jsonb_build_object('seq', 2, 'bad', chr(65535))") + "; " +
              insert_event(f.table, "Order", "c", "jsonb_build_object('seq', 3)") + "; COMMIT");
  f.db().exec(insert_event(f.table, "Order", "a", "jsonb_build_object('seq', 4)"));
  f.db().exec(insert_event(f.table, "Order", "d", "jsonb_build_object('seq', 5, 'pad', repeat('x', 300000))"));
  f.db().exec(insert_event(f.table, "Order", "a", "jsonb_build_object('seq', 6)"));
  auto invalid_id = f.db().scalar("SELECT id FROM " + f.table + " WHERE payload->>'seq' = '2'");
  auto large_id = f.db().scalar("SELECT id FROM " + f.table + " WHERE payload->>'seq' = '5'");
  auto recs = read_settled(f, *to);
  std::vector<std::string> seqs;
  for (auto& r : recs) seqs.push_back(json::parse(*r.value)["seq"].dump());
  std::sort(seqs.begin(), seqs.end());
  CHECK(seqs == std::vector<std::string>{"1", "3", "4", "6"});
  check_order_per_key(recs);
  auto dead_recs = dead->read(2);
  REQUIRE(dead_recs.size() == 2);
  std::map<std::string, KafkaRecord> by_id;
  for (auto& d : dead_recs) by_id[d.header("id").value_or("")] = d;
  REQUIRE(by_id.count(invalid_id) == 1);
  REQUIRE(by_id.count(large_id) == 1);
  auto& invalid = by_id[invalid_id];
  auto& large = by_id[large_id];
  INFO(invalid.header("__connect.errors.exception.message").value_or(""));
  CHECK(invalid.key == std::optional<std::string>("b"));
  CHECK(invalid.header("walrelay.error.reason") == std::optional<std::string>("invalid_record"));
  CHECK(invalid.header("__connect.errors.exception.message").value_or("").find("SendMessageBatch") != std::string::npos);
  CHECK(large.key == std::optional<std::string>("d"));
  CHECK(large.header("walrelay.error.reason") == std::optional<std::string>("msg_size_too_large"));
  CHECK(std::stol(large.header("walrelay.value.dropped.bytes").value_or("0")) > 300000);
  CHECK(metric_at(relay, "walrelay_dead_lettered_total", 2) == 2);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);

  // A standard queue: every event, with its attributes (no order promised).
  const std::string plain = Sqs::queue_name(f.topic_prefix) + "Plain";
  auto made = Sqs::py("create --queue '" + plain + "'");
  REQUIRE(made.status == 0);
  auto cfg = Sqs::config(f);
  cfg.replace(cfg.find("${topic}.fifo"), std::string("${topic}.fifo").size(), "${topic}");
  Walrelay standard(cfg);
  standard.start();
  standard.wait_streaming();
  Writer writer(f.table, "Plain", 300, 10, 0ms);
  writer.join();
  auto got = Sqs::py("read --prefix '" + plain + "' --count 300 --timeout 60");
  auto plain_recs = records_of(got);
  std::set<std::string> ids;
  for (auto& r : plain_recs) {
    ids.insert(r.header("id").value_or(""));
    CHECK(r.key.has_value());
    CHECK(r.header("message_id") == std::nullopt);  // no deduplication id on a standard queue
  }
  CHECK(ids.size() == 300);
  Sqs::py("delete --prefix '" + plain + "'");
}

TEST_CASE("sqs: calls signed with AWS Signature V4 by the environment's credentials - an answer refusing them "
          "(InvalidClientTokenId) halts naming it, never dead-lettered, nothing confirmed past it",
          "[sqs][http][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  (void)Sqs::endpoint();  // the credentials in the environment
  // The project's HTTP receiver stands for SQS here: ElasticMQ takes any
  // signature. Its rule matches this test's queue in the body.
  const std::string queue = Sqs::queue_name(f.topic("Denied")) + ".fifo";
  Http::fault("", "--status 403 --match '" + queue + "' --reply "
                  "'{\"__type\":\"com.amazonaws.sqs#InvalidClientTokenId\",\"message\":\"The security token included "
                  "in the request is invalid.\"}'");
  auto dead = Sqs::dead_letters(f);
  Walrelay relay(without_kafka(f, "sink.type=sqs\nsink.sqs.queue.url=http://" + Http::address() +
                                      "/000000000000/${topic}.fifo\nsink.sqs.region=eu-north-1\nerrors.tolerance=all\n"
                                      "errors.deadletterqueue.topic.name=" + Sqs::dead_letter_topic(f) + "\n"));
  relay.start();
  relay.wait_streaming();
  const auto before = f.db().current_wal_lsn();
  f.db().exec(insert_event(f.table, "Denied", "a", "jsonb_build_object('seq', 1)"));
  CHECK(relay.wait_exit(60s) != 0);
  INFO(relay.log());
  CHECK(relay.log().find("answered 403 InvalidClientTokenId: The security token included in the request is invalid") !=
        std::string::npos);
  CHECK(relay.log().find("walrelay-test-secret") == std::string::npos);
  CHECK(f.db().confirmed_flush(f.slot) <= before);
  CHECK(dead->read().empty());
  // What the receiver got: the call, signed (SigV4, the region and service
  // named), the signature checked by read.py's own HMAC over what arrived.
  auto r = Http::py("attempts --prefix _root");
  REQUIRE(r.status == 0);
  auto checked = Http::py("sigv4 --prefix _root --secret walrelay-test-secret");
  REQUIRE(checked.status == 0);
  std::map<long, json> signature_of;
  std::istringstream verdicts(checked.output);
  for (std::string line; std::getline(verdicts, line);) {
    auto v = json::parse(line, nullptr, false);
    if (v.is_object()) signature_of[v["seq"].get<long>()] = v;
  }
  int seen = 0;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    auto a = json::parse(line, nullptr, false);
    if (!a.is_object() || a.value("body", "").find(queue) == std::string::npos) continue;
    ++seen;
    INFO(signature_of[a["seq"].get<long>()].dump());
    CHECK(signature_of[a["seq"].get<long>()]["ok"] == true);
    CHECK(a["status"] == 403);
    const std::string auth = a["headers"].value("Authorization", "");
    INFO(auth);
    CHECK(auth.starts_with("AWS4-HMAC-SHA256 Credential=walrelay-test/"));
    CHECK(auth.find("/eu-north-1/sqs/aws4_request") != std::string::npos);
    CHECK(auth.find("Signature=") != std::string::npos);
    CHECK(a["headers"].value("X-Amz-Target", "") == "AmazonSQS.SendMessageBatch");
    CHECK(a["headers"].value("Content-Type", "") == "application/x-amz-json-1.0");
  }
  CHECK(seen == 1);  // refused credentials halt at the first answer, never tried again
}

TEST_CASE("sqs: dead-letter copies always fit a FIFO queue - two logical messages of one transaction without an "
          "id both arrive, a value that is not UTF-8 goes in base64 - and a bytea payload that is not UTF-8 is "
          "refused before sending and dead-lettered, never a halt",
          "[sqs][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint", "text");
  auto to = Sqs::topics(f);
  auto dead = Sqs::dead_letters(f);
  const std::string prefix = f.slot;
  Walrelay relay(Sqs::config(f, "message.prefix.include.list=" + prefix + "\nerrors.tolerance=all\n"
                                "errors.deadletterqueue.topic.name=" + Sqs::dead_letter_topic(f) +
                                "\nerrors.deadletterqueue.context.headers.enable=true\n"));
  relay.start();
  relay.wait_streaming();
  // Adversarial review: two copies without an event id shared one
  // deduplication id, and SQS dropped the second as a repeat.
  f.db().exec("BEGIN; SELECT pg_logical_emit_message(true, '" + prefix + "', 'not json one'); "
              "SELECT pg_logical_emit_message(true, '" + prefix + "', 'not json two'); "
              "SELECT pg_logical_emit_message(true, '" + prefix + "', convert_to('not utf8 ', 'UTF8') || '\\xff'::bytea); COMMIT");
  // A text payload that is not JSON goes as a JSON string (valid UTF-8): this
  // one is the good event after them.
  f.db().exec(insert_event(f.table, "Order", "k", "'{\"seq\": 1}'"));
  auto recs = read_settled(f, *to);
  REQUIRE(recs.size() == 1);
  auto dead_recs = dead->read(3);
  INFO(dead_recs.size());
  REQUIRE(dead_recs.size() == 3);
  std::set<std::string> bodies;
  for (auto& d : dead_recs) {
    CHECK(d.header("walrelay.error.reason") == std::optional<std::string>("bad_content"));
    bodies.insert(d.header("walrelay.value.base64") ? "base64:" + *d.value : *d.value);
  }
  CHECK(bodies.count("not json one") == 1);
  CHECK(bodies.count("not json two") == 1);
  CHECK(bodies.count("base64:bm90IHV0Zjgg/w==") == 1);
  CHECK(metric_at(relay, "walrelay_dead_lettered_total", 3) == 3);
  CHECK(relay.running());

  // A value SQS cannot take as a body: the record's own failure, its copy
  // in base64 (the review saw the copy refused in turn, and a halt).
  Fixture g;
  create_outbox(g.db(), g.table, "bigint", "bytea");
  auto g_to = Sqs::topics(g);
  auto g_dead = Sqs::dead_letters(g);
  Walrelay binary(Sqs::config(g, "errors.tolerance=all\nerrors.deadletterqueue.topic.name=" + Sqs::dead_letter_topic(g) +
                                     "\nerrors.deadletterqueue.context.headers.enable=true\n"));
  binary.start();
  binary.wait_streaming();
  g.db().exec(insert_event(g.table, "Order", "b", "'\\xff00'::bytea"));
  g.db().exec(insert_event(g.table, "Order", "b", "convert_to('{\"seq\": 2}', 'UTF8')"));
  auto g_recs = read_settled(g, *g_to);
  REQUIRE(g_recs.size() == 1);
  auto g_dead_recs = g_dead->read(1);
  REQUIRE(g_dead_recs.size() == 1);
  INFO(g_dead_recs[0].header("__connect.errors.exception.message").value_or(""));
  CHECK(g_dead_recs[0].header("walrelay.error.reason") == std::optional<std::string>("invalid_record"));
  CHECK(g_dead_recs[0].header("__connect.errors.exception.message").value_or("").find("not UTF-8") != std::string::npos);
  CHECK(g_dead_recs[0].key == std::optional<std::string>("b"));
  CHECK(binary.running());
}

TEST_CASE("sqs: an answer walrelay cannot read (a SenderFault that is a string) is sent again, never a crash",
          "[sqs][http][fault]") {
  Fixture f;
  create_outbox(f.db(), f.table, "bigint");
  (void)Sqs::endpoint();
  const std::string queue = Sqs::queue_name(f.topic("Odd")) + ".fifo";
  // The adversarial review's answer: nlohmann threw in the worker thread, and
  // the process aborted at every start.
  Http::fault("", "--status 200 --match '" + queue + "' --reply '{\"Failed\":[{\"Id\":\"0\",\"Code\":\"X\",\"SenderFault\":\"true\"}]}'");
  Walrelay relay(without_kafka(f, "sink.type=sqs\nsink.sqs.queue.url=http://" + Http::address() +
                                      "/000000000000/${topic}.fifo\nsink.sqs.region=eu-north-1\n"
                                      "sink.sqs.retry.interval.ms=100\n"));
  relay.start();
  relay.wait_streaming();
  const auto before = f.db().current_wal_lsn();
  f.db().exec(insert_event(f.table, "Odd", "a", "jsonb_build_object('seq', 1)"));
  // Tried again (three calls for the one event), the process up, the slot held.
  REQUIRE(eventually([&] {
    auto r = Http::py("attempts --prefix _root");
    std::size_t n = 0;
    for (auto at = r.output.find(queue); at != std::string::npos; at = r.output.find(queue, at + 1)) ++n;
    return n >= 3;
  }, 30s));
  CHECK(relay.running());
  CHECK(f.db().confirmed_flush(f.slot) <= before);
}
