-- The snapshots table (migration 001): one snapshot per stream, the latest. {snapshots} is the schema's table.

-- Stores a snapshot unless a newer one is stored. created_at is the writing transaction's start time, like the
-- events' recorded_at, so a snapshot is never older than the event it was taken at (Load relies on it to tell a
-- snapshot that describes another history).
-- name: save_snapshot
INSERT INTO {snapshots} AS sn
		(tenant_id, stream_id, stream_type, version, schema_version, payload)
		VALUES (@tenant_id, @stream_id, @stream_type, @version, @schema_version, @snapshot)
		ON CONFLICT (tenant_id, stream_id) DO UPDATE SET stream_type = EXCLUDED.stream_type,
			version = EXCLUDED.version, schema_version = EXCLUDED.schema_version, payload = EXCLUDED.payload,
			created_at = now()
		WHERE sn.version <= EXCLUDED.version

-- name: load_snapshot
SELECT stream_type, version, schema_version, payload, created_at
		FROM {snapshots} WHERE tenant_id = @tenant_id AND stream_id = @stream_id

-- name: delete_snapshot
DELETE FROM {snapshots} WHERE tenant_id = @tenant_id AND stream_id = @stream_id
