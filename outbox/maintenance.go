package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"

	"github.com/stagehand-es/stagehand/internal/conf"
	"github.com/stagehand-es/stagehand/internal/lease"
	"github.com/stagehand-es/stagehand/internal/telemetry"
)

// Retention defaults of routine maintenance (MaintenanceConfig).
const (
	// DefaultSentRetention is how long the sent ledger keeps an entry by default: 7 days. The ledger is what
	// makes re-staging a message from the event log publish nothing twice; entries a registered watermark still
	// needs are kept whatever their age.
	DefaultSentRetention = 7 * 24 * time.Hour
	// DefaultDeadLetterRetention is how long a dead letter (outbox or inbox) is kept by default before
	// maintenance discards it: 30 days. An outbox dead letter that holds its key is never discarded by age.
	DefaultDeadLetterRetention = 30 * 24 * time.Hour
	// DefaultMaintenanceInterval is how often a maintenance pass runs by default, across every process.
	DefaultMaintenanceInterval = 5 * time.Minute
	// DefaultMaintenanceBatchSize is how many rows one retention statement deletes by default.
	DefaultMaintenanceBatchSize = 1000
	// DefaultMaintenanceLeaseTTL is the maintainer's lease lifetime by default.
	DefaultMaintenanceLeaseTTL = 30 * time.Second
	// MaintenanceLease is the name of the lease (in the schema's leases table) that makes one maintainer of an
	// outbox active at a time.
	MaintenanceLease = "maintenance:outbox"
)

// MaintenanceConfig configures routine maintenance of the outbox and inbox tables: retention of the sent ledger,
// the inbox, the inbox's failure counters and old dead letters. A nil *MaintenanceConfig uses the defaults. Every
// relay that subscribes (or drains) runs it unless Disabled, one active instance across processes through the
// MaintenanceLease; a process without a relay (an inbox-only consumer) runs Outbox.NewMaintainer's Run.
type MaintenanceConfig struct {
	// Disabled turns routine maintenance off for the relay this configures. Default false: maintenance runs.
	Disabled bool
	// Interval is how often a pass runs, counted from the start of the latest pass of any process (recorded in
	// the outbox_maintenance table). Default 5m. Rule: at least 1s.
	Interval time.Duration
	// SentRetention is how long the sent ledger keeps an entry. Entries at or above the lowest registered
	// watermark are kept whatever their age (a Deferred stager or reconciler may still re-stage them). Default
	// DefaultSentRetention (7 days); negative keeps entries forever.
	SentRetention time.Duration
	// InboxRetention is how long the inbox remembers a handled message, and how long an unfinished failure count
	// of a message that stopped arriving is kept. An entry whose inbox dead letter still exists is kept. Keep it
	// longer than anything may redeliver a message (see DefaultInboxRetention). Default DefaultInboxRetention
	// (7 days); negative keeps entries forever.
	InboxRetention time.Duration
	// DeadLetterRetention is how long dead letters are kept. An older outbox dead letter is discarded (its ID
	// stays in the sent ledger, so re-staging it publishes nothing), except one that holds its key, which only an
	// operator releases; an older inbox dead letter is deleted. The failure history (Admin.Failures) keeps its
	// entries as long. Default DefaultDeadLetterRetention (30 days); negative keeps them forever.
	DeadLetterRetention time.Duration
	// BatchSize is how many rows one DELETE removes; a pass repeats it until nothing is left. Default 1000.
	// Rule: 1 to 100000.
	BatchSize int
	// LeaseTTL is how long the maintainer's lease lasts without renewal (renewed every third of it). Default 30s.
	// Rule: at least 1s.
	LeaseTTL time.Duration
	// Logger overrides the Outbox's logger (the relay's, when the relay runs the maintainer).
	Logger *slog.Logger
	// MeterProvider creates the stagehand.maintenance.removed and stagehand.maintenance.passes counters.
	// Default: the Outbox's Config.MeterProvider (the relay's, when the relay runs it), else the global provider.
	MeterProvider metric.MeterProvider
}

