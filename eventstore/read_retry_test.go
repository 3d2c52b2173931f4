package eventstore_test

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// conflictCounter is a pgx tracer counting the statements that ended in a serialization failure.
type conflictCounter struct{ n atomic.Int64 }

func (c *conflictCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (c *conflictCounter) TraceQueryEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	var pgErr *pgconn.PgError
	if errors.As(data.Err, &pgErr) && pgErr.Code == "40001" {
		c.n.Add(1)
	}
}

// Under SERIALIZABLE, PostgreSQL can cancel a statement that only reads: a read of a row version written by a
// transaction that has prepared (so can no longer be cancelled itself) and that read what a transaction committed
// since then changed is the one cancelled ("Canceled on conflict out to pivot, during read"). The store's reads
// through the pool write nothing, so they read again until the writer has ended, and the caller gets the stream,
// not a serialization failure. The test builds that structure for each read, checks that a plain read of the
// stream's rows is cancelled, waits until the store's read has been cancelled at least once, then ends the
// prepared writer; the store's read must return the stream as it is.
func TestReadsThroughThePoolRetrySerializationFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	_, schema := pgtest.Migrated(t)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	tracer := &conflictCounter{}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var prepared int
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('max_prepared_transactions')::int").Scan(&prepared))
	if prepared == 0 {
		if os.Getenv(pgtest.EnvURL) != "" {
			t.Skip("the server at DATABASE_URL has max_prepared_transactions = 0")
		}
		t.Fatal("the test cluster has max_prepared_transactions = 0")
	}
	s, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	side, events := pgtest.Q(schema, "side"), pgtest.Q(schema, "events")
	pgtest.Exec(t, pool, "CREATE TABLE "+side+" (n int)")
	one := []eventstore.EventData{{Type: "e", Payload: []byte(`{}`)}}
	_, err = s.Append(ctx, eventstore.AppendRequest{StreamID: "s", StreamType: "t", Expected: eventstore.NoStream,
		Events: one})
	require.NoError(t, err)
	snapshot := func(version int64) eventstore.Snapshot {
		return eventstore.Snapshot{StreamID: "s", StreamType: "t", Version: version, Payload: []byte(`{}`)}
	}
	require.NoError(t, s.SaveSnapshot(ctx, snapshot(1)))

	// pivot builds the structure under the name gid: a transaction reads the side table, a transaction committed
	// since then writes it, and the first appends the stream's second event with its snapshot and prepares. It
	// checks that a plain read of the stream's rows is now cancelled, and returns the function that ends it.
	pivot := func(gid string, i int) (end func()) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		var n int
		require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM "+side).Scan(&n))
		pgtest.Exec(t, pool, "INSERT INTO "+side+" VALUES ($1)", i)
		_, err = s.AppendTx(ctx, tx, eventstore.AppendRequest{StreamID: "s", StreamType: "t",
			Expected: eventstore.ExpectedVersion(1), Events: one})
		require.NoError(t, err)
		require.NoError(t, s.SaveSnapshotTx(ctx, tx, snapshot(2)))
		_, err = tx.Exec(ctx, "PREPARE TRANSACTION '"+gid+"'")
		require.NoError(t, err)
		_ = tx.Rollback(ctx) // the connection is no longer in the transaction: this only returns it to the pool
		ended := false
		end = func() {
			if !ended {
				ended = true
				pgtest.Exec(t, pool, "ROLLBACK PREPARED '"+gid+"'")
			}
		}
		t.Cleanup(end) // a prepared transaction left behind would hold its locks past the test
		var v int64
		err = pool.QueryRow(ctx, "SELECT count(*) FROM "+events+" WHERE stream_id = 's'").Scan(&v)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr) && pgErr.Code == "40001",
			"%s: a plain read of the stream's rows was not cancelled (%v): the test built no conflict", gid, err)
		return end
	}

	reads := []struct {
		name string
		read func() (int64, error) // the stream's version as read
	}{
		{"Stream", func() (int64, error) {
			info, err := s.Stream(ctx, "", "s")
			return info.Version, err
		}},
		{"ReadStream", func() (int64, error) {
			recs, err := s.ReadStream(ctx, "", "s", 1)
			return int64(len(recs)), err
		}},
		{"ReadStreamPage", func() (int64, error) {
			recs, err := s.ReadStreamPage(ctx, "", "s", 1, 10)
			return int64(len(recs)), err
		}},
		{"ReadLog", func() (int64, error) {
			page, err := s.ReadLog(ctx, eventstore.LogQuery{StreamTypes: []string{"t"}})
			return int64(len(page.Records)), err
		}},
		{"LoadSnapshot", func() (int64, error) {
			snap, err := s.LoadSnapshot(ctx, "", "s")
			return snap.Version, err
		}},
	}
	for i, r := range reads {
		end := pivot(schema+"_"+r.name, i)
		before := tracer.n.Load()
		type result struct {
			v   int64
			err error
		}
		done := make(chan result, 1)
		go func() {
			v, err := r.read()
			done <- result{v, err}
		}()
		pgtest.Eventually(t, 10*time.Second, func() bool { return tracer.n.Load() >= before+1 },
			"%s: the store's read was never cancelled", r.name)
		end()
		select {
		case res := <-done:
			require.NoError(t, res.err, "%s: a read cancelled as a serialization failure reached the caller", r.name)
			require.Equal(t, int64(1), res.v, "%s: the rolled back event was read", r.name)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the read did not return once the prepared writer ended", r.name)
		}
	}

	// A writer that never ends: the read gives up after its tries, and the caller gets the serialization failure.
	end := pivot(schema+"_forever", len(reads))
	defer end()
	start := time.Now()
	_, err = s.Stream(ctx, "", "s")
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr) && pgErr.Code == "40001", "not the serialization failure: %v", err)
	require.ErrorContains(t, err, "cancelled as a transaction conflict 20 times")
	t.Logf("gave up after %v", time.Since(start))
}
