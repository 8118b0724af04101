// A Relay in the test's process, with a sink of the test's choosing, on its
// own loop thread as main() runs it; its state read on that loop.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <functional>
#include <future>
#include <memory>
#include <thread>

#include "test_util.hpp"
#include "walrelay/config.hpp"
#include "walrelay/admin/metrics.hpp"
#include "walrelay/relay/relay.hpp"

namespace it {

template <class SinkT>
struct InProcessRelay {
  using MakeSink = std::function<std::unique_ptr<SinkT>(boost::asio::io_context&, const walrelay::Config&)>;
  InProcessRelay(walrelay::Config c, const MakeSink& make)
      : config(exit_on_halt(std::move(c))), sink(make(io, config)), relay(io, config, metrics, *sink) {
    relay.start();
    loop = std::thread([this] { io.run(); });
  }
  ~InProcessRelay() { stop(); }
  // halt.action=exit unless the configuration names it, as the harness does
  // for a walrelay process: these tests see a halt as the loop stopping.
  static walrelay::Config exit_on_halt(walrelay::Config c) {
    if (!c.origin.count("halt.action")) c.halt_action = walrelay::HaltAction::exit;
    return c;
  }
  InProcessRelay(const InProcessRelay&) = delete;
  InProcessRelay& operator=(const InProcessRelay&) = delete;

  // The relay's status, read on its loop.
  walrelay::StatusSnapshot status() {
    std::promise<walrelay::StatusSnapshot> p;
    boost::asio::post(io, [&] { p.set_value(relay.status()); });
    auto f = p.get_future();
    REQUIRE(f.wait_for(10s) == std::future_status::ready);
    return f.get();
  }
  // SIGTERM's path: drain (up to shutdown.timeout.ms), final status, stop.
  int stop() {
    if (loop.joinable()) {
      boost::asio::post(io, [this] { relay.request_stop(); });
      loop.join();
    }
    return relay.exit_code();
  }
  // Waits for `n` more standby status updates than now: what the relay
  // confirms after a change has then reached the server.
  void wait_status_updates(int n) {
    double from = metrics.status_updates.Value();
    REQUIRE(eventually([&] { return metrics.status_updates.Value() >= from + n; }, 10s, 10ms));
  }
  // Waits for `n` more status updates, or until `done` holds: a relay that
  // has settled everything goes quiet (nothing more to confirm) and sends none.
  void wait_status_updates_or(int n, const std::function<bool()>& done) {
    double from = metrics.status_updates.Value();
    REQUIRE(eventually([&] { return metrics.status_updates.Value() >= from + n || done(); }, 10s, 10ms));
  }
  // Whether, within `within`, a whole `quiet` went by without a status
  // update: the relay is idle, its updates would only repeat the last one.
  bool wait_status_updates_quiet(std::chrono::milliseconds quiet, std::chrono::milliseconds within) {
    double last = metrics.status_updates.Value();
    auto since = std::chrono::steady_clock::now();
    return eventually(
        [&] {
          double v = metrics.status_updates.Value();
          if (v != last) {
            last = v;
            since = std::chrono::steady_clock::now();
          }
          return std::chrono::steady_clock::now() - since >= quiet;
        },
        within, 10ms);
  }

  boost::asio::io_context io{1};
  walrelay::Config config;
  walrelay::Metrics metrics;
  std::unique_ptr<SinkT> sink;
  walrelay::Relay relay;
  std::thread loop;
};

}  // namespace it
