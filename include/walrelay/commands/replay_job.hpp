// POST /replay: `walrelay replay` run by the daemon itself, on its loop, for
// operators who reach walrelay through its admin endpoint rather than a
// shell beside it. One replay at a time; GET /replay shows the current or
// last one. The admin server allows the POST only with admin.replay.token.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>

#include "walrelay/admin/admin_server.hpp"
#include "walrelay/config.hpp"
#include "walrelay/admin/metrics.hpp"
#include "walrelay/commands/replay.hpp"
#include "walrelay/sinks/sink.hpp"

namespace walrelay {

// The request body's options, or std::invalid_argument naming the member
// that is wrong. Members: table, where, from_id, to_id, since, until,
// time_column (strings; ids may be numbers), confirm_above (a number), yes,
// dry_run (booleans).
ReplayOptions parse_replay_request(std::string_view body);

class ReplayJobs : public ReplayControl {
 public:
  // `config` is the relay's; replays send at least once with a producer of
  // their own (a second transactional producer would fence the relay's).
  ReplayJobs(boost::asio::io_context& io, Config config, Metrics& metrics);
  ~ReplayJobs() override;
  ReplayJobs(const ReplayJobs&) = delete;
  ReplayJobs& operator=(const ReplayJobs&) = delete;

  Answer start(std::string_view request_body) override;
  std::string status_json() const override;
  // The daemon is stopping: the running replay stops sending and settles.
  void request_stop();

 private:
  enum class State { running, done, failed, refused, interrupted };
  static const char* to_string(State s);

  boost::asio::io_context& io_;
  Config config_;
  Metrics& metrics_;
  // Made at the first replay and kept: a sink may have handlers queued on
  // the loop, so it is never destroyed while the loop runs.
  std::unique_ptr<Sink> sink_;
  bool stop_ = false;                 // run_replay watches it
  bool has_job_ = false;              // a replay was started
  State state_ = State::done;
  int exit_code_ = 0;
  std::uint64_t job_number_ = 0;
  ReplayOptions options_;
  ReplayProgress progress_;
  std::chrono::system_clock::time_point started_at_;
  std::optional<std::chrono::steady_clock::time_point> finished_;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace walrelay
