-- The inbox's failures by handler, for health checks (Admin.InboxFailures): the messages each handler keeps
-- failing on (inbox_attempts, not yet handled or dead-lettered) and its dead letters, with the time of the oldest
-- and latest failure and the latest error. Both tables hold failures only, so this reads no handled entry. $1 the
-- scope's tenant (NULL estate-wide).
-- name: inbox_failures
SELECT handler,
    count(*) FILTER (WHERE dead = 0),
    count(*) FILTER (WHERE dead = 1),
    coalesce(max(attempts) FILTER (WHERE dead = 0), 0),
    min(first_at) FILTER (WHERE dead = 0),
    max(last_at),
    (array_agg(last_error ORDER BY last_at DESC))[1]
FROM (
    SELECT handler, 0 AS dead, attempts, first_failed_at AS first_at, last_failed_at AS last_at, last_error
    FROM {inbox_attempts} WHERE $1::text IS NULL OR tenant_id = $1
    UNION ALL
    SELECT handler, 1, attempts, dead_at, dead_at, last_error
    FROM {inbox_dead} WHERE $1::text IS NULL OR tenant_id = $1
) f
GROUP BY handler
ORDER BY handler
