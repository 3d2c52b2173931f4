package eventstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// isolatedStore returns a store whose connections run every transaction at level (default_transaction_isolation),
// on a fresh migrated schema.
func isolatedStore(t *testing.T, level string) (*eventstore.PostgresStore, *pgxpool.Pool) {
	t.Helper()
	_, schema := pgtest.Migrated(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	pgtest.Exec(t, pool, `CREATE TABLE `+pgtest.Q(schema, "side")+` (stream text, version bigint)`)
	return s, pool
}

// Under REPEATABLE READ and SERIALIZABLE, writers racing on one stream lose with serialization failures (40001)
// as well as failed version checks, in the statement or at COMMIT. Every loser's error must match
// ErrConcurrencyConflict and name the stream, whichever way it lost (Append, AppendWith with a staging write,
// AppendTx on the caller's transaction, AppendQueued with a queued write), and the stream stays 1..n.
func TestIsolationLevelLosersAreConflicts(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"serializable", "repeatable read"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, pool := isolatedStore(t, level)
			side := pgtest.Q(s.Schema(), "side")
			one := []eventstore.EventData{{Type: "e", Payload: []byte(`{}`)}}
			_, err := s.Append(ctx, eventstore.AppendRequest{StreamID: "s", StreamType: "t",
				Expected: eventstore.NoStream, Events: one})
			require.NoError(t, err)

			const writers, rounds = 12, 15
			var (
				mu      sync.Mutex
				wins    int
				losers  int
				reasons = map[string]int{}
			)
			var wg sync.WaitGroup
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range rounds {
						// Under SERIALIZABLE a statement that only reads can be the one PostgreSQL cancels: the
						// store reads again (TestReadsThroughThePoolRetrySerializationFailures), so no error here.
						info, err := s.Stream(ctx, "", "s")
						if err != nil {
							t.Errorf("stream: %v", err)
							return
						}
						req := eventstore.AppendRequest{StreamID: "s", StreamType: "t",
							Expected: eventstore.ExpectedVersion(info.Version), Events: one}
						switch w % 4 {
						case 0:
							_, err = s.Append(ctx, req)
						case 1:
							_, err = s.AppendWith(ctx, req, func(ctx context.Context, tx pgx.Tx,
								res eventstore.AppendResult) error {
								// Read what others staged, then write: a read-write dependency that
								// SERIALIZABLE may resolve with a failure in the stage or at COMMIT.
								var n int
								if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+side).Scan(&n); err != nil {
									return err
								}
								_, err := tx.Exec(ctx, `INSERT INTO `+side+` VALUES ('s', $1)`, res.Version)
								return err
							})
						case 2:
							err = appendTxAndCommit(ctx, s, pool, req)
						default:
							_, err = s.AppendQueued(ctx, req, func(_ context.Context, q eventstore.Queued) error {
								q.Batch.Queue(`INSERT INTO ` + side + ` SELECT 's', count(*) FROM ` + side)
								return nil
							})
						}
						mu.Lock()
						if err == nil {
							wins++
						} else {
							losers++
							var c *eventstore.ConflictError
							switch {
							case errors.Is(err, errCallerCommit):
								reasons["the caller's own commit"]++
							case !errors.Is(err, eventstore.ErrConcurrencyConflict) || !errors.As(err, &c) ||
								c.StreamID != "s":
								t.Errorf("writer %d: a loser's error is not a typed conflict: %v", w, err)
							default:
								reasons[c.Reason]++
							}
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			t.Logf("%s: %d wins, %d losers, by reason %v", level, wins, losers, reasons)
			require.Positive(t, losers, "no writer lost: the test raced nothing")
			info, err := s.Stream(ctx, "", "s")
			require.NoError(t, err)
			require.Equal(t, int64(wins+1), info.Version, "every win appended one event, no loser did")
			recs, err := s.ReadStream(ctx, "", "s", 1)
			require.NoError(t, err)
			for i, r := range recs {
				require.Equal(t, int64(i+1), r.Version)
			}
		})
	}
}

// errCallerCommit marks a serialization failure of the caller's own COMMIT after a successful AppendTx: the
// caller owns that transaction and its commit (the inbox treats it as contention).
var errCallerCommit = errors.New("the caller's commit failed with a transaction conflict")

// appendTxAndCommit appends on a transaction of the caller's and commits it.
func appendTxAndCommit(ctx context.Context, s *eventstore.PostgresStore, pool *pgxpool.Pool,
	req eventstore.AppendRequest) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := s.AppendTx(ctx, tx, req); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01") {
			return fmt.Errorf("%w: %w", errCallerCommit, err)
		}
		return err
	}
	return nil
}
