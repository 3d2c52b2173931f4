package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// The groups of dead letters by cause read the signature index alone: it covers the grouping. Whether the planner
// prefers it to reading the table depends on the table's visibility map (an index-only scan skips the heap only on
// all-visible pages, and a vacuum cannot mark them while another session's snapshot is older than the rows, as on
// a shared test cluster), so the test asks for the estate-wide plan without sequential scans: it must be an
// index-only scan of the signature index, grouped in its order. A tenant's scope reads the tenant's rows through
// an index (whichever), never the whole table.
func TestDeadLetterGroupsReadTheSignatureIndex(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	ctx := context.Background()
	for _, table := range []string{"outbox_dead_letters", "inbox_dead_letters"} {
		cols, vals := "topic, partition_key, correlation_id, causation_id, holds_key, created_at",
			"'orders', 'k' || (i % 100), '', '', false, now()"
		if table == "inbox_dead_letters" {
			cols, vals = "handler, topic", "'billing', 'orders'"
		}
		pgtest.Exec(t, pool, `INSERT INTO `+pgtest.Q(schema, table)+` (message_id, tenant_id, message_type,
				payload, metadata, attempts, last_error, dead_at, error_type, error_signature, `+cols+`)
			SELECT 'd' || i, 't' || (i % 50), 'T', convert_to(repeat('p', 1000), 'UTF8'), '{}', 5, 'boom ' || i,
				now() + i * interval '1 s', 'error', 'error: boom ' || (i % 19), `+vals+`
			FROM generate_series(1, 20000) i`)
		pgtest.Exec(t, pool, `VACUUM ANALYZE `+pgtest.Q(schema, table))
	}
	o, err := New(pool, &Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = o.Close() }()
	tenant := "t7"
	for _, c := range []struct {
		name, sql, index string
		args             []any
	}{
		{"dead letter groups", o.q.deadGroups, "outbox_dead_letters_signature_idx",
			append(o.AllTenants().filter(ListOptions{}), 50)},
		{"a tenant's dead letter groups", o.q.deadGroups, "",
			append((&Admin{o: o, tenant: &tenant}).filter(ListOptions{}), 50)},
		{"inbox dead letter groups", o.q.inboxDeadGroups, "inbox_dead_letters_signature_idx",
			append(o.AllTenants().inboxFilter(InboxListOptions{}), 50)},
		{"a tenant's inbox dead letter groups", o.q.inboxDeadGroups, "",
			append((&Admin{o: o, tenant: &tenant}).inboxFilter(InboxListOptions{}), 50)},
	} {
		var lines []string
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if c.index != "" {
				if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
					return err
				}
			}
			rows, err := tx.Query(ctx, "EXPLAIN "+c.sql, c.args...)
			if err != nil {
				return err
			}
			lines, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		plan := strings.Join(lines, "\n")
		switch {
		case c.index == "":
			if strings.Contains(plan, "Seq Scan on") {
				t.Errorf("%s reads the whole table:\n%s", c.name, plan)
			}
		case !strings.Contains(plan, "Index Only Scan using "+c.index) || strings.Contains(plan, "Heap Scan") ||
			!strings.Contains(plan, "GroupAggregate"):
			t.Errorf("%s does not group through %s alone:\n%s", c.name, c.index, plan)
		}
	}
}