// maintenanceSettings is a MaintenanceConfig with its defaults applied.
func (c *MaintenanceConfig) withDefaults() (MaintenanceConfig, error) {
	var m MaintenanceConfig
	if c != nil {
		m = *c
	}
	check := conf.Check{Package: "outbox", Component: "maintenance"}
	check.Duration("Interval", &m.Interval, DefaultMaintenanceInterval, time.Second)
	if m.SentRetention == 0 {
		m.SentRetention = DefaultSentRetention
	}
	if m.InboxRetention == 0 {
		m.InboxRetention = DefaultInboxRetention
	}
	if m.DeadLetterRetention == 0 {
		m.DeadLetterRetention = DefaultDeadLetterRetention
	}
	check.Int("BatchSize", &m.BatchSize, DefaultMaintenanceBatchSize, 1, 100000)
	check.Duration("LeaseTTL", &m.LeaseTTL, DefaultMaintenanceLeaseTTL, time.Second)
	if err := check.Err(); err != nil {
		return MaintenanceConfig{}, err
	}
	return m, nil
}

// MaintenanceReport counts what one maintenance pass removed.
type MaintenanceReport struct {
	// SentRemoved counts sent-ledger entries deleted.
	SentRemoved int64
	// InboxRemoved counts inbox entries (handled or dead-lettered messages) deleted.
	InboxRemoved int64
	// InboxAttemptsRemoved counts failure counters of messages that stopped arriving, deleted.
	InboxAttemptsRemoved int64
	// DeadLettersExpired counts outbox dead letters discarded for their age.
	DeadLettersExpired int64
	// InboxDeadLettersExpired counts inbox dead letters deleted for their age.
	InboxDeadLettersExpired int64
	// FailuresRemoved counts entries of the failure history (Admin.Failures) older than the dead-letter retention,
	// deleted. The maintenance table does not record it: only a pass's own report has it.
	FailuresRemoved int64
}

// MaintenanceStatus is the latest maintenance pass of an outbox, as recorded in its outbox_maintenance table.
type MaintenanceStatus struct {
	// Owner names the process (its lease owner) that ran the pass.
	Owner string
	// Interval is the interval that process was configured with.
	Interval time.Duration
	// StartedAt is when the pass started; FinishedAt when it ended (zero while it runs, or if its process died).
	StartedAt, FinishedAt time.Time
	// LastError is the pass's error, empty when it succeeded.
	LastError string
	// Removed is what the pass removed.
	Removed MaintenanceReport
	// Passes counts every pass recorded so far.
	Passes int64
}

// Overdue reports whether maintenance looks stopped at now: no pass started within three intervals.
func (s MaintenanceStatus) Overdue(now time.Time) bool {
	return now.Sub(s.StartedAt) > 3*s.Interval
}

// Maintainer applies the retention of a MaintenanceConfig to an outbox's tables: Run keeps doing it under the
// MaintenanceLease, RunOnce does one pass now. Create it with Outbox.NewMaintainer.
type Maintainer struct {
	o      *Outbox
	c      MaintenanceConfig
	owner  string
	leases *lease.Manager
	st     maintenanceSQL

	removed metric.Int64Counter
	passes  metric.Int64Counter

	mu     sync.Mutex // serialises passes of this maintainer
	logger *slog.Logger
}

// NewMaintainer returns a Maintainer of the outbox (nil cfg: the defaults). cfg.Disabled is ignored: a Maintainer
// made by hand is meant to run. Invalid settings return a *ConfigError naming the field.
func (o *Outbox) NewMaintainer(cfg *MaintenanceConfig) (*Maintainer, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if c.Logger == nil {
		c.Logger = o.logger
	}
	if c.MeterProvider == nil {
		c.MeterProvider = o.mp
	}
	host, _ := os.Hostname()
	if strings.TrimSpace(host) == "" {
		host = "stagehand"
	}
	m := &Maintainer{o: o, c: c, owner: newLeaseOwner(host + "/maintenance"), st: o.q.maintenance,
		logger: c.Logger}
	m.leases, err = lease.New(o.pool, &lease.Config{Schema: o.schema, Owner: m.owner, TTL: c.LeaseTTL,
		AcquireInterval: min(c.Interval, c.LeaseTTL), Logger: c.Logger})
	if err != nil {
		return nil, &ConfigError{Package: "outbox", Component: "maintenance", Field: "LeaseTTL", Reason: err.Error()}
	}
	meter := telemetry.Meter(c.MeterProvider)
	m.removed = telemetry.Int64Counter(meter, telemetry.MetricMaintenanceRemoved,
		"rows routine maintenance removed, by table", "{row}")
	m.passes = telemetry.Int64Counter(meter, telemetry.MetricMaintenancePasses,
		"routine maintenance passes, by outcome", "{pass}")
	return m, nil
}

