-- proto_version: 1
-- options:
-- Truncate of several relations, plain, CASCADE and RESTART IDENTITY.
CREATE TABLE t_a (id serial PRIMARY KEY);
CREATE TABLE t_b (id serial PRIMARY KEY, a int REFERENCES t_a(id));
CREATE TABLE t_c (id int);
CREATE PUBLICATION golden_pub FOR ALL TABLES;
TRUNCATE t_a, t_b, t_c;
TRUNCATE t_a CASCADE;
TRUNCATE t_c RESTART IDENTITY;
TRUNCATE t_a, t_b RESTART IDENTITY CASCADE;
