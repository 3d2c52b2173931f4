package outbox_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// partitionOf computes the partition of a hashed value the way the relay does (a range of PostgreSQL's hashtext).
func (e *env) partitionOf(value string, partitions int) int {
	h := pgtest.Count(e.t, e.pool, `SELECT hashtext($1)`, value)
	return int((h - math.MinInt32) * int64(partitions) >> 32)
}

// Partitioned by key, with several workers per partition and a destination rejecting 10% of publishes at random:
// every message is published and the first publications of each key follow its staging order.
func TestPartitionedRelayKeepsPerKeyOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	want := stageKeyed(t, e, "orders", 2000, 40)
	b := newBroker()
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(7, 7))
	b.setFail(func(*message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if rng.Float64() < 0.1 {
			return errRejected
		}
		return nil
	})
	var claims atomic.Int64
	r := e.relay(func(c *outbox.RelayConfig) {
		c.Partitions = 4
		c.MaxDegreeOfParallelism = 2
		c.BatchSize = 50
		c.MaxRetryCount = outbox.Retries(1000)
		c.RetryDelay = 5 * time.Millisecond
		c.MaxRetryDelay = 20 * time.Millisecond
		c.Hooks.Claimed = func(_ context.Context, rows int, _ time.Duration, _ error) {
			if rows > 0 {
				claims.Add(1)
			}
		}
	})
	runRouter(t, r, b, nil)
	pgtest.Eventually(t, 15*time.Second, func() bool { return b.distinct() == 2000 && e.count("outbox") == 0 },
		"not every message published and marked")
	got := firstOrder(b.snapshot())
	for key, ids := range want {
		require.Equal(t, ids, got[key], "first publications of %s out of staging order", key)
	}
	// Four loops claiming separately: no claim can take rows of another partition, so there are at least as many
	// claims as partitions with messages.
	require.GreaterOrEqual(t, claims.Load(), int64(4))
}

// Partitioned by tenant: while one tenant's destination is unreachable, its partition backs off alone and the other
// partitions deliver every message of theirs. Once the destination is back, its messages follow, no attempt counted.
func TestPartitionWithAnUnreachableDestinationDoesNotStallTheOthers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const partitions = 4
	bad := "tenant-bad"
	badPart := e.partitionOf(bad, partitions)
	var good []string
	for i := 0; len(good) < 6; i++ {
		tn := fmt.Sprintf("tenant-%d", i)
		if e.partitionOf(tn, partitions) != badPart {
			good = append(good, tn)
		}
	}
	var batch []outbox.Message
	for i := range 300 {
		tn := good[i%len(good)]
		batch = append(batch, outbox.Message{ID: fmt.Sprintf("g-%03d", i), Topic: "orders", Tenant: tn,
			PartitionKey: tn})
	}
	for i := range 30 {
		batch = append(batch, outbox.Message{ID: fmt.Sprintf("b-%03d", i), Topic: "orders", Tenant: bad,
			PartitionKey: bad})
	}
	_, err := e.ob.Stage(context.Background(), batch...)
	require.NoError(t, err)

	var down atomic.Bool
	down.Store(true)
	var unreachable atomic.Int64
	b := newBroker()
	b.setFail(func(m *message.Message) error {
		if m.Metadata.Get(stagehand.HeaderTenantID) == bad && down.Load() {
			return fmt.Errorf("dial tcp 10.0.0.1:4222: %w", outbox.ErrBrokerUnavailable)
		}
		return nil
	})
	r := e.relay(func(c *outbox.RelayConfig) {
		c.Partitions = partitions
		c.PartitionBy = outbox.PartitionByTenant
		c.BrokerBackoff = 500 * time.Millisecond // an unpartitioned relay would pause on every bad message
		c.MaxBrokerBackoff = time.Second
		c.Hooks.Delivered = func(_ context.Context, _ outbox.Delivery, o outbox.Outcome, _ error, _ time.Duration) {
			if o == outbox.Unreachable {
				unreachable.Add(1)
			}
		}
	})
	runRouter(t, r, b, nil)
	// The healthy partitions can finish before the bad one's first attempt: wait for both.
	pgtest.Eventually(t, 10*time.Second, func() bool { return b.distinct() == 300 && unreachable.Load() > 0 },
		"the healthy partitions did not deliver while one destination was unreachable")
	require.True(t, down.Load())
	for _, p := range b.snapshot() {
		require.NotEqual(t, bad, p.meta.Get(stagehand.HeaderTenantID))
	}
	require.Equal(t, int64(30), e.count("outbox", "tenant_id = 'tenant-bad' AND attempts = 0"),
		"an unreachable broker counts no attempt")

	down.Store(false)
	pgtest.Eventually(t, 10*time.Second, func() bool { return b.distinct() == 330 },
		"the recovered destination did not get its messages")
}

