package eventstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/conf"
	"github.com/stagehand-es/stagehand/internal/jsonmeta"
	"github.com/stagehand-es/stagehand/internal/names"
	"github.com/stagehand-es/stagehand/internal/pgnotify"
	"github.com/stagehand-es/stagehand/internal/sqlfile"
)

// PostgresConfig configures a PostgresStore. A nil *PostgresConfig uses the defaults.
type PostgresConfig struct {
	// Schema holding the stagehand tables (created by stagehand.Migrate). Default "stagehand". Quoted, never
	// interpolated.
	Schema string
	// DisableNotify turns off the wake-up NOTIFY sent (coalesced, after commit, never inside the append's
	// transaction) so log followers react within milliseconds. Default false: notifications on.
	DisableNotify bool
	// MaxGapWait bounds how long one ReadLog call waits for in-flight appends that may fill a gap in the global log.
	// When it passes, ReadLog returns the events before the gap and the caller retries later. Default 2s. It bounds
	// one call, not how long a reader stays before the gap: that lasts until the transactions that may still commit
	// the missing position have ended (see PostgresStore).
	MaxGapWait time.Duration
	// Clock stamps OccurredAt when an event carries none. Default time.Now.
	Clock func() time.Time
	// Logger receives diagnostics. Default: silent.
	Logger *slog.Logger
}

// DefaultMaxGapWait is PostgresConfig.MaxGapWait's default.
const DefaultMaxGapWait = 2 * time.Second

func (c *PostgresConfig) withDefaults() (PostgresConfig, error) {
	var cfg PostgresConfig
	if c != nil {
		cfg = *c
	}
	check := conf.Check{Package: "eventstore"}
	check.Text("Schema", &cfg.Schema, stagehand.DefaultSchema, names.Identifier)
	check.NonNegativeDuration("MaxGapWait", &cfg.MaxGapWait, DefaultMaxGapWait)
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, check.Err()
}

// PostgresStore is the PostgreSQL event store. It implements TransactionalStore.
//
// The global log is gap-safe by lock-aware gap detection: positions come from a sequence drawn by the INSERT (CACHE
// 1). When a reader meets a missing position it waits only for the transactions that held a RowExclusiveLock on the
// events table when the gap was seen (any transaction that drew the missing position is among them), then
// re-reads; a position still missing then belongs to an aborted transaction and is skipped. Readers stall only on
// event writers, never on unrelated long transactions, and never forever under continuous writes.
//
// Exactly what holds a reader back at a gap, and for how long: a transaction holding (or waiting for) a
// RowExclusiveLock on the events table that is running a statement, or that has written anything (it has a
// transaction ID: an append, or any other INSERT, UPDATE or DELETE on the table) and is still open. The reader waits
// for those that held the lock when it met the gap, MaxGapWait per ReadLog call, and passes the gap once they have
// ended; so an append transaction a caller leaves open (AppendTx without a commit) holds every reader at its
// position until it ends, by design: it may still commit. Not counted, because they can never commit a position: a
// transaction that only took the lock and wrote nothing (an INSERT that failed under a savepoint, LOCK TABLE), idle
// in its transaction, and a failed transaction waiting for its ROLLBACK. Sessions whose state the store's role may
// not read (pg_stat_activity) are counted, to be safe. The table is named, not cached by OID, in every check, so a
// schema dropped and migrated again under a running store is followed.
//
// ReadLog refuses (ErrInRecovery) to read on a server in recovery: a hot standby's pg_locks does not show the
// primary's transactions, so a gap there cannot be judged. Point log readers (projections, the Deferred stager,
// the reconciler) at the primary; Load and ReadStream work on a standby.
type PostgresStore struct {
	pool *pgxpool.Pool
	cfg  PostgresConfig
	t    tables
	// q are the store's statements (sql/*.sql), written out for its schema.
	q        storeSQL
	tableLay tableLayout
	notifier *pgnotify.Notifier
	channel  string

	primary atomic.Bool // the first ReadLog found a server not in recovery
	// serverPIDs is what backendPIDs found of the pool's connections: 0 not checked yet, pidsDirect or
	// pidsPooled.
	serverPIDs atomic.Int32
}

type tables struct {
	events, snapshots, streams, archives string
	// lifecycle and streamArchive are the stream lifecycle's tables (see LifecycleStore).
	lifecycle, streamArchive string
}

