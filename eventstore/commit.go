package eventstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// resolveTimeout bounds how long a store spends finding out whether a commit whose connection was lost happened.
const resolveTimeout = 10 * time.Second

// lostConnection reports whether err may hide the outcome of a statement that reached the server: the connection
// broke (a network error, an unexpected end of stream, a context that ended mid-exchange, which makes pgx close the
// connection) and pgx cannot tell that nothing was sent, or the server ended the session with an error of class 08
// (connection exception) or 57 (operator intervention, pg_terminate_backend included), which can come after a
// commit has completed. Every other error is definite.
//
// pgconn.ErrConnClosed ("conn closed") is a lost connection although pgx marks it safe to retry: pgx returns it
// not only when a statement is refused on a connection already closed, but also when the read of a reply that was
// already requested fails (its simple-protocol reader drops the read error, closes the connection and then reports
// the closed connection), which is how a COMMIT whose reply was lost ends.
func lostConnection(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, pgconn.ErrConnClosed) {
		return true
	}
	if pgconn.SafeToRetry(err) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57")
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		pgconn.Timeout(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// commitFailed is the outcome of AppendWith whose COMMIT failed. A server error there (a serialization failure, a
// deferred constraint) is definite; a lost connection is resolved by resolveCommit, knowing the server process of
// the transaction.
func (s *PostgresStore) commitFailed(ctx context.Context, tx pgx.Tx, req AppendRequest, res AppendResult,
	err error) (AppendResult, error) {
	if !lostConnection(err) {
		return AppendResult{}, s.commitError(ctx, err, req)
	}
	return s.commitLost(ctx, req, res, tx.Conn().PgConn().PID(), err)
}

// commitLost is the outcome of AppendQueued whose connection failed with the COMMIT in flight: resolveCommit,
// knowing the server process (pid) of the transaction.
func (s *PostgresStore) commitLost(ctx context.Context, req AppendRequest, res AppendResult, pid uint32,
	err error) (AppendResult, error) {
	ids := make([]uuid.UUID, len(res.Records))
	for i, r := range res.Records {
		ids[i] = r.EventID
	}
	return s.resolveCommit(ctx, req, ids, pid, err)
}

// appendFailed is the outcome of Append (one statement, committed by itself) that failed. A lost connection may
// have lost the reply of a committed statement: resolveCommit looks for the events when the request named their
// IDs (it cannot wait for the statement's server process, so it can confirm a commit but not rule one out).
func (s *PostgresStore) appendFailed(ctx context.Context, req AppendRequest, err error) (AppendResult, error) {
	if !lostConnection(err) {
		return AppendResult{}, err
	}
	ids := make([]uuid.UUID, len(req.Events))
	for i, e := range req.Events {
		if e.EventID == uuid.Nil {
			return AppendResult{}, s.commitUnknown(req, nil, err)
		}
		ids[i] = e.EventID
	}
	return s.resolveCommit(ctx, req, ids, 0, err)
}

func (s *PostgresStore) commitUnknown(req AppendRequest, ids []uuid.UUID, err error) error {
	return &CommitUnknownError{Tenant: tenantOrDefault(req.Tenant), StreamID: req.StreamID, Expected: req.Expected,
		EventIDs: ids, Err: err}
}

// resolveCommit finds out, on another connection, whether an append whose connection was lost committed: all its
// events stored means it did (its result is returned). Otherwise, when pid (the lost connection's server process)
// is known, and is a server process (not a pooler's number: backendPIDs), it waits for that process to end (from
// then on its transaction has committed or aborted for good) and looks again: none stored then means it did not
// commit (a plain error). Anything else is a CommitUnknownError.
func (s *PostgresStore) resolveCommit(ctx context.Context, req AppendRequest, ids []uuid.UUID, pid uint32,
	lost error) (AppendResult, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
	defer cancel()
	found, err := s.countEvents(ctx, ids)
	if err == nil && found < len(ids) && pid != 0 && s.backendPIDs(ctx) && s.waitForBackend(ctx, pid) {
		if found, err = s.countEvents(ctx, ids); err == nil && found == 0 {
			return AppendResult{}, fmt.Errorf("eventstore: append to stream %q did not commit (the connection "+
				"was lost before the commit completed; nothing was appended): %w", req.StreamID, lost)
		}
	}
	if err == nil && found == len(ids) {
		res, err := s.committedResult(ctx, req, ids)
		if err == nil {
			s.Notify()
			return res, nil
		}
		s.cfg.Logger.WarnContext(ctx, "stagehand: an append committed but its events could not be read back",
			"stream", req.StreamID, "error", err)
	} else if err != nil {
		s.cfg.Logger.WarnContext(ctx, "stagehand: could not find out whether an append committed",
			"stream", req.StreamID, "error", err)
	}
	return AppendResult{}, s.commitUnknown(req, ids, lost)
}

const (
	pidsDirect = 1 // a connection's process ID is the server process serving it
	pidsPooled = 2 // it is not: a pooler (PgBouncer) handed out keys of its own
)

// backendPIDs reports whether the process ID a pool connection was started with (its BackendKeyData) is the
// server process that runs its statements, as on a direct connection. Through a connection pooler it is the
// pooler's own number, so the end of that "process" says nothing of a transaction in flight: resolveCommit must
// not wait for it. Found out once per store, on a pool connection; when the check cannot run, it reports false
// (the pid is not trusted: the outcome is left unknown rather than guessed).
func (s *PostgresStore) backendPIDs(ctx context.Context) bool {
	switch s.serverPIDs.Load() {
	case pidsDirect:
		return true
	case pidsPooled:
		return false
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return false
	}
	defer conn.Release()
	var pid int32
	if err := conn.QueryRow(ctx, s.q.backendPID.SQL).Scan(&pid); err != nil {
		return false
	}
	if uint32(pid) == conn.Conn().PgConn().PID() {
		s.serverPIDs.Store(pidsDirect)
		return true
	}
	s.serverPIDs.Store(pidsPooled)
	s.cfg.Logger.InfoContext(ctx, "stagehand: the event store's connections go through a pooler; a lost commit "+
		"whose events are not found is reported as ErrCommitUnknown, since the server process that ran it "+
		"cannot be waited for")
	return false
}

// countEvents counts the stored events among ids. It tries a few times: the failure that lost the commit (a
// server restart, a terminated session) often broke other pooled connections too, and each try takes another.
func (s *PostgresStore) countEvents(ctx context.Context, ids []uuid.UUID) (int, error) {
	var err error
	for range 3 {
		var n int
		err = s.pool.QueryRow(ctx, s.q.countEvents.SQL, s.q.countEvents.Args(&param{IDs: ids})...).Scan(&n)
		if err == nil {
			return n, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return 0, err
}

// waitForBackend waits until server process pid has ended, and reports whether it did before ctx ended.
func (s *PostgresStore) waitForBackend(ctx context.Context, pid uint32) bool {
	for {
		var alive bool
		q := s.q.backendAlive
		err := s.pool.QueryRow(ctx, q.SQL, q.Args(&param{PID: int32(pid)})...).Scan(&alive)
		if err == nil && !alive {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// committedResult reads back the records of a committed append.
func (s *PostgresStore) committedResult(ctx context.Context, req AppendRequest, ids []uuid.UUID) (
	AppendResult, error) {
	var first int64
	q := s.q.firstVersion
	if err := s.pool.QueryRow(ctx, q.SQL, q.Args(&param{IDs: ids})...).Scan(&first); err != nil {
		return AppendResult{}, err
	}
	recs, err := s.readStream(ctx, s.pool, req.Tenant, req.StreamID, first, 0)
	if err != nil {
		return AppendResult{}, err
	}
	if len(recs) < len(ids) {
		return AppendResult{}, fmt.Errorf("eventstore: stream %q has %d events from version %d, want %d",
			req.StreamID, len(recs), first, len(ids))
	}
	recs = recs[:len(ids)]
	for i, r := range recs {
		if r.EventID != ids[i] {
			return AppendResult{}, fmt.Errorf("eventstore: stream %q: event %s at version %d, want %s",
				req.StreamID, r.EventID, r.Version, ids[i])
		}
	}
	return AppendResult{Records: recs, Version: recs[len(recs)-1].Version}, nil
}
