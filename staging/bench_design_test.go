package staging

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/benchpair"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// BenchmarkSaveTenOneRowPerKey prices, before it is built, a layout of the outbox that writes one row per (save,
// key) instead of one per message: the key's first message in the row's columns, the others in arrays of the same
// row (IDs, payloads, metadata, source positions), one sequence number, one set of index entries. Both sides are raw
// SQL on a benchmark schema whose outbox has those array columns added, so the comparison prices the rows alone.
// Ten events a save, each mapped to one message of the save's key, at 1 and 16 clients:
//
//   - rows: the rows a Transactional save writes today (BenchmarkSaveSameRows' raw side: ten events, ten staged
//     messages, the key's later messages parked) beside the same ten events and one row carrying the ten messages
//     with the same columns filled;
//   - plain: that one row beside the plain pair of BenchmarkSaveTen (ten events, ten plain outbox rows), the
//     baseline BenchmarkSaveTen's target is stated against.
//
// A save on the new layout would run at about (save / rows today, from BenchmarkSaveSameRows) x (one row / plain)
// of the plain pair:
//
//	go test ./staging -run '^$' -bench 'BenchmarkSaveTenOneRowPerKey' -benchtime 1x
func BenchmarkSaveTenOneRowPerKey(b *testing.B) {
	const n = 10
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("rows/clients=%d", clients), func(b *testing.B) {
			e := benchEnv(b)
			addMessageArrays(b, e)
			benchpair.Compare(b, benchpair.Config{Unit: "events", UnitsPerOp: n, Clients: clients,
				Names: [2]string{"one-row-per-key", "row-per-message"}}, oneRowPerKey(e, clients, n),
				sameRows(e, clients, n, rowParts{}))
		})
		b.Run(fmt.Sprintf("plain/clients=%d", clients), func(b *testing.B) {
			e := benchEnv(b)
			addMessageArrays(b, e)
			benchpair.Compare(b, benchpair.Config{Unit: "events", UnitsPerOp: n, Clients: clients,
				Names: [2]string{"one-row-per-key", "raw"}}, oneRowPerKey(e, clients, n), plainTen(e, clients, n))
		})
	}
}

// addMessageArrays adds to e's outbox the columns a row carrying a key's later messages would need.
func addMessageArrays(tb testing.TB, e *env) {
	tb.Helper()
	if _, err := e.pool.Exec(context.Background(), `ALTER TABLE `+pgtest.Q(e.schema, "outbox")+`
		ADD COLUMN more_ids text[], ADD COLUMN more_payloads bytea[], ADD COLUMN more_metadata jsonb[],
		ADD COLUMN more_causation_ids text[], ADD COLUMN more_positions bigint[]`); err != nil {
		tb.Fatal(err)
	}
}

// oneRowPerKey is sameRows' many-event form (the same events, the same columns of a staged message) writing the n
// messages of one key as one outbox row: the first in the row's columns, the rest in its arrays.
func oneRowPerKey(e *env, clients, n int) benchpair.Op {
	events, outboxT := pgtest.Q(e.schema, "events"), pgtest.Q(e.schema, "outbox")
	seq := strings.ReplaceAll(pgtest.Q(e.schema, "outbox_seq"), "'", "''")
	appendMany := rawAppendMany(events)
	stageRow := `INSERT INTO ` + outboxT + ` (message_id, message_type, topic, payload, metadata, tenant_id,
		correlation_id, causation_id, partition_key, seq, source_position, next_attempt_at, created_at,
		more_ids, more_payloads, more_metadata, more_causation_ids, more_positions)
		VALUES ($1, 'order.placed', 'orders', $2, $3, $4, $5, $5, $6, nextval('` + seq + `'), $7,
			CASE WHEN $8::bool THEN 'infinity'::timestamptz ELSE $9 END, $9, $10, $11, $12, $13, $14)`
	streams, versions := rawStreams(clients), make([]int64, clients)
	return func(w int) error {
		ctx := context.Background()
		now := time.Now()
		later := versions[w] > 0
		in, err := newRowInputs(n, streams[w], &versions[w], rowParts{}, now)
		if err != nil {
			return err
		}
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		rows, err := tx.Query(ctx, appendMany, stagehand.NoTenant, streams[w], in.versions, in.ids, now, in.payloads)
		if err != nil {
			return err
		}
		positions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, stageRow, in.msgIDs[0], in.payloads[0], in.metas[0], stagehand.NoTenant,
			in.links[0], streams[w], positions[0], later, now, in.msgIDs[1:], in.payloads[1:], in.metas[1:],
			in.links[1:], positions[1:]); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
}

// plainTen is BenchmarkSaveTen's raw side: n event rows and n plain outbox rows, one multi-row INSERT each.
func plainTen(e *env, clients, n int) benchpair.Op {
	ctx := context.Background()
	rawVersions, rawIDs := make([]int64, clients), rawStreams(clients)
	events, outboxT := pgtest.Q(e.schema, "events"), pgtest.Q(e.schema, "outbox")
	return func(w int) error {
		versions, ids, msgIDs := make([]int64, n), make([]uuid.UUID, n), make([]string, n)
		for i := range n {
			rawVersions[w]++
			versions[i], ids[i], msgIDs[i] = rawVersions[w], uuid.Must(uuid.NewV7()), uuid.NewString()
		}
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `INSERT INTO `+events+` (tenant_id, stream_id, stream_type, version,
			event_id, event_type, payload, occurred_at)
			SELECT $1, $2, 'shop.order', v, id, 'shop.order.placed', '{"Total":1}', now()
			FROM unnest($3::bigint[], $4::uuid[]) AS d(v, id)`, stagehand.NoTenant, rawIDs[w],
			versions, ids); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+outboxT+` (message_id, topic, message_type, payload,
			partition_key, next_attempt_at, created_at)
			SELECT id, 'orders', 'order.placed', '{"Total":1}', $2, now(), now()
			FROM unnest($1::text[]) AS d(id)`, msgIDs, rawIDs[w]); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
}

// TestOneRowPerKeyCarriesEveryMessage holds BenchmarkSaveTenOneRowPerKey's subject to its claim: a call writes the
// ten events and one outbox row carrying the ten messages, each with its ID, payload, headers, causation ID and
// its event's position, and a second call's row is parked behind the first.
func TestOneRowPerKeyCarriesEveryMessage(t *testing.T) {
	e := benchEnv(t)
	addMessageArrays(t, e)
	op := oneRowPerKey(e, 1, 10)
	for range 2 {
		if err := op(0); err != nil {
			t.Fatal(err)
		}
	}
	var rows, messages, linked, parked int64
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*), sum(1 + cardinality(o.more_ids)),
		sum((SELECT count(*) FROM unnest(o.causation_id || o.more_causation_ids, o.source_position || o.more_positions,
			o.metadata || o.more_metadata) AS m(c, p, md)
			JOIN `+pgtest.Q(e.schema, "events")+` ev ON ev.event_id::text = m.c AND ev.position = m.p
			WHERE md->>'event-id' = m.c)),
		count(*) FILTER (WHERE o.next_attempt_at = 'infinity')
		FROM `+pgtest.Q(e.schema, "outbox")+` o`).Scan(&rows, &messages, &linked, &parked); err != nil {
		t.Fatal(err)
	}
	if rows != 2 || messages != 20 || linked != 20 || parked != 1 {
		t.Fatalf("%d rows carrying %d messages, %d linked to their events, %d parked; want 2, 20, 20, 1", rows,
			messages, linked, parked)
	}
}
