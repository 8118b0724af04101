#include "walrelay/sinks/nats/nats_sink.hpp"

#include <nats/nats.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <boost/asio/post.hpp>

#include "walrelay/config.hpp"
#include "walrelay/mutation.hpp"
#include "walrelay/sinks/loop_wake.hpp"

namespace walrelay {

struct NatsJetStreamSink::CallbackRef {
  Inbox* inbox;
  boost::asio::io_context* io;
  std::weak_ptr<Inbox> self;
};

namespace {

using Inbox = NatsJetStreamSink::Inbox;
using Completion = NatsJetStreamSink::Completion;

// Hands the loop what a nats.c thread saw; one wake-up however many come.
using InboxRef = NatsJetStreamSink::CallbackRef;

void push(InboxRef* ref, Completion c) {
  std::lock_guard lock(ref->inbox->mu);
  ref->inbox->done.push_back(std::move(c));
  post_poll_locked(*ref->io, *ref->inbox, ref->self);
}


// nats.c's callbacks: each only records what happened.
void on_ack(jsCtx*, natsMsg* msg, jsPubAck* pa, jsPubAckErr* pae, void* closure) {
  Completion c;
  c.msg = msg;
  if (pa) {
    c.ok = true;
    c.duplicate = pa->Duplicate;
  } else if (pae) {
    c.status = pae->Err;
    c.js_code = pae->ErrCode;
    c.text = pae->ErrText ? pae->ErrText : natsStatus_GetText(pae->Err);
  }
  push(static_cast<InboxRef*>(closure), std::move(c));
}

void on_closed(natsConnection*, void* closure) {
  auto* ref = static_cast<InboxRef*>(closure);
  std::lock_guard lock(ref->inbox->mu);
  ref->inbox->closed = true;
  ref->inbox->close_seen = true;
  ref->inbox->cv.notify_all();
  post_poll_locked(*ref->io, *ref->inbox, ref->self);
}

void on_async_error(natsConnection* nc, natsSubscription*, natsStatus err, void* closure) {
  auto* ref = static_cast<InboxRef*>(closure);
  const char* text = nullptr;
  natsConnection_GetLastError(nc, &text);
  std::lock_guard lock(ref->inbox->mu);
  ref->inbox->async_error = redact_url(text && *text ? text : natsStatus_GetText(err));
  ref->inbox->async_error_new = true;
  post_poll_locked(*ref->io, *ref->inbox, ref->self);
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ",") + redact_url(x);
  return s;
}

// The library's last error (its text may name the server's URL, user info and all).
std::string last_error(natsStatus s) {
  natsStatus ignored;
  const char* text = nats_GetLastError(&ignored);
  return redact_url(text && *text ? text : natsStatus_GetText(s));
}

// A header value NATS can carry: its headers are text lines.
bool header_safe(std::string_view v) { return v.find_first_of("\r\n") == std::string_view::npos; }

}  // namespace

