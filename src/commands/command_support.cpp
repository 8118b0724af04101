#include "walrelay/commands/command_support.hpp"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace walrelay {
namespace asio = boost::asio;
using namespace std::chrono_literals;

RowMapping::RowMapping(asio::io_context& io, const Config& config) : mapper(config) {
  if (config.registry.format != RegistryFormat::none) encoder = std::make_unique<SchemaEncoder>(io, config, metrics);
}

bool RowMapping::announce(const TableRows& rows) {
  rows.relation(writer);
  auto relation = decoder.decode(writer.bytes());
  return relation && mapper.on_relation(std::get<pgoutput::Relation>(relation.value()));
}

asio::awaitable<void> pause(asio::io_context& io, std::chrono::milliseconds duration) {
  asio::steady_timer timer(io);
  timer.expires_after(duration);
  boost::system::error_code ec;
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
}

asio::awaitable<std::optional<MapError>> encode_when_ready(asio::io_context& io, SchemaEncoder* encoder,
                                                           OutboxRecord& record, const bool& stop) {
  while (encoder && !stop) {
    MapError error;
    switch (encoder->encode(record, error)) {
      case SchemaEncoder::Status::encoded: co_return std::nullopt;
      case SchemaEncoder::Status::failed: co_return error;
      case SchemaEncoder::Status::pending: co_await pause(io, 50ms); break;
    }
  }
  co_return std::nullopt;
}

asio::awaitable<void> submit_when_taken(asio::io_context& io, Sink& sink, const OutboxRecord& record,
                                        std::uint64_t token) {
  while (sink.submit(record, token) == SubmitStatus::queue_full) {
    sink.poll();
    co_await pause(io, 5ms);
  }
}

}  // namespace walrelay
