-- Cleanup: one batch of ledger entries older than the cutoff, never at or above the lowest watermark.
-- name: cleanup_sent
DELETE FROM {sent} WHERE ctid = ANY (ARRAY(
    SELECT s.ctid FROM {sent} s, (SELECT min(position) AS position FROM {watermarks}) low
    WHERE s.sent_at < $1 AND ($2::text IS NULL OR s.tenant_id = $2)
      AND (s.source_position IS NULL OR low.position IS NULL OR s.source_position < low.position)
    LIMIT $3))

-- The time of the last publication after $1 the ledger records (discards do not count), for progress probes: only
-- the newest entries are read (the sent_at index is a BRIN).
-- name: last_published
SELECT max(sent_at) FROM {sent} WHERE sent_at > $1 AND outcome = 'sent' AND ($2::text IS NULL OR tenant_id = $2)

-- The latest publications after $1 (of tenant $2 when not NULL), newest first, at most $3: when each message was
-- staged and published, for latency figures. Through the BRIN index on sent_at.
-- name: recently_published
SELECT s.message_id, s.tenant_id, s.topic, coalesce(s.source_position, 0), s.created_at, s.sent_at
FROM {sent} s
WHERE s.sent_at > $1 AND s.outcome = 'sent' AND ($2::text IS NULL OR s.tenant_id = $2)
ORDER BY s.sent_at DESC
LIMIT $3
