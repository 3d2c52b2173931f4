package eventstore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ReadLog implements Store with lock-aware gap detection (see PostgresStore).
func (s *PostgresStore) ReadLog(ctx context.Context, q LogQuery) (LogPage, error) {
	return poolRead(ctx, func() (LogPage, error) { return s.readLog(ctx, q) })
}

func (s *PostgresStore) readLog(ctx context.Context, q LogQuery) (LogPage, error) {
	if err := checkQuery(&q); err != nil {
		return LogPage{}, err
	}
	if err := s.checkPrimary(ctx); err != nil {
		return LogPage{}, err
	}
	if lay, _ := s.layout(ctx, s.pool); q.After < lay.archivedTo-1 {
		return LogPage{}, s.archivedLog(ctx, q.After)
	}
	limit := q.limit()
	deadline := time.Now().Add(s.cfg.MaxGapWait)
	// Positions up to settled are final: anything missing at or below it can never commit.
	settled := q.After
	for {
		page, err := s.readPage(ctx, q, limit)
		if err != nil {
			return LogPage{}, err
		}
		out, gap := cutAtGap(page, q.After, settled)
		if gap == 0 {
			if page.corrupt != nil && out.Last == q.After {
				// The next event to read cannot be read: report it alone, so the reader applies its failure mode
				// to that event (and can move past it) instead of failing on every page that contains it.
				return LogPage{Last: q.After}, page.corrupt
			}
			return out, nil
		}
		// A position is missing below the highest one read. Whoever drew it did so before that highest row was
		// written, holding a RowExclusiveLock on events from before the draw until its end. Wait for every current
		// holder to end; then a re-read shows the missing position if it committed, and it is final if not.
		holders, archivedTo, err := s.lockHolders(ctx)
		if err != nil {
			return LogPage{}, err
		}
		if gap < archivedTo {
			// Not a gap: archived positions (archived after this store last looked).
			return LogPage{}, s.archivedLog(ctx, q.After)
		}
		highest := page.highest()
		if len(holders) > 0 {
			ended, err := s.waitForEnd(ctx, holders, deadline)
			if err != nil {
				return LogPage{}, err
			}
			if !ended {
				// Still in flight: hand out what is safe; the caller comes back for the rest.
				return out, nil
			}
		}
		settled = highest
	}
}

// rawPage is a page of the log as read, before filtering: every row's position, and whether it matched.
type rawPage struct {
	recs  []Record
	match []bool // nil when the query has no filter: every row matches
	// corrupt is set when the page's last record could not be read; the page ends there.
	corrupt *RecordError
}

func (p *rawPage) highest() int64 { return p.recs[len(p.recs)-1].Position }

func (s *PostgresStore) readPage(ctx context.Context, q LogQuery, limit int) (rawPage, error) {
	filtered := len(q.EventTypes) > 0 || len(q.StreamTypes) > 0 || len(q.Tenants) > 0
	// The log as readers see it: the events table and the events archived or deleted stream by stream
	// (sql/events.sql, log_source). A filtered read still returns the rows filtered out, position only.
	stmt := s.q.readLog
	if filtered {
		stmt = s.q.readLogFiltered
	}
	rows, err := s.pool.Query(ctx, stmt.SQL, stmt.Args(&param{After: q.After, Limit: &limit,
		TypesIn: nilIfEmpty(q.EventTypes), StreamsIn: nilIfEmpty(q.StreamTypes), TenantsIn: nilIfEmpty(q.Tenants)})...)
	if err != nil {
		return rawPage{}, fmt.Errorf("eventstore: read log after %d: %w", q.After, err)
	}
	defer rows.Close()
	page := rawPage{recs: make([]Record, 0, min(limit, 1024))}
	if filtered {
		page.match = make([]bool, 0, cap(page.recs))
	}
	var meta []byte
	for rows.Next() {
		page.recs = append(page.recs, Record{})
		r := &page.recs[len(page.recs)-1]
		var m, gone bool
		if err := rows.Scan(&m, &gone, &r.Position, &r.Tenant, &r.StreamID, &r.StreamType, &r.Version, &r.EventID,
			&r.Type, &r.TypeVersion, &r.Payload, &meta, &r.OccurredAt, &r.RecordedAt); err != nil {
			return rawPage{}, fmt.Errorf("eventstore: read log after %d: %w", q.After, err)
		}
		if gone || IsLifecycleMarker(r.Type) {
			// A tombstone or a marker: passed over, but for deletion markers a query asks for.
			if m = q.passes(r, gone); m && r.Payload == nil {
				r.Payload = []byte(`{}`) // a marker's payload, not fetched by the filtered query
			}
			if !m && page.match == nil {
				page.match = make([]bool, len(page.recs)-1, cap(page.recs))
				for i := range page.match {
					page.match[i] = true
				}
			}
		}
		if page.match != nil {
			page.match = append(page.match, m)
		}
		if err := finishRecord(r, meta); err != nil {
			if !errors.As(err, &page.corrupt) {
				return rawPage{}, fmt.Errorf("eventstore: read log: %w", err)
			}
			break // the page ends at the record that cannot be read
		}
	}
	if err := rows.Err(); err != nil {
		return rawPage{}, fmt.Errorf("eventstore: read log after %d: %w", q.After, err)
	}
	return page, nil
}

