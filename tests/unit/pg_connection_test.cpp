// The connection string walrelay hands libpq once it has resolved the host
// names itself (off the loop): one entry per address, the name kept for TLS.
#include <catch2/catch.hpp>

#include "walrelay/source/pg_connection.hpp"

using namespace walrelay;

namespace {
std::string get(const std::vector<std::pair<std::string, std::string>>& options, const std::string& key) {
  for (auto& [k, v] : options)
    if (k == key) return v;
  return "(unset)";
}
}  // namespace

TEST_CASE("pg connection: which hosts walrelay resolves before libpq sees them", "[pg]") {
  CHECK(needs_resolving("db.internal"));
  CHECK(needs_resolving("localhost"));
  CHECK_FALSE(needs_resolving("127.0.0.1"));
  CHECK_FALSE(needs_resolving("::1"));
  CHECK_FALSE(needs_resolving("/var/run/postgresql"));
  CHECK_FALSE(needs_resolving(""));
}

TEST_CASE("pg connection: each name becomes one entry per address, ports follow, unresolved names are dropped",
          "[pg]") {
  auto options = parse_conninfo("host='db1,10.0.0.9,gone,/tmp' port=5433 dbname=app sslmode=verify-full");
  auto out = with_host_addresses(options, {{"db1", {"10.0.0.1", "fd00::1"}}});
  CHECK(get(out, "host") == "db1,db1,10.0.0.9,/tmp");
  CHECK(get(out, "hostaddr") == "10.0.0.1,fd00::1,,");
  CHECK(get(out, "port") == "5433,5433,5433,5433");
  CHECK(get(out, "dbname") == "app");
  CHECK(get(out, "sslmode") == "verify-full");

  auto per_host_ports = with_host_addresses(parse_conninfo("host=a,b port=1,2"), {{"a", {"1.1.1.1"}}, {"b", {"2.2.2.2", "2.2.2.3"}}});
  CHECK(get(per_host_ports, "host") == "a,b,b");
  CHECK(get(per_host_ports, "hostaddr") == "1.1.1.1,2.2.2.2,2.2.2.3");
  CHECK(get(per_host_ports, "port") == "1,2,2");
}

TEST_CASE("pg connection: a connection string that does not parse is an error naming why", "[pg]") {
  try {
    parse_conninfo("host='unterminated");
    FAIL("no error");
  } catch (const PgError& e) {
    CHECK(std::string(e.what()).find("could not parse the connection string") != std::string::npos);
  }
}

TEST_CASE("pg connection: a host that accepted the connection and failed it is passed over for the ones after it "
          "(libpq stops there) - the last one, or one not in the list, ends the tries",
          "[pg]") {
  auto options = with_host_addresses(parse_conninfo("host=db1,127.0.0.1,db2 port=5433,5434,5435 dbname=app"),
                                     {{"db1", {"10.0.0.1", "10.0.0.2"}}, {"db2", {"10.0.0.3"}}});
  auto after_first = hosts_after(options, "db1", "10.0.0.1", "5433");
  REQUIRE(after_first);
  CHECK(get(*after_first, "host") == "db1,127.0.0.1,db2");
  CHECK(get(*after_first, "hostaddr") == "10.0.0.2,,10.0.0.3");
  CHECK(get(*after_first, "port") == "5433,5434,5435");
  CHECK(get(*after_first, "dbname") == "app");
  auto after_literal = hosts_after(options, "127.0.0.1", "127.0.0.1", "5434");
  REQUIRE(after_literal);
  CHECK(get(*after_literal, "host") == "db2");
  CHECK(get(*after_literal, "hostaddr") == "10.0.0.3");
  CHECK(get(*after_literal, "port") == "5435");
  CHECK_FALSE(hosts_after(options, "db2", "10.0.0.3", "5435"));        // the last
  CHECK_FALSE(hosts_after(options, "db9", "10.0.0.9", "5433"));        // not in the list
  CHECK_FALSE(hosts_after(options, "127.0.0.1", "127.0.0.1", "9999"));  // another port
  CHECK_FALSE(hosts_after(with_host_addresses(parse_conninfo("host=127.0.0.1 port=5433"), {}), "127.0.0.1",
                          "127.0.0.1", "5433"));  // one host
}
