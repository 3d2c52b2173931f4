-- Statements on the outbox's dead letters: redrive, discard, listing, and the fragment every probe of a held key
-- uses. Markers: {outbox}, {sent}, {dead} are the tables' names.

-- The first sequence number among the dead letters holding the key ({tenant}, {key}), NULL when none holds it: a
-- message of the key with a later number waits for it. Through the index on a key's dead letters (migration
-- 028), filtering on holds_key (rare among them).
-- fragment: key_hold
(SELECT kd.seq FROM {dead} kd
 WHERE kd.holds_key AND kd.seq IS NOT NULL AND kd.tenant_id = {tenant} AND kd.partition_key = {key}
 ORDER BY kd.seq LIMIT 1)

-- The dead letters a filter selects (ListOptions; Admin.DeadLetters, CountDeadLetters, RedriveMatching and
-- DiscardMatching): $1 the scope's tenant (NULL estate-wide), $2 a topic, $3 a message ID, $4 message IDs, $5 a
-- message type, $6 an ILIKE pattern on the last error, $7 dead after (exclusive), $8 dead at or before, $9 an error
-- signature. A NULL argument does not filter.
-- fragment: dead_where
($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR topic = $2) AND ($3::text IS NULL OR message_id = $3)
  AND ($4::text[] IS NULL OR message_id = ANY ($4)) AND ($5::text IS NULL OR message_type = $5)
  AND ($6::text IS NULL OR last_error ILIKE $6) AND ($7::timestamptz IS NULL OR dead_at > $7)
  AND ($8::timestamptz IS NULL OR dead_at <= $8) AND ($9::text IS NULL OR error_signature = $9)

-- What a redrive does with the dead letters it deleted (gone): back into the outbox, due {now}, with a fresh attempt
-- count. A redriven message keeps its sequence number, so it goes before the messages its key was holding.
-- fragment: redrive_back
back AS (
    INSERT INTO {outbox} (message_id, message_type, topic, payload, metadata, tenant_id, correlation_id,
        causation_id, partition_key, seq, source_position, scheduled_at, attempts, last_error, next_attempt_at,
        created_at)
    SELECT message_id, message_type, topic, payload, metadata, tenant_id, correlation_id, causation_id,
        partition_key, seq, source_position, scheduled_at, 0, last_error, {now}, created_at
    FROM gone
    RETURNING message_id
)
SELECT g.message_id, g.tenant_id, g.partition_key, g.holds_key FROM gone g

-- What a discard does with the dead letters it deleted (gone): their IDs stay in the ledger, discarded at {now},
-- so re-staging them publishes nothing.
-- fragment: discard_kept
kept AS (
    INSERT INTO {sent} (message_id, tenant_id, topic, message_type, source_position, attempts, created_at, sent_at,
        outcome)
    SELECT message_id, tenant_id, topic, message_type, source_position, attempts, created_at, {now}, 'discarded'
    FROM gone
    ON CONFLICT (message_id, topic, tenant_id) DO NOTHING
)
SELECT g.message_id, g.tenant_id, g.partition_key, g.holds_key FROM gone g

-- Redrive: move the dead letters with the IDs $1 (of tenant $2 when not NULL) back into the outbox, due $3.
-- name: redrive
WITH gone AS (
    DELETE FROM {dead} WHERE message_id = ANY($1) AND ($2::text IS NULL OR tenant_id = $2) RETURNING *
), {redrive_back now=$3}

-- Discard: drop the dead letters with the IDs $1 (of tenant $2 when not NULL), discarded at $3.
-- name: discard
WITH gone AS (
    DELETE FROM {dead} WHERE message_id = ANY($1) AND ($2::text IS NULL OR tenant_id = $2) RETURNING *
), {discard_kept now=$3}

