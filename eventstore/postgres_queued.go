package eventstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

var _ QueuedAppender = (*PostgresStore)(nil)

// AppendQueued implements QueuedAppender: the insert and the statements queue adds are sent in one round trip and
// run in one implicit transaction, which the server commits at the end of the batch. queue is called before
// anything is sent, with the records as they will be stored (see QueueFunc). A failed version check, a failed
// statement or an error from queue leaves nothing stored.
//
// An exact expected version or NoStream appends in that single round trip. AnyVersion and StreamExists first read
// the stream's version (one more round trip) and append against it; AnyVersion tries again when another append
// wins the race.
//
// If the connection fails while the batch is in flight, the append may or may not have committed: the store finds
// out on another connection (see the package documentation, "Lost commits") and returns success, a plain failure,
// or an error matching ErrCommitUnknown when the outcome cannot be known.
func (s *PostgresStore) AppendQueued(ctx context.Context, req AppendRequest, queue QueueFunc) (AppendResult, error) {
	req, err := prepare(req, s.cfg.Clock())
	if err != nil {
		return AppendResult{}, err
	}
	if req.Expected >= NoStream {
		return s.appendPipelined(ctx, req, queue)
	}
	for attempt := 0; ; attempt++ {
		var current int64
		q, _ := s.versionSQL(ctx, s.pool) // through the pool: no error
		if err := s.pool.QueryRow(ctx, q.SQL, q.Args(&param{Tenant: req.Tenant, StreamID: req.StreamID})...).
			Scan(&current); err != nil {
			return AppendResult{}, fmt.Errorf("eventstore: read the version of stream %q: %w", req.StreamID, err)
		}
		if current == 0 && req.Expected == StreamExists {
			return AppendResult{}, &ConflictError{Tenant: req.Tenant, StreamID: req.StreamID, Expected: req.Expected}
		}
		exact := req
		exact.Expected = ExpectedVersion(current)
		res, err := s.appendPipelined(ctx, exact, queue)
		var c *ConflictError
		if errors.As(err, &c) && c.Reason == "" {
			if req.Expected == AnyVersion && attempt < 20 {
				continue
			}
			c.Expected = req.Expected // the caller's condition, not the one derived from it
		}
		return res, err
	}
}

// appendPipelined is AppendQueued for a prepared request whose versions are known before the insert (an exact
// expected version, or NoStream). It holds one connection at a time: what it reads after a failure (the stream's
// version, whether a lost commit happened) it reads once the batch's connection is back in the pool.
func (s *PostgresStore) appendPipelined(ctx context.Context, req AppendRequest, queue QueueFunc) (AppendResult,
	error) {
	p, l := appendParams(req)
	planned := plannedResult(req)
	b := &pgx.Batch{}
	var recs []Record
	inserted := false
	stmt, _ := s.appendSQL(ctx, s.pool, req.Expected, l) // through the pool: no error
	b.Queue(stmt.SQL, stmt.Args(&p)...).Query(func(rows pgx.Rows) (err error) {
		recs, err = scanAppended(rows)
		inserted = err == nil
		return err
	})
	if queue != nil {
		st, _ := s.layout(ctx, s.pool) // as appendSQL read it: no error through the pool
		last := planned.Records[len(planned.Records)-1].EventID.String()
		if err := queue(ctx, Queued{Planned: planned, Batch: b,
			Positions: s.appendedPositions(st.partitioned, last)}); err != nil {
			return AppendResult{}, fmt.Errorf("eventstore: staging in the append transaction of stream %q: %w",
				req.StreamID, err)
		}
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return AppendResult{}, fmt.Errorf("eventstore: acquire a connection: %w", err)
	}
	err = conn.SendBatch(ctx, b).Close()
	lost := err != nil && conn.Conn().IsClosed() && lostConnection(err)
	pid := conn.Conn().PgConn().PID()
	conn.Release() // a broken connection is destroyed rather than reused
	if err != nil {
		if lost {
			return s.commitLost(ctx, req, planned, pid, err)
		}
		// A statement failed, so the server rolled the implicit transaction back: nothing is stored.
		if !inserted {
			err = s.translate(err, req)
			if errors.Is(err, ErrConcurrencyConflict) {
				if lerr := s.lifecycleConflict(ctx, s.pool, req); lerr != nil {
					return AppendResult{}, lerr
				}
				var c *ConflictError
				if errors.As(err, &c) {
					return AppendResult{}, s.withActual(ctx, c, req)
				}
				return AppendResult{}, s.conflict(ctx, s.pool, req)
			}
			return AppendResult{}, err
		}
		return AppendResult{}, s.stageError(ctx, err, req)
	}
	if len(recs) != len(req.Events) {
		return AppendResult{}, fmt.Errorf("eventstore: append to stream %q stored %d of %d events", req.StreamID,
			len(recs), len(req.Events))
	}
	s.Notify()
	return appended(req, recs), nil
}

// plannedResult describes the records an append of req with a known base version will store, before the insert:
// everything but Position and RecordedAt, which the insert assigns.
func plannedResult(req AppendRequest) AppendResult {
	base := int64(req.Expected)
	recs := make([]Record, len(req.Events))
	for i := range recs {
		recs[i].Version = base + int64(i) + 1
	}
	return appended(req, recs)
}
