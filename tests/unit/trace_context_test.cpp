#include <catch2/catch.hpp>

#include "walrelay/config.hpp"
#include "walrelay/route/outbox_mapper.hpp"
#include "walrelay/route/trace_context.hpp"

using namespace walrelay;

namespace {
const std::string parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

struct Parsed {
  bool ok;
  std::string traceparent, tracestate, why;
};
Parsed parse(std::string_view text) {
  Parsed p;
  p.ok = parse_trace_context(text, p.traceparent, p.tracestate, p.why);
  return p;
}
}  // namespace

TEST_CASE("trace context: Debezium's properties text and a plain traceparent", "[trace]") {
  SECTION("as java.util.Properties.store writes it, escapes and comments included") {
    auto p = parse("#\n#Wed Mar 22 14:04:49 UTC 2023\ntraceparent=" + parent +
                   "\ntracestate=rojo\\=00f067aa0ba902b7,congo\\=t61rcWkgMzE\n");
    REQUIRE(p.ok);
    CHECK(p.traceparent == parent);
    CHECK(p.tracestate == "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE");
    CHECK(p.why.empty());
  }
  SECTION("':' and blanks as separators, CRLF lines, \\u escapes") {
    auto p = parse("traceparent : " + parent + "\r\ntracestate:a\\u003db\r\n");
    REQUIRE(p.ok);
    CHECK(p.traceparent == parent);
    CHECK(p.tracestate == "a=b");
  }
  SECTION("a plain traceparent, surrounding blanks ignored") {
    auto p = parse("  " + parent + "\n");
    REQUIRE(p.ok);
    CHECK(p.traceparent == parent);
    CHECK(p.tracestate.empty());
  }
  SECTION("blank is no context and no problem") {
    auto p = parse("  \n");
    CHECK_FALSE(p.ok);
    CHECK(p.why.empty());
  }
}

TEST_CASE("trace context: malformed values are named, a bad tracestate alone is dropped", "[trace]") {
  CHECK_FALSE(valid_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1"));
  CHECK_FALSE(valid_traceparent("00-00000000000000000000000000000000-b7ad6b7169203331-01"));  // zero trace id
  CHECK_FALSE(valid_traceparent("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"));  // zero parent id
  CHECK_FALSE(valid_traceparent("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));  // forbidden version
  CHECK_FALSE(valid_traceparent("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"));  // upper case
  CHECK_FALSE(valid_traceparent(parent + "-extra"));                                             // 00 is exact
  CHECK(valid_traceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra"));    // later versions may extend
  auto p = parse("not a trace");
  CHECK_FALSE(p.ok);
  CHECK_THAT(p.why, Catch::Contains("not a W3C traceparent"));
  p = parse("tracestate=a=b\n");
  CHECK_FALSE(p.ok);
  CHECK_THAT(p.why, Catch::Contains("no traceparent"));
  p = parse("traceparent=" + parent + "\ntracestate=caf\\u00e9\n");
  CHECK_FALSE(p.ok);  // \u00e9 is not ASCII: the escape is refused
  p = parse("traceparent=" + parent + "\ntracestate=" + std::string(600, 'a') + "\n");
  REQUIRE(p.ok);
  CHECK(p.tracestate.empty());
  CHECK_THAT(p.why, Catch::Contains("tracestate"));
  p = parse("traceparent=" + parent + "\ntracestate=a\\u00");
  CHECK_FALSE(p.ok);  // a cut escape, never read past the end
}

TEST_CASE("trace context: a message member becomes traceparent and tracestate headers, a bad one only a problem",
          "[trace][message]") {
  Config cfg = parse_config("kafka.bootstrap.servers=x:1\nmessage.prefix.include.list=outbox\ntracing.enabled=true\n", "t", {});
  OutboxMapper m(cfg);
  auto map = [&](const std::string& content, OutboxRecord& rec) {
    pgoutput::LogicalMessage msg{};
    msg.flags = 1;
    msg.prefix = "outbox";
    msg.content = pgoutput::Bytes(reinterpret_cast<const std::byte*>(content.data()), content.size());
    return m.map_message(msg, 0, 0, rec);
  };
  OutboxRecord rec;
  REQUIRE_FALSE(map(R"({"id":"1","aggregatetype":"A","aggregateid":"k","payload":{},"tracingspancontext":"traceparent=)" +
                        parent + R"(\ntracestate=k\\=v\n"})",
                    rec));
  REQUIRE(rec.headers.size() == 3);
  CHECK(rec.headers[1].name == "traceparent");
  CHECK(rec.headers[1].value == std::optional<std::string_view>(parent));
  CHECK(rec.headers[2].name == "tracestate");
  CHECK(rec.headers[2].value == std::optional<std::string_view>("k=v"));
  CHECK(m.trace_problem().empty());
  REQUIRE_FALSE(map(R"({"id":"1","aggregatetype":"A","aggregateid":"k","payload":{},"tracingspancontext":"garbage"})",
                    rec));
  CHECK(rec.headers.size() == 1);
  CHECK_FALSE(m.trace_problem().empty());
}
