-- proto_version: 1
-- options: binary
-- Binary mode: values in their send format.
CREATE TABLE b (id int PRIMARY KEY, i8 bigint, t text, ts timestamptz, u uuid, f bool, n numeric, raw bytea, z int);
CREATE PUBLICATION golden_pub FOR ALL TABLES;
INSERT INTO b VALUES (1, 1234567890123, 'héllo', '2024-01-02 03:04:05+00',
  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', true, 3.14, '\xdeadbeef', NULL);
