package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// PruneKeys deletes the per-key sequence counters of the scope that no message needs any more: keys with no
// pending or parked message and no dead letter holding them. Staging keeps one small counter row per (tenant,
// partition key) it ever numbered, so without pruning the counters grow with the number of aggregates; CleanupSent
// prunes them too. It works in batches of batchSize (default 1000) keys and returns how many it deleted.
//
// It is safe beside staging and relays: each batch locks its counters (skipping those a staging transaction or a
// relay holds) before a second statement, whose snapshot sees every message staged before the lock, checks that the
// key is idle. A transaction staging on a pruned key waits for the batch to commit and starts the key afresh, and
// since the key has no message left, the order of its messages is not affected.
func (a *Admin) PruneKeys(ctx context.Context, batchSize int) (int64, error) {
	if batchSize <= 0 {
		batchSize = 1000
	}
	keys := pgx.Identifier{a.o.schema, "outbox_keys"}.Sanitize()
	lock := `SELECT tenant_id, partition_key FROM ` + keys + `
WHERE ($1::text IS NULL OR tenant_id = $1) AND (tenant_id, partition_key) > ($2, $3)
ORDER BY tenant_id, partition_key LIMIT $4 FOR UPDATE SKIP LOCKED`
	prune := `DELETE FROM ` + keys + ` k USING unnest($1::text[], $2::text[]) AS l(tenant_id, partition_key)
WHERE k.tenant_id = l.tenant_id AND k.partition_key = l.partition_key
  AND (SELECT o.seq FROM ` + pgx.Identifier{a.o.schema, "outbox"}.Sanitize() + ` o
       WHERE o.tenant_id = k.tenant_id AND o.partition_key = k.partition_key AND o.seq IS NOT NULL
       ORDER BY o.seq LIMIT 1) IS NULL
  AND (SELECT d.seq FROM ` + pgx.Identifier{a.o.schema, "outbox_dead_letters"}.Sanitize() + ` d
       WHERE d.holds_key AND d.tenant_id = k.tenant_id AND d.partition_key = k.partition_key
       ORDER BY d.seq LIMIT 1) IS NULL`
	var total int64
	afterTenant, afterKey := "", ""
	for {
		var seen int
		var pruned int64
		err := pgx.BeginFunc(ctx, a.o.pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, lock, a.tenant, afterTenant, afterKey, batchSize)
			if err != nil {
				return err
			}
			var tenants, names []string
			for rows.Next() {
				var t, k string
				if err := rows.Scan(&t, &k); err != nil {
					rows.Close()
					return err
				}
				tenants, names = append(tenants, t), append(names, k)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			seen = len(names)
			if seen == 0 {
				return nil
			}
			afterTenant, afterKey = tenants[seen-1], names[seen-1]
			tag, err := tx.Exec(ctx, prune, tenants, names)
			if err != nil {
				return err
			}
			pruned = tag.RowsAffected()
			return nil
		})
		if err != nil {
			return total, fmt.Errorf("outbox: prune key counters: %w", err)
		}
		total += pruned
		if seen < batchSize {
			return total, nil
		}
	}
}