// Several processes share a partitioned, leader-elected outbox through one lease per partition: the first relay
// leads every partition, hands part of them over when a second relay joins (each leads its fair share), and when a
// relay stops the other takes its partitions over and delivers what they hold, keeping per-key order throughout.
func TestRelaysSplitAndTakeOverPartitions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := func(c *outbox.RelayConfig) {
		c.LeaderElection = "orders-relay"
		// Far above every wait below: a join and a graceful stop hand partitions over by release, at once, never
		// by a lease running out.
		c.LeaderTTL = time.Minute
		c.Partitions = 4
	}
	// ledBy returns, per owner, how many partition leases it holds now.
	ledBy := func() map[string]int {
		rows, err := e.pool.Query(context.Background(), `SELECT owner, count(*) FROM `+pgtest.Q(e.schema, "leases")+
			` WHERE name ~ '^orders-relay/[0-9]+$' AND expires_at > now() GROUP BY owner`)
		require.NoError(t, err)
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var owner string
			var n int
			require.NoError(t, rows.Scan(&owner, &n))
			out[owner] = n
		}
		require.NoError(t, rows.Err())
		return out
	}
	split := func(want ...int) func() bool {
		return func() bool {
			got := ledBy()
			if len(got) != len(want) {
				return false
			}
			for _, n := range want {
				found := false
				for owner, m := range got {
					if m == n {
						delete(got, owner)
						found = true
						break
					}
				}
				if !found {
					return false
				}
			}
			return true
		}
	}
	b := newBroker()
	first := setupOn(t, e.pool, e.schema, nil).relay(cfg)
	stopFirst := runRouterStoppable(t, first, b)
	pgtest.Eventually(t, 10*time.Second, split(4), "the first relay did not lead every partition")
	second := setupOn(t, e.pool, e.schema, nil).relay(cfg)
	runRouter(t, second, b, nil)
	pgtest.Eventually(t, 10*time.Second, split(2, 2), "the relays did not split the partitions: %v", ledBy())

	want := stageKeyed(t, e, "orders", 300, 30)
	e.ob.Notify()
	pgtest.Eventually(t, 10*time.Second, func() bool { return b.distinct() == 300 }, "not every message published")

	stopFirst() // releases its leases: the second relay takes every partition over
	pgtest.Eventually(t, 10*time.Second, split(4), "the second relay did not take every partition over")
	more := stageKeyed(t, e, "later", 90, 9)
	pgtest.Eventually(t, 10*time.Second, func() bool { return b.distinct() == 390 },
		"the partitions of the stopped relay were not taken over")
	got := firstOrder(b.snapshot())
	for key, ids := range want {
		require.Equal(t, append(ids, more[key]...), got[key])
	}
}

// runRouterStoppable is runRouter with a function that stops the router and closes the relay early.
func runRouterStoppable(t *testing.T, r *outbox.Relay, pub message.Publisher) func() {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, nil)
	require.NoError(t, err)
	r.AddToRouter(router, pub, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	<-router.Running()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			_ = router.Close()
			<-done
			_ = r.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}

// A partitioned, leader-elected relay ends every goroutine with its owner: partition loops, leadership terms (one
// ended by a takeover), lease renewers, the shared listener and drains. Closing it releases its leader leases. Not
// parallel: the leak check sees the whole process.
func TestPartitionedLeaderRelayLeavesNoGoroutines(t *testing.T) {
	pgtest.CheckLeaks(t)
	e := setup(t)
	ctx := context.Background()
	r := e.relay(func(c *outbox.RelayConfig) {
		c.LeaderElection = "orders-relay"
		c.LeaderTTL = time.Second
		c.Partitions = 3
	})
	b := newBroker()
	router := runRouter(t, r, b, nil)
	_, err := e.ob.Stage(ctx, msgs("t", 30, func(i int) string { return fmt.Sprint(i % 5) })...)
	require.NoError(t, err)
	pgtest.Eventually(t, 10*time.Second, func() bool { return b.distinct() == 30 && e.count("outbox") == 0 },
		"not delivered")

	// Partition 1 changes hands behind the relay's back: its term ends and it contends again.
	leases := pgtest.Q(e.schema, "leases")
	pgtest.Exec(t, e.pool, `UPDATE `+leases+` SET owner = 'intruder', token = token + 1 WHERE name = 'orders-relay/1'`)
	pgtest.Exec(t, e.pool, `UPDATE `+leases+` SET expires_at = now() WHERE name = 'orders-relay/1'`)
	pgtest.Eventually(t, 10*time.Second, func() bool {
		return pgtest.Count(t, e.pool, `SELECT count(*) FROM `+leases+
			` WHERE name = 'orders-relay/1' AND owner <> 'intruder' AND expires_at > now()`) == 1
	}, "the relay did not lead partition 1 again")
	require.NoError(t, router.Close())

	_, err = e.ob.Stage(ctx, outbox.Message{ID: "late", Topic: "t"})
	require.NoError(t, err)
	res, err := r.Drain(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 1, res.Published)
	require.NoError(t, r.Close())
	require.Zero(t, pgtest.Count(t, e.pool, `SELECT count(*) FROM `+leases+` WHERE expires_at > now()`),
		"closing released every leader lease")
}

