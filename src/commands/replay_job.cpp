#include "walrelay/commands/replay_job.hpp"

#include <exception>
#include <set>
#include <stdexcept>
#include <utility>

#include <boost/asio/co_spawn.hpp>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "walrelay/exit_codes.hpp"
#include "walrelay/json.hpp"
#include "walrelay/sinks/sink_table.hpp"

namespace walrelay {
namespace asio = boost::asio;

ReplayOptions parse_replay_request(std::string_view body) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(body);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::invalid_argument(std::string("the body is not JSON: ") + e.what());
  }
  if (!doc.is_object())
    throw std::invalid_argument("the body must be a JSON object, such as {\"since\": \"2026-02-01\", \"until\": "
                                "\"2026-03-01\"}");
  ReplayOptions o;
  // Ids may come as numbers; every other text member is a string.
  auto text = [](const nlohmann::json& v, const std::string& key, bool number_ok) {
    if (v.is_string()) return v.get<std::string>();
    if (number_ok && v.is_number_integer()) return v.dump();
    throw std::invalid_argument("\"" + key + "\" must be a string" + (number_ok ? " or an integer" : ""));
  };
  auto flag = [](const nlohmann::json& v, const std::string& key) {
    if (!v.is_boolean()) throw std::invalid_argument("\"" + key + "\" must be true or false");
    return v.get<bool>();
  };
  for (auto& [key, value] : doc.items()) {
    if (key == "table") o.table = text(value, key, false);
    else if (key == "where") o.where = text(value, key, false);
    else if (key == "from_id") o.from_id = text(value, key, true);
    else if (key == "to_id") o.to_id = text(value, key, true);
    else if (key == "since") o.since = text(value, key, false);
    else if (key == "until") o.until = text(value, key, false);
    else if (key == "time_column") o.time_column = text(value, key, false);
    else if (key == "yes") o.yes = flag(value, key);
    else if (key == "dry_run") o.dry_run = flag(value, key);
    else if (key == "confirm_above") {
      if (!value.is_number_unsigned()) throw std::invalid_argument("\"confirm_above\" must be a whole number");
      o.confirm_above = value.get<std::uint64_t>();
    } else {
      throw std::invalid_argument("unknown member \"" + key +
                                  "\" (known: table, where, from_id, to_id, since, until, time_column, "
                                  "confirm_above, yes, dry_run)");
    }
  }
  return o;
}

ReplayJobs::ReplayJobs(asio::io_context& io, Config config, Metrics& metrics)
    : io_(io), config_(std::move(config)), metrics_(metrics) {
  config_.exactly_once = false;
}

ReplayJobs::~ReplayJobs() {
  if (has_job_ && state_ == State::running)
    spdlog::warn("replay: stopped with walrelay after {} of {} rows sent; the rows sent were sent at least once: "
                 "POST /replay again to send the rest",
                 progress_.rows_sent, progress_.rows_matched);
}

const char* ReplayJobs::to_string(State s) {
  switch (s) {
    case State::running: return "running";
    case State::done: return "done";
    case State::failed: return "failed";
    case State::refused: return "refused";
    case State::interrupted: return "interrupted";
  }
  return "unknown";
}

void ReplayJobs::request_stop() { stop_ = true; }

ReplayControl::Answer ReplayJobs::start(std::string_view request_body) {
  auto refuse = [](unsigned status, const std::string& why) {
    Json doc = Json::object();
    doc["error"] = why;
    return Answer{status, to_json_text(doc) + '\n'};
  };
  if (stop_) return refuse(503, "walrelay is stopping");
  if (has_job_ && state_ == State::running) return Answer{409, status_json()};
  ReplayOptions o;
  try {
    o = parse_replay_request(request_body);
    replay_table(config_, o);
    // The selection and the time column are checked here, so that a bad
    // request is a 400 rather than a failed job; run_replay builds the
    // condition again with the connection's quoting.
    auto as_is = [](const std::string& s) { return s; };
    replay_condition(config_, o, as_is, as_is);
  } catch (const std::invalid_argument& e) {
    return refuse(400, e.what());
  }
  if (!sink_) {
    try {
      sink_ = make_sink(io_, config_);
    } catch (const std::exception& e) {
      spdlog::error("replay: could not make the {} sink: {}", config_.sink_type, e.what());
      return refuse(500, std::string("could not make the sink: ") + e.what());
    }
  }
  has_job_ = true;
  state_ = State::running;
  exit_code_ = 0;
  options_ = o;
  progress_ = ReplayProgress{};
  started_at_ = std::chrono::system_clock::now();
  started_ = std::chrono::steady_clock::now();
  finished_.reset();
  const std::uint64_t job = ++job_number_;
  metrics_.replay_job_running.Set(1);
  spdlog::info("replay {}: started by POST /replay", job);
  asio::co_spawn(io_, run_replay(io_, config_, *sink_, options_, stop_, &progress_),
                 [this, job](std::exception_ptr e, int code) {
                   if (e) {
                     try {
                       std::rethrow_exception(e);
                     } catch (const std::exception& ex) {
                       spdlog::error("replay {}: stopped on an unexpected error: {}", job, ex.what());
                       progress_.refusal = ex.what();
                     }
                     code = exit_failure;
                   }
                   // run_replay has returned: nothing may reach its frame now.
                   sink_->on_delivery([](const Delivery&) {});
                   exit_code_ = code;
                   finished_ = std::chrono::steady_clock::now();
                   if (code == exit_ok) state_ = State::done;
                   else if (stop_) state_ = State::interrupted;
                   else if (!progress_.refusal.empty() && progress_.rows_sent == 0) state_ = State::refused;
                   else state_ = State::failed;
                   metrics_.replay_job_running.Set(0);
                   metrics_.replay_job_rows.Increment(static_cast<double>(progress_.rows_acknowledged));
                   spdlog::info("replay {}: {} (exit code {})", job, to_string(state_), code);
                 });
  return Answer{202, status_json()};
}

std::string ReplayJobs::status_json() const {
  Json doc = Json::object();
  if (!has_job_) {
    doc["state"] = "none";
    return to_json_text(doc) + '\n';
  }
  doc["job"] = job_number_;
  doc["state"] = to_string(state_);
  doc["table"] = progress_.table;
  doc["condition"] = progress_.condition;
  doc["dry_run"] = options_.dry_run;
  doc["rows_matched"] = progress_.counted ? Json(progress_.rows_matched) : Json(nullptr);
  doc["rows_sent"] = progress_.rows_sent;
  doc["rows_acknowledged"] = progress_.rows_acknowledged;
  doc["rows_not_delivered"] = progress_.rows_not_delivered;
  doc["rows_unmapped"] = progress_.rows_unmapped;
  doc["started_at"] = fmt::format("{:%Y-%m-%dT%H:%M:%S}Z", fmt::gmtime(std::chrono::system_clock::to_time_t(started_at_)));
  const auto end = finished_.value_or(std::chrono::steady_clock::now());
  doc["seconds"] = std::chrono::duration<double>(end - started_).count();
  doc["exit_code"] = finished_ ? Json(exit_code_) : Json(nullptr);
  doc["message"] = progress_.refusal;
  return to_json_text(doc) + '\n';
}

}  // namespace walrelay
