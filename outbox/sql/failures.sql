-- Statements on the failure history (migration 047): each failed attempt of a message, the last few kept per
-- (message, target). Markers: {failures} is the table's name.

-- Record a failed attempt of message $2 of tenant $4 at target $3 (source $1: 'outbox', target the topic; 'inbox',
-- target the handler): its attempt number $5, error type $6, signature $7 and text $8, at $9, numbered after the
-- last one recorded; the entries that fall out of the last $10 are deleted. Through the table's key alone.
-- name: record_failure
WITH last AS (
    SELECT coalesce(max(n), 0) AS n FROM {failures}
    WHERE message_id = $2 AND source = $1 AND target = $3 AND tenant_id = $4
), dropped AS (
    DELETE FROM {failures} f USING last
    WHERE f.message_id = $2 AND f.source = $1 AND f.target = $3 AND f.tenant_id = $4 AND f.n <= last.n + 1 - $10::int
)
INSERT INTO {failures} (source, message_id, target, tenant_id, n, attempt, error_type, signature, error, failed_at)
SELECT $1, $2, $3, $4, last.n + 1, $5, $6, $7, $8, $9 FROM last
ON CONFLICT DO NOTHING

-- The recorded failures of the messages $1 (of tenant $2 when not NULL), newest first per (message, source,
-- target). Through the table's key (message ID first).
-- name: failures_of
SELECT source, message_id, tenant_id, target, n, attempt, error_type, signature, error, failed_at
FROM {failures}
WHERE message_id = ANY ($1::text[]) AND ($2::text IS NULL OR tenant_id = $2)
ORDER BY message_id, tenant_id, source, target, n DESC

-- Failures older than the cutoff $1, up to $2 (routine maintenance).
-- name: expire_failures
DELETE FROM {failures} WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {failures} WHERE failed_at < $1 LIMIT $2))
