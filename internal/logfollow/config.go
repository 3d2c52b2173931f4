package logfollow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/backoff"
	"github.com/stagehand-es/stagehand/internal/conf"
	"github.com/stagehand-es/stagehand/internal/lease"
	"github.com/stagehand-es/stagehand/internal/names"
)

// Handler handles a batch of records in position order, writing through tx. The follower advances its
// checkpoint in tx after Handler returns nil and commits; an error rolls everything back and the batch is
// retried (see Config.MaxAttempts).
type Handler func(ctx context.Context, tx pgx.Tx, records []eventstore.Record) error

// Config configures a Follower. Name is required; every other field has a default.
type Config struct {
	// Name identifies the follower: its checkpoint row and (prefixed with LeasePrefix) its lease. Required.
	Name string
	// Kind says what follows the log ("projection", "stager", "reconciler", "subscriber"); status listings
	// filter on it. Default "follower".
	Kind string
	// ResetGroup names the followers reset together by RequestReset (the partitions of one projection). Default
	// Name.
	ResetGroup string
	// Schema holding the checkpoints and leases tables (created by stagehand.Migrate). Default "stagehand".
	Schema string

	// EventTypes, StreamTypes and Tenants filter the log (eventstore.LogQuery); empty means all. A blank tenant is
	// NoTenant.
	EventTypes, StreamTypes, Tenants []string
	// Deletions asks the log for the markers of stream deletions (eventstore.LogQuery.Deletions), which the handler
	// then receives as records of type eventstore.StreamDeletedType.
	Deletions bool
	// Select, when set, keeps only the records it returns true for (partitioning by stream hash). Positions of
	// records it drops are still passed. Default: keep all.
	Select func(eventstore.Record) bool

	// BatchSize is the most log positions read per page (and so the largest batch). Default 1000; 1 to 10000.
	BatchSize int
	// PagesPerTx is how many pages one transaction may apply while catching up (pages come back full): one
	// commit then serves them all. Live tailing commits every page. A further page is taken only when it has been
	// read ahead already (see Follower.commit). Default 10; 1 to 100.
	PagesPerTx int
	// PollInterval is how often the log is polled when no wake-up arrives. Default 1s; at least 1ms.
	PollInterval time.Duration
	// DisableListen turns off LISTEN/NOTIFY wake-ups even when the store offers them (polling only).
	DisableListen bool
	// ReconnectDelay is the pause before the listen connection is re-established after it drops. Default 1s.
	ReconnectDelay time.Duration

	// Owner names this process in the leases table. Default lease.DefaultOwner().
	Owner string
	// LeaseTTL is how long the follower's lease lasts without renewal: how long a dead process blocks its
	// successor. Default 5s; at least 100ms.
	LeaseTTL time.Duration
	// LeaseRenewInterval is how often the lease is renewed. Default LeaseTTL/3; less than LeaseTTL.
	LeaseRenewInterval time.Duration
	// LeaseAcquireInterval is how often a standby instance tries to take the lease. Default 1s.
	LeaseAcquireInterval time.Duration

	// MaxAttempts is how many times one record is handled before it is given up on (OnExhausted, or the
	// follower stops). Default 5; at least 1. A batch that fails is retried one record per transaction until
	// the failing record is found, so only that record's attempts are counted. Errors of the database
	// connection itself (a restart, a dropped connection) are retried without counting.
	MaxAttempts int
	// RetryDelay is the wait before the second attempt; it doubles with every attempt. Default 100ms.
	RetryDelay time.Duration
	// MaxRetryDelay caps the delay between attempts. Default 30s; at least RetryDelay.
	MaxRetryDelay time.Duration
	// OnExhausted, when set, is called in a transaction that moves the checkpoint past failure.Record once that
	// record has failed MaxAttempts times (or returned an error wrapped by Permanent): record it there (for
	// example, park it). When nil, Run stops and returns the *HandlerError. A record is never skipped silently.
	OnExhausted func(ctx context.Context, tx pgx.Tx, failure *HandlerError) error
	// OnReset is called in the transaction that resets the checkpoint to the start (RequestReset), after the
	// lease and the checkpoint rows of the reset group are locked: clear the follower's own tables there.
	OnReset func(ctx context.Context, tx pgx.Tx) error

	// Share, when set, makes the follower partition Partition of a component whose partitions are spread over the
	// processes that run it (lease.Share): it contends for its lease only while this process leads fewer than its
	// fair share, and hands the lease over (ending its run, releasing the lease) when this process leads more.
	// Default nil: the follower always contends.
	Share     *lease.Share
	Partition int

	// AfterCommit, when set, is called after each commit that handled at least one record (the Deferred stager
	// wakes the outbox's relays there: a wake-up sent inside the transaction would arrive before the rows are
	// visible). It must not block.
	AfterCommit func()

	// Clock is used for time lag. Default time.Now.
	Clock func() time.Time
	// Logger receives diagnostics. Default: silent.
	Logger *slog.Logger
}

