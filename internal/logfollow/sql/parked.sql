-- The parked-event tables: projection_parked (owned by the projection's name, with the checkpoint that parked each
-- event) and staging_parked (owned by the worker's name). They are laid out alike but for their owner column:
-- {parked} is the table, {owner} its owner column, {checkpoint} the checkpoint column ('' for a table without one).

-- Parking an event in the transaction that moves the checkpoint past it; an event parked again adds its attempts
-- and replaces the last error.
-- name: park
INSERT INTO {parked} AS pk ({owner}, {checkpoint column}position, tenant_id, stream_id, stream_type, version, event_id,
    event_type, attempts, last_error)
VALUES (@owner::text, {checkpoint value}@position::bigint, @tenant_id::text, @stream_id::text, @stream_type::text,
    @version::bigint, @event_id::uuid, @event_type::text, @attempts::int, @last_error::text)
ON CONFLICT ({owner}, position) DO UPDATE SET attempts = pk.attempts + EXCLUDED.attempts,
    last_error = EXCLUDED.last_error, parked_at = now()

-- fragment: parked_columns
id, {owner}, {checkpoint}, position, tenant_id, stream_id, stream_type, version, event_id, event_type, attempts,
last_error, parked_at, replay_requested

-- An owner's parked events ('' for every owner's), by owner and position.
-- name: parked_list
SELECT {parked_columns} FROM {parked}
WHERE @owner::text = '' OR {owner} = @owner::text ORDER BY {owner}, position

-- A page of parked events in ID order (the earliest parked first), by the primary key.
-- name: parked_page
SELECT {parked_columns} FROM {parked}
WHERE (@owner::text = '' OR {owner} = @owner::text) AND (@tenants::text[] IS NULL OR tenant_id = ANY (@tenants))
    AND (@ids::bigint[] IS NULL OR id = ANY (@ids)) AND id > @after_id::bigint
ORDER BY id LIMIT @limit::int

-- How many events are parked per {group}: the owner, or the checkpoint.
-- name: parked_counts
SELECT {group}, count(*) FROM {parked} GROUP BY {group}

-- name: parked_discard
DELETE FROM {parked} WHERE id = @id::bigint

-- Marking an owner's parked events (all of them for an empty list) for the process running it to replay.
-- name: parked_request_replay
UPDATE {parked} SET replay_requested = true
WHERE {owner} = @owner::text AND (coalesce(cardinality(@ids::bigint[]), 0) = 0 OR id = ANY (@ids))

-- name: parked_locate
SELECT position, {owner} FROM {parked} WHERE id = @id::bigint

-- A failed replay: one more attempt, the new error, the request cleared.
-- name: parked_replay_failed
UPDATE {parked} SET attempts = attempts + 1, last_error = @last_error::text, replay_requested = false
WHERE id = @id::bigint

-- name: parked_requested
SELECT id FROM {parked} WHERE {owner} = @owner::text AND replay_requested ORDER BY position
