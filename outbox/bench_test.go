package outbox_test

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

	"github.com/stagehand-es/stagehand/internal/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// Benchmarks run on a durable cluster (fsync and synchronous_commit on): pgtest.DurableURL, or DATABASE_URL.
//
//	go test ./outbox -run '^$' -bench 'Drain|Latency' -benchtime 1x
//	STAGEHAND_OUTBOX_SOAK=5m go test ./outbox -run '^$' -bench Soak -benchtime 1x -timeout 20m

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

func stageAll(b *testing.B, ob *outbox.Outbox, msgs []outbox.Message) {
	b.Helper()
	ctx := context.Background()
	for start := 0; start < len(msgs); start += 1000 {
		_, err := ob.Stage(ctx, msgs[start:min(start+1000, len(msgs))]...)
		require.NoError(b, err)
	}
}

func drainSize(batch int) int {
	switch {
	case batch == 1:
		return 3000
	case batch <= 100:
		return 30000
	default:
		return 60000
	}
}

// BenchmarkDrain is the drain rate (messages/s) of a pre-filled outbox to a no-op publisher, at batch sizes 1, 100
// and 1000, beside a raw-SQL claim + mark baseline and watermill-sql's default schema with Watermill's forwarder,
// on the same database in the same run.
func BenchmarkDrain(b *testing.B) {
	url := pgtest.DurableURL(b)
	for _, batch := range []int{1, 100, 1000} {
		n := drainSize(batch)
		b.Run(fmt.Sprintf("batch=%d/raw", batch), func(b *testing.B) { benchRaw(b, url, batch, n) })
		b.Run(fmt.Sprintf("batch=%d/relay-router", batch), func(b *testing.B) {
			benchRelay(b, url, batch, n, 0, true)
		})
		b.Run(fmt.Sprintf("batch=%d/relay-drain", batch), func(b *testing.B) {
			benchRelay(b, url, batch, n, 0, false)
		})
		b.Run(fmt.Sprintf("batch=%d/relay-router-1000keys", batch), func(b *testing.B) {
			benchRelay(b, url, batch, n, 1000, true)
		})
		b.Run(fmt.Sprintf("batch=%d/forwarder", batch), func(b *testing.B) { benchForwarder(b, url, batch, n) })
	}
}

func relayConfig(batch int) *outbox.RelayConfig {
	return &outbox.RelayConfig{BatchSize: batch, PollingInterval: 100 * time.Millisecond,
		MaxDegreeOfParallelism: 4}
}

func benchRelay(b *testing.B, url string, batch, n, keys int, viaRouter bool) {
	pool, schema := pgtest.MigratedOn(b, url)
	e := setupOn(b, pool, schema, nil)
	var elapsed time.Duration
	for i := 0; i < b.N; i++ {
		stageAll(b, e.ob, benchMessages(n, keys, fmt.Sprint("m", i)))
		pgtest.Exec(b, pool, "VACUUM ANALYZE "+pgtest.Q(schema, "outbox"))
		pub := &countingPublisher{}
		r, err := e.ob.NewRelay(relayConfig(batch))
		require.NoError(b, err)
		start := time.Now()
		if viaRouter {
			router, err := message.NewRouter(message.RouterConfig{}, nil)
			require.NoError(b, err)
			r.AddToRouter(router, pub, nil)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { _ = router.Run(ctx); close(done) }()
			for pub.n.Load() < int64(n) || e.count("outbox") > 0 {
				time.Sleep(2 * time.Millisecond)
			}
			elapsed += time.Since(start)
			cancel()
			<-done
		} else {
			res, err := r.Drain(context.Background(), pub)
			require.NoError(b, err)
			require.Equal(b, n, res.Published)
			elapsed += time.Since(start)
		}
		require.NoError(b, r.Close())
		require.EqualValues(b, n, pub.n.Load())
	}
	b.ReportMetric(float64(n*b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(0, "ns/op")
}

// benchRaw is the baseline: the minimal claim (lease) + mark an outbox can do, in two statements per batch, one
// worker, on a plain table with a partial index on unsent rows.
func benchRaw(b *testing.B, url string, batch, n int) {
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
	var elapsed time.Duration
	for i := 0; i < b.N; i++ {
		for start := 0; start < n; start += 1000 {
			_, err := pool.Exec(ctx, "INSERT INTO "+tbl+" (topic, payload) SELECT 'orders', $1 FROM generate_series(1, $2)",
				payload, min(1000, n-start))
			require.NoError(b, err)
		}
		pgtest.Exec(b, pool, "VACUUM ANALYZE "+tbl)
		pub := &countingPublisher{}
		began := time.Now()
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
				break
			}
			_, err = pool.Exec(ctx, mark, ids)
			require.NoError(b, err)
		}
		elapsed += time.Since(began)
		require.EqualValues(b, n, pub.n.Load())
		pgtest.Exec(b, pool, "TRUNCATE "+tbl)
	}
	b.ReportMetric(float64(n*b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(0, "ns/op")
}

// benchForwarder is the peer: messages published through Watermill's forwarder into watermill-sql's default
// PostgreSQL schema, forwarded by the forwarder to the no-op publisher.
func benchForwarder(b *testing.B, url string, batch, n int) {
	pool, schema := pgtest.MigratedOn(b, url)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(b, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	wpool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(wpool.Close)
	_ = pool
	db := wmsql.BeginnerFromPgx(wpool)
	logger := watermill.NopLogger{}
	var elapsed time.Duration
	for i := 0; i < b.N; i++ {
		topic := fmt.Sprintf("forwarded_%d", i)
		sqlPub, err := wmsql.NewPublisher(db, wmsql.PublisherConfig{
			SchemaAdapter: wmsql.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true}, logger)
		require.NoError(b, err)
		fwdPub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: topic})
		// Create the table outside the staging transactions (AutoInitializeSchema refuses to run in one).
		require.NoError(b, fwdPub.Publish("orders", message.NewMessage("warmup", payload)))
		for start := 0; start < n-1; start += 1000 {
			require.NoError(b, pgx.BeginFunc(ctx, wpool, func(tx pgx.Tx) error {
				txPub, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{
					SchemaAdapter: wmsql.DefaultPostgreSQLSchema{}}, logger)
				if err != nil {
					return err
				}
				var ms []*message.Message
				for j := start; j < min(start+1000, n-1); j++ {
					ms = append(ms, message.NewMessage(fmt.Sprint(j), payload))
				}
				return forwarder.NewPublisher(txPub, forwarder.PublisherConfig{ForwarderTopic: topic}).
					Publish("orders", ms...)
			}))
		}
		sub, err := wmsql.NewSubscriber(db, wmsql.SubscriberConfig{
			ConsumerGroup:    "forwarder",
			PollInterval:     100 * time.Millisecond,
			SchemaAdapter:    wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: batch},
			OffsetsAdapter:   wmsql.DefaultPostgreSQLOffsetsAdapter{},
			InitializeSchema: true,
		}, logger)
		require.NoError(b, err)
		pub := &countingPublisher{}
		fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: topic})
		require.NoError(b, err)
		start := time.Now()
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = fwd.Run(runCtx); close(done) }()
		for pub.n.Load() < int64(n) {
			time.Sleep(2 * time.Millisecond)
		}
		elapsed += time.Since(start)
		cancel()
		_ = fwd.Close()
		<-done
	}
	b.ReportMetric(float64(n*b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(0, "ns/op")
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
