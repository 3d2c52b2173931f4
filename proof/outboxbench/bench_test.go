package outboxbench_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/hoststat"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// Benchmarks run on a durable cluster (fsync and synchronous_commit on): pgtest.DurableURL, or DATABASE_URL.
//
//	go test ./proof/outboxbench -run '^$' -bench 'Drain|Latency' -benchtime 1x
//	STAGEHAND_OUTBOX_SOAK=5m go test ./proof/outboxbench -run '^$' -bench Soak -benchtime 1x -timeout 20m

// countingPublisher is a no-op Watermill publisher that counts.
type countingPublisher struct{ n atomic.Int64 }

func (p *countingPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.n.Add(int64(len(msgs)))
	return nil
}
func (p *countingPublisher) Close() error { return nil }

var payload = []byte(`{"order_id":"0f8fad5b-d9cb-469f-a165-70867728950e","amount":1999,"currency":"EUR"}`)

func benchMessages(n, keys int, prefix string) []outbox.Message {
	out := make([]outbox.Message, n)
	for i := range out {
		out[i] = outbox.Message{ID: fmt.Sprintf("%s-%d", prefix, i), Topic: "orders", Type: "orders.OrderPlaced",
			Payload: payload}
		if keys > 0 {
			out[i].PartitionKey = fmt.Sprintf("order-%d", i%keys)
		}
	}
	return out
}

// drainRound is the backlog each side drains in one round.
func drainRound(batch int) int {
	switch {
	case batch == 1:
		return 600
	case batch <= 100:
		return 15000
	default:
		return 40000
	}
}

// drainSide is one way of draining a backlog: fill stages n messages in one transaction (so they become visible at
// once) and drain returns when all of them are published and marked.
type drainSide struct {
	name  string
	fill  func(round, n int)
	drain func(n int)
	stop  func()
}

// BenchmarkDrain is the drain rate (messages/s) of a committed backlog to a no-op publisher, at batch sizes 1, 100
// and 1000, beside a raw-SQL claim + mark baseline and watermill-sql's default schema with Watermill's forwarder,
// on the same database in the same run. The sides take turns in rounds (rotating their order), so drift in the
// machine's load falls on all of them; rates and ratios are over all rounds.
func BenchmarkDrain(b *testing.B) {
	url := pgtest.DurableURL(b)
	for _, batch := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			n := drainRound(batch)
			sides := []drainSide{
				rawSide(b, url, batch),
				relaySide(b, url, batch, 0, true),
				relaySide(b, url, batch, 0, false),
				relaySide(b, url, batch, 1000, true),
				forwarderSide(b, url, batch),
			}
			defer func() {
				for _, s := range sides {
					s.stop()
				}
			}()
			spent := make([]time.Duration, len(sides))
			rounds := 5 * b.N
			steal := hoststat.Steal()
			for round := range rounds {
				for i := range sides {
					k := (i + round) % len(sides)
					sides[k].fill(round, n)
					start := time.Now()
					sides[k].drain(n)
					spent[k] += time.Since(start)
				}
			}
			rate := func(i int) float64 { return float64(n*rounds) / spent[i].Seconds() }
			for i, s := range sides {
				b.ReportMetric(rate(i), s.name+"-msgs/s")
			}
			b.ReportMetric(rate(1)/rate(0), "router/raw")
			b.ReportMetric(rate(1)/rate(4), "router/forwarder")
			b.ReportMetric(0, "ns/op")
			fmt.Printf("DRAIN batch=%d: raw %.0f, relay-router %.0f (%.2fx raw, %.2fx forwarder), relay-drain %.0f "+
				"(%.2fx raw, %.2fx forwarder), relay-router-1000keys %.0f (%.2fx raw), forwarder %.0f msgs/s (%s)\n",
				batch, rate(0), rate(1), rate(1)/rate(0), rate(1)/rate(4), rate(2), rate(2)/rate(0),
				rate(2)/rate(4), rate(3), rate(3)/rate(0), rate(4), hoststat.Percent(steal()))
		})
	}
}

func relayConfig(batch int) *outbox.RelayConfig {
	return &outbox.RelayConfig{BatchSize: batch, PollingInterval: 100 * time.Millisecond,
		MaxDegreeOfParallelism: 4}
}

