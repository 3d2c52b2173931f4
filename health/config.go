package health

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/staging"
)

// Defaults from the Excalibur outbox documentation ("Monitoring", AddOutboxHealthCheck).
const (
	DefaultDegradedInactivity   = 2 * time.Minute
	DefaultUnhealthyInactivity  = 5 * time.Minute
	DefaultDegradedFailureRate  = 5.0
	DefaultUnhealthyFailureRate = 20.0
	DefaultFailureWindow        = 5 * time.Minute
	DefaultMinDeliveries        = 20
	DefaultTimeout              = 5 * time.Second
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
	bad := func(field, format string, args ...any) (Config, error) {
		return Config{}, &ConfigError{Package: "health", Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	for i, w := range s.Workers {
		if w == nil {
			return bad("Workers", "Workers[%d] is nil.", i)
		}
	}
	if s.DegradedInactivity == 0 {
		s.DegradedInactivity = DefaultDegradedInactivity
	}
	if s.UnhealthyInactivity == 0 {
		s.UnhealthyInactivity = max(DefaultUnhealthyInactivity, s.DegradedInactivity)
	}
	switch {
	case s.DegradedInactivity < 0:
		return bad("DegradedInactivity", "DegradedInactivity must be positive.")
	case s.UnhealthyInactivity < 0:
		return bad("UnhealthyInactivity", "UnhealthyInactivity must be positive.")
	case s.UnhealthyInactivity < s.DegradedInactivity:
		return bad("UnhealthyInactivity", "UnhealthyInactivity (%s) cannot be less than DegradedInactivity (%s).",
			s.UnhealthyInactivity, s.DegradedInactivity)
	}
	if s.DegradedFailureRate == 0 {
		s.DegradedFailureRate = DefaultDegradedFailureRate
	}
	if s.UnhealthyFailureRate == 0 {
		s.UnhealthyFailureRate = max(DefaultUnhealthyFailureRate, s.DegradedFailureRate)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"DegradedFailureRate", s.DegradedFailureRate}, {"UnhealthyFailureRate", s.UnhealthyFailureRate}} {
		if math.IsNaN(f.v) || f.v <= 0 || f.v > 100 {
			return bad(f.name, "%s must be a percentage above 0 and at most 100, not %v.", f.name, f.v)
		}
	}
	if s.UnhealthyFailureRate < s.DegradedFailureRate {
		return bad("UnhealthyFailureRate", "UnhealthyFailureRate (%v%%) cannot be less than DegradedFailureRate (%v%%).",
			s.UnhealthyFailureRate, s.DegradedFailureRate)
	}
	switch {
	case s.FailureWindow == 0:
		s.FailureWindow = DefaultFailureWindow
	case s.FailureWindow < time.Second:
		return bad("FailureWindow", "FailureWindow must be at least 1s.")
	}
	switch {
	case s.MinDeliveries == 0:
		s.MinDeliveries = DefaultMinDeliveries
	case s.MinDeliveries < 0:
		return bad("MinDeliveries", "MinDeliveries cannot be negative.")
	}
	if s.DeadLetters == 0 {
		s.DeadLetters = 1
	}
	if s.InboxDeadLetters == 0 {
		s.InboxDeadLetters = 1
	}
	if s.InboxFailing == 0 {
		s.InboxFailing = 1
	}
	if s.UnhealthyInboxFailing == 0 {
		s.UnhealthyInboxFailing = max(DefaultUnhealthyInboxFailing, s.InboxFailing)
	}
	if s.InboxFailing > 0 && s.UnhealthyInboxFailing > 0 && s.UnhealthyInboxFailing < s.InboxFailing {
		return bad("UnhealthyInboxFailing", "UnhealthyInboxFailing (%d) cannot be less than InboxFailing (%d).",
			s.UnhealthyInboxFailing, s.InboxFailing)
	}
	switch {
	case s.Timeout == 0:
		s.Timeout = DefaultTimeout
	case s.Timeout < 0:
		return bad("Timeout", "Timeout cannot be negative.")
	}
	if s.Clock == nil {
		s.Clock = time.Now
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	return s, nil
}
