// walrelay: relays transactional-outbox rows from PostgreSQL's WAL to Kafka.
#include <utility>  // before Boost 1.74 asio: its awaitable.hpp needs std::exchange
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/program_options.hpp>
#include <librdkafka/rdkafka.h>
#include <libpq-fe.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <pthread.h>
#include <cstdlib>
#include <iostream>

#include "walrelay/admin/admin_server.hpp"
#include "walrelay/source/catalog.hpp"
#include "walrelay/config.hpp"
#include "walrelay/sinks/kafka/kafka_sink.hpp"
#include "walrelay/sinks/sink_table.hpp"
#include "walrelay/logging.hpp"
#include "walrelay/admin/metrics.hpp"
#include "walrelay/mutation.hpp"
#include "walrelay/relay/relay.hpp"
#include "walrelay/commands/ctl.hpp"
#include "walrelay/commands/redrive.hpp"
#include "walrelay/commands/replay.hpp"
#include "walrelay/commands/replay_job.hpp"
#include "walrelay/route/schema_registry.hpp"
#include "walrelay/json.hpp"
#include <nlohmann/json.hpp>
#include <boost/asio/steady_timer.hpp>

extern char** environ;

namespace po = boost::program_options;
namespace asio = boost::asio;
using namespace walrelay;

namespace {

// The configuration file (--config, else $WALRELAY_CONFIG) with the
// WALRELAY_* variables over it; throws ConfigError.
Config load_config_from_environment(std::string path) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  if (path.empty())
    for (auto& kv : env)
      if (kv.rfind("WALRELAY_CONFIG=", 0) == 0) path = kv.substr(16);
  return load_config(path, env);
}

// The same, or nullopt after saying what is wrong.
std::optional<Config> read_config(std::string path, const std::string& who) {
  try {
    return load_config_from_environment(std::move(path));
  } catch (const ConfigError& e) {
    std::cerr << who << ": configuration error: " << e.what() << "\n";
    return std::nullopt;
  }
}

// Parses a command line (walrelay's, or an operator's command's, `who` in
// its messages); an exit code when it is done (--help, or a bad option),
// nullopt to go on.
std::optional<int> parse_command(int argc, char** argv, const po::options_description& options, const char* who,
                                 const char* exit_codes, po::variables_map& vm) {
  try {
    po::store(po::parse_command_line(argc, argv, options), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << who << ": " << e.what() << "\n" << options << "\n";
    return exit_config;
  }
  if (vm.count("help")) {
    std::cout << options << "\nExit codes: " << exit_codes << "\n";
    return exit_ok;
  }
  return std::nullopt;
}

// The configuration of an operator's command (replay, redrive): the relay's
// file, logging set up, and at least once whatever the relay runs with: a
// second transactional producer under the relay's transactional.id would
// fence the running walrelay.
std::optional<Config> command_config(std::string path, const char* command) {
  auto read = read_config(std::move(path), std::string("walrelay ") + command);
  if (!read) return std::nullopt;
  Config& config = *read;
  setup_logging(config.log_level, config.log_format);
  if (config.exactly_once) {
    spdlog::info("{}: exactly.once.support=required is for the relay; {} sends at least once, outside its Kafka "
                 "transactions, so that the running walrelay is not fenced",
                 command, command);
    config.exactly_once = false;
  }
  return read;
}

// Runs an operator's command on a loop of its own with the configured sink;
// SIGINT or SIGTERM sets the flag it watches.
int run_command_job(const Config& config,
                    const std::function<asio::awaitable<int>(asio::io_context&, Sink&, const bool&)>& job) {
  asio::io_context io(1);
  std::unique_ptr<Sink> sink;
  try {
    sink = make_sink(io, config);
  } catch (const ConfigError& e) {
    spdlog::critical("configuration error: {}", e.what());
    return exit_config;
  }
  bool stop = false;
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int) {
    if (!ec) stop = true;
  });
  int code = exit_failure;
  asio::co_spawn(io, job(io, *sink, stop), [&](std::exception_ptr e, int result) {
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        spdlog::critical("{}", ex.what());
      }
    } else {
      code = result;
    }
    signals.cancel();
    io.stop();
  });
  io.run();
  return code;
}

