package health

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/conf"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/staging"
)

// Defaults of Config; the inactivity and failure-rate thresholds are those of the Excalibur outbox documentation
// ("Monitoring", AddOutboxHealthCheck).
const (
	DefaultDegradedInactivity   = 2 * time.Minute
	DefaultUnhealthyInactivity  = 5 * time.Minute
	DefaultDegradedFailureRate  = 5.0
	DefaultUnhealthyFailureRate = 20.0
	DefaultFailureWindow        = 5 * time.Minute
	DefaultMinDeliveries        = 20
	DefaultTimeout              = 5 * time.Second
	// DefaultDeadLetters is Config.DeadLetters's default.
	DefaultDeadLetters = 1
	// DefaultInboxDeadLetters is Config.InboxDeadLetters's default.
	DefaultInboxDeadLetters = 1
	// DefaultInboxFailing is Config.InboxFailing's default.
	DefaultInboxFailing = 1
	// DefaultUnhealthyInboxFailing is Config.UnhealthyInboxFailing's default.
	DefaultUnhealthyInboxFailing = 100
)

// Worker is a log follower whose lag the checker watches: *staging.Worker (a Deferred stager or a reconciler)
// satisfies it.
type Worker interface {
	Name() string
	Lag(ctx context.Context) (staging.Lag, error)
}

// Config configures a Checker. A nil *Config is valid but watches nothing; a zero field means the default stated
// on it.
type Config struct {
	// Outbox is the outbox scope watched: pending messages, dead letters, and publishing progress read from the
	// sent ledger (so relays in any process count). Usually ob.AllTenants(). Default: no outbox component.
	Outbox *outbox.Admin
	// Inbox is the inbox scope watched, usually ob.AllTenants(): every handler's dead letters and the messages it
	// keeps failing on, read from the database (so consumers in any process count). Default: no inbox component.
	Inbox *outbox.Admin
	// Projections returns the status of the projections watched: a projection's Status method, or a closure over
	// projection.ListStatus for every projection of a schema. Default: no projection component.
	Projections func(ctx context.Context) ([]projection.Status, error)
	// Workers are the staging workers (Deferred stagers, reconcilers) watched. Default: none.
	Workers []Worker
	// WorkerStatus returns the status of the staging workers watched, read from the database: a closure over
	// staging.ListWorkerStatus sees every worker of a schema, whichever process runs it, without building one. A
	// failed worker is Unhealthy; one retrying an event, or holding parked events (DeadLetters), is Degraded.
	// Default: none.
	WorkerStatus func(ctx context.Context) ([]staging.WorkerStatus, error)

	// DegradedInactivity and UnhealthyInactivity: a component that has work (ready messages, lag) but has made
	// no progress for this long is Degraded, then Unhealthy. Defaults 2m and 5m (the Excalibur outbox documentation).
	// Rule: positive, and UnhealthyInactivity not below DegradedInactivity.
	DegradedInactivity  time.Duration
	UnhealthyInactivity time.Duration
	// DegradedFailureRate and UnhealthyFailureRate are the percentages of failed relay deliveries (rejected or broker
	// unreachable) within FailureWindow that make the relay Degraded, then Unhealthy. They need the relay's hooks from
	// Checker.RelayHooks. Defaults 5 and 20 (the Excalibur outbox documentation). Rule: above 0, at most 100, Unhealthy
	// not below Degraded.
	DegradedFailureRate  float64
	UnhealthyFailureRate float64
	// FailureWindow is how far back the failure rate looks. Default 5m. Rule: at least 1s.
	FailureWindow time.Duration
	// MinDeliveries is how many deliveries the window must hold before its failure rate is judged, so one early
	// rejection is not a 100% failure rate. Default 20. Rule: not negative (use 1 to judge every rate).
	MinDeliveries int
	// DeadLetters is how many outbox dead letters (or parked events of one projection) make a component
	// Degraded: they wait for an operator to redrive, discard or replay them. Default 1. Negative: never.
	DeadLetters int64
	// InboxDeadLetters is how many dead letters of one inbox handler make the inbox Degraded. Default 1.
	// Negative: never.
	InboxDeadLetters int64
	// InboxFailing is how many messages one inbox handler is failing on (retrying, not yet dead-lettered) that make
	// the inbox Degraded, and UnhealthyInboxFailing how many make it Unhealthy. A handler whose oldest failing
	// message first failed DegradedInactivity (UnhealthyInactivity) ago, by the database's records, is Degraded
	// (Unhealthy) too: it is stuck on it. Defaults 1 and 100. Negative: never. Rule: UnhealthyInboxFailing not
	// below InboxFailing when both are positive.
	InboxFailing          int64
	UnhealthyInboxFailing int64
	// Timeout bounds one Check. Default 5s. Rule: not negative.
	Timeout time.Duration
	// Clock is the time the checker measures inactivity and failure windows with. Default time.Now.
	Clock func() time.Time
	// Logger receives status changes. Default: silent.
	Logger *slog.Logger
}

