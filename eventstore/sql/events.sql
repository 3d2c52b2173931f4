-- The events table (migrations 001, 035) and, on a partitioned table, the stream heads of event_streams: appends,
-- stream and log reads. {events}, {streams}, {lifecycle}, {archives} and {stream_archive} are the schema's tables.

-- An append's base: the stream's current version, the one the new versions count from, as a scalar that is NULL
-- when the expected version does not hold (see PostgresStore.appendSQL). A NoStream append counts from 0.
-- fragment: base_no_stream
0::bigint

-- The stream's head on a partitioned table; a closed head (an archived or deleted stream) is none.
-- fragment: head
SELECT version FROM {streams} WHERE tenant_id = @tenant_id AND stream_id = @stream_id AND NOT closed

-- fragment: base_any_partitioned
(SELECT coalesce(({head}), 0))

-- fragment: base_exists_partitioned
({head})

-- fragment: base_exact_partitioned
({head} AND version = @expected)

-- fragment: base_any
(SELECT coalesce(max(version), 0) FROM {events} WHERE tenant_id = @tenant_id AND stream_id = @stream_id)

-- fragment: base_exists
(SELECT max(version) FROM {events} WHERE tenant_id = @tenant_id AND stream_id = @stream_id)

-- The expected version's own event: NULL when the stream is elsewhere, which fails the insert (a NULL version). One
-- index probe, planned as one node (an EXISTS would add a filter node to start per call).
-- fragment: base_exact
(SELECT v.version FROM {events} v WHERE v.tenant_id = @tenant_id AND v.stream_id = @stream_id AND v.version = @expected::bigint)

-- An archived or deleted stream takes no appends: its lifecycle row makes the base NULL, so the statement fails as a
-- failed version check does, and the store reports the stream's state (lifecycleConflict). One probe of a table that
-- holds only archived and deleted streams. On a partitioned table the closed head does it instead, and a NoStream
-- append fails on the head's row: no extra relation is read, so a save stays within the fast-path locks.
-- fragment: base_guarded
(CASE WHEN EXISTS (SELECT 1 FROM {lifecycle} WHERE tenant_id = @tenant_id AND stream_id = @stream_id) THEN NULL
		ELSE {unguarded} END)

-- fragment: insert_events
INSERT INTO {events} (tenant_id, stream_id, stream_type, version, event_id, event_type,
			payload, event_version, metadata, occurred_at)

-- An append of one event. {base} is one of the base fragments.
-- name: append_single
{insert_events}
		SELECT @tenant_id, @stream_id, @stream_type, {base} + 1, @event_id::uuid, @event_type::text, @payload::jsonb, @event_version::int, @metadata::jsonb, @occurred_at::timestamptz
		RETURNING position, version, recorded_at

-- An append of several events sharing type version, metadata and occurred-at: arrays of what differs.
-- name: append_uniform
{insert_events}
		SELECT @tenant_id, @stream_id, @stream_type, b.base + d.ord, d.event_id, d.event_type, d.payload, @event_version::int, @metadata::jsonb,
			@occurred_at::timestamptz
		FROM (SELECT {base} AS base) b, unnest(@event_ids::uuid[], @event_types::text[], @payloads::jsonb[])
			WITH ORDINALITY AS d(event_id, event_type, payload, ord)
		ORDER BY d.ord
		RETURNING position, version, recorded_at

-- An append of several events that differ in those too: arrays of every column.
-- name: append_mixed
{insert_events}
		SELECT @tenant_id, @stream_id, @stream_type, b.base + d.ord, d.event_id, d.event_type, d.payload, d.event_version, d.metadata,
			d.occurred_at
		FROM (SELECT {base} AS base) b,
			unnest(@event_ids::uuid[], @event_types::text[], @payloads::jsonb[], @event_versions::int[], @metadatas::jsonb[], @occurred_ats::timestamptz[])
			WITH ORDINALITY AS d(event_id, event_type, payload, event_version, metadata, occurred_at, ord)
		ORDER BY d.ord
		RETURNING position, version, recorded_at

-- A stream's current version (0 when it does not exist): its head on a partitioned table.
-- name: version_partitioned
SELECT coalesce((SELECT version FROM {streams} WHERE tenant_id = @tenant_id AND stream_id = @stream_id), 0)

-- A stream's current version (0 when it does not exist): its highest event on an unpartitioned table.
-- name: version
SELECT coalesce(max(version), 0) FROM {events} WHERE tenant_id = @tenant_id AND stream_id = @stream_id

-- A stream's type, version, last event type and first and last recording times.
-- name: stream_info
SELECT l.stream_type, l.version, l.event_type, f.recorded_at, l.recorded_at
		FROM (SELECT stream_type, version, event_type, recorded_at FROM {events}
			WHERE tenant_id = @tenant_id AND stream_id = @stream_id ORDER BY version DESC LIMIT 1) l,
		     (SELECT recorded_at FROM {events}
			WHERE tenant_id = @tenant_id AND stream_id = @stream_id ORDER BY version LIMIT 1) f

-- name: head_position
SELECT coalesce(max(position), 0) FROM {events}

-- Whether the table named @events_table is partitioned. It asks the catalog caches (not the statement's snapshot,
-- which a REPEATABLE READ transaction keeps from before a conversion), and is false for a table that does not exist:
-- it never fails.
-- fragment: partitioned
coalesce(pg_get_partkeydef(to_regclass(@events_table)) IS NOT NULL, false)

-- The table's layout: partitioned or not, and the end of the archived positions (0 when nothing is archived).
-- name: layout
SELECT {partitioned}, coalesce((SELECT max(to_position) FROM {archives}), 0)