// cutAtGap returns the page up to (excluding) the first unexplained gap, and the first missing position (0 when
// there is none). Missing positions at or below settled are known to be final and are skipped. A record that could
// not be read (the page's last, page.corrupt) ends the page before it.
func cutAtGap(page rawPage, after, settled int64) (LogPage, int64) {
	out := LogPage{Last: after}
	prev := after
	keep := page.recs[:0:0]
	if page.match == nil {
		keep = page.recs // unfiltered: hand out the prefix of the page itself, no copy
	}
	for i := range page.recs {
		pos := page.recs[i].Position
		if pos > prev+1 && pos-1 > settled {
			if page.match == nil {
				out.Records = keep[:i]
			} else {
				out.Records = keep
			}
			return out, max(prev+1, settled+1)
		}
		if page.corrupt != nil && i == len(page.recs)-1 {
			if page.match == nil {
				out.Records = keep[:i]
			} else {
				out.Records = keep
			}
			return out, 0
		}
		if page.match != nil && page.match[i] {
			keep = append(keep, page.recs[i])
		}
		out.Last = pos
		prev = pos
	}
	out.Records = keep
	return out, 0
}

// lockHolders returns the virtual transaction IDs of the transactions that may still commit a missing position:
// those holding (or waiting for) a RowExclusiveLock on the events table, except the ones that provably cannot (see
// PostgresStore): a transaction already failed and waiting for its ROLLBACK, and an idle one that has written
// nothing (no transaction ID), whose every INSERT has ended without leaving a row (sql/events.sql, holder_filter).
// The table is named as text and resolved by each query, so a schema dropped and migrated again under a running
// store is followed, never judged through a stale OID. Sessions whose activity this role may not see count, to be
// safe. On a server in recovery (a hot standby) the primary's transactions are not in pg_locks, so a
// gap cannot be judged there: it returns an *InRecoveryError.
//
// It also returns where the archived positions end (0 when nothing is archived): a missing position below it was
// archived, not drawn by an append in flight.
func (s *PostgresStore) lockHolders(ctx context.Context) ([]string, int64, error) {
	var holders []string
	var inRecovery bool
	var archivedTo int64
	q := s.q.lockHolders
	err := s.pool.QueryRow(ctx, q.SQL, q.Args(&param{EventsTable: s.t.events})...).Scan(&inRecovery, &holders,
		&archivedTo)
	if err != nil {
		return nil, 0, fmt.Errorf("eventstore: read lock holders of %s (did you run stagehand.Migrate?): %w",
			s.t.events, err)
	}
	if inRecovery {
		return nil, 0, &InRecoveryError{Schema: s.cfg.Schema}
	}
	return holders, archivedTo, nil
}

// archivedLog is the *ArchivedError of a log read after position after.
func (s *PostgresStore) archivedLog(ctx context.Context, after int64) error {
	from, to, err := s.archivedRange(ctx, s.pool)
	if err != nil {
		return err
	}
	return &ArchivedError{After: after, ArchivedFrom: from, ArchivedTo: to}
}

// checkPrimary refuses, on the store's first ReadLog, to follow the log on a server in recovery, so a reader
// pointed at a standby fails at once rather than at its first gap (where lockHolders checks again, since a
// pool may reach another server after a failover).
func (s *PostgresStore) checkPrimary(ctx context.Context) error {
	if s.primary.Load() {
		return nil
	}
	var inRecovery bool
	if err := s.pool.QueryRow(ctx, s.q.inRecovery.SQL).Scan(&inRecovery); err != nil {
		return fmt.Errorf("eventstore: read log: is the server in recovery: %w", err)
	}
	if inRecovery {
		return &InRecoveryError{Schema: s.cfg.Schema}
	}
	s.primary.Store(true)
	return nil
}

// waitForEnd polls until none of holders may still commit a missing position, or the deadline passes.
func (s *PostgresStore) waitForEnd(ctx context.Context, holders []string, deadline time.Time) (bool, error) {
	pause := 500 * time.Microsecond
	for {
		var remaining int
		q := s.q.holdersLeft
		err := s.pool.QueryRow(ctx, q.SQL, q.Args(&param{EventsTable: s.t.events, Holders: holders})...).
			Scan(&remaining)
		if err != nil {
			return false, fmt.Errorf("eventstore: wait for in-flight appends: %w", err)
		}
		if remaining == 0 {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(pause):
		}
		if pause < 20*time.Millisecond {
			pause *= 2
		}
	}
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}
