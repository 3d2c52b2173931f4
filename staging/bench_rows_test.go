package staging

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// TestSameRowsWritesWhatASaveWrites holds BenchmarkSaveSameRows to its claim: its raw side writes event and outbox
// rows of the same shape as a Transactional save of the same events (which columns are filled, the metadata's
// headers, message sequence numbers, source positions that are the events' positions, a key's later messages
// parked), in its scalar form (one event a call) and its multi-row form, so a change to what a save stores fails
// here until the baseline follows. It also holds BenchmarkRowParts to its: each part left out is gone from the raw
// side's rows, and only that part.
func TestSameRowsWritesWhatASaveWrites(t *testing.T) {
	for _, c := range []struct{ n, calls int }{{3, 1}, {1, 2}} {
		t.Run(fmt.Sprintf("events=%d", c.n), func(t *testing.T) {
			e, save := saver(t, Transactional, 1, c.n)
			raw := sameRows(e, 1, c.n, rowParts{})
			for range c.calls {
				if err := save(0); err != nil {
					t.Fatal(err)
				}
				if err := raw(0); err != nil {
					t.Fatal(err)
				}
			}
			evs, msgs := rowShapes(t, e, c.n*c.calls)
			for _, s := range []struct {
				what      string
				save, raw []string
			}{{"event", evs["save"], evs["raw"]}, {"message", msgs["save"], msgs["raw"]}} {
				for i := range s.save {
					if s.save[i] != s.raw[i] {
						t.Errorf("%s %d: the save wrote\n  %s\nthe raw side\n  %s", s.what, i+1, s.save[i], s.raw[i])
					}
				}
			}
			// The parking pattern is part of the shape: the first message due, the others parked.
			if !strings.HasSuffix(msgs["save"][0], " f t 0") || !strings.HasSuffix(msgs["save"][1], " t t 0") {
				t.Fatalf("unexpected shape of the save's messages: %v", msgs["save"])
			}
		})
	}
	t.Run("parts", func(t *testing.T) {
		ctx := context.Background()
		for _, c := range []struct {
			leave rowParts
			want  string // the left-out row's headers, sequence/parking and links, beside the whole row's
		}{
			{rowParts{}, "headers order links"},
			{rowParts{headers: true}, "order links"},
			{rowParts{order: true}, "headers links"},
			{rowParts{links: true}, "headers order"},
			{rowParts{headers: true, order: true, links: true}, ""},
		} {
			for _, n := range []int{1, 3} {
				e := benchEnv(t)
				raw := sameRows(e, 1, n, c.leave)
				for range 2 {
					if err := raw(0); err != nil {
						t.Fatal(err)
					}
				}
				var got string
				if err := e.pool.QueryRow(ctx, `SELECT concat_ws(' ',
					CASE WHEN bool_and(metadata ? 'event-id') THEN 'headers' END,
					CASE WHEN bool_and(seq IS NOT NULL) AND bool_or(next_attempt_at = 'infinity') THEN 'order' END,
					CASE WHEN bool_and(causation_id <> '' AND correlation_id <> '' AND source_position IS NOT NULL)
						THEN 'links' END)
				FROM `+pgtest.Q(e.schema, "outbox")).Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != c.want {
					t.Errorf("sameRows of %d events leaving out %+v wrote rows with %q, want %q", n, c.leave, got, c.want)
				}
			}
		}
	})
}

// rowShapes returns, by side ("save", "raw"), the shape of each event and each outbox row in e's schema: which
// columns are filled and with what kind of value, row by row in version order.
func rowShapes(t *testing.T, e *env, n int) (events, messages map[string][]string) {
	t.Helper()
	ctx := context.Background()
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
	eventsT, outboxT := pgtest.Q(e.schema, "events"), pgtest.Q(e.schema, "outbox")
	events = shapes(`SELECT ` + side("stream_id") + `, concat_ws(' ', stream_type, version, event_type, payload::text,
		event_version, metadata::text, occurred_at IS NOT NULL, recorded_at IS NOT NULL)
		FROM ` + eventsT + ` ORDER BY stream_id, version`)
	messages = shapes(`SELECT ` + side("o.partition_key") + `, concat_ws(' ', o.topic, o.message_type,
		convert_from(o.payload, 'UTF8'), o.tenant_id, o.message_id IS NOT NULL,
		(SELECT string_agg(k, ',' ORDER BY k) FROM jsonb_object_keys(o.metadata) AS k),
		o.metadata->>'event-id' = o.causation_id, o.correlation_id = o.causation_id,
		o.metadata->>'aggregate-id' = o.partition_key, o.seq IS NOT NULL,
		o.source_position = e.position, o.next_attempt_at = 'infinity', o.scheduled_at IS NULL, o.attempts)
		FROM ` + outboxT + ` o JOIN ` + eventsT + ` e ON e.event_id::text = o.causation_id
		ORDER BY o.partition_key, o.seq`)
	return events, messages
}

// TestPlainPairWritesTheSameRowsEitherWay holds BenchmarkRowParts' payload comparison to its claim: the plain pair
// that sends its payload as a parameter writes the very rows of the one whose statements carry it as a constant.
func TestPlainPairWritesTheSameRowsEitherWay(t *testing.T) {
	e := benchEnv(t)
	for _, sent := range []bool{false, true} {
		if err := plainPair(e, 1, sent)(0); err != nil {
			t.Fatal(err)
		}
	}
	var events, messages int
	if err := e.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(DISTINCT (stream_type, version, event_type, payload, event_version, metadata)) FROM `+
		pgtest.Q(e.schema, "events")+`),
		(SELECT count(DISTINCT (topic, message_type, payload, metadata, seq, next_attempt_at = 'infinity')) FROM `+
		pgtest.Q(e.schema, "outbox")+`)`).Scan(&events, &messages); err != nil {
		t.Fatal(err)
	}
	if events != 1 || messages != 1 {
		t.Fatalf("the two plain pairs wrote %d kinds of event row and %d kinds of outbox row, want 1 and 1", events,
			messages)
	}
}
