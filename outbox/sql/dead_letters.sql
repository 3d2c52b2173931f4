-- Statements on the outbox's dead letters: redrive, discard, listing, and the fragment every probe of a held key
-- uses. Markers: {outbox}, {sent}, {dead} are the tables' names.

-- The first sequence number among the dead letters holding the key ({tenant}, {key}), NULL when none holds it: a
-- message of the key with a later number waits for it. Through the index on a key's dead letters (migration
-- 028), filtering on holds_key (rare among them).
-- fragment: key_hold
(SELECT kd.seq FROM {dead} kd
 WHERE kd.holds_key AND kd.seq IS NOT NULL AND kd.tenant_id = {tenant} AND kd.partition_key = {key}
 ORDER BY kd.seq LIMIT 1)

-- Redrive: move dead letters back into the outbox, due now, with a fresh attempt count. A redriven message
-- keeps its sequence number, so it goes before the messages its key was holding.
-- name: redrive
WITH gone AS (
    DELETE FROM {dead} WHERE message_id = ANY($1) AND ($2::text IS NULL OR tenant_id = $2) RETURNING *
), back AS (
    INSERT INTO {outbox} (message_id, message_type, topic, payload, metadata, tenant_id, correlation_id,
        causation_id, partition_key, seq, source_position, scheduled_at, attempts, last_error, next_attempt_at,
        created_at)
    SELECT message_id, message_type, topic, payload, metadata, tenant_id, correlation_id, causation_id,
        partition_key, seq, source_position, scheduled_at, 0, last_error, $3, created_at
    FROM gone
    RETURNING message_id
)
SELECT g.message_id, g.tenant_id, g.partition_key, g.holds_key FROM gone g

-- Discard: drop dead letters, keeping their IDs in the ledger so re-staging them publishes nothing.
-- name: discard
WITH gone AS (
    DELETE FROM {dead} WHERE message_id = ANY($1) AND ($2::text IS NULL OR tenant_id = $2) RETURNING *
), kept AS (
    INSERT INTO {sent} (message_id, tenant_id, topic, message_type, source_position, attempts, created_at, sent_at,
        outcome)
    SELECT message_id, tenant_id, topic, message_type, source_position, attempts, created_at, $3, 'discarded'
    FROM gone
    ON CONFLICT (message_id, topic, tenant_id) DO NOTHING
)
SELECT g.message_id, g.tenant_id, g.partition_key, g.holds_key FROM gone g

-- name: list_dead
SELECT message_id, tenant_id, message_type, topic, payload, metadata, correlation_id, causation_id, partition_key,
    seq, source_position, scheduled_at, attempts, last_error, holds_key, created_at, dead_at
FROM {dead}
WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR topic = $2)
  AND ($3::text IS NULL OR message_id = $3)
  AND (dead_at, message_id, topic, tenant_id) > ($4, $5, $6, $8)
ORDER BY dead_at, message_id, topic, tenant_id
LIMIT $7

-- name: get_dead
SELECT message_id, tenant_id, message_type, topic, payload, metadata, correlation_id, causation_id, partition_key,
    seq, source_position, scheduled_at, attempts, last_error, holds_key, created_at, dead_at
FROM {dead} WHERE message_id = $1 AND ($2::text IS NULL OR tenant_id = $2)
ORDER BY dead_at, topic, tenant_id
LIMIT 1
