#include "walrelay/sinks/rabbitmq/rabbitmq_sink.hpp"

// rabbitmq-c 0.12 moved its headers (Debian 13 has 0.15, Debian 12 0.11).
#if __has_include(<rabbitmq-c/amqp.h>)
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/ssl_socket.h>
#include <rabbitmq-c/tcp_socket.h>
#else
#include <amqp.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#endif
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <stdexcept>

#include <boost/asio/post.hpp>

#include "walrelay/mutation.hpp"
#include "walrelay/sinks/loop_wake.hpp"

namespace walrelay {

namespace {

using Outgoing = RabbitMqSink::Outgoing;
using Outcome = RabbitMqSink::Outcome;
using Shared = RabbitMqSink::Shared;
using Clock = std::chrono::steady_clock;

constexpr amqp_channel_t channel = 1;

amqp_bytes_t bytes_of(std::string_view s) { return amqp_bytes_t{s.size(), const_cast<char*>(s.data())}; }
std::string string_of(amqp_bytes_t b) { return std::string(static_cast<const char*>(b.bytes), b.len); }

// What an RPC reply says when it is not a success.
std::string reply_error(const amqp_rpc_reply_t& r, const char* what) {
  switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      return {};
    case AMQP_RESPONSE_NONE:
      return std::string(what) + ": no reply";
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
      return std::string(what) + ": " + amqp_error_string2(r.library_error);
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        auto* m = static_cast<amqp_connection_close_t*>(r.reply.decoded);
        return std::string(what) + ": the server closed the connection: " + std::to_string(m->reply_code) + " " +
               string_of(m->reply_text);
      }
      if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        auto* m = static_cast<amqp_channel_close_t*>(r.reply.decoded);
        return std::string(what) + ": the server closed the channel: " + std::to_string(m->reply_code) + " " +
               string_of(m->reply_text);
      }
      return std::string(what) + ": server error (method " + std::to_string(r.reply.id) + ")";
  }
  return std::string(what) + ": unknown reply";
}

// The connection's thread: connects, publishes what the loop hands over,
// reads confirms and returns, and hands outcomes back.
class Connection {
 public:
  Connection(std::shared_ptr<Shared> shared, RabbitMqConfig config, boost::asio::io_context& io)
      : shared_(std::move(shared)), config_(std::move(config)), io_(io) {}

  void run() {
    auto backoff = std::chrono::milliseconds(0);
    while (!stopping()) {
      if (!conn_) {
        fail_stale();
        if (auto error = connect(); !error.empty()) {
          disconnect();
          set_state(false, error);
          backoff = std::clamp(backoff * 2, std::chrono::milliseconds(250), std::chrono::milliseconds(5000));
          std::unique_lock lock(shared_->mu);
          shared_->cv.wait_for(lock, backoff, [&] { return shared_->stop; });
          continue;
        }
        backoff = std::chrono::milliseconds(0);
        set_state(true, "");
      }
      if (auto error = turn(); !error.empty()) lose(error);
    }
    // Stopping: what is unconfirmed is reported as not delivered (the relay
    // confirms nothing past it), then the connection closes.
    fail_unconfirmed("walrelay is stopping");
    if (conn_) {
      amqp_channel_close(conn_, channel, AMQP_REPLY_SUCCESS);
      amqp_connection_close(conn_, AMQP_REPLY_SUCCESS);
    }
    disconnect();
  }

 private:
  struct Inflight {
    std::uint64_t tag;
    Clock::time_point sent;
    Outgoing record;
    bool settled = false;
  };
  struct Returned {
    std::string message_id;
    std::string text;
  };

  bool stopping() {
    std::lock_guard lock(shared_->mu);
    return shared_->stop;
  }

  void wake_loop_locked() { post_poll_locked(io_, *shared_, std::weak_ptr<Shared>(shared_)); }

  void set_state(bool connected, const std::string& error) {
    std::lock_guard lock(shared_->mu);
    if (shared_->connected == connected && shared_->error == error) return;
    shared_->connected = connected;
    shared_->error = error;
    wake_loop_locked();
  }

