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

// keyRef names one tenant's partition key in the relay's and admin's bookkeeping: the tenant and the key joined by
// a NUL byte, which neither can contain (PostgreSQL text cannot hold one).
func keyRef(tenant, key string) string { return tenant + "\x00" + key }

// splitKeyRef is the inverse of keyRef.
func splitKeyRef(ref string) (tenant, key string) {
	tenant, key, _ = strings.Cut(ref, "\x00")
	return tenant, key
}

// keyRef is the row's key reference, for ordered rows.
func (r *row) keyRef() string { return keyRef(r.tenant, r.partitionKey) }

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

// keyArgs lays refs out for the lockKeys and promote statements: their locks, tenants and keys, in refs' order.
func (o *Outbox) keyArgs(refs []string) (locks []int64, tenants, keys []string) {
	locks, tenants, keys = make([]int64, len(refs)), make([]string, len(refs)), make([]string, len(refs))
	for i, ref := range refs {
		tenants[i], keys[i] = splitKeyRef(ref)
		locks[i] = o.keyLock(tenants[i], keys[i])
	}
	return locks, tenants, keys
}

// queuePromote queues, onto b, the try-lock of refs' keys and the promotion of each key's next message. Read the
// locked keys with lockedKeys.
func (o *Outbox) queuePromote(b *pgx.Batch, refs []string, now any) {
	locks, tenants, keys := o.keyArgs(refs)
	b.Queue(o.q.lockKeys, locks)
	b.Queue(o.q.promote, tenants, keys, now)
}

// lockedKeys reads the result of the lockKeys statement queued by queuePromote(refs): the refs it locked.
func lockedKeys(res pgx.BatchResults, refs []string) ([]string, error) {
	rows, err := res.Query()
	if err != nil {
		return nil, err
	}
	idx, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, err
	}
	locked := make([]string, 0, len(idx))
	for _, i := range idx {
		locked = append(locked, refs[i-1])
	}
	return locked, nil
}

// sortedLocks returns the distinct locks, ascending: the order in which every waiting locker takes them.
func sortedLocks(locks []int64) []int64 {
	slices.Sort(locks)
	return slices.Compact(locks)
}
