package shred_test

// The cost of encrypted fields, side by side with the same event in clear, in alternating rounds of one run on a
// durable cluster (DATABASE_URL unset):
//
//	go test ./shred -run '^$' -bench . -benchtime 1x
//
// Both sides save through the same repository set-up (Transactional staging, one message per event) and load the
// same aggregates; the clear side's registry uses encoding/json, so its struct tags are ignored.

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/internal/testkit/benchpair"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/shred"
)

// benchWorlds returns two worlds on schemas of their own on a durable cluster, without snapshots: one encrypting
// with codecCfg, one in clear.
func benchWorlds(b *testing.B, codecCfg *shred.CodecConfig) (encrypted, clear *world) {
	b.Helper()
	url := pgtest.DurableURL(b)
	pool, schema := pgtest.MigratedOn(b, url)
	encrypted = worldOn(b, pool, schema, codecCfg, true, 0)
	schema2 := pgtest.NewSchemaName(b)
	pgtest.Exec(b, pool, "CREATE SCHEMA "+pgx.Identifier{schema2}.Sanitize())
	b.Cleanup(func() { pgtest.DropSchema(b, pool, schema2) })
	if _, err := stagehand.Migrate(context.Background(), pool, &stagehand.MigrateConfig{Schema: schema2}); err != nil {
		b.Fatal(err)
	}
	clear = worldOn(b, pool, schema2, nil, false, 0)
	return encrypted, clear
}

var benchSeq atomic.Int64

// BenchmarkSave saves one event (and stages its message) for a subject the key store already knows (its key is in
// the codec's cache), at 1 and 16 clients, and for a new subject (whose first save makes its key: one more short
// transaction), encrypted beside in clear.
func BenchmarkSave(b *testing.B) {
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("known-subject/clients=%d", clients), func(b *testing.B) {
			enc, clr := benchWorlds(b, nil)
			ctx := context.Background()
			ids := make([]string, clients)
			for i := range ids {
				ids[i] = fmt.Sprintf("c-%d", benchSeq.Add(1))
				enc.register(ids[i], "Name "+ids[i], ids[i]+"@example.com", "basic")
				clr.register(ids[i], "Name "+ids[i], ids[i]+"@example.com", "basic")
			}
			save := func(w *world) benchpair.Op {
				custs := make([]*Customer, clients)
				for i := range custs {
					custs[i] = w.load(ids[i])
				}
				return func(i int) error {
					c := custs[i]
					aggregate.Raise(c, EmailChanged{CustomerID: c.ID(), Email: fmt.Sprintf("%s-%d@example.com",
						c.ID(), c.Version()), Reason: "moved"})
					return w.repo.Save(ctx, c)
				}
			}
			benchpair.Compare(b, benchpair.Config{Unit: "saves", Clients: clients,
				Names: [2]string{"encrypted", "clear"}}, save(enc), save(clr))
		})
	}
	b.Run("new-subject/clients=1", func(b *testing.B) {
		enc, clr := benchWorlds(b, nil)
		create := func(w *world) benchpair.Op {
			return func(int) error {
				id := fmt.Sprintf("n-%d", benchSeq.Add(1))
				_, err := w.repo.Create(context.Background(), id, func(c *Customer) error {
					aggregate.Raise(c, CustomerRegistered{CustomerID: id, Name: "Name " + id, Email: id + "@example.com",
						Plan: "basic"})
					return nil
				})
				return err
			}
		}
		benchpair.Compare(b, benchpair.Config{Unit: "saves", Names: [2]string{"encrypted", "clear"}}, create(enc),
			create(clr))
	})
}

// BenchmarkLoad loads an aggregate of 10 events (no snapshot) whose key is cached, and with the cache off (each
// encrypted field asks the key store), encrypted beside in clear.
func BenchmarkLoad(b *testing.B) {
	for _, cached := range []bool{true, false} {
		b.Run(fmt.Sprintf("cached=%t", cached), func(b *testing.B) {
			var cfg *shred.CodecConfig
			if !cached {
				cfg = &shred.CodecConfig{CacheTTL: -1}
			}
			enc, clr := benchWorlds(b, cfg)
			ctx := context.Background()
			id := fmt.Sprintf("l-%d", benchSeq.Add(1))
			for _, w := range []*world{enc, clr} {
				w.register(id, "Name", "first@example.com", "basic")
				for i := range 9 {
					w.changeEmail(id, fmt.Sprintf("e%d@example.com", i), "moved")
				}
			}
			load := func(w *world) benchpair.Op {
				return func(int) error {
					c, err := w.repo.Load(ctx, id)
					if err == nil && c.Version() != 10 {
						err = fmt.Errorf("loaded version %d", c.Version())
					}
					return err
				}
			}
			benchpair.Compare(b, benchpair.Config{Unit: "loads", Names: [2]string{"encrypted", "clear"}},
				load(enc), load(clr))
		})
	}
}

// BenchmarkCodec is the codec's own CPU cost for one event with two personal fields (key cached), beside
// encoding/json: go test ./shred -run '^$' -bench Codec
func BenchmarkCodec(b *testing.B) {
	c, err := shred.NewCodec(shred.NewMemoryKeyStore(), nil)
	if err != nil {
		b.Fatal(err)
	}
	ev := CustomerRegistered{CustomerID: "c-1", Name: "Alice Liddell", Email: "alice@example.com", Plan: "basic"}
	for _, side := range []struct {
		name  string
		codec aggregate.Codec
	}{{"encrypted", c}, {"clear", aggregate.JSONCodec{}}} {
		b.Run(side.name+"/marshal", func(b *testing.B) {
			for b.Loop() {
				if _, err := side.codec.Marshal(ev); err != nil {
					b.Fatal(err)
				}
			}
		})
		data, err := side.codec.Marshal(ev)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(side.name+"/unmarshal", func(b *testing.B) {
			for b.Loop() {
				var out CustomerRegistered
				if err := side.codec.Unmarshal(data, &out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