// The operator views read the big tables through indexes: on a ledger of 200,000 entries, an inbox of 50,000 and
// 20,000 dead letters (analyzed), none of their statements scans the ledger, the inbox or the dead letters from
// end to end. The hot outbox table is the one table they may scan (it holds only messages still to publish).
func TestOperatorViewsUseIndexes(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	ctx := context.Background()
	q := func(table string) string { return pgtest.Q(schema, table) }
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	pgtest.Exec(t, pool, `INSERT INTO `+q("outbox_sent")+` (message_id, topic, tenant_id, message_type,
			source_position, attempts, created_at, sent_at)
		SELECT 'm' || i, 'orders', 'acme', 'T', i, 1, $1::timestamptz + i * interval '1 ms',
			$1::timestamptz + i * interval '1 ms' + interval '5 ms'
		FROM generate_series(1, 200000) i`, base)
	pgtest.Exec(t, pool, `INSERT INTO `+q("inbox")+` (message_id, handler, tenant_id, processed_at)
		SELECT 'm' || i, 'billing', 'acme', $1::timestamptz + i * interval '4 ms' FROM generate_series(1, 50000) i`,
		base)
	for _, table := range []string{"outbox_dead_letters", "inbox_dead_letters"} {
		cols, vals := "topic, partition_key, correlation_id, causation_id, holds_key, created_at",
			"'orders', 'k' || (i % 100), '', '', false, $1::timestamptz"
		if table == "inbox_dead_letters" {
			cols, vals = "handler, topic", "'billing', 'orders'"
		}
		// Dead letters as they come: a payload of a kilobyte, a few headers, twenty causes (one of them rare).
		pgtest.Exec(t, pool, `INSERT INTO `+q(table)+` (message_id, tenant_id, message_type, payload, metadata,
				attempts, last_error, dead_at, error_type, error_signature, `+cols+`)
			SELECT 'd' || i, 't' || (i % 50), 'T', convert_to(repeat('p', 1000), 'UTF8'),
				jsonb_build_object('aggregate-id', 's' || i, 'correlation-id', 'c' || i, 'event-id', md5(i::text)),
				5, 'boom ' || i, $1::timestamptz - interval '20000 s' + i * interval '1 s', 'error',
				'error: boom ' || CASE WHEN i = 7 THEN 'rare' ELSE (i % 19)::text END, `+vals+`
			FROM generate_series(1, 20000) i`, base)
	}
	pgtest.Exec(t, pool, `VACUUM ANALYZE `+q("outbox_sent")+`, `+q("inbox")+`, `+q("outbox_dead_letters")+`, `+
		q("inbox_dead_letters"))

	o, err := New(pool, &Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = o.Close() }()
	all := o.AllTenants()
	end := base.Add(200 * time.Second)
	since := end.Add(-time.Minute)
	deadArgs := func(newest bool, tenant *string) []any {
		a := &Admin{o: o, tenant: tenant}
		return append(a.filter(ListOptions{}), keysetStart(newest), "", "", "", 50, 0, 0)
	}
	inboxArgs := func(newest bool) []any {
		return append(all.inboxFilter(InboxListOptions{}), keysetStart(newest), "", "", "", 50, 0, 0)
	}
	tenant := "t7"
	for _, c := range []struct {
		name, sql string
		args      []any
		big       []string // tables that must not be scanned from end to end
	}{
		{"recently published", o.q.recentlyPublished, []any{since, nil, 100}, []string{"outbox_sent"}},
		{"recently handled", o.q.recentlyHandled, []any{since, nil, 100}, []string{"outbox_sent", "inbox"}},
		{"activity", o.q.activity, []any{since, end, nil}, []string{"outbox_sent", "inbox", "outbox_dead_letters",
			"inbox_dead_letters"}},
		{"staged from", o.q.stagedFrom, []any{[]int64{150000, 150001}, 150000, 150001, nil},
			[]string{"outbox_sent"}},
		{"dead letters, oldest first", o.q.listDead[0], deadArgs(false, nil), []string{"outbox_dead_letters"}},
		{"dead letters, newest first", o.q.listDead[1], deadArgs(true, nil), []string{"outbox_dead_letters"}},
		{"a tenant's dead letters", o.q.listDead[1], deadArgs(true, &tenant), []string{"outbox_dead_letters"}},
		{"inbox dead letters, oldest first", o.q.inboxListDead[0], inboxArgs(false), []string{"inbox_dead_letters"}},
		{"inbox dead letters, newest first", o.q.inboxListDead[1], inboxArgs(true), []string{"inbox_dead_letters"}},
		{"inbox entries", o.q.inboxEntries, []any{[]string{"m1", "m2"}, nil}, []string{"inbox"}},
		{"find by correlation", o.q.findIDs[0], []any{"c-1", nil, FindScanLimit, 51},
			[]string{"outbox_dead_letters", "inbox_dead_letters"}},
		{"find by stream", o.q.findIDs[1], []any{"s-1", nil, FindScanLimit, 51},
			[]string{"outbox_dead_letters", "inbox_dead_letters"}},
		{"find by key", o.q.findIDs[2], []any{"k7", nil, FindScanLimit, 51},
			[]string{"outbox_dead_letters", "inbox_dead_letters"}},
		{"find messages", o.q.findMessages, []any{[]string{"m1", "d2"}, nil, end},
			[]string{"outbox_sent", "outbox_dead_letters"}},
		{"find in the inbox", o.q.findInbox, []any{[]string{"m1", "d2"}, nil},
			[]string{"inbox", "inbox_dead_letters"}},
		{"failure history", o.q.failuresOf, []any{[]string{"m1", "d2"}, nil}, []string{"message_failures"}},
	} {
		rows, err := pool.Query(ctx, "EXPLAIN "+c.sql, c.args...)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		plan := strings.Join(lines, "\n")
		if testing.Verbose() {
			t.Logf("%s:\n%s", c.name, plan)
		}
		for _, table := range c.big {
			if strings.Contains(plan, "Seq Scan on "+table+" ") {
				t.Errorf("%s scans %s from end to end:\n%s", c.name, table, plan)
			}
		}
	}
}