// NewPostgres returns a store on pool. It does not create tables: run stagehand.Migrate first. The pool is not
// closed by the store.
func NewPostgres(pool *pgxpool.Pool, cfg *PostgresConfig) (*PostgresStore, error) {
	if pool == nil {
		return nil, &ConfigError{Package: "eventstore", Field: "pool", Reason: "must not be nil"}
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &PostgresStore{
		pool: pool,
		cfg:  c,
		t: tables{
			events:        pgx.Identifier{c.Schema, "events"}.Sanitize(),
			snapshots:     pgx.Identifier{c.Schema, "snapshots"}.Sanitize(),
			streams:       pgx.Identifier{c.Schema, "event_streams"}.Sanitize(),
			archives:      pgx.Identifier{c.Schema, "event_archives"}.Sanitize(),
			lifecycle:     pgx.Identifier{c.Schema, "stream_lifecycle"}.Sanitize(),
			streamArchive: pgx.Identifier{c.Schema, "stream_archive"}.Sanitize(),
		},
		channel: pgnotify.Channel(c.Schema, "events"),
	}
	if s.q, err = newStoreSQL(s.t); err != nil {
		return nil, err
	}
	if !c.DisableNotify {
		s.notifier = pgnotify.NewNotifier(pool, s.channel, c.Logger)
	}
	return s, nil
}

// Close waits for in-flight wake-up notifications. It does not close the pool. Safe to call more than once.
func (s *PostgresStore) Close() {
	if s.notifier != nil {
		s.notifier.Close()
	}
}

// Pool returns the pool the store writes through.
func (s *PostgresStore) Pool() *pgxpool.Pool { return s.pool }

// Begin starts a transaction on the store's pool, for AppendTx.
func (s *PostgresStore) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("eventstore: begin: %w", err)
	}
	return tx, nil
}

// Schema returns the schema the store's tables live in.
func (s *PostgresStore) Schema() string { return s.cfg.Schema }

// NotifyChannel is the LISTEN channel that receives a wake-up after appends commit.
func (s *PostgresStore) NotifyChannel() string { return s.channel }

// Notify sends a wake-up to log followers. Call it after committing a transaction that used AppendTx; Append and
// AppendWith do it themselves. Without it, followers see the events at their next poll.
func (s *PostgresStore) Notify() {
	if s.notifier != nil {
		s.notifier.Notify()
	}
}

// Append implements Store. It is one statement in its own transaction.
func (s *PostgresStore) Append(ctx context.Context, req AppendRequest) (AppendResult, error) {
	res, err := s.append(ctx, s.pool, req, false)
	if err != nil {
		return s.appendFailed(ctx, req, err)
	}
	s.Notify()
	return res, nil
}

// AppendTx implements TransactionalStore. The append runs under a savepoint (sent in the same round trip), so a
// version conflict leaves the caller's transaction usable.
func (s *PostgresStore) AppendTx(ctx context.Context, tx pgx.Tx, req AppendRequest) (AppendResult, error) {
	if tx == nil {
		return AppendResult{}, fmt.Errorf("%w: nil transaction", ErrInvalidAppend)
	}
	return s.append(ctx, tx, req, true)
}

// AppendWith implements TransactionalStore. It holds one connection at a time: what it reads after a failure (the
// stream's version for a conflict) it reads once its transaction has ended.
func (s *PostgresStore) AppendWith(ctx context.Context, req AppendRequest, stage StageFunc) (AppendResult, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return AppendResult{}, fmt.Errorf("eventstore: begin: %w", err)
	}
	rollback := func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }
	defer rollback()
	res, err := s.append(ctx, tx, req, false)
	if err != nil {
		rollback()
		return AppendResult{}, s.withCurrent(ctx, err, req)
	}
	if stage != nil {
		if err := stage(ctx, tx, res); err != nil {
			rollback()
			return AppendResult{}, s.stageError(ctx, err, req)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return s.commitFailed(ctx, tx, req, res, err)
	}
	s.Notify()
	return res, nil
}

// dbtx is satisfied by *pgxpool.Pool and pgx.Tx.
type dbtx interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

func (s *PostgresStore) append(ctx context.Context, db dbtx, req AppendRequest, savepoint bool) (AppendResult, error) {
	// After a savepoint rollback the caller's transaction is usable and sees its own writes, so a conflict's
	// version is read on it. A failed insert without a savepoint aborts the transaction: the version is left
	// unknown (-1) for AppendWith to read once that transaction has ended (withCurrent), never on a second
	// connection while it holds this one. Only an append that owns its transaction (or its savepoint) may retry.
	lookup := db
	if !savepoint && inTx(db) {
		lookup = nil
	}
	return s.appendBy(ctx, db, req, lookup, savepoint || !inTx(db), func(sql string, args []any) ([]Record, error) {
		if savepoint {
			return s.insertUnderSavepoint(ctx, db, sql, args)
		}
		return s.insert(ctx, db, sql, args)
	})
}