-- The global log as readers see it: the events table and the events archived or deleted stream by stream
-- (stream_archive), which keep their positions there; gone is true for a deleted event's tombstone. PostgreSQL
-- flattens the union and merges the two tables' position indexes, so a page still walks positions in order and
-- stops at its limit.
-- fragment: log_source
(SELECT {log_columns}, false AS gone FROM {events} UNION ALL SELECT {log_columns}, payload IS NULL FROM {stream_archive})

-- fragment: log_columns
position, tenant_id, stream_id, stream_type, version, event_id, event_type, event_version, payload,
		metadata, occurred_at, recorded_at

-- A page of the log after a position.
-- name: read_log
SELECT true, gone, position, tenant_id, stream_id, stream_type, version,
				event_id, event_type, event_version, payload, metadata, occurred_at, recorded_at
			FROM {log_source} e WHERE position > @after ORDER BY position LIMIT @limit

-- fragment: log_match
(@event_types_in::text[] IS NULL OR event_type = ANY(@event_types_in)) AND (@stream_types_in::text[] IS NULL OR stream_type = ANY(@stream_types_in))
			AND (@tenants_in::text[] IS NULL OR tenant_id = ANY(@tenants_in))

-- A filtered page of the log: filtered-out rows still come back (position only), so gaps are judged on every
-- position and the payload of rows nobody asked for never crosses the wire.
-- name: read_log_filtered
SELECT m, gone, position, tenant_id, stream_id, stream_type, version,
				event_id, event_type, event_version, CASE WHEN m THEN payload END, CASE WHEN m THEN metadata END,
				occurred_at, recorded_at
			FROM (SELECT e.*, ({log_match}) AS m FROM {log_source} e WHERE position > @after
				ORDER BY position LIMIT @limit) p
			ORDER BY position

-- The pg_locks condition of the transactions that may still commit a missing position (see
-- PostgresStore.lockHolders). The table is named as text and resolved by each query.
-- fragment: holder_filter
l.locktype = 'relation' AND l.relation = @events_table::regclass AND l.mode = 'RowExclusiveLock'
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND NOT coalesce((SELECT a.state = 'idle in transaction (aborted)'
			OR (a.state = 'idle in transaction' AND a.backend_xid IS NULL)
		FROM pg_stat_activity a WHERE a.pid = l.pid), false)

-- name: lock_holders
SELECT pg_is_in_recovery(), coalesce((SELECT array_agg(DISTINCT l.virtualtransaction)
		FROM pg_locks l WHERE {holder_filter}), '{}'), coalesce((SELECT max(to_position) FROM {archives}), 0)

-- How many of the holders a reader waits for are still there.
-- name: holders_left
SELECT count(*) FROM pg_locks l WHERE {holder_filter}
			AND l.virtualtransaction = ANY(@holders)

-- name: in_recovery
SELECT pg_is_in_recovery()

-- A stream's events from a version on, the first @limit (NULL: all). {bounds} is empty on an unpartitioned table; on
-- a partitioned one the stream's head bounds the positions, so PostgreSQL visits only the partitions between its
-- first and its last event (it prunes the others as the statement runs, from the bounds' subqueries).
-- name: read_stream
SELECT position, stream_type, version, event_id, event_type, event_version, payload, metadata,
			occurred_at, recorded_at FROM {events}
		WHERE tenant_id = @tenant_id AND stream_id = @stream_id AND version >= @from_version {bounds} ORDER BY version LIMIT @limit

-- fragment: head_bounds
AND position >= (SELECT first_position FROM {streams} WHERE tenant_id = @tenant_id AND stream_id = @stream_id) AND position <= (SELECT last_position FROM {streams} WHERE tenant_id = @tenant_id AND stream_id = @stream_id)

-- A stream's current version (NULL when it does not exist) and whether the table is partitioned, in one statement:
-- its head on a partitioned table.
-- name: stream_head_partitioned
SELECT (SELECT version FROM {streams} WHERE tenant_id = @tenant_id AND stream_id = @stream_id), {partitioned}

-- The same on an unpartitioned table, which keeps no heads: its events answer, looked at only when there is no head.
-- name: stream_head
SELECT coalesce((SELECT version FROM {streams} WHERE tenant_id = @tenant_id AND stream_id = @stream_id), (SELECT max(version) FROM {events}
			WHERE tenant_id = @tenant_id AND stream_id = @stream_id)), {partitioned}

-- When the events at the given positions were recorded, wherever the log keeps them (archived and deleted streams'
-- events too: a tombstone keeps its recording time).
-- name: recorded_at
SELECT position, recorded_at FROM {log_source} e WHERE position = ANY (@positions)

-- The events a ReadLog with the same query returns over a range (LogQuery.passes): the log as readers see it, the
-- archived streams' events included, without tombstones, and without lifecycle markers except a deletion's
-- (@marker_type) when the query asks for deletions, which obeys the stream type and tenant filters only.
-- name: count_log
SELECT count(*) FROM {log_source} e WHERE position > @after AND position <= @through AND NOT gone
		AND CASE WHEN starts_with(event_type, @marker_prefix::text)
			THEN @deletions::bool AND event_type = @marker_type::text
				AND (@stream_types_in::text[] IS NULL OR stream_type = ANY(@stream_types_in))
				AND (@tenants_in::text[] IS NULL OR tenant_id = ANY(@tenants_in))
			ELSE {log_match} END

-- Lost commits (see commit.go): the server process of a connection, whether one still runs, and where the events
-- of a lost append are, if it committed.
-- name: backend_pid
SELECT pg_backend_pid()

-- name: backend_alive
SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = @pid)

-- name: count_events
SELECT count(*) FROM {events} WHERE event_id = ANY(@ids::uuid[])

-- name: first_version
SELECT min(version) FROM {events} WHERE event_id = ANY(@ids::uuid[])
