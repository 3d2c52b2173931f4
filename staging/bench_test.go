package staging

// Save per strategy (1 event -> 1 message) at 1 and 16 clients, each beside raw SQL that inserts an event row and
// a plain outbox row (payload, topic, type, key; no metadata, no order) in one transaction, alternating in the same
// run on a durable cluster; a Transactional save of 10 events and 10 messages beside a raw transaction inserting
// the 10 event rows and the 10 plain outbox rows (one multi-row INSERT each); the Transactional saves of 1 and 10
// events beside a raw transaction writing the very rows the save writes (BenchmarkSaveSameRows); what each part of
// those rows costs (BenchmarkRowParts); the Transactional save beside a relay that publishes the outbox
// (BenchmarkSaveBesideARelay); and the delay from the append's commit to the staged row under EventuallyConsistent
// and Deferred:
//
//	go test ./staging -run '^$' -bench . -benchtime 1x
//
// With STAGEHAND_BENCH_PARTITIONED=1 the events table of every benchmark's schema is first partitioned by position
// (eventstore.Partitions, partitions of 100,000 positions): both sides then insert through the partitioned table
// and its trigger (the raw side's INSERT too), so the ratios say what stagehand adds there, and the rates beside a
// run without it what partitioning costs.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/telemetry"
	"github.com/stagehand-es/stagehand/internal/telemetry/telemetrytest"
	"github.com/stagehand-es/stagehand/internal/testkit/benchpair"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

func benchEnv(b testing.TB) *env {
	b.Helper()
	pool, schema := pgtest.MigratedOn(b, pgtest.DurableURL(b))
	if os.Getenv("STAGEHAND_BENCH_PARTITIONED") != "" {
		parts, err := eventstore.NewPartitions(pool, &eventstore.PartitionConfig{Schema: schema, Size: 100_000,
			Ahead: 4, Headroom: 1})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := parts.Convert(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	e := setupOn(b, pool, schema)
	m := NewMapping(e.reg)
	_ = Map(m, "placed", func(src eventstore.Record, ev OrderPlaced) ([]Message, error) {
		return []Message{{Topic: "orders", Type: "order.placed", Payload: ev}}, nil
	})
	e.m = m
	return e
}

var benchSeq atomic.Int64

// saver is the subject of the save benchmarks: on a fresh benchmark schema, a repository with strategy s, and an
// operation that raises n events on the worker's own order (one per client) and saves it.
func saver(b testing.TB, s Strategy, clients, n int) (*env, benchpair.Op) {
	e := benchEnv(b)
	r, _ := e.repo(e.store, &Config{Strategy: s, Outbox: e.outbox})
	orders := make([]*Order, clients)
	for i := range orders {
		orders[i] = r.New(fmt.Sprintf("o-%d", benchSeq.Add(1)))
	}
	return e, func(w int) error {
		for range n {
			aggregate.Raise(orders[w], OrderPlaced{Total: 1})
		}
		return r.Save(context.Background(), orders[w])
	}
}

func BenchmarkSave(b *testing.B) {
	for _, s := range []Strategy{Transactional, EventuallyConsistent, Deferred} {
		for _, clients := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/clients=%d", s, clients), func(b *testing.B) {
				e, save := saver(b, s, clients, 1)
				benchpair.Compare(b, benchpair.Config{Unit: "saves", Clients: clients}, save, plainPair(e, clients, false))
			})
		}
	}
}

