-- proto_version: 1
-- options:
-- A table with 200 columns c1..c200; the row holds 'v1'..'v200'.
DO $$
BEGIN
  EXECUTE 'CREATE TABLE wide (' ||
    (SELECT string_agg(format('c%s text', i), ', ') FROM generate_series(1, 200) i) || ')';
END $$;
CREATE PUBLICATION golden_pub FOR ALL TABLES;
DO $$
BEGIN
  EXECUTE 'INSERT INTO wide VALUES (' ||
    (SELECT string_agg(format('%L', 'v' || i), ', ') FROM generate_series(1, 200) i) || ')';
END $$;
