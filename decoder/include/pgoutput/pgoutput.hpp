// pgoutput: decoder for PostgreSQL's logical replication protocol (pgoutput
// plugin, protocol versions 1 to 4) and the streaming replication envelope.
//
// No I/O, standard library only, never throws, never trusts a length.
// Decoded messages are views: every std::string_view and Bytes in them points
// into the buffer passed to decode(), which must outlive the message.
// decode() does not allocate.
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace pgoutput {

using Bytes = std::span<const std::byte>;

// Message tags of the pgoutput protocol (first byte of each message).
namespace tag {
inline constexpr char begin = 'B';
inline constexpr char commit = 'C';
inline constexpr char origin = 'O';
inline constexpr char relation = 'R';
inline constexpr char type = 'Y';
inline constexpr char insert = 'I';
inline constexpr char update = 'U';
inline constexpr char delete_ = 'D';
inline constexpr char truncate = 'T';
inline constexpr char message = 'M';
inline constexpr char stream_start = 'S';
inline constexpr char stream_stop = 'E';
inline constexpr char stream_commit = 'c';
inline constexpr char stream_abort = 'A';
inline constexpr char begin_prepare = 'b';
inline constexpr char prepare = 'P';
inline constexpr char commit_prepared = 'K';
inline constexpr char rollback_prepared = 'r';
inline constexpr char stream_prepare = 'p';
// Streaming replication envelope (first byte of CopyData).
inline constexpr char xlog_data = 'w';
inline constexpr char primary_keepalive = 'k';
inline constexpr char standby_status_update = 'r';
}  // namespace tag

// A WAL position. Printed and parsed as "%X/%X" (high/low 32 bits).
struct Lsn {
  std::uint64_t value = 0;  // byte position in the WAL

  // Parses "16/B374D848": 1-8 hex digits, '/', 1-8 hex digits, nothing else.
  static std::optional<Lsn> parse(std::string_view text);
  // Formats as "%X/%X", the way PostgreSQL prints it.
  std::string to_string() const;

  friend auto operator<=>(Lsn, Lsn) = default;
};

enum class ErrorCode : std::uint8_t {
  truncated,               // a read ran past the end of the message
  trailing_bytes,          // bytes left over after the message
  unknown_message_tag,     // first byte is not a known message tag
  unknown_flags,           // a flags field has bits we do not know
  unterminated_string,     // no NUL before the end of the message
  bad_column_kind,         // tuple column kind not n/u/t/b
  bad_length,              // a negative or impossible length/count
  bad_value,               // a field holds a value outside its domain
  unsupported_in_context,  // message not valid for this protocol version or stream state
};

// Why a message could not be decoded.
struct Error {
  ErrorCode code;           // what went wrong
  std::size_t offset;       // byte offset in the message where it was detected
  std::string_view detail;  // static text, e.g. "could not read commit: unrecognized flags"
};

// Name of an error code, e.g. "truncated".
const char* to_string(ErrorCode code) noexcept;

// Holds a T or an Error. Never throws: value() on an error (or error() on a
// value) is a programming error and calls std::abort().
template <class T>
class Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : v_(std::in_place_index<1>, error) {}         // NOLINT: implicit by design

  bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  T& value() & noexcept { return *checked_value(); }
  const T& value() const& noexcept { return *checked_value(); }
  T* operator->() noexcept { return checked_value(); }
  const T* operator->() const noexcept { return checked_value(); }
  T& operator*() & noexcept { return *checked_value(); }
  const T& operator*() const& noexcept { return *checked_value(); }

  const Error& error() const noexcept {
    const Error* e = std::get_if<1>(&v_);
    if (e == nullptr) std::abort();
    return *e;
  }

 private:
  T* checked_value() noexcept {
    T* p = std::get_if<0>(&v_);
    if (p == nullptr) std::abort();
    return p;
  }
  const T* checked_value() const noexcept {
    const T* p = std::get_if<0>(&v_);
    if (p == nullptr) std::abort();
    return p;
  }

  std::variant<T, Error> v_;  // the value or the error
};

