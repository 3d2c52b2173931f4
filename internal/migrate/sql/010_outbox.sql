-- Outbox: messages staged with business transactions, the relay's leases, dead letters, the ledger of sent message
-- IDs, per-key sequence counters and the watermarks that bound cleanup. Owned by package outbox.
--
-- Layout, and why:
--   outbox              the hot table. Only messages still to be published (and the few parked behind a
--                       dead-lettered message of their key) live here. A publication moves the row out, so the
--                       table stays small and cheap to vacuum however long the system runs.
--   outbox_sent         a compact ledger of published (or discarded) message IDs. Staging the same ID for the same
--                       topic again inserts nothing while it is here; cleanup removes entries by age and below the lowest
--                       watermark ("Sent rows and re-staging" in docs/design.md).
--   outbox_dead_letters messages whose retries are used up, with everything needed to redrive them.
--   outbox_keys         one counter per partition key; staging locks it, so sequence numbers follow staging-commit
--                       order even when transactions stage the same key concurrently.
--   outbox_watermarks   source positions that components re-staging from the event log have passed.
-- Every time is timestamptz. Tenant is never NULL: "no tenant" is the reserved value '__untenanted__'.

CREATE TABLE outbox (
    -- The relay's handle on a row (claims, marks, leases address rows by it: one bigint array per batch).
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The message ID (text: Watermill users publish UUIDs, ULIDs or short IDs) and its destination topic at the
    -- broker identify the message: staging the same ID for the same topic twice inserts one row, while one
    -- message fanned out to several topics is one row per topic (Watermill's own Pub/Sub suite publishes the same
    -- UUIDs to twenty topics and expects each to deliver them all).
    message_id       text        NOT NULL CHECK (message_id <> ''),
    topic            text        NOT NULL CHECK (topic <> ''),
    -- Stable message type name (never a Go type name); '' when the producer gave none.
    message_type     text        NOT NULL DEFAULT '',
    payload          bytea       NOT NULL,
    -- Watermill metadata (string to string).
    metadata         jsonb       NOT NULL DEFAULT '{}',
    tenant_id        text        NOT NULL DEFAULT '__untenanted__' CHECK (tenant_id <> ''),
    correlation_id   text        NOT NULL DEFAULT '',
    causation_id     text        NOT NULL DEFAULT '',
    -- Messages sharing a partition key are published in staging-commit order; '' means unordered.
    partition_key    text        NOT NULL DEFAULT '',
    -- Position of the message within its key (from outbox_keys); NULL for unordered and scheduled messages.
    seq              bigint,
    -- Global event-log position the message was derived from, for retention by watermark; NULL otherwise.
    source_position  bigint,
    -- Not published before this instant; NULL for immediate messages.
    scheduled_at     timestamptz,
    -- Delivery attempts that ended in a rejection (a broker that could not be reached counts none).
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error       text,
    -- The relay holding the row, and when that lease lapses. Marks are conditional on still holding it.
    lease_owner      text,
    lease_expires_at timestamptz,
    -- The row is not claimed before this instant: the scheduled time, the end of a retry backoff, or 'infinity'
    -- while the row is parked: it waits behind an earlier message of its key (still pending, or dead-lettered
    -- and holding the key), and is promoted (made due) when that message is done.
    next_attempt_at  timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    CONSTRAINT outbox_message_key UNIQUE (message_id, topic)
) WITH (
    -- Room on each page for lease updates to stay HOT (no new index entries).
    fillfactor = 70,
    -- The table is a queue: rows are inserted and deleted all day. Vacuum it after a fixed number of dead rows
    -- rather than a fraction of a table that is nearly empty, at full speed, so dead index entries do not pile up
    -- at the head of the claim index (docs/design.md, "Measured ceilings").
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 5000
);

-- The claim: due rows, oldest first. Parked rows ('infinity') are left out, so however deep the backlog of one
-- key, a claim never walks past its waiting messages.
CREATE INDEX outbox_due_idx ON outbox (next_attempt_at) WHERE next_attempt_at < 'infinity';

-- Per-key order: is there an earlier message of this key still to publish, and which messages follow it.
CREATE INDEX outbox_key_idx ON outbox (partition_key, seq) WHERE seq IS NOT NULL;

-- The keys with parked messages, for the sweep that promotes a key's first message if a promotion was missed.
CREATE INDEX outbox_parked_idx ON outbox (partition_key, seq) WHERE next_attempt_at = 'infinity';

CREATE TABLE outbox_sent (
    message_id      text        NOT NULL,
    topic           text        NOT NULL,
    tenant_id       text        NOT NULL,
    message_type    text        NOT NULL,
    source_position bigint,
    attempts        integer     NOT NULL,
    created_at      timestamptz NOT NULL,
    -- When the message was published, or discarded from the dead letters.
    sent_at         timestamptz NOT NULL,
    outcome         text        NOT NULL DEFAULT 'sent' CHECK (outcome IN ('sent', 'discarded')),
    PRIMARY KEY (message_id, topic)
) WITH (
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);

-- Cleanup finds old entries by time; rows arrive in time order, so a BRIN index is enough and nearly free.
CREATE INDEX outbox_sent_sent_at_idx ON outbox_sent USING brin (sent_at);

CREATE TABLE outbox_dead_letters (
    message_id      text        NOT NULL,
    topic           text        NOT NULL,
    -- Copied from the outbox row; no default, so a hand-written INSERT cannot silently make a message untenanted.
    tenant_id       text        NOT NULL CHECK (tenant_id <> ''),
    message_type    text        NOT NULL,
    payload         bytea       NOT NULL,
    metadata        jsonb       NOT NULL,
    correlation_id  text        NOT NULL,
    causation_id    text        NOT NULL,
    partition_key   text        NOT NULL,
    seq             bigint,
    source_position bigint,
    scheduled_at    timestamptz,
    attempts        integer     NOT NULL,
    last_error      text        NOT NULL,
    -- While true, later messages of the same partition key wait until this one is redriven or discarded.
    holds_key       boolean     NOT NULL,
    created_at      timestamptz NOT NULL,
    dead_at         timestamptz NOT NULL,
    PRIMARY KEY (message_id, topic)
);

CREATE INDEX outbox_dead_letters_hold_idx ON outbox_dead_letters (partition_key, seq) WHERE holds_key;
CREATE INDEX outbox_dead_letters_dead_at_idx ON outbox_dead_letters (tenant_id, dead_at);

-- Staging locks the counter of each key it numbers until its transaction ends; a relay promoting a key's next
-- message locks it too (never waiting: SKIP LOCKED), so a message parked by a staging transaction that has not
-- committed yet is never missed by the promotion.
CREATE TABLE outbox_keys (
    partition_key text   NOT NULL PRIMARY KEY,
    last_seq      bigint NOT NULL
) WITH (
    -- Every staging transaction updates its keys' counters; keep those updates HOT.
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

CREATE TABLE outbox_watermarks (
    name       text        NOT NULL PRIMARY KEY CHECK (name <> ''),
    position   bigint      NOT NULL,
    updated_at timestamptz NOT NULL
);
