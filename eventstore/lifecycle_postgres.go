package eventstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var _ LifecycleStore = (*PostgresStore)(nil)

// lifecycleWait bounds how long ArchiveStream and DeleteStream wait, between their two steps, for the transactions
// that began before the first (see moveWhenSafe).
const lifecycleWait = 30 * time.Second

// ArchiveStream implements LifecycleStore.
//
// It runs in two steps. The first, one short transaction, records the stream as archiving (from then on every
// append to it is refused) and appends the archive's marker at the stream's next version (an append racing it
// loses on the version, as against any append, and then reports the archive). The second waits until every
// transaction that began before the first has ended (one could still append with a view of the stream from before
// it: a REPEATABLE READ transaction, or a statement in flight), then moves the stream's events from the events
// table to stream_archive in one transaction, so a reader sees them in one table or the other, never in neither.
// The wait is bounded (30 s and ctx): past it the stream stays archiving, appends refused, loads served from the
// events table, and the error matches ErrLifecyclePending; call ArchiveStream again to move the events.
func (s *PostgresStore) ArchiveStream(ctx context.Context, req LifecycleRequest) (StreamLifecycle, error) {
	if err := checkLifecycleRequest(&req, "archive stream", false); err != nil {
		return StreamLifecycle{}, err
	}
	return s.lifecycleOp(ctx, req, StreamArchiving)
}

// DeleteStream implements LifecycleStore, in the two steps ArchiveStream takes (see there): the first records the
// deletion (who, when, why) and appends its marker, the second replaces the stream's events by tombstones (in
// stream_archive, payload and metadata NULL; an archived stream's archived events lose theirs there) and deletes
// its snapshot.
func (s *PostgresStore) DeleteStream(ctx context.Context, req LifecycleRequest) (StreamLifecycle, error) {
	if err := checkLifecycleRequest(&req, "delete stream", true); err != nil {
		return StreamLifecycle{}, err
	}
	return s.lifecycleOp(ctx, req, StreamDeleting)
}

// Lifecycle implements LifecycleStore.
func (s *PostgresStore) Lifecycle(ctx context.Context, tenant, streamID string) (StreamLifecycle, error) {
	tenant = tenantOrDefault(tenant)
	type read struct {
		lc    StreamLifecycle
		found bool
	}
	r, err := poolRead(ctx, func() (read, error) {
		lc, found, err := s.readLifecycle(ctx, s.pool, tenant, streamID, false)
		return read{lc, found}, err
	})
	if err != nil || r.found {
		return r.lc, err
	}
	info, err := s.Stream(ctx, tenant, streamID)
	if err != nil {
		return r.lc, err
	}
	return StreamLifecycle{Tenant: tenant, StreamID: streamID, StreamType: info.StreamType, State: StreamActive,
		Version: info.Version}, nil
}

// readLifecycle reads a stream's lifecycle row through db (locking it when forUpdate); found is false when the
// stream has none (it is active, or does not exist).
func (s *PostgresStore) readLifecycle(ctx context.Context, db dbtx, tenant, streamID string, forUpdate bool) (
	StreamLifecycle, bool, error) {
	lc := StreamLifecycle{Tenant: tenant, StreamID: streamID}
	q := s.q.readLifecycle[b2i(forUpdate)]
	var state string
	err := db.QueryRow(ctx, q.SQL, q.Args(&param{Tenant: tenant, StreamID: streamID})...).Scan(&lc.StreamType,
		&state, &lc.Version, &lc.FirstPosition, &lc.LastPosition, &lc.MarkerPosition, &lc.Events, &lc.ArchivedAt,
		&lc.ArchivedBy, &lc.DeletedAt, &lc.DeletedBy, &lc.Reason)
	if errors.Is(err, pgx.ErrNoRows) {
		return lc, false, nil
	}
	if err != nil {
		return lc, false, fmt.Errorf("eventstore: read the lifecycle of stream %q: %w", streamID, err)
	}
	lc.State = StreamState(state)
	lc.ArchivedAt, lc.DeletedAt = zeroEpoch(lc.ArchivedAt), zeroEpoch(lc.DeletedAt)
	return lc, true, nil
}

func zeroEpoch(t time.Time) time.Time {
	if t.Unix() == 0 {
		return time.Time{}
	}
	return t.UTC()
}

// lifecycleConflict returns the typed error of an append to req's stream that failed its version check when the
// stream is archived or deleted (read through db), and nil otherwise (a plain conflict, or the state could not be
// read).
func (s *PostgresStore) lifecycleConflict(ctx context.Context, db dbtx, req AppendRequest) error {
	lc, found, err := s.readLifecycle(ctx, db, tenantOrDefault(req.Tenant), req.StreamID, false)
	if err != nil || !found {
		return nil
	}
	return lifecycleError(lc)
}