namespace detail {
// Big-endian loads from a buffer the caller has already bounds-checked.
inline std::uint16_t load_be16(const std::byte* p) noexcept {
  return static_cast<std::uint16_t>((std::to_integer<unsigned>(p[0]) << 8) | std::to_integer<unsigned>(p[1]));
}
inline std::uint32_t load_be32(const std::byte* p) noexcept {
  return (std::to_integer<std::uint32_t>(p[0]) << 24) | (std::to_integer<std::uint32_t>(p[1]) << 16) |
         (std::to_integer<std::uint32_t>(p[2]) << 8) | std::to_integer<std::uint32_t>(p[3]);
}
inline std::uint64_t load_be64(const std::byte* p) noexcept {
  return (std::uint64_t{load_be32(p)} << 32) | load_be32(p + 4);
}
}  // namespace detail

// ---------------------------------------------------------------------------
// Streaming replication envelope (the payload of CopyData during START_REPLICATION)

// 'w': WAL data; payload is one pgoutput message.
struct XLogData {
  Lsn wal_start;          // WAL position of the start of payload
  Lsn wal_end;            // current end of WAL on the server
  std::int64_t send_time; // server clock, microseconds since 2000-01-01
  Bytes payload;          // the pgoutput message
};

// 'k': primary keepalive.
struct PrimaryKeepalive {
  Lsn wal_end;             // current end of WAL on the server
  std::int64_t send_time;  // server clock, microseconds since 2000-01-01
  bool reply_requested;    // the server wants a standby status update now
};

using ReplicationMessage = std::variant<XLogData, PrimaryKeepalive>;

// Decodes the contents of one CopyData message from the server.
Result<ReplicationMessage> decode_replication_message(Bytes copy_data) noexcept;

constexpr std::size_t standby_status_update_size = 34;

// Writes an 'r' standby status update: written, flushed, applied LSNs, client
// time (microseconds since 2000-01-01) and the reply-requested flag.
void encode_standby_status_update(std::span<std::byte, standby_status_update_size> out, Lsn written, Lsn flushed,
                                  Lsn applied, std::int64_t client_time_us, bool reply_requested) noexcept;

// Now, in microseconds since the PostgreSQL epoch (2000-01-01 00:00:00 UTC). Reads the clock.
std::int64_t pg_epoch_micros_now() noexcept;

// ---------------------------------------------------------------------------
// Tuple data

enum class ColumnKind : char { null = 'n', unchanged_toast = 'u', text = 't', binary = 'b' };

// One column of a tuple. data is empty for null and unchanged_toast.
struct Column {
  ColumnKind kind;  // how the value is sent
  Bytes data;       // the value bytes (text or binary send format)

  // The value bytes as characters (meaningful for ColumnKind::text).
  std::string_view text() const noexcept {
    return {reinterpret_cast<const char*>(data.data()), data.size()};
  }
  bool is_null() const noexcept { return kind == ColumnKind::null; }
  bool is_unchanged_toast() const noexcept { return kind == ColumnKind::unchanged_toast; }
};

// A validated, zero-copy view of a TupleData: Int16 column count, then per
// column a kind byte and, for 't' and 'b', an Int32 length and the bytes.
class TupleData {
 public:
  // Forward iterator over the columns; does not allocate.
  class iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = Column;
    using difference_type = std::ptrdiff_t;
    using pointer = const Column*;
    using reference = const Column&;

    iterator() = default;
    reference operator*() const noexcept { return current_; }
    pointer operator->() const noexcept { return &current_; }
    iterator& operator++() noexcept {
      --remaining_;
      p_ = next_;
      load();
      return *this;
    }
    iterator operator++(int) noexcept {
      iterator old = *this;
      ++*this;
      return old;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept {
      return a.remaining_ == b.remaining_ && (a.remaining_ == 0 || a.p_ == b.p_);
    }

   private:
    friend class TupleData;
    iterator(const std::byte* p, std::uint16_t remaining) noexcept : p_(p), remaining_(remaining) { load(); }
    void load() noexcept {
      if (remaining_ == 0) return;
      current_.kind = static_cast<ColumnKind>(std::to_integer<char>(*p_));
      if (current_.kind == ColumnKind::text || current_.kind == ColumnKind::binary) {
        const std::uint32_t len = detail::load_be32(p_ + 1);
        current_.data = Bytes(p_ + 5, len);
        next_ = p_ + 5 + len;
      } else {
        current_.data = Bytes();
        next_ = p_ + 1;
      }
    }

    const std::byte* p_ = nullptr;     // start of the current column
    const std::byte* next_ = nullptr;  // start of the next column
    std::uint16_t remaining_ = 0;      // columns left, including the current one
    Column current_{ColumnKind::null, {}};  // the decoded current column
  };