// walrelay replay ...: the rows an outbox table keeps, sent again (replay.hpp).
int replay_main(int argc, char** argv) {
  po::options_description options("walrelay replay: sends again the rows an outbox table keeps, with their id header, "
                                  "beside a running walrelay\n\nUsage: walrelay replay --config FILE [--table T] "
                                  "(--where COND | --from-id A --to-id B | --since T1 --until T2) [--yes]\n\nOptions");
  ReplayOptions o;
  std::string path;
  options.add_options()
      ("config,c", po::value<std::string>(&path), "walrelay's configuration file (the sink, the mapping, the database)")
      ("table", po::value<std::string>(&o.table), "the outbox table (schema.table of table.include.list; optional when it lists one)")
      ("where", po::value<std::string>(&o.where), "an SQL condition on the table's rows")
      ("from-id", po::value<std::string>(&o.from_id), "the first id (table.field.event.id), inclusive")
      ("to-id", po::value<std::string>(&o.to_id), "the last id, inclusive")
      ("since", po::value<std::string>(&o.since), "rows whose time is at or after this (a timestamp PostgreSQL reads)")
      ("until", po::value<std::string>(&o.until), "rows whose time is before this")
      ("time-column", po::value<std::string>(&o.time_column), "the column --since and --until compare (default table.field.event.timestamp)")
      ("confirm-above", po::value<std::uint64_t>(&o.confirm_above)->default_value(1000), "ask before sending more rows than this")
      ("yes,y", "send without asking")
      ("dry-run", "count the rows and send nothing")
      ("help,h", "print this help and exit");
  po::variables_map vm;
  if (auto done = parse_command(argc, argv, options, "walrelay replay",
                                "0 every row sent and acknowledged, 1 not confirmed or interrupted, 2 bad options or "
                                "condition, 3 rows that could not be mapped or delivered",
                                vm))
    return *done;
  o.yes = vm.count("yes") > 0;
  o.dry_run = vm.count("dry-run") > 0;
  o.may_ask = true;
  o.quote_server_errors = true;
  auto config = command_config(path, "replay");
  if (!config) return exit_config;
  return run_command_job(*config, [&](asio::io_context& io, Sink& sink, const bool& stop) {
    return run_replay(io, *config, sink, o, stop);
  });
}

// walrelay redrive ...: the dead-letter topic's records sent on again (redrive.hpp).
int redrive_main(int argc, char** argv) {
  po::options_description options("walrelay redrive: sends the records of the dead-letter topic again to where they "
                                  "would go now\n\nUsage: walrelay redrive --config FILE [--group G] [--dry-run]\n\n"
                                  "Options");
  RedriveOptions o;
  std::string path;
  options.add_options()
      ("config,c", po::value<std::string>(&path), "walrelay's configuration file (the dead-letter topic, the mapping)")
      ("group", po::value<std::string>(&o.group), "the consumer group that records what is done (default walrelay-redrive.<slot.name>)")
      ("dry-run", "list what would be sent again; send and commit nothing")
      ("help,h", "print this help and exit");
  po::variables_map vm;
  if (auto done = parse_command(argc, argv, options, "walrelay redrive",
                                "0 every record sent on or back to the dead-letter topic, 1 could not run or "
                                "interrupted, 2 bad options, 3 stopped on a record that could not be sent",
                                vm))
    return *done;
  o.dry_run = vm.count("dry-run") > 0;
  auto config = command_config(path, "redrive");
  if (!config) return exit_config;
  if (config->sink_type != "kafka") {
    spdlog::critical("redrive: sink.type={}: redrive reads a Kafka dead-letter topic; the {} sink's dead letters are "
                     "read with the broker's own tools",
                     config->sink_type, config->sink_type);
    return exit_config;
  }
  return run_command_job(*config, [&](asio::io_context& io, Sink& sink, const bool& stop) {
    return run_redrive(io, *config, sink, o, stop);
  });
}

