package eventstore_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// The connection of an AppendWith or AppendQueued is terminated (pg_terminate_backend) while its COMMIT runs (a
// deferred trigger makes the commit take a few milliseconds), at a random moment, in a loop. Whatever the moment, a
// save whose events are stored is never reported as a plain failure: it is a success (the store found its events)
// or ErrCommitUnknown; and a save reported as a success is stored.
func TestConnectionKilledDuringCommit(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"AppendWith", "AppendQueued"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			killDuringCommit(t, how)
		})
	}
}

func killDuringCommit(t *testing.T, how string) {
	ctx := context.Background()
	s := newPostgres(t)
	pool := pgtest.Pool(t) // the test's own: the store's connections are the ones killed
	slow := pgtest.Q(s.Schema(), "slow")
	events := pgtest.Q(s.Schema(), "events")
	pgtest.Exec(t, pool, `CREATE TABLE `+slow+` (x int)`)
	pgtest.Exec(t, pool, `CREATE FUNCTION `+pgtest.Q(s.Schema(), "sleep_at_commit")+`() RETURNS trigger
		LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.01); RETURN NULL; END $$`)
	pgtest.Exec(t, pool, `CREATE CONSTRAINT TRIGGER sleep_at_commit AFTER INSERT ON `+slow+`
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+pgtest.Q(s.Schema(), "sleep_at_commit")+`()`)

	const rounds = 40
	outcomes := map[string]int{}
	version := int64(0)
	for range rounds {
		id := uuid.Must(uuid.NewV7())
		req := eventstore.AppendRequest{StreamID: "s", StreamType: "t", Expected: eventstore.ExpectedVersion(version),
			Events: []eventstore.EventData{{EventID: id, Type: "e", Payload: []byte(`{}`)}}}
		if version == 0 {
			req.Expected = eventstore.NoStream
		}
		pids := make(chan uint32, 1)
		killed := make(chan struct{})
		go func() {
			defer close(killed)
			pid, ok := <-pids
			if !ok {
				return
			}
			if pid == 0 { // AppendQueued: the only writer holding a lock on events, once its batch has arrived
				var p int32
				for deadline := time.Now().Add(time.Second); ; {
					err := pool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE relation = $1::regclass
						AND mode = 'RowExclusiveLock' AND pid <> pg_backend_pid() LIMIT 1`, events).Scan(&p)
					if err == nil {
						break
					}
					if time.Now().After(deadline) {
						return
					}
				}
				pid = uint32(p)
			}
			time.Sleep(time.Duration(rand.Int64N(int64(15 * time.Millisecond))))
			_, _ = pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, int32(pid))
		}()
		var err error
		if how == "AppendWith" {
			_, err = s.AppendWith(ctx, req, func(ctx context.Context, tx pgx.Tx, _ eventstore.AppendResult) error {
				pids <- tx.Conn().PgConn().PID()
				_, err := tx.Exec(ctx, `INSERT INTO `+slow+` VALUES (1)`)
				return err
			})
		} else {
			_, err = s.AppendQueued(ctx, req, func(_ context.Context, q eventstore.Queued) error {
				pids <- 0
				q.Batch.Queue(`INSERT INTO ` + slow + ` VALUES (1)`)
				return nil
			})
		}
		close(pids)
		<-killed
		stored := pgtest.Count(t, pool, `SELECT count(*) FROM `+events+` WHERE event_id = $1`, id) == 1
		switch {
		case err == nil:
			require.True(t, stored, "a save reported as a success is stored")
			outcomes["success"]++
		case errors.Is(err, eventstore.ErrCommitUnknown):
			outcomes["commit unknown"]++
		case errors.Is(err, eventstore.ErrConcurrencyConflict):
			require.False(t, stored)
			outcomes["conflict"]++
		default:
			require.False(t, stored, "a stored save reported as a plain failure: %v", err)
			if strings.Contains(err.Error(), "did not commit") {
				outcomes["not committed (resolved after the commit failed)"]++
			} else {
				outcomes["not committed (killed before the commit)"]++
			}
		}
		if stored {
			version++
		}
		s.Pool().Reset() // a kill that landed after the save left a dead idle connection: start afresh
	}
	t.Logf("%s: outcomes of %d saves killed during their commit: %v", how, rounds, outcomes)
	require.Positive(t, outcomes["not committed (resolved after the commit failed)"],
		"no kill landed during a commit: the test tested nothing")
	info, err := s.Stream(ctx, "", "s")
	if version == 0 { // every save was killed before it committed (a loaded machine delays the saves)
		require.ErrorIs(t, err, eventstore.ErrStreamNotFound)
		return
	}
	require.NoError(t, err)
	require.Equal(t, version, info.Version)
}
