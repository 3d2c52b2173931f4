package eventstore

import (
	"context"
	"sync"
	"time"
)

// layoutTTL is how long a store trusts what it last read of its events table's layout. A store running while the
// table is converted appends correctly all along (the partitioned table's trigger enforces versions whatever
// statement inserts), and switches to the statements that read the stream's head within this time.
const layoutTTL = 10 * time.Second

// tableLayout caches whether the events table is partitioned, and the positions archived below (the end of the
// archived range, 0 when nothing is archived).
type tableLayout struct {
	mu          sync.Mutex
	checked     time.Time
	partitioned bool
	archivedTo  int64
}

// partitioned reports whether the store's events table is partitioned (see Partitions), as last read within
// layoutTTL. A failed read (a schema not migrated, a lost connection) keeps what was known before (unpartitioned
// at first) for another layoutTTL: the statement that follows reports the database's error itself.
func (s *PostgresStore) partitioned(ctx context.Context) bool {
	p, _ := s.layout(ctx)
	return p
}

// Partitioned reports whether the store's events table is partitioned by position (see Partitions), as the store
// last read it (at most 10 s ago).
func (s *PostgresStore) Partitioned(ctx context.Context) bool { return s.partitioned(ctx) }

// layout returns whether the events table is partitioned and where its archived range ends.
func (s *PostgresStore) layout(ctx context.Context) (bool, int64) {
	l := &s.tableLay
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.checked.IsZero() && time.Since(l.checked) < layoutTTL {
		return l.partitioned, l.archivedTo
	}
	var partitioned bool
	var archivedTo int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)),
			false), coalesce((SELECT max(to_position) FROM `+s.t.archives+`), 0)`, s.t.events).
		Scan(&partitioned, &archivedTo)
	if err == nil {
		l.partitioned, l.archivedTo = partitioned, archivedTo
	}
	l.checked = time.Now()
	return l.partitioned, l.archivedTo
}

// forgetLayout makes the next statement read the layout again (after this process converted or archived).
func (s *PostgresStore) forgetLayout() {
	s.tableLay.mu.Lock()
	s.tableLay.checked = time.Time{}
	s.tableLay.mu.Unlock()
}
