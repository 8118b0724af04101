// walrelay redrive: the records of the dead-letter topic go again to where
// they would go now, once their cause is fixed.
//
// - A row that could not be mapped is mapped again from the row image its
//   dead letter carries (walrelay.source.table, the row as JSON), under
//   today's configuration; a message likewise from its content.
// - A record the broker refused is sent again as it was (its topic from
//   __connect.errors.topic, its key, value and headers).
// - What fails again, or cannot be sent again (a value that was not kept, a
//   dead letter without context headers), is written to the dead-letter
//   topic again, with walrelay.redrive.attempts counted up.
// The consumer group's offsets are committed only past records whose new
// copy (at their topic, or back in the dead-letter topic) the broker has
// acknowledged: a redrive killed at any moment sends some again, by id, and
// loses none. It reads what the topic held when it started, and stops there.
#pragma once

#include <string>
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include "walrelay/config.hpp"
#include "walrelay/sinks/sink.hpp"

namespace walrelay {

struct RedriveOptions {
  std::string group;     // the consumer group whose offsets say what is done (default walrelay-redrive.<slot>)
  bool dry_run = false;  // count and classify, send nothing, commit nothing
};

// Returns the exit code: 0 every record sent on (or back to the dead-letter
// topic, counted), 1 could not run or interrupted, 2 bad options.
boost::asio::awaitable<int> run_redrive(boost::asio::io_context& io, const Config& config, Sink& sink,
                                        const RedriveOptions& options, const bool& stop_requested);

}  // namespace walrelay
