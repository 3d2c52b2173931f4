package console

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// TestSampleCostAtScale times the sampler at 1,000,000 inbox entries and 1,000,000 sent-ledger entries, spread over
// the last day (the fixture is written with generate_series and analyzed). It reports the median and slowest of 20
// samples. Behind STAGEHAND_CONSOLE_SCALE=full:
//
//	STAGEHAND_CONSOLE_SCALE=full go test ./console -run SampleCostAtScale -v
func TestSampleCostAtScale(t *testing.T) {
	if os.Getenv("STAGEHAND_CONSOLE_SCALE") != "full" {
		t.Skip("set STAGEHAND_CONSOLE_SCALE=full to seed 1,000,000 inbox and sent-ledger rows")
	}
	pool, schema := pgtest.Migrated(t)
	ctx := context.Background()
	seedScale(t, pool.Exec, schema, 1_000_000)
	c, err := New(&Config{Pool: pool, Schema: schema, SampleInterval: time.Second})
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	var ds []time.Duration
	for range 20 {
		start := time.Now()
		c.samples.sample(ctx)
		ds = append(ds, time.Since(start))
		require.Empty(t, c.samples.snapshot().err)
		time.Sleep(200 * time.Millisecond)
	}
	slices.Sort(ds)
	t.Logf("per sample at 1M inbox + 1M sent rows: median %s, slowest %s (20 samples)", ds[len(ds)/2], ds[len(ds)-1])
}

// seedScale writes n sent-ledger entries and n inbox entries, one per message, 86 ms apart over the last day.
func seedScale(t *testing.T, exec func(context.Context, string, ...any) (pgconn.CommandTag, error), schema string, n int) {
	t.Helper()
	ctx := context.Background()
	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	step := (24 * time.Hour / time.Duration(n)).String()
	now := time.Now().UTC()
	for _, stmt := range []string{
		`INSERT INTO ` + q("outbox_sent") + ` (message_id, topic, tenant_id, message_type, source_position, attempts,
			created_at, sent_at)
		SELECT 'm-' || i, 'shop.orders.' || (i % 5), 't' || (i % 50), 'shop.v1.OrderPlaced', i, 1,
			$1::timestamptz - interval '1 day' + i * $3::interval,
			$1::timestamptz - interval '1 day' + i * $3::interval + interval '5 ms'
		FROM generate_series(1, $2::int) i`,
		`INSERT INTO ` + q("inbox") + ` (message_id, handler, tenant_id, message_type, processed_at)
		SELECT 'm-' || i, 'handler-' || (i % 3), 't' || (i % 50), 'shop.v1.OrderPlaced',
			$1::timestamptz - interval '1 day' + i * $3::interval + interval '9 ms'
		FROM generate_series(1, $2::int) i`,
	} {
		_, err := exec(ctx, stmt, now, n, step)
		require.NoError(t, err)
	}
	for _, name := range []string{"outbox_sent", "inbox"} {
		_, err := exec(ctx, `VACUUM ANALYZE `+q(name))
		require.NoError(t, err)
	}
}

// The sampler's count of a window reads the window's rows only: on a ledger and an inbox of 70,000 entries each
// (several thousand pages), the plan of a ten-second window reads neither table from end to end, and the heap
// pages it visits in each are bounded by the time index's block ranges around the window (three ranges of 128
// pages at most), not by the table's size. Read with EXPLAIN (ANALYZE, BUFFERS), not timed.
func TestSampleWindowReadsOnlyItsWindow(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	ctx := context.Background()
	seedScale(t, pool.Exec, schema, 70_000)
	c, err := New(&Config{Pool: pool, Schema: schema})
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	var pages = map[string]int64{}
	for _, table := range []string{"outbox_sent", "inbox"} {
		var n int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT relpages FROM pg_class WHERE oid = $1::regclass`,
			pgx.Identifier{schema, table}.Sanitize()).Scan(&n))
		require.Greater(t, n, int64(600), "the fixture must be large enough for the bound to mean something")
		pages[table] = n
	}
	to := time.Now().Add(-time.Hour)
	var plan []map[string]any
	require.NoError(t, pool.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+c.q.sampleWindow,
		pgx.QueryExecModeExec, to.Add(-10*time.Second), to, "10 seconds", nil).Scan(&plan))
	visited := map[string]float64{}
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if rel, ok := n["Relation Name"].(string); ok && (rel == "outbox_sent" || rel == "inbox") {
			require.NotEqual(t, "Seq Scan", n["Node Type"], "%s is read from end to end", rel)
			if n["Node Type"] == "Bitmap Heap Scan" {
				visited[rel] += num(n["Exact Heap Blocks"]) + num(n["Lossy Heap Blocks"])
			}
		}
		if kids, ok := n["Plans"].([]any); ok {
			for _, k := range kids {
				walk(k.(map[string]any))
			}
		}
	}
	walk(plan[0]["Plan"].(map[string]any))
	for _, table := range []string{"outbox_sent", "inbox"} {
		require.Contains(t, visited, table, "the window is read through the time index of %s", table)
		require.LessOrEqual(t, visited[table], float64(3*128), "%s: %v heap pages visited of %d", table,
			visited[table], pages[table])
	}
	t.Logf("heap pages visited: %v (tables: %v pages)", visited, pages)
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}
