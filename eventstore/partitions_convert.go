package eventstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ConvertResult describes a conversion.
type ConvertResult struct {
	// Already is true when the table was partitioned before (Convert then only ran Ensure).
	Already bool
	// First is the table's first partition: the existing table, holding every position below First.To.
	First Partition
	// Created are the partitions created after it.
	Created []Partition
	// Streams and Events are how many stream heads and event IDs were copied into event_streams and event_ids.
	Streams int64
	Events  int64
	// Copy is the time taken to copy heads and IDs, Validate the time taken to check the existing rows' positions
	// (both while appends go on), Swap the time appends waited while the table was swapped.
	Copy     time.Duration
	Validate time.Duration
	Swap     time.Duration
	// Duration is the whole conversion's.
	Duration time.Duration
}

// Convert turns the events table into one range-partitioned by position, live: appends, stream reads and log
// readers go on throughout, except for three short waits, each bounded by LockTimeout (a SHARE ROW EXCLUSIVE lock
// to install the conversion's trigger, an ACCESS EXCLUSIVE lock to add the positions' bound unvalidated, and one
// for the swap, which renames and attaches in milliseconds; each waits for the appends in flight, and appends
// that come meanwhile wait behind it). Run stagehand.Migrate first (migration 035). It is idempotent: a conversion that failed or was
// interrupted is resumed by running it again; on a partitioned table it only runs Ensure.
//
// Steps: (1) a trigger on the existing table records the heads and IDs of what is appended from then on; (2) the
// heads and IDs of the existing rows are copied into event_streams and event_ids (one pass over the table); (3) a
// CHECK constraint bounds the positions the table may take (Headroom past the last one drawn) and is validated
// without blocking appends; (4) in one short transaction the table is renamed to become the first partition,
// a partitioned events table takes its name, columns, defaults and the position sequence, the first partition is
// attached (the validated constraint spares the scan), the checking trigger replaces the recording one, and
// Ahead partitions are created after it.
func (p *Partitions) Convert(ctx context.Context) (ConvertResult, error) {
	start := time.Now()
	var res ConvertResult
	s, err := p.lock(ctx)
	if err != nil {
		return res, err
	}
	defer s.release()
	st, err := p.status(ctx, s.conn)
	if err != nil {
		return res, err
	}
	var migrated bool
	args := &partParam{EventsTable: p.t.events, StreamsTable: p.t.streams}
	if err := s.conn.QueryRow(ctx, p.q.migrated.SQL, p.q.migrated.Args(args)...).Scan(&migrated); err != nil {
		return res, fmt.Errorf("eventstore: convert: %w", err)
	}
	if !migrated {
		return res, fmt.Errorf("eventstore: convert: schema %q lacks migration 035 (run stagehand.Migrate first)",
			p.cfg.Schema)
	}
	if st.Partitioned {
		res.Already = true
		if len(st.Attached) > 0 {
			res.First = st.Attached[0]
		}
		res.Created, err = s.ensure(ctx)
		res.Duration = time.Since(start)
		return res, err
	}
	log := p.cfg.Logger.With("schema", p.cfg.Schema)
	for _, f := range []string{"track_function", "check_function"} {
		if err := s.execNamed(ctx, f, nil, p.idents, false); err != nil {
			return res, fmt.Errorf("eventstore: convert: create the trigger functions: %w", err)
		}
	}

	// 1. Record what is appended from now on. CREATE TRIGGER waits for the appends in flight (and holds new ones
	// for as long): bounded by the lock timeout.
	var tracking bool
	if err := s.conn.QueryRow(ctx, p.q.tracking.SQL, p.q.tracking.Args(args)...).Scan(&tracking); err != nil {
		return res, fmt.Errorf("eventstore: convert: %w", err)
	}
	if !tracking {
		if err := s.execNamed(ctx, "create_track_trigger", nil, p.idents, true); err != nil {
			return res, fmt.Errorf("eventstore: convert: install the recording trigger: %w", err)
		}
	}
	log.InfoContext(ctx, "stagehand: convert: recording appends")

	// 2. Copy the heads and IDs of the rows that were there before the trigger: every transaction that inserted
	// without it had ended when CREATE TRIGGER got its lock, so this pass sees all of them.
	t0 := time.Now()
	tag, err := s.execDDL(ctx, "copy_heads", nil)
	if err != nil {
		return res, fmt.Errorf("eventstore: convert: copy stream heads: %w", err)
	}
	res.Streams = tag.RowsAffected()
	// The heads of archived and deleted streams are closed, as the stream lifecycle closes them on a partitioned
	// table: the closed head is what refuses appends to them there. A stream archived after this statement closes
	// its own head (lifecycleMark), which the trigger has made by then.
	if err := s.execNamed(ctx, "close_archived_heads", nil, p.idents, false); err != nil {
		return res, fmt.Errorf("eventstore: convert: close the heads of archived and deleted streams: %w", err)
	}
	tag, err = s.execDDL(ctx, "copy_ids", nil)
	if err != nil {
		return res, fmt.Errorf("eventstore: convert: copy event IDs: %w", err)
	}
	res.Events = tag.RowsAffected()
	res.Copy = time.Since(t0)
	log.InfoContext(ctx, "stagehand: convert: heads and IDs copied", "streams", res.Streams, "events", res.Events,
		"took", res.Copy)

	// 3. Bound the positions the table takes, without a scan under a strong lock: NOT VALID is instant, VALIDATE
	// scans under a lock that lets appends go on.
	st, err = p.status(ctx, s.conn)
	if err != nil {
		return res, err
	}
	size := p.size(st)
	limit := boundary(st.Drawn+p.cfg.Headroom, size)
	if err := s.execNamed(ctx, "bound_positions", bound("bound", limit), p.idents, true); err != nil {
		return res, fmt.Errorf("eventstore: convert: bound the positions: %w", err)
	}
	t0 = time.Now()
	if err := s.execNamed(ctx, "validate_bound", nil, p.idents, false); err != nil {
		return res, fmt.Errorf("eventstore: convert: validate the positions: %w", err)
	}
	res.Validate = time.Since(t0)
	log.InfoContext(ctx, "stagehand: convert: positions bounded", "below", limit, "took", res.Validate)

	// 4. The swap.
	res.First = Partition{Name: partitionName(1), From: 1, To: limit, State: PartitionAttached}
	created, swap, err := p.swap(ctx, s, limit, size)
	if err != nil {
		return res, err
	}
	res.Created, res.Swap, res.Duration = created, swap, time.Since(start)
	log.InfoContext(ctx, "stagehand: convert: events table partitioned", "first_partition_to", limit,
		"swap", swap, "took", res.Duration)
	return res, nil
}

