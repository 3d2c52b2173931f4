-- Events a projection parked after its handler failed on them MaxAttempts times. Parking happens in the same
-- transaction that moves the checkpoint past the event, so an event is either handled, parked, or still ahead of
-- the checkpoint: never silently skipped.
CREATE TABLE projection_parked (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    projection  text        NOT NULL,
    -- The checkpoint (partition) that parked it.
    checkpoint  text        NOT NULL,
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
    -- Set by an operator (RequestReplay); a process running the projection replays the event and deletes the row.
    replay_requested boolean NOT NULL DEFAULT false,
    CONSTRAINT projection_parked_position_key UNIQUE (projection, position)
);
