package eventstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/names"
)

// Defaults of PartitionConfig.
const (
	// DefaultPartitionSize is the number of positions a partition holds.
	DefaultPartitionSize = 1_000_000
	// DefaultPartitionsAhead is how many partitions Ensure keeps after the one holding the next position.
	DefaultPartitionsAhead = 2
	// DefaultConvertHeadroom is how many positions beyond the last one drawn the converted table keeps taking.
	DefaultConvertHeadroom = 10_000_000
	// DefaultPartitionLockTimeout bounds each wait for a lock that would make appends queue behind it.
	DefaultPartitionLockTimeout = 2 * time.Second
)

// PartitionConfig configures Partitions. A nil *PartitionConfig uses the defaults.
type PartitionConfig struct {
	// Schema holding the stagehand tables. Default "stagehand".
	Schema string
	// Size is the number of positions each new partition holds (the unit of archiving). Default: the size of the
	// newest partition when the table has one besides its first (the converted table), else 1,000,000.
	Size int64
	// Ahead is how many partitions Ensure keeps after the one holding the next position to draw, so appends find
	// one between two runs of Ensure. Default 2.
	Ahead int
	// Headroom is how many positions beyond the last one drawn the existing table keeps taking while Convert runs:
	// it becomes the first partition, up to the first multiple of Size (plus one) past the last position drawn
	// plus Headroom. Appends that draw past it before the conversion's last step fail (and Convert reports it), so
	// it must exceed what is appended while Convert validates the table. Default 10,000,000.
	Headroom int64
	// LockTimeout bounds each wait for a lock that appends would queue behind (the conversion's trigger and swap,
	// attaching and detaching partitions): past it the step fails, nothing is changed, and it can be run again.
	// Default 2s.
	LockTimeout time.Duration
	// Logger receives one line per step. Default: silent.
	Logger *slog.Logger
}

