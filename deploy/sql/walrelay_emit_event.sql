-- The tableless outbox: an outbox event written to the WAL only, in the
-- caller's transaction, with nothing to store, vacuum or delete.
--
--   BEGIN;
--   INSERT INTO orders ...;
--   SELECT walrelay_emit_event('Order', '42', 'OrderCreated', '{"total": 12}');
--   COMMIT;
--
-- walrelay relays it when message.prefix.include.list matches the prefix
-- ('outbox' unless given). The members are named as walrelay's defaults
-- name the outbox columns (table.field.event.id, route.by.field,
-- table.field.event.key, table.field.event.type, table.field.event.payload);
-- rename them here if you changed those. The payload goes out as jsonb's
-- text form, the same bytes a jsonb payload column gives. PostgreSQL 13+
-- (gen_random_uuid); 14+ to relay it.
CREATE OR REPLACE FUNCTION walrelay_emit_event(
    aggregatetype text,
    aggregateid text,
    event_type text,
    payload jsonb,
    prefix text DEFAULT 'outbox',
    event_id uuid DEFAULT gen_random_uuid())
RETURNS pg_lsn
LANGUAGE sql
VOLATILE
AS $$
  -- transactional = true: the message commits or rolls back with the
  -- business write, and reaches walrelay only if it commits.
  SELECT pg_logical_emit_message(
    true,
    prefix,
    jsonb_build_object(
      'id', event_id,
      'aggregatetype', aggregatetype,
      'aggregateid', aggregateid,
      'type', event_type,
      'payload', payload)::text)
$$;
