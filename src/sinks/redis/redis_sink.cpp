#include "walrelay/sinks/redis/redis_sink.hpp"

#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>

#include <boost/asio/post.hpp>

#include "walrelay/json.hpp"
#include "walrelay/mutation.hpp"
#include "walrelay/sinks/loop_wake.hpp"

#include <nlohmann/json.hpp>

namespace walrelay {

namespace {

// One stream's batch. KEYS[1] the stream, KEYS[2] walrelay's mark beside it
// (a hash: the source - database system, timeline, database, slot - and the
// highest id walrelay stored there from it with none of its events missing
// below). ARGV[1] MAXLEN ("0": none), ARGV[2] the source ("" for records of no
// stream), ARGV[3] "1" when the mark may move (not after a refused entry of
// this stream); then per entry its id ("" for after the last), the name of
// the field that tells one event from another (its value is the entry's
// own), the number of field pairs and the pairs.
//
// Answers a status per entry: ok (appended), dup (there, the same event),
// gone (at or below the mark of this same source and not there: stored, then
// trimmed or deleted), conflict (at or below the stream's last id, and
// neither: another writer's entries, or a source whose LSNs do not follow
// the mark's), or err:<text>, after which the script stops (nothing after it
// is stored: a prefix). Never "delivered" on an id alone. Ids are compared as
// two decimal numbers: Lua's numbers cannot hold a 64-bit LSN. Needs Redis 7
// (XADD's <ms>-* ids).
constexpr const char* append_script = R"lua(
local stream, mark = KEYS[1], KEYS[2]
local maxlen, source, may_move = ARGV[1], ARGV[2], ARGV[3] == '1'
local last = '0-0'
if redis.call('EXISTS', stream) == 1 then
  local info = redis.call('XINFO', 'STREAM', stream)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then last = info[i + 1] end
  end
end
local marked = nil
if source ~= '' then
  local m = redis.call('HMGET', mark, 'source', 'id')
  if m[1] == source then marked = m[2] end
end
local function part(id)
  local d = string.find(id, '-', 1, true)
  return string.sub(id, 1, d - 1), string.sub(id, d + 1)
end
local function cmpn(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  if a == b then return 0 end
  return a < b and -1 or 1
end
local function cmp(a, b)
  local am, as = part(a)
  local bm, bs = part(b)
  local c = cmpn(am, bm)
  if c ~= 0 then return c end
  return cmpn(as, bs)
end
local out = {}
local moved = false
local i = 4
while i <= #ARGV do
  local id, field, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local at = i + 3
  i = at + 2 * n
  local want = nil
  for j = at, i - 1, 2 do
    if ARGV[j] == field then want = ARGV[j + 1] break end
  end
  local status = nil
  if id ~= '' and cmp(id, last) <= 0 then
    local found = redis.call('XRANGE', stream, id, id)
    status = 'conflict'
    if #found == 1 then
      local f = found[1][2]
      for j = 1, #f, 2 do
        if f[j] == field and f[j + 1] == want then status = 'dup' break end
      end
    elseif marked ~= nil and cmp(id, marked) <= 0 then
      status = 'gone'
    end
  end
  if status == nil then
    local args = {'XADD', stream}
    if maxlen ~= '0' then
      args[#args + 1] = 'MAXLEN'
      args[#args + 1] = '~'
      args[#args + 1] = maxlen
    end
    args[#args + 1] = id == '' and (part(last)) .. '-*' or id
    for j = at, i - 1 do args[#args + 1] = ARGV[j] end
    local r = redis.pcall(unpack(args))
    if type(r) == 'table' and r.err then
      out[#out + 1] = 'err:' .. r.err
      break
    end
    last = r
    status = 'ok'
  end
  if status == 'conflict' then may_move = false end
  if may_move and source ~= '' and id ~= '' and status ~= 'dup' and status ~= 'gone' then
    marked = id
    moved = true
  end
  out[#out + 1] = status
end
if moved then redis.call('HSET', mark, 'source', source, 'id', marked) end
return out
)lua";

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

timeval to_timeval(int ms) { return timeval{ms / 1000, static_cast<suseconds_t>((ms % 1000) * 1000)}; }

std::string reply_text(const redisReply* r) {
  if (!r) return "no reply";
  if (r->type == REDIS_REPLY_ERROR || r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
    return std::string(r->str, r->len);
  return "an unexpected reply";
}

// Queues a command on the connection (binary-safe arguments); its reply is
// read with redisGetReply, in order.
void append_command(redisContext* ctx, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  redisAppendCommandArgv(ctx, static_cast<int>(argv.size()), argv.data(), lens.data());
}

// A command's reply; throws std::runtime_error on a broken connection or an
// error reply (the caller's context is then unusable, or the command failed).
Reply command(redisContext* ctx, const std::vector<std::string>& args) {
  append_command(ctx, args);
  redisReply* raw = nullptr;
  if (redisGetReply(ctx, reinterpret_cast<void**>(&raw)) != REDIS_OK) raw = nullptr;
  Reply r(raw);
  if (!r) throw std::runtime_error(ctx->errstr[0] ? ctx->errstr : "the connection to Redis broke");
  if (r->type == REDIS_REPLY_ERROR) throw std::runtime_error(args[0] + ": " + reply_text(r.get()));
  return r;
}

std::string where(const RedisConfig& c) { return c.host + ":" + std::to_string(c.port); }

// A connection, signed in, on its database, with the script loaded (its
// SHA1 returned in `sha`). Throws std::runtime_error naming what failed; no
// secret in it.
redisContext* connect(const RedisConfig& config, int timeout_ms, std::string& sha) {
  redisContext* ctx = redisConnectWithTimeout(config.host.c_str(), config.port, to_timeval(timeout_ms));
  if (!ctx || ctx->err) {
    std::string why = ctx ? ctx->errstr : "out of memory";
    if (ctx) redisFree(ctx);
    throw std::runtime_error("could not connect to Redis at " + where(config) + ": " + why);
  }
  try {
    redisSetTimeout(ctx, to_timeval(config.socket_timeout_ms));
    if (!config.password.empty()) {
      try {
        if (config.user.empty()) command(ctx, {"AUTH", config.password});
        else command(ctx, {"AUTH", config.user, config.password});
      } catch (const std::runtime_error& e) {
        // The error names no secret: the server's text only.
        throw std::runtime_error("Redis at " + where(config) + " refused sink.redis.user/password: " +
                                 std::string(e.what()).substr(6));
      }
    }
    // XADD's <ms>-* ids (records of no stream: dead-letter copies, replay)
    // came with Redis 7.
    const std::string info = reply_text(command(ctx, {"INFO", "server"}).get());
    const auto at = info.find("redis_version:");
    const std::string version =
        at == std::string::npos ? "?" : info.substr(at + 14, info.find_first_of("\r\n", at) - at - 14);
    if (version == "?" || std::atoi(version.c_str()) < 7)
      throw std::runtime_error("Redis at " + where(config) + " is " + version +
                               ": walrelay's Redis sink needs Redis 7.0 or later");
    if (config.db_index != 0) command(ctx, {"SELECT", std::to_string(config.db_index)});
    auto loaded = command(ctx, {"SCRIPT", "LOAD", append_script});
    sha = reply_text(loaded.get());
  } catch (...) {
    redisFree(ctx);
    throw;
  }
  return ctx;
}

// An ACL's refusal: of a key (NOPERM), or of a command inside the script.
bool denied(const std::string& text) {
  return text.rfind("NOPERM", 0) == 0 || text.find("user executing the script can't run this command") != std::string::npos;
}

// An error's kind by Redis's code: a key of another type is the record's
// own; a refused permission (ACL) is walrelay's user's; the rest (OOM, a
// read-only replica, a busy script) passes.
RedisStreamsSink::Outcome outcome_of(const std::string& text) {
  if (text.rfind("WRONGTYPE", 0) == 0) return RedisStreamsSink::Outcome::record_error;
  if (denied(text)) return RedisStreamsSink::Outcome::denied;
  return RedisStreamsSink::Outcome::transient;
}

std::string code_of(const std::string& text) {
  if (text.rfind("WRONGTYPE", 0) == 0) return "wrong_type";
  if (denied(text)) return "permission_denied";
  if (text.rfind("OOM", 0) == 0) return "out_of_memory";
  return "redis_error";
}

std::string headers_json(const std::vector<std::pair<std::string, std::optional<std::string>>>& headers) {
  Json o = Json::object();
  for (auto& [name, value] : headers) o[name] = value ? Json(*value) : Json(nullptr);
  return to_json_text(o);
}

}  // namespace

RedisStreamsSink::RedisStreamsSink(boost::asio::io_context& io, RedisConfig config)
    : io_(io), config_(std::move(config)), shared_(std::make_shared<Shared>()) {
  shared_->sink = this;
  worker_ = std::thread([this] { run_worker(); });
}

RedisStreamsSink::~RedisStreamsSink() {
  {
    std::lock_guard lock(shared_->mu);
    shared_->stop = true;
    shared_->sink = nullptr;
  }
  shared_->cv.notify_all();
  worker_.join();  // a round trip under way ends within socket.timeout.ms
}

void RedisStreamsSink::source_identified(const SourceIdentity& source) {
  source_ = std::make_shared<const std::string>(source.system + "/" + source.timeline + "/" + source.database + "/" +
                                                source.slot + "/" + config_.selection);
}

bool RedisStreamsSink::healthy() const {
  std::lock_guard lock(shared_->mu);
  return shared_->connected;
}

std::string RedisStreamsSink::health_reason() const {
  std::lock_guard lock(shared_->mu);
  return shared_->last_error;
}

SubmitStatus RedisStreamsSink::enqueue(Entry e) {
  {
    std::lock_guard lock(shared_->mu);
    // No connection (yet, or again): backpressure, the slot holds.
    if (!shared_->connected) return SubmitStatus::queue_full;
    if (outstanding_ >= static_cast<std::size_t>(config_.max_pending)) return SubmitStatus::queue_full;
    e.epoch = epoch_;
    if (mutation::active(mutation::Break::redis_ack_at_submit)) {
      // Counted as stored once queued: reported on the loop's next turn.
      e.reported = true;
      boost::asio::post(io_, [this, token = e.token, bytes = e.bytes, topic = e.topic] {
        Delivery ok;
        ok.token = token;
        ok.bytes = bytes;
        ok.topic = topic;
        if (on_delivery_) on_delivery_(ok);
      });
    }
    shared_->queue.push_back(std::move(e));
  }
  ++outstanding_;
  shared_->cv.notify_one();
  return SubmitStatus::accepted;
}

SubmitStatus RedisStreamsSink::submit(const OutboxRecord& record, std::uint64_t token) {
  Entry e;
  e.take(record, token);
  e.stream = redis_stream_name(config_, record.topic);
  if (record.position) {
    e.id = std::to_string(record.position->commit_lsn) + "-" + std::to_string(record.position->index);
    e.source = source_;
  }
  return enqueue(std::move(e));
}

SubmitStatus RedisStreamsSink::submit_dead_letter(std::string_view reason, std::string_view topic,
                                                  std::optional<std::string_view> key,
                                                  std::optional<std::string_view> value,
                                                  const std::vector<OutboxRecord::Header>& headers,
                                                  std::uint64_t token, std::size_t bytes) {
  Entry e;
  e.take_dead_letter(reason, topic, key, value, headers, token, bytes);
  e.stream = redis_stream_name(config_, topic);
  e.dead_letter = true;
  return enqueue(std::move(e));
}

// Everything queued and not yet sent fails (transiently) rather than land
// after a record that failed: the worker drops the entries of this epoch.
void RedisStreamsSink::abort_queued() {
  {
    std::lock_guard lock(shared_->mu);
    shared_->taken_back = std::max(shared_->taken_back, epoch_);
  }
  ++epoch_;
  shared_->cv.notify_one();
}

void RedisStreamsSink::poll() {
  {
    std::lock_guard lock(shared_->mu);
    scratch_.swap(shared_->done);
  }
  for (auto& d : scratch_) report(d);
  scratch_.clear();
}

void RedisStreamsSink::report(Done& done) {
  if (outstanding_ > 0) --outstanding_;
  Entry& e = done.entry;
  if (e.reported) return;
  Delivery d = e.delivery(done.outcome == Outcome::record_error);
  switch (done.outcome) {
    case Outcome::stored:
    case Outcome::duplicate:
      d.ok = true;
      break;
    case Outcome::transient:
      d.ok = false;
      d.transient = true;
      break;
    case Outcome::denied:
      d.ok = false;
      d.denied = true;
      break;
    case Outcome::record_error:
      d.ok = false;
      d.transient = false;
      break;
  }
  d.error_code = done.code;
  d.error_message = done.message;
  if (on_delivery_) on_delivery_(d);
}

void RedisStreamsSink::run_worker() {
  ::pthread_setname_np(::pthread_self(), "wr-redis");  // (the fault campaign finds it by name)
  Worker w;
  w.backoff = std::chrono::milliseconds(config_.retry_initial_delay_ms);
  std::vector<Entry> batch;
  while (true) {
    std::uint64_t taken_back = 0;
    std::string source;  // the batch's (one source a batch: its mark is that source's)
    {
      std::unique_lock lock(shared_->mu);
      if (!wait_for_work(w, lock)) continue;
      if (shared_->stop) break;
      source = take_batch_locked(batch);
      taken_back = shared_->taken_back;
    }
    send_or_fail(w, batch, source, taken_back);
    hand_over(io_, shared_, w.out);
  }
  if (w.ctx) redisFree(w.ctx);
  // What is still queued is never reported: the sink is going away, and the
  // relay confirms nothing past it.
}

// Connected: waits up to a second for entries, else PINGs, so that a server
// gone while nothing is sent shows on /readyz (false: look again). Not
// connected: tries once, then waits out the backoff on failure; entries
// queued meanwhile fail in send_or_fail.
bool RedisStreamsSink::wait_for_work(Worker& w, std::unique_lock<std::mutex>& lock) {
  if (w.ctx) {
    if (shared_->cv.wait_for(lock, std::chrono::seconds(1), [&] { return shared_->stop || !shared_->queue.empty(); }))
      return true;
    lock.unlock();
    std::string error;
    try {
      command(w.ctx, {"PING"});
    } catch (const std::runtime_error& e) {
      error = e.what();
    }
    lock.lock();
    if (!error.empty() && w.ctx->err) {
      redisFree(w.ctx);
      w.ctx = nullptr;
      connection_lost_locked(": " + error);
    }
    return false;
  }
  if (shared_->stop) return true;
  lock.unlock();
  std::string error;
  try {
    w.ctx = connect(config_, config_.connect_timeout_ms, w.sha);
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  lock.lock();
  if (w.ctx) {
    if (!shared_->connected) spdlog::info("redis: connected to {}", where(config_));
    shared_->connected = true;
    shared_->last_error.clear();
    w.backoff = std::chrono::milliseconds(config_.retry_initial_delay_ms);
  } else {
    if (shared_->last_error != error) spdlog::error("redis: {}", error);
    shared_->connected = false;
    shared_->last_error = error;
    shared_->cv.wait_for(lock, w.backoff, [&] { return shared_->stop; });
    w.backoff = std::min(w.backoff * 2, std::chrono::milliseconds(config_.retry_max_delay_ms));
  }
  return true;
}

// The connection dropped: not ready until a new one.
void RedisStreamsSink::connection_lost_locked(const std::string& why) {
  shared_->connected = false;
  shared_->last_error = "the connection to Redis at " + where(config_) + " broke" + why;
  spdlog::warn("redis: {}; connecting again", shared_->last_error);
}

// Up to batch.size queued entries, all of one source (the mark a script
// moves is that source's); returns the source ("" for dead-letter copies).
std::string RedisStreamsSink::take_batch_locked(std::vector<Entry>& batch) {
  std::string source;
  const auto n = std::min<std::size_t>(shared_->queue.size(), static_cast<std::size_t>(config_.batch_size));
  const std::string* batch_source = nullptr;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& next = shared_->queue.front().source;
    if (next) {
      if (batch_source && *batch_source != *next) break;
      if (!batch_source) source = *next;
      batch_source = next.get();
    }
    batch.push_back(std::move(shared_->queue.front()));
    shared_->queue.pop_front();
  }
  return source;
}

// Entries taken back, behind a failure or without a connection fail here
// (transiently: the relay sends them again); the others go in one round trip.
// What fails transiently poisons its epoch; what is refused for good keeps
// its stream's mark still until the relay has taken back what followed.
void RedisStreamsSink::send_or_fail(Worker& w, std::vector<Entry>& batch, const std::string& source,
                                   std::uint64_t taken_back) {
  std::erase_if(refused_in_, [&](const auto& r) { return r.second <= taken_back; });
  if (marks_held_in_ && *marks_held_in_ <= taken_back) marks_held_in_.reset();
  // A dead-letter copy not stored holds every stream's mark (marks_held_in_).
  auto hold_marks = [&](const Entry& e) {
    if (e.dead_letter) marks_held_in_ = std::max(marks_held_in_.value_or(0), e.epoch);
  };
  auto fail = [&](Entry& e, const std::string& code, const std::string& message) {
    w.poisoned = std::max(w.poisoned, e.epoch);
    hold_marks(e);
    w.out.push_back(Done{std::move(e), Outcome::transient, code, message});
  };
  std::vector<Entry> to_send;
  for (auto& e : batch) {
    if (e.epoch <= taken_back) fail(e, "taken_back", "taken back after an earlier record failed");
    else if (e.epoch <= w.poisoned) fail(e, "after_failure", "not sent: an earlier record to Redis failed");
    else if (!w.ctx) fail(e, "connection_lost", "no connection to Redis at " + where(config_));
    else to_send.push_back(std::move(e));
  }
  batch.clear();
  if (to_send.empty()) return;
  // A dead-letter copy's event is missing from its stream until the copy is
  // stored: no mark moves in the round trip that carries one (the entries
  // after it may be stored before it is).
  const bool copy_in_batch = std::any_of(to_send.begin(), to_send.end(), [](const Entry& e) { return e.dead_letter; });
  const bool was_connected = w.ctx != nullptr;
  send_batch(w, source, to_send, !copy_in_batch);
  for (auto& d : w.out) {
    if (d.outcome != Outcome::stored && d.outcome != Outcome::duplicate) hold_marks(d.entry);
    if (d.outcome == Outcome::transient) w.poisoned = std::max(w.poisoned, d.entry.epoch);
    if (d.outcome == Outcome::record_error || d.outcome == Outcome::denied) {
      auto& epoch = refused_in_[d.entry.stream];
      epoch = std::max(epoch, d.entry.epoch);
    }
  }
  if (was_connected && !w.ctx) {
    std::lock_guard lock(shared_->mu);
    connection_lost_locked("");
  }
}

// One round trip: the append script once per stream, its entries in
// submission order, pipelined; then WAIT when configured. Outcomes go to
// w.out in submission order, as the relay gave them.
void RedisStreamsSink::send_batch(Worker& w, const std::string& source, std::vector<Entry>& batch,
                                  bool marks_may_move) {
  std::map<std::string, std::vector<std::size_t>> by_stream;
  for (std::size_t i = 0; i < batch.size(); ++i) by_stream[batch[i].stream].push_back(i);
  if (w.sha.empty() && !load_script(w, batch)) return;
  for (auto& [stream, indexes] : by_stream) append_command(w.ctx, append_args(w.sha, stream, indexes, batch, source, marks_may_move));
  std::optional<std::string> broken;  // why the connection broke
  std::vector<std::pair<std::size_t, Done>> results;
  for (auto& [stream, indexes] : by_stream) {
    redisReply* raw = nullptr;
    if (!broken && redisGetReply(w.ctx, reinterpret_cast<void**>(&raw)) != REDIS_OK)
      broken = w.ctx->errstr[0] ? w.ctx->errstr : "the connection broke";
    Reply reply(raw);
    for (std::size_t k = 0; k < indexes.size(); ++k) {
      Entry& e = batch[indexes[k]];
      results.emplace_back(indexes[k], broken ? Done{std::move(e), Outcome::transient, "connection_lost",
                                                     "no answer from Redis at " + where(config_) + ": " + *broken}
                                              : verdict(e, reply.get(), k, stream, w.sha));
    }
  }
  if (broken) {
    redisFree(w.ctx);
    w.ctx = nullptr;
  } else if (config_.wait_enabled) {
    wait_for_replicas(w, results);
  }
  std::sort(results.begin(), results.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [i, d] : results) w.out.push_back(std::move(d));
}

// The script's SHA1: loaded on connect; loaded again after a NOSCRIPT (a
// SCRIPT FLUSH meanwhile). False: the batch failed, transiently.
bool RedisStreamsSink::load_script(Worker& w, std::vector<Entry>& batch) {
  try {
    w.sha = reply_text(command(w.ctx, {"SCRIPT", "LOAD", append_script}).get());
    return true;
  } catch (const std::runtime_error& e) {
    for (auto& entry : batch) w.out.push_back(Done{std::move(entry), Outcome::transient, "redis_error", e.what()});
    if (w.ctx->err) {
      redisFree(w.ctx);
      w.ctx = nullptr;
    }
    return false;
  }
}

// EVALSHA of the append script for one stream's entries (see append_script
// for the arguments).
std::vector<std::string> RedisStreamsSink::append_args(const std::string& sha, const std::string& stream,
                                                       const std::vector<std::size_t>& indexes,
                                                       const std::vector<Entry>& batch, const std::string& source,
                                                       bool marks_may_move) {
  // The mark may move unless an entry of this stream was refused, or a
  // dead-letter copy failed, in an epoch not yet taken back.
  const auto refused = refused_in_.find(stream);
  const std::uint64_t epoch = batch[indexes.front()].epoch;
  const bool held = !marks_may_move || (marks_held_in_ && *marks_held_in_ >= epoch);
  const bool may_move = (refused == refused_in_.end() || refused->second < epoch) &&
                        (!held || mutation::active(mutation::Break::redis_mark_past_dead_letter));
  std::vector<std::string> args{"EVALSHA",    sha, "2", stream, "walrelay:mark:{" + stream + "}", std::to_string(config_.maxlen),
                                source, may_move ? "1" : "0"};
  for (auto i : indexes) {
    const Entry& e = batch[i];
    args.push_back(e.id);
    if (config_.extended) {
      args.push_back("id");
      std::vector<std::string> fields;
      if (e.key) fields.insert(fields.end(), {"key", *e.key});
      if (e.value) fields.insert(fields.end(), {"value", *e.value});
      fields.insert(fields.end(), {"id", e.event_id, "headers", headers_json(e.headers)});
      args.push_back(std::to_string(fields.size() / 2));
      args.insert(args.end(), std::make_move_iterator(fields.begin()), std::make_move_iterator(fields.end()));
    } else {
      const std::string field = e.key ? *e.key : config_.null_key;
      args.push_back(field);
      args.push_back("1");
      args.push_back(field);
      args.push_back(e.value ? *e.value : config_.null_value);
    }
  }
  return args;
}

// The k-th entry's outcome from its stream's script reply (takes e).
RedisStreamsSink::Done RedisStreamsSink::verdict(Entry& e, const redisReply* reply, std::size_t k,
                                                 const std::string& stream, std::string& sha) {
  if (reply->type == REDIS_REPLY_ERROR) {
    const std::string text = reply_text(reply);
    if (text.rfind("NOSCRIPT", 0) == 0) sha.clear();
    return Done{std::move(e), outcome_of(text), code_of(text),
                "Redis refused the append to stream \"" + stream + "\": " + text};
  }
  if (reply->type != REDIS_REPLY_ARRAY)
    return Done{std::move(e), Outcome::transient, "redis_error", "an unexpected reply from the append script"};
  if (k >= reply->elements)
    return Done{std::move(e), Outcome::transient, "after_failure",
                "not stored: an entry before it in stream \"" + stream + "\" failed"};
  const std::string status = reply_text(reply->element[k]);
  if (status == "ok") return Done{std::move(e), Outcome::stored, "", ""};
  if (status == "dup" || status == "gone") return Done{std::move(e), Outcome::duplicate, "", ""};
  if (status == "conflict") {
    std::string message = "stream \"" + stream + "\" is past this event's id " + e.id +
                          " and neither holds it nor was marked past it by this source (another writer's "
                          "entries, another database's, or an event that table.include.list or "
                          "message.prefix.include.list added to a transaction stored before): it cannot go there "
                          "in commit order";
    return Done{std::move(e), Outcome::record_error, "id_conflict", std::move(message)};
  }
  const std::string text = status.rfind("err:", 0) == 0 ? status.substr(4) : status;
  return Done{std::move(e), outcome_of(text), code_of(text),
              "Redis refused the append to stream \"" + stream + "\": " + text};
}

// Stored on the primary is not yet safe from its loss: WAIT for replicas,
// and what was stored fails transiently when too few acknowledge in time.
void RedisStreamsSink::wait_for_replicas(Worker& w, std::vector<std::pair<std::size_t, Done>>& results) {
  std::string problem;
  try {
    auto r = command(w.ctx, {"WAIT", std::to_string(config_.wait_replicas), std::to_string(config_.wait_timeout_ms)});
    if (r->type != REDIS_REPLY_INTEGER || r->integer < config_.wait_replicas)
      problem = std::to_string(r->type == REDIS_REPLY_INTEGER ? r->integer : 0) + " of " +
                std::to_string(config_.wait_replicas) + " replicas acknowledged within sink.redis.wait.timeout.ms=" +
                std::to_string(config_.wait_timeout_ms);
  } catch (const std::runtime_error& e) {
    problem = e.what();
    if (w.ctx->err) {
      redisFree(w.ctx);
      w.ctx = nullptr;
    }
  }
  if (problem.empty()) return;
  for (auto& [i, d] : results)
    if (d.outcome == Outcome::stored || d.outcome == Outcome::duplicate) {
      d.outcome = Outcome::transient;
      d.code = "wait_timeout";
      d.message = "WAIT: " + problem;
    }
}

void RedisStreamsSink::check_connectivity(int timeout_ms) {
  std::string sha;
  redisContext* ctx = connect(config_, timeout_ms, sha);
  redisFree(ctx);
}

}  // namespace walrelay
