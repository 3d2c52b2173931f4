package scalebench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// rig is one migrated schema with the raw tables, an outbox to stage into and a fleet of worker processes.
type rig struct {
	tb         testing.TB
	url        string
	dataDir    string // the cluster's, when this run started it (for its CPU time); "" otherwise
	pool       *pgxpool.Pool
	schema     string
	ob         *outbox.Outbox
	fleet      *Fleet
	partitions int
}

type rigConfig struct {
	url, dataDir string
	partitions   int
	ttl          time.Duration // LeaderTTL of relays, LeaseTTL of projections
	batch        int
}

func newRig(tb testing.TB, c rigConfig) *rig {
	tb.Helper()
	pool, schema := pgtest.MigratedOn(tb, c.url)
	ctx := context.Background()
	require.NoError(tb, createRawTables(ctx, pool, schema))
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = ob.Close() })
	f := &Fleet{
		Command: []string{os.Args[0], "-test.run=^$", "-test.bench=^$"},
		Env: []string{envDB + "=" + c.url, envSchema + "=" + schema,
			envPartitions + "=" + strconv.Itoa(c.partitions), envTTL + "=" + c.ttl.String(),
			envBatch + "=" + strconv.Itoa(c.batch)},
	}
	tb.Cleanup(f.Close) // registered after the schema's drop, so it runs first
	return &rig{tb: tb, url: c.url, dataDir: c.dataDir, pool: pool, schema: schema, ob: ob, fleet: f,
		partitions: c.partitions}
}

// start starts n workers of role, slots prefix1..prefixN; the raw roles get partitions (claim loops) dealt out
// round robin.
func (r *rig) start(role, prefix string, n int) []*Worker {
	r.tb.Helper()
	ws := make([]*Worker, n)
	for i := range ws {
		var own []string
		for p := i; p < r.partitions; p += n {
			own = append(own, strconv.Itoa(p))
		}
		w, err := r.fleet.Start(role, fmt.Sprintf("%s%d", prefix, i+1), envOwn+"="+strings.Join(own, ","))
		require.NoError(r.tb, err)
		ws[i] = w
	}
	require.NoError(r.tb, WaitReady(2*time.Minute, ws...))
	return ws
}

// held is who holds each partition's lease now (partition -> worker slot), for the relays' partition leases
// ("scale/<p>") or, with projection set, that projection's ("logfollow:<name>#<p>/<n>").
func (r *rig) held(ctx context.Context, projection string) (map[int]string, error) {
	prefix := leaderElection + "/"
	if projection != "" {
		prefix = "logfollow:" + projection + "#"
	}
	rows, err := r.pool.Query(ctx, `/* scalebench */ SELECT name, owner FROM `+qualify(r.schema, "leases")+`
		WHERE starts_with(name, $1) AND expires_at > now()`, prefix)
	if err != nil {
		return nil, fmt.Errorf("scalebench: leases: %w", err)
	}
	defer rows.Close()
	out := map[int]string{}
	for rows.Next() {
		var name, owner string
		if err := rows.Scan(&name, &owner); err != nil {
			return nil, fmt.Errorf("scalebench: leases: %w", err)
		}
		rest := strings.TrimPrefix(name, prefix)
		rest, _, _ = strings.Cut(rest, "/") // "<p>/<n>" for a projection partition
		p, err := strconv.Atoi(rest)
		if err != nil {
			continue // a membership slot ("scale/members/<slot>")
		}
		slot, _, _ := strings.Cut(owner, "/")
		slot = strings.TrimPrefix(strings.TrimPrefix(slot, "scale-"), "proj-")
		out[p] = slot
	}
	return out, rows.Err()
}

// spread is how many partitions each slot holds.
func spread(held map[int]string) map[string]int {
	out := map[string]int{}
	for _, s := range held {
		out[s]++
	}
	return out
}

// even reports whether every partition is held and the live slots hold their fair shares: ceil(n/len(slots)) at
// most each, and at least one each.
func even(held map[int]string, n int, slots ...string) bool {
	if len(held) != n {
		return false
	}
	share := (n + len(slots) - 1) / len(slots)
	sp := spread(held)
	total := 0
	for _, s := range slots {
		if sp[s] < 1 || sp[s] > share {
			return false
		}
		total += sp[s]
	}
	return total == n
}

// waitFor polls cond every 10 ms until it holds, returning how long that took, or fails after timeout.
func (r *rig) waitFor(timeout time.Duration, what string, cond func() (bool, error), ws ...*Worker) time.Duration {
	r.tb.Helper()
	start := time.Now()
	for {
		ok, err := cond()
		require.NoError(r.tb, err)
		if ok {
			return time.Since(start)
		}
		require.NoError(r.tb, r.fleet.Failed(ws...))
		if time.Since(start) > timeout {
			r.tb.Fatalf("scalebench: %s: not within %s", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// evenly waits until the relays' partitions are evenly held by ws.
func (r *rig) evenly(timeout time.Duration, projection string, ws ...*Worker) time.Duration {
	slots := make([]string, len(ws))
	for i, w := range ws {
		slots[i] = w.Slot
	}
	return r.waitFor(timeout, "partitions evenly held by "+strings.Join(slots, ","), func() (bool, error) {
		h, err := r.held(context.Background(), projection)
		return err == nil && even(h, r.partitions, slots...), err
	}, ws...)
}

// empty reports whether table (of the rig's schema) has no rows.
func (r *rig) empty(table string) func() (bool, error) {
	q := `/* scalebench */ SELECT NOT EXISTS (SELECT 1 FROM ` + qualify(r.schema, table) + `)`
	return func() (bool, error) {
		var ok bool
		err := r.pool.QueryRow(context.Background(), q).Scan(&ok)
		return ok, err
	}
}

// exec runs statements that are part of the benchmark's bookkeeping.
func (r *rig) exec(sql string, args ...any) {
	r.tb.Helper()
	_, err := r.pool.Exec(context.Background(), "/* scalebench */ "+sql, args...)
	require.NoError(r.tb, err)
}

func (r *rig) q(table string) string { return qualify(r.schema, table) }
