// Decoding of pgoutput messages and the streaming replication envelope.
// Field layouts follow PostgreSQL's src/backend/replication/logical/proto.c
// (versions 15 to 17) and the "Logical Replication Message Formats" and
// "Streaming Replication Protocol" documentation.
#include "pgoutput/pgoutput.hpp"

#include <chrono>

namespace pgoutput {
namespace {

// Protocol versions that introduced features (LOGICALREP_PROTO_*_VERSION_NUM).
constexpr int proto_min = 1;
constexpr int proto_stream = 2;
constexpr int proto_two_phase = 3;
constexpr int proto_max = 4;

// Known flag bits.
constexpr std::uint8_t message_transactional = 1;
constexpr std::uint8_t truncate_known_options = 1 | 2;
constexpr std::uint8_t relation_column_known_flags = 1;

// One checked cursor over a message: every read is bounds-checked. The first
// failure is sticky: later reads return zeros and the first error is kept, so
// a decoder can read a whole message and check once at the end.
class Reader {
 public:
  explicit Reader(Bytes buf) noexcept : buf_(buf) {}

  bool ok() const noexcept { return !failed_; }
  std::size_t offset() const noexcept { return pos_; }
  std::size_t remaining() const noexcept { return buf_.size() - pos_; }
  const Error& error() const noexcept { return error_; }

  // Records an error detected at offset, unless an earlier one is recorded.
  void fail(ErrorCode code, std::size_t at, std::string_view detail) noexcept {
    if (failed_) return;
    failed_ = true;
    error_ = Error{code, at, detail};
  }

  // Reads n raw bytes, or fails with truncated.
  Bytes bytes(std::size_t n, std::string_view detail) noexcept {
    if (failed_) return {};
    if (n > remaining()) {
      fail(ErrorCode::truncated, pos_, detail);
      return {};
    }
    Bytes out = buf_.subspan(pos_, n);
    pos_ += n;
    return out;
  }
  std::uint8_t u8(std::string_view detail) noexcept {
    Bytes b = bytes(1, detail);
    return b.empty() ? 0 : std::to_integer<std::uint8_t>(b[0]);
  }
  std::uint16_t u16(std::string_view detail) noexcept {
    Bytes b = bytes(2, detail);
    return b.empty() ? 0 : detail::load_be16(b.data());
  }
  std::uint32_t u32(std::string_view detail) noexcept {
    Bytes b = bytes(4, detail);
    return b.empty() ? 0 : detail::load_be32(b.data());
  }
  std::int32_t i32(std::string_view detail) noexcept { return static_cast<std::int32_t>(u32(detail)); }
  std::uint64_t u64(std::string_view detail) noexcept {
    Bytes b = bytes(8, detail);
    return b.empty() ? 0 : detail::load_be64(b.data());
  }
  std::int64_t i64(std::string_view detail) noexcept { return static_cast<std::int64_t>(u64(detail)); }
  Lsn lsn(std::string_view detail) noexcept { return Lsn{u64(detail)}; }

  // Reads a NUL-terminated string that must end inside the message.
  std::string_view cstring(std::string_view detail) noexcept {
    if (failed_) return {};
    const std::byte* start = buf_.data() + pos_;
    const void* nul = remaining() == 0 ? nullptr : std::memchr(start, 0, remaining());
    if (nul == nullptr) {
      fail(ErrorCode::unterminated_string, pos_, detail);
      return {};
    }
    const std::size_t len = static_cast<std::size_t>(static_cast<const std::byte*>(nul) - start);
    pos_ += len + 1;
    return {reinterpret_cast<const char*>(start), len};
  }

  // Fails with trailing_bytes unless the whole message was read (pq_getmsgend).
  void end(std::string_view detail) noexcept {
    if (!failed_ && pos_ != buf_.size()) fail(ErrorCode::trailing_bytes, pos_, detail);
  }

  // The unread rest of the message (does not advance).
  Bytes rest() const noexcept { return buf_.subspan(pos_); }

