-- proto_version: 1
-- options:
-- Unchanged TOAST: updating another column of a row with a large toasted value.
CREATE TABLE docs (id int PRIMARY KEY, big text, counter int);
ALTER TABLE docs ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE PUBLICATION golden_pub FOR ALL TABLES;
INSERT INTO docs SELECT 1, string_agg(md5(i::text), ''), 0 FROM generate_series(1, 400) i;
UPDATE docs SET counter = counter + 1 WHERE id = 1;