// walrelay ctl ...: an operator's request to a running walrelay (ctl.hpp).
int ctl_main(int argc, char** argv) {
  po::options_description options("walrelay ctl: asks a running walrelay's admin endpoint for its status, or to pause, "
                                  "resume or restart\n\nUsage: walrelay ctl [--config FILE | --url URL] "
                                  "status|pause|resume|restart\n\nThe token: $WALRELAY_CTL_TOKEN, else the "
                                  "file's admin.control.token (pause, resume, restart) or admin.token (status)\n\n"
                                  "Options");
  CtlOptions o;
  std::string path;
  options.add_options()
      ("config,c", po::value<std::string>(&path), "walrelay's configuration file (admin.listen and the tokens)")
      ("url", po::value<std::string>(&o.url), "the admin endpoint, e.g. http://127.0.0.1:8080 (default: admin.listen)")
      ("action", po::value<std::string>(&o.action), "status, pause, resume or restart")
      ("help,h", "print this help and exit");
  po::positional_options_description positional;
  positional.add("action", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(options).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "walrelay ctl: " << e.what() << "\n" << options << "\n";
    return exit_config;
  }
  if (vm.count("help") || o.action.empty()) {
    std::cout << options << "\nExit codes: 0 done (a 2xx answer), 1 refused or no answer, 2 bad options\n";
    return vm.count("help") ? exit_ok : exit_config;
  }
  if (const char* token = std::getenv("WALRELAY_CTL_TOKEN")) o.token = token;
  if (!path.empty() || (o.url.empty() && std::getenv("WALRELAY_CONFIG"))) {
    o.config = read_config(path, "walrelay ctl");
    if (!o.config) return exit_config;
  }
  return run_ctl(o);
}

// --version: walrelay's version and its libraries'.
int print_version() {
  std::cout << "walrelay " WALRELAY_VERSION " (librdkafka " << rd_kafka_version_str() << ", libpq "
            << PQlibVersion() / 10000 << ")";
  if (mutation::compiled_in) std::cout << " MUTATION TESTING: " << mutation::name(mutation::selected());
  std::cout << "\n";
  return exit_ok;
}

// --list-metrics: the families as the running daemon registers them
// (docs/operations.md's table is checked against this by
// tests/deploy/test_metrics_table.sh).
int list_metrics() {
  Metrics metrics;
  for (auto& family : metrics.describe()) {
    std::string labels;
    for (auto& l : family.labels) labels += (labels.empty() ? "" : ",") + l;
    std::cout << family.name << '\t' << family.type << '\t' << (labels.empty() ? "-" : labels) << '\t'
              << family.help << '\n';
  }
  return exit_ok;
}

// --check: the configuration, the database, the broker and the registry
// checked, each problem printed; 0 when there is none.
int check(asio::io_context& io, const Config& config, Sink& sink) {
  int code = exit_ok;
  asio::co_spawn(io, check_setup(io, config, sink), [&](std::exception_ptr e, CheckReport report) {
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        report.problems.push_back(ex.what());
      }
    }
    if (config.registry.format != RegistryFormat::none) {
      try {
        SchemaEncoder::check(config, "");
        report.notes.push_back("the schema registry answers (" + redact_url(config.registry.urls.front()) +
                               "); each subject's schema is fetched at its first record");
      } catch (const std::exception& ex) {
        report.problems.push_back(std::string("value.converter.schema.registry.url: ") + ex.what());
      }
    }
    for (auto& n : report.notes) std::cout << "note: " << n << "\n";
    for (auto& p : report.problems) std::cout << "problem: " << p << "\n";
    if (report.problems.empty()) std::cout << "ok: configuration, database and broker checked\n";
    code = report.problems.empty() ? exit_ok : exit_failure;
    io.stop();
  });
  io.run();
  return code;
}

