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