// appendBy prepares req, inserts it with insert (on db, whose layout picks the statement) and turns the outcome into
// a result or a typed error: a failed version check, or a lost race on the stream's unique index, is a conflict
// (with the stream's current version read on lookup, or -1 when lookup is nil); an AnyVersion or StreamExists
// append that lost a race is retried when retry allows it.
func (s *PostgresStore) appendBy(ctx context.Context, db dbtx, req AppendRequest, lookup dbtx, retry bool,
	insert func(sql string, args []any) ([]Record, error)) (AppendResult, error) {
	req, err := prepare(req, s.cfg.Clock())
	if err != nil {
		return AppendResult{}, err
	}
	p, l := appendParams(req)
	stmt, err := s.appendSQL(ctx, db, req.Expected, l)
	if err != nil {
		return AppendResult{}, fmt.Errorf("eventstore: append to stream %q: %w", req.StreamID, err)
	}
	args := stmt.Args(&p)
	for attempt := 0; ; attempt++ {
		recs, err := insert(stmt.SQL, args)
		if err == nil && len(recs) == 0 {
			return AppendResult{}, s.conflict(ctx, lookup, req)
		}
		if err != nil {
			err = s.translate(err, req)
			if errors.Is(err, ErrConcurrencyConflict) && lookup != nil {
				if lerr := s.lifecycleConflict(ctx, lookup, req); lerr != nil {
					return AppendResult{}, lerr // archived or deleted: no retry can succeed
				}
			}
			// Two AnyVersion/StreamExists appends read the same current version; the loser retries. An exact
			// expectation that lost is a real conflict.
			if errors.Is(err, ErrConcurrencyConflict) && (req.Expected == AnyVersion ||
				req.Expected == StreamExists) && attempt < 20 && retry {
				continue
			}
			var c *ConflictError
			if errors.Is(err, ErrConcurrencyConflict) && lookup == nil && errors.As(err, &c) {
				return AppendResult{}, c // a transaction conflict, with its reason
			}
			if errors.Is(err, ErrConcurrencyConflict) {
				return AppendResult{}, s.conflict(ctx, lookup, req)
			}
			return AppendResult{}, err
		}
		return appended(req, recs), nil
	}
}

// appended completes the rows an insert returned (position, version, recorded-at) with the request's data.
func appended(req AppendRequest, recs []Record) AppendResult {
	sort.Slice(recs, func(i, j int) bool { return recs[i].Version < recs[j].Version })
	for i := range recs {
		e := req.Events[i]
		r := &recs[i]
		r.Tenant, r.StreamID, r.StreamType = req.Tenant, req.StreamID, req.StreamType
		r.EventID, r.Type, r.TypeVersion = e.EventID, e.Type, e.TypeVersion
		r.Payload, r.Metadata, r.OccurredAt = e.Payload, e.Metadata, e.OccurredAt
		r.RecordedAt = r.RecordedAt.UTC()
	}
	return AppendResult{Records: recs, Version: recs[len(recs)-1].Version}
}

func inTx(db dbtx) bool {
	_, ok := db.(pgx.Tx)
	return ok
}

// layout is the parameter layout of an append statement (sql/events.sql).
type layout int

const (
	// single: one event, its columns as scalars (append_single).
	single layout = iota
	// uniform: several events sharing type version, metadata and occurred-at: arrays of ID, type and payload, the
	// rest as scalars (append_uniform).
	uniform
	// mixed: several events that differ in those too: arrays of every column (append_mixed).
	mixed
)