// --reset-offsets: exactly once, the position committed in
// offsets.storage.topic forgotten (after a restore or a failover).
int reset_offsets(asio::io_context& io, const Config& config, Sink& sink) {
  if (!config.exactly_once) {
    spdlog::critical("--reset-offsets: there is no committed position without exactly.once.support=required");
    return exit_config;
  }
  int code = exit_failure;
  // exactly.once.support=required holds only with the Kafka sink (config.cpp).
  asio::co_spawn(io, static_cast<KafkaSink&>(sink).forget_position(), [&](std::exception_ptr e, std::optional<CommittedPosition> p) {
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        spdlog::critical("--reset-offsets: {}", ex.what());
      }
    } else {
      if (p)
        spdlog::warn("--reset-offsets: forgot the position {} (system identifier {}, timeline {}) committed for {} "
                     "in {}; the next start sends every event from the slot's confirmed position on",
                     p->end_lsn.to_string(), p->system, p->timeline, config.transactional_id(),
                     config.offsets_topic);
      else
        spdlog::info("--reset-offsets: no position committed for {} in {}: nothing to forget",
                     config.transactional_id(), config.offsets_topic);
      code = exit_ok;
    }
    io.stop();
  });
  io.run();
  return code;
}

// --reset-slot: the replication slot made anew when missing or invalidated.
int reset_slot_once(asio::io_context& io, const Config& config) {
  int code = exit_failure;
  asio::co_spawn(io, reset_slot(io, config), [&](std::exception_ptr e, int result) {
    if (!e) code = result;
    io.stop();
  });
  io.run();
  return code;
}

// The operator's control (POST /pause, /resume, /restart) over the relay of
// the daemon's current generation. A restart reads the configuration file
// again first: one that does not load is refused, and the relay runs on.
class DaemonControl final : public RelayControl {
 public:
  DaemonControl(asio::io_context& io, Relay& relay, ReplayJobs& replays, std::string config_path,
                std::optional<Config>& next)
      : relay_(relay), replays_(replays), config_path_(std::move(config_path)), next_(next), restart_timer_(io) {}

  Answer pause(const std::string& who) override {
    if (auto refused = relay_.pause(who)) return answer(409, *refused);
    return answer(202, "pausing: no WAL is read once the transaction being read ends (GET /status)");
  }
  Answer resume(const std::string& who) override {
    if (auto refused = relay_.resume(who)) return answer(409, *refused);
    return answer(202, "resuming (GET /status)");
  }
  Answer restart(const std::string& who, bool only_failed) override {
    if (only_failed && !relay_.failed()) return answer(204, "");
    if (auto refused = relay_.restart_refused()) return answer(409, "not restarted: " + *refused);
    try {
      next_ = load_config_from_environment(config_path_);
    } catch (const ConfigError& e) {
      return answer(409, std::string("not restarted: the configuration does not load: ") + e.what());
    }
    // A moment first, so that this answer is written before the loop ends.
    restart_timer_.expires_after(std::chrono::milliseconds(100));
    restart_timer_.async_wait([this, who](const boost::system::error_code& ec) {
      if (ec || relay_.restart_refused()) return;  // halted on a lost slot meanwhile
      replays_.request_stop();  // a POST /replay under way ends as at a stop
      relay_.request_restart(who);
    });
    return answer(202, "restarting: this session ends, a new one starts with the configuration read again "
                       "(GET /status)");
  }

 private:
  static Answer answer(unsigned status, const std::string& message) {
    if (status == 204) return {status, ""};
    Json doc = Json::object();
    doc[status < 300 ? "message" : "error"] = message;
    return {status, to_json_text(doc) + "\n"};
  }

  Relay& relay_;
  ReplayJobs& replays_;
  std::string config_path_;       // read again by a restart
  std::optional<Config>& next_;   // the configuration the restart read
  asio::steady_timer restart_timer_;
};

// How a generation of the daemon ended: the process's exit code, or the
// configuration of the next generation (POST /restart) with the pause.
struct GenerationEnd {
  int exit_code = exit_ok;
  std::optional<Config> next;
  Relay::PauseRequest pause;
  int listener = -1;      // the admin endpoint's socket, for the next generation
  std::string listen;     // the admin.listen it is bound for
  bool started = false;   // the relay ran (false: the configuration could not be built into one)
};

GenerationEnd ended(int exit_code) {
  GenerationEnd end;
  end.exit_code = exit_code;
  return end;
}

