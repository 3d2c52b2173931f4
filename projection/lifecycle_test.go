package projection_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

// deleterMux is the model's Mux with a deletion handler that removes the stream's account row.
func (m *model) deleterMux(calls *sync.Map) *projection.Mux {
	mux := m.mux()
	mux.OnStreamDeleted(func(ctx context.Context, tx pgx.Tx, e projection.Event) error {
		n, _ := calls.LoadOrStore(e.StreamID, new(int))
		*n.(*int)++
		_, err := tx.Exec(ctx, `DELETE FROM `+m.t("accounts")+` WHERE tenant = $1 AND id = $2`, e.Tenant, e.StreamID)
		return err
	})
	return mux
}

// Streams are archived and deleted while writers append to them and a projection runs throughout. Every append
// either lands before (and is archived or deleted with its stream) or fails with the typed error; the projection
// applies each event at most once, is told of each deletion once (and removes the stream's row), and ends with the
// read model a rebuild from the start produces (which reads the archived events and passes over the tombstones).
func TestLifecycleUnderWritesWithAProjectionRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	m := w.model("rm")
	var calls sync.Map
	p := w.newProjection(t, m.deleterMux(&calls), projection.Config{BatchSize: 5, PollInterval: 20 * time.Millisecond})
	start(t, p)
	const accounts = 6
	w.seed(t, w.store, accounts, 2)

	archived := map[string]bool{"a1": true, "a2": true}
	deleted := map[string]bool{"a3": true, "a4": true}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var unexpected []error
	refused := map[string]bool{}
	for i := range accounts {
		id := fmt.Sprintf("a%d", i)
		for range 2 { // two writers per account, so appends also race each other
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					_, err := w.store.Append(ctx, w.request(t, id, eventstore.AnyVersion, Deposited{Amount: 1}))
					switch {
					case err == nil:
					case (archived[id] && errors.Is(err, eventstore.ErrStreamArchived)) ||
						(deleted[id] && errors.Is(err, eventstore.ErrStreamDeleted)):
						mu.Lock()
						refused[id] = true
						mu.Unlock()
						return
					default:
						mu.Lock()
						unexpected = append(unexpected, fmt.Errorf("%s: %w", id, err))
						mu.Unlock()
						return
					}
					if n%4 == 3 {
						time.Sleep(time.Millisecond) // leave the machine to the projection now and then
					}
				}
			}()
		}
	}
	time.Sleep(50 * time.Millisecond)
	var ops sync.WaitGroup
	opErrs := make(chan error, 4)
	for id := range archived {
		ops.Go(func() {
			_, err := w.store.ArchiveStream(ctx, eventstore.LifecycleRequest{StreamID: id, Actor: "test"})
			opErrs <- err
		})
	}
	for id := range deleted {
		ops.Go(func() {
			_, err := w.store.DeleteStream(ctx, eventstore.LifecycleRequest{StreamID: id, Reason: "erasure"})
			opErrs <- err
		})
	}
	ops.Wait()
	close(opErrs)
	for err := range opErrs {
		require.NoError(t, err)
	}
	time.Sleep(50 * time.Millisecond) // the live streams' writers go on a little after the operations
	close(stop)
	wg.Wait()
	require.Empty(t, unexpected)
	for id := range archived {
		require.True(t, refused[id], "%s's writers end refused", id)
	}
	for id := range deleted {
		require.True(t, refused[id], "%s's writers end refused", id)
	}

	pgtest.Eventually(t, 20*time.Second, caughtUp(t, w, p), "the projection catches up")
	// Each event applied once: no duplicate positions, and every event the log still holds was applied.
	live := w.count(t, `SELECT count(*) FROM `+pgtest.Q(w.schema, "rm_applied"))
	distinct := w.count(t, `SELECT count(DISTINCT position) FROM `+pgtest.Q(w.schema, "rm_applied"))
	require.Equal(t, live, distinct, "no event applied twice")
	var readable []int64
	q := eventstore.LogQuery{}
	for {
		page, err := w.store.ReadLog(ctx, q)
		require.NoError(t, err)
		for _, r := range page.Records {
			readable = append(readable, r.Position)
		}
		if page.Last == q.After {
			break
		}
		q.After = page.Last
	}
	require.Equal(t, int64(0), w.count(t, `SELECT count(*) FROM unnest($1::bigint[]) p WHERE p NOT IN (SELECT position
		FROM `+pgtest.Q(w.schema, "rm_applied")+`)`, readable), "every event the log holds was applied")
	for id := range deleted {
		n, ok := calls.Load(id)
		require.True(t, ok, "the projection was told of the deletion of %s", id)
		require.Equal(t, 1, *n.(*int), "once")
	}
	// The read model agrees with the store: archived accounts at their last version, deleted ones gone.
	for i := range accounts {
		id := fmt.Sprintf("a%d", i)
		rows := w.count(t, `SELECT count(*) FROM `+pgtest.Q(w.schema, "rm_accounts")+` WHERE id = $1`, id)
		if deleted[id] {
			require.Zero(t, rows, "%s's row was removed", id)
			continue
		}
		recs, err := w.store.ReadStream(ctx, "", id, 1)
		require.NoError(t, err)
		require.Equal(t, int64(len(recs)), w.count(t, `SELECT version FROM `+pgtest.Q(w.schema, "rm_accounts")+
			` WHERE id = $1`, id), "%s", id)
	}
	for id := range archived {
		require.Zero(t, w.count(t, `SELECT count(*) FROM `+pgtest.Q(w.schema, "events")+
			` WHERE stream_id = $1 AND event_type NOT LIKE '$%'`, id), "%s's events left the hot table", id)
	}
	for id := range deleted {
		require.Zero(t, w.count(t, `SELECT count(*) FROM `+pgtest.Q(w.schema, "stream_archive")+
			` WHERE stream_id = $1 AND (payload IS NOT NULL OR metadata IS NOT NULL)`, id), "%s's data is gone", id)
	}

	incremental := w.snapshot(t, "rm")
	pgtest.Exec(t, w.pool, `UPDATE `+pgtest.Q(w.schema, "rm_accounts")+` SET balance = -1`)
	require.NoError(t, p.Rebuild(ctx))
	pgtest.Eventually(t, 20*time.Second, func() bool {
		return caughtUp(t, w, p)() && w.snapshot(t, "rm") == incremental
	}, "the rebuilt read model equals the incremental one")
	for id := range deleted {
		n, _ := calls.Load(id)
		require.Equal(t, 2, *n.(*int), "the rebuild is told of the deletion of %s again", id)
	}
}
