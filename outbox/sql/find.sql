-- Statements of the operator's lookups: dead letters grouped by cause (Admin.DeadLetterGroups,
-- InboxDeadLetterGroups) and a message found wherever it is (Admin.Find). Markers: {outbox}, {sent}, {dead},
-- {inbox}, {inbox_attempts}, {inbox_dead} are the tables' names. Every text a listing shows is cut (left(…)); no
-- payload or whole metadata is read.

-- The groups of the dead letters {dead_where} selects ($1 to $9), by error signature: each group's size, first and
-- last death, and the last error of its newest dead letter; the largest groups first, at most $10. The signature
-- index (migration 047) covers the grouping (signature, time, tenant and type): the planner reads it alone (an
-- index-only scan, the table being written rarely and so all-visible once vacuumed), never a dead letter's
-- payload; the sample is each group's last index entry.
-- name: dead_groups
SELECT g.error_signature, g.error_type, g.n, g.first_at, g.last_at,
    coalesce((SELECT left(last_error, 300) FROM {dead} WHERE {dead_where} AND error_signature = g.error_signature
              ORDER BY dead_at DESC LIMIT 1), '')
FROM (
    SELECT error_signature, min(error_type) AS error_type, count(*) AS n, min(dead_at) AS first_at,
        max(dead_at) AS last_at
    FROM {dead} WHERE {dead_where}
    GROUP BY error_signature
) g
ORDER BY g.n DESC, g.last_at DESC, g.error_signature
LIMIT $10

-- The same for the inbox dead letters {inbox_dead_where} selects.
-- name: inbox_dead_groups
SELECT g.error_signature, g.error_type, g.n, g.first_at, g.last_at,
    coalesce((SELECT left(last_error, 300) FROM {inbox_dead} WHERE {inbox_dead_where}
                AND error_signature = g.error_signature
              ORDER BY dead_at DESC LIMIT 1), '')
FROM (
    SELECT error_signature, min(error_type) AS error_type, count(*) AS n, min(dead_at) AS first_at,
        max(dead_at) AS last_at
    FROM {inbox_dead} WHERE {inbox_dead_where}
    GROUP BY error_signature
) g
ORDER BY g.n DESC, g.last_at DESC, g.error_signature
LIMIT $10

-- The messages (tenant, message ID) whose correlation ID, stream (the aggregate-id header) or partition key is $1
-- ({dead match}, {inbox match} and {outbox match} test it; queries.find writes out each variant), of tenant $2 when
-- not NULL, at most $4: the dead letters through their indexes (migration 047); the outbox table, which has no
-- index on the correlation ID or the stream (staging would pay for it), among its first $3 rows only; a key's
-- ordered messages through the key index ({outbox key}).
-- name: find_ids
SELECT tenant_id, message_id FROM (
    SELECT tenant_id, message_id FROM {dead}
    WHERE {dead match} AND ($2::text IS NULL OR tenant_id = $2)
    UNION
    SELECT tenant_id, message_id FROM {inbox_dead}
    WHERE {inbox match} AND ($2::text IS NULL OR tenant_id = $2)
    UNION
    SELECT tenant_id, message_id FROM (SELECT tenant_id, message_id, partition_key, correlation_id,
        metadata ->> 'aggregate-id' AS stream FROM {outbox} LIMIT $3) o
    WHERE {outbox match} AND ($2::text IS NULL OR tenant_id = $2){outbox key}
) f
ORDER BY tenant_id, message_id
LIMIT $4

-- Whether the outbox table holds more than $1 rows (a bounded count: what find_ids scans).
-- name: outbox_beyond
SELECT count(*) > $1 FROM (SELECT 1 FROM {outbox} LIMIT $1 + 1) o

-- Where the messages $1 (of tenant $2 when not NULL) are: the outbox (its state at $3), the dead letters and the
-- sent ledger, each through its key (message ID first).
-- name: find_messages
SELECT CASE WHEN o.next_attempt_at = 'infinity' THEN 'parked'
            WHEN o.lease_expires_at > $3 THEN 'in-flight'
            WHEN o.next_attempt_at > $3 AND o.attempts > 0 THEN 'backing-off'
            WHEN o.next_attempt_at > $3 THEN 'scheduled'
            ELSE 'pending' END,
    o.message_id, o.tenant_id, o.topic, o.message_type, left(o.partition_key, 300), left(o.correlation_id, 300),
    left(coalesce(o.metadata ->> 'aggregate-id', ''), 300), o.attempts, left(coalesce(o.last_error, ''), 1000),
    o.created_at, NULL::timestamptz,
    CASE WHEN o.next_attempt_at = 'infinity' THEN NULL ELSE o.next_attempt_at END, false,
    coalesce(o.source_position, 0), ''
FROM {outbox} o WHERE o.message_id = ANY ($1::text[]) AND ($2::text IS NULL OR o.tenant_id = $2)
UNION ALL
SELECT 'dead-lettered', d.message_id, d.tenant_id, d.topic, d.message_type, left(d.partition_key, 300),
    left(d.correlation_id, 300), left(coalesce(d.metadata ->> 'aggregate-id', ''), 300), d.attempts,
    left(d.last_error, 1000), d.created_at, d.dead_at, NULL::timestamptz, d.holds_key,
    coalesce(d.source_position, 0), d.error_signature
FROM {dead} d WHERE d.message_id = ANY ($1::text[]) AND ($2::text IS NULL OR d.tenant_id = $2)
UNION ALL
SELECT s.outcome, s.message_id, s.tenant_id, s.topic, s.message_type, '', '', '', s.attempts, '', s.created_at,
    s.sent_at, NULL::timestamptz, false, coalesce(s.source_position, 0), ''
FROM {sent} s WHERE s.message_id = ANY ($1::text[]) AND ($2::text IS NULL OR s.tenant_id = $2)

-- What the inbox knows of the messages $1 (of tenant $2 when not NULL), per handler: handled or dead-lettered
-- (inbox), failing (inbox_attempts), and each dead letter's topic, error and signature (inbox_dead_letters); each
-- through its key (message ID first).
-- name: find_inbox
SELECT i.message_id, i.tenant_id, i.handler, i.outcome, i.processed_at, 0, '', '', '', '', ''
FROM {inbox} i WHERE i.message_id = ANY ($1::text[]) AND ($2::text IS NULL OR i.tenant_id = $2)
UNION ALL
SELECT a.message_id, a.tenant_id, a.handler, 'failing', a.last_failed_at, a.attempts, left(a.last_error, 1000), '',
    '', '', ''
FROM {inbox_attempts} a WHERE a.message_id = ANY ($1::text[]) AND ($2::text IS NULL OR a.tenant_id = $2)
UNION ALL
SELECT d.message_id, d.tenant_id, d.handler, 'dead-letter', d.dead_at, d.attempts, left(d.last_error, 1000),
    d.error_signature, d.topic, d.message_type, left(coalesce(d.metadata ->> 'correlation-id', ''), 300)
FROM {inbox_dead} d WHERE d.message_id = ANY ($1::text[]) AND ($2::text IS NULL OR d.tenant_id = $2)