// The connection options of `config`; callbacks (the closed and error
// handlers) only when `ref` is given. Throws ConfigError naming the key
// nats.c rejects.
natsOptions* NatsJetStreamSink::make_options(const NatsJetStreamConfig& config, int timeout_ms, CallbackRef* ref) {
  natsOptions* o = nullptr;
  auto check = [&](natsStatus s, const char* key) {
    if (s != NATS_OK) {
      if (o) natsOptions_Destroy(o);
      throw ConfigError(std::string("sink.nats-jetstream.") + key, last_error(s));
    }
  };
  check(natsOptions_Create(&o), "url");
  std::vector<const char*> servers;
  for (auto& u : config.urls) servers.push_back(u.c_str());
  check(natsOptions_SetServers(o, servers.data(), static_cast<int>(servers.size())), "url");
  // Reconnection is walrelay's: see the header (order across a broker restart).
  check(natsOptions_SetAllowReconnect(o, false), "url");
  check(natsOptions_SetTimeout(o, timeout_ms), "connect.timeout.ms");
  check(natsOptions_SetName(o, "walrelay"), "url");
  // A broker that vanishes without a reset is noticed within about 15 s.
  check(natsOptions_SetPingInterval(o, 5000), "url");
  check(natsOptions_SetMaxPingsOut(o, 3), "url");
  // The publishes are bounded by max.pending: the library's buffer must hold them.
  check(natsOptions_SetMaxPendingMsgs(o, std::max(65536, config.max_pending * 2)), "max.pending");
  if (!config.user.empty()) check(natsOptions_SetUserInfo(o, config.user.c_str(), config.password.c_str()), "auth.user");
  if (!config.token.empty()) check(natsOptions_SetToken(o, config.token.c_str()), "auth.token");
  if (!config.credentials_file.empty())
    check(natsOptions_SetUserCredentialsFromFiles(o, config.credentials_file.c_str(), nullptr), "auth.credentials.file");
  if (config.tls) {
    check(natsOptions_SetSecure(o, true), "tls.enabled");
    if (!config.tls_ca_location.empty())
      check(natsOptions_LoadCATrustedCertificates(o, config.tls_ca_location.c_str()), "tls.ca.location");
    if (!config.tls_certificate_location.empty())
      check(natsOptions_LoadCertificatesChain(o, config.tls_certificate_location.c_str(),
                                              config.tls_key_location.c_str()),
            "tls.certificate.location");
  }
  if (ref) {
    check(natsOptions_SetClosedCB(o, on_closed, ref), "url");
    check(natsOptions_SetErrorHandler(o, on_async_error, ref), "url");
  }
  return o;
}

NatsJetStreamSink::NatsJetStreamSink(boost::asio::io_context& io, NatsJetStreamConfig config)
    : io_(io), config_(std::move(config)), inbox_(std::make_shared<Inbox>()), reconnect_timer_(io) {
  inbox_->sink = this;
  ref_ = std::make_unique<CallbackRef>(CallbackRef{inbox_.get(), &io_, inbox_});
  options_ = make_options(config_, config_.connect_timeout_ms, ref_.get());
  start_connect();
}

NatsJetStreamSink::~NatsJetStreamSink() {
  reconnect_timer_.cancel();
  worker_.join();  // a connect under way ends (within connect.timeout.ms); its result is dropped below
  {
    std::lock_guard lock(inbox_->mu);
    inbox_->sink = nullptr;
  }
  if (nc_) {
    inbox_->close_seen = false;
    natsConnection_Close(nc_);
    // nats.c calls the closed callback last: after it, none of its threads
    // touches the inbox, which goes with this object.
    std::unique_lock lock(inbox_->mu);
    inbox_->cv.wait_for(lock, std::chrono::seconds(5), [&] { return inbox_->close_seen; });
  }
  retire_connection();
  {
    std::lock_guard lock(inbox_->mu);
    for (auto& c : inbox_->done) natsMsg_Destroy(c.msg);
    inbox_->done.clear();
  }
  if (options_) natsOptions_Destroy(options_);
}

std::string NatsJetStreamSink::health_reason() const { return last_error_; }

void NatsJetStreamSink::start_connect() {
  if (connecting_ || nc_) return;
  connecting_ = true;
  boost::asio::post(worker_, [this, self = std::weak_ptr<Inbox>(inbox_)] {
    auto c = connect(config_, options_, ref_.get());
    boost::asio::post(io_, [self, c] {
      auto in = self.lock();
      NatsJetStreamSink* sink = nullptr;
      if (in) {
        std::lock_guard lock(in->mu);
        sink = in->sink;
      }
      if (sink) {
        sink->connected(c);
      } else {  // the sink is gone
        if (c.js) jsCtx_Destroy(c.js);
        if (c.nc) natsConnection_Destroy(c.nc);
      }
    });
  });
}