  // The bytes from `from` to the current position.
  Bytes since(std::size_t from) const noexcept { return buf_.subspan(from, pos_ - from); }

 private:
  Bytes buf_;            // the whole message
  std::size_t pos_ = 0;  // next byte to read
  bool failed_ = false;  // an error has been recorded
  Error error_{ErrorCode::truncated, 0, {}};  // the first error
};

// Reads the xid that precedes streamed changes, if inside a streamed transaction.
std::optional<std::uint32_t> read_stream_xid(Reader& r, const DecodeContext& ctx, std::string_view detail) noexcept {
  if (!ctx.in_streamed_transaction) return std::nullopt;
  return r.u32(detail);
}

// Validates a TupleData (logicalrep_read_tuple) and returns a view of it.
// The hot path of decoding, so it scans with local pointers and updates the
// reader once; every step is still bounds-checked.
TupleData read_tuple(Reader& r) noexcept {
  if (!r.ok()) return {};
  const Bytes in = r.rest();
  const std::byte* const base = in.data();
  const std::byte* const end = base + in.size();
  const std::byte* p = base;
  auto at = [&](const std::byte* q) { return r.offset() + static_cast<std::size_t>(q - base); };
  if (end - p < 2) {
    r.fail(ErrorCode::truncated, at(p), "could not read tuple: missing column count");
    return {};
  }
  const std::uint16_t natts = detail::load_be16(p);
  p += 2;
  for (std::uint32_t i = 0; i < natts; ++i) {
    if (p == end) {
      r.fail(ErrorCode::truncated, at(p), "could not read tuple: missing column kind");
      return {};
    }
    const char kind = std::to_integer<char>(*p);
    if (kind == static_cast<char>(ColumnKind::text) || kind == static_cast<char>(ColumnKind::binary)) {
      if (end - p < 5) {
        r.fail(ErrorCode::truncated, at(p + 1), "could not read tuple: missing column length");
        return {};
      }
      const auto len = static_cast<std::int32_t>(detail::load_be32(p + 1));
      if (len < 0) {
        r.fail(ErrorCode::bad_length, at(p + 1), "could not read tuple: negative column length");
        return {};
      }
      p += 5;
      if (static_cast<std::size_t>(end - p) < static_cast<std::size_t>(len)) {
        r.fail(ErrorCode::truncated, at(p), "could not read tuple: column value runs past the message");
        return {};
      }
      p += len;
    } else if (kind == static_cast<char>(ColumnKind::null) || kind == static_cast<char>(ColumnKind::unchanged_toast)) {
      p += 1;
    } else {
      r.fail(ErrorCode::bad_column_kind, at(p), "could not read tuple: unrecognized column kind");
      return {};
    }
  }
  const auto n = static_cast<std::size_t>(p - base);
  r.bytes(n, "");  // cannot fail: n <= in.size()
  return TupleData::from_validated(in.first(n), natts);
}

// Reads a flags byte that must be zero.
std::uint8_t read_zero_flags(Reader& r, std::string_view missing, std::string_view unknown) noexcept {
  const std::size_t at = r.offset();
  const std::uint8_t flags = r.u8(missing);
  if (r.ok() && flags != 0) r.fail(ErrorCode::unknown_flags, at, unknown);
  return flags;
}

// Fails unless the message is allowed outside or inside a stream block as required.
bool check_stream_state(Reader& r, const DecodeContext& ctx, bool allowed_in_stream, bool allowed_outside,
                        std::string_view detail) noexcept {
  if ((ctx.in_streamed_transaction && !allowed_in_stream) || (!ctx.in_streamed_transaction && !allowed_outside)) {
    r.fail(ErrorCode::unsupported_in_context, 0, detail);
    return false;
  }
  return true;
}

// Fails unless the protocol version is at least `min`.
bool check_version(Reader& r, const DecodeContext& ctx, int min, std::string_view detail) noexcept {
  if (ctx.proto_version < min) {
    r.fail(ErrorCode::unsupported_in_context, 0, detail);
    return false;
  }
  return true;
}

// logicalrep_read_begin
void read_begin(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  if (!check_stream_state(r, ctx, false, true, "could not read begin: inside a streamed transaction")) return;
  Begin& m = out.emplace<Begin>();
  m.final_lsn = r.lsn("could not read begin: missing final LSN");
  m.commit_time = r.i64("could not read begin: missing commit time");
  m.xid = r.u32("could not read begin: missing xid");
  r.end("could not read begin: trailing bytes");
}

// logicalrep_read_commit
void read_commit(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  if (!check_stream_state(r, ctx, false, true, "could not read commit: inside a streamed transaction")) return;
  Commit& m = out.emplace<Commit>();
  m.flags = read_zero_flags(r, "could not read commit: missing flags", "could not read commit: unrecognized flags");
  m.commit_lsn = r.lsn("could not read commit: missing commit LSN");
  m.end_lsn = r.lsn("could not read commit: missing end LSN");
  m.commit_time = r.i64("could not read commit: missing commit time");
  r.end("could not read commit: trailing bytes");
}

// logicalrep_read_origin
void read_origin(Reader& r, Message& out) noexcept {
  Origin& m = out.emplace<Origin>();
  m.commit_lsn = r.lsn("could not read origin: missing commit LSN");
  m.name = r.cstring("could not read origin: unterminated name");
  r.end("could not read origin: trailing bytes");
}

// logicalrep_read_rel
void read_relation(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  Relation& m = out.emplace<Relation>();
  m.xid = read_stream_xid(r, ctx, "could not read relation: missing xid");
  m.oid = r.u32("could not read relation: missing OID");
  m.nspname = r.cstring("could not read relation: unterminated namespace");
  m.relname = r.cstring("could not read relation: unterminated relation name");
  const std::size_t ident_at = r.offset();
  m.replica_identity = static_cast<char>(r.u8("could not read relation: missing replica identity"));
  if (r.ok()) {
    switch (m.replica_identity) {
      case 'd':
      case 'n':
      case 'f':
      case 'i':
        break;
      default:
        r.fail(ErrorCode::bad_value, ident_at, "could not read relation: unrecognized replica identity");
    }
  }
  const std::size_t cols_start = r.offset();
  const std::uint16_t natts = r.u16("could not read relation: missing column count");
  for (std::uint32_t i = 0; i < natts && r.ok(); ++i) {
    const std::size_t flags_at = r.offset();
    const std::uint8_t flags = r.u8("could not read relation: missing column flags");
    if (r.ok() && (flags & ~relation_column_known_flags) != 0) {
      r.fail(ErrorCode::unknown_flags, flags_at, "could not read relation: unrecognized column flags");
    }
    r.cstring("could not read relation: unterminated column name");
    r.u32("could not read relation: missing column type");
    r.i32("could not read relation: missing column type modifier");
  }
  if (r.ok()) m.columns = RelationColumns::from_validated(r.since(cols_start), natts);
  r.end("could not read relation: trailing bytes");
}

// logicalrep_read_typ
void read_type(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  Type& m = out.emplace<Type>();
  m.xid = read_stream_xid(r, ctx, "could not read type: missing xid");
  m.oid = r.u32("could not read type: missing OID");
  m.nspname = r.cstring("could not read type: unterminated namespace");
  m.typname = r.cstring("could not read type: unterminated type name");
  r.end("could not read type: trailing bytes");
}

// logicalrep_read_insert
void read_insert(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  Insert& m = out.emplace<Insert>();
  m.xid = read_stream_xid(r, ctx, "could not read insert: missing xid");
  m.relation_oid = r.u32("could not read insert: missing relation OID");
  const std::size_t at = r.offset();
  const auto action = static_cast<char>(r.u8("could not read insert: missing tuple marker"));
  if (r.ok() && action != 'N') r.fail(ErrorCode::bad_value, at, "could not read insert: expected new tuple 'N'");
  m.new_tuple = read_tuple(r);
  r.end("could not read insert: trailing bytes");
}

// logicalrep_read_update
void read_update(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  Update& m = out.emplace<Update>();
  m.xid = read_stream_xid(r, ctx, "could not read update: missing xid");
  m.relation_oid = r.u32("could not read update: missing relation OID");
  std::size_t at = r.offset();
  auto action = static_cast<char>(r.u8("could not read update: missing tuple marker"));
  if (r.ok() && (action == 'K' || action == 'O')) {
    m.old_kind = action;
    m.old_tuple = read_tuple(r);
    at = r.offset();
    action = static_cast<char>(r.u8("could not read update: missing new tuple marker"));
  }
  if (r.ok() && action != 'N') r.fail(ErrorCode::bad_value, at, "could not read update: expected 'K', 'O' or 'N'");
  m.new_tuple = read_tuple(r);
  r.end("could not read update: trailing bytes");
}

// logicalrep_read_delete
void read_delete(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  Delete& m = out.emplace<Delete>();
  m.xid = read_stream_xid(r, ctx, "could not read delete: missing xid");
  m.relation_oid = r.u32("could not read delete: missing relation OID");
  const std::size_t at = r.offset();
  m.old_kind = static_cast<char>(r.u8("could not read delete: missing tuple marker"));
  if (r.ok() && m.old_kind != 'K' && m.old_kind != 'O') {
    r.fail(ErrorCode::bad_value, at, "could not read delete: expected 'K' or 'O'");
  }
  m.old_tuple = read_tuple(r);
  r.end("could not read delete: trailing bytes");
}

// logicalrep_read_truncate
void read_truncate(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  Truncate& m = out.emplace<Truncate>();
  m.xid = read_stream_xid(r, ctx, "could not read truncate: missing xid");
  const std::size_t count_at = r.offset();
  const std::int32_t count = r.i32("could not read truncate: missing relation count");
  if (r.ok() && count < 0) r.fail(ErrorCode::bad_length, count_at, "could not read truncate: negative relation count");
  const std::size_t opt_at = r.offset();
  m.options = r.u8("could not read truncate: missing options");
  if (r.ok() && (m.options & ~truncate_known_options) != 0) {
    r.fail(ErrorCode::unknown_flags, opt_at, "could not read truncate: unrecognized options");
  }
  if (r.ok()) {
    m.relation_count = static_cast<std::uint32_t>(count);
    m.relation_oids = r.bytes(std::size_t{m.relation_count} * 4, "could not read truncate: relation OIDs run past the message");
  }
  if (!r.ok()) m.relation_count = 0;
  r.end("could not read truncate: trailing bytes");
}

// logicalrep_read_message (the reader lives in the subscriber; layout from logicalrep_write_message)
void read_message(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  LogicalMessage& m = out.emplace<LogicalMessage>();
  m.xid = read_stream_xid(r, ctx, "could not read message: missing xid");
  const std::size_t flags_at = r.offset();
  m.flags = r.u8("could not read message: missing flags");
  if (r.ok() && (m.flags & ~message_transactional) != 0) {
    r.fail(ErrorCode::unknown_flags, flags_at, "could not read message: unrecognized flags");
  }
  m.lsn = r.lsn("could not read message: missing LSN");
  m.prefix = r.cstring("could not read message: unterminated prefix");
  const std::size_t len_at = r.offset();
  const std::int32_t len = r.i32("could not read message: missing content length");
  if (r.ok() && len < 0) r.fail(ErrorCode::bad_length, len_at, "could not read message: negative content length");
  if (r.ok()) m.content = r.bytes(static_cast<std::size_t>(len), "could not read message: content runs past the message");
  r.end("could not read message: trailing bytes");
}

// logicalrep_read_stream_start
void read_stream_start(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  if (!check_version(r, ctx, proto_stream, "could not read stream start: needs protocol version 2")) return;
  if (!check_stream_state(r, ctx, false, true, "could not read stream start: already inside a stream")) return;
  StreamStart& m = out.emplace<StreamStart>();
  m.xid = r.u32("could not read stream start: missing xid");
  const std::size_t at = r.offset();
  const std::uint8_t first = r.u8("could not read stream start: missing first-segment flag");
  if (r.ok() && first > 1) r.fail(ErrorCode::bad_value, at, "could not read stream start: first-segment flag not 0 or 1");
  m.first_segment = first == 1;
  r.end("could not read stream start: trailing bytes");
}

// logicalrep_write_stream_stop has no fields.
void read_stream_stop(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  if (!check_version(r, ctx, proto_stream, "could not read stream stop: needs protocol version 2")) return;
  if (!check_stream_state(r, ctx, true, false, "could not read stream stop: not inside a stream")) return;
  out.emplace<StreamStop>();
  r.end("could not read stream stop: trailing bytes");
}

// logicalrep_read_stream_commit
void read_stream_commit(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  if (!check_version(r, ctx, proto_stream, "could not read stream commit: needs protocol version 2")) return;
  if (!check_stream_state(r, ctx, false, true, "could not read stream commit: inside a stream")) return;
  StreamCommit& m = out.emplace<StreamCommit>();
  m.xid = r.u32("could not read stream commit: missing xid");
  m.flags = read_zero_flags(r, "could not read stream commit: missing flags",
                            "could not read stream commit: unrecognized flags");
  m.commit_lsn = r.lsn("could not read stream commit: missing commit LSN");
  m.end_lsn = r.lsn("could not read stream commit: missing end LSN");
  m.commit_time = r.i64("could not read stream commit: missing commit time");
  r.end("could not read stream commit: trailing bytes");
}

// logicalrep_read_stream_abort
void read_stream_abort(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  if (!check_version(r, ctx, proto_stream, "could not read stream abort: needs protocol version 2")) return;
  if (!check_stream_state(r, ctx, false, true, "could not read stream abort: inside a stream")) return;
  StreamAbort& m = out.emplace<StreamAbort>();
  m.xid = r.u32("could not read stream abort: missing xid");
  m.subxid = r.u32("could not read stream abort: missing subtransaction xid");
  const bool has_lsn = ctx.stream_abort_has_lsn.value_or(ctx.proto_version >= proto_max);
  if (has_lsn) {
    if (!check_version(r, ctx, proto_max, "could not read stream abort: abort LSN needs protocol version 4")) {
      return;
    }
    const Lsn lsn = r.lsn("could not read stream abort: missing abort LSN");
    const std::int64_t time = r.i64("could not read stream abort: missing abort time");
    if (r.ok()) {
      m.abort_lsn = lsn;
      m.abort_time = time;
    }
  }
  r.end("could not read stream abort: trailing bytes");
}

// Shared layout of Prepare and Stream Prepare (logicalrep_read_prepare_common).
template <class T>
void read_prepare_common(Reader& r, Message& out, std::string_view missing_flags, std::string_view unknown_flags,
                                    std::string_view trailing) noexcept {
  T& m = out.emplace<T>();
  m.flags = read_zero_flags(r, missing_flags, unknown_flags);
  m.prepare_lsn = r.lsn("could not read prepare: missing prepare LSN");
  m.end_lsn = r.lsn("could not read prepare: missing end LSN");
  m.prepare_time = r.i64("could not read prepare: missing prepare time");
  m.xid = r.u32("could not read prepare: missing xid");
  m.gid = r.cstring("could not read prepare: unterminated gid");
  r.end(trailing);
}

// logicalrep_read_begin_prepare
void read_begin_prepare(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  if (!check_version(r, ctx, proto_two_phase, "could not read begin prepare: needs protocol version 3")) {
    return;
  }
  if (!check_stream_state(r, ctx, false, true, "could not read begin prepare: inside a stream")) return;
  BeginPrepare& m = out.emplace<BeginPrepare>();
  m.prepare_lsn = r.lsn("could not read begin prepare: missing prepare LSN");
  m.end_lsn = r.lsn("could not read begin prepare: missing end LSN");
  m.prepare_time = r.i64("could not read begin prepare: missing prepare time");
  m.xid = r.u32("could not read begin prepare: missing xid");
  m.gid = r.cstring("could not read begin prepare: unterminated gid");
  r.end("could not read begin prepare: trailing bytes");
}

// logicalrep_read_prepare
void read_prepare(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  if (!check_version(r, ctx, proto_two_phase, "could not read prepare: needs protocol version 3")) return;
  if (!check_stream_state(r, ctx, false, true, "could not read prepare: inside a stream")) return;
  read_prepare_common<Prepare>(r, out, "could not read prepare: missing flags",
                                      "could not read prepare: unrecognized flags",
                                      "could not read prepare: trailing bytes");
}

// logicalrep_read_stream_prepare
void read_stream_prepare(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  if (!check_version(r, ctx, proto_two_phase, "could not read stream prepare: needs protocol version 3")) {
    return;
  }
  if (!check_stream_state(r, ctx, false, true, "could not read stream prepare: inside a stream")) return;
  read_prepare_common<StreamPrepare>(r, out, "could not read stream prepare: missing flags",
                                            "could not read stream prepare: unrecognized flags",
                                            "could not read stream prepare: trailing bytes");
}

// logicalrep_read_commit_prepared
void read_commit_prepared(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  if (!check_version(r, ctx, proto_two_phase, "could not read commit prepared: needs protocol version 3")) {
    return;
  }
  if (!check_stream_state(r, ctx, false, true, "could not read commit prepared: inside a stream")) return;
  CommitPrepared& m = out.emplace<CommitPrepared>();
  m.flags = read_zero_flags(r, "could not read commit prepared: missing flags",
                            "could not read commit prepared: unrecognized flags");
  m.commit_lsn = r.lsn("could not read commit prepared: missing commit LSN");
  m.end_lsn = r.lsn("could not read commit prepared: missing end LSN");
  m.commit_time = r.i64("could not read commit prepared: missing commit time");
  m.xid = r.u32("could not read commit prepared: missing xid");
  m.gid = r.cstring("could not read commit prepared: unterminated gid");
  r.end("could not read commit prepared: trailing bytes");
}

// logicalrep_read_rollback_prepared
void read_rollback_prepared(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  if (!check_version(r, ctx, proto_two_phase, "could not read rollback prepared: needs protocol version 3")) {
    return;
  }
  if (!check_stream_state(r, ctx, false, true, "could not read rollback prepared: inside a stream")) return;
  RollbackPrepared& m = out.emplace<RollbackPrepared>();
  m.flags = read_zero_flags(r, "could not read rollback prepared: missing flags",
                            "could not read rollback prepared: unrecognized flags");
  m.prepare_end_lsn = r.lsn("could not read rollback prepared: missing prepare end LSN");
  m.rollback_end_lsn = r.lsn("could not read rollback prepared: missing rollback end LSN");
  m.prepare_time = r.i64("could not read rollback prepared: missing prepare time");
  m.rollback_time = r.i64("could not read rollback prepared: missing rollback time");
  m.xid = r.u32("could not read rollback prepared: missing xid");
  m.gid = r.cstring("could not read rollback prepared: unterminated gid");
  r.end("could not read rollback prepared: trailing bytes");
}

constexpr std::int64_t unix_to_pg_epoch_micros = 946'684'800LL * 1'000'000LL;

void store_be64(std::byte* p, std::uint64_t v) noexcept {
  for (int i = 7; i >= 0; --i) {
    p[i] = static_cast<std::byte>(v & 0xFFU);
    v >>= 8;
  }
}

}  // namespace

const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::truncated: return "truncated";
    case ErrorCode::trailing_bytes: return "trailing_bytes";
    case ErrorCode::unknown_message_tag: return "unknown_message_tag";
    case ErrorCode::unknown_flags: return "unknown_flags";
    case ErrorCode::unterminated_string: return "unterminated_string";
    case ErrorCode::bad_column_kind: return "bad_column_kind";
    case ErrorCode::bad_length: return "bad_length";
    case ErrorCode::bad_value: return "bad_value";
    case ErrorCode::unsupported_in_context: return "unsupported_in_context";
  }
  return "unknown";
}