-- One batch of a redrive by filter ({dead_where}): up to $10 dead letters, oldest first, due $11. Rows another
-- operation has locked are left for the next batch.
-- name: redrive_where
WITH gone AS (
    DELETE FROM {dead} WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM {dead} WHERE {dead_where} ORDER BY dead_at LIMIT $10 FOR UPDATE SKIP LOCKED))
    RETURNING *
), {redrive_back now=$11}

-- One batch of a discard by filter ({dead_where}): up to $10 dead letters, oldest first, discarded at $11.
-- name: discard_where
WITH gone AS (
    DELETE FROM {dead} WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM {dead} WHERE {dead_where} ORDER BY dead_at LIMIT $10 FOR UPDATE SKIP LOCKED))
    RETURNING *
), {discard_kept now=$11}

-- The columns of a dead letter as read back; the payload cut to its first $15 bytes when $15 > 0, and its size;
-- when $16 > 0, the last error cut to its first $16 characters and no metadata (an empty object): a list then
-- reads neither whole, however large (a cut of a TOASTed value fetches only the chunks it needs).
-- fragment: dead_columns
message_id, tenant_id, message_type, topic,
    CASE WHEN $15::int > 0 THEN substring(payload FROM 1 FOR $15::int) ELSE payload END,
    CASE WHEN $16::int > 0 THEN '{}'::jsonb ELSE metadata END, correlation_id,
    causation_id, partition_key, seq, source_position, scheduled_at, attempts,
    CASE WHEN $16::int > 0 THEN substring(last_error FROM 1 FOR $16::int) ELSE last_error END, holds_key, created_at,
    dead_at, octet_length(payload), error_type, error_signature

-- A page of the dead letters {dead_where} selects, in (dead_at, message_id, topic, tenant_id) order ({order}: ASC
-- or DESC) after (before, DESC) the row ($10, $11, $12, $13), at most $14. The index on that order (migration 040)
-- walks the rows in order and stops at the page's end.
-- name: list_dead
SELECT {dead_columns}
FROM {dead}
WHERE {dead_where}
  AND (dead_at, message_id, topic, tenant_id) {after} ($10::timestamptz, $11::text, $12::text, $13::text)
ORDER BY dead_at {order}, message_id {order}, topic {order}, tenant_id {order}
LIMIT $14

-- name: count_dead
SELECT count(*) FROM {dead} WHERE {dead_where}

-- The oldest dead letter with message ID $1 (of tenant $2 when not NULL); the whole payload.
-- name: get_dead
SELECT message_id, tenant_id, message_type, topic, payload, metadata, correlation_id, causation_id, partition_key,
    seq, source_position, scheduled_at, attempts, last_error, holds_key, created_at, dead_at, octet_length(payload),
    error_type, error_signature
FROM {dead} WHERE message_id = $1 AND ($2::text IS NULL OR tenant_id = $2)
ORDER BY dead_at, topic, tenant_id
LIMIT 1

-- The dead letters holding their key (of tenant $1 when not NULL), each with how many pending messages of the key
-- wait behind it, in (dead_at, tenant_id, partition_key, message_id, topic) order after the row ($2, $3, $4, $5, $6),
-- at most $7. The count probes the key index of the outbox (migration 025).
-- name: held_keys
SELECT d.tenant_id, d.partition_key, d.message_id, d.topic, d.message_type, d.seq, d.attempts, d.last_error,
    d.dead_at,
    (SELECT count(*) FROM {outbox} o
     WHERE o.tenant_id = d.tenant_id AND o.partition_key = d.partition_key AND o.seq > d.seq)
FROM {dead} d
WHERE d.holds_key AND d.seq IS NOT NULL AND ($1::text IS NULL OR d.tenant_id = $1)
  AND (d.dead_at, d.tenant_id, d.partition_key, d.message_id, d.topic) > ($2::timestamptz, $3::text, $4::text,
      $5::text, $6::text)
ORDER BY d.dead_at, d.tenant_id, d.partition_key, d.message_id, d.topic
LIMIT $7