// lockLifecycle takes, on tx, the transaction-level advisory lock that serialises the lifecycle operations of one
// stream.
func (s *PostgresStore) lockLifecycle(ctx context.Context, tx pgx.Tx, tenant, streamID string) error {
	q := s.q.lifecycleLock
	_, err := tx.Exec(ctx, q.SQL, q.Args(&param{Schema: s.cfg.Schema, Tenant: tenant, StreamID: streamID})...)
	return err
}

// lifecycleOp runs ArchiveStream (to StreamArchiving) or DeleteStream (to StreamDeleting).
func (s *PostgresStore) lifecycleOp(ctx context.Context, req LifecycleRequest, to StreamState) (StreamLifecycle,
	error) {
	lc, err := s.lifecycleMark(ctx, req, to)
	if err != nil {
		return lc, err
	}
	return s.moveWhenSafe(ctx, lc)
}

// lifecycleMark is the first step: it records the operation and appends its marker, in one transaction, and
// returns the stream's record (already in state to, or further when a call before stopped between its steps).
func (s *PostgresStore) lifecycleMark(ctx context.Context, req LifecycleRequest, to StreamState) (StreamLifecycle,
	error) {
	op := "archive"
	if to == StreamDeleting {
		op = "delete"
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return StreamLifecycle{}, fmt.Errorf("eventstore: %s stream %q: begin: %w", op, req.StreamID, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := s.lockLifecycle(ctx, tx, req.Tenant, req.StreamID); err != nil {
		return StreamLifecycle{}, fmt.Errorf("eventstore: %s stream %q: lock: %w", op, req.StreamID, err)
	}
	lc, found, err := s.readLifecycle(ctx, tx, req.Tenant, req.StreamID, true)
	if err != nil {
		return lc, err
	}
	switch {
	case found && lc.State == to:
		return lc, nil // the first step is done: finish the second
	case found && (lc.State == StreamDeleting || lc.State == StreamDeleted):
		return lc, lifecycleError(lc)
	case found && to == StreamArchiving: // archived already
		return lc, lifecycleError(lc)
	}
	marker := StreamArchivedType
	if to == StreamDeleting {
		marker = StreamDeletedType
	}
	pos, version, streamType, err := s.appendMarker(ctx, tx, req, marker)
	if err != nil {
		return lc, err
	}
	// The head is closed whatever the layout this store last read: a table being converted to partitions has its
	// heads recorded already (and the conversion closes those of streams archived before it copied them), and on a
	// table that is not partitioned there is no head to close.
	stream := param{Tenant: req.Tenant, StreamID: req.StreamID}
	if _, err := tx.Exec(ctx, s.q.closeHead.SQL, s.q.closeHead.Args(&stream)...); err != nil {
		return lc, fmt.Errorf("eventstore: %s stream %q: close its head: %w", op, req.StreamID, err)
	}
	rec := param{Tenant: req.Tenant, StreamID: req.StreamID, StreamType: streamType, Version: version - 1,
		MarkerPosition: pos, Actor: nilIfBlank(req.Actor)}
	if !found {
		lc = StreamLifecycle{Tenant: req.Tenant, StreamID: req.StreamID, StreamType: streamType, Version: version - 1}
	}
	var at time.Time
	if to == StreamArchiving {
		rec.Reason = nilIfBlank(req.Reason)
		err = tx.QueryRow(ctx, s.q.recordArchiving.SQL, s.q.recordArchiving.Args(&rec)...).Scan(&at, &lc.ArchivedBy)
		lc.ArchivedAt = at.UTC()
	} else {
		rec.Reason = req.Reason
		err = tx.QueryRow(ctx, s.q.recordDeleting.SQL, s.q.recordDeleting.Args(&rec)...).Scan(&at, &lc.DeletedBy)
		lc.DeletedAt, lc.Reason = at.UTC(), req.Reason
	}
	if err != nil {
		return lc, fmt.Errorf("eventstore: %s stream %q: record it: %w", op, req.StreamID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return lc, fmt.Errorf("eventstore: %s stream %q: commit: %w", op, req.StreamID, err)
	}
	lc.State, lc.MarkerPosition = to, pos
	s.Notify() // the marker is in the log
	return lc, nil
}

// appendMarker appends a marker of type marker at the stream's next version on tx, under a savepoint: when an
// append wins the version first, it reads the new version and tries again. It returns the marker's position and
// version and the stream's type. The marker does not pass the lifecycle guard of appends (it is the store's own
// insert), and on a partitioned table the trigger moves the stream's head to it, as for any event.
func (s *PostgresStore) appendMarker(ctx context.Context, tx pgx.Tx, req LifecycleRequest, marker string) (
	int64, int64, string, error) {
	lay, err := s.layout(ctx, tx)
	if err != nil {
		return 0, 0, "", err
	}
	insert := s.q.appendMarker[b2i(lay.partitioned)] // after the stream's last event, found by its head when partitioned
	for attempt := 0; ; attempt++ {
		id, err := uuid.NewV7()
		if err != nil {
			return 0, 0, "", fmt.Errorf("eventstore: generate event id: %w", err)
		}
		if _, err := tx.Exec(ctx, `SAVEPOINT stagehand_marker`); err != nil {
			return 0, 0, "", fmt.Errorf("eventstore: mark stream %q: %w", req.StreamID, err)
		}
		var pos, version int64
		var streamType string
		err = tx.QueryRow(ctx, insert.SQL, insert.Args(&param{Tenant: req.Tenant, StreamID: req.StreamID, MarkerID: id,
			MarkerType: marker})...).Scan(&pos, &version, &streamType)
		if err == nil {
			_, err = tx.Exec(ctx, `RELEASE SAVEPOINT stagehand_marker`)
			return pos, version, streamType, err
		}
		if _, rerr := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT stagehand_marker`); rerr != nil {
			return 0, 0, "", fmt.Errorf("eventstore: mark stream %q: %w (and rolling back: %w)", req.StreamID, err,
				rerr)
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, 0, "", fmt.Errorf("%w: %q (tenant %q)", ErrStreamNotFound, req.StreamID, req.Tenant)
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" && attempt < 100 {
			continue // an append took the version first: it is in the stream, and moves with it
		}
		if np := noPartition(err); np != nil {
			return 0, 0, "", np
		}
		return 0, 0, "", fmt.Errorf("eventstore: mark stream %q: %w", req.StreamID, err)
	}
}

// moveWhenSafe is the second step: once no transaction that began before the first step is open, it moves the
// stream's events (see ArchiveStream, DeleteStream). lc is the record the first step left.
func (s *PostgresStore) moveWhenSafe(ctx context.Context, lc StreamLifecycle) (StreamLifecycle, error) {
	if lc.State.Done() {
		return lc, nil
	}
	waiting, err := s.waitForOlderTransactions(ctx)
	if err != nil {
		return lc, &LifecyclePendingError{Tenant: lc.Tenant, StreamID: lc.StreamID, State: lc.State,
			Waiting: waiting, Err: err}
	}
	return s.move(ctx, lc)
}

// waitForOlderTransactions waits until no other session of the database has a transaction that began before the
// call and holds a snapshot or a transaction ID (one that could still write with a view from before), at most
// lifecycleWait. It returns how many remained when it gave up.
func (s *PostgresStore) waitForOlderTransactions(ctx context.Context) (int, error) {
	var since time.Time
	if err := s.pool.QueryRow(ctx, s.q.clock.SQL).Scan(&since); err != nil {
		return 0, fmt.Errorf("read the clock: %w", err)
	}
	deadline := time.Now().Add(lifecycleWait)
	pause := time.Millisecond
	for {
		var n int
		q := s.q.olderTransactions
		if err := s.pool.QueryRow(ctx, q.SQL, q.Args(&param{Since: since})...).Scan(&n); err != nil {
			return 0, fmt.Errorf("list the open transactions: %w", err)
		}
		if n == 0 {
			return 0, nil
		}
		if time.Now().After(deadline) {
			return n, fmt.Errorf("waited %s", lifecycleWait)
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(pause):
		}
		pause = min(pause*2, 100*time.Millisecond)
	}
}

// move moves the stream's events out of the events table, in one transaction, and records the outcome.
func (s *PostgresStore) move(ctx context.Context, lc StreamLifecycle) (StreamLifecycle, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return lc, fmt.Errorf("eventstore: move the events of stream %q: begin: %w", lc.StreamID, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := s.lockLifecycle(ctx, tx, lc.Tenant, lc.StreamID); err != nil {
		return lc, fmt.Errorf("eventstore: move the events of stream %q: lock: %w", lc.StreamID, err)
	}
	cur, found, err := s.readLifecycle(ctx, tx, lc.Tenant, lc.StreamID, true)
	if err != nil {
		return lc, err
	}
	if !found || cur.State.Done() {
		return cur, nil // finished meanwhile by another call
	}
	deleting := cur.State == StreamDeleting
	stream := param{Tenant: lc.Tenant, StreamID: lc.StreamID, MarkerPrefix: LifecycleTypePrefix}
	if deleting {
		if _, err := tx.Exec(ctx, s.q.eraseArchived.SQL, s.q.eraseArchived.Args(&stream)...); err != nil {
			return lc, fmt.Errorf("eventstore: delete the archived events of stream %q: %w", lc.StreamID, err)
		}
		if _, err := tx.Exec(ctx, s.q.deleteSnapshot.SQL, s.q.deleteSnapshot.Args(&stream)...); err != nil {
			return lc, fmt.Errorf("eventstore: delete the snapshot of stream %q: %w", lc.StreamID, err)
		}
	}
	move := s.q.moveEvents[b2i(deleting)] // a deleted stream's events lose their payload and metadata
	if _, err := tx.Exec(ctx, move.SQL, move.Args(&stream)...); err != nil {
		return lc, fmt.Errorf("eventstore: move the events of stream %q: %w", lc.StreamID, err)
	}
	done := StreamArchived
	if deleting {
		done = StreamDeleted
	}
	stream.State = string(done)
	if _, err := tx.Exec(ctx, s.q.recordMoved.SQL, s.q.recordMoved.Args(&stream)...); err != nil {
		return lc, fmt.Errorf("eventstore: record the lifecycle of stream %q: %w", lc.StreamID, err)
	}
	cur, _, err = s.readLifecycle(ctx, tx, lc.Tenant, lc.StreamID, false)
	if err != nil {
		return lc, err
	}
	if err := tx.Commit(ctx); err != nil {
		return lc, fmt.Errorf("eventstore: move the events of stream %q: commit: %w", lc.StreamID, err)
	}
	return cur, nil
}

// readMoved is the outcome of a stream read (through db, of versions from fromVersion on, the first limit when limit
// > 0) whose last row read is a lifecycle marker: read holds the rows read from the events table. A deleted
// stream's read fails with a *StreamDeletedError. An archived stream's events are the rows read without the
// markers while the archive has not moved them (they are then all in the events table), and are read from
// stream_archive once it has (the rows read were the markers alone).
func (s *PostgresStore) readMoved(ctx context.Context, db dbtx, tenant, streamID string, fromVersion int64,
	limit int, read []Record) ([]Record, error) {
	lc, found, err := s.readLifecycle(ctx, db, tenant, streamID, false)
	if err != nil {
		return nil, err
	}
	if lerr := lifecycleError(lc); found && errors.Is(lerr, ErrStreamDeleted) {
		return nil, lerr
	}
	events := read[:0:0]
	for _, r := range read {
		if !IsLifecycleMarker(r.Type) {
			events = append(events, r)
		}
	}
	first := max(fromVersion, 1)
	if len(events) > 0 || !found || first > lc.Version {
		return events, nil
	}
	var lim *int
	if limit > 0 {
		lim = &limit
	}
	q := s.q.readArchive
	rows, err := db.Query(ctx, q.SQL, q.Args(&param{Tenant: tenant, StreamID: streamID, FromVersion: first,
		Limit: lim})...)
	if err != nil {
		return nil, fmt.Errorf("eventstore: read the archive of stream %q: %w", streamID, err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		r := Record{Tenant: tenant, StreamID: streamID}
		var meta []byte
		var gone bool
		if err := rows.Scan(&r.Position, &r.StreamType, &r.Version, &r.EventID, &r.Type, &r.TypeVersion, &r.Payload,
			&meta, &r.OccurredAt, &r.RecordedAt, &gone); err != nil {
			return nil, fmt.Errorf("eventstore: read the archive of stream %q: %w", streamID, err)
		}
		if gone { // deleted since the lifecycle row was read
			return nil, &StreamDeletedError{Tenant: tenant, StreamID: streamID}
		}
		if err := finishRecord(&r, meta); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("eventstore: read the archive of stream %q: %w", streamID, err)
	}
	return out, nil
}

// movedStream is Stream of an archived or deleted stream (its last event is a marker).
func (s *PostgresStore) movedStream(ctx context.Context, tenant, streamID string) (StreamInfo, error) {
	info := StreamInfo{Tenant: tenant, StreamID: streamID}
	lc, found, err := s.readLifecycle(ctx, s.pool, tenant, streamID, false)
	if err != nil {
		return info, err
	}
	if lerr := lifecycleError(lc); !found || errors.Is(lerr, ErrStreamDeleted) {
		if lerr == nil {
			lerr = fmt.Errorf("%w: %q (tenant %q)", ErrStreamNotFound, streamID, tenant)
		}
		return info, lerr
	}
	info.StreamType, info.Version, info.State = lc.StreamType, lc.Version, lc.State
	// The first and the last event, wherever they are (the events table while archiving, the archive after).
	q := s.q.movedStreamTimes
	err = s.pool.QueryRow(ctx, q.SQL, q.Args(&param{Tenant: tenant, StreamID: streamID, Version: lc.Version})...).
		Scan(&info.CreatedAt, &info.UpdatedAt)
	if err != nil {
		return info, fmt.Errorf("eventstore: stream %q: %w", streamID, err)
	}
	info.CreatedAt, info.UpdatedAt = info.CreatedAt.UTC(), info.UpdatedAt.UTC()
	return info, nil
}
