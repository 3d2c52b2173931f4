package eventstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// readStream reads a stream's events from fromVersion on through db (the pool, or a caller's transaction): all of
// them, or the first limit when limit > 0. Every statement it runs goes through db.
func (s *PostgresStore) readStream(ctx context.Context, db dbtx, tenant, streamID string, fromVersion int64,
	limit int) ([]Record, error) {
	lay, err := s.layout(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("eventstore: read stream %q: %w", streamID, err)
	}
	return s.readStreamAs(ctx, db, lay.partitioned, tenantOrDefault(tenant), streamID, fromVersion, limit, true)
}

// readStreamAs is readStream with the statement of the given layout. When it reads no events it asks the stream's
// head and the table's actual layout in one statement (streamHead); when the layout it read with was not the
// table's, it records the actual one, and reads again (once, when again is set) if the statement it used could
// have missed events.
func (s *PostgresStore) readStreamAs(ctx context.Context, db dbtx, partitioned bool, tenant, streamID string,
	fromVersion int64, limit int, again bool) ([]Record, error) {
	var lim *int // NULL: no limit
	if limit > 0 {
		lim = &limit
	}
	q := s.q.readStream[b2i(partitioned)]
	rows, err := db.Query(ctx, q.SQL, q.Args(&param{Tenant: tenant, StreamID: streamID, FromVersion: fromVersion,
		Limit: lim})...)
	if err != nil {
		return nil, fmt.Errorf("eventstore: read stream %q: %w", streamID, err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		r := Record{Tenant: tenant, StreamID: streamID}
		var meta []byte
		if err := rows.Scan(&r.Position, &r.StreamType, &r.Version, &r.EventID, &r.Type, &r.TypeVersion, &r.Payload,
			&meta, &r.OccurredAt, &r.RecordedAt); err != nil {
			return nil, fmt.Errorf("eventstore: read stream %q: %w", streamID, err)
		}
		if err := finishRecord(&r, meta); err != nil {
			return nil, err // a *RecordError, naming the stream, version and position
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("eventstore: read stream %q: %w", streamID, err)
	}
	if n := len(out); n > 0 && IsLifecycleMarker(out[n-1].Type) {
		// Archived or deleted (see LifecycleStore): markers are never returned.
		return s.readMoved(ctx, db, tenant, streamID, fromVersion, limit, out)
	}
	first := max(fromVersion, 1)
	if len(out) > 0 && out[0].Version > first {
		// Versions first..out[0].Version-1 are not stored: archived (or removed by hand, when nothing is).
		return s.archivedStream(ctx, db, tenant, streamID, first, out[0].Version-1, out)
	}
	if len(out) > 0 {
		return out, nil
	}
	head, actual, err := s.streamHead(ctx, db, partitioned, tenant, streamID)
	if err != nil {
		return nil, fmt.Errorf("eventstore: read stream %q: %w", streamID, err)
	}
	if actual != partitioned {
		// Converted (or dropped and migrated again) since this store last read the layout.
		s.learnPartitioned(actual)
		if partitioned && again {
			// The read was bounded by a stream head an unpartitioned table does not keep.
			return s.readStreamAs(ctx, db, actual, tenant, streamID, fromVersion, limit, false)
		}
	}
	switch {
	case head == nil:
		return nil, fmt.Errorf("%w: %q (tenant %q)", ErrStreamNotFound, streamID, tenant)
	case actual && *head >= first:
		// The stream's head outlives its archived events.
		return s.archivedStream(ctx, db, tenant, streamID, first, *head, out)
	}
	return out, nil // the stream ends before fromVersion
}

// streamHead returns, in one statement on db, a stream's current version (nil when the stream does not exist) and
// whether the events table is partitioned (sql/events.sql, the fragment partitioned: this statement, unlike the
// cached layout, is never stale). It is right whatever the table's layout, so a table converted since the store last
// read the layout cannot make an archived stream look absent. partitioned is the layout the store knows: on a partitioned table the
// stream's head in event_streams answers (one probe); an unpartitioned table does not keep heads, and its events
// answer (one probe of the stream's index), looked at only when there is no head, so a stale layout costs a scan
// of every partition's index only once (the layout is then recorded).
func (s *PostgresStore) streamHead(ctx context.Context, db dbtx, partitioned bool, tenant, streamID string) (
	*int64, bool, error) {
	var version *int64
	var actual bool
	q := s.q.streamHead[b2i(partitioned)]
	err := db.QueryRow(ctx, q.SQL, q.Args(&param{EventsTable: s.t.events, Tenant: tenant, StreamID: streamID})...).
		Scan(&version, &actual)
	return version, actual, err
}

// archivedStream is the outcome of a stream read that found versions from..to missing: an *ArchivedError when
// partitions were archived; otherwise (rows removed by hand from an unarchived store) the records as read.
func (s *PostgresStore) archivedStream(ctx context.Context, db dbtx, tenant, streamID string, from, to int64,
	read []Record) ([]Record, error) {
	af, at, err := s.archivedRange(ctx, db)
	if err != nil {
		return nil, err
	}
	if at == 0 {
		return read, nil
	}
	return nil, &ArchivedError{Tenant: tenant, StreamID: streamID, FromVersion: from, ToVersion: to,
		ArchivedFrom: af, ArchivedTo: at}
}

// ReadStreamTx implements TransactionalStore.
func (s *PostgresStore) ReadStreamTx(ctx context.Context, tx pgx.Tx, tenant, streamID string, fromVersion int64) (
	[]Record, error) {
	if tx == nil {
		return nil, fmt.Errorf("eventstore: read stream %q: nil transaction", streamID)
	}
	return s.readStream(ctx, tx, tenant, streamID, fromVersion, 0)
}

// ReadStreamPage is ReadStream bounded: at most limit events (100 when limit is not positive) from fromVersion on,
// in version order, so a stream of any length is read a page at a time. A stream that does not exist returns
// ErrStreamNotFound; one that ends before fromVersion returns no events.
func (s *PostgresStore) ReadStreamPage(ctx context.Context, tenant, streamID string, fromVersion int64,
	limit int) ([]Record, error) {
	if limit <= 0 {
		limit = 100
	}
	return poolRead(ctx, func() ([]Record, error) {
		return s.readStream(ctx, s.pool, tenant, streamID, fromVersion, limit)
	})
}

// RecordedAt returns when the events at the given log positions were recorded (their appending transaction's
// start, by the database's clock), by position, archived and deleted streams' events included; a position that
// holds no event is absent. Each position is one probe of the log's position indexes.
func (s *PostgresStore) RecordedAt(ctx context.Context, positions []int64) (map[int64]time.Time, error) {
	return poolRead(ctx, func() (map[int64]time.Time, error) { return s.recordedAt(ctx, positions) })
}

func (s *PostgresStore) recordedAt(ctx context.Context, positions []int64) (map[int64]time.Time, error) {
	out := make(map[int64]time.Time, len(positions))
	if len(positions) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, s.q.recordedAt.SQL, s.q.recordedAt.Args(&param{Positions: positions})...)
	if err != nil {
		return nil, fmt.Errorf("eventstore: recorded-at of %d positions: %w", len(positions), err)
	}
	var (
		p  int64
		at time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&p, &at}, func() error {
		out[p] = at.UTC()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("eventstore: recorded-at of %d positions: %w", len(positions), err)
	}
	return out, nil
}

// CountLog counts the events of the log after q.After and at or before through that a ReadLog with q returns
// (q.Limit does not matter): its filters apply, archived streams' events count, tombstones and lifecycle markers do
// not (a deletion's marker does when q.Deletions is set). It walks the log's position indexes over that range.
// Unlike ReadLog it does not wait for in-flight appends: near the head, an event that commits later with a lower
// position is not counted. It is meant for rates and progress figures, never for following the log.
func (s *PostgresStore) CountLog(ctx context.Context, q LogQuery, through int64) (int64, error) {
	if err := checkQuery(&q); err != nil {
		return 0, err
	}
	return poolRead(ctx, func() (int64, error) {
		var n int64
		c := s.q.countLog
		err := s.pool.QueryRow(ctx, c.SQL, c.Args(&param{After: q.After, Through: through,
			TypesIn: nilIfEmpty(q.EventTypes), StreamsIn: nilIfEmpty(q.StreamTypes),
			TenantsIn: nilIfEmpty(q.Tenants), Deletions: q.Deletions, MarkerPrefix: LifecycleTypePrefix,
			MarkerType: StreamDeletedType})...).Scan(&n)
		if err != nil {
			return 0, fmt.Errorf("eventstore: count the log from %d to %d: %w", q.After, through, err)
		}
		return n, nil
	})
}

// SaveSnapshot implements Store. It writes through the pool, so call it only for a version that has committed:
// a snapshot of an uncommitted version would describe a state the stream may never reach (use SaveSnapshotTx on the
// appending transaction instead).
func (s *PostgresStore) SaveSnapshot(ctx context.Context, snap Snapshot) error {
	snap.Tenant = tenantOrDefault(snap.Tenant)
	q := s.q.saveSnapshot // a newer snapshot stored is kept (sql/snapshots.sql)
	_, err := s.pool.Exec(ctx, q.SQL, q.Args(snapshotParam(snap))...)
	if err != nil {
		return fmt.Errorf("eventstore: save snapshot of stream %q: %w", snap.StreamID, err)
	}
	return nil
}

// SaveSnapshotTx implements TransactionalStore. The savepoint, the upsert and its release go in one round trip.
func (s *PostgresStore) SaveSnapshotTx(ctx context.Context, tx pgx.Tx, snap Snapshot) error {
	if tx == nil {
		return fmt.Errorf("eventstore: save snapshot of stream %q: nil transaction", snap.StreamID)
	}
	snap.Tenant = tenantOrDefault(snap.Tenant)
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT stagehand_snapshot")
	b.Queue(s.q.saveSnapshot.SQL, s.q.saveSnapshot.Args(snapshotParam(snap))...)
	b.Queue("RELEASE SAVEPOINT stagehand_snapshot")
	err := tx.SendBatch(ctx, b).Close()
	if err != nil {
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT stagehand_snapshot"); rerr != nil {
			err = fmt.Errorf("%w (and rolling back to the savepoint failed: %w)", err, rerr)
		}
		return fmt.Errorf("eventstore: save snapshot of stream %q: %w", snap.StreamID, err)
	}
	return nil
}

