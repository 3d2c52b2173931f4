package eventstore

import (
	"context"
	"fmt"
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
// with what was known. No caller ever waits for another: when nothing is known yet and another caller is reading
// it, a caller reads it too. Every read goes through the caller's own database handle (its transaction on the Tx
// paths), never through a second connection.
type tableLayout struct {
	cur     atomic.Pointer[layoutState]
	reading sync.Mutex // held (TryLock only) by the caller refreshing a stale layout
}

type layoutState struct {
	checked     time.Time
	partitioned bool
	archivedTo  int64
}

// Partitioned reports whether the store's events table is partitioned by position (see Partitions), as the store
// last read it (at most 10 s ago).
func (s *PostgresStore) Partitioned(ctx context.Context) bool {
	st, _ := s.layout(ctx, s.pool)
	return st.partitioned
}

// layout returns whether the events table is partitioned and where its archived range ends, as last read within
// layoutTTL, reading it through db when it is older (or unknown). db is the handle the caller's statements use:
// the caller's transaction on the Tx paths, so they never take a second connection.
//
// A failed read through the pool (a schema not migrated, a lost connection) keeps what was known before
// (unpartitioned at first) for another layoutTTL, with no error: the statement that follows reports the database's
// error itself. A failed read through a transaction returns the error, and keeps nothing: the failure has aborted
// the transaction (or it was aborted already), so the caller's next statement could only report that. On a
// migrated schema the statement cannot fail.
func (s *PostgresStore) layout(ctx context.Context, db dbtx) (layoutState, error) {
	l := &s.tableLay
	st := l.cur.Load()
	if st != nil && time.Since(st.checked) < layoutTTL {
		return *st, nil
	}
	if !l.reading.TryLock() {
		if st != nil {
			return *st, nil // another caller is refreshing it
		}
		return s.readLayout(ctx, db, nil) // nothing known: read it here rather than wait
	}
	defer l.reading.Unlock()
	if now := l.cur.Load(); now != nil && time.Since(now.checked) < layoutTTL {
		return *now, nil // read meanwhile
	}
	return s.readLayout(ctx, db, st)
}

// readLayout reads the layout through db and stores it (see layout); known is what was known before, if anything.
func (s *PostgresStore) readLayout(ctx context.Context, db dbtx, known *layoutState) (layoutState, error) {
	next := layoutState{checked: time.Now()}
	if known != nil {
		next.partitioned, next.archivedTo = known.partitioned, known.archivedTo
	}
	var partitioned bool
	var archivedTo int64
	q := s.q.layout // sql/events.sql: whether the table is partitioned, asking the catalog caches, never failing
	err := db.QueryRow(ctx, q.SQL, q.Args(&param{EventsTable: s.t.events})...).Scan(&partitioned, &archivedTo)
	if err != nil && inTx(db) {
		return next, fmt.Errorf("eventstore: read the layout of %s (did you run stagehand.Migrate?): %w",
			s.t.events, err)
	}
	if err == nil {
		next.partitioned, next.archivedTo = partitioned, archivedTo
	}
	s.tableLay.cur.Store(&next)
	return next, nil
}

// learnPartitioned records that the events table is (or is not) partitioned, as a statement just found out,
// keeping the rest of what was known (and when it was read, so the archived range is read again on time).
func (s *PostgresStore) learnPartitioned(partitioned bool) {
	next := layoutState{checked: time.Now(), partitioned: partitioned}
	if st := s.tableLay.cur.Load(); st != nil {
		next.checked, next.archivedTo = st.checked, st.archivedTo
	}
	s.tableLay.cur.Store(&next)
}
