-- Leases: the one lease/leader mechanism, shared by projections, the Deferred stager, the reconciler and the relay.
--
-- A lease is held by owner until expires_at (database clock). Taking a free or expired lease increments token, the
-- fencing token: it never decreases and is never reused for a name, so a writer that checks its token inside its
-- own transaction (row locked FOR SHARE) cannot commit after another holder took over.
CREATE TABLE leases (
    name        text        PRIMARY KEY CHECK (name <> ''),
    owner       text        NOT NULL,
    token       bigint      NOT NULL CHECK (token >= 1),
    expires_at  timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    renewed_at  timestamptz NOT NULL DEFAULT now()
);