NatsJetStreamSink::Connected NatsJetStreamSink::connect(const NatsJetStreamConfig& config, natsOptions* options,
                                                        void* ack_closure) {
  Connected c;
  natsStatus s = natsConnection_Connect(&c.nc, options);
  if (s != NATS_OK) {
    c.error = "could not connect to NATS at " + joined(config.urls) + ": " + last_error(s);
    c.nc = nullptr;
    return c;
  }
  jsOptions jo;
  jsOptions_Init(&jo);
  jo.Wait = config.connect_timeout_ms;
  // walrelay keeps the bound (max.pending) itself: the library must never
  // stall a publish on the loop.
  jo.PublishAsync.MaxPending = config.max_pending + 1024;
  jo.PublishAsync.AckHandler = on_ack;
  jo.PublishAsync.AckHandlerClosure = ack_closure;
  s = natsConnection_JetStream(&c.js, c.nc, &jo);
  if (s == NATS_OK && config.create_stream) {
    jsStreamInfo* si = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    s = js_GetStreamInfo(&si, c.js, config.stream_name.c_str(), nullptr, &jerr);
    if (s == NATS_OK) {
      jsStreamInfo_Destroy(si);
    } else if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr) {
      std::vector<const char*> subjects;
      for (auto& x : config.subjects) subjects.push_back(x.c_str());
      jsStreamConfig sc;
      jsStreamConfig_Init(&sc);
      sc.Name = config.stream_name.c_str();
      sc.Subjects = subjects.data();
      sc.SubjectsLen = static_cast<int>(subjects.size());
      sc.Storage = config.storage == "memory" ? js_MemoryStorage : js_FileStorage;
      sc.Duplicates = config.duplicate_window_ms * 1000000;  // nanoseconds
      s = js_AddStream(&si, c.js, &sc, nullptr, &jerr);
      if (s == NATS_OK) {
        jsStreamInfo_Destroy(si);
        spdlog::info("nats: created the stream {} over {}", config.stream_name, [&] {
          std::string t;
          for (auto& x : config.subjects) t += (t.empty() ? "" : ",") + x;
          return t;
        }());
      } else {
        c.error = "sink.nats-jetstream.create-stream: could not create the stream " + config.stream_name + ": " +
                  last_error(s);
      }
    } else {
      c.error = "sink.nats-jetstream.create-stream: could not look up the stream " + config.stream_name + ": " +
                last_error(s);
    }
  } else if (s != NATS_OK) {
    c.error = "NATS JetStream: " + last_error(s);
  }
  if (!c.error.empty()) {
    if (c.js) jsCtx_Destroy(c.js);
    natsConnection_Destroy(c.nc);
    c.js = nullptr;
    c.nc = nullptr;
  }
  return c;
}

void NatsJetStreamSink::connected(Connected c) {
  connecting_ = false;
  if (!c.error.empty()) {
    if (last_error_ != c.error) spdlog::error("{}", c.error);
    last_error_ = c.error;
    backoff_ = std::clamp(backoff_ * 2, std::chrono::milliseconds(250), std::chrono::milliseconds(5000));
    reconnect_timer_.expires_after(backoff_);
    reconnect_timer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) start_connect();
    });
    return;
  }
  nc_ = c.nc;
  js_ = c.js;
  backoff_ = std::chrono::milliseconds(0);
  last_error_.clear();
  char url[256] = "";
  natsConnection_GetConnectedUrl(nc_, url, sizeof url);
  spdlog::info("nats: connected to {}", redact_url(url));
}

void NatsJetStreamSink::retire_connection() {
  if (js_) jsCtx_Destroy(js_);
  if (nc_) natsConnection_Destroy(nc_);
  js_ = nullptr;
  nc_ = nullptr;
}

