package outbox

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/internal/pgtest"
)

// The promotion and the sweep update rows they found by key, by id: with a deep backlog of parked messages and
// statistics from when the table was nearly empty (autovacuum has not analysed it yet), their generic plans must
// still update through the primary key. A recheck written "= 'infinity'" matched the parked index's predicate, and
// the plan scanned the whole parked index comparing every entry with the ids: a sweep of a 40,000-message backlog
// over 4,000 keys ran for minutes (measured by proof/scalebench).
func TestPromotionsUpdateThroughThePrimaryKeyOnStaleStatistics(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	ctx := context.Background()
	table := pgtest.Q(schema, "outbox")
	pgtest.Exec(t, pool, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`)
	pgtest.Exec(t, pool, `ANALYZE `+table) // empty
	ob, err := New(pool, &Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ob.Close() }()
	msgs := make([]Message, 3000)
	for i := range msgs {
		msgs[i] = Message{ID: fmt.Sprint("m", i), Topic: "t", PartitionKey: fmt.Sprint("k", i%30)}
	}
	if _, err := ob.Stage(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Count(t, pool, `SELECT count(*) FROM `+table+` WHERE next_attempt_at = 'infinity'`); n != 2970 {
		t.Fatalf("parked: %d", n)
	}
	plan := func(name, sql, args string) string {
		var out []string
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, ob.q.relaySettings); err != nil { // generic plans, no sequential scans
				return err
			}
			if _, err := tx.Exec(ctx, "PREPARE "+name+" AS "+sql); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, "EXPLAIN EXECUTE "+name+args)
			if err != nil {
				return err
			}
			out, err = pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, "DEALLOCATE "+name)
			return err
		})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return strings.Join(out, "\n")
	}
	byKey := regexp.MustCompile(`Index Scan using outbox_pkey on outbox\s+\(`)
	byParked := regexp.MustCompile(`Scan using outbox_parked_idx on outbox\s+\(`) // the updated table, no alias
	for name, p := range map[string]string{
		"promote": plan("promote_plan", ob.q.promote, `('{__untenanted__}', '{k1}', now())`),
		"sweep":   plan("sweep_plan", ob.q.sweep, `(now())`),
	} {
		if !byKey.MatchString(p) || byParked.MatchString(p) {
			t.Errorf("the %s updates its rows through the parked index, not the primary key:\n%s", name, p)
		}
	}
}