// ErrInvalidConfig is matched (errors.Is) by every configuration error.
var ErrInvalidConfig = stagehand.ErrInvalidConfig

// ConfigError is stagehand.ConfigError, the configuration error every stagehand package returns (Package "health"
// here). It matches ErrInvalidConfig.
type ConfigError = stagehand.ConfigError

// withDefaults returns a validated copy of c with every default applied.
func (c *Config) withDefaults() (Config, error) {
	var s Config
	if c != nil {
		s = *c
	}
	check := conf.Check{Package: "health"}
	for i, w := range s.Workers {
		if w == nil {
			check.Fail("Workers", fmt.Sprintf("Workers[%d] must not be nil", i))
		}
	}
	check.Duration("DegradedInactivity", &s.DegradedInactivity, DefaultDegradedInactivity, 0)
	check.Duration("UnhealthyInactivity", &s.UnhealthyInactivity,
		max(DefaultUnhealthyInactivity, s.DegradedInactivity), 0)
	check.AtLeast("UnhealthyInactivity", s.UnhealthyInactivity, "DegradedInactivity", s.DegradedInactivity)
	percent(&check, "DegradedFailureRate", &s.DegradedFailureRate, DefaultDegradedFailureRate)
	percent(&check, "UnhealthyFailureRate", &s.UnhealthyFailureRate,
		max(DefaultUnhealthyFailureRate, s.DegradedFailureRate))
	if s.UnhealthyFailureRate < s.DegradedFailureRate {
		check.Fail("UnhealthyFailureRate", "must not be below DegradedFailureRate")
	}
	check.Duration("FailureWindow", &s.FailureWindow, DefaultFailureWindow, time.Second)
	check.NonNegativeInt("MinDeliveries", &s.MinDeliveries, DefaultMinDeliveries)
	for _, f := range []struct {
		v   *int64
		def int64
	}{{&s.DeadLetters, DefaultDeadLetters}, {&s.InboxDeadLetters, DefaultInboxDeadLetters},
		{&s.InboxFailing, DefaultInboxFailing},
		{&s.UnhealthyInboxFailing, max(DefaultUnhealthyInboxFailing, s.InboxFailing)}} {
		if *f.v == 0 {
			*f.v = f.def // negative: never
		}
	}
	if s.InboxFailing > 0 && s.UnhealthyInboxFailing > 0 && s.UnhealthyInboxFailing < s.InboxFailing {
		check.Fail("UnhealthyInboxFailing", "must not be below InboxFailing")
	}
	check.NonNegativeDuration("Timeout", &s.Timeout, DefaultTimeout)
	if s.Clock == nil {
		s.Clock = time.Now
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	if err := check.Err(); err != nil {
		return Config{}, err
	}
	return s, nil
}

// percent gives a zero *v the default def and checks that it is a percentage above 0 and at most 100.
func percent(check *conf.Check, field string, v *float64, def float64) {
	if *v == 0 {
		*v = def
	}
	if math.IsNaN(*v) || *v <= 0 || *v > 100 {
		check.Fail(field, "must be a percentage above 0 and at most 100")
	}
}
