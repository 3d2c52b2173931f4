-- The console's record of operator actions (package console): who did what, when, in which scope, and with what
-- result. A row is written when an action starts and completed when it ends, so an action whose process died
-- midway is still on record (finished_at NULL). Owned by package console.
CREATE TABLE console_audit (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The user the console's authorization named.
    username    text        NOT NULL,
    -- The console's scope: every tenant, or the tenant below. "No tenant" is the reserved value '__untenanted__',
    -- never the empty string, so an estate-wide console and a console of untenanted data are never confused.
    scope       text        NOT NULL CHECK (scope IN ('all-tenants', 'tenant')),
    tenant_id   text        NOT NULL DEFAULT '' CHECK ((scope = 'tenant') = (tenant_id <> '')),
    -- What was done ("outbox.redrive", "projection.rebuild", ...) and to what (a filter, a selection, a name).
    action      text        NOT NULL,
    target      text        NOT NULL,
    -- How many items the operator confirmed, and how many the action affected.
    confirmed   bigint,
    affected    bigint,
    -- The error that ended it, '' when it succeeded.
    error       text        NOT NULL DEFAULT '',
    -- Where the request came from (the console's view of the client address).
    remote_addr text        NOT NULL DEFAULT '',
    -- Figures the console keeps about the action (the head of the log when a rebuild was requested, say).
    details     jsonb       NOT NULL DEFAULT '{}',
    started_at  timestamptz NOT NULL,
    finished_at timestamptz
);

-- The console shows a scope's own entries, newest first.
CREATE INDEX console_audit_scope_idx ON console_audit (scope, tenant_id, id);

-- The latest action on a target (the rebuild of a projection, whose progress the console follows).
CREATE INDEX console_audit_target_idx ON console_audit (action, target, id);
