package eventstore_test

// The cost of partitioning, on stores of a few million events, measured in one run on one durable cluster:
//
//	go test ./eventstore -run '^$' -bench BenchmarkPartitioned -benchtime 1x -timeout 60m
//
// Three schemas get the same seeded history (STAGEHAND_BENCH_EVENTS events, default 3,000,000: streams of 10
// events and 4 streams of 10,000 events spread over the whole log, one with a snapshot 20 events before its end):
//
//   - unpartitioned: the table as migrated;
//   - converted: the same table converted live by Partitions.Convert (timed): one partition holding the history,
//     and partitions ahead;
//   - partitioned: converted while empty, then seeded through partitions of 500,000 positions (7 partitions).
//
// Then each partitioned schema is compared with the unpartitioned one (benchpair: alternating rounds, so drift
// falls on both sides; the ratio is partitioned / unpartitioned): appending 1 event to an existing stream at 1 and
// 16 clients, loading a short stream (10 events), a long one (10,000 events) and a snapshot with the 20 events
// after it. Last, the oldest partition of each partitioned schema is archived (timed): 500,000 events, and the
// converted schema's first partition, the whole history.

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/benchpair"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

const (
	benchShortLen = 10
	benchLongLen  = 10_000
	benchLongs    = 4
	benchChunk    = 100_000 // events per seeding statement
)

func benchEvents(b *testing.B) int {
	n := 3_000_000
	if v, err := strconv.Atoi(os.Getenv("STAGEHAND_BENCH_EVENTS")); err == nil && v >= benchChunk {
		n = v
	}
	return n / benchChunk * benchChunk
}

// seedHistory appends total events with SQL, benchChunk per statement (through the partitioned table's trigger
// when there is one): in chunk i, 10 events each of (benchChunk - longs' share) / 10 new short streams, in version-
// major order, and the next benchLongLen/chunks events of each long stream. It returns the number of short streams.
func seedHistory(b *testing.B, pool *pgxpool.Pool, schema string, total int) int {
	b.Helper()
	ctx := context.Background()
	chunks := total / benchChunk
	perLong := benchLongLen / chunks
	shortsPerChunk := (benchChunk - benchLongs*perLong) / benchShortLen
	events := pgtest.Q(schema, "events")
	start := time.Now()
	for i := range chunks {
		if _, err := pool.Exec(ctx, `INSERT INTO `+events+` (tenant_id, stream_id, stream_type, version, event_id,
				event_type, payload, occurred_at)
			SELECT '__untenanted__', id, 'bench.account', v, gen_random_uuid(), 'bench.account.deposited',
				'{"amount": 42, "currency": "EUR", "note": "a deposit of the seeded history"}', now()
			FROM (SELECT 'short-' || s AS id, v, v AS k1, s AS k2
					FROM generate_series($1::int, $2::int) s, generate_series(1, $3::int) v
				UNION ALL
				SELECT 'long-' || l, v, v - $4::int, -l FROM generate_series(1, $5::int) l,
					generate_series($4::int + 1, $4::int + $6::int) v) e
			ORDER BY k1, k2`,
			i*shortsPerChunk+1, (i+1)*shortsPerChunk, benchShortLen, i*perLong, benchLongs, perLong); err != nil {
			b.Fatalf("seed %s chunk %d: %v", schema, i, err)
		}
	}
	st, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema, DisableNotify: true})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if err := st.SaveSnapshot(ctx, eventstore.Snapshot{StreamID: "long-1", StreamType: "bench.account",
		Version: int64(chunks*perLong - 20), SchemaVersion: 1, Payload: []byte(`{"balance": 1}`)}); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+events); err != nil {
		b.Fatal(err)
	}
	b.Logf("seeded %d events into %s in %v", total, schema, time.Since(start).Round(time.Millisecond))
	return chunks * shortsPerChunk
}

