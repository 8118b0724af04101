// Reconnect delays: exponential from reconnect.backoff.ms up to
// reconnect.backoff.max.ms, each lengthened by up to a quarter at random so
// that relays cut off together do not come back in step.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>

namespace walrelay {

class Backoff {
 public:
  Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max,
          std::uint64_t seed = std::random_device{}())
      : initial_(initial), max_(std::max(initial, max)), current_(initial), rng_(seed) {}

  // The delay before the next attempt; the one after it is twice as long, up
  // to the maximum (jitter comes on top).
  std::chrono::milliseconds next() {
    auto base = current_;
    current_ = std::min(current_ * 2, max_);
    auto jitter = std::uniform_int_distribution<std::int64_t>(0, base.count() / 4)(rng_);
    return base + std::chrono::milliseconds(jitter);
  }
  // A session streamed: the next failure starts from the initial delay again.
  void reset() { current_ = initial_; }

 private:
  std::chrono::milliseconds initial_, max_, current_;
  std::mt19937_64 rng_;
};

}  // namespace walrelay