std::optional<Lsn> Lsn::parse(std::string_view text) {
  const std::size_t slash = text.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  auto parse_half = [](std::string_view s) -> std::optional<std::uint32_t> {
    if (s.empty() || s.size() > 8) return std::nullopt;
    std::uint32_t v = 0;
    for (char c : s) {
      unsigned d = 0;
      if (c >= '0' && c <= '9') {
        d = static_cast<unsigned>(c - '0');
      } else if (c >= 'A' && c <= 'F') {
        d = static_cast<unsigned>(c - 'A' + 10);
      } else if (c >= 'a' && c <= 'f') {
        d = static_cast<unsigned>(c - 'a' + 10);
      } else {
        return std::nullopt;
      }
      v = (v << 4) | d;
    }
    return v;
  };
  const auto hi = parse_half(text.substr(0, slash));
  const auto lo = parse_half(text.substr(slash + 1));
  if (!hi || !lo) return std::nullopt;
  return Lsn{(std::uint64_t{*hi} << 32) | *lo};
}

std::string Lsn::to_string() const {
  static constexpr char digits[] = "0123456789ABCDEF";
  auto append_hex = [](std::string& out, std::uint32_t v) {
    char buf[8];
    int n = 0;
    do {
      buf[n++] = digits[v & 0xFU];
      v >>= 4;
    } while (v != 0);
    while (n > 0) out.push_back(buf[--n]);
  };
  std::string out;
  out.reserve(17);
  append_hex(out, static_cast<std::uint32_t>(value >> 32));
  out.push_back('/');
  append_hex(out, static_cast<std::uint32_t>(value));
  return out;
}

