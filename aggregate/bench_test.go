package aggregate_test

// Benchmarks on a durable cluster (fsync and synchronous_commit on), each beside a raw-pgx baseline that writes or
// reads the same rows with the minimal SQL a hand-written store would use, alternating in the same run:
//
//	go test ./aggregate -run '^$' -bench . -benchtime 1x

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/benchpair"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

func benchRepo(b *testing.B, cfg *aggregate.RepositoryConfig) (*pgxpool.Pool, string, *aggregate.Repository[*Account]) {
	b.Helper()
	pool, schema := pgtest.MigratedOn(b, pgtest.DurableURL(b))
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(store.Close)
	r, err := aggregate.NewRepository[*Account](store, newRegistry(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	return pool, schema, r
}

var streamSeq atomic.Int64

// BenchmarkSave saves an aggregate with 1 or 10 new events per save, at 1 and 16 concurrent clients, beside a raw
// INSERT of the same event rows (versions computed by the client, the unique constraint for concurrency).
func BenchmarkSave(b *testing.B) {
	for _, events := range []int{1, 10} {
		for _, clients := range []int{1, 16} {
			b.Run(fmt.Sprintf("events=%d/clients=%d", events, clients), func(b *testing.B) {
				pool, schema, r := benchRepo(b, nil)
				ctx := context.Background()
				accounts := make([]*Account, clients)
				for i := range accounts {
					accounts[i] = r.New(fmt.Sprintf("s-%d", streamSeq.Add(1)))
				}
				type rawStream struct {
					id      string
					version int64
				}
				raws := make([]rawStream, clients)
				for i := range raws {
					raws[i].id = fmt.Sprintf("raw-%d", streamSeq.Add(1))
				}
				insert := `INSERT INTO ` + pgtest.Q(schema, "events") + ` (tenant_id, stream_id, stream_type,
					version, event_id, event_type, payload, metadata, occurred_at)
					SELECT $1, $2, $3, v, id, $4, p, '{}', now()
					FROM unnest($5::bigint[], $6::uuid[], $7::jsonb[]) AS d(v, id, p)`
				benchpair.Compare(b, benchpair.Config{Unit: "events", UnitsPerOp: events, Clients: clients},
					func(w int) error {
						a := accounts[w]
						for i := range events {
							_ = a.Deposit(int64(i + 1))
						}
						return r.Save(ctx, a)
					},
					func(w int) error {
						s := &raws[w]
						vs := make([]int64, events)
						ids := make([]string, events)
						payloads := make([]string, events)
						for i := range events {
							s.version++
							vs[i] = s.version
							ids[i] = uuid.Must(uuid.NewV7()).String()
							p, _ := json.Marshal(Deposited{Amount: int64(i + 1)})
							payloads[i] = string(p)
						}
						_, err := pool.Exec(ctx, insert, stagehand.NoTenant, s.id, "bank.account",
							"bank.account.deposited", vs, ids, payloads)
						return err
					})
			})
		}
	}
}

// BenchmarkLoad loads a 100- and a 1,000-event aggregate, with and without a snapshot 10 events before the end,
// beside raw reads of the same rows (snapshot row, then the events after it) decoded with encoding/json into the
// same structs and applied, as a hand-written loader would.
func BenchmarkLoad(b *testing.B) {
	for _, size := range []int{100, 1000} {
		for _, snap := range []bool{false, true} {
			b.Run(fmt.Sprintf("events=%d/snapshot=%t", size, snap), func(b *testing.B) {
				cfg := &aggregate.RepositoryConfig{}
				if snap {
					cfg.SnapshotEvery = size - 10
				}
				pool, schema, r := benchRepo(b, cfg)
				ctx := context.Background()
				a := r.New("big")
				_ = a.Open("ann")
				for v := 2; v <= size; v++ {
					_ = a.Deposit(1)
					if v == size-10 || v == size {
						if err := r.Save(ctx, a); err != nil {
							b.Fatal(err)
						}
					}
				}
				events := pgtest.Q(schema, "events")
				snapshots := pgtest.Q(schema, "snapshots")
				benchpair.Compare(b, benchpair.Config{Unit: "loads"},
					func(int) error {
						got, err := r.Load(ctx, "big")
						if err == nil && got.Version() != int64(size) {
							err = fmt.Errorf("loaded version %d", got.Version())
						}
						return err
					},
					func(int) error {
						from := int64(1)
						if snap {
							var payload []byte
							if err := pool.QueryRow(ctx, `SELECT version, payload FROM `+snapshots+
								` WHERE tenant_id = $1 AND stream_id = $2`, stagehand.NoTenant, "big").
								Scan(&from, &payload); err != nil {
								return err
							}
							from++
						}
						rows, err := pool.Query(ctx, `SELECT version, event_type, payload FROM `+events+
							` WHERE tenant_id = $1 AND stream_id = $2 AND version >= $3 ORDER BY version`,
							stagehand.NoTenant, "big", from)
						if err != nil {
							return err
						}
						defer rows.Close()
						// What a hand-written loader does with the rows: decode each payload into its struct and
						// apply it.
						acct := NewAccount("big")
						for rows.Next() {
							var v int64
							var typ string
							var p []byte
							if err := rows.Scan(&v, &typ, &p); err != nil {
								return err
							}
							var e any
							switch typ {
							case "bank.account.opened":
								var o Opened
								err = json.Unmarshal(p, &o)
								e = o
							case "bank.account.deposited":
								var d Deposited
								err = json.Unmarshal(p, &d)
								e = d
							}
							if err != nil {
								return err
							}
							acct.Apply(e)
						}
						return rows.Err()
					})
			})
		}
	}
}
