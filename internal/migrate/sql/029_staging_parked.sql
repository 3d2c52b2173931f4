-- Events a staging worker (the Deferred stager, the reconciler) parked after mapping or staging them failed
-- MaxAttempts times (or once, for an event that cannot be read). Parking happens in the transaction that moves the
-- worker's checkpoint past the event, so an event is staged, parked, or still ahead: never silently skipped. An
-- operator lists, replays (the running worker stages it) or discards parked events.
CREATE TABLE staging_parked (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The worker's checkpoint name ("stager:NAME" or "reconciler:NAME").
    worker      text        NOT NULL,
    position    bigint      NOT NULL,
    tenant_id   text        NOT NULL,
    stream_id   text        NOT NULL,
    stream_type text        NOT NULL,
    version     bigint      NOT NULL,
    event_id    uuid        NOT NULL,
    event_type  text        NOT NULL,
    attempts    integer     NOT NULL,
    last_error  text        NOT NULL,
    parked_at   timestamptz NOT NULL DEFAULT now(),
    replay_requested boolean NOT NULL DEFAULT false,
    CONSTRAINT staging_parked_position_key UNIQUE (worker, position)
);