// The connection closed (nats.c does not reconnect): every publish not yet
// acknowledged fails transiently, the relay sends it again from the slot,
// and a new connection is made.
void NatsJetStreamSink::connection_closed() {
  std::string why = "the connection to NATS closed";
  {
    std::lock_guard lock(inbox_->mu);
    if (!inbox_->async_error.empty()) why += " (" + inbox_->async_error + ")";
  }
  // Only a context that has published has a pending list: nats.c (3.4)
  // creates its map at the first asynchronous publish and dereferences it
  // unchecked, so asking an idle connection (a standby's, or one that closed
  // before its first publish) crashed. pending_ is empty then, and each of
  // its entries was published on this context (it is cleared below).
  if (js_ && !pending_.empty()) {
    natsMsgList list{};
    if (js_PublishAsyncGetPendingList(&list, js_) == NATS_OK) {
      for (int i = 0; i < list.Count; ++i) {
        Completion c;
        c.msg = list.Msgs[i];
        c.status = NATS_CONNECTION_CLOSED;
        c.text = why;
        list.Msgs[i] = nullptr;
        report(c);
      }
      natsMsgList_Destroy(&list);
    }
  }
  // A PubAck still on its way from a library thread vouches for nothing now.
  for (auto& [msg, p] : pending_) {
    Delivery d;
    d.token = p.token;
    d.bytes = p.bytes;
    d.ok = false;
    d.transient = true;
    d.dead_lettered = p.dead_letter;
    d.dead_letter_reason = p.reason;
    d.error_code = "connection_lost";
    d.error_message = why;
    if (on_delivery_) on_delivery_(d);
  }
  pending_.clear();
  if (nc_) spdlog::warn("nats: {}; connecting again", why);
  retire_connection();
  last_error_ = why;
  start_connect();
}

void NatsJetStreamSink::poll() {
  bool closed = false;
  std::optional<std::string> refusal;
  {
    std::lock_guard lock(inbox_->mu);
    scratch_.swap(inbox_->done);
    closed = std::exchange(inbox_->closed, false);
    if (std::exchange(inbox_->async_error_new, false)) refusal = inbox_->async_error;
  }
  if (refusal && !closed) {
    // The connection stays up (a permission refused, a slow consumer): say
    // so now, since the refused publishes will only time out.
    if (*refusal != server_refusal_)
      spdlog::error("nats: the server reports: {}; what it refuses gets no PubAck and is sent again from the slot",
                    *refusal);
    server_refusal_ = *refusal;
    last_error_ = "the NATS server reports: " + *refusal;
  }
  for (auto& c : scratch_) report(c);
  scratch_.clear();
  if (closed && nc_) connection_closed();
}

void NatsJetStreamSink::report(const Completion& c) {
  auto it = pending_.find(c.msg);
  if (it == pending_.end()) {  // reported already (its connection closed)
    natsMsg_Destroy(c.msg);
    return;
  }
  Pending p = std::move(it->second);
  pending_.erase(it);
  Delivery d;
  d.token = p.token;
  d.bytes = p.bytes;
  d.dead_lettered = p.dead_letter;
  d.dead_letter_reason = std::move(p.reason);
  const char* subject = natsMsg_GetSubject(c.msg);
  d.topic = subject ? subject : "";
  if (c.ok) {
    d.ok = true;
    if (stream_problem_ || !server_refusal_.empty()) {
      stream_problem_ = false;
      server_refusal_.clear();
      last_error_.clear();
    }
  } else {
    d.ok = false;
    d.transient = true;
    d.error_message = c.text;
    if (c.status == NATS_TIMEOUT) {
      d.error_code = "ack_timeout";
      d.error_message = "no PubAck within sink.nats-jetstream.ack.timeout.ms=" + std::to_string(config_.ack_timeout_ms) +
                        (server_refusal_.empty() ? std::string() : " (the server reports: " + server_refusal_ + ")");
    } else if (c.status == NATS_NO_RESPONDERS || c.js_code == JSStreamNotFoundErr) {
      // Not the record's fault and not for the dead-letter subject: the
      // stream is missing (or JetStream is starting). The slot holds.
      d.error_code = "no_stream";
      d.error_message = "no JetStream stream takes subject \"" + std::string(d.topic) +
                        "\": create one whose subjects cover it, or set sink.nats-jetstream.create-stream=true";
      stream_problem_ = true;
      last_error_ = d.error_message;
    } else if (c.js_code == JSStreamMessageExceedsMaximumErr) {
      d.transient = false;
      d.error_code = "msg_size_too_large";
      d.error_message = "JetStream refused the message: " + c.text;
    } else if (c.status == NATS_CONNECTION_CLOSED) {
      d.error_code = "connection_lost";
    } else {
      d.error_code = c.js_code ? "jetstream_" + std::to_string(c.js_code) : "nats_" + std::to_string(c.status);
    }
    if (!d.transient) {
      // The record as it was, for its dead-letter copy.
      const char* data = natsMsg_GetData(c.msg);
      d.value = std::string_view(data ? data : "", static_cast<std::size_t>(natsMsg_GetDataLength(c.msg)));
      const char** keys = nullptr;
      int count = 0;
      if (natsMsgHeader_Keys(c.msg, &keys, &count) == NATS_OK) {
        for (int i = 0; i < count; ++i) {
          const char* v = nullptr;
          natsMsgHeader_Get(c.msg, keys[i], &v);
          if (std::strcmp(keys[i], key_header) == 0) d.key = v ? std::string_view(v) : std::string_view();
          else if (std::strncmp(keys[i], "Nats-", 5) != 0)
            d.headers.push_back({keys[i], v ? std::optional<std::string_view>(v) : std::nullopt});
        }
        std::free(static_cast<void*>(keys));
      }
    }
  }
  if (on_delivery_) on_delivery_(d);
  natsMsg_Destroy(c.msg);
}