// snapshotParam is the parameters of a snapshot's save.
func snapshotParam(snap Snapshot) *param {
	return &param{Tenant: snap.Tenant, StreamID: snap.StreamID, StreamType: snap.StreamType, Version: snap.Version,
		SchemaVersion: snap.SchemaVersion, Snapshot: snap.Payload}
}

func (s *PostgresStore) loadSnapshot(ctx context.Context, db dbtx, tenant, streamID string) (Snapshot, error) {
	snap := Snapshot{Tenant: tenantOrDefault(tenant), StreamID: streamID}
	q := s.q.loadSnapshot
	err := db.QueryRow(ctx, q.SQL, q.Args(&param{Tenant: snap.Tenant, StreamID: streamID})...).
		Scan(&snap.StreamType, &snap.Version, &snap.SchemaVersion, &snap.Payload, &snap.CreatedAt)
	snap.CreatedAt = snap.CreatedAt.UTC()
	if errors.Is(err, pgx.ErrNoRows) {
		return snap, ErrSnapshotNotFound
	}
	if err != nil {
		return snap, fmt.Errorf("eventstore: load snapshot of stream %q: %w", streamID, err)
	}
	return snap, nil
}

// LoadSnapshot implements Store.
func (s *PostgresStore) LoadSnapshot(ctx context.Context, tenant, streamID string) (Snapshot, error) {
	return poolRead(ctx, func() (Snapshot, error) { return s.loadSnapshot(ctx, s.pool, tenant, streamID) })
}

// LoadSnapshotTx implements TransactionalStore.
func (s *PostgresStore) LoadSnapshotTx(ctx context.Context, tx pgx.Tx, tenant, streamID string) (Snapshot, error) {
	if tx == nil {
		return Snapshot{}, fmt.Errorf("eventstore: load snapshot of stream %q: nil transaction", streamID)
	}
	return s.loadSnapshot(ctx, tx, tenant, streamID)
}

// DeleteSnapshot implements Store.
func (s *PostgresStore) DeleteSnapshot(ctx context.Context, tenant, streamID string) error {
	tenant = tenantOrDefault(tenant)
	tag, err := s.pool.Exec(ctx, s.q.deleteSnapshot.SQL,
		s.q.deleteSnapshot.Args(&param{Tenant: tenant, StreamID: streamID})...)
	if err != nil {
		return fmt.Errorf("eventstore: delete snapshot of stream %q: %w", streamID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: stream %q (tenant %q)", ErrSnapshotNotFound, streamID, tenant)
	}
	return nil
}