// SIGINT and SIGTERM held between two generations, so that one sent then
// reaches the next generation's handler instead of killing the process.
void hold_stop_signals(bool hold) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(hold ? SIG_BLOCK : SIG_UNBLOCK, &set, nullptr);
}

// The admin endpoint's options from the configuration.
AdminOptions admin_options(const Config& config) {
  AdminOptions o;
  o.listen = config.admin_listen;
  o.token = config.admin_token;
  o.replay_token = config.admin_replay_token;
  o.control_token = config.admin_control_token;
  o.connector_name = config.slot_name;
  return o;
}

// One generation of the daemon: its loop, sink, relay and admin endpoint,
// built from `config`, until a signal or a halt ends the process or POST
// /restart asks for the next generation.
GenerationEnd run_generation(const Config& config, const std::string& config_path, const GenerationEnd& before) {
  spdlog::info("walrelay {} starting: slot={} publication={} tables={}", WALRELAY_VERSION, config.slot_name,
               config.publication_name, [&] {
                 std::string t;
                 for (auto& n : config.table_include_list) t += (t.empty() ? "" : ",") + n.qualified();
                 return t;
               }());
  asio::io_context io(1);
  Metrics metrics(config.slot_name);
  std::unique_ptr<Sink> sink;
  try {
    sink = make_sink(io, config);
  } catch (const ConfigError& e) {
    spdlog::critical("configuration error: {}", e.what());
    GenerationEnd failed = ended(exit_config);
    failed.pause = before.pause;        // what the generation before handed on, for the one after
    failed.listener = before.listener;  // unused: the next generation takes it
    failed.listen = before.listen;
    return failed;
  }
  Relay relay(io, config, metrics, *sink);
  relay.carry_pause(before.pause);
  ReplayJobs replays(io, config, metrics);  // POST /replay
  GenerationEnd end;
  DaemonControl control(io, relay, replays, config_path, end.next);
  AdminOptions options = admin_options(config);
  options.inherited_listener = before.listener;
  options.inherited_listen = before.listen;
  AdminServer admin(io, options, relay, metrics);
  admin.set_replay(&replays);
  admin.set_control(&control);
  try {
    admin.start();
  } catch (const std::exception& e) {
    spdlog::critical("admin.listen: could not listen on {}: {}", config.admin_listen, e.what());
    GenerationEnd failed = ended(exit_failure);
    failed.pause = before.pause;
    failed.listener = before.listener;  // not taken: the generation after takes it
    failed.listen = before.listen;
    return failed;
  }
  spdlog::info("admin endpoint on {} (port {})", config.admin_listen, admin.port());

  asio::signal_set signals(io, SIGINT, SIGTERM);
  int signalled = 0;  // a signal ends the process, even during a restart's drain
  std::function<void(const boost::system::error_code&, int)> on_signal = [&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    spdlog::info("signal {} received", sig);
    relay.request_stop();
    replays.request_stop();
    signals.async_wait(on_signal);  // a second signal while draining: leave at once
    if (++signalled > 1) {
      spdlog::warn("second signal: exiting without waiting for in-flight records");
      std::_Exit(exit_failure);
    }
  };
  signals.async_wait(on_signal);
  hold_stop_signals(false);
  end.started = true;
  relay.start();
  io.run();
  hold_stop_signals(true);
  end.exit_code = relay.exit_code();
  end.pause = relay.pause_request();
  if (relay.restart_requested() && signalled == 0) {
    end.listener = admin.release_listener();
    end.listen = config.admin_listen;
  } else {
    end.next.reset();
    admin.stop();
  }
  return end;
}