SubmitStatus NatsJetStreamSink::submit(const OutboxRecord& record, std::uint64_t token) {
  return publish(record.topic, record.key, record.value, record.headers, record.event_id,
                 Pending{token, record.size_bytes(), false, {}}, token, record.size_bytes());
}

SubmitStatus NatsJetStreamSink::submit_dead_letter(std::string_view reason, std::string_view topic,
                                                   std::optional<std::string_view> key,
                                                   std::optional<std::string_view> value,
                                                   const std::vector<OutboxRecord::Header>& headers,
                                                   std::uint64_t token, std::size_t bytes) {
  // The copy is deduplicated as the record is: by its id, under its own name.
  std::string_view id;
  for (auto& h : headers)
    if (h.name == "id" && h.value) id = *h.value;
  std::string msg_id = id.empty() ? std::string() : "dlq:" + std::string(id);
  return publish(topic, key, value, headers, msg_id, Pending{token, bytes, true, std::string(reason)}, token, bytes);
}

void NatsJetStreamSink::refuse_at_submit(Delivery& d, std::string_view subject, std::optional<std::string_view> key,
                                         std::optional<std::string_view> value,
                                         const std::vector<OutboxRecord::Header>& headers) {
  d.ok = false;
  d.at_submit = true;
  d.topic = subject;
  d.key = key;
  d.value = value;
  d.headers = headers;
  if (on_delivery_) on_delivery_(d);
}