// BenchmarkRelayModes is the drain rate (messages/s, Drain to a no-op publisher, batch 100, 4 workers per loop) of a
// committed backlog over 200 keys, unfenced and fenced, with one claim loop and with 4 partitions, on the durable
// cluster. The modes take turns in rounds (rotating their order), so drift in the machine's load falls on all.
//
//	go test ./outbox -run '^$' -bench RelayModes -benchtime 3x
func BenchmarkRelayModes(b *testing.B) {
	url := pgtest.DurableURL(b)
	modes := []struct {
		name string
		mod  func(*outbox.RelayConfig)
	}{
		{"plain", func(*outbox.RelayConfig) {}},
		{"fenced", func(c *outbox.RelayConfig) { c.LeaderElection = "bench" }},
		{"partitions=4", func(c *outbox.RelayConfig) { c.Partitions = 4 }},
		{"partitions=4-fenced", func(c *outbox.RelayConfig) { c.Partitions, c.LeaderElection = 4, "bench" }},
	}
	const n = 20000
	envs := make([]*env, len(modes))
	relays := make([]*outbox.Relay, len(modes))
	for i, m := range modes {
		pool, schema := pgtest.MigratedOn(b, url)
		envs[i] = setupOn(b, pool, schema, nil)
		relays[i] = envs[i].relay(func(c *outbox.RelayConfig) {
			c.BatchSize, c.MaxDegreeOfParallelism = 100, 4
			m.mod(c)
		})
	}
	spent := make([]time.Duration, len(modes))
	rounds := 3 * b.N
	for round := range rounds {
		for j := range modes {
			i := (j + round) % len(modes)
			var batch []outbox.Message
			for k := range n {
				batch = append(batch, outbox.Message{ID: fmt.Sprintf("%d-%d", round, k), Topic: "t",
					PartitionKey: fmt.Sprintf("k%d", k%200)})
				if len(batch) == 1000 {
					_, err := envs[i].ob.Stage(context.Background(), batch...)
					require.NoError(b, err)
					batch = nil
				}
			}
			start := time.Now()
			for done := 0; done < n; {
				res, err := relays[i].Drain(context.Background(), noopPublisher{})
				require.NoError(b, err)
				done += res.Published
			}
			spent[i] += time.Since(start)
		}
	}
	for i, m := range modes {
		b.ReportMetric(float64(n*rounds)/spent[i].Seconds(), m.name+"-msgs/s")
	}
	b.ReportMetric(0, "ns/op")
}

type noopPublisher struct{}

func (noopPublisher) Publish(string, ...*message.Message) error { return nil }
func (noopPublisher) Close() error                              { return nil }

// The sweep for missed promotions visits every parked key of the outbox, whatever its partition, so a relay runs
// one per interval for all its partitions (it ran one per partition: with 8 partitions and a deep backlog of keys,
// the redundant sweeps were a fifth of the database's time in a drain), and relays sharing partitions under
// leader election run one between them (the leader of partition 0 sweeps). Counted by a statement trigger.
func TestPartitionedRelaySweepsOncePerInterval(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		leader string
		relays int
	}{{"unfenced", "", 1}, {"leader", "orders-relay", 1}, {"three leader-elected relays", "orders-relay", 3}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			sweeps := pgtest.Q(e.schema, "sweeps")
			pgtest.Exec(t, e.pool, `CREATE TABLE `+sweeps+` (at timestamptz NOT NULL DEFAULT now())`)
			pgtest.Exec(t, e.pool, `CREATE FUNCTION `+pgtest.Q(e.schema, "count_sweeps")+`() RETURNS trigger
				LANGUAGE plpgsql AS $$ BEGIN
					IF current_query() LIKE '%WITH RECURSIVE parked%' THEN INSERT INTO `+sweeps+` DEFAULT VALUES; END IF;
					RETURN NULL;
				END $$`)
			pgtest.Exec(t, e.pool, `CREATE TRIGGER count_sweeps AFTER UPDATE ON `+pgtest.Q(e.schema, "outbox")+
				` FOR EACH STATEMENT EXECUTE FUNCTION `+pgtest.Q(e.schema, "count_sweeps")+`()`)
			var routers []*message.Router
			for range c.relays {
				r := e.relay(func(cfg *outbox.RelayConfig) {
					cfg.Partitions = 8
					cfg.PollingInterval = 100 * time.Millisecond // a sweep every second
					if c.leader != "" {
						cfg.LeaderElection, cfg.LeaderTTL = c.leader, time.Second
					}
				})
				routers = append(routers, runRouter(t, r, newBroker(), nil))
			}
			time.Sleep(3500 * time.Millisecond)
			for _, router := range routers {
				require.NoError(t, router.Close())
			}
			n := e.count("sweeps")
			// About four (at the start, then every second); one per partition per second would be about 32, one
			// per relay per second about 12 with three relays.
			require.GreaterOrEqual(t, n, int64(2), "the relays sweep")
			require.LessOrEqual(t, n, int64(7), "one sweep per interval for all eight partitions and every relay")
		})
	}
}
