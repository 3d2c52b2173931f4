package staging

import (
	"context"
	"strings"
	"testing"

	"github.com/stagehand-es/stagehand/internal/pgtest"
)

// TestSameRowsWritesWhatASaveWrites holds BenchmarkSaveSameRows to its claim: its raw side writes event and outbox
// rows of the same shape as a Transactional save of the same events (which columns are filled, the metadata's
// headers, message sequence numbers, source positions that are the events' positions, a key's later messages
// parked), so a change to what a save stores fails here until the baseline follows.
func TestSameRowsWritesWhatASaveWrites(t *testing.T) {
	const n = 3
	e, save := saver(t, Transactional, 1, n)
	if err := save(0); err != nil {
		t.Fatal(err)
	}
	if err := sameRows(e, 1, n)(0); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	events, outboxT := pgtest.Q(e.schema, "events"), pgtest.Q(e.schema, "outbox")
	shapes := func(query string) map[string][]string {
		t.Helper()
		rows, err := e.pool.Query(ctx, query)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		bySide := map[string][]string{}
		for rows.Next() {
			var side, shape string
			if err := rows.Scan(&side, &shape); err != nil {
				t.Fatal(err)
			}
			bySide[side] = append(bySide[side], shape)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if len(bySide) != 2 || len(bySide["save"]) != n || len(bySide["raw"]) != n {
			t.Fatalf("want %d rows from each side, got %v", n, bySide)
		}
		return bySide
	}
	side := func(stream string) string {
		return `CASE WHEN ` + stream + ` LIKE 'raw-%' THEN 'raw' ELSE 'save' END`
	}
	// Which columns are filled, and with what kind of value, row by row in version order.
	evs := shapes(`SELECT ` + side("stream_id") + `, concat_ws(' ', stream_type, version, event_type, payload::text,
		event_version, metadata::text, occurred_at IS NOT NULL, recorded_at IS NOT NULL)
		FROM ` + events + ` ORDER BY stream_id, version`)
	msgs := shapes(`SELECT ` + side("o.partition_key") + `, concat_ws(' ', o.topic, o.message_type,
		convert_from(o.payload, 'UTF8'), o.tenant_id, o.message_id IS NOT NULL,
		(SELECT string_agg(k, ',' ORDER BY k) FROM jsonb_object_keys(o.metadata) AS k),
		o.metadata->>'event-id' = o.causation_id, o.correlation_id = o.causation_id,
		o.metadata->>'aggregate-id' = o.partition_key, o.seq IS NOT NULL,
		o.source_position = e.position, o.next_attempt_at = 'infinity', o.scheduled_at IS NULL, o.attempts)
		FROM ` + outboxT + ` o JOIN ` + events + ` e ON e.event_id::text = o.causation_id
		ORDER BY o.partition_key, o.seq`)
	for _, c := range []struct {
		what      string
		save, raw []string
	}{{"event", evs["save"], evs["raw"]}, {"message", msgs["save"], msgs["raw"]}} {
		for i := range c.save {
			if c.save[i] != c.raw[i] {
				t.Errorf("%s %d: the save wrote\n  %s\nthe raw side\n  %s", c.what, i+1, c.save[i], c.raw[i])
			}
		}
	}
	// The parking pattern is part of the shape: the first message due, the others parked.
	if !strings.HasSuffix(msgs["save"][0], " f t 0") || !strings.HasSuffix(msgs["save"][1], " t t 0") {
		t.Fatalf("unexpected shape of the save's messages: %v", msgs["save"])
	}
}