// swap partitions the table in one transaction under an ACCESS EXCLUSIVE lock on it (waited for at most
// LockTimeout), and returns the partitions created after the first and how long the lock was held.
func (p *Partitions) swap(ctx context.Context, s *session, limit, size int64) ([]Partition, time.Duration, error) {
	tx, err := s.conn.Begin(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("eventstore: convert: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, strings.Replace(p.lockTimeout(), "SET", "SET LOCAL", 1)); err != nil {
		return nil, 0, fmt.Errorf("eventstore: convert: %w", err)
	}
	first := partitionName(1)
	idents := p.partitionIdents(first)
	idents["first"], idents["first_name"] = idents["partition"], pgx.Identifier{first}.Sanitize()
	idents["first_pkey"] = pgx.Identifier{first + "_pkey"}.Sanitize()
	texts := make(map[string]string, len(swapSteps)+1)
	for _, name := range append([]string{"lock_events"}, swapSteps...) {
		text, err := ddl(name, bound("bound", limit), idents)
		if err != nil {
			return nil, 0, err
		}
		texts[name] = text
	}
	if _, err := tx.Exec(ctx, texts["lock_events"]); err != nil {
		return nil, 0, fmt.Errorf("eventstore: convert: lock the events table (appends in flight held it past "+
			"the lock timeout; run the conversion again): %w", err)
	}
	locked := time.Now()
	var drawn int64
	if err := tx.QueryRow(ctx, p.q.lastDrawn.SQL).Scan(&drawn); err != nil {
		return nil, 0, fmt.Errorf("eventstore: convert: %w", err)
	}
	if drawn >= limit-1 {
		return nil, 0, fmt.Errorf("eventstore: convert: the log reached position %d, the bound set for the "+
			"existing table (%d) while it was validated: appends past it failed; run the conversion again with "+
			"a larger Headroom", drawn, limit)
	}
	for _, name := range swapSteps {
		if _, err := tx.Exec(ctx, texts[name]); err != nil {
			return nil, 0, fmt.Errorf("eventstore: convert: %s: %w", firstWords(texts[name]), err)
		}
	}
	created, err := p.createAhead(ctx, tx, drawn, limit, size)
	if err != nil {
		return nil, 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, 0, fmt.Errorf("eventstore: convert: commit: %w", err)
	}
	return created, time.Since(locked), nil
}

// swapSteps are the statements of the swap, in their order (sql/partitions.sql): the table renamed to become the
// first partition, a partitioned table in its place, the first partition attached, the checking trigger installed.
var swapSteps = []string{"swap_rename_table", "swap_rename_index", "swap_drop_track_trigger", "swap_create_table",
	"swap_drop_bound", "swap_primary_key", "swap_attach_first", "swap_drop_first_bound", "swap_sequence_owner",
	"swap_check_trigger"}

func firstWords(stmt string) string {
	f := strings.Fields(stmt)
	return strings.Join(f[:min(len(f), 3)], " ")
}

// execNamed writes the statement name out (DDL: raw bounds, then identifiers) and runs it on the session, with the
// lock timeout set when locked.
func (s *session) execNamed(ctx context.Context, name string, raw, idents map[string]string, locked bool) error {
	stmt, err := ddl(name, raw, idents)
	if err != nil {
		return err
	}
	if locked {
		return s.execLocked(ctx, stmt)
	}
	_, err = s.conn.Exec(ctx, stmt)
	return err
}

// execDDL runs the statement name, written out for the schema's tables, on the session and returns its tag.
func (s *session) execDDL(ctx context.Context, name string, raw map[string]string) (pgconn.CommandTag, error) {
	stmt, err := ddl(name, raw, s.p.idents)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return s.conn.Exec(ctx, stmt)
}

// execLocked runs stmt on the session with the lock timeout set, and resets it.
func (s *session) execLocked(ctx context.Context, stmt string) error {
	if _, err := s.conn.Exec(ctx, s.p.lockTimeout()); err != nil {
		return err
	}
	_, err := s.conn.Exec(ctx, stmt)
	if _, rerr := s.conn.Exec(context.WithoutCancel(ctx), `RESET lock_timeout`); err == nil {
		err = rerr
	}
	return err
}