  void report(Outgoing record, bool ok, bool transient, std::string code, std::string message) {
    std::lock_guard lock(shared_->mu);
    report_locked(std::move(record), ok, transient, std::move(code), std::move(message));
  }
  void report_locked(Outgoing record, bool ok, bool transient, std::string code, std::string message) {
    shared_->done.push_back(Outcome{std::move(record), ok, transient, std::move(code), std::move(message)});
    wake_loop_locked();
  }

  std::string connect() {
    conn_ = amqp_new_connection();
    amqp_socket_t* socket = config_.ssl ? amqp_ssl_socket_new(conn_) : amqp_tcp_socket_new(conn_);
    if (!socket) return "could not make a socket";
    if (config_.ssl) {
      if (!config_.ssl_ca_location.empty() &&
          amqp_ssl_socket_set_cacert(socket, config_.ssl_ca_location.c_str()) != AMQP_STATUS_OK)
        return "sink.rabbitmq.connection.ssl.ca.location: could not load " + config_.ssl_ca_location;
      if (!config_.ssl_certificate_location.empty() &&
          amqp_ssl_socket_set_key(socket, config_.ssl_certificate_location.c_str(), config_.ssl_key_location.c_str()) !=
              AMQP_STATUS_OK)
        return "sink.rabbitmq.connection.ssl.certificate.location: could not load the certificate and key";
      amqp_ssl_socket_set_verify_peer(socket, 1);
      amqp_ssl_socket_set_verify_hostname(socket, 1);
    }
    timeval tv{config_.connect_timeout_ms / 1000, (config_.connect_timeout_ms % 1000) * 1000};
    const std::string where = config_.host + ":" + std::to_string(config_.port);
    if (int rc = amqp_socket_open_noblock(socket, config_.host.c_str(), config_.port, &tv); rc != AMQP_STATUS_OK)
      return "could not connect to RabbitMQ at " + where + ": " + amqp_error_string2(rc);
    auto e = reply_error(amqp_login(conn_, config_.virtual_host.c_str(), 0, 131072, config_.heartbeat_s,
                                    AMQP_SASL_METHOD_PLAIN, config_.username.c_str(), config_.password.c_str()),
                         ("RabbitMQ at " + where + ": login as " + config_.username).c_str());
    if (!e.empty()) return e;
    amqp_channel_open(conn_, channel);
    if (e = reply_error(amqp_get_rpc_reply(conn_), "RabbitMQ: channel.open"); !e.empty()) return e;
    amqp_confirm_select(conn_, channel);
    if (e = reply_error(amqp_get_rpc_reply(conn_), "RabbitMQ: confirm.select"); !e.empty()) return e;
    if (!config_.exchange.empty()) {
      // A passive declare: a missing exchange is said now, by name.
      amqp_exchange_declare(conn_, channel, bytes_of(config_.exchange), amqp_cstring_bytes("topic"), 1, 0, 0, 0,
                            amqp_empty_table);
      if (e = reply_error(amqp_get_rpc_reply(conn_), ("sink.rabbitmq.exchange " + config_.exchange).c_str());
          !e.empty())
        return e;
    }
    // rabbitmq-c writes with blocking sends: a broker that stops reading
    // (frozen, or its socket buffers full) would hold this thread, and a
    // shutdown with it, for good. A send that waits longer than a confirm
    // may is a lost connection instead.
    timeval send_timeout{config_.ack_timeout_ms / 1000, (config_.ack_timeout_ms % 1000) * 1000};
    ::setsockopt(amqp_get_sockfd(conn_), SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
    next_tag_ = 1;
    spdlog::info("rabbitmq: connected to {} (virtual host {}), publisher confirms on", where, config_.virtual_host);
    return {};
  }

  void disconnect() {
    if (conn_) amqp_destroy_connection(conn_);
    conn_ = nullptr;
  }

  // The connection is gone: every record not confirmed fails transiently
  // (the relay sends it again from the slot), and a new one is made.
  void lose(const std::string& why) {
    spdlog::warn("rabbitmq: {}; connecting again", why);
    fail_unconfirmed(why);
    disconnect();
    set_state(false, why);
  }

  // Fails, in the order they were handed over, the publishes in flight, those
  // of the batch not sent, and those still queued: one left queued would go
  // out first on the next connection, ahead of the failed ones the relay
  // sends again from the slot (per-key order). What the loop hands over
  // before it has seen these failures fails too (turn(), by `losses`).
  void fail_unconfirmed(const std::string& why) {
    std::lock_guard lock(shared_->mu);
    for (auto& f : inflight_)
      if (!f.settled) report_locked(std::move(f.record), false, true, "connection_lost", why);
    inflight_.clear();
    returned_.clear();
    for (auto& out : batch_) report_locked(std::move(out), false, true, "connection_lost", why);
    batch_.clear();
    // The queued ones left to go out first on the next connection, as
    // before 5d34acd.
    if (mutation::active(mutation::Break::rabbitmq_keep_queued)) return;
    for (auto& out : shared_->to_send)
      report_locked(std::move(out), false, true, "connection_lost", why + " (it was queued behind a failed one)");
    shared_->to_send.clear();
    ++shared_->losses;
  }

  // What the loop handed over before it saw the last loss's failures (a
  // prefix of the queue: the stamps only grow) may not be sent, and neither
  // may anything queued behind it, which the loop handed over before it
  // could know of this failure: all of it fails, in order, and counts as a
  // loss, so that what the loop hands over before it sees these failures
  // fails too. Returns whether it failed anything.
  bool fail_stale_locked() {
    auto& queue = shared_->to_send;
    if (queue.empty() || queue.front().losses_seen == shared_->losses) return false;
    for (auto& o : queue)
      report_locked(std::move(o), false, true, "connection_lost",
                    "the connection was lost before it (or a record queued before it) was sent");
    queue.clear();
    ++shared_->losses;
    return true;
  }

  // While no connection is made: what is stale fails now rather than when a
  // connection is back.
  void fail_stale() {
    std::lock_guard lock(shared_->mu);
    fail_stale_locked();
  }

  // One turn: publish what waits, then read what the broker sent. Returns
  // why the connection is unusable, or "".
  std::string turn() {
    {
      std::unique_lock lock(shared_->mu);
      if (shared_->test_paused) {
        shared_->test_pause_reached = true;
        shared_->cv.notify_all();
        shared_->cv.wait(lock, [&] { return !shared_->test_paused || shared_->stop; });
        shared_->test_pause_reached = false;
        return {};
      }
      // Handed over before the loop saw the last lost connection's
      // failures: it may not overtake them, nor may what follows it.
      fail_stale_locked();
      auto& queue = shared_->to_send;
      const std::size_t take = std::min(queue.size(), shared_->test_take_limit.value_or(queue.size()));
      if (shared_->test_take_limit) *shared_->test_take_limit -= take;
      for (std::size_t i = 0; i < take; ++i) batch_.push_back(std::move(queue[i]));
      queue.erase(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(take));
    }
    for (std::size_t i = 0; i < batch_.size(); ++i) {
      if (auto e = publish(batch_[i]); !e.empty()) {
        // This one and those after it were never sent: lose() fails them
        // after those in flight.
        batch_.erase(batch_.begin(), batch_.begin() + static_cast<std::ptrdiff_t>(i));
        return e;
      }
    }
    batch_.clear();
    if (!inflight_.empty() &&
        Clock::now() - inflight_.front().sent > std::chrono::milliseconds(config_.ack_timeout_ms))
      return "no publisher confirm within sink.rabbitmq.ackTimeout=" + std::to_string(config_.ack_timeout_ms) + " ms";
    if (!amqp_frames_enqueued(conn_) && !amqp_data_in_buffer(conn_)) {
      pollfd fds[2] = {{amqp_get_sockfd(conn_), POLLIN, 0}, {shared_->wake_fd, POLLIN, 0}};
      ::poll(fds, 2, 1000);
      if (fds[1].revents & POLLIN) {
        std::uint64_t n;
        [[maybe_unused]] auto r = ::read(shared_->wake_fd, &n, sizeof n);
      }
    }
    // Also serves heartbeats, at least once a second.
    while (true) {
      amqp_frame_t frame;
      timeval zero{0, 0};
      int rc = amqp_simple_wait_frame_noblock(conn_, &frame, &zero);
      if (rc == AMQP_STATUS_TIMEOUT) break;
      if (rc != AMQP_STATUS_OK) return std::string("the connection failed: ") + amqp_error_string2(rc);
      if (frame.frame_type != AMQP_FRAME_METHOD) continue;
      if (auto e = handle(frame); !e.empty()) return e;
    }
    return {};
  }

  std::string publish(Outgoing& out) {
    amqp_basic_properties_t props{};
    props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_TIMESTAMP_FLAG;
    props.delivery_mode = 2;  // persistent
    props.timestamp = static_cast<std::uint64_t>(std::max<std::int64_t>(out.timestamp_ms, 0) / 1000);
    if (!out.message_id.empty()) {
      props._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
      props.message_id = bytes_of(out.message_id);
    }
    entries_.clear();
    for (auto& [name, value] : out.headers) {
      amqp_table_entry_t e{};
      e.key = bytes_of(name);
      if (value) {
        e.value.kind = AMQP_FIELD_KIND_UTF8;
        e.value.value.bytes = bytes_of(*value);
      } else {
        e.value.kind = AMQP_FIELD_KIND_VOID;
      }
      entries_.push_back(e);
    }
    if (out.key) {
      amqp_table_entry_t e{};
      e.key = amqp_cstring_bytes(RabbitMqSink::key_header);
      e.value.kind = AMQP_FIELD_KIND_UTF8;
      e.value.value.bytes = bytes_of(*out.key);
      entries_.push_back(e);
    }
    props.headers.num_entries = static_cast<int>(entries_.size());
    props.headers.entries = entries_.data();
    const std::string_view body = out.body ? std::string_view(*out.body) : std::string_view();
    int rc = amqp_basic_publish(conn_, channel, bytes_of(config_.exchange), bytes_of(out.routing_key),
                                1 /* mandatory */, 0, &props, bytes_of(body));
    if (rc != AMQP_STATUS_OK) return std::string("could not publish: ") + amqp_error_string2(rc);
    inflight_.push_back(Inflight{next_tag_++, Clock::now(), std::move(out)});
    return {};
  }

  // Marks every in-flight publish up to `tag` (or only `tag`) settled, in
  // order, and reports those at the front.
  void settle(std::uint64_t tag, bool multiple, bool ok, const std::string& why) {
    for (auto& f : inflight_) {
      if (f.tag > tag) break;
      if (f.settled || (!multiple && f.tag != tag)) continue;
      f.settled = true;
      auto r = std::find_if(returned_.begin(), returned_.end(),
                            [&](const Returned& x) { return x.message_id == f.record.message_id; });
      if (ok && r != returned_.end()) {
        std::string text = std::move(r->text);
        returned_.erase(r);
        report(std::move(f.record), false, false, "unroutable", std::move(text));
      } else if (ok) {
        report(std::move(f.record), true, false, "", "");
      } else {
        report(std::move(f.record), false, true, "nack", why);
      }
    }
    while (!inflight_.empty() && inflight_.front().settled) inflight_.pop_front();
  }

  std::string handle(const amqp_frame_t& frame) {
    switch (frame.payload.method.id) {
      case AMQP_BASIC_ACK_METHOD: {
        auto* m = static_cast<amqp_basic_ack_t*>(frame.payload.method.decoded);
        settle(m->delivery_tag, m->multiple, true, "");
        return {};
      }
      case AMQP_BASIC_NACK_METHOD: {
        auto* m = static_cast<amqp_basic_nack_t*>(frame.payload.method.decoded);
        settle(m->delivery_tag, m->multiple, false, "the broker refused the message (basic.nack): it could not "
                                                      "take responsibility for it");
        return {};
      }
      case AMQP_BASIC_RETURN_METHOD: {
        // An unroutable mandatory message: RabbitMQ sends it back before the
        // confirm that covers it; the message id tells which one it was.
        auto* m = static_cast<amqp_basic_return_t*>(frame.payload.method.decoded);
        std::string text = "RabbitMQ returned it: " + std::to_string(m->reply_code) + " " + string_of(m->reply_text) +
                           " (exchange \"" + string_of(m->exchange) + "\", routing key \"" +
                           string_of(m->routing_key) + "\": no queue is bound for it)";
        amqp_message_t message;
        auto r = amqp_read_message(conn_, frame.channel, &message, 0);
        if (r.reply_type != AMQP_RESPONSE_NORMAL) return reply_error(r, "reading a returned message");
        std::string id;
        if (message.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) id = string_of(message.properties.message_id);
        amqp_destroy_message(&message);
        returned_.push_back(Returned{std::move(id), std::move(text)});
        return {};
      }
      case AMQP_CHANNEL_CLOSE_METHOD: {
        auto* m = static_cast<amqp_channel_close_t*>(frame.payload.method.decoded);
        std::string why = "the server closed the channel: " + std::to_string(m->reply_code) + " " +
                          string_of(m->reply_text);
        amqp_channel_close_ok_t ok{};
        amqp_send_method(conn_, frame.channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
        return why;
      }
      case AMQP_CONNECTION_CLOSE_METHOD: {
        auto* m = static_cast<amqp_connection_close_t*>(frame.payload.method.decoded);
        std::string why = "the server closed the connection: " + std::to_string(m->reply_code) + " " +
                          string_of(m->reply_text);
        amqp_connection_close_ok_t ok{};
        amqp_send_method(conn_, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
        return why;
      }
      default:
        return {};
    }
  }

  std::shared_ptr<Shared> shared_;
  RabbitMqConfig config_;
  boost::asio::io_context& io_;
  amqp_connection_state_t conn_ = nullptr;
  std::uint64_t next_tag_ = 1;
  std::deque<Inflight> inflight_;
  std::vector<Returned> returned_;
  std::vector<Outgoing> batch_;
  std::vector<amqp_table_entry_t> entries_;
};

}  // namespace

RabbitMqSink::RabbitMqSink(boost::asio::io_context& io, RabbitMqConfig config)
    : io_(io), config_(std::move(config)), shared_(std::make_shared<Shared>()) {
  shared_->sink = this;
  shared_->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (shared_->wake_fd < 0) throw std::runtime_error("eventfd failed");
  thread_ = std::thread([shared = shared_, config = config_, &io] {
    // Named as librdkafka names its threads: top -H, a debugger and the
    // fault campaign tell it from the loop.
    ::pthread_setname_np(::pthread_self(), "wr-rabbitmq");
    Connection(shared, config, io).run();
  });
}

RabbitMqSink::~RabbitMqSink() {
  {
    std::lock_guard lock(shared_->mu);
    shared_->stop = true;
    shared_->sink = nullptr;
    shared_->cv.notify_all();
  }
  std::uint64_t one = 1;
  [[maybe_unused]] auto w = ::write(shared_->wake_fd, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  ::close(shared_->wake_fd);
}

SubmitStatus RabbitMqSink::hand_over(Outgoing out) {
  // Not connected (yet, or again): backpressure, the slot holds.
  if (!connected_ || outstanding_ >= static_cast<std::size_t>(config_.max_pending)) return SubmitStatus::queue_full;
  out.losses_seen = losses_seen_;
  {
    std::lock_guard lock(shared_->mu);
    shared_->to_send.push_back(std::move(out));
  }
  ++outstanding_;
  std::uint64_t one = 1;
  [[maybe_unused]] auto w = ::write(shared_->wake_fd, &one, sizeof one);
  return SubmitStatus::accepted;
}

SubmitStatus RabbitMqSink::submit(const OutboxRecord& record, std::uint64_t token) {
  Outgoing out;
  out.routing_key = config_.routing_key_from_topic ? std::string(record.topic) : config_.routing_key;
  if (record.key) out.key = std::string(*record.key);
  if (record.value) out.body = std::string(*record.value);
  out.message_id = std::string(record.event_id);
  out.headers.reserve(record.headers.size());
  for (auto& h : record.headers)
    out.headers.emplace_back(std::string(h.name), h.value ? std::optional<std::string>(*h.value) : std::nullopt);
  out.timestamp_ms = record.timestamp_ms;
  out.token = token;
  out.bytes = record.size_bytes();
  return hand_over(std::move(out));
}

SubmitStatus RabbitMqSink::submit_dead_letter(std::string_view reason, std::string_view topic,
                                              std::optional<std::string_view> key,
                                              std::optional<std::string_view> value,
                                              const std::vector<OutboxRecord::Header>& headers, std::uint64_t token,
                                              std::size_t bytes) {
  Outgoing out;
  out.routing_key = std::string(topic);  // the dead-letter topic is a routing key on the same exchange
  if (key) out.key = std::string(*key);
  if (value) out.body = std::string(*value);
  for (auto& h : headers) {
    if (h.name == "id" && h.value) out.message_id = std::string(*h.value);
    out.headers.emplace_back(std::string(h.name), h.value ? std::optional<std::string>(*h.value) : std::nullopt);
  }
  out.token = token;
  out.bytes = bytes;
  out.dead_letter = true;
  out.reason = std::string(reason);
  return hand_over(std::move(out));
}

void RabbitMqSink::poll() {
  {
    std::lock_guard lock(shared_->mu);
    scratch_.swap(shared_->done);
    losses_seen_ = shared_->losses;  // the failures of every loss so far are in scratch_ (or were before)
    if (connected_ != shared_->connected || last_error_ != shared_->error) {
      connected_ = shared_->connected;
      last_error_ = shared_->error;
      if (!connected_ && !last_error_.empty()) spdlog::error("rabbitmq: {}", last_error_);
    }
  }
  for (auto& o : scratch_) {
    --outstanding_;
    Delivery d;
    d.token = o.record.token;
    d.bytes = o.record.bytes;
    d.ok = o.ok;
    d.transient = o.transient;
    d.dead_lettered = o.record.dead_letter;
    d.dead_letter_reason = std::move(o.record.reason);
    d.error_code = std::move(o.code);
    d.error_message = std::move(o.message);
    d.topic = o.record.routing_key;
    if (!o.ok && !o.transient) {
      d.key = o.record.key;
      d.value = o.record.body;
      header_views_.clear();
      for (auto& [name, value] : o.record.headers) header_views_.push_back({name, value});
      d.headers = header_views_;
    }
    if (on_delivery_) on_delivery_(d);
  }
  scratch_.clear();
}

void RabbitMqSink::abort_queued() {
  {
    std::lock_guard lock(shared_->mu);
    for (auto& out : shared_->to_send)
      shared_->done.push_back(Outcome{std::move(out), false, true, "purged",
                                      "not sent: a record before it failed and is sent again from the slot first"});
    shared_->to_send.clear();
  }
  // Reported on the loop's next poll (the relay's drain polls).
}

void RabbitMqSink::limit_taking_for_test(std::optional<std::size_t> take) {
  {
    std::lock_guard lock(shared_->mu);
    shared_->test_take_limit = take;
  }
  std::uint64_t one = 1;
  [[maybe_unused]] auto w = ::write(shared_->wake_fd, &one, sizeof one);
}

void RabbitMqSink::pause_for_test(bool pause) {
  std::unique_lock lock(shared_->mu);
  shared_->test_paused = pause;
  shared_->cv.notify_all();
  if (!pause) return;
  std::uint64_t one = 1;
  [[maybe_unused]] auto w = ::write(shared_->wake_fd, &one, sizeof one);
  if (!shared_->cv.wait_for(lock, std::chrono::seconds(30), [&] { return shared_->test_pause_reached; }))
    throw std::runtime_error("rabbitmq: the connection's thread did not pause within 30 s");
}

std::size_t RabbitMqSink::outcomes_waiting_for_test() {
  std::lock_guard lock(shared_->mu);
  return shared_->done.size();
}

void RabbitMqSink::check_connectivity(int timeout_ms) {
  // The thread is connecting already: wait for it, within the time given.
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::unique_lock lock(shared_->mu);
  while (!shared_->connected && std::chrono::steady_clock::now() < until) {
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    lock.lock();
  }
  if (!shared_->connected) throw std::runtime_error(shared_->error);
}

}  // namespace walrelay
