#include <catch2/catch.hpp>

#include <set>

#include "walrelay/backoff.hpp"

using walrelay::Backoff;
using namespace std::chrono_literals;

TEST_CASE("backoff: doubles from the initial delay to the maximum, with up to a quarter of jitter", "[backoff]") {
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    Backoff b(100ms, 1000ms, seed);
    std::chrono::milliseconds base = 100ms;
    for (int i = 0; i < 8; ++i) {
      auto d = b.next();
      INFO("seed " << seed << " attempt " << i << " delay " << d.count());
      CHECK(d >= base);
      CHECK(d <= base + base / 4);
      base = std::min(base * 2, std::chrono::milliseconds(1000));
    }
  }
}

TEST_CASE("backoff: reset starts again from the initial delay", "[backoff]") {
  Backoff b(50ms, 400ms, 7);
  for (int i = 0; i < 5; ++i) b.next();
  CHECK(b.next() >= 400ms);
  b.reset();
  auto d = b.next();
  CHECK(d >= 50ms);
  CHECK(d <= 62ms);
}

TEST_CASE("backoff: the jitter is not the same for every relay", "[backoff]") {
  std::set<long> first;
  for (std::uint64_t seed = 0; seed < 20; ++seed) first.insert(Backoff(1000ms, 1000ms, seed).next().count());
  CHECK(first.size() > 5);
}
