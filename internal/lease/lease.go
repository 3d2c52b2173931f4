package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/conf"
	"github.com/stagehand-es/stagehand/internal/names"
	"github.com/stagehand-es/stagehand/internal/sqlfile"
)

// DB is what the lease queries need; *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// DefaultTTL is the lease lifetime when none is configured: a crashed holder is replaced about DefaultTTL plus
// one AcquireInterval after its last renewal, for 3/DefaultTTL renewals a second per lease. Chosen from
// lease_bench_test.go: a renewal costs about 3 round trips of SELECT 1 (120µs), its worst latency on a saturated
// 2-core machine was 0.2s, so with 5s a renewal may take up to 3.3s (two thirds of the TTL, 17 times that worst
// case) before a live holder loses its lease, while a crash stalls work for 5-6s instead of 15-16s.
const DefaultTTL = 5 * time.Second

// Config configures a Manager. A nil *Config uses the defaults.
type Config struct {
	// Schema holding the leases table (created by stagehand.Migrate). Default "stagehand".
	Schema string
	// Owner identifies this holder in the leases table. Default: host name, process ID and a random suffix, so
	// two Managers in one process are two owners.
	Owner string
	// TTL is how long a lease lasts without renewal, measured on the database clock. Default 5s (DefaultTTL).
	// Minimum 100ms.
	TTL time.Duration
	// RenewInterval is how often the holder renews. Default TTL/3. Must be less than TTL.
	RenewInterval time.Duration
	// AcquireInterval is how often a contender retries a lease held by someone else. Default 1s.
	AcquireInterval time.Duration
	// Logger receives diagnostics. Default: silent.
	Logger *slog.Logger
}

// ConfigError is stagehand.ConfigError, the configuration error every stagehand package returns (Package ""
// here). It matches ErrInvalidConfig.
type ConfigError = stagehand.ConfigError

// Errors of the lease package. Compare with errors.Is. No message of the package names it: they reach users
// through the public packages (the relay, projections, staging workers).
var (
	// ErrInvalidConfig: a Manager was configured with an invalid value.
	ErrInvalidConfig = stagehand.ErrInvalidConfig
	// ErrLost: the lease is no longer held by this holder (it expired and was taken, or was released).
	ErrLost = errors.New("lease lost")
	// ErrFenced: a fenced write was attempted with a token that no longer holds the lease.
	ErrFenced = errors.New("fenced out by a newer lease holder")
)

// FencedError reports a write refused because the lease moved on. It matches ErrFenced and ErrLost.
type FencedError struct {
	Name string
	// Token is the writer's token; Current the lease's token now (0 when the lease row is gone).
	Token, Current int64
	// Owner is the writer; CurrentOwner the lease's owner now.
	Owner, CurrentOwner string
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("write fenced out: lease %q is held by %q with token %d, writer %q has token %d",
		e.Name, e.CurrentOwner, e.Current, e.Owner, e.Token)
}

// Is matches ErrFenced and ErrLost.
func (e *FencedError) Is(target error) bool { return target == ErrFenced || target == ErrLost }

// DefaultAcquireInterval is how often a contender retries a held lease when none is configured.
const DefaultAcquireInterval = time.Second

func (c *Config) withDefaults() (Config, error) {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	var check conf.Check
	check.Text("Schema", &cfg.Schema, stagehand.DefaultSchema, names.Identifier)
	check.Text("Owner", &cfg.Owner, DefaultOwner(), nil)
	check.Duration("TTL", &cfg.TTL, DefaultTTL, 100*time.Millisecond)
	check.Duration("RenewInterval", &cfg.RenewInterval, cfg.TTL/3, 0)
	if cfg.RenewInterval >= cfg.TTL {
		check.Fail("RenewInterval", "must be less than TTL")
	}
	check.NonNegativeDuration("AcquireInterval", &cfg.AcquireInterval, DefaultAcquireInterval)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, check.Err()
}

// DefaultOwner returns "host/pid/random": unique per call, readable in the leases table.
func DefaultOwner() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// Lease is a held lease: the proof a holder passes to Renew, Release and CheckTx.
type Lease struct {
	Name  string
	Owner string
	// Token is the fencing token: it increases by one every time the lease changes hands.
	Token int64
	// ExpiresAt is the expiry on the database clock as of the last acquisition or renewal.
	ExpiresAt time.Time
}

// Manager acquires, renews and releases leases in one schema for one owner. It holds no goroutines of its own;
// Run starts (and always stops) a renewer per lease it holds.
type Manager struct {
	db  DB
	cfg Config
	q   statements
}

