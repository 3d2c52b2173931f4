package eventstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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
	if err := s.conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, p.t.streams).Scan(&migrated); err != nil {
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
	for _, f := range []string{trackFunctionSQL, checkFunctionSQL} {
		if _, err := s.conn.Exec(ctx, functionSQL(f, p.cfg.Schema)); err != nil {
			return res, fmt.Errorf("eventstore: convert: create the trigger functions: %w", err)
		}
	}

	// 1. Record what is appended from now on. CREATE TRIGGER waits for the appends in flight (and holds new ones
	// for as long): bounded by the lock timeout.
	var tracking bool
	if err := s.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass($1)
			AND tgname = 'events_track_append')`, p.t.events).Scan(&tracking); err != nil {
		return res, fmt.Errorf("eventstore: convert: %w", err)
	}
	if !tracking {
		if err := s.execLocked(ctx, `CREATE TRIGGER events_track_append BEFORE INSERT ON `+p.t.events+
			` FOR EACH ROW EXECUTE FUNCTION `+
			pgx.Identifier{p.cfg.Schema, "events_track_append"}.Sanitize()+`()`); err != nil {
			return res, fmt.Errorf("eventstore: convert: install the recording trigger: %w", err)
		}
	}
	log.InfoContext(ctx, "stagehand: convert: recording appends")

	// 2. Copy the heads and IDs of the rows that were there before the trigger: every transaction that inserted
	// without it had ended when CREATE TRIGGER got its lock, so this pass sees all of them.
	t0 := time.Now()
	tag, err := s.conn.Exec(ctx, `INSERT INTO `+p.t.streams+` AS h (tenant_id, stream_id, version, first_position,
			last_position)
		SELECT tenant_id, stream_id, max(version), min(position), max(position) FROM `+p.t.events+`
		GROUP BY tenant_id, stream_id
		ON CONFLICT (tenant_id, stream_id) DO UPDATE SET version = greatest(h.version, EXCLUDED.version),
			first_position = least(h.first_position, EXCLUDED.first_position),
			last_position = greatest(h.last_position, EXCLUDED.last_position)`)
	if err != nil {
		return res, fmt.Errorf("eventstore: convert: copy stream heads: %w", err)
	}
	res.Streams = tag.RowsAffected()
	// The heads of archived and deleted streams are closed, as the stream lifecycle closes them on a partitioned
	// table: the closed head is what refuses appends to them there. A stream archived after this statement closes
	// its own head (lifecycleMark), which the trigger has made by then.
	if _, err := s.conn.Exec(ctx, `UPDATE `+p.t.streams+` h SET closed = true FROM `+p.t.lifecycle+` l
		WHERE l.tenant_id = h.tenant_id AND l.stream_id = h.stream_id AND NOT h.closed`); err != nil {
		return res, fmt.Errorf("eventstore: convert: close the heads of archived and deleted streams: %w", err)
	}
	tag, err = s.conn.Exec(ctx, `INSERT INTO `+p.t.ids+` (event_id, position) SELECT event_id, position FROM `+
		p.t.events+` ON CONFLICT DO NOTHING`)
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
	bound := boundary(st.Drawn+p.cfg.Headroom, size)
	if err := s.execLocked(ctx, `ALTER TABLE `+p.t.events+` DROP CONSTRAINT IF EXISTS events_convert_bound, `+
		fmt.Sprintf(`ADD CONSTRAINT events_convert_bound CHECK (position < %d) NOT VALID`, bound)); err != nil {
		return res, fmt.Errorf("eventstore: convert: bound the positions: %w", err)
	}
	t0 = time.Now()
	if _, err := s.conn.Exec(ctx, `ALTER TABLE `+p.t.events+` VALIDATE CONSTRAINT events_convert_bound`); err != nil {
		return res, fmt.Errorf("eventstore: convert: validate the positions: %w", err)
	}
	res.Validate = time.Since(t0)
	log.InfoContext(ctx, "stagehand: convert: positions bounded", "below", bound, "took", res.Validate)

	// 4. The swap.
	res.First = Partition{Name: partitionName(1), From: 1, To: bound, State: PartitionAttached}
	created, swap, err := p.swap(ctx, s, bound, size)
	if err != nil {
		return res, err
	}
	res.Created, res.Swap, res.Duration = created, swap, time.Since(start)
	log.InfoContext(ctx, "stagehand: convert: events table partitioned", "first_partition_to", bound,
		"swap", swap, "took", res.Duration)
	return res, nil
}

// swap partitions the table in one transaction under an ACCESS EXCLUSIVE lock on it (waited for at most
// LockTimeout), and returns the partitions created after the first and how long the lock was held.
func (p *Partitions) swap(ctx context.Context, s *session, bound, size int64) ([]Partition, time.Duration, error) {
	tx, err := s.conn.Begin(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("eventstore: convert: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, strings.Replace(p.lockTimeout(), "SET", "SET LOCAL", 1)); err != nil {
		return nil, 0, fmt.Errorf("eventstore: convert: %w", err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE `+p.t.events+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		return nil, 0, fmt.Errorf("eventstore: convert: lock the events table (appends in flight held it past "+
			"the lock timeout; run the conversion again): %w", err)
	}
	locked := time.Now()
	var drawn int64
	if err := tx.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM `+
		p.t.seq).Scan(&drawn); err != nil {
		return nil, 0, fmt.Errorf("eventstore: convert: %w", err)
	}
	if drawn >= bound-1 {
		return nil, 0, fmt.Errorf("eventstore: convert: the log reached position %d, the bound set for the "+
			"existing table (%d) while it was validated: appends past it failed; run the conversion again with "+
			"a larger Headroom", drawn, bound)
	}
	first := partitionName(1)
	firstQ := pgx.Identifier{p.cfg.Schema, first}.Sanitize()
	fn := pgx.Identifier{p.cfg.Schema, "events_check_append"}.Sanitize()
	stmts := []string{
		`ALTER TABLE ` + p.t.events + ` RENAME TO ` + pgx.Identifier{first}.Sanitize(),
		`ALTER INDEX ` + pgx.Identifier{p.cfg.Schema, "events_pkey"}.Sanitize() + ` RENAME TO ` +
			pgx.Identifier{first + "_pkey"}.Sanitize(),
		`DROP TRIGGER events_track_append ON ` + firstQ,
		`CREATE TABLE ` + p.t.events + ` (LIKE ` + firstQ + ` INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
			PARTITION BY RANGE (position)`,
		`ALTER TABLE ` + p.t.events + ` DROP CONSTRAINT events_convert_bound`,
		`ALTER TABLE ` + p.t.events + ` ADD CONSTRAINT events_pkey PRIMARY KEY (position)`,
		// The validated CHECK implies the partition's bound: no scan.
		`ALTER TABLE ` + p.t.events + ` ATTACH PARTITION ` + firstQ +
			fmt.Sprintf(` FOR VALUES FROM (MINVALUE) TO (%d)`, bound),
		`ALTER TABLE ` + firstQ + ` DROP CONSTRAINT events_convert_bound`,
		// The sequence belonged to the old table's column: dropping that table, once archived, must not drop it.
		`ALTER SEQUENCE ` + p.t.seq + ` OWNED BY ` + p.t.events + `.position`,
		`CREATE TRIGGER events_check_append BEFORE INSERT ON ` + p.t.events +
			` FOR EACH ROW EXECUTE FUNCTION ` + fn + `()`,
	}
	for _, stmt := range stmts {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return nil, 0, fmt.Errorf("eventstore: convert: %s: %w", firstWords(stmt), err)
		}
	}
	created, err := p.createAhead(ctx, tx, drawn, bound, size)
	if err != nil {
		return nil, 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, 0, fmt.Errorf("eventstore: convert: commit: %w", err)
	}
	return created, time.Since(locked), nil
}

func firstWords(stmt string) string {
	f := strings.Fields(stmt)
	return strings.Join(f[:min(len(f), 3)], " ")
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