Result<ReplicationMessage> decode_replication_message(Bytes copy_data) noexcept {
  Reader r(copy_data);
  const auto t = static_cast<char>(r.u8("could not read replication message: empty"));
  if (!r.ok()) return r.error();
  if (t == tag::xlog_data) {
    XLogData m{};
    m.wal_start = r.lsn("could not read XLogData: missing WAL start");
    m.wal_end = r.lsn("could not read XLogData: missing WAL end");
    m.send_time = r.i64("could not read XLogData: missing send time");
    if (!r.ok()) return r.error();
    m.payload = r.bytes(r.remaining(), "");
    return ReplicationMessage(m);
  }
  if (t == tag::primary_keepalive) {
    PrimaryKeepalive m{};
    m.wal_end = r.lsn("could not read keepalive: missing WAL end");
    m.send_time = r.i64("could not read keepalive: missing send time");
    const std::size_t at = r.offset();
    const std::uint8_t reply = r.u8("could not read keepalive: missing reply flag");
    if (r.ok() && reply > 1) r.fail(ErrorCode::bad_value, at, "could not read keepalive: reply flag not 0 or 1");
    m.reply_requested = reply == 1;
    r.end("could not read keepalive: trailing bytes");
    if (!r.ok()) return r.error();
    return ReplicationMessage(m);
  }
  return Error{ErrorCode::unknown_message_tag, 0, "could not read replication message: unknown tag"};
}