// New returns a Manager on db (usually a *pgxpool.Pool). It does not create tables: run stagehand.Migrate first.
func New(db DB, cfg *Config) (*Manager, error) {
	if db == nil {
		return nil, &ConfigError{Field: "db", Reason: "must not be nil"}
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	q, err := statementsFor(c.Schema)
	if err != nil {
		return nil, err
	}
	return &Manager{db: db, cfg: c, q: q}, nil
}

// Owner returns the owner name this Manager acquires leases as.
func (m *Manager) Owner() string { return m.cfg.Owner }

// Config returns the Manager's configuration with defaults applied.
func (m *Manager) Config() Config { return m.cfg }

// TryAcquire takes the lease name if it is free, expired or released, incrementing its fencing token. ok is
// false when someone else holds it. Expiry is judged on the database clock.
func (m *Manager) TryAcquire(ctx context.Context, name string) (l Lease, ok bool, err error) {
	if strings.TrimSpace(name) == "" {
		return Lease{}, false, &ConfigError{Field: "name", Reason: "must not be blank"}
	}
	l = Lease{Name: name, Owner: m.cfg.Owner}
	err = m.db.QueryRow(ctx, m.q.acquire.SQL, m.q.acquire.Args(&row{Name: name, Owner: m.cfg.Owner,
		TTLMicros: m.cfg.TTL.Microseconds()})...).Scan(&l.Token, &l.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Lease{}, false, nil
	}
	if err != nil {
		return Lease{}, false, fmt.Errorf("acquire lease %q: %w", name, err)
	}
	l.ExpiresAt = l.ExpiresAt.UTC()
	return l, true, nil
}

// Renew extends a held lease by TTL from now (database clock). It returns an error matching ErrLost when the
// lease changed hands or was released; an expired lease that nobody took is renewed.
func (m *Manager) Renew(ctx context.Context, l Lease) (Lease, error) {
	err := m.db.QueryRow(ctx, m.q.renew.SQL, m.q.renew.Args(&row{Name: l.Name, Owner: l.Owner, Token: l.Token,
		TTLMicros: m.cfg.TTL.Microseconds()})...).Scan(&l.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, fmt.Errorf("%w: %q (token %d) is no longer held by %q", ErrLost, l.Name, l.Token, l.Owner)
	}
	if err != nil {
		return l, fmt.Errorf("renew lease %q: %w", l.Name, err)
	}
	l.ExpiresAt = l.ExpiresAt.UTC()
	return l, nil
}

// Release gives a held lease up at once, so a contender can take it without waiting for expiry. Releasing a
// lease that was already lost is not an error. The token stays: the next holder gets token + 1.
func (m *Manager) Release(ctx context.Context, l Lease) error {
	_, err := m.db.Exec(ctx, m.q.release.SQL, m.q.release.Args(&row{Name: l.Name, Owner: l.Owner, Token: l.Token})...)
	if err != nil {
		return fmt.Errorf("release lease %q: %w", l.Name, err)
	}
	return nil
}

// CheckTx is the fenced-write check. Call it inside the transaction whose commit must only happen while l is
// still held, as late as possible (just before the fenced writes and the commit): it locks the lease row FOR
// SHARE until the transaction ends, so no takeover can commit in between, and returns a *FencedError (matching
// ErrFenced and ErrLost) when the lease's token or owner is no longer l's. Expiry alone does not fence: a holder
// whose lease expired but was not taken over may still commit, since nobody else can have done its work.
//
// A takeover waits for the transaction to end, so keep fenced transactions short relative to the TTL.
func CheckTx(ctx context.Context, tx DB, schema string, l Lease) error {
	check, err := statement(schema, "check")
	if err != nil {
		return err
	}
	return checkTx(ctx, tx, check, l)
}

func checkTx(ctx context.Context, tx DB, check sqlfile.Named[row], l Lease) error {
	var token int64
	var owner string
	err := tx.QueryRow(ctx, check.SQL, check.Args(&row{Name: l.Name})...).Scan(&token, &owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return &FencedError{Name: l.Name, Token: l.Token, Owner: l.Owner}
	}
	if err != nil {
		return fmt.Errorf("fence check of lease %q: %w", l.Name, err)
	}
	if token != l.Token || owner != l.Owner {
		return &FencedError{Name: l.Name, Token: l.Token, Current: token, Owner: l.Owner, CurrentOwner: owner}
	}
	return nil
}

// Fenceable says why the current session could not fence writes with the leases of schema: the leases table is
// missing (the migrations were not run), the role cannot lock its rows (FOR SHARE needs SELECT and UPDATE), or the
// session is read-only (a hot standby, or default_transaction_read_only), where no lease can be taken. "" when it
// can.
func Fenceable(ctx context.Context, db DB, schema string) (string, error) {
	fenceable, err := statement(schema, "fenceable")
	if err != nil {
		return "", err
	}
	table := leasesTable(schema)
	var exists, canLock, readOnly bool
	err = db.QueryRow(ctx, fenceable.SQL, fenceable.Args(&row{Table: table})...).Scan(&exists, &canLock, &readOnly)
	switch {
	case err != nil:
		return "", err
	case !exists:
		return fmt.Sprintf("the leases table %s does not exist", table), nil
	case !canLock:
		return fmt.Sprintf("the current role lacks SELECT and UPDATE on %s, needed to lock the fence", table), nil
	case readOnly:
		return "the database session is read-only (a hot standby, or default_transaction_read_only)", nil
	}
	return "", nil
}

// CheckTx is the package-level CheckTx in the Manager's schema.
func (m *Manager) CheckTx(ctx context.Context, tx DB, l Lease) error {
	return checkTx(ctx, tx, m.q.check, l)
}

// Info describes a lease row, for status listings.
type Info struct {
	Name       string
	Owner      string
	Token      int64
	ExpiresAt  time.Time
	AcquiredAt time.Time
	RenewedAt  time.Time
	// Held is true when the lease had not expired at the time of the query (database clock).
	Held bool
}

// List returns the leases whose names start with prefix ("" for all), by name.
func List(ctx context.Context, db DB, schema, prefix string) ([]Info, error) {
	list, err := statement(schema, "list")
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, list.SQL, list.Args(&row{Prefix: prefix})...)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Info, error) {
		var i Info
		err := r.Scan(&i.Name, &i.Owner, &i.Token, &i.ExpiresAt, &i.AcquiredAt, &i.RenewedAt, &i.Held)
		i.ExpiresAt, i.AcquiredAt, i.RenewedAt = i.ExpiresAt.UTC(), i.AcquiredAt.UTC(), i.RenewedAt.UTC()
		return i, err
	})
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	return out, nil
}