func BenchmarkPartitioned(b *testing.B) {
	ctx := context.Background()
	url := pgtest.DurableURL(b)
	total := benchEvents(b)
	store := func(pool *pgxpool.Pool, schema string) *eventstore.PostgresStore {
		s, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema, DisableNotify: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(s.Close)
		return s
	}
	poolU, schemaU := pgtest.MigratedOn(b, url)
	poolC, schemaC := pgtest.MigratedOn(b, url)
	poolP, schemaP := pgtest.MigratedOn(b, url)
	shorts := seedHistory(b, poolU, schemaU, total)
	seedHistory(b, poolC, schemaC, total)

	partsC, err := eventstore.NewPartitions(poolC, &eventstore.PartitionConfig{Schema: schemaC, Size: 500_000,
		Headroom: 1})
	if err != nil {
		b.Fatal(err)
	}
	conv, err := partsC.Convert(ctx)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Printf("CONVERT %d events: copy of heads and IDs %v, validation %v, swap (appends held) %v, total %v\n",
		total, conv.Copy.Round(time.Millisecond), conv.Validate.Round(time.Millisecond),
		conv.Swap.Round(time.Millisecond), conv.Duration.Round(time.Millisecond))

	partsP, err := eventstore.NewPartitions(poolP, &eventstore.PartitionConfig{Schema: schemaP, Size: 500_000,
		Ahead: total / 500_000, Headroom: 1})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := partsP.Convert(ctx); err != nil {
		b.Fatal(err)
	}
	seedHistory(b, poolP, schemaP, total)
	stP, err := partsP.Status(ctx)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Printf("PARTITIONED schema: %d attached partitions\n", len(stP.Attached))

	u := store(poolU, schemaU)
	for _, side := range []struct {
		name string
		s    *eventstore.PostgresStore
	}{{"converted", store(poolC, schemaC)}, {"partitioned", store(poolP, schemaP)}} {
		comparePartitioned(b, side.name, side.s, u, shorts)
	}

	// Archive the oldest partition of each: 500,000 events; the converted history.
	// The log must have drawn past a partition before it is archived: move the sequences there (a jump of the
	// sequence is what aborted appends leave, too).
	for _, s := range []struct {
		pool   *pgxpool.Pool
		schema string
	}{{poolC, schemaC}, {poolP, schemaP}} {
		seq := pgtest.Q(s.schema, "events_position_seq")
		if _, err := s.pool.Exec(ctx, `SELECT setval('`+seq+`', greatest((SELECT last_value FROM `+seq+`), $1))`,
			conv.First.To); err != nil {
			b.Fatal(err)
		}
	}
	for _, a := range []struct {
		name  string
		parts *eventstore.Partitions
	}{{"partitioned", partsP}, {"converted", partsC}} {
		res, err := a.parts.Archive(ctx, eventstore.ArchiveRequest{Disposition: eventstore.ArchiveDrop,
			AllowUncovered: true})
		if err != nil {
			b.Fatal(err)
		}
		fmt.Printf("ARCHIVE %s %s (%d events): checks %v, detach %v, total %v\n", a.name, res.Partition.Name,
			res.Partition.Events, res.Check.Round(time.Millisecond), res.Detach.Round(time.Millisecond),
			res.Duration.Round(time.Millisecond))
	}
}

// comparePartitioned compares p (subject) with u (baseline) on appends and loads.
func comparePartitioned(b *testing.B, name string, p, u *eventstore.PostgresStore, shorts int) {
	ctx := context.Background()
	sides := []*eventstore.PostgresStore{p, u}
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("%s/append/clients=%d", name, clients), func(b *testing.B) {
			versions := [2][]int64{make([]int64, clients), make([]int64, clients)}
			op := func(side int) benchpair.Op {
				return func(w int) error {
					id := fmt.Sprintf("short-%d", 1+w*(shorts/16)+clients) // existing streams, one per worker
					if versions[side][w] == 0 {
						info, err := sides[side].Stream(ctx, "", id)
						if err != nil {
							return err
						}
						versions[side][w] = info.Version
					}
					res, err := sides[side].Append(ctx, eventstore.AppendRequest{StreamID: id,
						StreamType: "bench.account", Expected: eventstore.ExpectedVersion(versions[side][w]),
						Events: []eventstore.EventData{{Type: "bench.account.deposited",
							Payload: []byte(`{"amount": 42, "currency": "EUR"}`)}}})
					if err != nil {
						return err
					}
					versions[side][w] = res.Version
					return nil
				}
			}
			benchpair.Compare(b, benchpair.Config{Unit: "events", Clients: clients}, op(0), op(1))
		})
	}
	loads := []struct {
		name string
		load func(s *eventstore.PostgresStore, w int) error
	}{
		{"load/short", func(s *eventstore.PostgresStore, w int) error {
			_, err := s.ReadStream(ctx, "", fmt.Sprintf("short-%d", 1+(w*7919)%shorts), 1)
			return err
		}},
		{"load/long", func(s *eventstore.PostgresStore, _ int) error {
			recs, err := s.ReadStream(ctx, "", "long-2", 1)
			if err == nil && len(recs) < benchLongLen/2 {
				err = fmt.Errorf("long-2 has %d events", len(recs))
			}
			return err
		}},
		{"load/snapshot+tail", func(s *eventstore.PostgresStore, _ int) error {
			snap, err := s.LoadSnapshot(ctx, "", "long-1")
			if err != nil {
				return err
			}
			recs, err := s.ReadStream(ctx, "", "long-1", snap.Version)
			if err == nil && len(recs) != 21 {
				err = fmt.Errorf("long-1 from its snapshot: %d events, want 21", len(recs))
			}
			return err
		}},
	}
	for _, l := range loads {
		b.Run(name+"/"+l.name, func(b *testing.B) {
			n := 0
			benchpair.Compare(b, benchpair.Config{Unit: "loads"},
				func(int) error { n++; return l.load(p, n) }, func(int) error { n++; return l.load(u, n) })
		})
	}
}
