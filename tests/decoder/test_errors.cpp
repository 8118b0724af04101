// Hand-built pgoutput messages: malformed input, context rules and protocol 4.
#include "test_support.hpp"

#include <catch2/catch.hpp>

using namespace pgoutput;
using pgoutput_test::Builder;

namespace {

const DecodeContext v1{1, false, {}};
const DecodeContext v2{2, false, {}};
const DecodeContext v2_stream{2, true, {}};
const DecodeContext v3{3, false, {}};
const DecodeContext v4{4, false, {}};

// Decodes and requires an error with this code and offset.
void expect_error(const Builder& b, const DecodeContext& ctx, ErrorCode code, std::size_t offset) {
  auto r = decode(b.span(), ctx);
  REQUIRE(!r);
  INFO("got " << to_string(r.error().code) << " at " << r.error().offset << ": " << r.error().detail);
  CHECK(r.error().code == code);
  CHECK(r.error().offset == offset);
  CHECK(!r.error().detail.empty());
}

// An Insert into relation 16384 whose tuple the caller appends.
Builder insert_header() {
  Builder b;
  b.ch('I').u32(16384).ch('N');
  return b;
}

}  // namespace

TEST_CASE("empty message and unknown tag", "[errors]") {
  expect_error(Builder{}, v1, ErrorCode::truncated, 0);
  Builder b;
  b.ch('Z').u32(0);
  expect_error(b, v1, ErrorCode::unknown_message_tag, 0);
  Builder w;
  w.ch('w');  // an envelope tag is not a pgoutput message
  expect_error(w, v1, ErrorCode::unknown_message_tag, 0);
}

TEST_CASE("protocol version out of range", "[errors]") {
  Builder b;
  b.ch('E');
  expect_error(b, DecodeContext{0, false, {}}, ErrorCode::unsupported_in_context, 0);
  expect_error(b, DecodeContext{5, false, {}}, ErrorCode::unsupported_in_context, 0);
  Builder ins;
  ins.ch('I').u32(1).u32(2).ch('N').u16(0);
  expect_error(ins, DecodeContext{1, true, {}}, ErrorCode::unsupported_in_context, 0);
}

TEST_CASE("begin and commit decode, commit flags must be zero", "[errors]") {
  Builder begin;
  begin.ch('B').u64(0x16B374D848).i64(123456).u32(777);
  auto r = decode(begin.span(), v1);
  REQUIRE(r);
  const auto& b = std::get<Begin>(*r);
  CHECK(b.final_lsn.to_string() == "16/B374D848");
  CHECK(b.commit_time == 123456);
  CHECK(b.xid == 777);

  Builder commit;
  commit.ch('C').u8(0).u64(10).u64(20).i64(30);
  auto c = decode(commit.span(), v1);
  REQUIRE(c);
  CHECK(std::get<Commit>(*c).end_lsn.value == 20);

  Builder bad;
  bad.ch('C').u8(1).u64(10).u64(20).i64(30);
  expect_error(bad, v1, ErrorCode::unknown_flags, 1);

  Builder trailing = commit;
  trailing.u8(0);
  expect_error(trailing, v1, ErrorCode::trailing_bytes, commit.size());
}

