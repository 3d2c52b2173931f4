-- The leases table (migration 012): one row per lease name, with its holder, its fencing token and its expiry on
-- the database clock. {leases} is the schema's table.

-- Taking a lease that is free, expired or released: the token goes up by one, so a later holder's writes fence out
-- an earlier one's. No row comes back when someone else holds it.
-- name: acquire
INSERT INTO {leases} AS l (name, owner, token, expires_at)
VALUES (@name::text, @owner::text, 1, now() + @ttl_us::bigint * interval '1 microsecond')
ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, token = l.token + 1,
    expires_at = EXCLUDED.expires_at, acquired_at = now(), renewed_at = now()
WHERE l.expires_at <= now()
RETURNING token, expires_at

-- Renewing a held lease by its TTL from now; no row when it changed hands or was released.
-- name: renew
UPDATE {leases} SET expires_at = now() + @ttl_us::bigint * interval '1 microsecond', renewed_at = now()
WHERE name = @name::text AND owner = @owner::text AND token = @token::bigint
RETURNING expires_at

-- Releasing a held lease at once; the token stays, so the next holder gets token + 1.
-- name: release
UPDATE {leases} SET expires_at = now()
WHERE name = @name::text AND owner = @owner::text AND token = @token::bigint

-- The fence check: the lease's holder now, its row locked FOR SHARE until the transaction ends.
-- name: check
SELECT token, owner FROM {leases} WHERE name = @name::text FOR SHARE

-- Whether this session can fence: the table exists, the role can lock its rows, the session can write.
-- name: fenceable
SELECT t IS NOT NULL,
       t IS NOT NULL AND has_table_privilege(t, 'SELECT') AND has_table_privilege(t, 'UPDATE'),
       pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'
FROM (SELECT to_regclass(@table::text) AS t) x

-- The leases whose names start with a prefix, by name.
-- name: list
SELECT name, owner, token, expires_at, acquired_at, renewed_at, expires_at > now()
FROM {leases} WHERE starts_with(name, @prefix::text) ORDER BY name