void encode_standby_status_update(std::span<std::byte, standby_status_update_size> out, Lsn written, Lsn flushed,
                                  Lsn applied, std::int64_t client_time_us, bool reply_requested) noexcept {
  out[0] = static_cast<std::byte>(tag::standby_status_update);
  store_be64(out.data() + 1, written.value);
  store_be64(out.data() + 9, flushed.value);
  store_be64(out.data() + 17, applied.value);
  store_be64(out.data() + 25, static_cast<std::uint64_t>(client_time_us));
  out[33] = static_cast<std::byte>(reply_requested ? 1 : 0);
}

std::int64_t pg_epoch_micros_now() noexcept {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return std::chrono::duration_cast<std::chrono::microseconds>(now).count() - unix_to_pg_epoch_micros;
}

namespace {

// Decodes one message into out; errors are recorded in r.
void decode_into(Reader& r, const DecodeContext& ctx, Message& out) noexcept {
  if (ctx.proto_version < proto_min || ctx.proto_version > proto_max) {
    r.fail(ErrorCode::unsupported_in_context, 0, "could not decode: protocol version not in 1..4");
    return;
  }
  if (ctx.in_streamed_transaction && ctx.proto_version < proto_stream) {
    r.fail(ErrorCode::unsupported_in_context, 0, "could not decode: streamed transaction needs protocol version 2");
    return;
  }
  const auto t = static_cast<char>(r.u8("could not decode: empty message"));
  if (!r.ok()) return;
  switch (t) {
    case tag::begin: return read_begin(r, ctx, out);
    case tag::commit: return read_commit(r, ctx, out);
    case tag::origin: return read_origin(r, out);
    case tag::relation: return read_relation(r, ctx, out);
    case tag::type: return read_type(r, ctx, out);
    case tag::insert: return read_insert(r, ctx, out);
    case tag::update: return read_update(r, ctx, out);
    case tag::delete_: return read_delete(r, ctx, out);
    case tag::truncate: return read_truncate(r, ctx, out);
    case tag::message: return read_message(r, ctx, out);
    case tag::stream_start: return read_stream_start(r, ctx, out);
    case tag::stream_stop: return read_stream_stop(r, ctx, out);
    case tag::stream_commit: return read_stream_commit(r, ctx, out);
    case tag::stream_abort: return read_stream_abort(r, ctx, out);
    case tag::begin_prepare: return read_begin_prepare(r, ctx, out);
    case tag::prepare: return read_prepare(r, ctx, out);
    case tag::commit_prepared: return read_commit_prepared(r, ctx, out);
    case tag::rollback_prepared: return read_rollback_prepared(r, ctx, out);
    case tag::stream_prepare: return read_stream_prepare(r, ctx, out);
    default: break;
  }
  r.fail(ErrorCode::unknown_message_tag, 0, "could not decode: unknown message tag");
}

}  // namespace