TEST_CASE("tuple data errors", "[errors]") {
  SECTION("unknown column kind") {
    auto b = insert_header();
    b.u16(2).ch('n').ch('x');
    expect_error(b, v1, ErrorCode::bad_column_kind, 9);
  }
  SECTION("negative length") {
    auto b = insert_header();
    b.u16(1).ch('t').i32(-1);
    expect_error(b, v1, ErrorCode::bad_length, 9);
  }
  SECTION("length past the end") {
    auto b = insert_header();
    b.u16(1).ch('t').i32(10).raw("abc");
    expect_error(b, v1, ErrorCode::truncated, 13);
  }
  SECTION("huge length is not trusted") {
    auto b = insert_header();
    b.u16(1).ch('b').i32(0x7FFFFFFF).raw("abc");
    expect_error(b, v1, ErrorCode::truncated, 13);
  }
  SECTION("more columns announced than sent") {
    auto b = insert_header();
    b.u16(65535).ch('n').ch('u');
    expect_error(b, v1, ErrorCode::truncated, 10);
  }
  SECTION("wrong tuple marker") {
    Builder b;
    b.ch('I').u32(1).ch('K').u16(0);
    expect_error(b, v1, ErrorCode::bad_value, 5);
  }
  SECTION("a valid tuple with every kind") {
    auto b = insert_header();
    b.u16(4).ch('n').ch('u').ch('t').i32(2).raw("hi").ch('b').i32(0);
    auto r = decode(b.span(), v1);
    REQUIRE(r);
    const auto& t = std::get<Insert>(*r).new_tuple;
    REQUIRE(t.size() == 4);
    std::vector<ColumnKind> k;
    for (const auto& col : t) k.push_back(col.kind);
    CHECK(k == std::vector<ColumnKind>{ColumnKind::null, ColumnKind::unchanged_toast, ColumnKind::text,
                                       ColumnKind::binary});
    CHECK(t.column(2)->text() == "hi");
    CHECK(t.column(3)->data.empty());
    CHECK(t.raw().size() == b.size() - 6);
  }
}

TEST_CASE("update and delete markers", "[errors]") {
  Builder u;
  u.ch('U').u32(1).ch('X').u16(0);
  expect_error(u, v1, ErrorCode::bad_value, 5);
  Builder u2;  // old tuple must be followed by 'N'
  u2.ch('U').u32(1).ch('K').u16(0).ch('K').u16(0);
  expect_error(u2, v1, ErrorCode::bad_value, 8);
  Builder d;
  d.ch('D').u32(1).ch('N').u16(0);
  expect_error(d, v1, ErrorCode::bad_value, 5);
  Builder ok;
  ok.ch('U').u32(1).ch('O').u16(1).ch('n').ch('N').u16(1).ch('u');
  auto r = decode(ok.span(), v1);
  REQUIRE(r);
  const auto& upd = std::get<Update>(*r);
  CHECK(upd.old_kind == 'O');
  CHECK(upd.old_tuple->size() == 1);
  CHECK(upd.new_tuple.column(0)->is_unchanged_toast());
}

TEST_CASE("relation errors", "[errors]") {
  SECTION("unterminated relation name") {
    Builder b;
    b.ch('R').u32(1).cstr("public").raw("abc");
    expect_error(b, v1, ErrorCode::unterminated_string, 12);
  }
  SECTION("unknown replica identity") {
    Builder b;
    b.ch('R').u32(1).cstr("").cstr("t").ch('z').u16(0);
    expect_error(b, v1, ErrorCode::bad_value, 8);
  }
  SECTION("unknown column flags") {
    Builder b;
    b.ch('R').u32(1).cstr("").cstr("t").ch('d').u16(1).u8(2).cstr("c").u32(23).i32(-1);
    expect_error(b, v1, ErrorCode::unknown_flags, 11);
  }
  SECTION("unterminated column name") {
    Builder b;
    b.ch('R').u32(1).cstr("").cstr("t").ch('d').u16(1).u8(1).raw("col");
    expect_error(b, v1, ErrorCode::unterminated_string, 12);
  }
  SECTION("valid, with xid in a stream") {
    Builder b;
    b.ch('R').u32(99).u32(1).cstr("s").cstr("t").ch('i').u16(2).u8(1).cstr("a").u32(23).i32(-1).u8(0).cstr("").u32(
        25).i32(7);
    auto r = decode(b.span(), v2_stream);
    REQUIRE(r);
    const auto& rel = std::get<Relation>(*r);
    CHECK(rel.xid == 99u);
    CHECK(rel.replica_identity == 'i');
    std::vector<RelationColumn> cols(rel.columns.begin(), rel.columns.end());
    REQUIRE(cols.size() == 2);
    CHECK(cols[0].name == "a");
    CHECK(cols[0].is_key());
    CHECK(cols[1].name == "");
    CHECK(cols[1].type_modifier == 7);
    // The same bytes outside a stream: the xid is read as the OID and the rest is off.
    CHECK(!decode(b.span(), v2));
  }
}

