package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/internal/lease"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// The measurements behind the lease defaults (TTL 5s, renewed every third, contended every second):
//
//	go test ./internal/lease -run '^$' -bench 'Renew|Takeover' -benchtime 1x
//
// BenchmarkRenewCost is the price of holding a lease: one Renew against the round trip of SELECT 1 in the same
// run. BenchmarkRenewUnderLoad is what bounds the TTL from below: the renewal latency while the machine's cores
// are saturated by writers on the same database (a holder loses its lease when no renewal succeeds for a TTL, so
// the TTL must stay well above the worst renewal). BenchmarkTakeover is what a shorter TTL buys: the time from a
// holder's last renewal to a contender's first work after the holder crashed (stopped renewing, released nothing).

func BenchmarkRenewCost(b *testing.B) {
	pool, schema := pgtest.Migrated(b)
	ctx := context.Background()
	m, err := lease.New(pool, &lease.Config{Schema: schema, Owner: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	l, ok, err := m.TryAcquire(ctx, "cost")
	if err != nil || !ok {
		b.Fatalf("acquire: %v %v", ok, err)
	}
	const n = 2000
	raw := timeEach(b, n, func() error { return pool.QueryRow(ctx, "SELECT 1").Scan(new(int)) })
	renew := timeEach(b, n, func() error { l, err = m.Renew(ctx, l); return err })
	b.ReportMetric(float64(median(raw).Microseconds()), "select1-µs")
	b.ReportMetric(float64(median(renew).Microseconds()), "renew-µs")
	b.ReportMetric(float64(median(renew))/float64(median(raw)), "renew/select1")
}

func BenchmarkRenewUnderLoad(b *testing.B) {
	pool, schema := pgtest.Migrated(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "load"}.Sanitize()+
		` (id bigserial PRIMARY KEY, payload text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	m, err := lease.New(pool, &lease.Config{Schema: schema, Owner: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	l, ok, err := m.TryAcquire(ctx, "load")
	if err != nil || !ok {
		b.Fatalf("acquire: %v %v", ok, err)
	}
	// Writers: more than the pool's connections, so the renewal also queues for a connection, as it does in a
	// busy process.
	writers := 4 * int(pool.Config().MaxConns)
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for ctx.Err() == nil {
				_, _ = pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "load"}.Sanitize()+
					` (payload) SELECT repeat('x', 200) FROM generate_series(1, 20)`)
			}
		})
	}
	var lat []time.Duration
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		start := time.Now()
		if l, err = m.Renew(ctx, l); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	slices.Sort(lat)
	b.ReportMetric(float64(len(lat)), "renewals")
	b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
}

func BenchmarkTakeover(b *testing.B) {
	for _, ttl := range []time.Duration{time.Second, 5 * time.Second, 15 * time.Second} {
		b.Run(fmt.Sprintf("TTL=%s", ttl), func(b *testing.B) {
			pool, schema := pgtest.Migrated(b)
			ctx := context.Background()
			cfg := func(owner string) *lease.Config {
				return &lease.Config{Schema: schema, Owner: owner, TTL: ttl}
			}
			dead, err := lease.New(pool, cfg("crashed"))
			if err != nil {
				b.Fatal(err)
			}
			next, err := lease.New(pool, cfg("successor"))
			if err != nil {
				b.Fatal(err)
			}
			var total time.Duration
			for i := range b.N {
				name := fmt.Sprintf("takeover-%d", i)
				if _, ok, err := dead.TryAcquire(ctx, name); err != nil || !ok {
					b.Fatalf("acquire: %v %v", ok, err)
				}
				crashed := time.Now() // the holder's last renewal: nothing renews or releases it from here
				rctx, stop := context.WithCancel(ctx)
				var took time.Duration
				err := next.Run(rctx, name, func(context.Context, lease.Lease) error {
					took = time.Since(crashed)
					stop()
					return nil
				})
				stop()
				if err != nil && !errors.Is(err, context.Canceled) {
					b.Fatal(err)
				}
				total += took
			}
			b.ReportMetric(total.Seconds()/float64(b.N), "takeover-s")
			b.ReportMetric(3/ttl.Seconds(), "renewals/s")
		})
	}
}

func timeEach(b *testing.B, n int, f func() error) []time.Duration {
	b.Helper()
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		out = append(out, time.Since(start))
	}
	return out
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
