package eventstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// layoutTTL is how long a store trusts what it last read of its events table's layout. A store running while the
// table is converted appends correctly all along (the partitioned table's trigger enforces versions whatever
// statement inserts), and switches to the statements that read the stream's head within this time.
const layoutTTL = 10 * time.Second

// tableLayout caches whether the events table is partitioned, and the positions archived below (the end of the
// archived range, 0 when nothing is archived). Appends read it on every call, so reading it takes no lock: the
// state is swapped whole, and once it is older than layoutTTL one caller reads it again while the others go on
// with what was known (the first read, and the one after forgetLayout, make every caller wait for it).
type tableLayout struct {
	cur     atomic.Pointer[layoutState]
	reading sync.Mutex // held by the caller reading the layout
}

type layoutState struct {
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
	st := l.cur.Load()
	if st != nil && time.Since(st.checked) < layoutTTL {
		return st.partitioned, st.archivedTo
	}
	if st == nil {
		l.reading.Lock()
	} else if !l.reading.TryLock() {
		return st.partitioned, st.archivedTo // another caller is reading it
	}
	defer l.reading.Unlock()
	if now := l.cur.Load(); now != nil && time.Since(now.checked) < layoutTTL {
		return now.partitioned, now.archivedTo // read meanwhile
	}
	next := &layoutState{checked: time.Now()}
	if st != nil {
		next.partitioned, next.archivedTo = st.partitioned, st.archivedTo
	}
	var partitioned bool
	var archivedTo int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)),
			false), coalesce((SELECT max(to_position) FROM `+s.t.archives+`), 0)`, s.t.events).
		Scan(&partitioned, &archivedTo)
	if err == nil {
		next.partitioned, next.archivedTo = partitioned, archivedTo
	}
	l.cur.Store(next)
	return next.partitioned, next.archivedTo
}

// forgetLayout makes the next statement read the layout again (after this process converted or archived).
func (s *PostgresStore) forgetLayout() { s.tableLay.cur.Store(nil) }
