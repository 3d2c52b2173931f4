-- Event store: what an events table partitioned by position relies on. Partitioning is opt-in: this migration
-- changes nothing for a store that is not converted (the tables stay empty, the functions unused, no trigger is
-- installed); eventstore.Partitions.Convert (`stagehand events partitions convert`) installs them.
--
-- PostgreSQL requires every unique index of a partitioned table to include the partition key, so the two unique
-- indexes of an unpartitioned events table cannot exist on a partitioned one. Their work moves to two compact,
-- unpartitioned tables kept by a statement-level trigger of the partitioned table, in the appending statement:
-- every writer of the table goes through it, whichever statement it sends.

-- One row per stream: its current version. The optimistic-concurrency control of a partitioned store: an append
-- of versions lo..hi moves the head from lo-1 to hi, or creates it when lo is 1, and fails with a unique violation
-- otherwise. Two appends that read the same version serialise on this row exactly as they did on the unique index.
-- It is never partitioned nor archived, so a stream whose history is archived is still known (loads say so).
CREATE TABLE event_streams (
    tenant_id text   NOT NULL,
    stream_id text   NOT NULL,
    version   bigint NOT NULL CHECK (version >= 1),
    PRIMARY KEY (tenant_id, stream_id)
) WITH (
    -- Every append updates its stream's row; room on the page keeps those updates HOT (version is not indexed).
    fillfactor = 80
);

-- Every stored event ID: the uniqueness of event IDs across partitions. Archiving a partition removes its IDs.
CREATE TABLE event_ids (
    event_id uuid PRIMARY KEY
);

-- Partitions detached from the events table: the positions they held, how many events, and where they went.
-- Stream reads and the log reader consult it only when events are missing, to return a typed error naming the
-- archived range instead of a history with a hole.
CREATE TABLE event_archives (
    partition      text        PRIMARY KEY,
    -- Positions from_position (inclusive) to to_position (exclusive).
    from_position  bigint      NOT NULL,
    to_position    bigint      NOT NULL CHECK (to_position > from_position),
    events         bigint      NOT NULL,
    -- detaching: recorded before the detach, which may still be in progress; then moved (to archive_schema),
    -- dropped, or detached (left in the store's schema as a plain table, for pg_dump).
    state          text        NOT NULL CHECK (state IN ('detaching', 'moved', 'dropped', 'detached')),
    archive_schema text,
    archived_at    timestamptz NOT NULL DEFAULT now()
);

-- The trigger of the events table while it is being converted (still unpartitioned, its unique indexes in force):
-- it records the heads and IDs of what is appended while the existing rows are copied in. It enforces nothing.
CREATE FUNCTION events_track_append() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO event_ids (event_id) SELECT event_id FROM new_events ON CONFLICT DO NOTHING;
    INSERT INTO event_streams (tenant_id, stream_id, version)
        SELECT tenant_id, stream_id, max(version) FROM new_events GROUP BY tenant_id, stream_id
        ON CONFLICT (tenant_id, stream_id) DO UPDATE SET version = greatest(event_streams.version, EXCLUDED.version);
    RETURN NULL;
END
$$;

-- The trigger of the partitioned events table, run once per appending statement after its rows are inserted
-- (AFTER ... FOR EACH STATEMENT with the inserted rows as new_events): event IDs must be new, and each stream's
-- versions must be consecutive and continue its head. A failure is a unique violation naming the constraint the
-- unpartitioned table had (events_stream_version_key, event_ids_pkey), so the store reports a concurrency conflict
-- or a duplicate event ID as it always has, and the statement inserts nothing.
CREATE FUNCTION events_check_append() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
    r record;
BEGIN
    INSERT INTO event_ids (event_id) SELECT event_id FROM new_events;
    FOR r IN SELECT tenant_id, stream_id, min(version) AS lo, max(version) AS hi, count(*) AS n
            FROM new_events GROUP BY tenant_id, stream_id LOOP
        IF r.n = r.hi - r.lo + 1 THEN
            IF r.lo = 1 THEN
                INSERT INTO event_streams (tenant_id, stream_id, version) VALUES (r.tenant_id, r.stream_id, r.hi)
                    ON CONFLICT DO NOTHING;
            ELSE
                -- Under READ COMMITTED a concurrent append of the same stream makes this wait for its end and
                -- then re-check the version against the committed row.
                UPDATE event_streams SET version = r.hi
                    WHERE tenant_id = r.tenant_id AND stream_id = r.stream_id AND version = r.lo - 1;
            END IF;
        END IF;
        IF r.n <> r.hi - r.lo + 1 OR NOT FOUND THEN
            RAISE unique_violation USING
                MESSAGE = format('stream %L (tenant %L): versions %s..%s do not continue its head', r.stream_id,
                    r.tenant_id, r.lo, r.hi),
                CONSTRAINT = 'events_stream_version_key', TABLE = 'events', SCHEMA = TG_TABLE_SCHEMA;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;
