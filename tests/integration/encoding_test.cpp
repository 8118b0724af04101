// A database in another encoding: what reaches Kafka is UTF-8 all the same.
#include <csignal>

#include "test_util.hpp"

using namespace it;

TEST_CASE("relay: a LATIN1 database - accented payloads, keys and dead-letter JSON reach Kafka as UTF-8",
          "[relay][encoding]") {
  Db admin;
  const std::string slot = unique_name("enc");
  const std::string dbname = slot + "_latin1";
  admin.exec("CREATE DATABASE " + dbname + " ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
  struct Drop {
    Db& admin;
    std::string slot, dbname;
    ~Drop() {
      try {
        eventually([&] { return admin.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + slot +
                                             "' AND active") == "0"; }, 10s);
        admin.exec("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '" + slot +
                   "'");
        admin.exec("DROP DATABASE IF EXISTS " + dbname + " WITH (FORCE)");
      } catch (...) {
      }
    }
  } drop{admin, slot, dbname};
  {
    Db latin1(dbname);
    REQUIRE(latin1.scalar("SHOW server_encoding") == "LATIN1");
    latin1.exec("CREATE TABLE outbox (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, aggregatetype text NOT NULL, "
                "aggregateid text, type text NOT NULL, payload text)");
  }
  std::string config = with_key(base_config(slot), "database.dbname", dbname) +
                       "table.include.list=public.outbox\nroute.topic.replacement=" + slot +
                       ".${routedByValue}\nerrors.tolerance=all\nerrors.deadletterqueue.topic.name=" + slot + ".dlq\n";
  Walrelay relay(config);
  relay.start();
  relay.wait_streaming();
  Db latin1(dbname);
  latin1.exec("INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES "
              "('Order', 'clé-1', 'Créé', '{\"name\": \"café Müller\", \"note\": \"¿½ Ø\"}')");
  // A row with no key: a dead letter, its JSON carrying the accented columns.
  latin1.exec("INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES "
              "('Order', NULL, 'Créé', 'crème brûlée')");

  auto values = consume_values_raw(slot + ".Order", 1);
  REQUIRE(values.size() == 1);
  CHECK(values[0] == std::optional<std::string>("{\"name\": \"café Müller\", \"note\": \"¿½ Ø\"}"));
  auto recs = consume(slot + ".Order", 1);
  REQUIRE(recs.size() == 1);
  CHECK(recs[0].key == std::optional<std::string>("clé-1"));

  auto dead = consume_values_raw(slot + ".dlq", 1);
  REQUIRE(dead.size() == 1);
  REQUIRE(dead[0]);
  INFO(*dead[0]);
  CHECK(dead[0]->find("\"payload\":\"crème brûlée\"") != std::string::npos);
  CHECK(dead[0]->find("\"type\":\"Créé\"") != std::string::npos);
  relay.signal(SIGTERM);
  CHECK(relay.wait_exit() == 0);
}
