package eventstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

var _ QueuedAppender = (*PostgresStore)(nil)

// AppendQueued implements QueuedAppender. The first round trip begins the transaction and inserts the events; the
// second sends the statements queue adds and the COMMIT. A conflict, an error from queue or a failed statement rolls
// the append back (one more round trip). The connection is held from the first round trip to the commit, as with
// AppendWith, and the wake-up notification is sent after the commit.
//
// If the connection fails while the commit is in flight, the append may or may not have committed: the store finds
// out on another connection (see the package documentation, "Lost commits") and returns success, a plain failure,
// or an error matching ErrCommitUnknown when the outcome cannot be known.
func (s *PostgresStore) AppendQueued(ctx context.Context, req AppendRequest, queue QueueFunc) (AppendResult, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return AppendResult{}, fmt.Errorf("eventstore: acquire a connection: %w", err)
	}
	// A connection left inside a transaction (or broken) is destroyed by Release rather than reused.
	defer conn.Release()
	res, err := s.appendBy(ctx, req, s.pool, true, func(sql string, args []any) ([]Record, error) {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		var recs []Record
		b.Queue(sql, args...).Query(func(rows pgx.Rows) (err error) {
			recs, err = scanAppended(rows)
			return err
		})
		err := conn.SendBatch(ctx, b).Close()
		if err != nil || len(recs) == 0 {
			if rerr := rollback(ctx, conn); err == nil {
				err = rerr
			}
		}
		return recs, err
	})
	if err != nil {
		return res, err
	}
	b := &pgx.Batch{}
	if queue != nil {
		if err := queue(ctx, res, b); err != nil {
			if rerr := rollback(ctx, conn); rerr != nil {
				err = fmt.Errorf("%w (and the rollback failed: %w)", err, rerr)
			}
			return AppendResult{}, fmt.Errorf("eventstore: staging in the append transaction of stream %q: %w",
				req.StreamID, err)
		}
	}
	b.Queue("COMMIT").Exec(func(ct pgconn.CommandTag) error {
		if ct.String() == "ROLLBACK" {
			return pgx.ErrTxCommitRollback
		}
		return nil
	})
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		if conn.Conn().IsClosed() {
			return s.commitLost(ctx, req, res, conn.Conn().PgConn().PID(), err)
		}
		// A statement failed, so the server skipped the commit: nothing is stored.
		if rerr := rollback(ctx, conn); rerr != nil {
			err = fmt.Errorf("%w (and the rollback failed: %w)", err, rerr)
		}
		return AppendResult{}, s.stageError(ctx, err, req)
	}
	s.Notify()
	return res, nil
}

// rollback ends the transaction conn is in, if any.
func rollback(ctx context.Context, conn *pgxpool.Conn) error {
	if conn.Conn().IsClosed() || conn.Conn().PgConn().TxStatus() == 'I' {
		return nil
	}
	_, err := conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("eventstore: rollback: %w", err)
	}
	return err
}
