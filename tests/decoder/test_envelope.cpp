// LSNs, the streaming replication envelope and standby status updates.
#include "test_support.hpp"

#include <catch2/catch.hpp>

#include <array>

using namespace pgoutput;
using pgoutput_test::Builder;

TEST_CASE("LSN parse and print round trip", "[lsn]") {
  auto l = Lsn::parse("16/B374D848");
  REQUIRE(l);
  CHECK(l->value == 0x16B374D848ULL);
  CHECK(l->to_string() == "16/B374D848");
  CHECK(Lsn::parse("0/0")->value == 0);
  CHECK(Lsn{}.to_string() == "0/0");
  CHECK(Lsn::parse("FFFFFFFF/FFFFFFFF")->value == ~0ULL);
  CHECK(Lsn{~0ULL}.to_string() == "FFFFFFFF/FFFFFFFF");
  CHECK(Lsn::parse("a/bc")->to_string() == "A/BC");
  CHECK(Lsn::parse("00000001/00000002")->value == 0x100000002ULL);
  for (std::uint64_t v : {0ULL, 1ULL, 0xFFFFFFFFULL, 0x100000000ULL, 0x123456789ABCDEFULL}) {
    CHECK(Lsn::parse(Lsn{v}.to_string())->value == v);
  }
  for (const char* bad : {"", "/", "1/", "/1", "123456789/0", "0/123456789", "G/0", "1/2/3", " 1/2", "1/2 ", "-1/2",
                          "+1/2", "1;2", "0x1/2"}) {
    INFO(bad);
    CHECK(!Lsn::parse(bad));
  }
  CHECK(Lsn{1} < Lsn{2});
  CHECK(Lsn{3} == Lsn{3});
}

TEST_CASE("XLogData envelope", "[envelope]") {
  Builder b;
  b.ch('w').u64(0x100).u64(0x200).i64(42).raw("Epayload");
  auto r = decode_replication_message(b.span());
  REQUIRE(r);
  const auto& x = std::get<XLogData>(*r);
  CHECK(x.wal_start.value == 0x100);
  CHECK(x.wal_end.value == 0x200);
  CHECK(x.send_time == 42);
  CHECK(x.payload.size() == 8);
  CHECK(std::to_integer<char>(x.payload[0]) == 'E');
  for (std::size_t n = 0; n < 25; ++n) {
    auto p = decode_replication_message(b.span().first(n));
    REQUIRE(!p);
    CHECK(p.error().code == ErrorCode::truncated);
  }
  // An empty payload is a valid envelope (the pgoutput decoder rejects it).
  CHECK(std::get<XLogData>(*decode_replication_message(b.span().first(25))).payload.empty());
}

TEST_CASE("primary keepalive envelope", "[envelope]") {
  Builder b;
  b.ch('k').u64(0xABCDEF).i64(-1).u8(1);
  auto r = decode_replication_message(b.span());
  REQUIRE(r);
  const auto& k = std::get<PrimaryKeepalive>(*r);
  CHECK(k.wal_end.value == 0xABCDEF);
  CHECK(k.send_time == -1);
  CHECK(k.reply_requested);
  for (std::size_t n = 0; n < b.size(); ++n) CHECK(!decode_replication_message(b.span().first(n)));
  Builder longer = b;
  longer.u8(0);
  auto t = decode_replication_message(longer.span());
  REQUIRE(!t);
  CHECK(t.error().code == ErrorCode::trailing_bytes);
  CHECK(t.error().offset == 18);
  Builder bad;
  bad.ch('k').u64(0).i64(0).u8(2);
  REQUIRE(!decode_replication_message(bad.span()));
  CHECK(decode_replication_message(bad.span()).error().code == ErrorCode::bad_value);
  Builder unknown;
  unknown.ch('x');
  CHECK(decode_replication_message(unknown.span()).error().code == ErrorCode::unknown_message_tag);
}

TEST_CASE("standby status update encoding", "[envelope]") {
  std::array<std::byte, standby_status_update_size> out{};
  encode_standby_status_update(out, Lsn{0x0102030405060708ULL}, Lsn{0x1112131415161718ULL},
                               Lsn{0x2122232425262728ULL}, 0x3132333435363738LL, true);
  Builder expected;
  expected.ch('r')
      .u64(0x0102030405060708ULL)
      .u64(0x1112131415161718ULL)
      .u64(0x2122232425262728ULL)
      .u64(0x3132333435363738ULL)
      .u8(1);
  CHECK(std::vector<std::byte>(out.begin(), out.end()) == expected.bytes());
  encode_standby_status_update(out, Lsn{}, Lsn{}, Lsn{}, 0, false);
  CHECK(out[33] == std::byte{0});
  CHECK(std::to_integer<char>(out[0]) == 'r');
}

TEST_CASE("PostgreSQL epoch clock", "[envelope]") {
  const std::int64_t now = pg_epoch_micros_now();
  CHECK(now > 757479845000000);           // after 2024-01-02
  CHECK(now < 757479845000000 * 2);       // before ~2048
}
