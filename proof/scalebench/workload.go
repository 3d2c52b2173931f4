package scalebench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
)

// qualify is schema.name, quoted.
func qualify(schema, name string) string { return pgx.Identifier{schema, name}.Sanitize() }

// createRawTables creates the hand-written ceilings' tables in schema: an outbox of the same shape as stagehand's
// (without its per-key columns), its ledger, the projections' read model and the raw followers' checkpoints.
func createRawTables(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	for _, stmt := range []string{
		`CREATE TABLE ` + qualify(schema, "raw_outbox") + ` (id bigserial PRIMARY KEY, message_id text NOT NULL,
			topic text NOT NULL, partition_key text NOT NULL, payload bytea NOT NULL,
			metadata jsonb NOT NULL DEFAULT '{}', created_at timestamptz NOT NULL DEFAULT now(), lease_until timestamptz)`,
		`CREATE TABLE ` + qualify(schema, "raw_sent") + ` (message_id text NOT NULL, topic text NOT NULL,
			created_at timestamptz NOT NULL, sent_at timestamptz NOT NULL)`,
		`CREATE TABLE ` + qualify(schema, "read_model") + ` (tenant_id text NOT NULL, stream_id text NOT NULL,
			events bigint NOT NULL, last_position bigint NOT NULL, PRIMARY KEY (tenant_id, stream_id))`,
		`CREATE TABLE ` + qualify(schema, "raw_read_model") + ` (tenant_id text NOT NULL, stream_id text NOT NULL,
			events bigint NOT NULL, last_position bigint NOT NULL, PRIMARY KEY (tenant_id, stream_id))`,
		`CREATE TABLE ` + qualify(schema, "raw_checkpoints") + ` (name text NOT NULL, part int NOT NULL,
			position bigint NOT NULL DEFAULT 0, PRIMARY KEY (name, part))`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("scalebench: create raw tables: %w", err)
		}
	}
	return nil
}

// partitionRange is the relay's cut of the 32-bit hash space into n contiguous ranges (outbox/partition.go): a
// message whose key hashes (hashtext) into partition p's range is claimed by partition p.
func partitionRange(p, n int) (lo, hi int32) {
	const span = int64(1) << 32
	l := math.MinInt32 + span*int64(p)/int64(n)
	h := math.MinInt32 + span*int64(p+1)/int64(n) - 1
	return int32(l), int32(h)
}

// Keys returns perPartition partition keys for each of n relay partitions, named "p<partition>/k<i>" so that a
// relay reporting its publishes can tell which partition a message came from: the database's hashtext of each
// candidate key decides its partition, as it does for the relay's claim.
func Keys(ctx context.Context, pool *pgxpool.Pool, n, perPartition int) ([][]string, error) {
	out := make([][]string, n)
	need := n * perPartition
	for next := 0; need > 0; next += 4 * n * perPartition {
		cand := make([]string, 4*n*perPartition)
		for i := range cand {
			cand[i] = "k" + strconv.Itoa(next+i)
		}
		rows, err := pool.Query(ctx, `SELECT k, hashtext(k) FROM unnest($1::text[]) AS k`, cand)
		if err != nil {
			return nil, fmt.Errorf("scalebench: hash keys: %w", err)
		}
		for rows.Next() {
			var (
				k string
				h int32
			)
			if err := rows.Scan(&k, &h); err != nil {
				rows.Close()
				return nil, fmt.Errorf("scalebench: hash keys: %w", err)
			}
			for p := range n {
				if lo, hi := partitionRange(p, n); h >= lo && h <= hi && len(out[p]) < perPartition {
					out[p] = append(out[p], fmt.Sprintf("p%d/%s", p, k))
					need--
				}
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("scalebench: hash keys: %w", err)
		}
	}
	return out, nil
}

// KeyPartition is the partition a key named by Keys belongs to.
func KeyPartition(key string) (int, bool) {
	rest, ok := strings.CutPrefix(key, "p")
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(rest, "/")
	if !ok {
		return 0, false
	}
	p, err := strconv.Atoi(num)
	return p, err == nil
}

// payload is every message's and event's body: about the size of a small domain event.
var payload = []byte(`{"order_id":"0f8fad5b-d9cb-469f-a165-70867728950e","amount":1999,"currency":"EUR","lines":3}`)

// flatKeys lists keys partition by partition, round robin, so consecutive messages spread over the partitions.
func flatKeys(keys [][]string) []string {
	var out []string
	for i := 0; ; i++ {
		added := false
		for p := range keys {
			if i < len(keys[p]) {
				out = append(out, keys[p][i])
				added = true
			}
		}
		if !added {
			return out
		}
	}
}

// stageBacklog stages n messages (round robin over keys, so each key gets n/len(keys)) in one transaction through
// the outbox, so all of them become visible at once when it commits, and wakes the relays when notify is set.
func stageBacklog(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, round string, keys []string,
	n int, notify bool) error {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{ID: fmt.Sprintf("%s-%d", round, i), Topic: "orders", Type: "orders.OrderPlaced",
			Payload: payload, PartitionKey: keys[i%len(keys)]}
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for start := 0; start < n; start += 1000 {
			if _, err := ob.StageTx(ctx, tx, msgs[start:min(start+1000, n)]...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("scalebench: stage backlog: %w", err)
	}
	if notify {
		ob.Notify()
	}
	return nil
}

// rawBacklog inserts the same n messages into the raw outbox in one statement.
func rawBacklog(ctx context.Context, pool *pgxpool.Pool, schema, round string, keys []string, n int) error {
	ids := make([]string, n)
	ks := make([]string, n)
	for i := range ids {
		ids[i], ks[i] = fmt.Sprintf("%s-%d", round, i), keys[i%len(keys)]
	}
	_, err := pool.Exec(ctx, `INSERT INTO `+qualify(schema, "raw_outbox")+` (message_id, topic, partition_key, payload)
		SELECT id, 'orders', k, $3 FROM unnest($1::text[], $2::text[]) AS m(id, k)`, ids, ks, payload)
	if err != nil {
		return fmt.Errorf("scalebench: raw backlog: %w", err)
	}
	return nil
}

// appendLog appends perStream events to each of streams new streams (prefix + "-" + i) through the event store,
// in one transaction, so all of them become visible at once when it commits. It sends no wake-up: the caller
// starts its clock, then calls store.Notify.
func appendLog(ctx context.Context, store *eventstore.PostgresStore, prefix string, streams, perStream int) error {
	data, _ := json.Marshal(json.RawMessage(payload))
	tx, err := store.Begin(ctx)
	if err != nil {
		return fmt.Errorf("scalebench: append: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for s := range streams {
		evs := make([]eventstore.EventData, perStream)
		for i := range evs {
			evs[i] = eventstore.EventData{Type: "orders.OrderPlaced", Payload: data}
		}
		if _, err := store.AppendTx(ctx, tx, eventstore.AppendRequest{StreamID: prefix + "-" + strconv.Itoa(s),
			StreamType: "order", Expected: eventstore.NoStream, Events: evs}); err != nil {
			return fmt.Errorf("scalebench: append: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("scalebench: append: %w", err)
	}
	return nil
}