// relaySide drains with a relay: through a Watermill router (viaRouter), or with Drain.
func relaySide(b *testing.B, url string, batch, keys int, viaRouter bool) drainSide {
	pool, schema := pgtest.MigratedOn(b, url)
	e := setupOn(b, pool, schema, nil)
	name := "relay-drain"
	if viaRouter {
		name = "relay-router"
	}
	if keys > 0 {
		name += fmt.Sprintf("-%dkeys", keys)
	}
	pub := &countingPublisher{}
	cfg := relayConfig(batch)
	r, err := e.ob.NewRelay(cfg)
	require.NoError(b, err)
	side := drainSide{name: name, stop: func() { _ = r.Close() }}
	side.fill = func(round, n int) {
		msgs := benchMessages(n, keys, fmt.Sprint("m", round))
		require.NoError(b, pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
			for start := 0; start < n; start += 1000 {
				if _, err := e.ob.StageTx(context.Background(), tx, msgs[start:min(start+1000, n)]...); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	if !viaRouter {
		side.drain = func(n int) {
			res, err := r.Drain(context.Background(), pub)
			require.NoError(b, err)
			require.Equal(b, n, res.Published)
		}
		return side
	}
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	require.NoError(b, err)
	r.AddToRouter(router, pub, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = router.Run(ctx); close(done) }()
	<-router.Running()
	side.stop = func() { cancel(); <-done; _ = r.Close() }
	side.drain = func(n int) {
		e.ob.Notify()
		target := pub.n.Load() + int64(n)
		for pub.n.Load() < target {
			time.Sleep(time.Millisecond)
		}
		for e.count("outbox") > 0 { // and marked
			time.Sleep(time.Millisecond)
		}
	}
	return side
}

// rawSide is the baseline: the minimal claim (lease) + mark an outbox can do, in two statements per batch, one
// worker, on a plain table with a partial index on unsent rows.
func rawSide(b *testing.B, url string, batch int) drainSide {
	pool, schema := pgtest.MigratedOn(b, url)
	ctx := context.Background()
	tbl := pgtest.Q(schema, "raw_outbox")
	pgtest.Exec(b, pool, "CREATE TABLE "+tbl+` (id bigserial PRIMARY KEY, topic text NOT NULL, payload bytea NOT NULL,
		metadata jsonb NOT NULL DEFAULT '{}', created_at timestamptz NOT NULL DEFAULT now(),
		locked_until timestamptz, sent_at timestamptz)`)
	pgtest.Exec(b, pool, "CREATE INDEX ON "+tbl+" (id) WHERE sent_at IS NULL")
	claim := `UPDATE ` + tbl + ` SET locked_until = now() + interval '30 seconds'
		WHERE id IN (SELECT id FROM ` + tbl + ` WHERE sent_at IS NULL AND (locked_until IS NULL OR locked_until < now())
		             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
		RETURNING id, topic, payload`
	mark := `UPDATE ` + tbl + ` SET sent_at = now() WHERE id = ANY($1)`
	pub := &countingPublisher{}
	return drainSide{
		name: "raw",
		fill: func(_, n int) {
			_, err := pool.Exec(ctx, "INSERT INTO "+tbl+" (topic, payload) SELECT 'orders', $1 FROM generate_series(1, $2)",
				payload, n)
			require.NoError(b, err)
		},
		drain: func(int) {
			for {
				rows, err := pool.Query(ctx, claim, batch)
				require.NoError(b, err)
				var ids []int64
				for rows.Next() {
					var (
						id    int64
						topic string
						p     []byte
					)
					require.NoError(b, rows.Scan(&id, &topic, &p))
					require.NoError(b, pub.Publish(topic, message.NewMessage(fmt.Sprint(id), p)))
					ids = append(ids, id)
				}
				require.NoError(b, rows.Err())
				if len(ids) == 0 {
					return
				}
				_, err = pool.Exec(ctx, mark, ids)
				require.NoError(b, err)
			}
		},
		stop: func() {},
	}
}

// forwarderSide is the peer: messages published through Watermill's forwarder into watermill-sql's default
// PostgreSQL schema, forwarded by the forwarder to the no-op publisher.
func forwarderSide(b *testing.B, url string, batch int) drainSide {
	_, schema := pgtest.MigratedOn(b, url)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(b, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	wpool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	db := wmsql.BeginnerFromPgx(wpool)
	logger := watermill.NopLogger{}
	const topic = "forwarded"
	sqlPub, err := wmsql.NewPublisher(db, wmsql.PublisherConfig{
		SchemaAdapter: wmsql.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true}, logger)
	require.NoError(b, err)
	// Create the table outside the staging transactions (AutoInitializeSchema refuses to run in one).
	require.NoError(b, forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: topic}).
		Publish("orders", message.NewMessage("warmup", payload)))
	sub, err := wmsql.NewSubscriber(db, wmsql.SubscriberConfig{
		ConsumerGroup:    "forwarder",
		PollInterval:     10 * time.Millisecond,
		SchemaAdapter:    wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: batch},
		OffsetsAdapter:   wmsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
	}, logger)
	require.NoError(b, err)
	pub := &countingPublisher{}
	fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: topic})
	require.NoError(b, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = fwd.Run(runCtx); close(done) }()
	<-fwd.Running()
	for pub.n.Load() < 1 { // the warm-up message
		time.Sleep(time.Millisecond)
	}
	return drainSide{
		name: "forwarder",
		fill: func(round, n int) {
			require.NoError(b, pgx.BeginFunc(ctx, wpool, func(tx pgx.Tx) error {
				txPub, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{
					SchemaAdapter: wmsql.DefaultPostgreSQLSchema{}}, logger)
				if err != nil {
					return err
				}
				fp := forwarder.NewPublisher(txPub, forwarder.PublisherConfig{ForwarderTopic: topic})
				for start := 0; start < n; start += 1000 {
					var ms []*message.Message
					for j := start; j < min(start+1000, n); j++ {
						ms = append(ms, message.NewMessage(fmt.Sprint(round, "-", j), payload))
					}
					if err := fp.Publish("orders", ms...); err != nil {
						return err
					}
				}
				return nil
			}))
		},
		drain: func(n int) {
			target := pub.n.Load() + int64(n)
			for pub.n.Load() < target {
				time.Sleep(time.Millisecond)
			}
		},
		stop: func() { cancel(); _ = fwd.Close(); <-done; wpool.Close() },
	}
}

