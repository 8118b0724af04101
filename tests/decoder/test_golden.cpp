// Decoding of vectors captured from PostgreSQL 15 (tests/golden).
#include "test_support.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <cstdlib>
#include <new>
#include <set>

using namespace pgoutput;
using pgoutput_test::column_text;
using pgoutput_test::decode_golden;
using pgoutput_test::DecodedCase;

// Counts heap allocations so a test can check that decode() makes none.
// Not under AddressSanitizer, which must own operator new itself.
#if defined(__SANITIZE_ADDRESS__)
#define PGOUTPUT_COUNT_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PGOUTPUT_COUNT_ALLOCATIONS 0
#endif
#endif
#ifndef PGOUTPUT_COUNT_ALLOCATIONS
#define PGOUTPUT_COUNT_ALLOCATIONS 1
#endif

namespace {
std::atomic<long> g_allocations{0};
}  // namespace

#if PGOUTPUT_COUNT_ALLOCATIONS

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace {

// The messages of type T in a decoded case, in order.
template <class T>
std::vector<T> all_of(const DecodedCase& c) {
  std::vector<T> out;
  for (const auto& m : c.messages) {
    if (const T* p = std::get_if<T>(&m)) out.push_back(*p);
  }
  return out;
}

// The kinds of the messages, e.g. "Begin Relation Insert Commit".
std::string kinds(const DecodedCase& c) {
  std::string s;
  for (const auto& m : c.messages) {
    if (!s.empty()) s += ' ';
    s += message_name(m);
  }
  return s;
}

// prefix followed by n, e.g. "c12". (Not "c" + std::to_string(n): GCC 12 -Wrestrict false positive.)
std::string numbered(const char* prefix, int n) {
  std::string s(prefix);
  s.append(std::to_string(n));
  return s;
}

std::string bytes_to_string(Bytes b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

std::uint64_t be(Bytes b) {
  std::uint64_t v = 0;
  for (auto x : b) v = (v << 8) | std::to_integer<std::uint64_t>(x);
  return v;
}

// Checks Begin/Commit pairs: no xid fields in plain transactions, commit LSN matches.
void check_transactions(const DecodedCase& c) {
  auto begins = all_of<Begin>(c);
  auto commits = all_of<Commit>(c);
  REQUIRE(begins.size() == commits.size());
  for (std::size_t i = 0; i < begins.size(); ++i) {
    CHECK(commits[i].flags == 0);
    CHECK(commits[i].commit_lsn == begins[i].final_lsn);
    CHECK(commits[i].end_lsn > commits[i].commit_lsn);
    CHECK(commits[i].commit_time == begins[i].commit_time);
    CHECK(begins[i].xid != 0);
  }
}

}  // namespace

TEST_CASE("golden v1_dml: insert, update, delete with replica identity default and full", "[golden]") {
  auto c = decode_golden("v1_dml");
  CHECK(kinds(c) ==
        "Begin Relation Insert Commit Begin Insert Commit Begin Update Commit Begin Update Commit "
        "Begin Delete Commit Begin Relation Insert Commit Begin Update Commit Begin Delete Commit");
  check_transactions(c);

  auto rels = all_of<Relation>(c);
  REQUIRE(rels.size() == 2);
  const Relation& accounts = rels[0];
  CHECK(!accounts.xid);
  CHECK(accounts.nspname == "public");
  CHECK(accounts.relname == "accounts");
  CHECK(accounts.replica_identity == 'd');
  REQUIRE(accounts.columns.size() == 4);
  std::vector<std::string> names;
  std::vector<std::uint32_t> types;
  std::vector<bool> keys;
  for (const RelationColumn& col : accounts.columns) {
    names.emplace_back(col.name);
    types.push_back(col.type_oid);
    keys.push_back(col.is_key());
    CHECK(col.type_modifier == -1);
  }
  CHECK(names == std::vector<std::string>{"id", "name", "note", "balance"});
  CHECK(types == std::vector<std::uint32_t>{23, 25, 25, 1700});
  CHECK(keys == std::vector<bool>{true, false, false, false});
  CHECK(rels[1].relname == "audit");
  CHECK(rels[1].replica_identity == 'f');
  for (const auto& col : rels[1].columns) CHECK(col.is_key());

  auto inserts = all_of<Insert>(c);
  REQUIRE(inserts.size() == 3);
  CHECK(inserts[0].relation_oid == accounts.oid);
  CHECK(!inserts[0].xid);
  REQUIRE(inserts[0].new_tuple.size() == 4);
  CHECK(column_text(inserts[0].new_tuple, 0) == "1");
  CHECK(column_text(inserts[0].new_tuple, 1) == "alice");
  CHECK(inserts[0].new_tuple.column(2)->is_null());
  CHECK(inserts[0].new_tuple.column(2)->data.empty());
  CHECK(column_text(inserts[0].new_tuple, 3) == "10.50");
  CHECK(!inserts[0].new_tuple.column(4));
  CHECK(column_text(inserts[1].new_tuple, 1) == "Zo\xC3\xAB \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x9A\x80");
  CHECK(column_text(inserts[1].new_tuple, 2) == "na\xC3\xAFve caf\xC3\xA9");
  CHECK(inserts[1].new_tuple.column(3)->kind == ColumnKind::null);
  CHECK(inserts[2].relation_oid == rels[1].oid);

  auto updates = all_of<Update>(c);
  REQUIRE(updates.size() == 3);
  // Key unchanged, replica identity default: no old tuple.
  CHECK(!updates[0].old_kind);
  CHECK(!updates[0].old_tuple);
  CHECK(column_text(updates[0].new_tuple, 3) == "11");
  // Key changed: old key sent as 'K' with only the key column.
  REQUIRE(updates[1].old_kind == 'K');
  REQUIRE(updates[1].old_tuple);
  CHECK(column_text(*updates[1].old_tuple, 0) == "2");
  CHECK(updates[1].old_tuple->column(1)->is_null());
  CHECK(column_text(updates[1].new_tuple, 0) == "3");
  // Replica identity full: whole old row as 'O'.
  REQUIRE(updates[2].old_kind == 'O');
  CHECK(column_text(*updates[2].old_tuple, 1) == "created");
  CHECK(column_text(updates[2].new_tuple, 1) == "changed");

  auto deletes = all_of<Delete>(c);
  REQUIRE(deletes.size() == 2);
  CHECK(deletes[0].old_kind == 'K');
  CHECK(column_text(deletes[0].old_tuple, 0) == "1");
  CHECK(deletes[0].old_tuple.column(1)->is_null());
  CHECK(deletes[1].old_kind == 'O');
  CHECK(column_text(deletes[1].old_tuple, 1) == "changed");
}

TEST_CASE("golden v1_truncate: several relations with options", "[golden]") {
  auto c = decode_golden("v1_truncate");
  check_transactions(c);
  std::map<std::string, std::uint32_t> oid_by_name;
  for (const auto& r : all_of<Relation>(c)) oid_by_name[std::string(r.relname)] = r.oid;
  REQUIRE(oid_by_name.size() == 3);
  auto truncs = all_of<Truncate>(c);
  REQUIRE(truncs.size() == 4);
  auto oids = [](const Truncate& t) {
    std::set<std::uint32_t> s;
    for (std::uint32_t i = 0; i < t.relation_count; ++i) s.insert(t.relation_oid(i));
    return s;
  };
  CHECK(truncs[0].options == 0);
  CHECK(oids(truncs[0]) == std::set<std::uint32_t>{oid_by_name["t_a"], oid_by_name["t_b"], oid_by_name["t_c"]});
  CHECK(truncs[1].options == 1);
  CHECK(truncs[1].cascade());
  CHECK(oids(truncs[1]) == std::set<std::uint32_t>{oid_by_name["t_a"], oid_by_name["t_b"]});
  CHECK(truncs[2].options == 2);
  CHECK(truncs[2].restart_identity());
  CHECK(oids(truncs[2]) == std::set<std::uint32_t>{oid_by_name["t_c"]});
  CHECK(truncs[3].options == 3);
  CHECK(truncs[3].relation_count == 2);
  CHECK(truncs[3].relation_oid(2) == 0);  // out of range
}

TEST_CASE("golden v1_messages: transactional and non-transactional logical messages", "[golden]") {
  auto c = decode_golden("v1_messages");
  CHECK(kinds(c) == "Message Begin Message Relation Insert Message Message Commit");
  auto msgs = all_of<LogicalMessage>(c);
  REQUIRE(msgs.size() == 4);
  CHECK(!msgs[0].transactional());
  CHECK(msgs[0].flags == 0);
  CHECK(msgs[0].prefix == "outbox");
  CHECK(bytes_to_string(msgs[0].content) == "non-transactional");
  CHECK(msgs[1].transactional());
  CHECK(bytes_to_string(msgs[1].content) == "transactional");
  CHECK(msgs[2].prefix == "empty");
  CHECK(msgs[2].content.empty());
  CHECK(msgs[3].prefix == "bin");
  CHECK(bytes_to_string(msgs[3].content) == std::string("\x00\xff\x00", 3));
  for (const auto& m : msgs) {
    CHECK(!m.xid);
    CHECK(m.lsn.value != 0);
  }
  CHECK(msgs[1].lsn < msgs[2].lsn);
}

TEST_CASE("golden v1_types: Type messages for enum and domain columns", "[golden]") {
  auto c = decode_golden("v1_types");
  CHECK(kinds(c) == "Begin Type Type Relation Insert Commit");
  auto typs = all_of<Type>(c);
  REQUIRE(typs.size() == 2);
  CHECK(typs[0].nspname == "public");
  CHECK(typs[0].typname == "mood");
  // For a domain PostgreSQL sends the domain's OID with its base type's name;
  // pg_catalog is sent as the empty string.
  CHECK(typs[1].nspname == "");
  CHECK(typs[1].typname == "int4");
  auto rel = all_of<Relation>(c).at(0);
  std::vector<RelationColumn> cols(rel.columns.begin(), rel.columns.end());
  REQUIRE(cols.size() == 4);
  CHECK(cols[1].type_oid == typs[0].oid);
  CHECK(cols[2].type_oid == typs[1].oid);
  CHECK(cols[3].type_oid == 1043);
  CHECK(cols[3].type_modifier == 24);  // varchar(20): 20 + VARHDRSZ
  auto ins = all_of<Insert>(c).at(0);
  CHECK(column_text(ins.new_tuple, 1) == "happy");
  CHECK(column_text(ins.new_tuple, 2) == "42");
}

TEST_CASE("golden v1_toast: unchanged TOAST value in an update", "[golden]") {
  auto c = decode_golden("v1_toast");
  auto ins = all_of<Insert>(c).at(0);
  CHECK(ins.new_tuple.column(1)->data.size() == 12800);
  auto upd = all_of<Update>(c).at(0);
  CHECK(!upd.old_tuple);
  REQUIRE(upd.new_tuple.size() == 3);
  CHECK(column_text(upd.new_tuple, 0) == "1");
  CHECK(upd.new_tuple.column(1)->is_unchanged_toast());
  CHECK(upd.new_tuple.column(1)->data.empty());
  CHECK(column_text(upd.new_tuple, 2) == "1");
}

TEST_CASE("golden v1_large: a 1 MB value", "[golden]") {
  auto c = decode_golden("v1_large");
  auto ins = all_of<Insert>(c).at(0);
  auto col = ins.new_tuple.column(1);
  REQUIRE(col);
  REQUIRE(col->kind == ColumnKind::text);
  REQUIRE(col->data.size() == 1048576);
  std::string expected;
  for (int i = 0; i < 65536; ++i) expected += "0123456789abcdef";
  CHECK(col->text() == expected);
}

TEST_CASE("golden v1_many_columns: 200 columns", "[golden]") {
  auto c = decode_golden("v1_many_columns");
  auto rel = all_of<Relation>(c).at(0);
  REQUIRE(rel.columns.size() == 200);
  int i = 1;
  for (const auto& col : rel.columns) {
    CHECK(col.name == numbered("c", i));
    CHECK(col.flags == 0);  // no primary key
    ++i;
  }
  CHECK(i == 201);
  auto ins = all_of<Insert>(c).at(0);
  REQUIRE(ins.new_tuple.size() == 200);
  i = 1;
  for (const Column& col : ins.new_tuple) {
    CHECK(col.kind == ColumnKind::text);
    CHECK(col.text() == numbered("v", i));
    ++i;
  }
  CHECK(column_text(ins.new_tuple, 199) == "v200");
  CHECK(std::distance(ins.new_tuple.begin(), ins.new_tuple.end()) == 200);
}

TEST_CASE("golden v1_origin: Origin follows Begin", "[golden]") {
  auto c = decode_golden("v1_origin");
  CHECK(kinds(c) == "Begin Origin Relation Insert Commit");
  auto o = all_of<Origin>(c).at(0);
  CHECK(o.name == "upstream_a");
  CHECK(o.commit_lsn == *Lsn::parse("0/ABCDEF12"));
  // pg_replication_origin_xact_setup also sets the commit timestamp: 2024-01-02 03:04:05 UTC.
  CHECK(all_of<Begin>(c).at(0).commit_time == 757479845000000);
}

TEST_CASE("golden v1_binary: binary send format columns", "[golden]") {
  auto c = decode_golden("v1_binary");
  auto ins = all_of<Insert>(c).at(0);
  std::vector<Column> cols(ins.new_tuple.begin(), ins.new_tuple.end());
  REQUIRE(cols.size() == 9);
  for (std::size_t i = 0; i < 8; ++i) CHECK(cols[i].kind == ColumnKind::binary);
  CHECK(be(cols[0].data) == 1);
  CHECK(cols[0].data.size() == 4);
  CHECK(be(cols[1].data) == 1234567890123ULL);
  CHECK(cols[2].text() == "h\xC3\xA9llo");
  CHECK(be(cols[3].data) == 757479845000000ULL);
  CHECK(cols[4].data.size() == 16);
  CHECK(be(cols[4].data.subspan(0, 8)) == 0xa0eebc999c0b4ef8ULL);
  CHECK(cols[5].data.size() == 1);
  CHECK(be(cols[5].data) == 1);
  CHECK(be(cols[7].data) == 0xdeadbeefULL);
  CHECK(cols[8].is_null());
}

TEST_CASE("golden v1_outbox: the outbox row", "[golden]") {
  auto c = decode_golden("v1_outbox");
  auto rel = all_of<Relation>(c).at(0);
  CHECK(rel.relname == "outbox");
  auto ins = all_of<Insert>(c).at(0);
  REQUIRE(ins.new_tuple.size() == 6);
  CHECK(column_text(ins.new_tuple, 0) == "5f0c6f9e-2c5b-4b8e-9a55-0c7c2f1f4a11");
  CHECK(column_text(ins.new_tuple, 1) == "order");
  CHECK(column_text(ins.new_tuple, 2) == "order-1001");
  CHECK(column_text(ins.new_tuple, 3) == "OrderCreated");
  CHECK(column_text(ins.new_tuple, 4).find("\"orderId\": \"order-1001\"") != std::string::npos);
  CHECK(column_text(ins.new_tuple, 5) == "2024-01-02 03:04:05.123456+00");
}

TEST_CASE("golden v2_stream: streamed transactions with xids, subtransaction and whole abort", "[golden]") {
  auto c = decode_golden("v2_stream");
  auto starts = all_of<StreamStart>(c);
  REQUIRE(starts.size() >= 2);
  CHECK(starts[0].first_segment);
  CHECK(!starts[1].first_segment);
  const std::uint32_t committed_xid = starts[0].xid;

  // Inside a stream every change carries an xid; outside none does.
  bool in_stream = false;
  std::set<std::uint32_t> stream_xids;
  for (std::size_t i = 0; i < c.messages.size(); ++i) {
    const Message& m = c.messages[i];
    CHECK(c.contexts[i].in_streamed_transaction == in_stream);
    if (const auto* s = std::get_if<StreamStart>(&m)) {
      in_stream = true;
      stream_xids.insert(s->xid);
      continue;
    }
    if (std::holds_alternative<StreamStop>(m)) {
      in_stream = false;
      continue;
    }
    std::visit(
        [&](const auto& msg) {
          if constexpr (requires { msg.xid.has_value(); }) CHECK(msg.xid.has_value() == in_stream);
        },
        m);
  }
  CHECK(!in_stream);

  auto msgs = all_of<LogicalMessage>(c);
  REQUIRE(msgs.size() == 1);
  CHECK(msgs[0].transactional());
  CHECK(msgs[0].xid == committed_xid);
  CHECK(bytes_to_string(msgs[0].content) == "in-stream");

  auto aborts = all_of<StreamAbort>(c);
  REQUIRE(aborts.size() == 2);
  // ROLLBACK TO SAVEPOINT: the subtransaction is aborted inside the committed transaction.
  CHECK(aborts[0].xid == committed_xid);
  CHECK(aborts[0].subxid != aborts[0].xid);
  CHECK(!aborts[0].abort_lsn);
  CHECK(!aborts[0].abort_time);
  // ROLLBACK of the whole streamed transaction: subxid == xid.
  CHECK(aborts[1].subxid == aborts[1].xid);
  CHECK(aborts[1].xid != committed_xid);
  CHECK(stream_xids == std::set<std::uint32_t>{committed_xid, aborts[1].xid});

  auto commits = all_of<StreamCommit>(c);
  REQUIRE(commits.size() == 1);
  CHECK(commits[0].xid == committed_xid);
  CHECK(commits[0].flags == 0);
  CHECK(commits[0].end_lsn > commits[0].commit_lsn);

  // The small last transaction is not streamed.
  auto last_insert = all_of<Insert>(c).back();
  CHECK(!last_insert.xid);
  CHECK(column_text(last_insert.new_tuple, 1) == "small");
  check_transactions(c);

  // Streamed inserts come from the first and the aborted transaction only.
  for (const auto& ins : all_of<Insert>(c)) {
    if (!ins.xid) continue;
    const std::string pad = column_text(ins.new_tuple, 1);
    CHECK(pad.size() == 100);
    CHECK((pad[0] == 'a' || pad[0] == 'b' || pad[0] == 'c' || pad[0] == 'd'));
  }
}

TEST_CASE("golden v2_stream: protocol 1 rejects stream messages", "[golden]") {
  auto raw = pgoutput_test::load_golden("v2_stream");
  auto r = decode(raw[0], DecodeContext{1, false, {}});
  REQUIRE(!r);
  CHECK(r.error().code == ErrorCode::unsupported_in_context);
}

TEST_CASE("golden v3_two_phase: prepare, commit prepared, rollback prepared, stream prepare", "[golden]") {
  auto c = decode_golden("v3_two_phase");
  auto bps = all_of<BeginPrepare>(c);
  auto ps = all_of<Prepare>(c);
  auto cps = all_of<CommitPrepared>(c);
  auto rps = all_of<RollbackPrepared>(c);
  auto sps = all_of<StreamPrepare>(c);
  REQUIRE(bps.size() == 2);
  REQUIRE(ps.size() == 2);
  REQUIRE(cps.size() == 2);
  REQUIRE(rps.size() == 1);
  REQUIRE(sps.size() == 1);

  CHECK(bps[0].gid == "gid-commit");
  CHECK(ps[0].gid == "gid-commit");
  CHECK(ps[0].xid == bps[0].xid);
  CHECK(ps[0].flags == 0);
  CHECK(ps[0].prepare_lsn == bps[0].prepare_lsn);
  CHECK(ps[0].end_lsn == bps[0].end_lsn);
  CHECK(ps[0].prepare_time == bps[0].prepare_time);
  CHECK(cps[0].gid == "gid-commit");
  CHECK(cps[0].xid == bps[0].xid);
  CHECK(cps[0].commit_lsn >= ps[0].end_lsn);  // equal when nothing was logged in between

  CHECK(bps[1].gid == "gid-rollback");
  CHECK(rps[0].gid == "gid-rollback");
  CHECK(rps[0].xid == bps[1].xid);
  CHECK(rps[0].prepare_end_lsn == ps[1].end_lsn);
  CHECK(rps[0].prepare_time == ps[1].prepare_time);
  CHECK(rps[0].rollback_end_lsn > rps[0].prepare_end_lsn);
  CHECK(rps[0].rollback_time >= rps[0].prepare_time);

  auto starts = all_of<StreamStart>(c);
  REQUIRE(!starts.empty());
  CHECK(sps[0].gid == "gid-streamed");
  CHECK(sps[0].xid == starts[0].xid);
  CHECK(sps[0].flags == 0);
  CHECK(cps[1].gid == "gid-streamed");
  CHECK(cps[1].xid == sps[0].xid);
}

TEST_CASE("golden: every strict prefix of every message fails cleanly", "[golden][prefix]") {
  for (const auto& name : pgoutput_test::golden_cases()) {
    auto c = decode_golden(name);
    std::size_t decoded_ok = 0;
    std::size_t bad_offset = 0;
    std::size_t tried = 0;
    for (std::size_t i = 0; i < c.raw.size(); ++i) {
      const Bytes whole = c.raw[i];
      for (std::size_t n = 0; n < whole.size(); ++n) {
        auto r = decode(whole.first(n), c.contexts[i]);
        ++tried;
        if (r) {
          ++decoded_ok;
          UNSCOPED_INFO(name << " message " << i << " prefix " << n << " decoded");
        } else if (r.error().offset > n) {
          ++bad_offset;
        }
      }
    }
    INFO(name << ": " << tried << " prefixes");
    CHECK(decoded_ok == 0);
    CHECK(bad_offset == 0);
  }
}

TEST_CASE("golden: one trailing byte is rejected at the message end", "[golden]") {
  for (const auto& name : pgoutput_test::golden_cases()) {
    auto c = decode_golden(name);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < c.raw.size(); ++i) {
      auto longer = c.raw[i];
      longer.push_back(std::byte{0});
      auto r = decode(longer, c.contexts[i]);
      if (r || r.error().code != ErrorCode::trailing_bytes || r.error().offset != c.raw[i].size()) ++wrong;
    }
    INFO(name);
    CHECK(wrong == 0);
  }
}