// Run applies retention until ctx ends: it contends for the MaintenanceLease and, while it holds it, runs a pass
// whenever the latest pass of any process started Interval ago or more. A failed pass is logged and recorded
// (MaintenanceStatus.LastError), and tried again after the next interval. Run returns nil when ctx ends.
func (m *Maintainer) Run(ctx context.Context) error {
	return m.leases.Run(ctx, MaintenanceLease, func(ctx context.Context, _ lease.Lease) error {
		for {
			_, wait, err := m.runIfDue(ctx)
			if err != nil && ctx.Err() == nil {
				m.logger.WarnContext(ctx, "stagehand: outbox maintenance pass failed; retrying after the interval",
					"error", err)
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
	})
}

// RunIfDue runs one pass when the latest pass of any process started Interval ago or more (or none ever ran),
// holding the MaintenanceLease for its duration; it does nothing when another process holds the lease. It is
// what a serverless relay's Drain calls after draining.
func (m *Maintainer) RunIfDue(ctx context.Context) (ran bool, err error) {
	l, ok, err := m.leases.TryAcquire(ctx, MaintenanceLease)
	if err != nil || !ok {
		if err != nil {
			err = fmt.Errorf("outbox: maintenance lease: %w", err)
		}
		return false, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = m.leases.Release(rctx, l)
	}()
	ran, _, err = m.runIfDue(ctx)
	return ran, err
}

// runIfDue runs a pass when one is due and returns whether it ran one and how long to wait before the next one
// may be due.
func (m *Maintainer) runIfDue(ctx context.Context) (ran bool, wait time.Duration, err error) {
	var started time.Time
	err = m.o.pool.QueryRow(ctx, m.st.lastStart).Scan(&started)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return false, m.c.Interval, fmt.Errorf("outbox: maintenance status: %w", err)
	default:
		if next := started.Add(m.c.Interval); next.After(m.o.now()) {
			return false, next.Sub(m.o.now()), nil
		}
	}
	_, err = m.RunOnce(ctx)
	return true, m.c.Interval, err
}

// RunOnce runs one maintenance pass now, whatever the interval and without the lease (passes are idempotent:
// two at once only repeat work), records it in the outbox_maintenance table and returns what it removed. Every
// step runs even when an earlier one fails; the error joins their errors. A pass cut short by the end of ctx
// returns ctx's error but is not recorded as failed (MaintenanceStatus.LastError holds only the steps' own errors):
// the next pass repeats what it left.
func (m *Maintainer) RunOnce(ctx context.Context) (MaintenanceReport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.o.now()
	if _, err := m.o.pool.Exec(ctx, m.st.begin, m.owner, m.c.Interval.Seconds(), now); err != nil {
		return MaintenanceReport{}, fmt.Errorf("outbox: maintenance: record start: %w", err)
	}
	var rep MaintenanceReport
	var errs []error
	step := func(table string, retention time.Duration, query string, extra []any, n *int64) {
		if retention < 0 {
			return
		}
		args := append([]any{now.Add(-retention), m.c.BatchSize}, extra...)
		for ctx.Err() == nil {
			tag, err := m.o.pool.Exec(ctx, query, args...)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", table, err))
				return
			}
			*n += tag.RowsAffected()
			if tag.RowsAffected() < int64(m.c.BatchSize) {
				break
			}
		}
		if *n > 0 {
			m.removed.Add(ctx, *n, metric.WithAttributes(telemetry.AttrTable.String(table)))
		}
	}
	// Dead letters first: a discarded outbox dead letter leaves a ledger entry, and an expired inbox dead letter
	// lets its inbox entry go in the same pass.
	step("outbox_dead_letters", m.c.DeadLetterRetention, m.st.expireDead, []any{now}, &rep.DeadLettersExpired)
	step("inbox_dead_letters", m.c.DeadLetterRetention, m.st.expireInboxDead, nil, &rep.InboxDeadLettersExpired)
	step("outbox_sent", m.c.SentRetention, m.st.sent, nil, &rep.SentRemoved)
	step("inbox", m.c.InboxRetention, m.st.inbox, nil, &rep.InboxRemoved)
	step("inbox_attempts", m.c.InboxRetention, m.st.inboxAttempts, nil, &rep.InboxAttemptsRemoved)
	step("message_failures", m.c.DeadLetterRetention, m.st.failures, nil, &rep.FailuresRemoved)
	// A pass cut short because its context ended (its process is stopping) has not failed: the next pass repeats
	// what it left, so only the steps' own errors are recorded, and the outcome is "interrupted".
	interrupted := ctx.Err() != nil
	var recorded []error
	for _, e := range errs {
		if !interrupted || !(errors.Is(e, context.Canceled) || errors.Is(e, context.DeadlineExceeded)) {
			recorded = append(recorded, e)
		}
	}
	msg := ""
	outcome := "ok"
	switch {
	case len(recorded) > 0:
		msg, outcome = errors.Join(recorded...).Error(), "error"
	case interrupted:
		outcome = "interrupted"
	}
	if interrupted {
		errs = append(errs, ctx.Err())
	}
	err := errors.Join(errs...)
	m.passes.Add(ctx, 1, metric.WithAttributes(telemetry.AttrOutcome.String(outcome)))
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, ferr := m.o.pool.Exec(rctx, m.st.finish, m.o.now(), msg, rep.SentRemoved, rep.InboxRemoved,
		rep.InboxAttemptsRemoved, rep.DeadLettersExpired, rep.InboxDeadLettersExpired); ferr != nil {
		err = errors.Join(err, fmt.Errorf("record the pass: %w", ferr))
	}
	if err != nil {
		return rep, fmt.Errorf("outbox: maintenance: %w", err)
	}
	m.logger.DebugContext(ctx, "stagehand: outbox maintenance pass", "sent_removed", rep.SentRemoved,
		"inbox_removed", rep.InboxRemoved, "inbox_attempts_removed", rep.InboxAttemptsRemoved,
		"dead_letters_expired", rep.DeadLettersExpired, "inbox_dead_letters_expired", rep.InboxDeadLettersExpired)
	return rep, nil
}