  TupleData() = default;

  // Number of columns.
  std::uint16_t size() const noexcept { return count_; }
  bool empty() const noexcept { return count_ == 0; }
  iterator begin() const noexcept {
    return count_ == 0 ? iterator() : iterator(raw_.data() + 2, count_);
  }
  iterator end() const noexcept { return iterator(); }
  // The column at index (linear scan), or nullopt if index >= size().
  std::optional<Column> column(std::size_t index) const noexcept {
    if (index >= count_) return std::nullopt;
    auto it = begin();
    for (std::size_t i = 0; i < index; ++i) ++it;
    return *it;
  }
  // The whole TupleData as sent, starting with the Int16 column count.
  Bytes raw() const noexcept { return raw_; }

  // Only for the decoder: raw must already be validated.
  static TupleData from_validated(Bytes raw, std::uint16_t count) noexcept {
    TupleData t;
    t.raw_ = raw;
    t.count_ = count;
    return t;
  }

 private:
  Bytes raw_;               // validated wire bytes, from the column count on
  std::uint16_t count_ = 0; // number of columns
};

// One column of a Relation message.
struct RelationColumn {
  std::uint8_t flags;          // 1 = part of the replica identity key
  std::string_view name;       // column name
  std::uint32_t type_oid;      // pg_type OID
  std::int32_t type_modifier;  // atttypmod, -1 if none

  bool is_key() const noexcept { return (flags & 1U) != 0; }
};

// A validated, zero-copy view of the columns of a Relation message.
class RelationColumns {
 public:
  // Forward iterator over the columns; does not allocate.
  class iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = RelationColumn;
    using difference_type = std::ptrdiff_t;
    using pointer = const RelationColumn*;
    using reference = const RelationColumn&;

    iterator() = default;
    reference operator*() const noexcept { return current_; }
    pointer operator->() const noexcept { return &current_; }
    iterator& operator++() noexcept {
      --remaining_;
      p_ = next_;
      load();
      return *this;
    }
    iterator operator++(int) noexcept {
      iterator old = *this;
      ++*this;
      return old;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept {
      return a.remaining_ == b.remaining_ && (a.remaining_ == 0 || a.p_ == b.p_);
    }

   private:
    friend class RelationColumns;
    iterator(const std::byte* p, std::uint16_t remaining) noexcept : p_(p), remaining_(remaining) { load(); }
    void load() noexcept {
      if (remaining_ == 0) return;
      current_.flags = std::to_integer<std::uint8_t>(p_[0]);
      const char* name = reinterpret_cast<const char*>(p_ + 1);
      const std::size_t len = std::strlen(name);  // validated: NUL is inside the message
      current_.name = std::string_view(name, len);
      const std::byte* q = p_ + 1 + len + 1;
      current_.type_oid = detail::load_be32(q);
      current_.type_modifier = static_cast<std::int32_t>(detail::load_be32(q + 4));
      next_ = q + 8;
    }

    const std::byte* p_ = nullptr;     // start of the current column
    const std::byte* next_ = nullptr;  // start of the next column
    std::uint16_t remaining_ = 0;      // columns left, including the current one
    RelationColumn current_{0, {}, 0, 0};  // the decoded current column
  };

  RelationColumns() = default;

  // Number of columns.
  std::uint16_t size() const noexcept { return count_; }
  bool empty() const noexcept { return count_ == 0; }
  iterator begin() const noexcept {
    return count_ == 0 ? iterator() : iterator(raw_.data() + 2, count_);
  }
  iterator end() const noexcept { return iterator(); }
  // The whole column list as sent, starting with the Int16 column count.
  Bytes raw() const noexcept { return raw_; }

  // Only for the decoder: raw must already be validated.
  static RelationColumns from_validated(Bytes raw, std::uint16_t count) noexcept {
    RelationColumns c;
    c.raw_ = raw;
    c.count_ = count;
    return c;
  }

