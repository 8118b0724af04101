-- proto_version: 3
-- options: streaming two_phase
-- Two-phase commit: PREPARE TRANSACTION then COMMIT PREPARED, then ROLLBACK
-- PREPARED, and a prepared transaction big enough to be streamed (Stream Prepare).
CREATE TABLE tp (id int PRIMARY KEY, pad text);
CREATE PUBLICATION golden_pub FOR ALL TABLES;
BEGIN;
INSERT INTO tp VALUES (1, 'one');
PREPARE TRANSACTION 'gid-commit';
COMMIT PREPARED 'gid-commit';
BEGIN;
INSERT INTO tp VALUES (2, 'two');
PREPARE TRANSACTION 'gid-rollback';
ROLLBACK PREPARED 'gid-rollback';
BEGIN;
INSERT INTO tp SELECT i, repeat('p', 100) FROM generate_series(100, 1100) i;
PREPARE TRANSACTION 'gid-streamed';
COMMIT PREPARED 'gid-streamed';