TEST_CASE("golden: decode() does not allocate", "[golden][alloc]") {
  if (!PGOUTPUT_COUNT_ALLOCATIONS) WARN("allocation counting is off under AddressSanitizer");
  if (PGOUTPUT_COUNT_ALLOCATIONS) {  // the counter works
    const long before = g_allocations.load();
    auto p = std::make_unique<std::string>(100, 'x');
    CHECK(g_allocations.load() > before);
  }
  for (const auto& name : pgoutput_test::golden_cases()) {
    auto c = decode_golden(name);
    std::size_t total_columns = 0;
    const long before = g_allocations.load();
    for (std::size_t i = 0; i < c.raw.size(); ++i) {
      auto r = decode(c.raw[i], c.contexts[i]);
      if (!r) continue;
      if (const auto* ins = std::get_if<Insert>(&*r)) {
        for (const Column& col : ins->new_tuple) total_columns += col.data.size() > 0 ? 1 : 0;
      }
      if (const auto* rel = std::get_if<Relation>(&*r)) {
        for (const RelationColumn& col : rel->columns) total_columns += col.name.empty() ? 0 : 1;
      }
    }
    const long after = g_allocations.load();
    INFO(name);
    CHECK(after - before == 0);
    CHECK(total_columns > 0);
  }
}
