-- Checkpoints of log followers (projections, the Deferred stager, the reconciler, log subscribers): the global-log
-- position a follower has passed, advanced in the same transaction as the follower's own writes, plus the status
-- an operator reads (state, last error, the event being retried, a pending reset).
CREATE TABLE checkpoints (
    name             text        PRIMARY KEY CHECK (name <> ''),
    -- What kind of component follows the log ("projection", "stager", ...): status listings filter on it.
    kind             text        NOT NULL,
    -- Followers that are reset together (the partitions of one projection share a group).
    reset_group      text        NOT NULL,
    position         bigint      NOT NULL DEFAULT 0 CHECK (position >= 0),
    -- The log filter, as text, for operators.
    filter           text        NOT NULL DEFAULT '',
    -- running | stopped | failed. "running" is only true while the lease is held (see leases).
    state            text        NOT NULL DEFAULT 'stopped',
    last_error       text,
    last_error_at    timestamptz,
    -- The position whose handling is failing and how many attempts it has had (NULL / 0 when none).
    failing_position bigint,
    attempts         integer     NOT NULL DEFAULT 0,
    reset_requested  boolean     NOT NULL DEFAULT false,
    -- recorded_at of the last event handled, for time lag.
    last_event_at    timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX checkpoints_reset_group_idx ON checkpoints (reset_group);