func (c *PartitionConfig) withDefaults() (PartitionConfig, error) {
	var cfg PartitionConfig
	if c != nil {
		cfg = *c
	}
	if cfg.Schema == "" {
		cfg.Schema = stagehand.DefaultSchema
	}
	if reason := names.Identifier(cfg.Schema); strings.TrimSpace(cfg.Schema) == "" || reason != "" {
		if reason == "" {
			reason = "must not be blank"
		}
		return cfg, &ConfigError{Package: "eventstore", Field: "Schema", Reason: reason}
	}
	switch {
	case cfg.Size < 0:
		return cfg, &ConfigError{Package: "eventstore", Field: "Size", Reason: fmt.Sprintf(
			"must not be negative, got %d", cfg.Size)}
	case cfg.Ahead < 0:
		return cfg, &ConfigError{Package: "eventstore", Field: "Ahead", Reason: fmt.Sprintf(
			"must not be negative, got %d", cfg.Ahead)}
	case cfg.Headroom < 0:
		return cfg, &ConfigError{Package: "eventstore", Field: "Headroom", Reason: fmt.Sprintf(
			"must not be negative, got %d", cfg.Headroom)}
	case cfg.LockTimeout < 0:
		return cfg, &ConfigError{Package: "eventstore", Field: "LockTimeout", Reason: "must not be negative"}
	}
	if cfg.Ahead == 0 {
		cfg.Ahead = DefaultPartitionsAhead
	}
	if cfg.Headroom == 0 {
		cfg.Headroom = DefaultConvertHeadroom
	}
	if cfg.LockTimeout == 0 {
		cfg.LockTimeout = DefaultPartitionLockTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

// Partitions converts a store's events table to one range-partitioned by position, keeps partitions ahead of the
// log, and archives old ones. Partitioning is opt-in: a store that never runs Convert keeps its single table.
//
// A partitioned store behaves as an unpartitioned one: the same conformance suite passes on both. What changes:
// the concurrency control is a per-stream head in event_streams kept by the table's trigger (a unique index
// cannot span partitions), event IDs are unique through event_ids, appends past the last partition fail with a
// *NoPartitionError (so keep Ensure running), and reads of archived events fail with an *ArchivedError. See the
// package documentation, "Partitioned events table".
//
// Its operations take a session-level advisory lock per schema, so two of them never run at once; each strong
// lock they take waits at most LockTimeout. The operator command `stagehand events partitions` calls them.
type Partitions struct {
	pool *pgxpool.Pool
	cfg  PartitionConfig
	t    partitionTables
}

type partitionTables struct {
	events, seq, streams, ids, archives, snapshots, checkpoints, watermarks, projectionParked, stagingParked string
}

// NewPartitions returns the partition operations of the store in cfg.Schema on pool. It does not touch the
// database.
func NewPartitions(pool *pgxpool.Pool, cfg *PartitionConfig) (*Partitions, error) {
	if pool == nil {
		return nil, &ConfigError{Package: "eventstore", Field: "pool", Reason: "must not be nil"}
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	q := func(name string) string { return pgx.Identifier{c.Schema, name}.Sanitize() }
	return &Partitions{pool: pool, cfg: c, t: partitionTables{
		events: q("events"), seq: q("events_position_seq"), streams: q("event_streams"), ids: q("event_ids"),
		archives: q("event_archives"), snapshots: q("snapshots"), checkpoints: q("checkpoints"),
		watermarks: q("outbox_watermarks"), projectionParked: q("projection_parked"),
		stagingParked: q("staging_parked"),
	}}, nil
}

// PartitionState says where a partition's events are.
type PartitionState string

// Partition states.
const (
	// PartitionAttached: in the events table.
	PartitionAttached PartitionState = "attached"
	// PartitionDetaching: an archive was started and has not finished (run Archive again to finish it).
	PartitionDetaching PartitionState = "detaching"
	// PartitionMoved: detached and moved to the archive schema.
	PartitionMoved PartitionState = "moved"
	// PartitionDropped: detached and dropped.
	PartitionDropped PartitionState = "dropped"
	// PartitionDetached: detached and left in the store's schema as a plain table (for pg_dump).
	PartitionDetached PartitionState = "detached"
)

// Partition is a partition of the events table, attached or archived.
type Partition struct {
	// Name is the table's name: events_p and the first position it holds, in 19 digits.
	Name string
	// From (inclusive) and To (exclusive) bound its positions. The first partition of a converted table takes
	// every position below To; its From is 1.
	From int64
	To   int64
	// State says where its events are.
	State PartitionState
	// Events is PostgreSQL's estimate for an attached partition (pg_class.reltuples, as of the last ANALYZE),
	// the exact count for an archived one.
	Events int64
	// Bytes is the table's size with its indexes (0 when dropped).
	Bytes int64
	// ArchiveSchema is where a moved partition went.
	ArchiveSchema string
	// ArchivedAt is when it was archived (zero while attached).
	ArchivedAt time.Time
}

// PartitionStatus describes the events table's partitions.
type PartitionStatus struct {
	// Partitioned is false for a table never converted (everything else is then empty).
	Partitioned bool
	// Drawn is the last position drawn from the sequence (the log's head, or past it while appends are in flight
	// or after aborted ones).
	Drawn int64
	// End is where the attached partitions end: positions from End on have no partition yet.
	End int64
	// Attached are the partitions in the table, by position.
	Attached []Partition
	// Archived are the partitions archived, by position.
	Archived []Partition
}

// Headroom is how many positions can still be drawn before appends fail for lack of a partition.
func (s PartitionStatus) Headroom() int64 {
	if s.End == 0 {
		return 0
	}
	return s.End - 1 - s.Drawn
}

// Status lists the partitions. On a table never converted it returns Partitioned false and no error.
func (p *Partitions) Status(ctx context.Context) (PartitionStatus, error) {
	return p.status(ctx, p.pool)
}

// querier is satisfied by *pgxpool.Pool, *pgxpool.Conn and pgx.Tx.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

var boundExpr = regexp.MustCompile(`FROM \((MINVALUE|'?(-?\d+)'?)\) TO \((MAXVALUE|'?(-?\d+)'?)\)`)

func (p *Partitions) status(ctx context.Context, db querier) (PartitionStatus, error) {
	var st PartitionStatus
	var kind *string
	if err := db.QueryRow(ctx, `SELECT (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)),
			(SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM `+p.t.seq+`)`, p.t.events).
		Scan(&kind, &st.Drawn); err != nil {
		return st, fmt.Errorf("eventstore: partitions of %s (did you run stagehand.Migrate?): %w", p.t.events, err)
	}
	if kind == nil {
		return st, fmt.Errorf("eventstore: partitions: no table %s (did you run stagehand.Migrate?)", p.t.events)
	}
	st.Partitioned = *kind == "p"
	if !st.Partitioned {
		return st, nil
	}
	rows, err := db.Query(ctx, `SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending,
			greatest(c.reltuples, 0)::bigint, pg_total_relation_size(c.oid)
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)`, p.t.events)
	if err != nil {
		return st, fmt.Errorf("eventstore: list partitions: %w", err)
	}
	for rows.Next() {
		var part Partition
		var bound string
		var detaching bool
		if err := rows.Scan(&part.Name, &bound, &detaching, &part.Events, &part.Bytes); err != nil {
			rows.Close()
			return st, fmt.Errorf("eventstore: list partitions: %w", err)
		}
		m := boundExpr.FindStringSubmatch(bound)
		if m == nil || m[3] == "MAXVALUE" {
			rows.Close()
			return st, fmt.Errorf("eventstore: partition %s has a bound stagehand did not create: %s", part.Name, bound)
		}
		part.From = 1
		if m[1] != "MINVALUE" {
			part.From, _ = strconv.ParseInt(m[2], 10, 64)
		}
		part.To, _ = strconv.ParseInt(m[4], 10, 64)
		part.State = PartitionAttached
		if detaching {
			part.State = PartitionDetaching
		}
		st.Attached = append(st.Attached, part)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("eventstore: list partitions: %w", err)
	}
	sort.Slice(st.Attached, func(i, j int) bool { return st.Attached[i].From < st.Attached[j].From })
	for _, part := range st.Attached {
		st.End = max(st.End, part.To)
	}
	rows, err = db.Query(ctx, `SELECT a.partition, a.from_position, a.to_position, a.events, a.state,
			coalesce(a.archive_schema, ''), a.archived_at,
			coalesce(pg_total_relation_size(to_regclass(format('%I.%I', coalesce(a.archive_schema, $1), a.partition))), 0)
		FROM `+p.t.archives+` a ORDER BY a.from_position`, p.cfg.Schema)
	if err != nil {
		return st, fmt.Errorf("eventstore: list archived partitions: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var part Partition
		var state string
		if err := rows.Scan(&part.Name, &part.From, &part.To, &part.Events, &state, &part.ArchiveSchema,
			&part.ArchivedAt, &part.Bytes); err != nil {
			return st, fmt.Errorf("eventstore: list archived partitions: %w", err)
		}
		part.State, part.ArchivedAt = PartitionState(state), part.ArchivedAt.UTC()
		// A partition recorded as detaching that is still attached (the archive stopped before its detach) is
		// listed with the attached ones only.
		if part.State != PartitionDetaching || !attached(st, part.Name) {
			st.Archived = append(st.Archived, part)
		}
	}
	return st, rows.Err()
}

func attached(st PartitionStatus, name string) bool {
	for _, a := range st.Attached {
		if a.Name == name {
			return true
		}
	}
	return false
}

// session is a connection holding the schema's partition lock, with the helpers the operations share.
type session struct {
	p    *Partitions
	conn *pgxpool.Conn
}

// lock takes a connection and the schema's session-level advisory lock (waiting for another operation to end).
func (p *Partitions) lock(ctx context.Context) (*session, error) {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("eventstore: partitions: acquire a connection: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('stagehand.partitions:' || $1, 0))`,
		p.cfg.Schema); err != nil {
		conn.Release()
		return nil, fmt.Errorf("eventstore: partitions: take the schema's partition lock: %w", err)
	}
	return &session{p: p, conn: conn}, nil
}

func (s *session) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended('stagehand.partitions:' || $1, 0))`,
		s.p.cfg.Schema); err != nil {
		// The lock ends with the session: close it rather than return it to the pool holding the lock.
		_ = s.conn.Conn().Close(ctx)
	}
	s.conn.Release()
}

// lockTimeout is the SET of the configured lock timeout.
func (p *Partitions) lockTimeout() string {
	return fmt.Sprintf("SET lock_timeout = %d", max(p.cfg.LockTimeout.Milliseconds(), 1))
}

// size is the size of new partitions: Size, else the newest partition's (when it is not the converted table).
func (p *Partitions) size(st PartitionStatus) int64 {
	if p.cfg.Size > 0 {
		return p.cfg.Size
	}
	if n := len(st.Attached); n > 0 && st.Attached[n-1].Name != partitionName(1) {
		return st.Attached[n-1].To - st.Attached[n-1].From
	}
	return DefaultPartitionSize
}

// boundary returns the first partition boundary (a multiple of size, plus one) strictly above pos.
func boundary(pos, size int64) int64 {
	if pos < 1 {
		return size + 1
	}
	return ((pos-1)/size+1)*size + 1
}

// createSQL returns the statements that create partition [from, to) and attach it: a plain table first, its
// indexes, then ATTACH PARTITION, which takes only a SHARE UPDATE EXCLUSIVE lock on the events table (appends go
// on; CREATE TABLE ... PARTITION OF would lock them out).
func (p *Partitions) createSQL(from, to int64) []string {
	name := partitionName(from)
	q := pgx.Identifier{p.cfg.Schema, name}.Sanitize()
	return []string{
		`CREATE TABLE ` + q + ` (LIKE ` + p.t.events + ` INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`,
		// Stream reads: a stream's events in version order.
		`CREATE INDEX ` + pgx.Identifier{name + "_stream_version_idx"}.Sanitize() + ` ON ` + q +
			` (tenant_id, stream_id, version)`,
		// Lookups by event ID (resolving a lost commit).
		`CREATE INDEX ` + pgx.Identifier{name + "_event_id_idx"}.Sanitize() + ` ON ` + q + ` (event_id)`,
		`ALTER TABLE ` + p.t.events + ` ATTACH PARTITION ` + q + fmt.Sprintf(` FOR VALUES FROM (%d) TO (%d)`, from, to),
	}
}

// Ensure creates the partitions missing between the end of the last one and Ahead partitions past the one that
// holds the next position to draw, and returns them. Run it periodically (or `stagehand events partitions create` from cron): an
// append whose position has no partition fails with a *NoPartitionError. Creating a partition does not block
// appends; each waits at most LockTimeout for a conflicting operation.
func (p *Partitions) Ensure(ctx context.Context) ([]Partition, error) {
	s, err := p.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer s.release()
	return s.ensure(ctx)
}

// Keep runs Ensure now and then every interval until ctx ends, and returns nil then: the maintenance step that
// keeps partitions ahead of the log from inside an application (run it in every instance: Ensure takes the
// schema's partition lock, so they take turns and find nothing left to do). A failed Ensure is logged and tried
// again at the next interval. A table never converted is checked at each interval and left alone until it is.
// interval must be positive.
func (p *Partitions) Keep(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("eventstore: keep partitions ahead: interval must be positive, got %v", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		created, err := p.Ensure(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrNotPartitioned):
		case err != nil:
			p.cfg.Logger.WarnContext(ctx, "stagehand: could not create events partitions ahead; retrying",
				"schema", p.cfg.Schema, "retry_in", interval, "error", err)
		case len(created) > 0:
			p.cfg.Logger.InfoContext(ctx, "stagehand: events partitions created ahead", "schema", p.cfg.Schema,
				"created", len(created), "up_to", created[len(created)-1].To)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (s *session) ensure(ctx context.Context) ([]Partition, error) {
	p := s.p
	tx, err := s.conn.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("eventstore: create partitions: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	st, err := p.status(ctx, tx)
	if err != nil {
		return nil, err
	}
	if !st.Partitioned {
		return nil, fmt.Errorf("%w: %s (convert it first)", ErrNotPartitioned, p.t.events)
	}
	created, err := p.createAhead(ctx, tx, st.Drawn, st.End, p.size(st))
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("eventstore: create partitions: commit: %w", err)
	}
	return created, nil
}

// createAhead creates, on tx, partitions from end until they reach Ahead partitions past drawn.
func (p *Partitions) createAhead(ctx context.Context, tx pgx.Tx, drawn, end, size int64) ([]Partition, error) {
	if _, err := tx.Exec(ctx, strings.Replace(p.lockTimeout(), "SET", "SET LOCAL", 1)); err != nil {
		return nil, fmt.Errorf("eventstore: create partitions: %w", err)
	}
	var created []Partition
	// The partition of the next position to draw, and Ahead more after it.
	want := boundary(drawn+1, size) + int64(p.cfg.Ahead)*size
	for from := end; from < want; from += size {
		to := from + size
		for _, stmt := range p.createSQL(from, to) {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return nil, fmt.Errorf("eventstore: create partition %s: %w", partitionName(from), err)
			}
		}
		created = append(created, Partition{Name: partitionName(from), From: from, To: to, State: PartitionAttached})
		p.cfg.Logger.InfoContext(ctx, "stagehand: events partition created", "schema", p.cfg.Schema,
			"partition", partitionName(from), "from", from, "to", to)
	}
	return created, nil
}

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

// ArchiveDisposition says what Archive does with a detached partition.
type ArchiveDisposition string

// Dispositions of an archived partition.
const (
	// ArchiveMove moves the table to the archive schema (default).
	ArchiveMove ArchiveDisposition = "move"
	// ArchiveDrop drops it.
	ArchiveDrop ArchiveDisposition = "drop"
	// ArchiveDetach leaves it in the store's schema as a plain table (pg_dump it, then drop it).
	ArchiveDetach ArchiveDisposition = "detach"
)

// ArchiveRequest says which partition to archive and how.
type ArchiveRequest struct {
	// Partition names the partition. Empty means the oldest attached one, the only one that may be archived:
	// archived positions are always a prefix of the log.
	Partition string
	// Disposition says what happens to the detached table. Default ArchiveMove.
	Disposition ArchiveDisposition
	// ArchiveSchema is where ArchiveMove moves it. Default the store's schema with "_archive" appended.
	ArchiveSchema string
	// AllowUncovered archives even when streams with events in the partition have no snapshot taken after them.
	// Loads of those streams then fail with an *ArchivedError naming the stream and the archived range (never a
	// state rebuilt from part of its history). Default false: Archive refuses, naming a few.
	AllowUncovered bool
}

// ArchiveResult describes an archive.
type ArchiveResult struct {
	// Partition is the archived partition, as it now is.
	Partition Partition
	// Uncovered is the number of streams whose loads now fail with an *ArchivedError (AllowUncovered).
	Uncovered int64
	// Check is the time taken by the checks, Detach by DETACH PARTITION CONCURRENTLY, Duration by the whole.
	Check    time.Duration
	Detach   time.Duration
	Duration time.Duration
}

// Archive detaches the oldest partition without blocking appends or reads (DETACH PARTITION CONCURRENTLY), then
// moves it to the archive schema, drops it, or leaves it (req.Disposition), removes its event IDs from event_ids
// and records it in event_archives.
//
// It refuses (an *ArchiveRefusedError naming every reason, nothing changed) while the partition is still needed:
// the log has not drawn its last position; a log follower (a projection, the Deferred stager, the reconciler, a
// log subscriber: every row of the checkpoints table) has not passed it or has a rebuild pending; an outbox
// watermark has not passed it; a projection or a staging worker has parked events in it (replay or discard them
// first); or, unless req.AllowUncovered, a stream with events in it has no snapshot at a later version. Log
// followers that never ran in the schema are unknown to it.
//
// An archive interrupted after the detach began is finished by running Archive again (for the same partition).
func (p *Partitions) Archive(ctx context.Context, req ArchiveRequest) (ArchiveResult, error) {
	start := time.Now()
	var res ArchiveResult
	switch req.Disposition {
	case "":
		req.Disposition = ArchiveMove
	case ArchiveMove, ArchiveDrop, ArchiveDetach:
	default:
		return res, fmt.Errorf("eventstore: archive: unknown disposition %q (move, drop or detach)", req.Disposition)
	}
	if req.ArchiveSchema == "" {
		req.ArchiveSchema = p.cfg.Schema + "_archive"
	}
	if reason := names.Identifier(req.ArchiveSchema); reason != "" {
		return res, fmt.Errorf("eventstore: archive: ArchiveSchema %q %s", names.Cut(req.ArchiveSchema, 80), reason)
	}
	s, err := p.lock(ctx)
	if err != nil {
		return res, err
	}
	defer s.release()
	st, err := p.status(ctx, s.conn)
	if err != nil {
		return res, err
	}
	if !st.Partitioned {
		return res, fmt.Errorf("%w: %s (convert it first)", ErrNotPartitioned, p.t.events)
	}
	if len(st.Attached) == 0 {
		return res, fmt.Errorf("eventstore: archive: %s has no partition", p.t.events)
	}
	// An archive that stopped after its detach began is finished first, whatever was asked.
	part, resume := st.Attached[0], st.Attached[0].State == PartitionDetaching
	for _, a := range st.Archived {
		if a.State == PartitionDetaching {
			part, resume = a, true
		}
	}
	if !resume && req.Partition != "" && req.Partition != part.Name {
		return res, fmt.Errorf("eventstore: archive: %q is not the oldest attached partition (%s): partitions are "+
			"archived oldest first", req.Partition, part.Name)
	}
	if !resume {
		t0 := time.Now()
		if res.Uncovered, err = s.check(ctx, st, part, req.AllowUncovered); err != nil {
			return res, err
		}
		res.Check = time.Since(t0)
		if _, err := s.conn.Exec(ctx, `INSERT INTO `+p.t.archives+` (partition, from_position, to_position, events,
				state) VALUES ($1, $2, $3, $4, 'detaching')
			ON CONFLICT (partition) DO UPDATE SET state = 'detaching', archived_at = now()`,
			part.Name, part.From, part.To, part.Events); err != nil {
			return res, fmt.Errorf("eventstore: archive: record %s: %w", part.Name, err)
		}
	}
	partQ := pgx.Identifier{p.cfg.Schema, part.Name}.Sanitize()
	t0 := time.Now()
	switch {
	case part.State == PartitionDetaching && attached(st, part.Name):
		// A DETACH CONCURRENTLY that was interrupted after its first transaction.
		err = s.execLocked(ctx, `ALTER TABLE `+p.t.events+` DETACH PARTITION `+partQ+` FINALIZE`)
	case part.State == PartitionAttached:
		err = s.execLocked(ctx, `ALTER TABLE `+p.t.events+` DETACH PARTITION `+partQ+` CONCURRENTLY`)
	}
	if err != nil {
		return res, fmt.Errorf("eventstore: archive: detach %s (run the archive again to finish it): %w", part.Name, err)
	}
	res.Detach = time.Since(t0)
	p.cfg.Logger.InfoContext(ctx, "stagehand: events partition detached", "schema", p.cfg.Schema,
		"partition", part.Name, "took", res.Detach)

	var events int64
	if err := s.conn.QueryRow(ctx, `SELECT count(*) FROM `+partQ).Scan(&events); err != nil {
		return res, fmt.Errorf("eventstore: archive: count %s: %w", part.Name, err)
	}
	if _, err := s.conn.Exec(ctx, `DELETE FROM `+p.t.ids+` i USING `+partQ+` d WHERE i.event_id = d.event_id`); err != nil {
		return res, fmt.Errorf("eventstore: archive: remove the event IDs of %s: %w", part.Name, err)
	}
	state, schema := PartitionDetached, ""
	switch req.Disposition {
	case ArchiveMove:
		archQ := pgx.Identifier{req.ArchiveSchema}.Sanitize()
		if _, err := s.conn.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+archQ); err != nil {
			return res, fmt.Errorf("eventstore: archive: create schema %q: %w", req.ArchiveSchema, err)
		}
		if err := s.execLocked(ctx, `ALTER TABLE `+partQ+` SET SCHEMA `+archQ); err != nil {
			return res, fmt.Errorf("eventstore: archive: move %s to %q: %w", part.Name, req.ArchiveSchema, err)
		}
		state, schema = PartitionMoved, req.ArchiveSchema
	case ArchiveDrop:
		if err := s.execLocked(ctx, `DROP TABLE `+partQ); err != nil {
			return res, fmt.Errorf("eventstore: archive: drop %s: %w", part.Name, err)
		}
		state = PartitionDropped
	}
	if _, err := s.conn.Exec(ctx, `UPDATE `+p.t.archives+` SET state = $2, events = $3, archive_schema = $4
		WHERE partition = $1`, part.Name, string(state), events, nilIfBlank(schema)); err != nil {
		return res, fmt.Errorf("eventstore: archive: record %s: %w", part.Name, err)
	}
	part.State, part.Events, part.ArchiveSchema, part.ArchivedAt = state, events, schema, time.Now().UTC()
	if state == PartitionDropped {
		part.Bytes = 0
	}
	res.Partition, res.Duration = part, time.Since(start)
	return res, nil
}

func nilIfBlank(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// check returns the reasons not to archive part, as an *ArchiveRefusedError, and the number of streams no
// snapshot covers.
func (s *session) check(ctx context.Context, st PartitionStatus, part Partition, allowUncovered bool) (int64, error) {
	p := s.p
	last := part.To - 1
	var reasons []string
	if st.Drawn < last {
		reasons = append(reasons, fmt.Sprintf("the log has not reached the partition's end: position %d drawn, "+
			"the partition ends at %d", st.Drawn, last))
	}
	if len(st.Attached) < 2 {
		reasons = append(reasons, "it is the only attached partition")
	}
	rows, err := s.conn.Query(ctx, `SELECT name, kind, position, reset_requested FROM `+p.t.checkpoints+`
		WHERE position < $1 OR reset_requested ORDER BY name`, last)
	if err != nil {
		return 0, fmt.Errorf("eventstore: archive: read the log followers' checkpoints: %w", err)
	}
	for rows.Next() {
		var name, kind string
		var pos int64
		var reset bool
		if err := rows.Scan(&name, &kind, &pos, &reset); err != nil {
			rows.Close()
			return 0, fmt.Errorf("eventstore: archive: read the log followers' checkpoints: %w", err)
		}
		if reset {
			reasons = append(reasons, fmt.Sprintf("log follower %q (%s) has a rebuild pending, which reads the "+
				"log from the start", name, kind))
		} else {
			reasons = append(reasons, fmt.Sprintf("log follower %q (%s) is at position %d, before %d", name, kind,
				pos, last))
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("eventstore: archive: read the log followers' checkpoints: %w", err)
	}
	rows, err = s.conn.Query(ctx, `SELECT name, position FROM `+p.t.watermarks+` WHERE position < $1 ORDER BY name`,
		last)
	if err != nil {
		return 0, fmt.Errorf("eventstore: archive: read the outbox watermarks: %w", err)
	}
	for rows.Next() {
		var name string
		var pos int64
		if err := rows.Scan(&name, &pos); err != nil {
			rows.Close()
			return 0, fmt.Errorf("eventstore: archive: read the outbox watermarks: %w", err)
		}
		reasons = append(reasons, fmt.Sprintf("outbox watermark %q is at position %d, before %d", name, pos, last))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("eventstore: archive: read the outbox watermarks: %w", err)
	}
	var projParked, stagingParked int64
	if err := s.conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+p.t.projectionParked+`
			WHERE position >= $1 AND position < $2),
		(SELECT count(*) FROM `+p.t.stagingParked+` WHERE position >= $1 AND position < $2)`, part.From, part.To).
		Scan(&projParked, &stagingParked); err != nil {
		return 0, fmt.Errorf("eventstore: archive: count parked events: %w", err)
	}
	if projParked > 0 {
		reasons = append(reasons, fmt.Sprintf("%d events parked by projections are in it (replay or discard them)",
			projParked))
	}
	if stagingParked > 0 {
		reasons = append(reasons, fmt.Sprintf("%d events parked by staging workers are in it (replay or discard "+
			"them)", stagingParked))
	}
	partQ := pgx.Identifier{p.cfg.Schema, part.Name}.Sanitize()
	uncoveredSQL := `FROM (SELECT tenant_id, stream_id, max(version) AS v FROM ` + partQ + `
			GROUP BY tenant_id, stream_id) e
		WHERE NOT EXISTS (SELECT 1 FROM ` + p.t.snapshots + ` s
			WHERE s.tenant_id = e.tenant_id AND s.stream_id = e.stream_id AND s.version > e.v)`
	var uncovered int64
	if err := s.conn.QueryRow(ctx, `SELECT count(*) `+uncoveredSQL).Scan(&uncovered); err != nil {
		return 0, fmt.Errorf("eventstore: archive: find the streams no snapshot covers: %w", err)
	}
	if uncovered > 0 && !allowUncovered {
		var examples []string
		if err := s.conn.QueryRow(ctx, `SELECT coalesce(array_agg(x), '{}') FROM (SELECT format('%s (tenant %s)',
				e.stream_id, e.tenant_id) AS x `+uncoveredSQL+` LIMIT 3) ex`).Scan(&examples); err != nil {
			return 0, fmt.Errorf("eventstore: archive: find the streams no snapshot covers: %w", err)
		}
		reasons = append(reasons, fmt.Sprintf("%d streams with events in it have no snapshot taken after them, "+
			"so loading them would need it (for example %s); snapshot them, or allow uncovered streams (their "+
			"loads then fail with ErrArchived)", uncovered, strings.Join(examples, ", ")))
	}
	if len(reasons) > 0 {
		return 0, &ArchiveRefusedError{Partition: part.Name, Reasons: reasons}
	}
	return uncovered, nil
}

// archivedRange returns the archived positions [from, to), or (0, 0) when nothing is archived.
func (s *PostgresStore) archivedRange(ctx context.Context, db dbtx) (int64, int64, error) {
	return archivedRange(ctx, db, s.t.archives)
}

func archivedRange(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, table string) (int64, int64, error) {
	var from, to int64
	err := db.QueryRow(ctx, `SELECT coalesce(min(from_position), 0), coalesce(max(to_position), 0) FROM `+
		table).Scan(&from, &to)
	if err != nil {
		return 0, 0, fmt.Errorf("eventstore: read the archived ranges: %w", err)
	}
	return from, to, nil
}

// CheckLogFrom returns an *ArchivedError when a read of schema's global log after position after would need
// archived events (see Partitions.Archive), and nil when it would not (nothing is archived, or after is at or past
// the end of the archived range). It is for code that is about to send a reader there from afar, such as a
// projection rebuild requested by an operator: the reader itself gets the same error from ReadLog.
func CheckLogFrom(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, schema string, after int64) error {
	if reason := names.Schema(schema); reason != "" {
		return &ConfigError{Package: "eventstore", Field: "schema", Reason: reason}
	}
	from, to, err := archivedRange(ctx, db, pgx.Identifier{schema, "event_archives"}.Sanitize())
	if err != nil {
		return err
	}
	if to > 0 && after < to-1 {
		return &ArchivedError{After: after, ArchivedFrom: from, ArchivedTo: to}
	}
	return nil
}
