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
    last_error, dead_at, error_type, error_signature)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, $11, $12)
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

-- The inbox dead letters a filter selects (InboxListOptions, InboxRedriveFilter): $1 the scope's tenant (NULL
-- estate-wide), $2 a handler, $3 message IDs, $4 the topic consumed from, $5 a message type, $6 an ILIKE pattern on
-- the last error, $7 dead after (exclusive), $8 dead at or before, $9 an error signature. A NULL argument
-- does not filter.
-- fragment: inbox_dead_where
($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR handler = $2)
  AND ($3::text[] IS NULL OR message_id = ANY ($3::text[])) AND ($4::text IS NULL OR topic = $4)
  AND ($5::text IS NULL OR message_type = $5) AND ($6::text IS NULL OR last_error ILIKE $6)
  AND ($7::timestamptz IS NULL OR dead_at > $7) AND ($8::timestamptz IS NULL OR dead_at <= $8)
  AND ($9::text IS NULL OR error_signature = $9)

-- A page of the inbox dead letters {inbox_dead_where} selects, in (dead_at, message_id, handler, tenant_id) order
-- ({order}: ASC or DESC) after (before, DESC) the row ($10, $11, $12, $13), at most $14, the payloads cut to their
-- first $15 bytes when $15 > 0; when $16 > 0, the last errors cut to their first $16 characters and no metadata
-- (an empty object), so neither is read whole. The index on that order (migration 040) walks the rows in order.
-- name: inbox_list_dead
SELECT message_id, handler, tenant_id, message_type, topic,
    CASE WHEN $15::int > 0 THEN substring(payload FROM 1 FOR $15::int) ELSE payload END,
    CASE WHEN $16::int > 0 THEN '{}'::jsonb ELSE metadata END, attempts,
    CASE WHEN $16::int > 0 THEN substring(last_error FROM 1 FOR $16::int) ELSE last_error END, dead_at,
    octet_length(payload), error_type, error_signature
FROM {inbox_dead}
WHERE {inbox_dead_where}
  AND (dead_at, message_id, handler, tenant_id) {after} ($10::timestamptz, $11::text, $12::text, $13::text)
ORDER BY dead_at {order}, message_id {order}, handler {order}, tenant_id {order}
LIMIT $14

-- name: inbox_count_dead
SELECT count(*) FROM {inbox_dead} WHERE {inbox_dead_where}

-- One batch of a discard by filter ({inbox_dead_where}): up to $10 dead letters, oldest first. The inbox entries
-- stay, so redeliveries are still skipped.
-- name: inbox_discard_where
DELETE FROM {inbox_dead} WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {inbox_dead} WHERE {inbox_dead_where} ORDER BY dead_at LIMIT $10 FOR UPDATE SKIP LOCKED))
RETURNING message_id

-- The columns of an inbox dead letter, as read back, with the payload's size.
-- fragment: inbox_dead_columns
message_id, handler, tenant_id, message_type, topic, payload, metadata, attempts, last_error, dead_at,
    octet_length(payload), error_type, error_signature

-- name: inbox_dead_get
SELECT {inbox_dead_columns} FROM {inbox_dead}
WHERE message_id = $1 AND handler = $2 AND ($3::text IS NULL OR tenant_id = $3)
ORDER BY tenant_id

-- Takes (deletes and returns) up to $10 dead letters of the scope that {inbox_dead_where} selects, oldest first.
-- name: inbox_dead_take
DELETE FROM {inbox_dead} WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {inbox_dead} WHERE {inbox_dead_where} ORDER BY dead_at LIMIT $10 FOR UPDATE SKIP LOCKED))
RETURNING {inbox_dead_columns}

-- Forgets that the message was dead-lettered (never that it was handled), so its next delivery runs the handler;
-- and its failed attempts, so it gets MaxAttempts again.
-- name: inbox_unmark
WITH i AS (DELETE FROM {inbox} WHERE message_id = $1 AND handler = $2 AND tenant_id = $3
    AND outcome = 'dead-lettered')
DELETE FROM {inbox_attempts} WHERE message_id = $1 AND handler = $2 AND tenant_id = $3

-- The latest handlings after $1 (of tenant $2 when not NULL), newest first, at most $3, each with its message's
-- staging and publication as the ledger records them (a message published from another database's outbox has
-- none, and is left out). The inbox rows are found first (through the BRIN index on processed_at), then each one's
-- ledger entry by its key (message ID first): the ledger is never joined as a whole.
-- name: recently_handled
SELECT i.message_id, i.tenant_id, s.topic, i.handler, coalesce(s.source_position, 0), s.created_at, s.sent_at,
    i.processed_at
FROM (
    SELECT message_id, tenant_id, handler, processed_at FROM {inbox}
    WHERE processed_at > $1 AND outcome = 'handled' AND ($2::text IS NULL OR tenant_id = $2)
    ORDER BY processed_at DESC
    LIMIT $3
) i
CROSS JOIN LATERAL (
    SELECT s.topic, s.source_position, s.created_at, s.sent_at FROM {sent} s
    WHERE s.message_id = i.message_id AND s.tenant_id = i.tenant_id AND s.outcome = 'sent'
    ORDER BY s.sent_at
    LIMIT 1
) s
ORDER BY i.processed_at DESC

-- The inbox entries of the messages $1 (of tenant $2 when not NULL): which handlers handled (or dead-lettered)
-- them, and when. Through the inbox's key (message ID first).
-- name: inbox_entries
SELECT message_id, tenant_id, handler, outcome, processed_at
FROM {inbox}
WHERE message_id = ANY ($1::text[]) AND ($2::text IS NULL OR tenant_id = $2)
ORDER BY message_id, tenant_id, processed_at
