-- The partitions of the events table (migration 035) and their records in event_archives: converting the table,
-- creating partitions ahead, archiving old ones. {events}, {seq}, {streams}, {ids}, {archives}, {snapshots},
-- {checkpoints}, {watermarks}, {projection_parked}, {staging_parked} and {lifecycle} are the schema's tables and
-- sequence; {schema} is the schema. A partition, an index or an archive schema is an identifier marker too
-- ({partition}: schema-qualified), quoted by the code. Partition bounds ({from}, {to}, {bound}) are numbers the code
-- writes: DDL takes no parameters.

-- The archived positions [from, to), (0, 0) when nothing is archived.
-- name: archived_range
SELECT coalesce(min(from_position), 0), coalesce(max(to_position), 0) FROM {archives}

-- What the table is (relkind, NULL when there is none) and the last position drawn.
-- name: table_kind
SELECT (SELECT relkind::text FROM pg_class WHERE oid = to_regclass(@events_table)),
			(SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {seq})

-- name: list_attached
SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending,
			greatest(c.reltuples, 0)::bigint, pg_total_relation_size(c.oid)
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(@events_table)

-- name: list_archived
SELECT a.partition, a.from_position, a.to_position, a.events, a.state,
			coalesce(a.archive_schema, ''), a.archived_at,
			coalesce(pg_total_relation_size(to_regclass(format('%I.%I', coalesce(a.archive_schema, @schema), a.partition))), 0)
		FROM {archives} a ORDER BY a.from_position

-- The schema's partition lock, held by the session of an operation.
-- name: partition_lock
SELECT pg_advisory_lock(hashtextextended('stagehand.partitions:' || @schema, 0))

-- name: partition_unlock
SELECT pg_advisory_unlock(hashtextextended('stagehand.partitions:' || @schema, 0))

-- name: last_drawn
SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {seq}

-- Creating a partition: a plain table first, its indexes (a stream's events in version order; lookups by event ID,
-- resolving a lost commit), then ATTACH PARTITION, which takes only a SHARE UPDATE EXCLUSIVE lock on the events
-- table (appends go on; CREATE TABLE ... PARTITION OF would lock them out).
-- name: create_partition
CREATE TABLE {partition} (LIKE {events} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)

-- name: create_partition_stream_index
CREATE INDEX {stream_version_idx} ON {partition} (tenant_id, stream_id, version)

-- name: create_partition_event_id_index
CREATE INDEX {event_id_idx} ON {partition} (event_id)

-- name: attach_partition
ALTER TABLE {events} ATTACH PARTITION {partition} FOR VALUES FROM ({from}) TO ({to})

-- Archiving. The partition is recorded as detaching before its detach begins.
-- name: record_detaching
INSERT INTO {archives} (partition, from_position, to_position, events,
				state) VALUES (@partition, @from_position, @to_position, @events, 'detaching')
			ON CONFLICT (partition) DO UPDATE SET state = 'detaching', archived_at = now()

-- A DETACH CONCURRENTLY that was interrupted after its first transaction.
-- name: detach_finalize
ALTER TABLE {events} DETACH PARTITION {partition} FINALIZE

-- name: detach
ALTER TABLE {events} DETACH PARTITION {partition} CONCURRENTLY

-- name: count_partition
SELECT count(*) FROM {partition}

-- name: remove_partition_ids
DELETE FROM {ids} i USING {partition} d WHERE i.event_id = d.event_id

-- name: create_archive_schema
CREATE SCHEMA IF NOT EXISTS {archive_schema}

-- name: move_partition
ALTER TABLE {partition} SET SCHEMA {archive_schema}

-- name: drop_partition
DROP TABLE {partition}

-- name: record_archived
UPDATE {archives} SET state = @state, events = @events, archive_schema = @archive_schema
		WHERE partition = @partition

-- The checks before an archive: log followers, outbox watermarks, parked events, streams no snapshot covers.
-- name: followers_behind
SELECT name, kind, position, reset_requested FROM {checkpoints}
		WHERE position < @last OR reset_requested ORDER BY name

-- name: watermarks_behind
SELECT name, position FROM {watermarks} WHERE position < @last ORDER BY name

-- name: parked_in
SELECT (SELECT count(*) FROM {projection_parked}
			WHERE position >= @from_position AND position < @to_position),
		(SELECT count(*) FROM {staging_parked} WHERE position >= @from_position AND position < @to_position)

-- fragment: uncovered
FROM (SELECT tenant_id, stream_id, max(version) AS v FROM {partition}
			GROUP BY tenant_id, stream_id) e
		WHERE NOT EXISTS (SELECT 1 FROM {snapshots} s
			WHERE s.tenant_id = e.tenant_id AND s.stream_id = e.stream_id AND s.version > e.v)

-- name: count_uncovered
SELECT count(*) {uncovered}

-- name: uncovered_examples
SELECT coalesce(array_agg(x), '{}') FROM (SELECT format('%s (tenant %s)',
				e.stream_id, e.tenant_id) AS x {uncovered} LIMIT 3) ex

-- Converting. The recording trigger function of the events table while it is converted (still unpartitioned, its
-- unique indexes in force): BEFORE INSERT, for each row, it records the row's event ID and widens its stream's head
-- to the row's version and position. It enforces nothing.
-- name: track_function
CREATE OR REPLACE FUNCTION {schema}.events_track_append() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.event_ids (event_id, position) VALUES (NEW.event_id, NEW.position) ON CONFLICT DO NOTHING;
    INSERT INTO {schema}.event_streams AS h (tenant_id, stream_id, version, first_position, last_position)
        VALUES (NEW.tenant_id, NEW.stream_id, NEW.version, NEW.position, NEW.position)
        ON CONFLICT (tenant_id, stream_id) DO UPDATE SET version = greatest(h.version, EXCLUDED.version),
            first_position = least(h.first_position, EXCLUDED.first_position),
            last_position = greatest(h.last_position, EXCLUDED.last_position);
    RETURN NEW;
