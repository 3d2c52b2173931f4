-- Heartbeats of running processes (package internal/heartbeat): each relay, inbox handler, projection and staging
-- worker records, every few seconds, that it is alive and when it last did its work, so an operator sees every
-- process, including those that hold no lease (a relay without leader election) and those between batches.
-- One row per (kind, name, instance); updated in place (HOT: no indexed column changes), pruned when stale.
CREATE TABLE heartbeats (
    -- "relay", "inbox", "projection", "stager", "reconciler", ...
    kind             text        NOT NULL CHECK (kind <> ''),
    -- The component's name: a relay's election or topics, an inbox handler's name, a checkpoint's name.
    name             text        NOT NULL CHECK (name <> ''),
    -- The process: host name, process ID and a random suffix (a relay's or a lease holder's owner).
    instance         text        NOT NULL CHECK (instance <> ''),
    host             text        NOT NULL DEFAULT '',
    pid              integer     NOT NULL DEFAULT 0,
    started_at       timestamptz NOT NULL,
    -- Database time of the latest beat; a row whose beat is older than a few intervals is gone.
    heartbeat_at     timestamptz NOT NULL DEFAULT now(),
    -- How often it beats.
    interval_ms      integer     NOT NULL CHECK (interval_ms > 0),
    -- When it last published, handled or applied something (its process's clock), and how many since it started.
    last_activity_at timestamptz,
    activity         bigint      NOT NULL DEFAULT 0,
    -- Set when it stopped cleanly.
    stopped_at       timestamptz,
    PRIMARY KEY (kind, name, instance)
) WITH (fillfactor = 50);
