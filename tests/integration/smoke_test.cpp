// Smoke tests: the parts the project stands on are real and reachable.
#include <catch2/catch.hpp>

#include <librdkafka/rdkafka.h>
#include <libpq-fe.h>

#include <set>

#include "harness.hpp"

using namespace it;

TEST_CASE("smoke: a libpq replication connection runs IDENTIFY_SYSTEM", "[smoke]") {
  const auto& s = Services::get();
  std::string conninfo = "host=" + s.pg_host + " port=" + s.pg_port + " user=" + s.pg_user +
                         " dbname=" + s.pg_database + " replication=database";
  PGconn* conn = PQconnectdb(conninfo.c_str());
  REQUIRE(PQstatus(conn) == CONNECTION_OK);
  PGresult* r = PQexec(conn, "IDENTIFY_SYSTEM");
  REQUIRE(PQresultStatus(r) == PGRES_TUPLES_OK);
  CHECK(PQntuples(r) == 1);
  CHECK(std::string(PQfname(r, 0)) == "systemid");
  CHECK(parse_lsn(PQgetvalue(r, 0, 2)) > 0);  // xlogpos
  PQclear(r);
  PQfinish(conn);
}

TEST_CASE("smoke: a logical slot with pgoutput is created and dropped", "[smoke]") {
  Db db;
  std::string slot = unique_name("smoke");
  auto rows = db.exec("SELECT lsn FROM pg_create_logical_replication_slot('" + slot + "', 'pgoutput')");
  REQUIRE(rows.size() == 1);
  CHECK(db.scalar("SELECT plugin FROM pg_replication_slots WHERE slot_name = '" + slot + "'") == "pgoutput");
  db.exec("SELECT pg_drop_replication_slot('" + slot + "')");
  CHECK(db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + slot + "'") == "0");
}

TEST_CASE("smoke: a librdkafka producer writes records that kcat reads back", "[smoke]") {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  REQUIRE(rd_kafka_conf_set(conf, "bootstrap.servers", Services::get().kafka.c_str(), err, sizeof err) ==
          RD_KAFKA_CONF_OK);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  REQUIRE(rk);
  std::string topic = unique_name("smoke");
  for (int i = 0; i < 10; ++i) {
    std::string key = "k" + std::to_string(i), value = "v" + std::to_string(i);
    REQUIRE(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_KEY(key.data(), key.size()),
                              RD_KAFKA_V_VALUE(value.data(), value.size()), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                              RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  CHECK(rd_kafka_flush(rk, 30000) == RD_KAFKA_RESP_ERR_NO_ERROR);
  rd_kafka_destroy(rk);
  auto recs = consume(topic, 10);
  REQUIRE(recs.size() == 10);
  std::set<std::string> values;
  for (auto& r : recs) values.insert(*r.value);
  CHECK(values.count("v0"));
  CHECK(values.count("v9"));
}
