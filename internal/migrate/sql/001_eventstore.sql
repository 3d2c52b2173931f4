-- Event store: events and snapshots. A stream is the set of events sharing (tenant_id, stream_id).

-- Global positions come from this sequence, drawn by the INSERT itself (column DEFAULT). CACHE 1 is load-bearing:
-- the gap-safe log reader relies on a missing position having been drawn by a transaction that held a
-- RowExclusiveLock on events when the gap was seen. A cached range would let a session draw a low number long
-- after higher numbers committed.
CREATE SEQUENCE events_position_seq AS bigint CACHE 1;

CREATE TABLE events (
    position      bigint      NOT NULL DEFAULT nextval('events_position_seq') PRIMARY KEY,
    -- Never NULL: "no tenant" is the reserved value '__untenanted__'.
    tenant_id     text        NOT NULL CHECK (tenant_id <> ''),
    stream_id     text        NOT NULL,
    stream_type   text        NOT NULL,
    version       bigint      NOT NULL CHECK (version >= 1),
    event_id      uuid        NOT NULL,
    event_type    text        NOT NULL,
    -- Schema version of the payload, for upcasting on load.
    event_version integer     NOT NULL DEFAULT 1,
    payload       jsonb       NOT NULL,
    metadata      jsonb       NOT NULL DEFAULT '{}',
    occurred_at   timestamptz NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    -- The stream's identity includes its tenant. This unique index is the optimistic-concurrency control: two
    -- appends that read the same version cannot both insert the next one.
    CONSTRAINT events_stream_version_key UNIQUE (tenant_id, stream_id, version),
    CONSTRAINT events_event_id_key UNIQUE (event_id)
);

ALTER SEQUENCE events_position_seq OWNED BY events.position;

-- Latest snapshot per stream. The payload is opaque to the store.
CREATE TABLE snapshots (
    tenant_id      text        NOT NULL,
    stream_id      text        NOT NULL,
    stream_type    text        NOT NULL,
    version        bigint      NOT NULL,
    schema_version integer     NOT NULL,
    payload        bytea       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, stream_id)
);
