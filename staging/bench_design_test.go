package staging

import (
	"context"
	"encoding/json"
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
	appendMany := `INSERT INTO ` + events + ` (tenant_id, stream_id, stream_type, version, event_id, event_type,
		payload, event_version, metadata, occurred_at)
		SELECT $1, $2, 'shop.order', d.version, d.event_id, 'shop.order.placed', d.payload, 1, '{}', $5
		FROM unnest($3::bigint[], $4::uuid[], $6::jsonb[]) AS d(version, event_id, payload)
		RETURNING position`
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
		vs, ids, payloads := make([]int64, n), make([]uuid.UUID, n), make([][]byte, n)
		msgIDs, metas, links := make([]string, n), make([][]byte, n), make([]string, n)
		for i := range n {
			versions[w]++
			vs[i], ids[i] = versions[w], uuid.Must(uuid.NewV7())
			p, err := json.Marshal(OrderPlaced{Total: 1})
			if err != nil {
				return err
			}
			payloads[i], msgIDs[i], links[i] = p, uuid.NewString(), ids[i].String()
			metas[i], err = json.Marshal(map[string]string{stagehand.HeaderEventID: links[i],
				stagehand.HeaderEventType: "shop.order.placed", stagehand.HeaderOccurredAt: now.UTC().Format(time.RFC3339Nano),
				stagehand.HeaderAggregateID: streams[w], stagehand.HeaderAggregateType: "shop.order"})
			if err != nil {
				return err
			}
		}
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		rows, err := tx.Query(ctx, appendMany, stagehand.NoTenant, streams[w], vs, ids, now, payloads)
		if err != nil {
			return err
		}
		positions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, stageRow, msgIDs[0], payloads[0], metas[0], stagehand.NoTenant, links[0],
			streams[w], positions[0], later, now, msgIDs[1:], payloads[1:], metas[1:], links[1:],
			positions[1:]); err != nil {
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
