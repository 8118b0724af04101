// Test harness for integration and fault tests: the real PostgreSQL and Kafka
// started by scripts/services.sh, walrelay run as a child process, and Kafka
// read back with kcat, a client independent of walrelay's own code.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <libpq-fe.h>
#include <sys/types.h>

namespace it {

using namespace std::chrono_literals;

// Connection facts of the services (from `scripts/services.sh env`).
struct Services {
  std::string pg_host, pg_port, pg_user, pg_database, pg_data, kafka, scripts;
  static const Services& get();
  // Runs `scripts/services.sh <args>`; throws on failure.
  static void control(const std::string& args);
  // One variable of `scripts/services.sh env` as it is now ("" when unset):
  // the standby's port appears only once it runs.
  static std::string current(const std::string& name);
  // The server's major version (14 ... 18).
  static int pg_major();
};

// A lower-case name unique to this test run: prefix_<random>.
std::string unique_name(const std::string& prefix);

// The one way tests run a shell command: its exit status (as system()
// returns it, 0 for success) and its standard output.
struct CommandResult {
  int status = -1;
  std::string output;
};
CommandResult run_command(const std::string& cmd);

// The whole file, or "" when it cannot be read.
std::string read_file(const std::string& path);

// One run of kcat against the test broker: its exit code, what it printed and
// what it said on stderr, so that a reader that failed is told apart from a
// topic with nothing in it.
struct KcatRun {
  int code = -1;  // 124: `timeout` stopped it
  std::string out, err, args;
  bool ok() const { return code == 0; }
  bool timed_out() const { return code == 124; }
  // The broker answered that the topic does not exist (yet): a legitimate
  // "nothing there", unlike a broker that did not answer.
  bool unknown_topic() const { return code == 1 && err.find("Unknown topic or partition") != std::string::npos; }
  std::string failure() const {
    return "kcat " + args + (timed_out() ? " timed out" : " exited " + std::to_string(code)) + "; its stderr:\n" +
           err.substr(0, 2000);
  }
};
KcatRun kcat(const std::string& args, int timeout_s);

// A plain libpq connection for test set-up and server-side truth.
class Db {
 public:
  // The services' database, or `dbname` on the same server (or the server
  // at `port`, e.g. the standby); UTF-8 always.
  explicit Db(const std::string& dbname = "", const std::string& port = "");
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;
  // Runs SQL (several statements allowed); throws with the server's message.
  std::vector<std::vector<std::optional<std::string>>> exec(const std::string& sql);
  // First column of the first row, or "" when none / NULL.
  std::string scalar(const std::string& sql);
  // The slot's confirmed_flush_lsn as a number (0 when absent).
  std::uint64_t confirmed_flush(const std::string& slot);
  std::uint64_t current_wal_lsn();
  // The walsender streaming the slot (0 when none) and, from
  // pg_stat_replication, how far it has sent (0 when not streaming).
  int walsender_pid(const std::string& slot);
  std::uint64_t sent_lsn(const std::string& slot);

