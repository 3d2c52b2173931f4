package eventstore

import (
	"context"
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
	// idents are the identifier markers of sql/partitions.sql: the schema and its tables, quoted.
	idents map[string]string
	// q are the statements that take parameters, written out for the schema.
	q partitionSQL
}

type partitionTables struct {
	events, streams string
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
	p := &Partitions{pool: pool, cfg: c, t: partitionTables{events: q("events"), streams: q("event_streams")},
		idents: map[string]string{
			"schema": pgx.Identifier{c.Schema}.Sanitize(), "events": q("events"), "seq": q("events_position_seq"),
			"streams": q("event_streams"), "ids": q("event_ids"), "archives": q("event_archives"),
			"snapshots": q("snapshots"), "checkpoints": q("checkpoints"), "watermarks": q("outbox_watermarks"),
			"projection_parked": q("projection_parked"), "staging_parked": q("staging_parked"),
			"lifecycle": q("stream_lifecycle"),
		}}
	if p.q, err = newPartitionSQL(p.idents); err != nil {
		return nil, err
	}
	return p, nil
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
	args := &partParam{Schema: p.cfg.Schema, EventsTable: p.t.events}
	if err := db.QueryRow(ctx, p.q.tableKind.SQL, p.q.tableKind.Args(args)...).Scan(&kind, &st.Drawn); err != nil {
		return st, fmt.Errorf("eventstore: partitions of %s (did you run stagehand.Migrate?): %w", p.t.events, err)
	}
	if kind == nil {
		return st, fmt.Errorf("eventstore: partitions: no table %s (did you run stagehand.Migrate?)", p.t.events)
	}
	st.Partitioned = *kind == "p"
	if !st.Partitioned {
		return st, nil
	}
	rows, err := db.Query(ctx, p.q.listAttached.SQL, p.q.listAttached.Args(args)...)
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
	rows, err = db.Query(ctx, p.q.listArchived.SQL, p.q.listArchived.Args(args)...)
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
	if _, err := conn.Exec(ctx, p.q.lock.SQL, p.q.lock.Args(&partParam{Schema: p.cfg.Schema})...); err != nil {
		conn.Release()
		return nil, fmt.Errorf("eventstore: partitions: take the schema's partition lock: %w", err)
	}
	return &session{p: p, conn: conn}, nil
}

func (s *session) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	unlock := s.p.q.unlock
	if _, err := s.conn.Exec(ctx, unlock.SQL, unlock.Args(&partParam{Schema: s.p.cfg.Schema})...); err != nil {
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
