package eventstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/pgnotify"
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
	// When it passes, ReadLog returns the events before the gap and the caller retries later. Default 2s.
	MaxGapWait time.Duration
	// Clock stamps OccurredAt when an event carries none. Default time.Now.
	Clock func() time.Time
	// Logger receives diagnostics. Default: silent.
	Logger *slog.Logger
}

func (c *PostgresConfig) withDefaults() (PostgresConfig, error) {
	var cfg PostgresConfig
	if c != nil {
		cfg = *c
	} else {
		cfg.Schema = stagehand.DefaultSchema
	}
	if strings.TrimSpace(cfg.Schema) == "" {
		return cfg, &ConfigError{Field: "Schema", Reason: "must not be empty"}
	}
	if cfg.MaxGapWait < 0 {
		return cfg, &ConfigError{Field: "MaxGapWait", Reason: "must not be negative"}
	}
	if cfg.MaxGapWait == 0 {
		cfg.MaxGapWait = 2 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

// PostgresStore is the PostgreSQL event store. It implements TransactionalStore.
//
// The global log is gap-safe by lock-aware gap detection: positions come from a sequence drawn by the INSERT (CACHE
// 1). When a reader meets a missing position it waits only for the transactions that held a RowExclusiveLock on the
// events table when the gap was seen (any transaction that drew the missing position is among them), then
// re-reads; a position still missing then belongs to an aborted transaction and is skipped. Readers stall only on
// event writers, never on unrelated long transactions, and never forever under continuous writes.
type PostgresStore struct {
	pool     *pgxpool.Pool
	cfg      PostgresConfig
	t        tables
	notifier *pgnotify.Notifier
	channel  string

	oid atomic.Uint32 // OID of the events table, looked up on first use
}

type tables struct {
	events, streams, snapshots string
}

// NewPostgres returns a store on pool. It does not create tables: run stagehand.Migrate first. The pool is not
// closed by the store.
func NewPostgres(pool *pgxpool.Pool, cfg *PostgresConfig) (*PostgresStore, error) {
	if pool == nil {
		return nil, &ConfigError{Field: "pool", Reason: "must not be nil"}
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &PostgresStore{
		pool: pool,
		cfg:  c,
		t: tables{
			events:    pgx.Identifier{c.Schema, "events"}.Sanitize(),
			streams:   pgx.Identifier{c.Schema, "streams"}.Sanitize(),
			snapshots: pgx.Identifier{c.Schema, "snapshots"}.Sanitize(),
		},
		channel: pgnotify.Channel(c.Schema, "events"),
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

// querier is satisfied by *pgxpool.Pool and pgx.Tx.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Append implements Store. Without a staging callback it is one statement in its own transaction.
func (s *PostgresStore) Append(ctx context.Context, req AppendRequest) (AppendResult, error) {
	res, err := s.append(ctx, s.pool, req)
	if err != nil {
		return res, err
	}
	s.Notify()
	return res, nil
}

// AppendTx implements TransactionalStore.
func (s *PostgresStore) AppendTx(ctx context.Context, tx pgx.Tx, req AppendRequest) (AppendResult, error) {
	if tx == nil {
		return AppendResult{}, fmt.Errorf("%w: nil transaction", ErrInvalidAppend)
	}
	return s.append(ctx, tx, req)
}

// AppendWith implements TransactionalStore.
func (s *PostgresStore) AppendWith(ctx context.Context, req AppendRequest, stage StageFunc) (AppendResult, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return AppendResult{}, fmt.Errorf("eventstore: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	res, err := s.append(ctx, tx, req)
	if err != nil {
		return AppendResult{}, err
	}
	if stage != nil {
		if err := stage(ctx, tx, res); err != nil {
			return AppendResult{}, fmt.Errorf("eventstore: staging in the append transaction of stream %q: %w",
				req.StreamID, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return AppendResult{}, fmt.Errorf("eventstore: commit append to stream %q: %w", req.StreamID, err)
	}
	s.Notify()
	return res, nil
}

func (s *PostgresStore) append(ctx context.Context, q querier, req AppendRequest) (AppendResult, error) {
	req, err := prepare(req, s.cfg.Clock())
	if err != nil {
		return AppendResult{}, err
	}
	n := len(req.Events)
	ids := make([]string, n)
	types := make([]string, n)
	versions := make([]int32, n)
	payloads := make([]string, n)
	metas := make([]string, n)
	occurred := make([]time.Time, n)
	for i, e := range req.Events {
		ids[i] = e.EventID.String()
		types[i] = e.Type
		versions[i] = int32(e.TypeVersion)
		payloads[i] = string(e.Payload)
		m, err := encodeMetadata(e.Metadata)
		if err != nil {
			return AppendResult{}, err
		}
		metas[i] = m
		occurred[i] = e.OccurredAt
	}
	sql := s.appendSQL(req.Expected)
	args := []any{req.Tenant, req.StreamID, req.StreamType, int64(n), ids, types, versions, payloads, metas, occurred}
	if req.Expected > 0 {
		args = append(args, int64(req.Expected))
	}
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return AppendResult{}, s.translate(err, req)
	}
	records := make([]Record, 0, n)
	i := 0
	for rows.Next() {
		var r Record
		if err := rows.Scan(&r.Position, &r.Version, &r.RecordedAt); err != nil {
			rows.Close()
			return AppendResult{}, fmt.Errorf("eventstore: scan append result: %w", err)
		}
		if i >= n {
			rows.Close()
			return AppendResult{}, fmt.Errorf("eventstore: append to stream %q returned more rows than events",
				req.StreamID)
		}
		e := req.Events[i]
		r.Tenant, r.StreamID, r.StreamType = req.Tenant, req.StreamID, req.StreamType
		r.EventID, r.Type, r.TypeVersion = e.EventID, e.Type, e.TypeVersion
		r.Payload, r.Metadata, r.OccurredAt = e.Payload, e.Metadata, e.OccurredAt
		r.RecordedAt = r.RecordedAt.UTC()
		records = append(records, r)
		i++
	}
	if err := rows.Err(); err != nil {
		return AppendResult{}, s.translate(err, req)
	}
	if len(records) == 0 {
		return AppendResult{}, s.conflict(ctx, q, req)
	}
	return AppendResult{Records: records, Version: records[len(records)-1].Version}, nil
}

// appendSQL returns the single statement that checks the expected version on the streams row and inserts the
// events. When the check fails the stream CTE yields no row, nothing is inserted and no error is raised, so the
// caller's transaction stays usable.
func (s *PostgresStore) appendSQL(expected ExpectedVersion) string {
	var stream string
	switch {
	case expected == NoStream:
		stream = `INSERT INTO ` + s.t.streams + ` (tenant_id, stream_id, stream_type, version)
			VALUES ($1, $2, $3, $4) ON CONFLICT (tenant_id, stream_id) DO NOTHING
			RETURNING 0::bigint AS base`
	case expected == AnyVersion:
		stream = `INSERT INTO ` + s.t.streams + ` AS st (tenant_id, stream_id, stream_type, version)
			VALUES ($1, $2, $3, $4) ON CONFLICT (tenant_id, stream_id)
			DO UPDATE SET version = st.version + EXCLUDED.version, updated_at = now()
			RETURNING st.version - $4 AS base`
	case expected == StreamExists:
		stream = `UPDATE ` + s.t.streams + ` SET version = version + $4, updated_at = now()
			WHERE tenant_id = $1 AND stream_id = $2
			RETURNING version - $4 AS base`
	default:
		stream = `UPDATE ` + s.t.streams + ` SET version = version + $4, updated_at = now()
			WHERE tenant_id = $1 AND stream_id = $2 AND version = $11
			RETURNING version - $4 AS base`
	}
	return `WITH s AS (` + stream + `),
	e AS (
		INSERT INTO ` + s.t.events + ` (tenant_id, stream_id, stream_type, version, event_id, event_type,
			event_version, payload, metadata, occurred_at)
		SELECT $1, $2, $3, s.base + d.ord, d.event_id, d.event_type, d.event_version, d.payload, d.metadata,
			d.occurred_at
		FROM s, unnest($5::uuid[], $6::text[], $7::int[], $8::jsonb[], $9::jsonb[], $10::timestamptz[])
			WITH ORDINALITY AS d(event_id, event_type, event_version, payload, metadata, occurred_at, ord)
		ORDER BY d.ord
		RETURNING position, version, recorded_at
	)
	SELECT position, version, recorded_at FROM e ORDER BY position`
}

func (s *PostgresStore) conflict(ctx context.Context, q querier, req AppendRequest) error {
	var actual int64
	err := q.QueryRow(ctx, `SELECT version FROM `+s.t.streams+` WHERE tenant_id = $1 AND stream_id = $2`,
		req.Tenant, req.StreamID).Scan(&actual)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("eventstore: read version of stream %q after a conflict: %w (%w)", req.StreamID, err,
			ErrConcurrencyConflict)
	}
	return &ConflictError{Tenant: req.Tenant, StreamID: req.StreamID, Expected: req.Expected, Actual: actual}
}

// translate turns driver errors into the store's typed errors; no raw SQLSTATE reaches the user for an expected
// condition.
func (s *PostgresStore) translate(err error, req AppendRequest) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		switch pgErr.ConstraintName {
		case "events_event_id_key":
			return fmt.Errorf("%w: an event of the append to stream %q is already stored", ErrDuplicateEventID,
				req.StreamID)
		default:
			return &ConflictError{Tenant: req.Tenant, StreamID: req.StreamID, Expected: req.Expected, Actual: -1}
		}
	}
	return fmt.Errorf("eventstore: append to stream %q: %w", req.StreamID, err)
}

func encodeMetadata(m Metadata) (string, error) {
	if len(m) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("eventstore: encode metadata: %w", err)
	}
	return string(b), nil
}

const recordColumns = `position, tenant_id, stream_id, stream_type, version, event_id, event_type, event_version,
	payload, metadata, occurred_at, recorded_at`

func scanRecord(row pgx.Row, r *Record) error {
	var meta []byte
	if err := row.Scan(&r.Position, &r.Tenant, &r.StreamID, &r.StreamType, &r.Version, &r.EventID, &r.Type,
		&r.TypeVersion, &r.Payload, &meta, &r.OccurredAt, &r.RecordedAt); err != nil {
		return err
	}
	r.OccurredAt, r.RecordedAt = r.OccurredAt.UTC(), r.RecordedAt.UTC()
	if len(meta) > 2 {
		if err := json.Unmarshal(meta, &r.Metadata); err != nil {
			return fmt.Errorf("decode metadata of event at position %d: %w", r.Position, err)
		}
	}
	return nil
}

// ReadStream implements Store.
func (s *PostgresStore) ReadStream(ctx context.Context, tenant, streamID string, fromVersion int64) ([]Record, error) {
	tenant = tenantOrDefault(tenant)
	rows, err := s.pool.Query(ctx, `SELECT `+recordColumns+` FROM `+s.t.events+`
		WHERE tenant_id = $1 AND stream_id = $2 AND version >= $3 ORDER BY version`, tenant, streamID, fromVersion)
	if err != nil {
		return nil, fmt.Errorf("eventstore: read stream %q: %w", streamID, err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var r Record
		if err := scanRecord(rows, &r); err != nil {
			return nil, fmt.Errorf("eventstore: read stream %q: %w", streamID, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("eventstore: read stream %q: %w", streamID, err)
	}
	if len(out) == 0 {
		if _, err := s.Stream(ctx, tenant, streamID); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Stream implements Store.
func (s *PostgresStore) Stream(ctx context.Context, tenant, streamID string) (StreamInfo, error) {
	tenant = tenantOrDefault(tenant)
	info := StreamInfo{Tenant: tenant, StreamID: streamID}
	err := s.pool.QueryRow(ctx, `SELECT stream_type, version, created_at, updated_at FROM `+s.t.streams+`
		WHERE tenant_id = $1 AND stream_id = $2`, tenant, streamID).
		Scan(&info.StreamType, &info.Version, &info.CreatedAt, &info.UpdatedAt)
	info.CreatedAt, info.UpdatedAt = info.CreatedAt.UTC(), info.UpdatedAt.UTC()
	if errors.Is(err, pgx.ErrNoRows) {
		return info, fmt.Errorf("%w: %q (tenant %q)", ErrStreamNotFound, streamID, tenant)
	}
	if err != nil {
		return info, fmt.Errorf("eventstore: stream %q: %w", streamID, err)
	}
	return info, nil
}

// HeadPosition implements Store.
func (s *PostgresStore) HeadPosition(ctx context.Context) (int64, error) {
	var head int64
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(position), 0) FROM `+s.t.events).Scan(&head); err != nil {
		return 0, fmt.Errorf("eventstore: head position: %w", err)
	}
	return head, nil
}

// SaveSnapshot implements Store.
func (s *PostgresStore) SaveSnapshot(ctx context.Context, snap Snapshot) error {
	snap.Tenant = tenantOrDefault(snap.Tenant)
	_, err := s.pool.Exec(ctx, `INSERT INTO `+s.t.snapshots+` AS sn
		(tenant_id, stream_id, stream_type, version, schema_version, payload)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (tenant_id, stream_id) DO UPDATE SET stream_type = EXCLUDED.stream_type,
			version = EXCLUDED.version, schema_version = EXCLUDED.schema_version, payload = EXCLUDED.payload,
			created_at = now()
		WHERE sn.version <= EXCLUDED.version`,
		snap.Tenant, snap.StreamID, snap.StreamType, snap.Version, snap.SchemaVersion, snap.Payload)
	if err != nil {
		return fmt.Errorf("eventstore: save snapshot of stream %q: %w", snap.StreamID, err)
	}
	return nil
}

// LoadSnapshot implements Store.
func (s *PostgresStore) LoadSnapshot(ctx context.Context, tenant, streamID string) (Snapshot, error) {
	snap := Snapshot{Tenant: tenantOrDefault(tenant), StreamID: streamID}
	err := s.pool.QueryRow(ctx, `SELECT stream_type, version, schema_version, payload, created_at
		FROM `+s.t.snapshots+` WHERE tenant_id = $1 AND stream_id = $2`, snap.Tenant, streamID).
		Scan(&snap.StreamType, &snap.Version, &snap.SchemaVersion, &snap.Payload, &snap.CreatedAt)
	snap.CreatedAt = snap.CreatedAt.UTC()
	if errors.Is(err, pgx.ErrNoRows) {
		return snap, ErrSnapshotNotFound
	}
	if err != nil {
		return snap, fmt.Errorf("eventstore: load snapshot of stream %q: %w", streamID, err)
	}
	return snap, nil
}