// appendParams lays out the statement's parameters. What a save's events usually share (type version, metadata,
// occurred-at) goes as one scalar each, as arrays only when the events differ.
func appendParams(req AppendRequest) (param, layout) {
	n := len(req.Events)
	metas := make([]string, n)
	same := true
	first := req.Events[0]
	for i, e := range req.Events {
		m := jsonmeta.Encode(e.Metadata)
		metas[i] = m
		same = same && m == metas[0] && e.TypeVersion == first.TypeVersion && e.OccurredAt.Equal(first.OccurredAt)
	}
	p := param{Tenant: req.Tenant, StreamID: req.StreamID, StreamType: req.StreamType, Expected: int64(req.Expected),
		TypeVersion: int32(first.TypeVersion), Metadata: metas[0], OccurredAt: first.OccurredAt}
	if n == 1 {
		// Event IDs as pgx's own UUIDs, encoded in binary as they are. A uuid.UUID is a driver.Valuer, which pgx
		// turns into a string and parses back (strings for a uuid[] parameter first fail the binary encoding,
		// building an error, and then go as text).
		p.EventID = pgtype.UUID{Bytes: first.EventID, Valid: true}
		p.EventType, p.Payload = first.Type, string(first.Payload)
		return p, single
	}
	p.EventIDs, p.EventTypes, p.Payloads = make([]pgtype.UUID, n), make([]string, n), make([]string, n)
	for i, e := range req.Events {
		p.EventIDs[i], p.EventTypes[i], p.Payloads[i] = pgtype.UUID{Bytes: e.EventID, Valid: true}, e.Type,
			string(e.Payload)
	}
	if same {
		return p, uniform
	}
	p.TypeVersions, p.OccurredAts, p.Metadatas = make([]int32, n), make([]time.Time, n), metas
	for i, e := range req.Events {
		p.TypeVersions[i], p.OccurredAts[i] = int32(e.TypeVersion), e.OccurredAt
	}
	return p, mixed
}

func (s *PostgresStore) insert(ctx context.Context, db dbtx, sql string, args []any) ([]Record, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return scanAppended(rows)
}

// insertUnderSavepoint sends SAVEPOINT, the insert and RELEASE in one round trip; after a failed insert it rolls
// back to the savepoint so the caller's transaction stays usable.
func (s *PostgresStore) insertUnderSavepoint(ctx context.Context, db dbtx, sql string, args []any) ([]Record, error) {
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT stagehand_append")
	b.Queue(sql, args...)
	b.Queue("RELEASE SAVEPOINT stagehand_append")
	br := db.SendBatch(ctx, b)
	_, err := br.Exec()
	var recs []Record
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			recs, err = scanAppended(rows)
		}
		if err == nil {
			_, err = br.Exec()
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if _, rerr := db.Exec(ctx, "ROLLBACK TO SAVEPOINT stagehand_append"); rerr != nil {
			return nil, fmt.Errorf("%w (and rolling back to the savepoint failed: %w)", err, rerr)
		}
		return nil, err
	}
	return recs, nil
}