SubmitStatus NatsJetStreamSink::publish(std::string_view subject, std::optional<std::string_view> key,
                                        std::optional<std::string_view> value,
                                        const std::vector<OutboxRecord::Header>& headers, std::string_view msg_id,
                                        Pending pending, std::uint64_t token, std::size_t bytes) {
  // No connection (yet, or again): backpressure, the slot holds.
  if (!js_) return SubmitStatus::queue_full;
  if (pending_.size() >= static_cast<std::size_t>(config_.max_pending)) return SubmitStatus::queue_full;
  Delivery d;
  d.token = token;
  d.bytes = bytes;
  d.dead_lettered = pending.dead_letter;
  d.dead_letter_reason = pending.reason;
  auto refuse = [&](std::string code, std::string message) {
    d.error_code = std::move(code);
    d.error_message = std::move(message);
    refuse_at_submit(d, subject, key, value, headers);
    return SubmitStatus::refused_reported;
  };
  if (key && !header_safe(*key)) return refuse("invalid_header", "the key holds a line break, which a NATS header cannot carry");
  for (auto& h : headers)
    if (h.value && !header_safe(*h.value))
      return refuse("invalid_header", "header " + std::string(h.name) + " holds a line break, which a NATS header cannot carry");

  // subject is NUL-terminated (OutboxRecord::topic, the dead-letter subject's std::string).
  natsMsg* msg = nullptr;
  natsStatus s = natsMsg_Create(&msg, subject.data(), nullptr, value ? value->data() : nullptr,
                                value ? static_cast<int>(value->size()) : 0);
  if (s != NATS_OK) return refuse(s == NATS_INVALID_SUBJECT ? "invalid_subject" : "nats_" + std::to_string(s),
                                  "could not make a NATS message for subject \"" + std::string(subject) + "\": " + last_error(s));
  for (auto& h : headers) {
    value_buf_.assign(h.value.value_or(std::string_view()));
    natsMsgHeader_Add(msg, h.name.data(), value_buf_.c_str());
  }
  if (key) {
    value_buf_.assign(*key);
    natsMsgHeader_Set(msg, key_header, value_buf_.c_str());
  }
  jsPubOptions po;
  jsPubOptions_Init(&po);
  po.MaxWait = config_.ack_timeout_ms;
  id_buf_.assign(msg_id);
  if (!id_buf_.empty()) po.MsgId = id_buf_.c_str();
  natsMsg* key_of = msg;  // the library clears `msg` when it takes it
  pending_.emplace(key_of, std::move(pending));
  s = js_PublishMsgAsync(js_, &msg, &po);
  if (s == NATS_OK) {
    if (mutation::active(mutation::Break::nats_ack_at_publish)) {
      // Counted as sent once queued (the mistake of Fluent Bit's out_kafka):
      // reported delivered on the loop's next turn, its PubAck ignored.
      pending_.erase(key_of);
      boost::asio::post(io_, [this, d, topic = std::string(subject)] {
        Delivery ok = d;
        ok.ok = true;
        ok.topic = topic;
        if (on_delivery_) on_delivery_(ok);
      });
    }
    return SubmitStatus::accepted;
  }
  pending_.erase(key_of);
  natsMsg_Destroy(msg);
  const std::string text = last_error(s);
  switch (s) {
    case NATS_MAX_PAYLOAD:
      return refuse("msg_size_too_large", "larger than the server's max_payload: " + text);
    case NATS_INVALID_SUBJECT:
      return refuse("invalid_subject", "\"" + std::string(subject) + "\" is not a NATS subject: " + text);
    case NATS_CONNECTION_CLOSED:
    case NATS_CONNECTION_DISCONNECTED:
    case NATS_NOT_YET_CONNECTED:
    case NATS_TIMEOUT:  // the library's own pending bound: wait for acknowledgements
      return SubmitStatus::queue_full;
    default:
      d.transient = true;
      return refuse("nats_" + std::to_string(s), text);
  }
}

void NatsJetStreamSink::check_connectivity(int timeout_ms) {
  natsOptions* o = make_options(config_, timeout_ms, nullptr);
  natsConnection* nc = nullptr;
  natsStatus s = natsConnection_Connect(&nc, o);
  natsOptions_Destroy(o);
  if (s != NATS_OK) throw std::runtime_error("could not connect to NATS at " + joined(config_.urls) + ": " + last_error(s));
  jsCtx* js = nullptr;
  jsAccountInfo* ai = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  std::string problem;
  s = natsConnection_JetStream(&js, nc, nullptr);
  if (s == NATS_OK) s = js_GetAccountInfo(&ai, js, nullptr, &jerr);
  if (s != NATS_OK)
    problem = "NATS at " + joined(config_.urls) + " has no JetStream for this account: " + last_error(s);
  else if (!config_.create_stream && ai->Streams == 0)
    problem = "NATS JetStream has no stream: create one whose subjects cover the outbox topics, or set "
              "sink.nats-jetstream.create-stream=true";
  if (ai) jsAccountInfo_Destroy(ai);
  if (js) jsCtx_Destroy(js);
  natsConnection_Destroy(nc);
  if (!problem.empty()) throw std::runtime_error(problem);
}

}  // namespace walrelay
