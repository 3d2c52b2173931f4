-- The stream lifecycle's tables (migration 050): stream_lifecycle, a row per archived or deleted stream, and
-- stream_archive, the events moved out of the events table. {lifecycle}, {stream_archive}, {events}, {streams} and
-- {snapshots} are the schema's tables.

-- The transaction-level advisory lock that serialises the lifecycle operations of one stream.
-- name: lifecycle_lock
SELECT pg_advisory_xact_lock(hashtextextended('stagehand.lifecycle:' || @schema || ':' || @tenant_id ||
	':' || @stream_id, 0))

-- fragment: lifecycle_columns
stream_type, state, version, first_position, last_position, marker_position, events,
	coalesce(archived_at, 'epoch'), coalesce(archived_by, ''), coalesce(deleted_at, 'epoch'),
	coalesce(deleted_by, ''), coalesce(reason, '')

-- name: read_lifecycle
SELECT {lifecycle_columns} FROM {lifecycle} WHERE tenant_id = @tenant_id AND stream_id = @stream_id

-- name: read_lifecycle_for_update
SELECT {lifecycle_columns} FROM {lifecycle} WHERE tenant_id = @tenant_id AND stream_id = @stream_id FOR UPDATE

-- Closes a stream's head (on a partitioned table, or one being converted): a closed head takes no appends.
-- name: close_head
UPDATE {streams} SET closed = true WHERE tenant_id = @tenant_id AND stream_id = @stream_id

-- name: record_archiving
INSERT INTO {lifecycle} (tenant_id, stream_id, stream_type, state, version,
				first_position, last_position, marker_position, archived_at, archived_by, reason)
			VALUES (@tenant_id, @stream_id, @stream_type, 'archiving', @version, 0, 0, @marker_position, now(), coalesce(@actor, session_user), @reason)
			RETURNING archived_at, archived_by

-- name: record_deleting
INSERT INTO {lifecycle} AS l (tenant_id, stream_id, stream_type, state,
				version, first_position, last_position, marker_position, deleted_at, deleted_by, reason)
			VALUES (@tenant_id, @stream_id, @stream_type, 'deleting', @version, 0, 0, @marker_position, now(), coalesce(@actor, session_user), @reason)
			ON CONFLICT (tenant_id, stream_id) DO UPDATE SET state = 'deleting', marker_position = EXCLUDED.marker_position,
				deleted_at = EXCLUDED.deleted_at, deleted_by = EXCLUDED.deleted_by, reason = EXCLUDED.reason,
				updated_at = now()
			RETURNING deleted_at, deleted_by

-- A marker at the stream's next version, after its last event. {last} is last_event or last_event_partitioned.
-- name: append_marker
INSERT INTO {events} (tenant_id, stream_id, stream_type, version, event_id, event_type,
			payload, event_version, metadata, occurred_at)
		SELECT @tenant_id, @stream_id, l.stream_type, l.version + 1, @marker_id, @marker_type, '{}', 1, '{}', now() FROM ({last}) l
		RETURNING position, version, stream_type

-- fragment: last_event
SELECT stream_type, version FROM {events} WHERE tenant_id = @tenant_id AND stream_id = @stream_id
		ORDER BY version DESC LIMIT 1

-- fragment: last_event_partitioned
SELECT e.stream_type, e.version FROM {events} e JOIN {streams} h
			ON h.tenant_id = e.tenant_id AND h.stream_id = e.stream_id AND h.last_position = e.position
			WHERE e.tenant_id = @tenant_id AND e.stream_id = @stream_id

-- name: clock
SELECT clock_timestamp()

-- The other sessions of the database whose transaction began before @since and holds a snapshot or a transaction ID.
-- name: older_transactions
SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid()
			AND datid = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND backend_type = 'client backend' AND xact_start < @since
			AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)

-- A deleted stream's archived events lose their payload and metadata.
-- name: erase_archived
UPDATE {stream_archive} SET payload = NULL, metadata = NULL
			WHERE tenant_id = @tenant_id AND stream_id = @stream_id

-- Moves a stream's events (not its markers) to stream_archive. {data} is payload_kept or payload_erased.
-- name: move_events
WITH moved AS (DELETE FROM {events}
			WHERE tenant_id = @tenant_id AND stream_id = @stream_id AND NOT starts_with(event_type, @marker_prefix)
			RETURNING position, tenant_id, stream_id, stream_type, version, event_id, event_type, event_version,
				payload, metadata, occurred_at, recorded_at)
		INSERT INTO {stream_archive} (position, tenant_id, stream_id, stream_type, version, event_id, event_type,
			event_version, payload, metadata, occurred_at, recorded_at)
		SELECT position, tenant_id, stream_id, stream_type, version, event_id, event_type, event_version, {data},
			occurred_at, recorded_at FROM moved

-- fragment: payload_kept
payload, metadata

-- fragment: payload_erased
NULL::jsonb, NULL::jsonb

-- name: record_moved
UPDATE {lifecycle} l SET state = @state, events = a.n,
			first_position = a.first, last_position = a.last, updated_at = now()
		FROM (SELECT count(*) AS n, coalesce(min(position), 0) AS first, coalesce(max(position), 0) AS last
			FROM {stream_archive} WHERE tenant_id = @tenant_id AND stream_id = @stream_id) a
		WHERE l.tenant_id = @tenant_id AND l.stream_id = @stream_id

-- An archived stream's events from a version on, the first @limit (NULL: all).
-- name: read_archive
SELECT position, stream_type, version, event_id, event_type, event_version, payload,
			metadata, occurred_at, recorded_at, payload IS NULL
		FROM {stream_archive} WHERE tenant_id = @tenant_id AND stream_id = @stream_id AND version >= @from_version ORDER BY version
		LIMIT @limit

-- The first and the last event's recording times, wherever they are (the events table while archiving, the
-- archive after).
-- name: moved_stream_times
SELECT
			coalesce((SELECT recorded_at FROM {events} WHERE tenant_id = @tenant_id AND stream_id = @stream_id AND version = 1),
				(SELECT recorded_at FROM {stream_archive} WHERE tenant_id = @tenant_id AND stream_id = @stream_id AND version = 1)),
			coalesce((SELECT recorded_at FROM {events} WHERE tenant_id = @tenant_id AND stream_id = @stream_id AND version = @version),
				(SELECT recorded_at FROM {stream_archive} WHERE tenant_id = @tenant_id AND stream_id = @stream_id AND version = @version))
