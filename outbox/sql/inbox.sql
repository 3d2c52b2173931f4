-- name: inbox_claim
INSERT INTO {inbox} (message_id, handler, tenant_id, message_type, processed_at) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (message_id, handler, tenant_id) DO NOTHING

-- A failure counts only for a message the handler has not handled: a duplicate delivery that failed before
-- reaching the inbox record (its transaction could not begin, the database restarted) must neither leave
-- an attempt behind nor dead-letter a message whose effects are committed.
-- name: inbox_attempt
INSERT INTO {inbox_attempts} AS a (message_id, handler, tenant_id, attempts, last_error, first_failed_at,
    last_failed_at)
SELECT $1, $2, $3, 1, $4, $5, $5
WHERE NOT EXISTS (SELECT 1 FROM {inbox} WHERE message_id = $1 AND handler = $2 AND tenant_id = $3)
ON CONFLICT (message_id, handler, tenant_id) DO UPDATE
SET attempts = a.attempts + 1, last_error = EXCLUDED.last_error, last_failed_at = EXCLUDED.last_failed_at
RETURNING attempts

-- name: inbox_clear_attempts
DELETE FROM {inbox_attempts} WHERE message_id = $1 AND handler = $2 AND tenant_id = $3

-- name: inbox_dead_letter
INSERT INTO {inbox_dead} (message_id, handler, tenant_id, message_type, topic, payload, metadata, attempts,
    last_error, dead_at)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10)
ON CONFLICT (message_id, handler, tenant_id) DO NOTHING

-- name: inbox_mark_dead
INSERT INTO {inbox} (message_id, handler, tenant_id, message_type, outcome, processed_at)
VALUES ($1, $2, $3, $4, 'dead-lettered', $5)
ON CONFLICT (message_id, handler, tenant_id) DO NOTHING

-- name: inbox_stats
SELECT count(*) FILTER (WHERE outcome = 'handled'), min(processed_at),
    (SELECT count(*) FROM {inbox_attempts} WHERE $1::text IS NULL OR tenant_id = $1),
    (SELECT count(*) FROM {inbox_dead} WHERE $1::text IS NULL OR tenant_id = $1)
FROM {inbox} WHERE $1::text IS NULL OR tenant_id = $1

-- name: inbox_cleanup
DELETE FROM {inbox} WHERE ctid = ANY (ARRAY(
    SELECT i.ctid FROM {inbox} i WHERE i.processed_at < $1 AND ($2::text IS NULL OR i.tenant_id = $2)
      AND NOT EXISTS (SELECT 1 FROM {inbox_dead} d
                      WHERE d.message_id = i.message_id AND d.handler = i.handler AND d.tenant_id = i.tenant_id)
    LIMIT $3))

-- name: inbox_list_dead
SELECT message_id, handler, tenant_id, message_type, topic, payload, metadata, attempts, last_error, dead_at
FROM {inbox_dead}
WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR handler = $2)
  AND (dead_at, message_id, handler, tenant_id) > ($3, $4, $5, $7)
ORDER BY dead_at, message_id, handler, tenant_id
LIMIT $6

-- name: inbox_remove_dead
DELETE FROM {inbox_dead} WHERE message_id = $1 AND handler = $2 AND ($3::text IS NULL OR tenant_id = $3)

-- The columns of an inbox dead letter, as read back.
-- fragment: inbox_dead_columns
message_id, handler, tenant_id, message_type, topic, payload, metadata, attempts, last_error, dead_at

-- name: inbox_dead_get
SELECT {inbox_dead_columns} FROM {inbox_dead}
WHERE message_id = $1 AND handler = $2 AND ($3::text IS NULL OR tenant_id = $3)
ORDER BY tenant_id

-- Takes (deletes and returns) up to $4 dead letters of the scope ($1 the tenant when not NULL): of handler $2 when
-- not NULL, with an ID in $3 when not NULL.
-- name: inbox_dead_take
DELETE FROM {inbox_dead} WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {inbox_dead}
    WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR handler = $2)
      AND ($3::text[] IS NULL OR message_id = ANY ($3::text[]))
    ORDER BY dead_at LIMIT $4 FOR UPDATE SKIP LOCKED))
RETURNING {inbox_dead_columns}

-- Forgets that the message was dead-lettered (never that it was handled), so its next delivery runs the handler;
-- and its failed attempts, so it gets MaxAttempts again.
-- name: inbox_unmark
WITH i AS (DELETE FROM {inbox} WHERE message_id = $1 AND handler = $2 AND tenant_id = $3
    AND outcome = 'dead-lettered')
DELETE FROM {inbox_attempts} WHERE message_id = $1 AND handler = $2 AND tenant_id = $3