 private:
  Bytes raw_;               // validated wire bytes, from the column count on
  std::uint16_t count_ = 0; // number of columns
};

// ---------------------------------------------------------------------------
// pgoutput messages. Timestamps are microseconds since 2000-01-01 00:00:00 UTC.
// xid fields that are optional are present only inside a streamed transaction
// (between Stream Start and Stream Stop).

// 'B'
struct Begin {
  Lsn final_lsn;             // LSN of the commit record
  std::int64_t commit_time;  // commit timestamp
  std::uint32_t xid;         // transaction id
};

// 'C'
struct Commit {
  std::uint8_t flags;        // always 0
  Lsn commit_lsn;            // LSN of the commit record
  Lsn end_lsn;               // end LSN of the transaction
  std::int64_t commit_time;  // commit timestamp
};

// 'O'
struct Origin {
  Lsn commit_lsn;         // commit LSN on the origin server
  std::string_view name;  // origin name
};

// 'R'
struct Relation {
  std::optional<std::uint32_t> xid;  // only in a streamed transaction
  std::uint32_t oid;                 // relation OID
  std::string_view nspname;          // schema ("" for pg_catalog)
  std::string_view relname;          // table name
  char replica_identity;             // 'd' default, 'n' nothing, 'f' full, 'i' index
  RelationColumns columns;           // column definitions
};

// 'Y'
struct Type {
  std::optional<std::uint32_t> xid;  // only in a streamed transaction
  std::uint32_t oid;                 // type OID
  std::string_view nspname;          // schema ("" for pg_catalog)
  std::string_view typname;          // type name
};

// 'I'
struct Insert {
  std::optional<std::uint32_t> xid;  // only in a streamed transaction
  std::uint32_t relation_oid;        // relation OID
  TupleData new_tuple;               // the inserted row
};

// 'U'
struct Update {
  std::optional<std::uint32_t> xid;  // only in a streamed transaction
  std::uint32_t relation_oid;        // relation OID
  std::optional<char> old_kind;      // 'K' (key) or 'O' (full old row), if sent
  std::optional<TupleData> old_tuple;  // present iff old_kind is
  TupleData new_tuple;                 // the new row
};

// 'D'
struct Delete {
  std::optional<std::uint32_t> xid;  // only in a streamed transaction
  std::uint32_t relation_oid;        // relation OID
  char old_kind;                     // 'K' (key) or 'O' (full old row)
  TupleData old_tuple;               // the key or old row
};

// 'T'
struct Truncate {
  std::optional<std::uint32_t> xid;  // only in a streamed transaction
  std::uint8_t options;              // 1 = CASCADE, 2 = RESTART IDENTITY
  std::uint32_t relation_count;      // number of relations
  Bytes relation_oids;               // relation_count big-endian Int32 OIDs

  // The i-th relation OID; 0 if i >= relation_count.
  std::uint32_t relation_oid(std::size_t i) const noexcept {
    if (i >= relation_count) return 0;
    return detail::load_be32(relation_oids.data() + i * 4);
  }
  bool cascade() const noexcept { return (options & 1U) != 0; }
  bool restart_identity() const noexcept { return (options & 2U) != 0; }
};

// 'M' (pg_logical_emit_message)
struct LogicalMessage {
  std::optional<std::uint32_t> xid;  // only in a streamed transaction
  std::uint8_t flags;                // 1 = transactional
  Lsn lsn;                           // LSN of the message
  std::string_view prefix;           // message prefix
  Bytes content;                     // message content

  bool transactional() const noexcept { return (flags & 1U) != 0; }
};

// 'S' (protocol 2+)
struct StreamStart {
  std::uint32_t xid;   // top-level transaction id
  bool first_segment;  // first stream block of this transaction
};

// 'E' (protocol 2+)
struct StreamStop {};

// 'c' (protocol 2+)
struct StreamCommit {
  std::uint32_t xid;         // transaction id
  std::uint8_t flags;        // always 0
  Lsn commit_lsn;            // LSN of the commit record
  Lsn end_lsn;               // end LSN of the transaction
  std::int64_t commit_time;  // commit timestamp
};

