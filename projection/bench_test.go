package projection_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

// Benchmarks run on a durable cluster (fsync and synchronous_commit on): DATABASE_URL when set, else a throwaway
// one. Run them with
//
//	go test -run '^$' -bench . -benchtime 1x -v ./projection/

// catchUpEvents is 1M; STAGEHAND_BENCH_EVENTS overrides it for quicker exploratory runs.
var catchUpEvents = func() int {
	if n, err := strconv.Atoi(os.Getenv("STAGEHAND_BENCH_EVENTS")); err == nil && n > 0 {
		return n
	}
	return 1_000_000
}()

// BenchmarkCatchUp compares a projection catching up over 1M events (no-op handler: the runner's own cost,
// pages of 1,000, fenced checkpoint advance; one page per transaction, and the default of up to 10) with a raw
// ordered scan of the same table in pages of 1,000 and with the store's ReadLog, in the same run.
func BenchmarkCatchUp(b *testing.B) {
	pool, schema := pgtest.MigratedOn(b, pgtest.DurableURL(b))
	w := worldOn(b, pool, schema)
	start := time.Now()
	// Seeded in one statement: 10,000 streams of 100 events.
	pgtest.Exec(b, pool, `INSERT INTO `+pgtest.Q(schema, "events")+` (tenant_id, stream_id, stream_type, version,
			event_id, event_type, payload, metadata, occurred_at)
		SELECT '__untenanted__', 's' || (g % 10000), 'account', g / 10000 + 1, gen_random_uuid(),
			'account.deposited', '{"Amount": 1}', '{"correlation-id": "c"}', now()
		FROM generate_series(0, $1 - 1) g`, catchUpEvents)
	pgtest.Exec(b, pool, `VACUUM ANALYZE `+pgtest.Q(schema, "events"))
	b.Logf("seeded %d events in %s", catchUpEvents, time.Since(start).Round(time.Millisecond))

	// The machine is shared: run the variants in interleaved rounds and report each one's median.
	variants := []struct {
		name string
		run  func() time.Duration
	}{
		{"raw-scan", func() time.Duration { return rawScan(b, w) }},
		{"store-readlog", func() time.Duration { return readLogScan(b, w) }},
		{"projection-1-page-per-tx", func() time.Duration { return catchUp(b, w, 1) }},
		{"projection", func() time.Duration { return catchUp(b, w, 0) }},
	}
	rates := make([][]float64, len(variants))
	for range b.N {
		for round := range 3 {
			for i, v := range variants {
				rate := float64(catchUpEvents) / v.run().Seconds()
				rates[i] = append(rates[i], rate)
				b.Logf("round %d %-26s %8.0f events/s", round, v.name, rate)
			}
		}
	}
	for i, v := range variants {
		slices.Sort(rates[i])
		b.ReportMetric(rates[i][len(rates[i])/2], v.name+"-events/s")
	}
}

// rawScan reads the events table in pages of 1,000 by position with plain SQL, decoding what a Record holds.
func rawScan(b *testing.B, w world) time.Duration {
	ctx := context.Background()
	t0 := time.Now()
	var after int64
	n := 0
	for {
		rows, err := w.pool.Query(ctx, `SELECT position, tenant_id, stream_id, stream_type, version, event_id,
				event_type, event_version, payload, metadata, occurred_at, recorded_at
			FROM `+pgtest.Q(w.schema, "events")+` WHERE position > $1 ORDER BY position LIMIT 1000`, after)
		require.NoError(b, err)
		got := 0
		for rows.Next() {
			var r eventstore.Record
			var meta []byte
			require.NoError(b, rows.Scan(&r.Position, &r.Tenant, &r.StreamID, &r.StreamType, &r.Version,
				&r.EventID, &r.Type, &r.TypeVersion, &r.Payload, &meta, &r.OccurredAt, &r.RecordedAt))
			require.NoError(b, json.Unmarshal(meta, &r.Metadata))
			after = r.Position
			got++
		}
		require.NoError(b, rows.Err())
		n += got
		if got == 0 {
			break
		}
	}
	require.Equal(b, catchUpEvents, n)
	return time.Since(t0)
}