TEST_CASE("truncate errors", "[errors]") {
  Builder neg;
  neg.ch('T').i32(-1).u8(0);
  expect_error(neg, v1, ErrorCode::bad_length, 1);
  Builder huge;
  huge.ch('T').i32(0x7FFFFFFF).u8(0).u32(1);
  expect_error(huge, v1, ErrorCode::truncated, 6);
  Builder flags;
  flags.ch('T').i32(1).u8(4).u32(1);
  expect_error(flags, v1, ErrorCode::unknown_flags, 5);
  Builder ok;
  ok.ch('T').i32(2).u8(3).u32(10).u32(0xFFFFFFFF);
  auto r = decode(ok.span(), v1);
  REQUIRE(r);
  const auto& t = std::get<Truncate>(*r);
  CHECK(t.relation_count == 2);
  CHECK(t.relation_oid(0) == 10);
  CHECK(t.relation_oid(1) == 0xFFFFFFFF);
  CHECK(t.cascade());
  CHECK(t.restart_identity());
}

TEST_CASE("logical message errors", "[errors]") {
  Builder flags;
  flags.ch('M').u8(2).u64(1).cstr("p").i32(0);
  expect_error(flags, v1, ErrorCode::unknown_flags, 1);
  Builder neg;
  neg.ch('M').u8(1).u64(1).cstr("p").i32(-5);
  expect_error(neg, v1, ErrorCode::bad_length, 12);
  Builder past;
  past.ch('M').u8(1).u64(1).cstr("p").i32(5).raw("abcd");
  expect_error(past, v1, ErrorCode::truncated, 16);
  Builder in_stream;
  in_stream.ch('M').u32(42).u8(1).u64(1).cstr("p").i32(2).raw("hi");
  auto r = decode(in_stream.span(), v2_stream);
  REQUIRE(r);
  CHECK(std::get<LogicalMessage>(*r).xid == 42u);
  CHECK(std::get<LogicalMessage>(*r).content.size() == 2);
}

TEST_CASE("stream messages and their context", "[errors]") {
  Builder start;
  start.ch('S').u32(5).u8(1);
  expect_error(start, v1, ErrorCode::unsupported_in_context, 0);
  expect_error(start, v2_stream, ErrorCode::unsupported_in_context, 0);
  Builder bad_first;
  bad_first.ch('S').u32(5).u8(2);
  expect_error(bad_first, v2, ErrorCode::bad_value, 5);

  Builder stop;
  stop.ch('E');
  expect_error(stop, v2, ErrorCode::unsupported_in_context, 0);
  REQUIRE(decode(stop.span(), v2_stream));

  Builder begin;
  begin.ch('B').u64(1).i64(2).u32(3);
  expect_error(begin, v2_stream, ErrorCode::unsupported_in_context, 0);

  Builder commit;
  commit.ch('c').u32(5).u8(0).u64(1).u64(2).i64(3);
  REQUIRE(decode(commit.span(), v2));
  expect_error(commit, v2_stream, ErrorCode::unsupported_in_context, 0);
  Builder commit_flags;
  commit_flags.ch('c').u32(5).u8(8).u64(1).u64(2).i64(3);
  expect_error(commit_flags, v2, ErrorCode::unknown_flags, 5);

  SECTION("Decoder tracks the stream state") {
    Decoder d(2);
    CHECK(!d.in_streamed_transaction());
    REQUIRE(d.decode(start.span()));
    CHECK(d.in_streamed_transaction());
    Builder ins;
    ins.ch('I').u32(5).u32(16384).ch('N').u16(0);
    auto r = d.decode(ins.span());
    REQUIRE(r);
    CHECK(std::get<Insert>(*r).xid == 5u);
    CHECK(!d.decode(start.span()));  // nested start is an error and changes nothing
    CHECK(d.in_streamed_transaction());
    REQUIRE(d.decode(stop.span()));
    CHECK(!d.in_streamed_transaction());
    REQUIRE(d.decode(commit.span()));
  }
}

