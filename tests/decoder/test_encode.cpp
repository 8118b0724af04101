// MessageWriter: what it builds decodes as the walsender's messages do.
#include <pgoutput/encode.hpp>
#include <pgoutput/pgoutput.hpp>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

TEST_CASE("encode: a written Relation and Insert decode to the columns and values given, in every protocol version") {
  for (int proto : {1, 2, 3, 4}) {
    INFO("proto_version " << proto);
    pgoutput::Decoder decoder(proto);
    pgoutput::MessageWriter w;
    const pgoutput::MessageWriter::ColumnSpec cols[] = {{"id", 20, -1}, {"payload", 3802, -1}, {"note", 1043, 68}};
    w.relation(16384, "app", "outbox", cols);
    auto r = decoder.decode(w.bytes());
    REQUIRE(r);
    auto* rel = std::get_if<pgoutput::Relation>(&r.value());
    REQUIRE(rel);
    CHECK(rel->oid == 16384);
    CHECK(rel->nspname == "app");
    CHECK(rel->relname == "outbox");
    std::vector<std::string> names;
    for (auto c : rel->columns) {
      names.emplace_back(c.name);
      CHECK_FALSE(c.is_key());
    }
    CHECK(names == std::vector<std::string>{"id", "payload", "note"});

    w.insert(16384, 3);
    w.text("42");
    w.text("{\"a\": \"é\"}");
    w.null();
    auto i = decoder.decode(w.bytes());
    REQUIRE(i);
    auto* ins = std::get_if<pgoutput::Insert>(&i.value());
    REQUIRE(ins);
    CHECK(ins->relation_oid == 16384);
    CHECK_FALSE(ins->xid);
    std::vector<std::string> values;
    std::vector<bool> nulls;
    for (auto c : ins->new_tuple) {
      values.emplace_back(c.text());
      nulls.push_back(c.is_null());
    }
    CHECK(values == std::vector<std::string>{"42", "{\"a\": \"é\"}", ""});
    CHECK(nulls == std::vector<bool>{false, false, true});
  }
}

TEST_CASE("encode: an empty value and a value with NUL-free binary-looking bytes keep their lengths") {
  pgoutput::Decoder decoder(4);
  pgoutput::MessageWriter w;
  w.insert(7, 2);
  w.text("");
  w.text(std::string("\\x00ff", 6));
  auto i = decoder.decode(w.bytes());
  REQUIRE(i);
  auto& tuple = std::get<pgoutput::Insert>(i.value()).new_tuple;
  std::vector<std::size_t> sizes;
  for (auto c : tuple) sizes.push_back(c.text().size());
  CHECK(sizes == std::vector<std::size_t>{0, 6});
}