// 'A' (protocol 2+)
struct StreamAbort {
  std::uint32_t xid;                       // top-level transaction id
  std::uint32_t subxid;                    // aborted (sub)transaction id; == xid for the whole txn
  std::optional<Lsn> abort_lsn;            // protocol 4 with streaming = parallel
  std::optional<std::int64_t> abort_time;  // protocol 4 with streaming = parallel
};

// 'b' (protocol 3+)
struct BeginPrepare {
  Lsn prepare_lsn;            // LSN of the PREPARE record
  Lsn end_lsn;                // end LSN of the prepared transaction
  std::int64_t prepare_time;  // prepare timestamp
  std::uint32_t xid;          // transaction id
  std::string_view gid;       // global transaction id
};

// 'P' (protocol 3+)
struct Prepare {
  std::uint8_t flags;         // always 0
  Lsn prepare_lsn;            // LSN of the PREPARE record
  Lsn end_lsn;                // end LSN of the prepared transaction
  std::int64_t prepare_time;  // prepare timestamp
  std::uint32_t xid;          // transaction id
  std::string_view gid;       // global transaction id
};

// 'K' (protocol 3+)
struct CommitPrepared {
  std::uint8_t flags;        // always 0
  Lsn commit_lsn;            // LSN of the COMMIT PREPARED record
  Lsn end_lsn;               // end LSN of the commit prepared transaction
  std::int64_t commit_time;  // commit timestamp
  std::uint32_t xid;         // transaction id
  std::string_view gid;      // global transaction id
};

// 'r' (protocol 3+)
struct RollbackPrepared {
  std::uint8_t flags;           // always 0
  Lsn prepare_end_lsn;          // end LSN of the prepared transaction
  Lsn rollback_end_lsn;         // end LSN of the rollback prepared transaction
  std::int64_t prepare_time;    // prepare timestamp
  std::int64_t rollback_time;   // rollback timestamp
  std::uint32_t xid;            // transaction id
  std::string_view gid;         // global transaction id
};

// 'p' (protocol 3+): same layout as Prepare.
struct StreamPrepare {
  std::uint8_t flags;         // always 0
  Lsn prepare_lsn;            // LSN of the PREPARE record
  Lsn end_lsn;                // end LSN of the prepared transaction
  std::int64_t prepare_time;  // prepare timestamp
  std::uint32_t xid;          // transaction id
  std::string_view gid;       // global transaction id
};

using Message = std::variant<Begin, Commit, Origin, Relation, Type, Insert, Update, Delete, Truncate, LogicalMessage,
                             StreamStart, StreamStop, StreamCommit, StreamAbort, BeginPrepare, Prepare, CommitPrepared,
                             RollbackPrepared, StreamPrepare>;

// Short name of the message kind, e.g. "Insert".
const char* message_name(const Message& message) noexcept;

// What decode() needs to know that is not in the message itself.
struct DecodeContext {
  int proto_version = 1;                // 1..4, as sent in START_REPLICATION
  bool in_streamed_transaction = false; // between Stream Start and Stream Stop: xid fields present
  // Whether Stream Abort carries abort_lsn and abort_time. The server sends
  // them only with proto_version >= 4 AND streaming = parallel. Unset means
  // proto_version >= 4; set it to false for protocol 4 with streaming = on.
  std::optional<bool> stream_abort_has_lsn;
};

// Decodes one pgoutput message (the XLogData payload). Does not allocate.
Result<Message> decode(Bytes pgoutput_message, const DecodeContext& ctx) noexcept;

// Decodes messages in order, tracking Stream Start / Stream Stop itself. No I/O.
class Decoder {
 public:
  explicit Decoder(int proto_version) noexcept;
  explicit Decoder(const DecodeContext& ctx) noexcept;

  // Decodes the next message; on success updates the stream state. On error
  // the state is unchanged.
  Result<Message> decode(Bytes pgoutput_message) noexcept;
  // True between Stream Start and Stream Stop.
  bool in_streamed_transaction() const noexcept { return ctx_.in_streamed_transaction; }
  const DecodeContext& context() const noexcept { return ctx_; }

 private:
  DecodeContext ctx_;  // protocol version and stream state
};

// Views a string's characters as Bytes (convenience for tests and callers).
inline Bytes as_bytes(std::string_view s) noexcept {
  return Bytes(reinterpret_cast<const std::byte*>(s.data()), s.size());
}

}  // namespace pgoutput