TEST_CASE("stream abort: protocol 2/3 layout and protocol 4 with abort LSN and time", "[errors][v4]") {
  Builder short_abort;
  short_abort.ch('A').u32(700).u32(701);
  Builder long_abort = short_abort;
  long_abort.u64(0x1000002A0).i64(757479845000000);

  auto r2 = decode(short_abort.span(), v2);
  REQUIRE(r2);
  CHECK(std::get<StreamAbort>(*r2).subxid == 701);
  CHECK(!std::get<StreamAbort>(*r2).abort_lsn);
  expect_error(long_abort, v2, ErrorCode::trailing_bytes, 9);

  auto r4 = decode(long_abort.span(), v4);
  REQUIRE(r4);
  const auto& a = std::get<StreamAbort>(*r4);
  CHECK(a.xid == 700);
  CHECK(a.subxid == 701);
  REQUIRE(a.abort_lsn);
  CHECK(a.abort_lsn->to_string() == "1/2A0");
  REQUIRE(a.abort_time);
  CHECK(*a.abort_time == 757479845000000);
  expect_error(short_abort, v4, ErrorCode::truncated, 9);

  // Protocol 4 with streaming = on (not parallel): no abort LSN.
  DecodeContext v4_on = v4;
  v4_on.stream_abort_has_lsn = false;
  REQUIRE(decode(short_abort.span(), v4_on));
  expect_error(long_abort, v4_on, ErrorCode::trailing_bytes, 9);

  // Asking for the abort LSN below protocol 4 is a configuration error.
  DecodeContext v2_lsn = v2;
  v2_lsn.stream_abort_has_lsn = true;
  expect_error(long_abort, v2_lsn, ErrorCode::unsupported_in_context, 0);

  SECTION("every prefix of the protocol 4 message fails") {
    for (std::size_t n = 0; n < long_abort.size(); ++n) CHECK(!decode(long_abort.span().first(n), v4));
  }
}

TEST_CASE("two-phase messages need protocol 3 and zero flags", "[errors]") {
  Builder prepare;
  prepare.ch('P').u8(0).u64(1).u64(2).i64(3).u32(4).cstr("g");
  expect_error(prepare, v2, ErrorCode::unsupported_in_context, 0);
  auto r = decode(prepare.span(), v3);
  REQUIRE(r);
  CHECK(std::get<Prepare>(*r).gid == "g");
  Builder bad;
  bad.ch('K').u8(1).u64(1).u64(2).i64(3).u32(4).cstr("g");
  expect_error(bad, v3, ErrorCode::unknown_flags, 1);
  Builder unterminated;
  unterminated.ch('b').u64(1).u64(2).i64(3).u32(4).raw("gid");
  expect_error(unterminated, v3, ErrorCode::unterminated_string, 29);
  Builder rollback;
  rollback.ch('r').u8(0).u64(1).u64(2).i64(3).i64(4).u32(5).cstr("");
  auto rr = decode(rollback.span(), v4);
  REQUIRE(rr);
  CHECK(std::get<RollbackPrepared>(*rr).rollback_time == 4);
  CHECK(std::get<RollbackPrepared>(*rr).gid.empty());
  Builder sp;
  sp.ch('p').u8(0).u64(1).u64(2).i64(3).u32(4).cstr("s");
  auto rs = decode(sp.span(), v3);
  REQUIRE(rs);
  CHECK(std::get<StreamPrepare>(*rs).xid == 4);
}

TEST_CASE("origin and type", "[errors]") {
  Builder o;
  o.ch('O').u64(5).cstr("name");
  auto r = decode(o.span(), v1);
  REQUIRE(r);
  CHECK(std::get<Origin>(*r).name == "name");
  Builder o_bad;
  o_bad.ch('O').u64(5).raw("name");
  expect_error(o_bad, v1, ErrorCode::unterminated_string, 9);
  Builder y;
  y.ch('Y').u32(9).u32(16400).cstr("public").cstr("mood");
  auto ry = decode(y.span(), v2_stream);
  REQUIRE(ry);
  CHECK(std::get<Type>(*ry).xid == 9u);
  CHECK(std::get<Type>(*ry).typname == "mood");
}

TEST_CASE("error codes have names", "[errors]") {
  CHECK(std::string(to_string(ErrorCode::truncated)) == "truncated");
  CHECK(std::string(to_string(ErrorCode::unsupported_in_context)) == "unsupported_in_context");
}
