package eventstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATEs of transaction conflicts: PostgreSQL rolled the transaction (or the statement) back because of a
// concurrent one, so retrying the whole unit of work can succeed.
const (
	sqlstateSerializationFailure = "40001"
	sqlstateDeadlockDetected     = "40P01"
)

// conflictReason returns the Reason of the ConflictError for err when err is a transaction conflict (a
// serialization failure under REPEATABLE READ or SERIALIZABLE, or a deadlock), else "".
func conflictReason(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	switch pgErr.Code {
	case sqlstateSerializationFailure:
		return "serialization failure"
	case sqlstateDeadlockDetected:
		return "deadlock"
	}
	return ""
}

// txConflict returns a *ConflictError naming req's stream when err is a transaction conflict, else nil. Its Actual
// is -1: the caller reads the stream's version when it can.
func txConflict(err error, req AppendRequest) *ConflictError {
	reason := conflictReason(err)
	if reason == "" {
		return nil
	}
	return &ConflictError{Tenant: req.Tenant, StreamID: req.StreamID, Expected: req.Expected, Actual: -1,
		Reason: reason}
}

// withActual reads the stream's committed version into c (outside any transaction: the failed one is aborted).
func (s *PostgresStore) withActual(ctx context.Context, c *ConflictError, req AppendRequest) *ConflictError {
	var current *ConflictError
	if errors.As(s.conflict(ctx, s.pool, req), &current) {
		c.Actual = current.Actual
	}
	return c
}

// withCurrent completes err, when it is a *ConflictError whose version was left unknown (-1), with the stream's
// committed version read on the pool. Call it only once the failed append's transaction has ended.
func (s *PostgresStore) withCurrent(ctx context.Context, err error, req AppendRequest) error {
	var c *ConflictError
	if errors.As(err, &c) && c.Reason == "" {
		if lerr := s.lifecycleConflict(ctx, s.pool, AppendRequest{Tenant: c.Tenant, StreamID: c.StreamID}); lerr != nil {
			return lerr
		}
	}
	if errors.As(err, &c) && c.Actual == -1 {
		req.Tenant = c.Tenant // as prepared: the default tenant filled in
		s.withActual(ctx, c, req)
	}
	return err
}

// stageError is the error of AppendWith when its stage callback failed (called once its transaction has ended): a
// transaction conflict there (the outbox insert of a serializable transaction, for instance) rolled the append
// back, so it is a concurrency conflict.
func (s *PostgresStore) stageError(ctx context.Context, err error, req AppendRequest) error {
	if c := txConflict(err, req); c != nil {
		return fmt.Errorf("eventstore: staging in the append transaction of stream %q: %w", req.StreamID,
			s.withActual(ctx, c, req))
	}
	return fmt.Errorf("eventstore: staging in the append transaction of stream %q: %w", req.StreamID, err)
}

// commitError is the error of AppendWith's failed COMMIT. A serialization failure or a deadlock at commit rolled
// the transaction back: a concurrency conflict, nothing appended.
func (s *PostgresStore) commitError(ctx context.Context, err error, req AppendRequest) error {
	if c := txConflict(err, req); c != nil {
		return s.withActual(ctx, c, req)
	}
	return fmt.Errorf("eventstore: commit append to stream %q: %w", req.StreamID, err)
}

// readAttempts bounds how many times poolRead runs a read that PostgreSQL keeps cancelling as a conflict.
const readAttempts = 20

// poolRead runs read, which reads through the pool (each statement its own implicit transaction, writing nothing),
// and runs it again when PostgreSQL cancelled it as a transaction conflict. Under SERIALIZABLE (a server, database
// or role whose default_transaction_isolation is serializable) PostgreSQL can cancel a statement that only reads
// with a serialization failure: when it reads a row version of a transaction that has already prepared or
// committed and that read what a transaction committed before it then changed ("Canceled on conflict out to
// pivot, during read"), the reader is the only one it can still cancel. Nothing was written, so reading again is
// safe, and a read started later usually finds the writer ended. It waits 1 ms before the second try, doubling
// up to 100 ms, and gives up after readAttempts tries (about 1.6 s) or when ctx ends, with the last error.
func poolRead[T any](ctx context.Context, read func() (T, error)) (T, error) {
	wait := time.Millisecond
	for attempt := 1; ; attempt++ {
		v, err := read()
		if err == nil || conflictReason(err) == "" {
			return v, err
		}
		if attempt == readAttempts {
			return v, fmt.Errorf("eventstore: a read cancelled as a transaction conflict %d times: %w", attempt, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}
