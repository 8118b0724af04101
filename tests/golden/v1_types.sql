-- proto_version: 1
-- options:
-- Type messages for a custom enum and a domain column.
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN positive_int AS int CHECK (VALUE > 0);
CREATE TABLE people (id int PRIMARY KEY, m mood, p positive_int, v varchar(20));
CREATE PUBLICATION golden_pub FOR ALL TABLES;
INSERT INTO people VALUES (1, 'happy', 42, 'x');
