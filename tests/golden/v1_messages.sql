-- proto_version: 1
-- options:
-- Logical decoding messages, transactional and not, including an empty one.
CREATE TABLE m (id int PRIMARY KEY);
CREATE PUBLICATION golden_pub FOR ALL TABLES;
SELECT pg_logical_emit_message(false, 'outbox', 'non-transactional');
BEGIN;
SELECT pg_logical_emit_message(true, 'outbox', 'transactional');
INSERT INTO m VALUES (1);
SELECT pg_logical_emit_message(true, 'empty', '');
SELECT pg_logical_emit_message(true, 'bin', '\x00ff00'::bytea);
COMMIT;
