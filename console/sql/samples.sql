-- Statements of the console's sampler and charts (migration 048). Markers: {samples} the chart history, {outbox},
-- {sent}, {dead}, {inbox}, {inbox_dead}, {inbox_attempts} the tables counted.

-- What was recorded in [$1, $2), of tenant $4 when not NULL, counted per bucket of $3 (date_bin from the epoch) and
-- per topic (staged, published, dead-lettered) or per inbox handler (handled, dead-lettered, failing pairs by their
-- latest failure). Every count reads only the window's rows, through the tables' time indexes: the ledger and the
-- inbox through their BRIN indexes on sent_at and processed_at (a message staged in the window was sent after its
-- start), the dead letters through their indexes on dead_at (migrations 040, 011). The hot outbox table (messages
-- still to publish) and the inbox's failing pairs (failures only) hold no history and are read whole.
-- name: sample_window
WITH staged AS (
    SELECT date_bin($3::interval, t, 'epoch') AS b, topic AS name, count(*) AS n FROM (
        SELECT s.created_at AS t, s.topic FROM {sent} s
        WHERE s.sent_at >= $1 AND s.created_at >= $1 AND s.created_at < $2 AND ($4::text IS NULL OR s.tenant_id = $4)
        UNION ALL
        SELECT o.created_at, o.topic FROM {outbox} o
        WHERE o.created_at >= $1 AND o.created_at < $2 AND ($4::text IS NULL OR o.tenant_id = $4)
        UNION ALL
        SELECT d.created_at, d.topic FROM {dead} d
        WHERE d.dead_at >= $1 AND d.created_at >= $1 AND d.created_at < $2 AND ($4::text IS NULL OR d.tenant_id = $4)
    ) x GROUP BY 1, 2
), published AS (
    SELECT date_bin($3::interval, s.sent_at, 'epoch') AS b, s.topic AS name, count(*) AS n FROM {sent} s
    WHERE s.sent_at >= $1 AND s.sent_at < $2 AND s.outcome = 'sent' AND ($4::text IS NULL OR s.tenant_id = $4)
    GROUP BY 1, 2
), dead AS (
    SELECT date_bin($3::interval, d.dead_at, 'epoch') AS b, d.topic AS name, count(*) AS n FROM {dead} d
    WHERE d.dead_at >= $1 AND d.dead_at < $2 AND ($4::text IS NULL OR d.tenant_id = $4)
    GROUP BY 1, 2
), handled AS (
    SELECT date_bin($3::interval, i.processed_at, 'epoch') AS b, i.handler AS name, count(*) AS n FROM {inbox} i
    WHERE i.processed_at >= $1 AND i.processed_at < $2 AND i.outcome = 'handled'
      AND ($4::text IS NULL OR i.tenant_id = $4)
    GROUP BY 1, 2
), inbox_dead AS (
    SELECT date_bin($3::interval, d.dead_at, 'epoch') AS b, d.handler AS name, count(*) AS n FROM {inbox_dead} d
    WHERE d.dead_at >= $1 AND d.dead_at < $2 AND ($4::text IS NULL OR d.tenant_id = $4)
    GROUP BY 1, 2
), failed AS (
    SELECT date_bin($3::interval, a.last_failed_at, 'epoch') AS b, a.handler AS name, count(*) AS n
    FROM {inbox_attempts} a
    WHERE a.last_failed_at >= $1 AND a.last_failed_at < $2 AND ($4::text IS NULL OR a.tenant_id = $4)
    GROUP BY 1, 2
)
SELECT 'topic', b, name, coalesce(staged.n, 0), coalesce(published.n, 0), coalesce(dead.n, 0), 0::bigint, 0::bigint,
    0::bigint
FROM staged FULL JOIN published USING (b, name) FULL JOIN dead USING (b, name)
UNION ALL
SELECT 'handler', b, name, 0, 0, 0, coalesce(handled.n, 0), coalesce(inbox_dead.n, 0), coalesce(failed.n, 0)
FROM handled FULL JOIN inbox_dead USING (b, name) FULL JOIN failed USING (b, name)

-- One bucket's row ($1 scope, $2 kind, $3 name, $4 at, $5 seconds, then the figures); a bucket another console
-- wrote first is kept.
-- name: sample_insert
INSERT INTO {samples} (scope, kind, name, at, seconds, appended, staged, published, dead_lettered, handled,
    inbox_dead_lettered, inbox_failed, pending, oldest_pending_ms, dead_letters, inbox_dead_letters, projection_lag,
    worker_lag)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
ON CONFLICT (scope, kind, name, at) DO NOTHING

-- The end of the latest bucket written for scope $1, no earlier than $2 (NULL when none): where the sampler
-- resumes after a restart.
-- name: sample_last
SELECT max(at + seconds * interval '1 second') FROM {samples} WHERE scope = $1 AND kind = 'all' AND at >= $2

-- The buckets of scope $1 and kind $2 in [$3, $4), merged into buckets of $5 (date_bin from the epoch): counts
-- summed, backlogs the latest of the merged buckets. Through the index on (scope, kind, at).
-- name: sample_range
SELECT date_bin($5::interval, at, 'epoch') AS b, name, sum(seconds)::bigint,
    sum(appended)::bigint, sum(staged)::bigint, sum(published)::bigint, sum(dead_lettered)::bigint,
    sum(handled)::bigint, sum(inbox_dead_lettered)::bigint, sum(inbox_failed)::bigint,
    (array_agg(pending ORDER BY at DESC) FILTER (WHERE pending IS NOT NULL))[1],
    (array_agg(oldest_pending_ms ORDER BY at DESC) FILTER (WHERE oldest_pending_ms IS NOT NULL))[1],
    (array_agg(dead_letters ORDER BY at DESC) FILTER (WHERE dead_letters IS NOT NULL))[1],
    (array_agg(inbox_dead_letters ORDER BY at DESC) FILTER (WHERE inbox_dead_letters IS NOT NULL))[1],
    (array_agg(projection_lag ORDER BY at DESC) FILTER (WHERE projection_lag IS NOT NULL))[1],
    (array_agg(worker_lag ORDER BY at DESC) FILTER (WHERE worker_lag IS NOT NULL))[1]
FROM {samples}
WHERE scope = $1 AND kind = $2 AND at >= $3 AND at < $4
GROUP BY 1, 2
ORDER BY 1, 2

-- Retention: one batch of buckets (any scope) that began before $1, at most $2.
-- name: sample_expire
DELETE FROM {samples} WHERE ctid = ANY (ARRAY(SELECT ctid FROM {samples} WHERE at < $1 LIMIT $2))
