// PostgreSQL's binary send formats (pgoutput/binary.hpp): the values of a
// row captured from PostgreSQL 15 in binary mode, edge values, and every
// length but the right one refused.
#include "test_support.hpp"

#include <pgoutput/binary.hpp>

#include <catch2/catch.hpp>

#include <limits>
#include <vector>

using namespace pgoutput;
using pgoutput_test::Builder;
using pgoutput_test::ByteVec;

namespace {

// The Insert of tests/golden/v1_binary: (1, 1234567890123, 'héllo',
// '2024-01-02 03:04:05+00', 'a0eebc99-...', true, 3.14, '\xdeadbeef', NULL).
std::vector<Column> golden_binary_row(pgoutput_test::DecodedCase& c) {
  for (const auto& m : c.messages) {
    if (const auto* ins = std::get_if<Insert>(&m)) return {ins->new_tuple.begin(), ins->new_tuple.end()};
  }
  FAIL("no Insert in v1_binary");
  return {};
}

// A value of n bytes, all 0xAB: only its length matters to the checks that use it.
ByteVec filler(std::size_t n) { return ByteVec(n, std::byte{0xAB}); }

}  // namespace

TEST_CASE("binary: the golden row's values read as PostgreSQL sent them", "[binary]") {
  auto c = pgoutput_test::decode_golden("v1_binary");
  const auto cols = golden_binary_row(c);
  REQUIRE(cols.size() == 9);
  CHECK(binary::to_int32(cols[0].data) == 1);
  CHECK(binary::to_int64(cols[1].data) == 1234567890123);
  // 2024-01-02 03:04:05+00 is 757479845 s after 2000-01-01.
  CHECK(binary::to_timestamp(cols[3].data) == 757479845000000);
  const auto uuid = binary::to_uuid(cols[4].data);
  REQUIRE(uuid);
  CHECK(*uuid == binary::Uuid{0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8,
                              0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38, 0x0a, 0x11});
  CHECK(binary::to_bool(cols[5].data) == true);
  // Text is sent as its bytes: no reader needed, and none of the fixed-size ones accepts 'héllo'.
  CHECK(cols[2].text() == "h\xC3\xA9llo");
  CHECK_FALSE(binary::to_int32(cols[2].data));
  CHECK_FALSE(binary::to_int64(cols[2].data));
  CHECK_FALSE(binary::to_uuid(cols[2].data));
}

TEST_CASE("binary: integers are big-endian two's complement", "[binary]") {
  Builder b2;
  b2.u16(0xFFFF);
  CHECK(binary::to_int16(b2.span()) == -1);
  Builder b2max;
  b2max.u16(0x7FFF);
  CHECK(binary::to_int16(b2max.span()) == std::numeric_limits<std::int16_t>::max());
  Builder b2min;
  b2min.u16(0x8000);
  CHECK(binary::to_int16(b2min.span()) == std::numeric_limits<std::int16_t>::min());

  Builder b4;
  b4.u32(0x80000000U);
  CHECK(binary::to_int32(b4.span()) == std::numeric_limits<std::int32_t>::min());
  CHECK(binary::to_oid(b4.span()) == 0x80000000U);
  Builder b4max;
  b4max.u32(0xFFFFFFFFU);
  CHECK(binary::to_int32(b4max.span()) == -1);
  CHECK(binary::to_oid(b4max.span()) == 4294967295U);

  Builder b8;
  b8.u64(0x8000000000000000ULL);
  CHECK(binary::to_int64(b8.span()) == std::numeric_limits<std::int64_t>::min());
  Builder b8neg;
  b8neg.i64(-258);
  CHECK(binary::to_int64(b8neg.span()) == -258);
}

TEST_CASE("binary: timestamps count microseconds from 2000-01-01, infinities included", "[binary]") {
  Builder epoch;
  epoch.i64(0);
  CHECK(binary::to_timestamp(epoch.span()) == 0);
  Builder before;
  before.i64(-1);
  CHECK(binary::to_timestamp(before.span()) == -1);
  Builder inf;
  inf.i64(std::numeric_limits<std::int64_t>::max());
  CHECK(binary::to_timestamp(inf.span()) == binary::timestamp_infinity);
  Builder minus_inf;
  minus_inf.i64(std::numeric_limits<std::int64_t>::min());
  CHECK(binary::to_timestamp(minus_inf.span()) == binary::timestamp_minus_infinity);
  // 2000-01-01 is 10957 days after 1970-01-01.
  CHECK(binary::pg_epoch_unix_micros == 10957LL * 86400 * 1000000);
}

TEST_CASE("binary: bool is one byte, any non-zero byte true", "[binary]") {
  for (int v : {0, 1, 2, 0xFF}) {
    Builder b;
    b.u8(static_cast<std::uint8_t>(v));
    CHECK(binary::to_bool(b.span()) == (v != 0));
  }
}

TEST_CASE("binary: jsonb is a version byte and the text", "[binary]") {
  Builder b;
  b.u8(1).raw(R"({"a": 1})");
  CHECK(binary::to_jsonb_text(b.span()) == std::optional<std::string_view>(R"({"a": 1})"));
  Builder empty_doc;
  empty_doc.u8(1);
  CHECK(binary::to_jsonb_text(empty_doc.span()) == std::optional<std::string_view>(""));
  Builder version2;
  version2.u8(2).raw("{}");
  CHECK_FALSE(binary::to_jsonb_text(version2.span()));
  CHECK_FALSE(binary::to_jsonb_text(Bytes()));
}

TEST_CASE("binary: a value of any other length is refused, never read past", "[binary]") {
  for (std::size_t n = 0; n <= 17; ++n) {
    INFO(n << " bytes");
    // A prefix of a larger buffer: only the length check can refuse it.
    const ByteVec big = filler(32);
    const Bytes v = Bytes(big).first(n);
    CHECK(binary::to_bool(v).has_value() == (n == 1));
    CHECK(binary::to_int16(v).has_value() == (n == 2));
    CHECK(binary::to_int32(v).has_value() == (n == 4));
    CHECK(binary::to_oid(v).has_value() == (n == 4));
    CHECK(binary::to_int64(v).has_value() == (n == 8));
    CHECK(binary::to_timestamp(v).has_value() == (n == 8));
    CHECK(binary::to_uuid(v).has_value() == (n == 16));
  }
}
