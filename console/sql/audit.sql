-- Statements on the console's audit table (migration 041). Marker: {audit} is the table's name.

-- An action starts: its row, before anything is done. $1 user, $2 scope, $3 tenant, $4 action, $5 target,
-- $6 confirmed count, $7 client address, $8 details, $9 the time.
-- name: audit_begin
INSERT INTO {audit} (username, scope, tenant_id, action, target, confirmed, remote_addr, details, started_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
RETURNING id

-- An action ends: $2 affected, $3 the error ('' when none), $4 details to merge, $5 the time.
-- name: audit_finish
UPDATE {audit} SET affected = $2, error = $3, details = details || $4::jsonb, finished_at = $5 WHERE id = $1

-- The columns of an entry, as read back.
-- fragment: audit_columns
id, username, scope, tenant_id, action, target, confirmed, affected, error, remote_addr, details, started_at,
    finished_at

-- A page of entries, newest first, before id $2, at most $3: a tenant's ($1) own, or every entry when $1 is NULL.
-- name: audit_list
SELECT {audit_columns} FROM {audit}
WHERE ($1::text IS NULL OR (scope = 'tenant' AND tenant_id = $1)) AND id < $2
ORDER BY id DESC
LIMIT $3

-- One entry, in the scope $2 as audit_list reads it.
-- name: audit_get
SELECT {audit_columns} FROM {audit}
WHERE id = $1 AND ($2::text IS NULL OR (scope = 'tenant' AND tenant_id = $2))

-- The latest entry of an action on a target ($1, $2), in the scope $3 as audit_list reads it.
-- name: audit_latest
SELECT {audit_columns} FROM {audit}
WHERE action = $1 AND target = $2 AND ($3::text IS NULL OR (scope = 'tenant' AND tenant_id = $3))
ORDER BY id DESC
LIMIT 1