 private:
  PGconn* conn_;
};

std::uint64_t parse_lsn(const std::string& text);

struct KafkaRecord {
  std::string topic;
  int partition = -1;
  std::int64_t offset = -1;
  std::int64_t timestamp_ms = 0;
  std::optional<std::string> key;
  std::optional<std::string> value;
  std::vector<std::pair<std::string, std::string>> headers;
  std::optional<std::string> header(const std::string& name) const;
};

// Reads a topic from the beginning with kcat until at least `expected`
// records are there or the timeout passes; returns all it read (none when the
// topic does not exist). Throws with kcat's exit and stderr when its last
// read failed: a dead reader never passes for an empty topic.
std::vector<KafkaRecord> consume(const std::string& topic, std::size_t expected,
                                 std::chrono::milliseconds timeout = 60s);
// Same, but only the payload bytes exactly as stored (binary-safe); throws likewise.
std::vector<std::optional<std::string>> consume_values_raw(const std::string& topic, std::size_t expected,
                                                           std::chrono::milliseconds timeout = 60s);
// Records in `topic` now (0 when the broker says it does not exist yet), read
// in full with kcat; throws with kcat's exit and stderr when kcat fails.
std::size_t count_records(const std::string& topic);
// True once one record of `topic` can be read (the topic exists and has a
// leader); false when none came in time; throws when kcat failed otherwise.
bool wait_first_record(const std::string& topic, std::chrono::milliseconds timeout = 60s);
// consume(), once the topic can be read: kcat's consumer can hang for good
// when it starts while the broker is still creating the topic.
std::vector<KafkaRecord> read_topic(const std::string& topic, std::size_t expected,
                                    std::chrono::milliseconds timeout = 60s);

// Creates `topic` with these topic configs (max.message.bytes ...), or, when
// it exists, sets them on it (AlterConfigs: its other configs go back to the
// broker's defaults). Through librdkafka's admin API; throws on failure.
void configure_topic(const std::string& topic, int partitions, const std::map<std::string, std::string>& configs);

// Produces one plain (not transactional) record with this timestamp (0:
// now) and waits for its acknowledgement; throws on failure.
void produce_record(const std::string& topic, const std::string& key, const std::string& value,
                    std::int64_t timestamp_ms = 0, const std::vector<std::pair<std::string, std::string>>& headers = {});

// Sum of every sample of a Prometheus metric in an exposition (all label
// sets; `name` may carry a full label set, e.g. name{reason="x"}); nullopt
// when absent, so that a missing metric never passes for zero.
std::optional<double> metric_value(const std::string& exposition, const std::string& name);

// Polls cond until true or timeout; true if it became true.
bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds timeout,
                std::chrono::milliseconds every = 50ms);

struct HttpResponse {
  int status = 0;
  std::string body;
};
HttpResponse http_get(int port, const std::string& path, const std::string& bearer = {});
// Any method, with an empty body (POST /pause and the like).
HttpResponse http_request(int port, const std::string& method, const std::string& path, const std::string& bearer = {});

// walrelay as a child process with its own configuration file and log. The
// binary is the build's, or $WALRELAY_TEST_BINARY (the mutation runs point it
// at a deliberately broken build).
class Walrelay {
 public:
  // config: key=value lines added after the harness's own (database, kafka,
  // admin.listen=127.0.0.1:0, log.level=debug). env: extra environment.
  explicit Walrelay(const std::string& config, std::map<std::string, std::string> env = {});
  ~Walrelay();
  Walrelay(const Walrelay&) = delete;
  Walrelay& operator=(const Walrelay&) = delete;

  void start();
  // Starts walrelay with these arguments instead of --config <config_path()>.
  void start(const std::vector<std::string>& args);
  // start(args), then waits for the exit: its code, or -1 if it did not exit in time.
  int run(const std::vector<std::string>& args, std::chrono::milliseconds timeout = 60s);
  bool running();
  void signal(int sig);
  // Waits for exit; the exit code, or -1 on timeout, 128+N if killed by signal N.
  int wait_exit(std::chrono::milliseconds timeout = 60s);
  // Waits until the log says "streaming:" (START_REPLICATION accepted).
  void wait_streaming(std::chrono::milliseconds timeout = 30s);
  std::string log() const;           // everything, all runs
  std::string this_run_log() const;  // since the last start()
  int admin_port();
  HttpResponse get(const std::string& path, const std::string& bearer = {});
  HttpResponse request(const std::string& method, const std::string& path, const std::string& bearer = {});
  // metric_value() of this process's /metrics; nullopt when the metric is
  // absent; throws when the endpoint does not answer (or not with 200).
  std::optional<double> metric(const std::string& name, const std::string& bearer = {});
  const std::string& config_path() const { return config_path_; }
  pid_t pid() const { return pid_; }

 private:
  std::string dir_, config_path_, log_path_;
  std::map<std::string, std::string> env_;
  pid_t pid_ = -1;
  int exit_code_ = -1;
  int admin_port_ = 0;
  std::size_t log_offset_ = 0;
};

// The harness's base configuration for a walrelay on the test services.
std::string base_config(const std::string& slot);

// Creates an outbox table with Debezium's default columns.
void create_outbox(Db& db, const std::string& table, const std::string& id_type = "uuid",
                   const std::string& payload_type = "jsonb");

}  // namespace it