// BenchmarkSaveBesideARelay is the Transactional save of BenchmarkSave (1 event + 1 message, 16 clients) in steady
// state: a relay publishes the outbox while the clients save, as in production (without one, every message after a
// stream's first is parked behind it). It makes two comparisons, each in one run. The first is the save beside the
// raw pair of BenchmarkSave, both sides' rows published by the relay (the raw side wakes it after each commit, as a
// save does), so each side's CPU per save includes what the relay spent on its rows. The second has each client
// save one aggregate again and again (its messages share one key) beside saves that each create an aggregate (every
// message a key of its own): a staging waits for its key's lock while a relay promotes that key's next message
// (from the relay's try of the lock to the end of its transaction), which a stream saved again and again meets and
// a new stream never does (a new stream's append also skips the expected version's probe).
//
//	go test ./staging -run '^$' -bench 'BenchmarkSaveBesideARelay' -benchtime 1x
func BenchmarkSaveBesideARelay(b *testing.B) {
	const clients = 16
	b.Run(fmt.Sprintf("transactional/clients=%d", clients), func(b *testing.B) {
		e, save := saver(b, Transactional, clients, 1)
		benchRelay(b, e, &outbox.RelayConfig{})
		raw := plainPair(e, clients, false)
		benchpair.Compare(b, benchpair.Config{Unit: "saves", Clients: clients}, save, func(w int) error {
			if err := raw(w); err != nil {
				return err
			}
			e.outbox.Notify() // as a save does, so the relay publishes both sides' rows alike
			return nil
		})
	})
	b.Run(fmt.Sprintf("one-aggregate-per-client/clients=%d", clients), func(b *testing.B) {
		e, again := saver(b, Transactional, clients, 1)
		benchRelay(b, e, &outbox.RelayConfig{})
		r, _ := e.repo(e.store, &Config{Strategy: Transactional, Outbox: e.outbox})
		fresh := func(int) error {
			o := r.New(fmt.Sprintf("n-%d", benchSeq.Add(1)))
			aggregate.Raise(o, OrderPlaced{Total: 1})
			return r.Save(context.Background(), o)
		}
		benchpair.Compare(b, benchpair.Config{Unit: "saves", Clients: clients,
			Names: [2]string{"one-aggregate", "new-aggregates"}}, again, fresh)
	})
}

// plainPair returns the raw side of BenchmarkSave: one transaction per call that inserts an event row and a plain
// outbox row (payload, topic, type, key; no metadata, no order), the payload a constant of the statement; with
// sent, the payload is encoded per call and sent as a parameter of both inserts instead, as an application's is.
func plainPair(e *env, clients int, sent bool) benchpair.Op {
	ctx := context.Background()
	rawVersions, rawIDs := make([]int64, clients), rawStreams(clients)
	events, outboxT := pgtest.Q(e.schema, "events"), pgtest.Q(e.schema, "outbox")
	payload := [2]string{`'{"Total":1}'`, `'{"Total":1}'`} // in the event's insert, in the message's
	if sent {
		payload = [2]string{"$5", "$3"}
	}
	appendSQL := `INSERT INTO ` + events + ` (tenant_id, stream_id, stream_type, version, event_id, event_type, payload,
		occurred_at) VALUES ($1, $2, 'shop.order', $3, $4, 'shop.order.placed', ` + payload[0] + `, now())`
	stageSQL := `INSERT INTO ` + outboxT + ` (message_id, topic, message_type, payload, partition_key, next_attempt_at,
		created_at) VALUES ($1, 'orders', 'order.placed', ` + payload[1] + `, $2, now(), now())`
	return func(w int) error {
		rawVersions[w]++
		appendArgs := []any{stagehand.NoTenant, rawIDs[w], rawVersions[w], uuid.Must(uuid.NewV7())}
		stageArgs := []any{uuid.NewString(), rawIDs[w]}
		if sent {
			p, err := json.Marshal(OrderPlaced{Total: 1})
			if err != nil {
				return err
			}
			appendArgs, stageArgs = append(appendArgs, p), append(stageArgs, p)
		}
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, appendSQL, appendArgs...); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, stageSQL, stageArgs...); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
}

// rawStreams names a new stream for each of the raw side's clients ("raw-" and a number: the rows tests tell the
// raw side's rows by it).
func rawStreams(clients int) []string {
	streams := make([]string, clients)
	for i := range streams {
		streams[i] = fmt.Sprintf("raw-%d", benchSeq.Add(1))
	}
	return streams
}

// BenchmarkSaveTen is a Transactional save of 10 events, each mapped to one message, beside a raw transaction that
// inserts the same 10 event rows and 10 outbox rows (one multi-row INSERT each).
func BenchmarkSaveTen(b *testing.B) {
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("transactional/clients=%d", clients), func(b *testing.B) {
			const n = 10
			e, save := saver(b, Transactional, clients, n)
			benchpair.Compare(b, benchpair.Config{Unit: "events", UnitsPerOp: n, Clients: clients}, save,
				plainTen(e, clients, n))
		})
	}
}