// The daemon: generations of the relay and its admin endpoint, one after
// the other while POST /restart asks for the next, until a signal or a halt
// ends the process.
int run_daemon(const std::string& config_path, Config config) {
  GenerationEnd end;
  std::optional<Config> last_good;  // the configuration of the generation before, for a restart that cannot start
  hold_stop_signals(true);
  while (true) {
    const bool restarting = last_good.has_value();
    end = run_generation(config, config_path, end);
    if (!end.started && restarting) {
      // The file loaded, but its sink or endpoint could not be built: the
      // configuration that ran goes on rather than leave nothing running.
      spdlog::critical("the configuration read for the restart could not start (above); running the previous one "
                       "again: fix the file, then restart again");
      config = std::move(*last_good);
      last_good.reset();
      continue;
    }
    if (!end.next) return end.exit_code;
    last_good = config;
    config = std::move(*end.next);
    end.next.reset();
    setup_logging(config.log_level, config.log_format);
    for (auto& w : config_warnings(config)) spdlog::warn("{}", w);
    spdlog::info("restarting with the configuration read again");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "replay") return replay_main(argc - 1, argv + 1);
  if (argc > 1 && std::string_view(argv[1]) == "redrive") return redrive_main(argc - 1, argv + 1);
  if (argc > 1 && std::string_view(argv[1]) == "ctl") return ctl_main(argc - 1, argv + 1);
  po::options_description options("walrelay " WALRELAY_VERSION
                                   ": relays transactional-outbox rows from PostgreSQL's WAL to Kafka\n\n"
                                   "Usage: walrelay --config FILE [--check]\n"
                                   "       walrelay replay --config FILE --where COND ... (walrelay replay --help)\n"
                                   "       walrelay redrive --config FILE (walrelay redrive --help)\n"
                                   "       walrelay ctl --config FILE status|pause|resume|restart (walrelay ctl --help)\n\n"
                                   "Options");
  options.add_options()
      ("config,c", po::value<std::string>(), "configuration file (key=value); WALRELAY_* variables override it")
      ("check", "validate the configuration and connectivity (server, slot, publication, tables, broker), then exit 0 or 1")
      ("reset-slot", "create the replication slot anew when it is missing or invalidated, accepting that the events "
                     "since its last confirmed position are not relayed; logs the skipped LSN range, then exits")
      ("reset-offsets", "exactly once: forget the position committed in offsets.storage.topic (after a restore or a "
                        "failover that rewound the database), so that the next start skips nothing; fences a running "
                        "walrelay with the same transactional.id, then exits")
      ("print-config", "print the effective configuration (secrets masked) and exit")
      ("list-metrics", "print every metric family walrelay exports, one a line: name, type, labels (comma-separated, "
                       "- for none) and help, tab-separated; connects nowhere, reads no configuration")
      ("version", "print the version and exit")
      ("help,h", "print this help and exit");
  po::variables_map vm;
  if (auto done = parse_command(argc, argv, options, "walrelay",
                                "0 stopped cleanly, 1 could not run, 2 invalid configuration, 3 halted on an event "
                                "that needs attention",
                                vm))
    return *done;
  if (vm.count("version")) return print_version();
  if (vm.count("list-metrics")) return list_metrics();
  if (mutation::compiled_in && mutation::selected() != mutation::Break::none)
    std::cerr << "walrelay-mutation: '" << mutation::name(mutation::selected())
              << "' is broken on purpose (tests/mutation/run.sh)\n";

  auto read = read_config(vm.count("config") ? vm["config"].as<std::string>() : "", "walrelay");
  if (!read) return exit_config;
  Config config = std::move(*read);
  if (vm.count("print-config")) {
    // A Debezium or Connect file comes out as walrelay's own, what it
    // dropped as comments.
    for (auto& n : config.notes) std::cout << "# " << n << "\n";
    std::cout << config.describe();
    return exit_ok;
  }
  setup_logging(config.log_level, config.log_format);
  for (auto& w : config_warnings(config)) spdlog::warn("{}", w);
  for (auto& n : config.notes) spdlog::info("{}", n);

  const std::string config_path = vm.count("config") ? vm["config"].as<std::string>() : "";
  if (!vm.count("check") && !vm.count("reset-offsets") && !vm.count("reset-slot"))
    return run_daemon(config_path, std::move(config));
  asio::io_context io(1);
  std::unique_ptr<Sink> sink;
  try {
    sink = make_sink(io, config);
  } catch (const ConfigError& e) {
    spdlog::critical("configuration error: {}", e.what());
    return exit_config;
  }
  if (vm.count("check")) return check(io, config, *sink);
  if (vm.count("reset-offsets")) return reset_offsets(io, config, *sink);
  return reset_slot_once(io, config);
}
