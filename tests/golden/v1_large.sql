-- proto_version: 1
-- options:
-- A 1 MB (1048576 byte) text value.
CREATE TABLE blobs (id int PRIMARY KEY, payload text);
ALTER TABLE blobs ALTER COLUMN payload SET STORAGE EXTERNAL;
CREATE PUBLICATION golden_pub FOR ALL TABLES;
INSERT INTO blobs VALUES (1, repeat('0123456789abcdef', 65536));
