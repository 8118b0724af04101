-- proto_version: 1
-- options:
-- Insert, Update (same key, changed key), Delete with replica identity default
-- and full, NULLs and non-ASCII text.
CREATE TABLE accounts (id int PRIMARY KEY, name text, note text, balance numeric);
CREATE TABLE audit (id int, what text);
ALTER TABLE audit REPLICA IDENTITY FULL;
CREATE PUBLICATION golden_pub FOR ALL TABLES;
INSERT INTO accounts VALUES (1, 'alice', NULL, 10.50);
INSERT INTO accounts VALUES (2, 'Zoë 日本語 🚀', 'naïve café', NULL);
UPDATE accounts SET balance = 11 WHERE id = 1;
UPDATE accounts SET id = 3 WHERE id = 2;
DELETE FROM accounts WHERE id = 1;
INSERT INTO audit VALUES (7, 'created');
UPDATE audit SET what = 'changed' WHERE id = 7;
DELETE FROM audit WHERE id = 7;