// BenchmarkSaveSameRows is a Transactional save of 1 and of 10 events, each mapped to one message, beside a raw
// transaction that writes the same rows: the events with their version, metadata and occurrence time, returning
// their positions as the append does, then the messages with the columns a staged message fills (its metadata
// headers, correlation and causation IDs, partition key, a sequence number from the outbox's sequence, the event's
// position, a key's later messages parked behind its first). One event and its message go as scalar statements
// (VALUES rows), as a hand-written application writes one row; ten as one multi-row INSERT each. What the raw side
// leaves out is what the save adds to those rows: the expected-version check, the key's lock and its order probes,
// and one round trip instead of four. BenchmarkSave and BenchmarkSaveTen compare the same saves with narrower raw
// rows (no metadata, no order), so the three ratios together say how much of the gap is the rows and how much the
// save's own work (TestSameRowsWritesWhatASaveWrites keeps the raw side's rows the shape of the save's;
// BenchmarkRowParts prices the rows' parts one by one):
//
//	go test ./staging -run '^$' -bench 'BenchmarkSaveSameRows' -benchtime 1x
func BenchmarkSaveSameRows(b *testing.B) {
	for _, n := range []int{1, 10} {
		for _, clients := range []int{1, 16} {
			b.Run(fmt.Sprintf("events=%d/clients=%d", n, clients), func(b *testing.B) {
				e, save := saver(b, Transactional, clients, n)
				benchpair.Compare(b, benchpair.Config{Unit: "events", UnitsPerOp: n, Clients: clients}, save,
					sameRows(e, clients, n, rowParts{}))
			})
		}
	}
}

// BenchmarkRowParts prices the parts of a staged message's row that the plain pair of BenchmarkSave does not
// write, at 16 clients, with the raw side of BenchmarkSaveSameRows for one event and one message: the whole row
// beside the plain pair, then the row without one part at a time (and without all of them) beside the whole row in
// the same run, so a part's cost is read from one paired comparison (a ratio above 1: what leaving it out gains)
// rather than from the difference of two ratios, each of which moves by more than a part costs; and the plain pair
// sending its payload as a parameter beside the plain pair whose statements carry it as a constant:
//
//	STAGEHAND_BENCH_ROUND=2s go test ./staging -run '^$' -bench 'BenchmarkRowParts' -benchtime 1x
func BenchmarkRowParts(b *testing.B) {
	const clients = 16
	b.Run(fmt.Sprintf("whole/clients=%d", clients), func(b *testing.B) {
		e := benchEnv(b)
		benchpair.Compare(b, benchpair.Config{Unit: "saves", Clients: clients, Names: [2]string{"whole", "plain"}},
			sameRows(e, clients, 1, rowParts{}), plainPair(e, clients, false))
	})
	b.Run(fmt.Sprintf("plain-payload-sent/clients=%d", clients), func(b *testing.B) {
		e := benchEnv(b)
		benchpair.Compare(b, benchpair.Config{Unit: "saves", Clients: clients,
			Names: [2]string{"payload-sent", "plain"}}, plainPair(e, clients, true), plainPair(e, clients, false))
	})
	for _, v := range []struct {
		name  string
		leave rowParts
	}{
		{"without-headers", rowParts{headers: true}},
		{"without-order", rowParts{order: true}},
		{"without-links", rowParts{links: true}},
		{"without-all", rowParts{headers: true, order: true, links: true}},
	} {
		b.Run(fmt.Sprintf("%s/clients=%d", v.name, clients), func(b *testing.B) {
			e := benchEnv(b)
			benchpair.Compare(b, benchpair.Config{Unit: "saves", Clients: clients, Names: [2]string{v.name, "whole"}},
				sameRows(e, clients, 1, v.leave), sameRows(e, clients, 1, rowParts{}))
		})
	}
}

// rowParts names the parts of a staged message's row that sameRows can leave out (true: left out).
type rowParts struct {
	headers bool // the standard headers in the metadata ('{}' instead)
	order   bool // the key's order: no sequence number, so no key index entry and no parking
	links   bool // the correlation and causation IDs and the source position
}

