// Package heartbeat records that a running component (a relay, an inbox handler, a projection, a staging worker)
// is alive, and when it last did its work, in the heartbeats table (migration 046), so operators see every
// process, including those that hold no lease.
//
// A Beat counts activity in memory (two atomic operations per call, no database write) and writes one row, an
// UPSERT of a single row by its primary key, at most once per interval: from Run, a loop the component runs in a
// goroutine it already owns and waits for, or from Touch, inline in the component's own goroutine for components
// without a lifecycle (inbox handlers). Stale rows (no beat for PruneAfter) are deleted by the beats themselves,
// one DELETE every pruneEvery beats.
package heartbeat

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Defaults of Config.
const (
	DefaultInterval   = 5 * time.Second
	DefaultPruneAfter = time.Hour
	// pruneEvery is how many beats of one Beat pass between its deletes of stale rows.
	pruneEvery = 60
	// writeTimeout bounds one write.
	writeTimeout = 2 * time.Second
)

// DB is what a Beat writes with: *pgxpool.Pool satisfies it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Config configures a Beat.
type Config struct {
	// Schema holds the heartbeats table. Required.
	Schema string
	// Kind and Name identify the component ("relay", "orders-relay"). Required.
	Kind, Name string
	// Instance identifies the process. Default Instance().
	Instance string
	// Interval is how often it beats. Default 5s.
	Interval time.Duration
	// PruneAfter is how long a row with no beat is kept before a beat deletes it. Default 1h.
	PruneAfter time.Duration
	// Logger receives failed writes (debug). Default: silent.
	Logger *slog.Logger
}

// Beat is one component's heartbeat. Its methods are safe for concurrent use.
type Beat struct {
	db       DB
	cfg      Config
	host     string
	pid      int
	started  time.Time
	upsert   string
	stop     string
	prune    string
	activity atomic.Int64
	lastAct  atomic.Int64 // unix nanoseconds of the latest activity, 0 for none
	lastBeat atomic.Int64 // unix nanoseconds of the latest write (Touch)
	beats    atomic.Int64
	running  chan struct{} // a one-slot semaphore: one Run writes at a time
}