// LeasePrefix prefixes a follower's Name to form its lease name. It is stored data (rows of the leases table):
// changing it would let processes of two releases follow one log side by side during an upgrade.
const LeasePrefix = "logfollow:"

// Errors of the logfollow package. Compare with errors.Is. Their messages, like every error message of the
// package, name no internal package: they reach users through the public packages (projection, staging), and a
// follower's own errors are prefixed with its Kind and Name ("projection orders: ...").
var (
	// ErrInvalidConfig: a Follower was configured with an invalid value.
	ErrInvalidConfig = stagehand.ErrInvalidConfig
	// ErrHandler matches the *HandlerError Run returns when a record exhausted its attempts.
	ErrHandler = errors.New("handler failed")
	// ErrAlreadyRunning: Run was called on a Follower that is running.
	ErrAlreadyRunning = errors.New("already running")
)

// ConfigError is stagehand.ConfigError, the configuration error every stagehand package returns (Package ""
// here). It matches ErrInvalidConfig.
type ConfigError = stagehand.ConfigError

// HandlerError is returned by Run when a record failed MaxAttempts times and no OnExhausted is set. It matches
// ErrHandler and unwraps to the handler's last error.
type HandlerError struct {
	Kind     string // the follower's Config.Kind
	Name     string
	Record   eventstore.Record
	Attempts int
	Err      error
}

func (e *HandlerError) Error() string {
	return fmt.Sprintf("%s stopped: event %q at position %d (stream %q version %d, tenant %q) failed "+
		"%d times: %v", Label(e.Kind, e.Name), e.Record.Type, e.Record.Position, e.Record.StreamID, e.Record.Version,
		e.Record.Tenant, e.Attempts, e.Err)
}

// Is matches ErrHandler.
func (e *HandlerError) Is(target error) bool { return target == ErrHandler }

// Unwrap returns the handler's error.
func (e *HandlerError) Unwrap() error { return e.Err }

// Defaults of Config, which projections and staging workers pass on to their users.
const (
	DefaultKind           = "follower"
	DefaultBatchSize      = 1000
	DefaultPagesPerTx     = 10
	DefaultPollInterval   = time.Second
	DefaultReconnectDelay = time.Second
	DefaultMaxAttempts    = 5
	DefaultRetryDelay     = 100 * time.Millisecond
	DefaultMaxRetryDelay  = 30 * time.Second
)