// The message is built in place inside the result (one return object, so no
// copies of the variant on the success path).
Result<Message> decode(Bytes pgoutput_message, const DecodeContext& ctx) noexcept {
  Result<Message> result{Message{}};
  Reader r(pgoutput_message);
  decode_into(r, ctx, result.value());
  if (!r.ok()) result = r.error();
  return result;
}

const char* message_name(const Message& message) noexcept {
  static constexpr const char* names[] = {
      "Begin",        "Commit",      "Origin",       "Relation",     "Type",         "Insert",  "Update",
      "Delete",       "Truncate",    "Message",      "StreamStart",  "StreamStop",   "StreamCommit",
      "StreamAbort",  "BeginPrepare", "Prepare",     "CommitPrepared", "RollbackPrepared", "StreamPrepare"};
  static_assert(std::size(names) == std::variant_size_v<Message>);
  return names[message.index()];
}

Decoder::Decoder(int proto_version) noexcept { ctx_.proto_version = proto_version; }

Decoder::Decoder(const DecodeContext& ctx) noexcept : ctx_(ctx) {}

Result<Message> Decoder::decode(Bytes pgoutput_message) noexcept {
  Result<Message> result = pgoutput::decode(pgoutput_message, ctx_);
  if (result.has_value()) {
    if (std::holds_alternative<StreamStart>(*result)) {
      ctx_.in_streamed_transaction = true;
    } else if (std::holds_alternative<StreamStop>(*result)) {
      ctx_.in_streamed_transaction = false;
    }
  }
  return result;
}

}  // namespace pgoutput
