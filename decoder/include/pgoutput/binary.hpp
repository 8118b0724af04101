// pgoutput/binary: PostgreSQL's binary send formats of common types, as
// pgoutput sends column values when START_REPLICATION asks for binary 'true'
// (ColumnKind::binary). Layouts follow each type's *send function in
// PostgreSQL's src/backend/utils/adt/.
//
// No I/O, standard library only, never throws, never trusts a length: every
// reader takes the whole value and returns nullopt unless it has exactly the
// size (or the header) its type sends. What a value means (its text form, a
// Kafka timestamp) is the caller's business.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

#include "pgoutput/pgoutput.hpp"

namespace pgoutput::binary {

// Microseconds from the Unix epoch to PostgreSQL's, 2000-01-01 00:00:00 UTC.
inline constexpr std::int64_t pg_epoch_unix_micros = 946'684'800'000'000;
// The timestamps 'infinity' and '-infinity' (DT_NOEND and DT_NOBEGIN).
inline constexpr std::int64_t timestamp_infinity = std::numeric_limits<std::int64_t>::max();
inline constexpr std::int64_t timestamp_minus_infinity = std::numeric_limits<std::int64_t>::min();
// The version byte that starts jsonb's send format (jsonb_send).
inline constexpr std::byte jsonb_version{1};

// A uuid's 16 bytes in network order (uuid_send).
using Uuid = std::array<std::uint8_t, 16>;

// bool (boolsend): one byte; boolrecv reads any non-zero byte as true.
inline std::optional<bool> to_bool(Bytes value) noexcept {
  if (value.size() != 1) return std::nullopt;
  return value[0] != std::byte{0};
}

// int2 (int2send): two bytes, big-endian two's complement.
inline std::optional<std::int16_t> to_int16(Bytes value) noexcept {
  if (value.size() != 2) return std::nullopt;
  return static_cast<std::int16_t>(detail::load_be16(value.data()));
}

// int4 (int4send): four bytes, big-endian two's complement.
inline std::optional<std::int32_t> to_int32(Bytes value) noexcept {
  if (value.size() != 4) return std::nullopt;
  return static_cast<std::int32_t>(detail::load_be32(value.data()));
}

// oid (oidsend): four bytes, big-endian unsigned.
inline std::optional<std::uint32_t> to_oid(Bytes value) noexcept {
  if (value.size() != 4) return std::nullopt;
  return detail::load_be32(value.data());
}

// int8 (int8send): eight bytes, big-endian two's complement.
inline std::optional<std::int64_t> to_int64(Bytes value) noexcept {
  if (value.size() != 8) return std::nullopt;
  return static_cast<std::int64_t>(detail::load_be64(value.data()));
}

// timestamp and timestamptz (timestamp_send, timestamptz_send): microseconds
// since 2000-01-01 00:00:00 (UTC for timestamptz) as an int8, or one of the
// two infinities above.
inline std::optional<std::int64_t> to_timestamp(Bytes value) noexcept { return to_int64(value); }

// uuid (uuid_send): the 16 bytes as they are.
inline std::optional<Uuid> to_uuid(Bytes value) noexcept {
  if (value.size() != 16) return std::nullopt;
  Uuid out;
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = std::to_integer<std::uint8_t>(value[i]);
  return out;
}

// jsonb (jsonb_send): a version byte, 1, then the document's text; a view
// into `value`. nullopt for another version: its layout is unknown.
inline std::optional<std::string_view> to_jsonb_text(Bytes value) noexcept {
  if (value.empty() || value[0] != jsonb_version) return std::nullopt;
  return std::string_view(reinterpret_cast<const char*>(value.data()) + 1, value.size() - 1);
}

}  // namespace pgoutput::binary
