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
#include "walrelay/commands/redrive.hpp"
#include "walrelay/commands/replay.hpp"
#include "walrelay/commands/replay_job.hpp"
#include "walrelay/route/schema_registry.hpp"

extern char** environ;

namespace po = boost::program_options;
namespace asio = boost::asio;
using namespace walrelay;

namespace {

// The configuration file (--config, else $WALRELAY_CONFIG) with the
// WALRELAY_* variables over it; nullopt after saying what is wrong.
std::optional<Config> read_config(std::string path, const std::string& who) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  if (path.empty())
    for (auto& kv : env)
      if (kv.rfind("WALRELAY_CONFIG=", 0) == 0) path = kv.substr(16);
  try {
    return load_config(path, env);
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

// The daemon: the relay and its admin endpoint, until a signal stops them.
int run_relay(asio::io_context& io, const Config& config, Metrics& metrics, Sink& sink) {
  spdlog::info("walrelay {} starting: slot={} publication={} tables={}", WALRELAY_VERSION, config.slot_name,
               config.publication_name, [&] {
                 std::string t;
                 for (auto& n : config.table_include_list) t += (t.empty() ? "" : ",") + n.qualified();
                 return t;
               }());
  Relay relay(io, config, metrics, sink);
  ReplayJobs replays(io, config, metrics);  // POST /replay
  AdminOptions admin_options;
  admin_options.listen = config.admin_listen;
  admin_options.token = config.admin_token;
  admin_options.replay_token = config.admin_replay_token;
  AdminServer admin(io, admin_options, relay, metrics);
  admin.set_replay(&replays);
  try {
    admin.start();
  } catch (const std::exception& e) {
    spdlog::critical("admin.listen: could not listen on {}: {}", config.admin_listen, e.what());
    return exit_failure;
  }
  spdlog::info("admin endpoint on {} (port {})", config.admin_listen, admin.port());

  asio::signal_set signals(io, SIGINT, SIGTERM);
  std::function<void(const boost::system::error_code&, int)> on_signal = [&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    spdlog::info("signal {} received", sig);
    relay.request_stop();
    replays.request_stop();
    signals.async_wait(on_signal);  // a second signal while draining: leave at once
    static int count = 0;
    if (++count > 1) {
      spdlog::warn("second signal: exiting without waiting for in-flight records");
      std::_Exit(exit_failure);
    }
  };
  signals.async_wait(on_signal);
  relay.start();
  io.run();
  admin.stop();
  return relay.exit_code();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "replay") return replay_main(argc - 1, argv + 1);
  if (argc > 1 && std::string_view(argv[1]) == "redrive") return redrive_main(argc - 1, argv + 1);
  po::options_description options("walrelay " WALRELAY_VERSION
                                   ": relays transactional-outbox rows from PostgreSQL's WAL to Kafka\n\n"
                                   "Usage: walrelay --config FILE [--check]\n"
                                   "       walrelay replay --config FILE --where COND ... (walrelay replay --help)\n"
                                   "       walrelay redrive --config FILE (walrelay redrive --help)\n\nOptions");
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

  asio::io_context io(1);
  Metrics metrics(config.slot_name);
  std::unique_ptr<Sink> sink;
  try {
    sink = make_sink(io, config);
  } catch (const ConfigError& e) {
    spdlog::critical("configuration error: {}", e.what());
    return exit_config;
  }
  if (vm.count("check")) return check(io, config, *sink);
  if (vm.count("reset-offsets")) return reset_offsets(io, config, *sink);
  if (vm.count("reset-slot")) return reset_slot_once(io, config);
  return run_relay(io, config, metrics, *sink);
}