END
$$

-- The trigger function of the partitioned events table, BEFORE INSERT, for each row (in the appending statement,
-- before the row is stored; its position is drawn already): its event ID must be new, and its version must continue
-- its stream's head (1 creates the head; v moves it from v-1 to v, and the stream's last position to the row's). A
-- failure is a unique violation naming the constraint the unpartitioned table had (events_stream_version_key;
-- event_ids_pkey for an ID), so the store reports a concurrency conflict or a duplicate event ID as it always has,
-- and the statement stores nothing. Under READ COMMITTED the UPDATE of a head that a concurrent append holds waits
-- for it, then re-checks the version against the committed row: of two appends that read the same version, one
-- fails, exactly as on the unique index. A row trigger costs less than a statement trigger with a transition table
-- for the appends a store makes (one to a few rows). The names are qualified, so the function runs with no
-- search_path of its own.
-- name: check_function
CREATE OR REPLACE FUNCTION {schema}.events_check_append() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.version IS NULL THEN
        RETURN NEW; -- a failed version check: the column's NOT NULL constraint reports it
    END IF;
    INSERT INTO {schema}.event_ids (event_id, position) VALUES (NEW.event_id, NEW.position);
    IF NEW.version = 1 THEN
        INSERT INTO {schema}.event_streams (tenant_id, stream_id, version, first_position, last_position)
            VALUES (NEW.tenant_id, NEW.stream_id, 1, NEW.position, NEW.position) ON CONFLICT DO NOTHING;
    ELSE
        UPDATE {schema}.event_streams SET version = NEW.version, last_position = NEW.position
            WHERE tenant_id = NEW.tenant_id AND stream_id = NEW.stream_id AND version = NEW.version - 1;
    END IF;
    IF NOT FOUND THEN
        RAISE unique_violation USING
            MESSAGE = format('stream %L (tenant %L): version %s does not continue its head', NEW.stream_id,
                NEW.tenant_id, NEW.version),
            CONSTRAINT = 'events_stream_version_key', TABLE = 'events', SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    RETURN NEW;
END
$$

-- Whether the schema has migration 035's tables.
-- name: convert_migrated
SELECT to_regclass(@streams_table) IS NOT NULL

-- name: tracking
SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass(@events_table)
			AND tgname = 'events_track_append')

-- name: create_track_trigger
CREATE TRIGGER events_track_append BEFORE INSERT ON {events} FOR EACH ROW EXECUTE FUNCTION {schema}.events_track_append()

-- The heads of the rows that were there before the recording trigger.
-- name: copy_heads
INSERT INTO {streams} AS h (tenant_id, stream_id, version, first_position,
			last_position)
		SELECT tenant_id, stream_id, max(version), min(position), max(position) FROM {events}
		GROUP BY tenant_id, stream_id
		ON CONFLICT (tenant_id, stream_id) DO UPDATE SET version = greatest(h.version, EXCLUDED.version),
			first_position = least(h.first_position, EXCLUDED.first_position),
			last_position = greatest(h.last_position, EXCLUDED.last_position)

-- The heads of archived and deleted streams are closed, as the stream lifecycle closes them on a partitioned table.
-- name: close_archived_heads
UPDATE {streams} h SET closed = true FROM {lifecycle} l
		WHERE l.tenant_id = h.tenant_id AND l.stream_id = h.stream_id AND NOT h.closed

-- name: copy_ids
INSERT INTO {ids} (event_id, position) SELECT event_id, position FROM {events} ON CONFLICT DO NOTHING

-- name: bound_positions
ALTER TABLE {events} DROP CONSTRAINT IF EXISTS events_convert_bound, ADD CONSTRAINT events_convert_bound CHECK (position < {bound}) NOT VALID

-- name: validate_bound
ALTER TABLE {events} VALIDATE CONSTRAINT events_convert_bound

-- name: lock_events
LOCK TABLE {events} IN ACCESS EXCLUSIVE MODE

-- The swap, in one transaction, in this order. {first} is the first partition, schema-qualified.
-- name: swap_rename_table
ALTER TABLE {events} RENAME TO {first_name}

-- name: swap_rename_index
ALTER INDEX {schema}.events_pkey RENAME TO {first_pkey}

-- name: swap_drop_track_trigger
DROP TRIGGER events_track_append ON {first}

-- name: swap_create_table
CREATE TABLE {events} (LIKE {first} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
			PARTITION BY RANGE (position)

-- name: swap_drop_bound
ALTER TABLE {events} DROP CONSTRAINT events_convert_bound

-- name: swap_primary_key
ALTER TABLE {events} ADD CONSTRAINT events_pkey PRIMARY KEY (position)

-- The validated CHECK implies the partition's bound: no scan.
-- name: swap_attach_first
ALTER TABLE {events} ATTACH PARTITION {first} FOR VALUES FROM (MINVALUE) TO ({bound})

-- name: swap_drop_first_bound
ALTER TABLE {first} DROP CONSTRAINT events_convert_bound

-- The sequence belonged to the old table's column: dropping that table, once archived, must not drop it.
-- name: swap_sequence_owner
ALTER SEQUENCE {seq} OWNED BY {events}.position

-- name: swap_check_trigger
CREATE TRIGGER events_check_append BEFORE INSERT ON {events} FOR EACH ROW EXECUTE FUNCTION {schema}.events_check_append()
