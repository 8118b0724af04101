-- proto_version: 1
-- options:
-- A transaction replayed with a replication origin: Origin after Begin.
CREATE TABLE o (id int PRIMARY KEY);
CREATE PUBLICATION golden_pub FOR ALL TABLES;
SELECT pg_replication_origin_create('upstream_a');
SELECT pg_replication_origin_session_setup('upstream_a');
BEGIN;
SELECT pg_replication_origin_xact_setup('0/ABCDEF12', '2024-01-02 03:04:05+00');
INSERT INTO o VALUES (1);
COMMIT;
SELECT pg_replication_origin_session_reset();
