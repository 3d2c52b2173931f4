package health_test

import (
	"context"
	"testing"
	"time"

	"github.com/stagehand-es/stagehand/health"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// BenchmarkCheckOutbox measures one Check of an outbox whose sent ledger holds 200,000 entries, 1,000 messages
// pending: the check reads outbox.Admin.Backlog (the statistics without the count of the ledger) and the progress
// probe only the ledger's newest entries (BRIN on sent_at), so its cost does not grow with the ledger; Stats, which
// counts the ledger, is measured beside it.
//
//	go test -run '^$' -bench CheckOutbox -benchtime 50x ./health/
func BenchmarkCheckOutbox(b *testing.B) {
	e := setup(b)
	pgtest.Exec(b, e.pool, `INSERT INTO `+pgtest.Q(e.schema, "outbox_sent")+` (message_id, topic, tenant_id,
		message_type, attempts, created_at, sent_at)
		SELECT 'm' || i, 'orders', 'acme', 'x', 0, now() - interval '1 day', now() - (200000 - i) * interval '1 ms'
		FROM generate_series(1, 200000) i`)
	// As autovacuum does on an insert-only table: a BRIN index summarizes block ranges only when vacuumed, and
	// ranges not yet summarized are always read.
	pgtest.Exec(b, e.pool, `VACUUM ANALYZE `+pgtest.Q(e.schema, "outbox_sent"))
	e.stage(b, "p", 1000)
	c, err := health.New(&health.Config{Outbox: e.ob.AllTenants()})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	first := c.Check(ctx)
	if first.Status != health.Healthy {
		b.Fatalf("%v", first.Reasons)
	}
	b.Run("Check", func(b *testing.B) {
		for range b.N {
			c.Check(ctx)
		}
	})
	// The two queries a Check makes of the outbox, apart, and Stats.
	b.Run("Backlog", func(b *testing.B) {
		for range b.N {
			if _, err := e.ob.AllTenants().Backlog(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Stats", func(b *testing.B) {
		for range b.N {
			if _, err := e.ob.AllTenants().Stats(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	last, err := e.ob.AllTenants().LastPublished(ctx, time.Time{})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("LastPublished", func(b *testing.B) {
		for range b.N {
			if _, err := e.ob.AllTenants().LastPublished(ctx, last); err != nil {
				b.Fatal(err)
			}
		}
	})
}