// sameRows returns the raw side of BenchmarkSaveSameRows: one transaction per call that appends n events to the
// worker's stream and writes one outbox row per event with the content a Transactional save stages for it (less
// the parts in leave), its payload and metadata encoded as JSON per call as a hand-written application would. As
// in a save with no relay running, a stream's messages after its first are parked.
func sameRows(e *env, clients, n int, leave rowParts) benchpair.Op {
	events, outboxT := pgtest.Q(e.schema, "events"), pgtest.Q(e.schema, "outbox")
	seq := strings.ReplaceAll(pgtest.Q(e.schema, "outbox_seq"), "'", "''")
	appendOne := `INSERT INTO ` + events + ` (tenant_id, stream_id, stream_type, version, event_id, event_type,
		payload, event_version, metadata, occurred_at)
		VALUES ($1, $2, 'shop.order', $3, $4, 'shop.order.placed', $5, 1, '{}', $6)
		RETURNING position`
	stageOne := `INSERT INTO ` + outboxT + ` (message_id, message_type, topic, payload, metadata, tenant_id,
		correlation_id, causation_id, partition_key, seq, source_position, next_attempt_at, created_at)
		VALUES ($1, 'order.placed', 'orders', $2, $3, $4, $5, $5, $6, CASE WHEN $7::bool THEN nextval('` + seq + `') END,
			$8, CASE WHEN $9::bool THEN 'infinity'::timestamptz ELSE $10 END, $10)`
	appendMany := rawAppendMany(events)
	stageMany := `INSERT INTO ` + outboxT + ` (message_id, message_type, topic, payload, metadata, tenant_id,
		correlation_id, causation_id, partition_key, seq, source_position, next_attempt_at, created_at)
		SELECT d.message_id, 'order.placed', 'orders', d.payload, d.metadata, $1, d.event_id, d.event_id, $2,
			CASE WHEN $9::bool THEN nextval('` + seq + `') END, CASE WHEN $11::bool THEN d.position END,
			CASE WHEN $9::bool AND (d.ord > 1 OR $10::bool) THEN 'infinity'::timestamptz ELSE $3 END, $3
		FROM unnest($4::text[], $5::bytea[], $6::jsonb[], $7::text[], $8::bigint[]) WITH ORDINALITY
			AS d(message_id, payload, metadata, event_id, position, ord)`
	streams, versions := rawStreams(clients), make([]int64, clients)
	return func(w int) error {
		ctx := context.Background()
		now := time.Now()
		later := versions[w] > 0 // the stream has messages pending from earlier calls
		in, err := newRowInputs(n, streams[w], &versions[w], leave, now)
		if err != nil {
			return err
		}
		vs, ids, payloads, msgIDs, metas, links := in.versions, in.ids, in.payloads, in.msgIDs, in.metas, in.links
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if n == 1 {
			var position int64
			if err := tx.QueryRow(ctx, appendOne, stagehand.NoTenant, streams[w], vs[0], ids[0], payloads[0], now).
				Scan(&position); err != nil {
				return err
			}
			var source any = position
			if leave.links {
				source = nil
			}
			if _, err := tx.Exec(ctx, stageOne, msgIDs[0], payloads[0], metas[0], stagehand.NoTenant, links[0],
				streams[w], !leave.order, source, !leave.order && later, now); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}
		rows, err := tx.Query(ctx, appendMany, stagehand.NoTenant, streams[w], vs, ids, now, payloads)
		if err != nil {
			return err
		}
		positions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, stageMany, stagehand.NoTenant, streams[w], now, msgIDs, payloads, metas, links,
			positions, !leave.order, later, !leave.links); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
}

