-- Statements of the routine maintenance (package outbox, Maintainer): its status row, and one batch of each
-- retention. Each DELETE takes one batch ($1 the cutoff, $2 the batch size) by ctid through an index-ordered
-- sub-select, so a pass never holds many row locks at once. Markers: {maint}, {outbox}, {sent}, {dead},
-- {watermarks}, {inbox}, {inbox_attempts}, {inbox_dead} are the tables' names.

-- name: maintenance_last_start
SELECT started_at FROM {maint}

-- name: maintenance_begin
INSERT INTO {maint} (owner, interval_seconds, started_at) VALUES ($1, $2, $3)
ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner, interval_seconds = EXCLUDED.interval_seconds,
    started_at = EXCLUDED.started_at, finished_at = NULL

-- name: maintenance_finish
UPDATE {maint} SET finished_at = $1, last_error = $2, sent_removed = $3, inbox_removed = $4,
    inbox_attempts_removed = $5, dead_letters_expired = $6, inbox_dead_expired = $7, passes = passes + 1

-- name: maintenance_status
SELECT owner, interval_seconds, started_at, finished_at, last_error, sent_removed, inbox_removed,
    inbox_attempts_removed, dead_letters_expired, inbox_dead_expired, passes FROM {maint}

-- Outbox dead letters older than the cutoff that do not hold their key, discarded as Admin.Discard does: their
-- identity stays in the ledger ($3 the time of the discard).
-- name: expire_dead
WITH gone AS (
    DELETE FROM {dead} WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM {dead} WHERE dead_at < $1 AND NOT holds_key LIMIT $2 FOR UPDATE SKIP LOCKED))
    RETURNING *
)
INSERT INTO {sent} (message_id, tenant_id, topic, message_type, source_position, attempts, created_at, sent_at,
    outcome)
SELECT message_id, tenant_id, topic, message_type, source_position, attempts, created_at, $3, 'discarded'
FROM gone
ON CONFLICT (message_id, topic, tenant_id) DO NOTHING

-- name: expire_inbox_dead
DELETE FROM {inbox_dead} WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {inbox_dead} WHERE dead_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))

-- The sent ledger: never at or above the lowest watermark.
-- name: expire_sent
DELETE FROM {sent} WHERE ctid = ANY (ARRAY(
    SELECT s.ctid FROM {sent} s, (SELECT min(position) AS position FROM {watermarks}) low
    WHERE s.sent_at < $1
      AND (s.source_position IS NULL OR low.position IS NULL OR s.source_position < low.position)
    LIMIT $2))

-- The inbox: never an entry whose dead letter still exists.
-- name: expire_inbox
DELETE FROM {inbox} WHERE ctid = ANY (ARRAY(
    SELECT i.ctid FROM {inbox} i WHERE i.processed_at < $1
      AND NOT EXISTS (SELECT 1 FROM {inbox_dead} d
                      WHERE d.message_id = i.message_id AND d.handler = i.handler AND d.tenant_id = i.tenant_id)
    LIMIT $2))

-- name: expire_inbox_attempts
DELETE FROM {inbox_attempts} WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {inbox_attempts} WHERE last_failed_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))
