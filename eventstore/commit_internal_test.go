package eventstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

func internalStore(t *testing.T) *PostgresStore {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	s, err := NewPostgres(pool, &PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

func oneEvent(stream string, expected ExpectedVersion) AppendRequest {
	return AppendRequest{StreamID: stream, StreamType: "t", Expected: expected,
		Events: []EventData{{EventID: uuid.Must(uuid.NewV7()), Type: "e", Payload: []byte(`{}`)}}}
}

// A commit whose reply was lost but which committed is resolved as a success with the append's result; one whose
// server process ended without committing is a plain failure (not ErrCommitUnknown); a lookup that cannot run
// leaves ErrCommitUnknown.
func TestResolveLostCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := internalStore(t)

	// Committed, reply lost.
	req := oneEvent("s", NoStream)
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	res, err := s.append(ctx, tx, req, false)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	got, err := s.commitFailed(ctx, tx, req, res, io.ErrUnexpectedEOF)
	require.NoError(t, err, "the events are stored: the save succeeded")
	require.Equal(t, res.Version, got.Version)
	require.Equal(t, res.Records[0].EventID, got.Records[0].EventID)
	require.Equal(t, res.Records[0].Position, got.Records[0].Position)
	got, err = s.appendFailed(ctx, req, io.ErrUnexpectedEOF)
	require.NoError(t, err, "Append resolves a committed statement too")
	require.Equal(t, int64(1), got.Version)

	// Not committed: its server process ended with the transaction open.
	req = oneEvent("s", 1)
	conn, err := s.pool.Acquire(ctx)
	require.NoError(t, err)
	tx, err = conn.Begin(ctx)
	require.NoError(t, err)
	res, err = s.append(ctx, tx, req, false)
	require.NoError(t, err)
	pid := conn.Conn().PgConn().PID()
	var killed bool
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, int32(pid)).Scan(&killed))
	require.True(t, killed)
	commitErr := tx.Commit(ctx)
	require.Error(t, commitErr)
	conn.Release()
	require.True(t, lostConnection(commitErr), "a terminated session's commit error is a lost connection: %v",
		commitErr)
	_, err = s.commitFailed(ctx, tx, req, res, commitErr)
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrCommitUnknown, "the process ended without the events: definitely not committed")
	require.ErrorContains(t, err, "did not commit")
	_, err = s.appendFailed(ctx, req, io.ErrUnexpectedEOF)
	require.ErrorIs(t, err, ErrCommitUnknown, "Append cannot wait for its statement's process: unknown")
	var cu *CommitUnknownError
	require.ErrorAs(t, err, &cu)
	require.Equal(t, "s", cu.StreamID)
	require.Equal(t, ExpectedVersion(1), cu.Expected)
	require.Equal(t, []uuid.UUID{req.Events[0].EventID}, cu.EventIDs)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "it unwraps to the connection error")

	// The database cannot be asked.
	cctx, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	pool := pgtest.PoolFor(t, pgtest.URL(t))
	closed, err := NewPostgres(pool, &PostgresConfig{Schema: s.cfg.Schema})
	require.NoError(t, err)
	pool.Close()
	_, err = closed.resolveCommit(cctx, req, []uuid.UUID{req.Events[0].EventID}, 0, io.ErrUnexpectedEOF)
	require.ErrorIs(t, err, ErrCommitUnknown)

	// Definite errors are never resolved.
	for _, e := range []error{ErrDuplicateEventID, ErrInvalidAppend, &ConflictError{}, errors.New("encode")} {
		require.False(t, lostConnection(e), "%v", e)
	}
}

// pgx reports the read of a reply that broke off as "conn closed" (pgconn.ErrConnClosed), an error it marks safe
// to retry although the statement was sent: a COMMIT whose reply was lost ends so. It is a lost connection, to be
// resolved, never a definite failure. (The end-to-end case, a COMMIT reply dropped by a proxy, is in
// proof/histories: TestLostCommitReplyIsNeverAFailure.)
func TestConnClosedIsALostConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	_, err = conn.Exec(ctx, "commit")
	require.ErrorIs(t, err, pgconn.ErrConnClosed)
	require.True(t, pgconn.SafeToRetry(err), "pgx marks it safe to retry")
	require.True(t, lostConnection(fmt.Errorf("eventstore: commit: %w", err)))
}
