package projection

import (
	"errors"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/internal/conf"
	"github.com/stagehand-es/stagehand/internal/names"
)

// FailureMode says what a projection does with an event whose handler failed MaxAttempts times. It is
// stagehand.FailureMode, the one failure mode of projections and staging workers.
type FailureMode = stagehand.FailureMode

const (
	// Stop stops the projection (Run returns a *HandlerError; status "failed") with the checkpoint just before
	// the event. Nothing after it is applied until the cause is fixed and the projection restarted. The default.
	Stop = stagehand.StopOnFailure
	// Park records the event in the parked table (ListParked) in the transaction that moves the checkpoint past
	// it, and goes on with the next events. Parked events can be replayed (ReplayParked) or discarded.
	Park = stagehand.ParkOnFailure
)

// Config configures a Projection. Name is required; every other field has a default.
type Config struct {
	// Name identifies the projection: its checkpoint, its lease and its parked events. Required; it must not
	// contain '#'. Renaming a projection starts it from scratch.
	Name string
	// Schema holding stagehand's tables (created by stagehand.Migrate). Default "stagehand".
	Schema string

	// EventTypes, StreamTypes and Tenants filter the log: the handler sees only matching events. Empty means
	// all. A blank tenant in Tenants ("" or whitespace) is stagehand.NoTenant: the events written without one.
	// Filter to what the projection reads: with a Registry, every event it sees must decode.
	EventTypes, StreamTypes, Tenants []string
	// Registry decodes each event into its current Go type (Event.Data), upcasting older versions. An event that
	// cannot be decoded fails at once (it is not retried) and is parked or stops the projection. Default: the
	// Mux's registry when the handler is a *Mux, else none (Event.Data is nil).
	Registry *aggregate.Registry

	// Partitions runs the projection as N workers, each with its own checkpoint and lease, that split the
	// streams by a hash of (tenant, stream ID): the events of one stream are applied in order by one worker,
	// and streams in different partitions progress independently. Default 1 (no partitioning). Changing it
	// requires a Rebuild. At most 256.
	//
	// The partitions are spread over the processes running the projection: each process leads at most
	// ceil(N / processes) of them (it holds a membership lease, "<Name>#members/<slot>", while Run runs), a
	// process that joins gets partitions handed over by the others within a few LeaseAcquireIntervals, and the
	// partitions of a process that stops are taken over at once (released) or after about LeaseTTL (died). Every
	// partition reads the whole log and keeps its own streams' events, so each adds a read of the log to the
	// database's work: partition for the handlers' cost, not for the read's.
	Partitions int
	// BatchSize is the most log positions read per page, and so the most events applied per transaction.
	// Default 1000; 1 to 10000.
	BatchSize int
	// PagesPerTx is how many pages (of BatchSize positions) one transaction may apply while catching up, so one
	// commit serves them all; live tailing commits every page. The transaction takes a further page only when it
	// has been read ahead already: it never waits, holding its connection, for a read that needs another. Default
	// 10; 1 to 100.
	PagesPerTx int
	// PollInterval is how often the log is polled when no notification arrives. Default 1s; at least 1ms.
	PollInterval time.Duration
	// DisableListen turns off LISTEN/NOTIFY wake-ups (polling only). Required when the store's pool goes through a
	// pooler in transaction pooling mode, where Run otherwise fails with stagehand.ErrPooledConnection. Default
	// false.
	DisableListen bool

	// OnFailure is what happens after MaxAttempts failures of one event: Stop (default) or Park.
	OnFailure FailureMode
	// MaxAttempts is how many times an event is handled before OnFailure applies. Default 5; at least 1.
	MaxAttempts int
	// RetryDelay is the wait before the second attempt; it doubles per attempt. Default 100ms.
	RetryDelay time.Duration
	// MaxRetryDelay caps the delay between attempts. Default 30s; at least RetryDelay.
	MaxRetryDelay time.Duration

	// Owner names this process in the leases table. Default: host name, process ID and a random suffix.
	Owner string
	// LeaseTTL bounds how long a dead process keeps the projection (or one partition) from running elsewhere.
	// Default 5s (see the lease defaults in the outbox README: a takeover after about 5-6s for about 0.6
	// renewals a second); at least 100ms.
	LeaseTTL time.Duration
	// LeaseRenewInterval is how often the lease is renewed. Default LeaseTTL/3; less than LeaseTTL.
	LeaseRenewInterval time.Duration
	// LeaseAcquireInterval is how often a standby process tries to take over. Default 1s.
	LeaseAcquireInterval time.Duration

	// Clock is used for time lag. Default time.Now.
	Clock func() time.Time
	// Logger receives diagnostics. Default: silent.
	Logger *slog.Logger

	// TracerProvider creates the stagehand.projection.batch span of every batch the handler applies. Default nil:
	// the global provider (otel.GetTracerProvider), which records nothing until the application installs an SDK.
	TracerProvider trace.TracerProvider
	// MeterProvider observes the stagehand.projection.lag and stagehand.projection.lag_time gauges of every
	// checkpoint of the projection, from New until Close. Default nil: the global provider.
	MeterProvider metric.MeterProvider
}

// Errors of the projection package. Compare with errors.Is.
var (
	// ErrInvalidConfig: a projection or subscriber was configured with an invalid value.
	ErrInvalidConfig = stagehand.ErrInvalidConfig
	// ErrParkedNotFound: no parked event has the given ID.
	ErrParkedNotFound = errors.New("projection: parked event not found")
	// ErrUnknownProjection: no checkpoint of the named projection exists in the schema (it never ran there, or
	// the name is misspelled).
	ErrUnknownProjection = errors.New("projection: unknown projection")
)

// ConfigError is stagehand.ConfigError, the configuration error every stagehand package returns (Package "projection"
// here). It matches ErrInvalidConfig.
type ConfigError = stagehand.ConfigError

func (c *Config) withDefaults() (Config, error) {
	if c == nil {
		return Config{}, &ConfigError{Package: "projection", Field: "Name", Reason: "is required"}
	}
	cfg := *c
	if strings.TrimSpace(cfg.Name) == "" {
		return cfg, &ConfigError{Package: "projection", Field: "Name", Reason: "is required"}
	}
	check := conf.Check{Package: "projection"}
	check.Text("Name", &cfg.Name, "", func(name string) string {
		if strings.Contains(name, "#") {
			return "must not contain '#' (it separates partition names)"
		}
		if reason := names.Identifier(name); reason != "" {
			return reason
		}
		return names.Text(name)
	})
	if cfg.Schema == "" {
		cfg.Schema = stagehand.DefaultSchema
	}
	check.Int("Partitions", &cfg.Partitions, 1, 1, 256)
	if cfg.OnFailure != Stop && cfg.OnFailure != Park {
		check.Fail("OnFailure", "must be Stop or Park")
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	// The remaining fields are validated (and defaulted) by the log follower; its errors are translated.
	return cfg, check.Err()
}
