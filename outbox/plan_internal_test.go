package outbox

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
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

// Staging many messages at once rechecks them against the ledger and the dead letters: it must probe the outbox
// only for the IDs it found there, one index probe each, whatever the table's statistics. On statistics from a
// nearly empty outbox the row lookup was pulled up into a plain join driven by a full scan of the outbox's message
// key index, comparing every row with every staged ID: staging 1,000 messages into a 32,000-row outbox took 8.5 s
// per statement (measured by proof/scalebench).
func TestStagingRecheckProbesTheOutboxPerIDOnStaleStatistics(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	ctx := context.Background()
	table := pgtest.Q(schema, "outbox")
	pgtest.Exec(t, pool, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`)
	ob, err := New(pool, &Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ob.Close() }()
	stage := func(round string) {
		msgs := make([]Message, 3000)
		for i := range msgs {
			msgs[i] = Message{ID: fmt.Sprint(round, i), Topic: "t"}
		}
		if _, err := ob.Stage(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	// Statistics of a drained outbox: its pages kept (the outbox is never truncated by vacuum), no rows.
	stage("old")
	pgtest.Exec(t, pool, `DELETE FROM `+table)
	pgtest.Exec(t, pool, `VACUUM ANALYZE `+table)
	stage("m")
	var lines []string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "PREPARE recheck_plan AS "+ob.q.stageRecheckMany); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `EXPLAIN EXECUTE recheck_plan('{m1,m2}', '{t,t}', '{__untenanted__,__untenanted__}')`)
		if err != nil {
			return err
		}
		lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(lines, "\n")
	if !regexp.MustCompile(`Index Cond: \(\(message_id = k\.message_id\)`).MatchString(plan) ||
		regexp.MustCompile(`Join Filter: .*k\.message_id = o\.message_id`).MatchString(plan) {
		t.Errorf("the recheck does not probe the outbox per staged ID:\n%s", plan)
	}
}
