// The initial snapshot's rows as COPY's text format gives them, made into the
// pgoutput Inserts the stream's decoder reads: every value as the server's
// output function wrote it, NULL told from the text "\N".
#include <catch2/catch.hpp>

#include <pgoutput/pgoutput.hpp>

#include "walrelay/source/table_rows.hpp"

using namespace walrelay;

namespace {
struct Field {
  bool null = false;
  std::string text;
  bool operator==(const Field& o) const { return null == o.null && text == o.text; }
};

std::vector<Field> fields_of(std::string_view row) {
  std::vector<Field> out;
  std::string scratch;
  const std::size_t n = for_each_copy_text_field(row, scratch, [&](std::optional<std::string_view> v) {
    out.push_back(v ? Field{false, std::string(*v)} : Field{true, {}});
  });
  REQUIRE(n == out.size());
  return out;
}

Field text(std::string s) { return {false, std::move(s)}; }
const Field null_field{true, {}};
}  // namespace

TEST_CASE("table rows: a COPY text row splits at tabs, NULL as backslash-N, the line end left out", "[snapshot]") {
  CHECK(fields_of("1\tOrder\t{\"a\": 1}\n") == std::vector<Field>{text("1"), text("Order"), text("{\"a\": 1}")});
  CHECK(fields_of("1\t\\N\t\n") == std::vector<Field>{text("1"), null_field, text("")});
  CHECK(fields_of("\\N\n") == std::vector<Field>{null_field});
  CHECK(fields_of("a\tb\r\n") == std::vector<Field>{text("a"), text("b")});  // a Windows server's line end
  CHECK(fields_of("\t\n") == std::vector<Field>{text(""), text("")});
  // "\N" as text is written \\N: a value, not NULL.
  CHECK(fields_of("\\\\N\n") == std::vector<Field>{text("\\N")});
}

TEST_CASE("table rows: COPY's escapes are undone as the server reads them", "[snapshot]") {
  std::string scratch;
  CHECK(unescape_copy_text("plain", scratch) == "plain");
  CHECK(unescape_copy_text("a\\tb\\nc\\rd\\\\e", scratch) == "a\tb\nc\rd\\e");
  CHECK(unescape_copy_text("\\b\\f\\v", scratch) == "\b\f\v");
  CHECK(unescape_copy_text("\\101\\0610\\7", scratch) == std::string("A10\7"));
  CHECK(unescape_copy_text("\\x41\\x4a2\\xg", scratch) == "AJ2xg");
  CHECK(unescape_copy_text("\\.\\q", scratch) == ".q");
  CHECK(unescape_copy_text("end\\", scratch) == "end\\");
  // A tab or newline in a value never splits it: COPY writes them escaped.
  CHECK(fields_of("line1\\nline2\tcol\\tumn\n") == std::vector<Field>{text("line1\nline2"), text("col\tumn")});
  // Multibyte UTF-8 passes through untouched.
  CHECK(fields_of("z\xc3\xbcrich\t\xe2\x82\xac\\\\\n") == std::vector<Field>{text("z\xc3\xbcrich"), text("\xe2\x82\xac\\")});
}

TEST_CASE("table rows: a COPY row becomes the Insert the decoder reads, values and NULLs in place", "[snapshot]") {
  TableRows t;
  t.oid = 16384;
  t.columns = {{"id", 20, -1}, {"aggregatetype", 25, -1}, {"payload", 3802, -1}};
  pgoutput::MessageWriter writer;
  std::string scratch;
  CHECK(t.insert_copy_text(writer, "7\t\\N\t{\"k\": \"a\\\\tb\"}\n", scratch) == 3);
  const auto message = pgoutput::Decoder(1).decode(writer.bytes());
  REQUIRE(message.has_value());
  const auto* insert = std::get_if<pgoutput::Insert>(&*message);
  REQUIRE(insert);
  CHECK(insert->relation_oid == 16384);
  REQUIRE(insert->new_tuple.size() == 3);
  CHECK(insert->new_tuple.column(0)->text() == "7");
  CHECK(insert->new_tuple.column(1)->is_null());
  CHECK(insert->new_tuple.column(2)->text() == "{\"k\": \"a\\tb\"}");
  // A row with another number of fields says so.
  pgoutput::MessageWriter short_row;
  CHECK(t.insert_copy_text(short_row, "7\tOrder\n", scratch) == 2);
}