// latencyPublisher records when each message was published.
type latencyPublisher struct{ got chan time.Time }

func (p *latencyPublisher) Publish(_ string, msgs ...*message.Message) error {
	for range msgs {
		p.got <- time.Now()
	}
	return nil
}
func (p *latencyPublisher) Close() error { return nil }

// BenchmarkLatency is the time from a staging transaction's commit to the publish, p50 and p99 over 1000 messages
// (100 when polling every second) staged one at a time, with wake-up notifications and with polling only.
func BenchmarkLatency(b *testing.B) {
	url := pgtest.DurableURL(b)
	for _, c := range []struct {
		name    string
		poll    time.Duration
		polling bool
	}{
		{"notify", time.Second, false},
		{"polling=10ms", 10 * time.Millisecond, true},
		{"polling=1s", time.Second, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			pool, schema := pgtest.MigratedOn(b, url)
			e := setupOn(b, pool, schema, &outbox.Config{DisableNotify: c.polling})
			r, err := e.ob.NewRelay(&outbox.RelayConfig{PollingInterval: c.poll, DisableNotify: c.polling})
			require.NoError(b, err)
			pub := &latencyPublisher{got: make(chan time.Time, 1)}
			runRouter(b, r, pub, nil)
			samples := 1000
			if c.polling && c.poll >= time.Second {
				samples = 100 // a second each
			}
			var lat []time.Duration
			for i := 0; i < b.N; i++ {
				for j := range samples {
					_, err := e.ob.Stage(context.Background(), outbox.Message{ID: fmt.Sprint(i, "-", j), Topic: "t",
						Payload: payload})
					require.NoError(b, err)
					committed := time.Now()
					lat = append(lat, (<-pub.got).Sub(committed))
					time.Sleep(time.Duration(j%7) * time.Millisecond) // do not stay in phase with the poll
				}
			}
			slices.Sort(lat)
			b.Logf("p90 %s p95 %s p99 %s top %v", lat[len(lat)*90/100], lat[len(lat)*95/100], lat[len(lat)*99/100], lat[len(lat)-8:])
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkSoak drains a continuously refilled outbox for STAGEHAND_OUTBOX_SOAK (for example 5m) with the
// HighThroughput profile and reports the drain rate of the first and the last minute: the rate must not decay as
// sent rows pile up in the ledger and dead tuples in the hot table.
func BenchmarkSoak(b *testing.B) {
	d, err := time.ParseDuration(os.Getenv("STAGEHAND_OUTBOX_SOAK"))
	if err != nil || d <= 0 {
		b.Skip("set STAGEHAND_OUTBOX_SOAK=5m to run the long drain")
	}
	url := pgtest.DurableURL(b)
	pool, schema := pgtest.MigratedOn(b, url)
	e := setupOn(b, pool, schema, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	producerDone := make(chan struct{})
	var staged atomic.Int64
	// The refill inserts server-side (the writer on 2 shared cores cannot outpace the relay), keeping the backlog
	// between 40k and 80k so the relay never idles: the figure is the relay's drain rate, not the producer's.
	refill := "INSERT INTO " + pgtest.Q(schema, "outbox") + ` (message_id, topic, message_type, payload, metadata,
		next_attempt_at, created_at)
		SELECT $1 || '-' || i, 'orders', 'orders.OrderPlaced', $2, '{"source":"soak"}', now(), now()
		FROM generate_series(1, 20000) i`
	go func() {
		defer close(producerDone)
		for i := 0; ctx.Err() == nil; i++ {
			if e.count("outbox") > 40000 {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			if _, err := pool.Exec(ctx, refill, fmt.Sprint("s", i), payload); err != nil {
				return
			}
			staged.Add(20000)
		}
	}()
	pgtest.Eventually(b, time.Minute, func() bool { return staged.Load() >= 60000 }, "producer too slow")
	pub := &countingPublisher{}
	cfg := outbox.HighThroughput()
	var claimedRows, claimNanos atomic.Int64 // the claim's own cost per row: index bloat shows here first
	cfg.Hooks.Claimed = func(_ context.Context, rows int, took time.Duration, _ error) {
		claimedRows.Add(int64(rows))
		claimNanos.Add(int64(took))
	}
	r, err := e.ob.NewRelay(cfg)
	require.NoError(b, err)
	runRouter(b, r, pub, nil)
	window := 10 * time.Second
	var rates, costs []float64
	last := pub.n.Load()
	for end := time.Now().Add(d); time.Now().Before(end); {
		time.Sleep(window)
		now := pub.n.Load()
		rates = append(rates, float64(now-last)/window.Seconds())
		last = now
		rows, nanos := claimedRows.Swap(0), claimNanos.Swap(0)
		costs = append(costs, float64(nanos)/1e3/float64(max(rows, 1)))
		b.Logf("t=%3.0fs drain %7.0f msgs/s, claim %5.1f µs/row, backlog %d, ledger %d",
			float64(len(rates))*window.Seconds(), rates[len(rates)-1], costs[len(costs)-1], e.count("outbox"),
			e.count("outbox_sent"))
	}
	cancel()
	<-producerDone
	perMinute := int(time.Minute / window)
	avg := func(rs []float64) float64 {
		s := 0.0
		for _, r := range rs {
			s += r
		}
		return s / float64(len(rs))
	}
	first, lastMin := avg(rates[:min(perMinute, len(rates))]), avg(rates[max(0, len(rates)-perMinute):])
	b.ReportMetric(first, "first-min-msgs/s")
	b.ReportMetric(lastMin, "last-min-msgs/s")
	b.ReportMetric(lastMin/first, "end/start")
	b.ReportMetric(avg(costs[:min(perMinute, len(costs))]), "first-min-claim-µs/row")
	b.ReportMetric(avg(costs[max(0, len(costs)-perMinute):]), "last-min-claim-µs/row")
	b.ReportMetric(0, "ns/op")
}
