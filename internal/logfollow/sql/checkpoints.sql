-- The checkpoints table (migration 021): one row per log follower, its position in the global log, its
-- state and its last error for status readers, and the reset requests of its reset group. {checkpoints} is the
-- schema's table, {leases} the leases table the fence reads.

-- The fence: one row, the lease row locked FOR SHARE until the transaction ends, only while the follower's lease
-- is still its own (see lease.CheckTx).
-- fragment: fence
fence AS (SELECT 1 FROM {leases} WHERE name = @fence_name::text AND owner = @fence_owner::text
          AND token = @fence_token::bigint FOR SHARE)

-- Moving the checkpoint from @from to @position, fenced, in the transaction that applied the events between:
-- nothing is written unless the lease is still the follower's and the checkpoint still where it read it. It
-- returns whether a reset was requested meanwhile.
-- name: advance
WITH {fence}
UPDATE {checkpoints} c SET position = @position::bigint,
    last_event_at = coalesce(@last_event_at::timestamptz, last_event_at),
    failing_position = CASE WHEN failing_position <= @position THEN NULL ELSE failing_position END,
    attempts = CASE WHEN failing_position <= @position THEN 0 ELSE attempts END,
    state = 'running', updated_at = now()
FROM fence WHERE c.name = @name::text AND c.position = @from::bigint
RETURNING c.reset_requested

-- Recording the failing position and its error for status readers (best effort, not fenced: no position moves).
-- name: note_error
UPDATE {checkpoints} SET last_error = @error::text, last_error_at = now(), failing_position = @failing_position::bigint,
    attempts = @attempts::int, updated_at = now()
WHERE name = @name::text

-- Recording why the follower stopped: failed (with its error) or stopped (a NULL error keeps the last one).
-- name: set_state
UPDATE {checkpoints} SET state = @state::text, last_error = coalesce(@last_error::text, last_error),
    last_error_at = CASE WHEN @last_error::text IS NULL THEN last_error_at ELSE now() END, updated_at = now()
WHERE name = @name::text

-- Creating or updating the checkpoint as the follower starts, and reading it.
-- name: start
INSERT INTO {checkpoints} AS c (name, kind, reset_group, filter, state)
VALUES (@name::text, @kind::text, @reset_group::text, @filter::text, 'running')
ON CONFLICT (name) DO UPDATE SET kind = EXCLUDED.kind, reset_group = EXCLUDED.reset_group,
    filter = EXCLUDED.filter, state = 'running', updated_at = now()
RETURNING position, reset_requested

-- name: load
SELECT position, reset_requested FROM {checkpoints} WHERE name = @name::text

-- The follower's position, 0 before it ever ran.
-- name: position
SELECT coalesce((SELECT position FROM {checkpoints} WHERE name = @name::text), 0)

-- Locking a reset group's checkpoints (in name order, so two members cannot deadlock) and reading whether a reset
-- was requested.
-- name: lock_reset_group
SELECT coalesce(bool_or(reset_requested), false)
FROM (SELECT reset_requested FROM {checkpoints} WHERE reset_group = @reset_group::text ORDER BY name FOR UPDATE) g

-- Performing a requested reset: every checkpoint of the group goes back to where the request said.
-- name: reset_group
UPDATE {checkpoints} SET position = reset_position, reset_position = 0, reset_requested = false,
    failing_position = NULL, attempts = 0, last_event_at = NULL, updated_at = now()
WHERE reset_group = @reset_group::text

-- Asking a reset group to start again after a position.
-- name: request_reset
UPDATE {checkpoints} SET reset_requested = true, reset_position = @position::bigint, updated_at = now()
WHERE reset_group = @reset_group::text

-- The checkpoints of a kind ('' for all), by name, for status listings.
-- name: list
SELECT c.name, c.kind, c.reset_group, c.filter, c.position, c.state, coalesce(c.last_error, ''), c.last_error_at,
    coalesce(c.failing_position, 0), c.attempts, c.reset_requested, c.last_event_at, c.updated_at
FROM {checkpoints} c
WHERE @kind::text = '' OR c.kind = @kind::text ORDER BY c.name

-- The positions of a reset group's followers of a kind, for lag gauges.
-- name: positions
SELECT name, position FROM {checkpoints} WHERE reset_group = @reset_group::text AND kind = @kind::text
