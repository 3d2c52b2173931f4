package outbox

import (
	"context"
	"testing"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// A dead-letter list with a TextLimit reads neither the metadata nor the last error whole: with one dead letter of
// each kind carrying a 1 MB error and 1 MB of metadata (stored out of line), listing them cut reads a few blocks of
// the TOAST table where the uncut list reads hundreds, as the table's own I/O counters show
// (pg_statio_user_tables, flushed by the listing connection). The cut list returns the error's first characters
// and no metadata.
func TestDeadLetterListsReadCutColumns(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	ctx := context.Background()
	q := func(table string) string { return pgtest.Q(schema, table) }
	big := `(SELECT string_agg(md5(i::text || random()::text), '') FROM generate_series(1, 32768) i)`
	pgtest.Exec(t, pool, `INSERT INTO `+q("outbox_dead_letters")+` (message_id, topic, tenant_id, message_type,
			payload, metadata, correlation_id, causation_id, partition_key, attempts, last_error, holds_key,
			created_at, dead_at)
		VALUES ('big', 'orders', 'acme', 'T', '\x00', jsonb_build_object('blob', `+big+`), '', '', '', 5, `+big+`,
			false, now(), now())`)
	pgtest.Exec(t, pool, `INSERT INTO `+q("inbox_dead_letters")+` (message_id, handler, tenant_id, message_type,
			topic, payload, metadata, attempts, last_error, dead_at)
		VALUES ('big', 'billing', 'acme', 'T', 'orders', '\x00', jsonb_build_object('blob', `+big+`), 3, `+big+`,
			now())`)
	o, err := New(pool, &Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = o.Close() }()
	all := o.AllTenants()

	// What the lists return.
	dls, err := all.DeadLetters(ctx, ListOptions{PayloadLimit: 1, TextLimit: 300})
	if err != nil || len(dls) != 1 {
		t.Fatalf("list: %v, %d rows", err, len(dls))
	}
	if len(dls[0].LastError) != 300 || dls[0].Metadata != nil {
		t.Fatalf("the cut list returned %d characters of error and metadata %d keys", len(dls[0].LastError),
			len(dls[0].Metadata))
	}
	idls, err := all.InboxDeadLetters(ctx, InboxListOptions{PayloadLimit: 1, TextLimit: 300})
	if err != nil || len(idls) != 1 {
		t.Fatalf("inbox list: %v, %d rows", err, len(idls))
	}
	if len(idls[0].LastError) != 300 || idls[0].Metadata != nil {
		t.Fatalf("the cut inbox list returned %d characters of error and metadata %d keys", len(idls[0].LastError),
			len(idls[0].Metadata))
	}
	whole, err := all.DeadLetters(ctx, ListOptions{PayloadLimit: 1})
	if err != nil || len(whole[0].LastError) != 32768*32 || len(whole[0].Metadata["blob"]) != 32768*32 {
		t.Fatalf("the uncut list: %v", err)
	}

	// What they read: the TOAST blocks of each table one listing touches.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	toastBlocks := func(table string) int64 {
		t.Helper()
		var n int64
		if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, `SELECT coalesce(toast_blks_hit, 0) + coalesce(toast_blks_read, 0)
			FROM pg_statio_user_tables WHERE schemaname = $1 AND relname = $2`, schema, table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	read := func(table, sql string, args []any) int64 {
		t.Helper()
		before := toastBlocks(table)
		rows, err := conn.Query(ctx, sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			if _, err := rows.Values(); err != nil {
				t.Fatal(err)
			}
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		return toastBlocks(table) - before
	}
	deadArgs := func(textLimit int) []any {
		return append(all.filter(ListOptions{}), keysetStart(true), "", "", "", 50, 1, textLimit)
	}
	inboxArgs := func(textLimit int) []any {
		return append(all.inboxFilter(InboxListOptions{}), keysetStart(true), "", "", "", 50, 1, textLimit)
	}
	for _, c := range []struct {
		table, sql string
		args       func(int) []any
	}{
		{"outbox_dead_letters", o.q.listDead[1], deadArgs},
		{"inbox_dead_letters", o.q.inboxListDead[1], inboxArgs},
	} {
		cut, uncut := read(c.table, c.sql, c.args(300)), read(c.table, c.sql, c.args(0))
		t.Logf("%s: %d TOAST blocks read cut, %d whole", c.table, cut, uncut)
		if uncut < 100 {
			t.Fatalf("%s: the whole list read only %d TOAST blocks: the measure is broken", c.table, uncut)
		}
		if cut > 10 {
			t.Errorf("%s: the cut list read %d TOAST blocks (the whole one %d)", c.table, cut, uncut)
		}
	}
}
