package outbox

import (
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Per-key order is per (tenant, partition key): two tenants may use the same key (stream IDs are unique only within
// a tenant). Staging serializes the stagers of one key with a transaction-scoped advisory lock on it (see
// queries.stagePrelude), and the relay tries the same lock before it promotes a key's next message.
//
// Advisory locks share one space per database with every other user of pg_advisory_lock on 64-bit keys. A key's
// lock is a 64-bit hash of the schema, the tenant and the key, so another application's lock (or another key)
// lands on the same value with a chance of about one in 2^64 per pair; a collision only makes the two holders wait
// for each other (or a relay promote a key later), and never changes an order.

// tenantKey is one tenant's partition key: the unit of per-key order, in the relay's and admin's bookkeeping.
type tenantKey struct{ tenant, key string }

func compareKeys(a, b tenantKey) int {
	if c := strings.Compare(a.tenant, b.tenant); c != 0 {
		return c
	}
	return strings.Compare(a.key, b.key)
}

// sortedKeys returns the distinct keys, sorted.
func sortedKeys(keys []tenantKey) []tenantKey {
	slices.SortFunc(keys, compareKeys)
	return slices.Compact(keys)
}

// key is the row's tenant key, for ordered rows.
func (r *row) key() tenantKey { return tenantKey{r.tenant, r.partitionKey} }

// keyLock is the advisory-lock key of one tenant's partition key in the outbox's schema: FNV-1a (64 bits) of the
// three, separated by NUL bytes.
func (o *Outbox) keyLock(tenant, key string) int64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for _, s := range [3]string{o.schema, tenant, key} {
		for i := 0; i < len(s); i++ {
			h = (h ^ uint64(s[i])) * prime
		}
		h *= prime // the NUL separator: h ^ 0 == h
	}
	return int64(h)
}

// keyArgs lays keys out for the lockKeys and promote statements: their locks, tenants and partition keys, in keys'
// order.
func (o *Outbox) keyArgs(keys []tenantKey) (locks []int64, tenants, names []string) {
	locks, tenants, names = make([]int64, len(keys)), make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		tenants[i], names[i] = k.tenant, k.key
		locks[i] = o.keyLock(k.tenant, k.key)
	}
	return locks, tenants, names
}

// queuePromote queues, onto b, the try-lock of keys and the promotion of each key's next message. Read the locked
// keys with lockedKeys.
func (o *Outbox) queuePromote(b *pgx.Batch, keys []tenantKey, now any) {
	locks, tenants, names := o.keyArgs(keys)
	b.Queue(o.q.lockKeys, locks)
	b.Queue(o.q.promote, tenants, names, now)
}

// lockedKeys reads the result of the lockKeys statement queued by queuePromote(keys): the keys it locked.
func lockedKeys(res pgx.BatchResults, keys []tenantKey) ([]tenantKey, error) {
	rows, err := res.Query()
	if err != nil {
		return nil, err
	}
	idx, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, err
	}
	locked := make([]tenantKey, 0, len(idx))
	for _, i := range idx {
		locked = append(locked, keys[i-1])
	}
	return locked, nil
}

// sortedLocks returns the distinct locks, ascending: the order in which every waiting locker takes them.
func sortedLocks(locks []int64) []int64 {
	slices.Sort(locks)
	return slices.Compact(locks)
}
