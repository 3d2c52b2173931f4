package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/internal/pgtest"
)

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
		pgtest.Exec(t, pool, `INSERT INTO `+q(table)+` (message_id, tenant_id, message_type, payload, metadata,
				attempts, last_error, dead_at, `+cols+`)
			SELECT 'd' || i, 't' || (i % 50), 'T', '\x00', '{}', 5, 'boom ' || i,
				$1::timestamptz - interval '20000 s' + i * interval '1 s', `+vals+`
			FROM generate_series(1, 20000) i`, base)
	}
	pgtest.Exec(t, pool, `ANALYZE `+q("outbox_sent")+`, `+q("inbox")+`, `+q("outbox_dead_letters")+`, `+
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
		for _, table := range c.big {
			if strings.Contains(plan, "Seq Scan on "+table+" ") {
				t.Errorf("%s scans %s from end to end:\n%s", c.name, table, plan)
			}
		}
	}
}