// Instance returns an identity for this process: host name, process ID and a random suffix.
func Instance() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s:%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// New returns a Beat writing to db. It writes nothing until Run or Touch.
func New(db DB, cfg Config) (*Beat, error) {
	if db == nil || cfg.Schema == "" || cfg.Kind == "" || cfg.Name == "" {
		return nil, fmt.Errorf("heartbeat: a database, a schema, a kind and a name are required")
	}
	if cfg.Instance == "" {
		cfg.Instance = Instance()
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.PruneAfter <= 0 {
		cfg.PruneAfter = DefaultPruneAfter
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	host, _ := os.Hostname()
	t := pgx.Identifier{cfg.Schema, "heartbeats"}.Sanitize()
	return &Beat{db: db, cfg: cfg, host: host, pid: os.Getpid(), started: time.Now(),
		running: make(chan struct{}, 1),
		upsert:  upsert(t, "NULL"), stop: upsert(t, "now()"),
		prune: `DELETE FROM ` + t + ` WHERE heartbeat_at < now() - make_interval(secs => $1)`}, nil
}

// upsert is the statement of a beat; stopped is the stopped_at it records (NULL: running, now(): stopped).
func upsert(table, stopped string) string {
	return `INSERT INTO ` + table + ` AS h (kind, name, instance, host, pid, started_at, heartbeat_at, interval_ms,
		last_activity_at, activity, stopped_at) VALUES ($1, $2, $3, $4, $5, $6, now(), $7, $8, $9, ` + stopped + `)
		ON CONFLICT (kind, name, instance) DO UPDATE SET heartbeat_at = now(), interval_ms = EXCLUDED.interval_ms,
			last_activity_at = EXCLUDED.last_activity_at, activity = EXCLUDED.activity,
			stopped_at = EXCLUDED.stopped_at`
}

// Interval returns how often the beat writes.
func (b *Beat) Interval() time.Duration { return b.cfg.Interval }

// Add records n units of activity (messages published, handled, events applied) at now; n 0 records none. It
// writes nothing.
func (b *Beat) Add(n int64, now time.Time) {
	if b == nil || n <= 0 {
		return
	}
	b.activity.Add(n)
	b.lastAct.Store(now.UnixNano())
}

// Touch records activity like Add and writes the beat when the last write by Touch is an interval old: for
// components without a loop of their own. At most one caller writes per interval; the others return at once. The
// write uses a connection of its own, never the caller's context (which may carry a transaction's).
func (b *Beat) Touch(n int64, now time.Time) {
	if b == nil {
		return
	}
	b.Add(n, now)
	last := b.lastBeat.Load()
	if now.UnixNano()-last < int64(b.cfg.Interval) || !b.lastBeat.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	b.write(context.Background())
}

// Run beats every interval until ctx ends, then records that the component stopped. When several loops of one
// component call Run (a relay's subscriptions), one writes and the others wait to take over. Its writes carry
// none of ctx's values (a caller's transaction marks, spans): only its end.
func (b *Beat) Run(ctx context.Context) {
	select {
	case b.running <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-b.running }()
	parent := ctx
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer context.AfterFunc(parent, cancel)()
	t := time.NewTicker(b.cfg.Interval)
	defer t.Stop()
	for {
		b.write(ctx)
		select {
		case <-ctx.Done():
			b.exec(context.Background(), b.stop) // the last count, and that it stopped
			return
		case <-t.C:
		}
	}
}

// write writes the beat (and, every pruneEvery beats, deletes stale rows).
func (b *Beat) write(ctx context.Context) {
	if b.exec(ctx, b.upsert) && b.beats.Add(1)%pruneEvery == 1 {
		ctx, cancel := context.WithTimeout(ctx, writeTimeout)
		defer cancel()
		if _, err := b.db.Exec(ctx, b.prune, b.cfg.PruneAfter.Seconds()); err != nil && ctx.Err() == nil {
			b.cfg.Logger.Debug("stagehand: stale heartbeats not pruned", "error", err)
		}
	}
}

// exec runs a beat statement (upsert or stop) and reports whether it succeeded.
func (b *Beat) exec(ctx context.Context, stmt string) bool {
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	var last *time.Time
	if n := b.lastAct.Load(); n != 0 {
		t := time.Unix(0, n)
		last = &t
	}
	_, err := b.db.Exec(ctx, stmt, b.cfg.Kind, b.cfg.Name, b.cfg.Instance, b.host, b.pid, b.started,
		b.cfg.Interval.Milliseconds(), last, b.activity.Load())
	if err != nil && ctx.Err() == nil {
		b.cfg.Logger.Debug("stagehand: heartbeat not recorded", "kind", b.cfg.Kind, "name", b.cfg.Name,
			"error", err)
	}
	return err == nil
}

// Process is one row of the heartbeats table, as read by List.
type Process struct {
	Kind, Name, Instance, Host string
	PID                        int
	StartedAt, HeartbeatAt     time.Time
	Interval                   time.Duration
	// LastActivityAt is zero when it never did anything; Activity counts what it did since it started.
	LastActivityAt time.Time
	Activity       int64
	// StoppedAt is when it stopped cleanly (zero while running or when it died); Age how old the beat is (by
	// the database's clock).
	StoppedAt time.Time
	Age       time.Duration
}

// Gone reports whether the process stopped, or has not beaten for three of its intervals.
func (p Process) Gone() bool { return !p.StoppedAt.IsZero() || p.Age > 3*p.Interval }

// Querier is what List reads with: *pgxpool.Pool satisfies it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// List returns every heartbeat row of schema, by kind, name and instance.
func List(ctx context.Context, db Querier, schema string) ([]Process, error) {
	rows, err := db.Query(ctx, `SELECT kind, name, instance, host, pid, started_at, heartbeat_at, interval_ms,
		last_activity_at, activity, stopped_at, extract(epoch FROM now() - heartbeat_at)
		FROM `+pgx.Identifier{schema, "heartbeats"}.Sanitize()+` ORDER BY kind, name, instance`)
	if err != nil {
		return nil, fmt.Errorf("heartbeat: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Process, error) {
		var p Process
		var ms int64
		var last, stopped *time.Time
		var age float64
		err := r.Scan(&p.Kind, &p.Name, &p.Instance, &p.Host, &p.PID, &p.StartedAt, &p.HeartbeatAt, &ms, &last,
			&p.Activity, &stopped, &age)
		p.Interval = time.Duration(ms) * time.Millisecond
		p.Age = time.Duration(age * float64(time.Second))
		if last != nil {
			p.LastActivityAt = *last
		}
		if stopped != nil {
			p.StoppedAt = *stopped
		}
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("heartbeat: list: %w", err)
	}
	return out, nil
}
