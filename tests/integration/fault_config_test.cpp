// Fault: invalid configuration. Every bad key is refused with exit code 2 and
// named, before walrelay connects to anything: the database and the broker
// point at a listener of the test's own that must see no connection.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "test_util.hpp"

using namespace it;

namespace {

// A listening TCP socket on a free loopback port; counts connections made to it.
class Listener {
 public:
  Listener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd_, 64) == 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~Listener() { ::close(fd_); }
  int port() const { return port_; }
  // Accepts (and closes) whatever connected since the last call.
  int accepted() {
    int n = 0;
    for (int c; (c = ::accept(fd_, nullptr, nullptr)) >= 0; ++n) ::close(c);
    return n;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace

TEST_CASE("fault: every invalid configuration key is refused with exit 2, named, before connecting",
          "[fault][config]") {
  Listener trap;
  // A valid configuration that points everything at the trap.
  const std::string base = "database.hostname=127.0.0.1\ndatabase.port=" + std::to_string(trap.port()) +
                           "\nkafka.bootstrap.servers=127.0.0.1:" + std::to_string(trap.port()) +
                           "\nadmin.listen=127.0.0.1:0\n";
  struct Case {
    std::string key, line;
  };
  const std::vector<Case> cases = {
      {"no.such.key", "no.such.key=1"},
      {"database.port", "database.port=0"},
      {"database.port", "database.port=http"},
      {"database.sslmode", "database.sslmode=sometimes"},
      {"database.connect.timeout.ms", "database.connect.timeout.ms=5"},
      {"slot.name", "slot.name=Bad-Slot"},
      {"publication.name", "publication.name="},
      {"publication.autocreate.mode", "publication.autocreate.mode=all_tables"},
      {"status.update.interval.ms", "status.update.interval.ms=-1"},
      {"replication.timeout.ms", "replication.timeout.ms=10"},
      {"reconnect.backoff.max.ms", "reconnect.backoff.ms=5000\nreconnect.backoff.max.ms=100"},
      {"slot.status.interval.ms", "slot.status.interval.ms=soon"},
      {"pgoutput.binary", "pgoutput.binary=yes"},
      {"table.include.list", "table.include.list=a.b.c"},
      {"table.include.list", "table.include.list=public.t,public.t"},
      {"table.field.event.id", "table.field.event.id="},
      {"route.topic.replacement", "route.topic.replacement="},
      {"route.by.field", "route.by.field="},
      {"table.fields.additional.placement", "table.fields.additional.placement=type:value"},
      {"value.converter", "value.converter=org.apache.kafka.connect.json.JsonConverter"},
      {"route.topic.regex", "route.topic.regex=(unclosed"},
      {"message.prefix.include.list", "message.prefix.include.list=[bad"},
      {"route.tombstone.on.empty.payload", "route.tombstone.on.empty.payload=1"},
      {"max.inflight.records", "max.inflight.records=0"},
      {"max.inflight.bytes", "max.inflight.bytes=1000"},
      {"errors.tolerance", "errors.tolerance=some"},
      {"errors.deadletterqueue.topic.name", "errors.tolerance=all"},
      {"errors.deadletterqueue.context.headers.enable", "errors.deadletterqueue.context.headers.enable=on"},
      {"shutdown.timeout.ms", "shutdown.timeout.ms=-5"},
      {"admin.listen", "admin.listen=8080"},
      {"log.level", "log.level=loud"},
      {"log.format", "log.format=xml"},
      {"kafka.acks", "kafka.acks=1"},
      {"kafka.enable.idempotence", "kafka.enable.idempotence=false"},
      {"kafka.no.such.property", "kafka.no.such.property=1"},
      {"kafka.linger.ms", "kafka.linger.ms=forever"},
      {"database.port", "database.port=5432\ndatabase.port=5433"},  // conflicting or redundant
  };
  for (auto& c : cases) {
    INFO("case: " << c.line);
    Walrelay relay(base + c.line + "\n");
    auto t0 = std::chrono::steady_clock::now();
    relay.start();
    int code = relay.wait_exit(10s);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto log = relay.log();
    INFO("output: " << log);
    CHECK(code == 2);
    CHECK(log.find(c.key) != std::string::npos);
    CHECK(s < 5);
    CHECK(log.find("connecting:") == std::string::npos);
  }
  // Not one connection reached the database or the broker port.
  CHECK(trap.accepted() == 0);

  // The same key from the environment is refused the same way.
  Walrelay env_relay(base, {{"WALRELAY_MAX_INFLIGHT_RECORDS", "-1"}});
  env_relay.start();
  CHECK(env_relay.wait_exit(10s) == 2);
  CHECK(env_relay.log().find("max.inflight.records") != std::string::npos);
  CHECK(trap.accepted() == 0);
}