func (c *Config) withDefaults() (Config, error) {
	if c == nil {
		return Config{}, &ConfigError{Field: "Name", Reason: "is required"}
	}
	cfg := *c
	if strings.TrimSpace(cfg.Name) == "" {
		return cfg, &ConfigError{Field: "Name", Reason: "is required"}
	}
	var check conf.Check
	check.Text("Name", &cfg.Name, "", names.Text)
	for _, t := range cfg.Tenants {
		if err := stagehand.ValidateTenant(t); err != nil {
			check.FailErr("Tenants", err)
		}
	}
	cfg.Tenants = NormalizeTenants(cfg.Tenants)
	check.Text("Kind", &cfg.Kind, DefaultKind, nil)
	check.Text("ResetGroup", &cfg.ResetGroup, cfg.Name, nil)
	check.Text("Schema", &cfg.Schema, stagehand.DefaultSchema, names.Identifier)
	check.Int("BatchSize", &cfg.BatchSize, DefaultBatchSize, 1, 10000)
	check.Int("PagesPerTx", &cfg.PagesPerTx, DefaultPagesPerTx, 1, 100)
	check.Duration("PollInterval", &cfg.PollInterval, DefaultPollInterval, time.Millisecond)
	check.NonNegativeDuration("ReconnectDelay", &cfg.ReconnectDelay, DefaultReconnectDelay)
	check.Int("MaxAttempts", &cfg.MaxAttempts, DefaultMaxAttempts, 1, 0)
	check.NonNegativeDuration("RetryDelay", &cfg.RetryDelay, DefaultRetryDelay)
	check.NonNegativeDuration("MaxRetryDelay", &cfg.MaxRetryDelay, max(DefaultMaxRetryDelay, cfg.RetryDelay))
	check.AtLeast("MaxRetryDelay", cfg.MaxRetryDelay, "RetryDelay", cfg.RetryDelay)
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, check.Err()
}

// NormalizeTenants returns a tenant filter with each blank tenant ("" or whitespace) read as stagehand.NoTenant, as
// every tenant input is; a filter with none is returned as it is, and the caller's slice is never changed.
func NormalizeTenants(tenants []string) []string {
	for i, t := range tenants {
		if n := stagehand.NormalizeTenant(t); n != t {
			out := slices.Clone(tenants)
			out[i] = n
			for j := i + 1; j < len(out); j++ {
				out[j] = stagehand.NormalizeTenant(out[j])
			}
			return out
		}
	}
	return tenants
}

// filterText renders the log filter for operators.
func (c *Config) filterText() string {
	var parts []string
	add := func(k string, v []string) {
		if len(v) > 0 {
			parts = append(parts, k+":"+strings.Join(v, ","))
		}
	}
	add("events", c.EventTypes)
	add("streams", c.StreamTypes)
	add("tenants", c.Tenants)
	if c.Select != nil {
		parts = append(parts, "select")
	}
	if len(parts) == 0 {
		return "*"
	}
	return strings.Join(parts, ";")
}

// notifier is implemented by stores that send a wake-up after each append commits (eventstore.PostgresStore).
type notifier interface {
	NotifyChannel() string
	Pool() *pgxpool.Pool
}

// Label is how errors and logs name a follower: its Kind and Name ("projection orders"), or the Name alone when
// it already starts with the kind ("reconciler:default").
func Label(kind, name string) string {
	if kind == "" || strings.HasPrefix(name, kind+":") {
		return name
	}
	return kind + " " + name
}

// errorf formats an error of the follower, prefixed with its Label.
func (f *Follower) errorf(format string, args ...any) error {
	return fmt.Errorf("%s: "+format, append([]any{Label(f.cfg.Kind, f.cfg.Name)}, args...)...)
}

// retryDelay is the wait after failed attempt number attempts (1 = after the first): RetryDelay doubled per earlier
// failure, capped by MaxRetryDelay, saturating rather than overflowing whatever the settings.
func (c *Config) retryDelay(attempts int) time.Duration {
	return backoff.Exponential(c.RetryDelay, c.MaxRetryDelay, attempts-1)
}

// CheckSchema checks the schema argument of an exported function of package pkg that reads or writes followers'
// tables (status, parked lists, rebuild and replay requests) by the rule every constructor applies to a Schema: a
// schema refused there is refused here with the same *ConfigError (Field "schema"), not a PostgreSQL error about a
// cut name.
func CheckSchema(pkg, schema string) error {
	if reason := names.Schema(schema); reason != "" {
		return &ConfigError{Package: pkg, Field: "schema", Reason: reason}
	}
	return nil
}

// CheckName checks a follower name argument (field names it) of an exported function of package pkg: it must be
// storable text, as a configured name is; "" is accepted (it means every follower where the function allows it).
func CheckName(pkg, field, name string) error {
	if reason := names.Text(name); reason != "" {
		return &ConfigError{Package: pkg, Field: field, Reason: reason}
	}
	return nil
}