func scanAppended(rows pgx.Rows) ([]Record, error) {
	defer rows.Close()
	var recs []Record
	for rows.Next() {
		var r Record
		if err := rows.Scan(&r.Position, &r.Version, &r.RecordedAt); err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	return recs, rows.Err()
}

// appendSQL returns the single statement of an append. The unique index on (tenant_id, stream_id, version) is the
// concurrency control: two writers that both read version n cannot both insert n+1, and the statement that loses
// inserts none of its events. The expected version gives the stream's current version (the base the new versions
// count from) as a scalar that is NULL when the check fails: for an exact version n, n when the stream's event n
// exists (one index probe); for StreamExists, the stream's highest version. A NULL base makes every new version
// NULL, so the statement fails on the column's NOT NULL constraint (translated into a conflict) rather than
// inserting nothing: statements queued after it in the same transaction never run after a failed check.
//
// On a partitioned events table (see Partitions) the base is read from the stream's head in event_streams (one
// probe, where the events' own index has one per partition), and the table's trigger is the concurrency control
// (see migration 035): it moves the head from base to the last new version, or fails as the unique index did.
//
// The layout is read through db (see layout): an error only when db is a transaction the read failed on.
func (s *PostgresStore) appendSQL(ctx context.Context, db dbtx, expected ExpectedVersion, l layout) (
	sqlfile.Named[param], error) {
	lay, err := s.layout(ctx, db)
	return s.q.appends[b2i(lay.partitioned)][expectationKind(expected)][l], err
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// expectationKind indexes the append statements by expected version: NoStream, AnyVersion, StreamExists, exact.
func expectationKind(expected ExpectedVersion) int {
	switch {
	case expected == NoStream:
		return 0
	case expected == AnyVersion:
		return 1
	case expected == StreamExists:
		return 2
	}
	return 3
}

// conflict builds the ConflictError with the stream's current version as db sees it (-1 when it cannot be read,
// or db is nil).
func (s *PostgresStore) conflict(ctx context.Context, db dbtx, req AppendRequest) error {
	actual := int64(-1)
	if db != nil {
		if q, err := s.versionSQL(ctx, db); err == nil {
			if err := db.QueryRow(ctx, q.SQL, q.Args(&param{Tenant: req.Tenant, StreamID: req.StreamID})...).
				Scan(&actual); err != nil {
				actual = -1
			}
		}
	}
	return &ConflictError{Tenant: req.Tenant, StreamID: req.StreamID, Expected: req.Expected, Actual: actual}
}

// versionSQL reads a stream's current version (0 when it does not exist): its head on a partitioned table, its
// highest event otherwise. The layout is read through db.
func (s *PostgresStore) versionSQL(ctx context.Context, db dbtx) (sqlfile.Named[param], error) {
	lay, err := s.layout(ctx, db)
	if err != nil {
		return sqlfile.Named[param]{}, err
	}
	return s.q.version[b2i(lay.partitioned)], nil
}

// translate turns driver errors into the store's typed errors; no raw SQLSTATE reaches the user for an expected
// condition.
func (s *PostgresStore) translate(err error, req AppendRequest) error {
	if c := txConflict(err, req); c != nil {
		return c
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		switch pgErr.ConstraintName {
		case "events_event_id_key", "event_ids_pkey":
			return fmt.Errorf("%w: an event of the append to stream %q is already stored", ErrDuplicateEventID,
				req.StreamID)
		case "events_stream_version_key":
			return ErrConcurrencyConflict
		}
	}
	if failedVersionCheck(err) {
		return ErrConcurrencyConflict
	}
	if np := noPartition(err); np != nil {
		return np
	}
	if terr := translateData(err, req); terr != nil {
		return terr
	}
	return fmt.Errorf("eventstore: append to stream %q: %w", req.StreamID, err)
}

// failedVersionCheck reports whether err is the NOT NULL violation of an append whose expected version did not hold
// (see appendSQL).
func failedVersionCheck(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23502" && pgErr.ColumnName == "version" &&
		(pgErr.TableName == "events" || isPartitionName(pgErr.TableName))
}

// finishRecord normalises times to UTC and decodes the metadata column by jsonmeta's one reading rule: values that
// are not strings are read as their JSON text, and metadata that is not a JSON object (42, [], "s", true, every
// length alike) returns a *RecordError.
func finishRecord(r *Record, meta []byte) error {
	r.OccurredAt, r.RecordedAt = r.OccurredAt.UTC(), r.RecordedAt.UTC()
	m, err := jsonmeta.Decode(meta) // "{}", null and an empty column are no metadata
	if err != nil {
		return &RecordError{Record: *r, Err: err}
	}
	r.Metadata = m
	return nil
}

// ReadStream implements Store.
func (s *PostgresStore) ReadStream(ctx context.Context, tenant, streamID string, fromVersion int64) ([]Record, error) {
	return poolRead(ctx, func() ([]Record, error) { return s.readStream(ctx, s.pool, tenant, streamID, fromVersion, 0) })
}

// Stream implements Store.
func (s *PostgresStore) Stream(ctx context.Context, tenant, streamID string) (StreamInfo, error) {
	return poolRead(ctx, func() (StreamInfo, error) { return s.stream(ctx, tenant, streamID) })
}

func (s *PostgresStore) stream(ctx context.Context, tenant, streamID string) (StreamInfo, error) {
	tenant = tenantOrDefault(tenant)
	info := StreamInfo{Tenant: tenant, StreamID: streamID, State: StreamActive}
	var lastType string
	q := s.q.streamInfo
	err := s.pool.QueryRow(ctx, q.SQL, q.Args(&param{Tenant: tenant, StreamID: streamID})...).
		Scan(&info.StreamType, &info.Version, &lastType, &info.CreatedAt, &info.UpdatedAt)
	if err == nil && IsLifecycleMarker(lastType) {
		return s.movedStream(ctx, tenant, streamID)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err := s.readStream(ctx, s.pool, tenant, streamID, 1, 1); err != nil {
			return info, err // not found, or archived
		}
		return info, fmt.Errorf("%w: %q (tenant %q)", ErrStreamNotFound, streamID, tenant)
	}
	if err != nil {
		return info, fmt.Errorf("eventstore: stream %q: %w", streamID, err)
	}
	info.CreatedAt, info.UpdatedAt = info.CreatedAt.UTC(), info.UpdatedAt.UTC()
	return info, nil
}

// HeadPosition implements Store.
func (s *PostgresStore) HeadPosition(ctx context.Context) (int64, error) {
	return poolRead(ctx, func() (int64, error) {
		var head int64
		if err := s.pool.QueryRow(ctx, s.q.headPosition.SQL).Scan(&head); err != nil {
			return 0, fmt.Errorf("eventstore: head position: %w", err)
		}
		return head, nil
	})
}