// BenchmarkCommitToStaged measures, under EventuallyConsistent, the time from the append's commit to the commit of
// its staging (the stagehand.stage span, which starts once the append has committed and ends with the staging's
// commit), and under Deferred, the time from the save's return to the row appearing in the outbox (the
// DeferredStager wakes on the event store's NOTIFY).
func BenchmarkCommitToStaged(b *testing.B) {
	const saves = 300
	b.Run("eventually-consistent", func(b *testing.B) {
		e := benchEnv(b)
		ctx := context.Background()
		rec := telemetrytest.New(b)
		r, _ := e.traced(rec, EventuallyConsistent)
		o := r.New(fmt.Sprintf("o-%d", benchSeq.Add(1)))
		for range saves {
			aggregate.Raise(o, OrderPlaced{Total: 1})
			if err := r.Save(ctx, o); err != nil {
				b.Fatal(err)
			}
		}
		var delays []time.Duration
		for _, s := range rec.Spans(telemetry.SpanStage) {
			delays = append(delays, s.EndTime.Sub(s.StartTime))
		}
		report(b, delays)
	})
	b.Run("deferred", func(b *testing.B) {
		e := benchEnv(b)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		r, _ := e.repo(e.store, &Config{Strategy: Deferred})
		w, err := NewDeferredStager(e.store, e.outbox, e.m, &WorkerConfig{PollInterval: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.Run(ctx) }()
		defer wg.Wait()
		defer cancel()
		var delays []time.Duration
		o := r.New(fmt.Sprintf("o-%d", benchSeq.Add(1)))
		outboxT := pgtest.Q(e.schema, "outbox")
		for range saves {
			aggregate.Raise(o, OrderPlaced{Total: 1})
			if err := r.Save(ctx, o); err != nil {
				b.Fatal(err)
			}
			saved := time.Now()
			id := MessageID("", o.ID(), o.StoredVersion(), "placed", 0)
			for {
				var n int
				if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+outboxT+` WHERE message_id = $1`, id).
					Scan(&n); err != nil {
					b.Fatal(err)
				}
				if n > 0 {
					break
				}
				if time.Since(saved) > 10*time.Second {
					b.Fatal("message never staged")
				}
				time.Sleep(200 * time.Microsecond)
			}
			delays = append(delays, time.Since(saved))
		}
		report(b, delays)
	})
}

func report(b *testing.B, delays []time.Duration) {
	sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
	p50, p99 := delays[len(delays)/2], delays[len(delays)*99/100]
	b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
	fmt.Fprintf(os.Stdout, "DELAY %s: p50 %.2f ms, p99 %.2f ms (%d saves)\n", b.Name(),
		float64(p50.Microseconds())/1000, float64(p99.Microseconds())/1000, len(delays))
}

// rowInputs are what one call of sameRows (or oneRowPerKey) sends for n events of stream and their messages: the
// next n versions, event IDs, payloads, and the messages' IDs, metadata headers and links, less the parts leave
// leaves out.
type rowInputs struct {
	versions      []int64
	ids           []uuid.UUID
	payloads      [][]byte
	msgIDs, links []string
	metas         [][]byte
}

func newRowInputs(n int, stream string, version *int64, leave rowParts, now time.Time) (rowInputs, error) {
	in := rowInputs{versions: make([]int64, n), ids: make([]uuid.UUID, n), payloads: make([][]byte, n),
		msgIDs: make([]string, n), links: make([]string, n), metas: make([][]byte, n)}
	for i := range n {
		*version++
		in.versions[i], in.ids[i] = *version, uuid.Must(uuid.NewV7())
		p, err := json.Marshal(OrderPlaced{Total: 1})
		if err != nil {
			return rowInputs{}, err
		}
		in.payloads[i], in.msgIDs[i], in.metas[i] = p, uuid.NewString(), []byte(`{}`)
		if !leave.links {
			in.links[i] = in.ids[i].String()
		}
		if leave.headers {
			continue
		}
		in.metas[i], err = json.Marshal(map[string]string{stagehand.HeaderEventID: in.ids[i].String(),
			stagehand.HeaderEventType: "shop.order.placed", stagehand.HeaderOccurredAt: now.UTC().Format(time.RFC3339Nano),
			stagehand.HeaderAggregateID: stream, stagehand.HeaderAggregateType: "shop.order"})
		if err != nil {
			return rowInputs{}, err
		}
	}
	return in, nil
}

// rawAppendMany is the raw sides' append of several events to the events table events: ($1 tenant, $2 stream, $3
// versions, $4 event IDs, $5 occurrence time, $6 payloads), returning their positions.
func rawAppendMany(events string) string {
	return `INSERT INTO ` + events + ` (tenant_id, stream_id, stream_type, version, event_id, event_type,
		payload, event_version, metadata, occurred_at)
		SELECT $1, $2, 'shop.order', d.version, d.event_id, 'shop.order.placed', d.payload, 1, '{}', $5
		FROM unnest($3::bigint[], $4::uuid[], $6::jsonb[]) AS d(version, event_id, payload)
		RETURNING position`
}