// readLogScan pages through the log with the store's gap-safe ReadLog, pages of 1,000.
func readLogScan(b *testing.B, w world) time.Duration {
	ctx := context.Background()
	t0 := time.Now()
	var after int64
	n := 0
	for {
		page, err := w.store.ReadLog(ctx, eventstore.LogQuery{After: after, Limit: 1000})
		require.NoError(b, err)
		if page.Last == after {
			break
		}
		n += len(page.Records)
		after = page.Last
	}
	require.Equal(b, catchUpEvents, n)
	return time.Since(t0)
}

var benchRuns int

// catchUp runs a new projection (no-op handler: the runner's own cost) from the start of the log to its head,
// with pages of 1,000 and pagesPerTx pages per transaction (0: the default).
func catchUp(b *testing.B, w world, pagesPerTx int) time.Duration {
	ctx := context.Background()
	benchRuns++
	var n int
	h := projection.HandlerFunc(func(context.Context, pgx.Tx, projection.Event) error { n++; return nil })
	p, err := projection.New(w.pool, w.store, h, &projection.Config{Name: fmt.Sprint("bench-", benchRuns),
		Schema: w.schema, BatchSize: 1000, PagesPerTx: pagesPerTx})
	require.NoError(b, err)
	t0 := time.Now()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	for { // poll the checkpoint sparingly: the measurement shares two cores with the database
		var pos int64
		require.NoError(b, w.pool.QueryRow(ctx, `SELECT coalesce(max(position), 0) FROM `+
			pgtest.Q(w.schema, "checkpoints")+` WHERE name = $1`, p.Name()).Scan(&pos))
		if pos == int64(catchUpEvents) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(t0)
	cancel()
	require.NoError(b, <-done)
	require.Equal(b, catchUpEvents, n)
	return elapsed
}

// BenchmarkLiveLatency measures append commit -> handler latency with a 1s polling interval (notifications do
// the work), alone and while an unrelated transaction that writes no events is held open for 5s.
func BenchmarkLiveLatency(b *testing.B) {
	pool, schema := pgtest.MigratedOn(b, pgtest.DurableURL(b))
	w := worldOn(b, pool, schema)
	ctx := context.Background()
	var mu sync.Mutex
	handled := map[int64]time.Time{}
	h := projection.HandlerFunc(func(_ context.Context, tx pgx.Tx, e projection.Event) error {
		mu.Lock()
		handled[e.Position] = time.Now()
		mu.Unlock()
		return nil
	})
	p, err := projection.New(pool, w.store, h, &projection.Config{Name: "live", Schema: schema,
		PollInterval: time.Second})
	require.NoError(b, err)
	stop := start(b, p)
	defer func() { require.NoError(b, stop()) }()
	pgtest.Eventually(b, 10*time.Second, func() bool { return status(b, p).Owner != "" }, "running")
	pgtest.Exec(b, pool, `CREATE TABLE `+pgtest.Q(schema, "unrelated")+` (n int)`)

	measure := func(b *testing.B, stream string, d time.Duration) {
		committed := map[int64]time.Time{}
		version := 0
		for t0 := time.Now(); time.Since(t0) < d; {
			res, err := w.store.Append(ctx, w.request(b, stream, eventstore.ExpectedVersion(version),
				Deposited{Amount: 1}))
			require.NoError(b, err)
			committed[res.Records[0].Position] = time.Now()
			version++
			time.Sleep(10 * time.Millisecond)
		}
		var lat []time.Duration
		pgtest.Eventually(b, 30*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			for pos := range committed {
				if _, ok := handled[pos]; !ok {
					return false
				}
			}
			return true
		}, "all handled")
		mu.Lock()
		for pos, c := range committed {
			lat = append(lat, handled[pos].Sub(c))
		}
		mu.Unlock()
		slices.Sort(lat)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
		b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
		b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
		b.ReportMetric(float64(len(lat)), "events")
	}

	b.Run("alone", func(b *testing.B) {
		for i := range b.N {
			measure(b, fmt.Sprint("alone-", i), 5*time.Second)
		}
	})
	b.Run("unrelated-tx-open-5s", func(b *testing.B) {
		for i := range b.N {
			tx, err := pool.Begin(ctx)
			require.NoError(b, err)
			_, err = tx.Exec(ctx, `INSERT INTO `+pgtest.Q(schema, "unrelated")+` VALUES (1)`)
			require.NoError(b, err) // it has an xid now, and holds back pg_snapshot_xmin for everyone
			measure(b, fmt.Sprint("with-tx-", i), 5*time.Second)
			require.NoError(b, tx.Rollback(ctx))
		}
	})
}
