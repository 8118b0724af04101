-- proto_version: 2
-- options: streaming
-- Transactions bigger than logical_decoding_work_mem (64kB) are streamed:
-- one with an aborted subtransaction that commits, one that aborts, and a
-- small one that is not streamed.
CREATE TABLE s (id int PRIMARY KEY, pad text);
CREATE PUBLICATION golden_pub FOR ALL TABLES;
BEGIN;
INSERT INTO s SELECT i, repeat('a', 100) FROM generate_series(1, 1000) i;
SELECT pg_logical_emit_message(true, 'outbox', 'in-stream');
SAVEPOINT sp;
INSERT INTO s SELECT i, repeat('b', 100) FROM generate_series(1001, 2000) i;
ROLLBACK TO SAVEPOINT sp;
INSERT INTO s SELECT i, repeat('c', 100) FROM generate_series(2001, 3000) i;
COMMIT;
BEGIN;
INSERT INTO s SELECT i, repeat('d', 100) FROM generate_series(3001, 4000) i;
ROLLBACK;
INSERT INTO s VALUES (5000, 'small');