// Maintenance returns the latest maintenance pass recorded for the outbox; ok is false when none ever ran. The
// record is estate-wide: maintenance serves every tenant.
func (a *Admin) Maintenance(ctx context.Context) (st MaintenanceStatus, ok bool, err error) {
	if err := a.valid(); err != nil {
		return MaintenanceStatus{}, false, err
	}
	var secs float64
	var finished *time.Time
	r := &st.Removed
	err = a.o.pool.QueryRow(ctx, a.o.q.maintenance.status).Scan(&st.Owner, &secs, &st.StartedAt, &finished,
		&st.LastError, &r.SentRemoved, &r.InboxRemoved, &r.InboxAttemptsRemoved, &r.DeadLettersExpired,
		&r.InboxDeadLettersExpired, &st.Passes)
	if errors.Is(err, pgx.ErrNoRows) {
		return MaintenanceStatus{}, false, nil
	}
	if err != nil {
		return MaintenanceStatus{}, false, fmt.Errorf("outbox: maintenance status: %w", err)
	}
	st.Interval = time.Duration(secs * float64(time.Second))
	st.StartedAt = st.StartedAt.UTC()
	if finished != nil {
		st.FinishedAt = finished.UTC()
	}
	return st, true, nil
}

// relayMaintenance runs a relay's maintainer while at least one of its subscriptions is live.
type relayMaintenance struct {
	m *Maintainer

	mu     sync.Mutex
	users  int
	cancel context.CancelFunc
	done   chan struct{}
}

// retain counts a subscription starting; the first one starts the maintainer.
func (rm *relayMaintenance) retain() {
	if rm == nil {
		return
	}
	rm.mu.Lock()
	defer rm.mu.Unlock()
	rm.users++
	if rm.users > 1 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	rm.cancel, rm.done = cancel, done
	go func() {
		defer close(done)
		if err := rm.m.Run(ctx); err != nil {
			rm.m.logger.Error("stagehand: outbox maintenance stopped", "error", err)
		}
	}()
}

// release counts a subscription ending; the last one stops the maintainer and waits for it.
func (rm *relayMaintenance) release() {
	if rm == nil {
		return
	}
	rm.mu.Lock()
	rm.users--
	if rm.users > 0 {
		rm.mu.Unlock()
		return
	}
	cancel, done := rm.cancel, rm.done
	rm.cancel, rm.done = nil, nil
	rm.mu.Unlock()
	cancel()
	<-done
}

// afterDrain runs a pass when one is due, after a Drain.
func (rm *relayMaintenance) afterDrain(ctx context.Context, logger *slog.Logger) {
	if rm == nil {
		return
	}
	if _, err := rm.m.RunIfDue(ctx); err != nil && ctx.Err() == nil {
		logger.WarnContext(ctx, "stagehand: outbox maintenance after drain failed", "error", err)
	}
}
