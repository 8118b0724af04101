-- Demo schema for deploy/docker-compose.yml: an application table and an
-- outbox table with the column names of the Outbox Event Router defaults.
-- Runs once, as the superuser, when the PostgreSQL volume is first created.

CREATE TABLE orders (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id bigint      NOT NULL,
    total_cents bigint      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- id -> Kafka header `id`; aggregateid -> record key; aggregatetype -> topic
-- outbox.event.<aggregatetype>; payload -> record value (relayed as stored).
CREATE TABLE outbox (
    id            uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregatetype text        NOT NULL,
    aggregateid   text        NOT NULL,
    type          text        NOT NULL,
    payload       jsonb,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- The relay's role: REPLICATION for the slot, nothing on the tables. The
-- password is for this demo only.
CREATE ROLE walrelay LOGIN REPLICATION PASSWORD 'walrelay-demo';

-- A pre-made publication (walrelay.properties: publication.autocreate.mode=disabled),
-- so the relay's role needs no ownership of the outbox table. Only inserts matter.
CREATE PUBLICATION walrelay FOR TABLE public.outbox WITH (publish = 'insert');
-- Owned by the relay's role, which records its slot in the publication's
-- comment: a later start then tells a lost slot from a first start and
-- stops instead of skipping events. (Only a superuser can give it away.)
ALTER PUBLICATION walrelay OWNER TO walrelay;

-- The application's role.
CREATE ROLE app LOGIN PASSWORD 'app-demo';
GRANT SELECT, INSERT ON orders, outbox TO app;
