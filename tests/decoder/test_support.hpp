// Helpers for the decoder tests: golden vector loading and a message builder.
#pragma once

#include <pgoutput/pgoutput.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pgoutput_test {

using ByteVec = std::vector<std::byte>;

// Decodes lowercase/uppercase hex; returns false on odd length or a bad digit.
bool unhex(std::string_view hex, ByteVec& out);

// The messages of tests/golden/<name>.hex, one per line. Fails the test if unreadable.
std::vector<ByteVec> load_golden(const std::string& name);

// Every golden case name (the .hex files in tests/golden).
std::vector<std::string> golden_cases();

// Protocol version of a golden case, from its "vN_" name prefix.
int golden_proto_version(const std::string& name);

// A golden case decoded in order with a pgoutput::Decoder; the messages point
// into `raw`, which the struct owns.
struct DecodedCase {
  std::vector<ByteVec> raw;                    // the wire messages
  std::vector<pgoutput::Message> messages;     // decoded, same order
  std::vector<pgoutput::DecodeContext> contexts;  // context each message was decoded in
};
// Loads and decodes a case; any decode error fails the test.
DecodedCase decode_golden(const std::string& name);

// Builds pgoutput messages by hand, big-endian.
class Builder {
 public:
  Builder& u8(std::uint8_t v);
  Builder& ch(char c) { return u8(static_cast<std::uint8_t>(c)); }
  Builder& u16(std::uint16_t v);
  Builder& u32(std::uint32_t v);
  Builder& i32(std::int32_t v) { return u32(static_cast<std::uint32_t>(v)); }
  Builder& u64(std::uint64_t v);
  Builder& i64(std::int64_t v) { return u64(static_cast<std::uint64_t>(v)); }
  Builder& cstr(std::string_view s);  // with the terminating NUL
  Builder& raw(std::string_view s);   // without NUL
  const ByteVec& bytes() const { return b_; }
  pgoutput::Bytes span() const { return b_; }
  std::size_t size() const { return b_.size(); }

 private:
  ByteVec b_;  // the message so far
};

// Text of a column (empty for null / unchanged).
std::string column_text(const pgoutput::TupleData& t, std::size_t i);

}  // namespace pgoutput_test

namespace Catch {
// Prints LSNs as %X/%X in assertion messages.
template <>
struct StringMaker<pgoutput::Lsn> {
  static std::string convert(pgoutput::Lsn lsn) { return lsn.to_string(); }
};
}  // namespace Catch
