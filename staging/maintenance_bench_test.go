package staging

// The save's latency in the second after the relay's maintenance (a vacuum of the outbox, by the relay or by
// autovacuum, an analyze, a cleanup of the sent ledger) against its latency elsewhere, in the same run: Transactional
// saves of one event and one message, paced at half the rate the same clients reach unpaced, beside a relay that
// publishes them and vacuums every 2,000 moved rows, and a cleanup every 3 s, on a durable cluster:
//
//	go test ./staging -run '^$' -bench MaintenanceSpikes -benchtime 1x

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

func BenchmarkMaintenanceSpikes(b *testing.B) {
	e := benchEnv(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, _ := e.repo(e.store, &Config{Strategy: Transactional, Outbox: e.outbox})
	benchRelay(b, e, &outbox.RelayConfig{VacuumInterval: 500 * time.Millisecond, VacuumAfterRows: 2000})

	// Maintenance events: when a vacuum or an analyze of the outbox ends (that is when it invalidates every
	// connection's plans), and when a cleanup runs.
	var mu sync.Mutex
	var events []time.Time
	mark := func() { mu.Lock(); events = append(events, time.Now()); mu.Unlock() }
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		var last int64 = -1
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			var n int64
			if err := e.pool.QueryRow(ctx, `SELECT vacuum_count + autovacuum_count + analyze_count + autoanalyze_count
				FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'outbox'`, e.schema).Scan(&n); err != nil {
				continue
			}
			if last >= 0 && n != last {
				mark()
			}
			last = n
		}
	}()
	go func() {
		defer wg.Done()
		t := time.NewTicker(3 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			mark()
			_, _ = e.outbox.AllTenants().CleanupSent(ctx, 0, 1000)
		}
	}()

	const clients = 16
	save := func(o *Order) (time.Duration, error) {
		start := time.Now()
		aggregate.Raise(o, OrderPlaced{Total: 1})
		err := r.Save(ctx, o)
		return time.Since(start), err
	}
	newOrders := func() []*Order {
		list := make([]*Order, clients)
		for i := range list {
			list[i] = r.New(fmt.Sprintf("m-%d", benchSeq.Add(1)))
		}
		return list
	}
	// Unpaced first, for the rate the clients reach.
	var done atomic.Int64
	unpaced := newOrders()
	var cw sync.WaitGroup
	stop := time.Now().Add(3 * time.Second)
	for c := range clients {
		cw.Add(1)
		go func() {
			defer cw.Done()
			for time.Now().Before(stop) {
				if _, err := save(unpaced[c]); err != nil {
					b.Error(err)
					return
				}
				done.Add(1)
			}
		}()
	}
	cw.Wait()
	max := float64(done.Load()) / 3
	rate := max / 2
	b.ResetTimer()

	// Paced at half of it: each client starts its saves at evenly spaced due times, latency from the due time.
	type sample struct {
		at  time.Time
		lat time.Duration
	}
	var smu sync.Mutex
	var samples []sample
	paced := newOrders()
	dur := 20 * time.Second
	begin := time.Now()
	interval := time.Duration(float64(time.Second) * clients / rate)
	for c := range clients {
		cw.Add(1)
		go func() {
			defer cw.Done()
			due := begin.Add(time.Duration(c) * interval / clients)
			for due.Before(begin.Add(dur)) {
				time.Sleep(time.Until(due))
				if _, err := save(paced[c]); err != nil {
					b.Error(err)
					return
				}
				smu.Lock()
				samples = append(samples, sample{at: due, lat: time.Since(due)})
				smu.Unlock()
				due = due.Add(interval)
			}
		}()
	}
	cw.Wait()
	b.StopTimer()
	cancel()
	wg.Wait()

	mu.Lock()
	ev := slices.Clone(events)
	mu.Unlock()
	var after, elsewhere []time.Duration
	for _, s := range samples {
		near := false
		for _, t := range ev {
			if !s.at.Before(t) && s.at.Sub(t) < time.Second {
				near = true
				break
			}
		}
		if near {
			after = append(after, s.lat)
		} else {
			elsewhere = append(elsewhere, s.lat)
		}
	}
	p := func(ds []time.Duration, q float64) time.Duration {
		if len(ds) == 0 {
			return 0
		}
		slices.Sort(ds)
		return ds[min(len(ds)-1, int(float64(len(ds))*q))]
	}
	pa, pe := p(after, 0.99), p(elsewhere, 0.99)
	ratio := 0.0
	if pe > 0 {
		ratio = float64(pa) / float64(pe)
	}
	b.ReportMetric(rate, "paced-saves/s")
	b.ReportMetric(float64(pa.Microseconds())/1000, "p99-after-ms")
	b.ReportMetric(float64(pe.Microseconds())/1000, "p99-elsewhere-ms")
	b.ReportMetric(ratio, "ratio")
	fmt.Fprintf(os.Stdout, "MAINTENANCE: unpaced %.0f saves/s, paced at %.0f saves/s for %s; %d maintenance events; "+
		"save p50/p99 in the second after maintenance %.1f/%.1f ms (%d saves), elsewhere %.1f/%.1f ms (%d saves); "+
		"p99 ratio %.2fx\n", max, rate, dur, len(ev), ms(p(after, 0.5)), ms(pa), len(after), ms(p(elsewhere, 0.5)),
		ms(pe), len(elsewhere), ratio)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// benchRelay runs, until the benchmark ends, a relay of e's outbox on a pool of its own (as a relay process would
// have) that publishes through a Watermill router to a publisher that counts the messages.
func benchRelay(b *testing.B, e *env, cfg *outbox.RelayConfig) *countingPublisher {
	b.Helper()
	relayOutbox, err := outbox.New(pgtest.PoolFor(b, pgtest.DurableURL(b)), &outbox.Config{Schema: e.schema})
	if err != nil {
		b.Fatal(err)
	}
	relay, err := relayOutbox.NewRelay(cfg)
	if err != nil {
		b.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, nil)
	if err != nil {
		b.Fatal(err)
	}
	pub := &countingPublisher{}
	relay.AddToRouter(router, pub, nil)
	ctx, cancel := context.WithCancel(context.Background())
	routed := make(chan error, 1)
	go func() { routed <- router.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		if err := <-routed; err != nil {
			b.Errorf("relay's router: %v", err)
		}
		if err := relay.Close(); err != nil {
			b.Errorf("relay: close: %v", err)
		}
		if pub.n.Load() == 0 {
			b.Error("the relay published nothing: the benchmark measured saves without one")
		}
	})
	<-router.Running()
	return pub
}
