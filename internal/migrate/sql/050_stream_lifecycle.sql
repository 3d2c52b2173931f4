-- Event store: per-stream lifecycle (eventstore.PostgresStore.ArchiveStream and DeleteStream).
--
-- A stream is archived or deleted in two steps. The first commits the stream's row below and appends a marker event
-- to the stream itself (type "$stagehand.stream-archived" or "$stagehand.stream-deleted", empty payload): the marker
-- takes the stream's next version, so an append racing it loses on the stream's version as any concurrent append
-- does, and every append that starts later is refused by the row below. The second, once no transaction that began
-- before the first can still append, moves the stream's events out of the events table into stream_archive: whole
-- for an archived stream, without their payload and metadata (a tombstone) for a deleted one. Markers stay in the
-- events table: they are the stream's head and the log's record of the change.
--
-- The global log reads events and stream_archive together, so it stays gap-free: an archived stream's events are
-- still read at their positions (a projection rebuilt from the start sees them), a deleted stream's are passed
-- over without waiting.

-- One row per archived or deleted stream: its state, what was moved, and the audit of who did it, when and why
-- (never the events' data).
CREATE TABLE stream_lifecycle (
    tenant_id       text        NOT NULL,
    stream_id       text        NOT NULL,
    stream_type     text        NOT NULL,
    -- archiving and deleting: the first step committed, the events are not moved yet (running the operation again
    -- finishes it); archived and deleted: done.
    state           text        NOT NULL CHECK (state IN ('archiving', 'archived', 'deleting', 'deleted')),
    -- The stream's last event before its first marker, and the positions of its first and last events.
    version         bigint      NOT NULL,
    first_position  bigint      NOT NULL,
    last_position   bigint      NOT NULL,
    -- The position of the latest marker (the archive's, then the deletion's).
    marker_position bigint      NOT NULL,
    -- How many events were moved out of the events table (0 until the second step).
    events          bigint      NOT NULL DEFAULT 0,
    archived_at     timestamptz,
    archived_by     text,
    deleted_at      timestamptz,
    deleted_by      text,
    -- Why the stream was deleted (required for a deletion).
    reason          text,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, stream_id)
);

-- The events of archived and deleted streams, moved out of the events table at the positions they had. A deleted
-- stream's rows keep their identity (tenant, stream, version, position, event ID and type) and lose their payload
-- and metadata (NULL).
CREATE TABLE stream_archive (
    position      bigint      NOT NULL PRIMARY KEY,
    tenant_id     text        NOT NULL,
    stream_id     text        NOT NULL,
    stream_type   text        NOT NULL,
    version       bigint      NOT NULL,
    event_id      uuid        NOT NULL,
    event_type    text        NOT NULL,
    event_version integer     NOT NULL,
    payload       jsonb,
    metadata      jsonb,
    occurred_at   timestamptz NOT NULL,
    recorded_at   timestamptz NOT NULL,
    CONSTRAINT stream_archive_stream_version_key UNIQUE (tenant_id, stream_id, version)
);

-- On an events table partitioned by position (migration 035), appends read the stream's head instead of the table
-- above, so the guard costs them no extra relation lock: an archived or deleted stream's head is closed.
ALTER TABLE event_streams ADD COLUMN closed boolean NOT NULL DEFAULT false;
