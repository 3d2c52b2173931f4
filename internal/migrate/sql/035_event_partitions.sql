-- Event store: what an events table partitioned by position relies on. Partitioning is opt-in: this migration
-- changes nothing for a store that is not converted (the tables stay empty and nothing writes them);
-- eventstore.Partitions.Convert (`stagehand events partitions convert`) fills them and installs the trigger that
-- keeps them (its function is written out for the schema by the conversion, with qualified names, so it runs
-- without a search_path of its own).
--
-- PostgreSQL requires every unique index of a partitioned table to include the partition key, so the two unique
-- indexes of an unpartitioned events table cannot exist on a partitioned one. Their work moves to two compact,
-- unpartitioned tables kept by a row trigger of the partitioned table (BEFORE INSERT, in the appending
-- statement): every writer of the table goes through it, whichever statement it sends.

-- One row per stream: its current version. The optimistic-concurrency control of a partitioned store: each event
-- of version v moves the head from v-1 to v, or creates it when v is 1, and fails with a unique violation
-- otherwise. Two appends that read the same version serialise on this row exactly as they did on the unique index.
-- It is never partitioned nor archived, so a stream whose history is archived is still known (loads say so).
-- It also bounds where the stream's events are: every one lies between first_position and last_position, so a
-- stream read visits only the partitions in between (PostgreSQL prunes the others as the read runs), not one index
-- of every partition.
CREATE TABLE event_streams (
    tenant_id      text   NOT NULL,
    stream_id      text   NOT NULL,
    version        bigint NOT NULL CHECK (version >= 1),
    first_position bigint NOT NULL,
    last_position  bigint NOT NULL,
    PRIMARY KEY (tenant_id, stream_id)
) WITH (
    -- Every append updates its stream's row; room on the page keeps those updates HOT (nothing updated is indexed).
    fillfactor = 80
);

-- Every stored event ID and its position: the uniqueness of event IDs across partitions, and the lookup of an
-- event's position by its ID in one index (the Transactional save's staging statement does it) instead of one per
-- partition. Archiving a partition removes its IDs.
CREATE TABLE event_ids (
    event_id uuid   PRIMARY KEY,
    position bigint NOT NULL
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
