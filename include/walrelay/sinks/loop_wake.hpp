#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

namespace walrelay {

// A sink whose broker client runs on a thread of its own (Redis, HTTP, SQS,
// RabbitMQ) or answers in a library's callbacks (NATS) hands its outcomes to
// the event loop through a state it shares with it: `Shared` has `mu`, the
// outcomes under it, `bool wake_posted` and `Sink* sink` (cleared under mu by
// the sink's destructor). These ask the loop to run sink->poll() once; at most
// one such call waits in the loop at a time, so a burst of outcomes costs one
// wake-up, and a call that runs after the sink is gone finds nothing to do.

// With shared.mu held.
template <class Shared>
void post_poll_locked(boost::asio::io_context& io, Shared& shared, std::weak_ptr<Shared> self) {
  if (shared.wake_posted || !shared.sink) return;
  shared.wake_posted = true;
  boost::asio::post(io, [self = std::move(self)] {
    auto s = self.lock();
    if (!s) return;
    decltype(s->sink) sink = nullptr;
    {
      std::lock_guard lock(s->mu);
      s->wake_posted = false;
      sink = s->sink;
    }
    if (sink) sink->poll();
  });
}

// Moves `out` into shared->done and wakes the loop (takes shared->mu).
template <class Shared, class Done>
void hand_over(boost::asio::io_context& io, const std::shared_ptr<Shared>& shared, std::vector<Done>& out) {
  if (out.empty()) return;
  std::lock_guard lock(shared->mu);
  for (auto& d : out) shared->done.push_back(std::move(d));
  out.clear();
  post_poll_locked(io, *shared, std::weak_ptr<Shared>(shared));
}

}  // namespace walrelay
