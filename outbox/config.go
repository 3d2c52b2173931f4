package outbox

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand/internal/backoff"
	"github.com/stagehand-es/stagehand/internal/conf"
)

// RelayConfig holds a relay's processing settings. A nil *RelayConfig means Balanced(); a zero field means the
// default stated on it. The settings and their validation rules follow the Excalibur outbox documentation; profiles
// HighThroughput, Balanced and HighReliability return its suggested starting points.
type RelayConfig struct {
	// BatchSize is how many rows one claim takes. Default 100. Rule: 1 to 10000.
	BatchSize int
	// PollingInterval is how often the relay looks for due rows when no wake-up notification arrives (notifications
	// are hints; polling is the safety net, and delivers retries and scheduled rows that fall due). Default 1s.
	// Rule: at least 10ms.
	PollingInterval time.Duration
	// ClaimInterval is the least time from the start of one claim to the start of the next when a wake-up starts the
	// next (a notification, a delivery ending, a row falling due, a poll), so that the rows staged in between are
	// claimed together. A claim that fills its batch is followed at once, a Drain is never paced, and the first
	// claim after a quiet spell is not delayed: only a steady trickle waits, up to this long. A claim costs the
	// database about as much as its first few rows, so at a few hundred messages a second, where a claim at every
	// wake-up (the writers' notifications come up to every 5ms) carries two or three rows, pacing trades latency
	// for database time: 10ms about halved the relay's claims and marks and cut the whole path's CPU per message by
	// 5-10%, for a median about 3ms later (the outbox README, "Claim pacing"). Default 0: a claim at every wake-up.
	// Rule: not negative, not above PollingInterval.
	ClaimInterval time.Duration
	// MaxRetryCount is how many times a rejected message is retried after its first attempt before it is
	// dead-lettered (3 means up to 4 attempts). nil means 5; use Retries(0) to dead-letter on the first
	// rejection. Rule: not negative.
	MaxRetryCount *int
	// RetryDelay is the backoff after the first rejection; it doubles with every further rejection (plus up to
	// Jitter at random), capped by MaxRetryDelay. Default 5m. Rule: positive.
	RetryDelay time.Duration
	// MaxRetryDelay caps the backoff, so a 15-minute RetryDelay does not grow to days. Default 1h, or RetryDelay
	// when that is longer. Rule: not below RetryDelay.
	MaxRetryDelay time.Duration
	// Jitter is the largest fraction of the backoff added at random, so retries of many messages spread out.
	// Default 0.2. Rule: 0 to 1 (0 means the default; use a tiny value such as 1e-9 for none).
	Jitter float64
	// MaxDegreeOfParallelism is how many deliveries may be in flight at once (waiting for their ack). Messages of
	// one partition key are never in flight together, whatever the setting. Default 4. Rule: at least 1.
	MaxDegreeOfParallelism int
	// ProcessorID names this relay in leases (a random suffix is added, so replicas sharing a configuration never
	// share a lease). Default: the host name. Rule: not blank.
	ProcessorID string
	// ClaimDuration is how long a claimed row stays reserved for this relay (a claim: "lease" names leadership
	// alone, LeaderElection). The relay renews the claims it still holds every third of it, so a claim only lapses
	// when the relay dies or stalls; another relay then takes the row over (a possible duplicate, never a loss). Default 10s (the rows of a crashed relay without leader
	// election wait that long; a fenced relay takes them over at once). Rule: at least 100ms.
	ClaimDuration time.Duration
	// AckDeadline is how long a delivered message may stay unacknowledged before it counts as a rejected attempt
	// and is retried after its backoff. Default 1m. Rule: positive.
	AckDeadline time.Duration
	// ReleaseKeyOnDeadLetter lets the later messages of a dead-lettered message's key flow on. Default false: the
	// dead letter holds its key (a sequenced dead-letter queue) until it is redriven or discarded.
	ReleaseKeyOnDeadLetter bool
	// IsBrokerUnavailable tells a broker that cannot be reached from one that rejects the message. Unreachable
	// counts no attempt and backs the whole relay off instead. Default BrokerUnavailable.
	IsBrokerUnavailable func(error) bool
	// BrokerBackoff is the relay's first pause after an unreachable broker; it doubles up to MaxBrokerBackoff while
	// the broker stays unreachable and resets after a delivery succeeds. Defaults 1s and 30s.
	// Rule: positive, and MaxBrokerBackoff not below BrokerBackoff.
	BrokerBackoff    time.Duration
	MaxBrokerBackoff time.Duration
	// DisableNotify makes the relay poll only, without listening for wake-up notifications. Required when the
	// outbox's pool goes through a pooler in transaction pooling mode, where the relay otherwise refuses to start
	// (stagehand.ErrPooledConnection). Default false.
	DisableNotify bool
	// VacuumInterval is how often the relay considers vacuuming the outbox table while it is moving rows out of
	// it, so dead index entries cannot pile up at the head of the claim index even when autovacuum's global nap is
	// long (minutes). Needs the table's owner or a superuser; without the privilege the relay logs once and leaves
	// it to autovacuum. Default 10s. Negative disables it.
	VacuumInterval time.Duration
	// VacuumAfterRows is how many rows the relay must have moved out of the table since its last vacuum for the
	// next interval to vacuum (fewer are left to autovacuum, which the outbox's migration tunes for a queue). A
	// vacuum makes every connection plan its statements on the table anew, and a few thousand dead rows cost a
	// claim little, so vacuuming more often than that buys nothing. Default 10000. Must not be negative.
	VacuumAfterRows int
	// Maintenance configures the routine maintenance the relay runs while it is subscribed (and after each Drain
	// when due): retention of the sent ledger, the inbox and old dead letters, one active maintainer across
	// processes through a lease. nil means the defaults (maintenance on); Maintenance.Disabled opts out.
	Maintenance *MaintenanceConfig
	// Logger overrides the Outbox's logger for this relay.
	Logger *slog.Logger
	// Hooks observe the relay, for metrics and traces. Default: none.
	Hooks Hooks

	// LeaderElection names a lease (in the leases table stagehand.Migrate creates, shared with projections and
	// stagers) that makes the relay single-active: only the holder claims, and every claim and every mark (sent,
	// backoff, dead-letter move, release) carries the lease's fencing token, checked in the same statement, so a
	// demoted leader's late writes are rejected (ErrFenced) and its rows are left to the new leader, which takes
	// them over at once. With Partitions > 1 each partition has its own lease, named LeaderElection + "/" + the
	// partition number, so several processes can share the partitions. Subscribe and Drain refuse to start
	// (ErrCannotFence) when the database cannot fence. Default "": no election; relays share the outbox through
	// row leases alone.
	LeaderElection string
	// LeaderTTL is how long the leader's lease lasts without renewal (renewed every third of it, contended every
	// third of it up to 1s). A leader that dies is replaced after about LeaderTTL (plus at most 1s). Default 5s.
	// Rule: at least 100ms, and only with LeaderElection.
	LeaderTTL time.Duration
	// SingleWriter declares that the operator guarantees exactly one relay drains this outbox: it runs unfenced,
	// and says so in one warning at construction. Rule: not with LeaderElection.
	SingleWriter bool

	// Partitions splits the claim into this many independent loops, each with its own claims, backoff after an
	// unreachable broker, error isolation and MaxDegreeOfParallelism workers. A message belongs to the partition
	// of the hash of its partition key (of its ID when it has none) or of its tenant (PartitionBy). Default 1.
	// Rule: 1 to 256. Every relay of one outbox must use the same Partitions and PartitionBy.
	Partitions int
	// PartitionBy chooses what a message's partition is hashed from. Default PartitionByKey.
	PartitionBy PartitionBy

	// TracerProvider creates the relay's spans (stagehand.relay.claim, stagehand.relay.publish). Default: the
	// Outbox's (Config.TracerProvider), else the global provider (otel.GetTracerProvider), which records nothing
	// until the application installs an SDK.
	TracerProvider trace.TracerProvider
	// MeterProvider creates the relay's metrics (messages published, failed and dead-lettered, claim duration,
	// pending count and oldest pending age). Default: the Outbox's (Config.MeterProvider), else the global
	// provider (otel.GetMeterProvider).
	MeterProvider metric.MeterProvider
}

// Defaults of RelayConfig: the Balanced profile, which a nil *RelayConfig means and a zero field falls back to.
const (
	// DefaultBatchSize is how many rows one claim takes.
	DefaultBatchSize = 100
	// DefaultPollingInterval is how often a relay polls when no wake-up arrives.
	DefaultPollingInterval = time.Second
	// DefaultMaxRetryCount is how many retries follow a message's first rejected attempt.
	DefaultMaxRetryCount = 5
	// DefaultRetryDelay is the backoff after the first rejection.
	DefaultRetryDelay = 5 * time.Minute
	// DefaultMaxRetryDelay caps the backoff (or RetryDelay, when that is longer).
	DefaultMaxRetryDelay = time.Hour
	// DefaultJitter is the largest fraction of a backoff added at random.
	DefaultJitter = 0.2
	// DefaultMaxDegreeOfParallelism is how many deliveries may be in flight at once.
	DefaultMaxDegreeOfParallelism = 4
	// DefaultAckDeadline is how long a delivery may wait for its acknowledgement.
	DefaultAckDeadline = time.Minute
	// DefaultBrokerBackoff and DefaultMaxBrokerBackoff bound the pause after an unreachable broker.
	DefaultBrokerBackoff    = time.Second
	DefaultMaxBrokerBackoff = 30 * time.Second
	// DefaultVacuumInterval is how often a relay considers vacuuming the outbox table.
	DefaultVacuumInterval = 10 * time.Second
	// DefaultVacuumAfterRows is how many rows must have left the table since the last vacuum.
	DefaultVacuumAfterRows = 10000
)

// Claim and lease defaults of a relay, chosen from measurements (see "Lease defaults" in the outbox README): a
// renewal costs about 120µs of database time and took at most 0.2s on a saturated 2-core machine, so a live holder
// keeps its claims and lease through renewals 33 (rows) or 17 (leader) times slower than that, while a crash stalls
// work for seconds.
const (
	// DefaultClaimDuration is RelayConfig.ClaimDuration's default: 10s. A claim's rows are renewed every third of
	// it in one statement per batch in flight; a relay without leader election that crashes leaves its rows to
	// the others after about this long.
	DefaultClaimDuration = 10 * time.Second
	// DefaultLeaderTTL is RelayConfig.LeaderTTL's default: 5s. A crashed leader's partitions move after about
	// 5-6s (the TTL plus one contention interval); graceful closes hand over at once.
	DefaultLeaderTTL = 5 * time.Second
)

// PartitionBy is what RelayConfig.Partitions hashes a message on.
type PartitionBy int

const (
	// PartitionByKey hashes the partition key (the message ID for unordered messages), so a key's messages stay in
	// one partition.
	PartitionByKey PartitionBy = iota
	// PartitionByTenant hashes the tenant, so one tenant's messages (and a failing destination of its own) stay in
	// one partition.
	PartitionByTenant
)

func (p PartitionBy) String() string {
	switch p {
	case PartitionByKey:
		return "key"
	case PartitionByTenant:
		return "tenant"
	}
	return fmt.Sprintf("PartitionBy(%d)", int(p))
}

// Hooks are optional callbacks observing a relay, the place metrics and traces plug in. They run synchronously on
// the relay's goroutines, so keep them fast and never block.
type Hooks struct {
	// Claimed follows every claim: how many rows it leased, how long it took, and its error.
	Claimed func(ctx context.Context, rows int, took time.Duration, err error)
	// Delivered follows every delivery: the message, how it ended, the error that ended it (nil when published)
	// and how long it took from hand-over to answer.
	Delivered func(ctx context.Context, d Delivery, outcome Outcome, err error, took time.Duration)
	// Marked follows every statement marking published rows: how many, how long, and its error.
	Marked func(ctx context.Context, rows int, took time.Duration, err error)
	// DeadLettered follows a message's move to the dead letters, with the error of its last attempt.
	DeadLettered func(ctx context.Context, d Delivery, err error)
}

// Delivery describes a message a relay delivered, for Hooks.
type Delivery struct {
	MessageID    string
	Topic        string
	MessageType  string
	Tenant       string
	PartitionKey string
	// Attempt is the delivery attempt this was (1 for the first).
	Attempt int
}

// Outcome is how a delivery ended.
type Outcome int

const (
	// Published: acknowledged (the message reached the broker); its mark follows, batched with others.
	Published Outcome = iota
	// Rejected: nacked or not acknowledged within AckDeadline; the attempt counts.
	Rejected
	// Unreachable: the broker could not be reached; no attempt counted, the relay backs off.
	Unreachable
	// Released: given back without an answer because the relay was closing.
	Released
)

func (o Outcome) String() string {
	switch o {
	case Published:
		return "published"
	case Rejected:
		return "rejected"
	case Unreachable:
		return "unreachable"
	case Released:
		return "released"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Retries returns a *int for RelayConfig.MaxRetryCount.
func Retries(n int) *int { return &n }

// HighThroughput is the Excalibur outbox documentation's profile for real-time event processing and high-volume
// systems.
func HighThroughput() *RelayConfig {
	return &RelayConfig{BatchSize: 1000, PollingInterval: 100 * time.Millisecond, MaxRetryCount: Retries(3),
		RetryDelay: time.Minute, MaxDegreeOfParallelism: 8}
}

// Balanced is the Excalibur outbox documentation's profile for most production workloads, and the default.
func Balanced() *RelayConfig {
	return &RelayConfig{BatchSize: DefaultBatchSize, PollingInterval: DefaultPollingInterval,
		MaxRetryCount: Retries(DefaultMaxRetryCount), RetryDelay: DefaultRetryDelay,
		MaxDegreeOfParallelism: DefaultMaxDegreeOfParallelism}
}

// HighReliability is the Excalibur outbox documentation's profile for financial transactions and critical systems:
// small batches, long backoff, sequential delivery.
func HighReliability() *RelayConfig {
	return &RelayConfig{BatchSize: 10, PollingInterval: 5 * time.Second, MaxRetryCount: Retries(10),
		RetryDelay: 15 * time.Minute, MaxDegreeOfParallelism: 1}
}

// settings is a validated RelayConfig with every default applied, and what is derived from it.
type settings struct {
	RelayConfig
	maxRetryCount int                // *MaxRetryCount, or its default
	maintenance   *MaintenanceConfig // nil when disabled; defaults applied
}

func (c *RelayConfig) settings(defaultLogger *slog.Logger) (settings, error) {
	if c == nil {
		c = Balanced()
	}
	s := settings{RelayConfig: *c, maxRetryCount: DefaultMaxRetryCount}
	if c.MaxRetryCount != nil {
		s.maxRetryCount = *c.MaxRetryCount
	}
	check := conf.Check{Package: "outbox"}
	check.Int("BatchSize", &s.BatchSize, DefaultBatchSize, 1, 10000)
	check.Duration("PollingInterval", &s.PollingInterval, DefaultPollingInterval, 10*time.Millisecond)
	check.NonNegativeDuration("ClaimInterval", &s.ClaimInterval, 0)
	if s.ClaimInterval > s.PollingInterval {
		check.Fail("ClaimInterval", "must not be longer than PollingInterval")
	}
	if s.maxRetryCount < 0 {
		check.Fail("MaxRetryCount", "must not be negative")
	}
	check.Duration("RetryDelay", &s.RetryDelay, DefaultRetryDelay, 0)
	check.Duration("MaxRetryDelay", &s.MaxRetryDelay, max(DefaultMaxRetryDelay, s.RetryDelay), 0)
	check.AtLeast("MaxRetryDelay", s.MaxRetryDelay, "RetryDelay", s.RetryDelay)
	check.Fraction("Jitter", &s.Jitter, DefaultJitter)
	check.Int("MaxDegreeOfParallelism", &s.MaxDegreeOfParallelism, DefaultMaxDegreeOfParallelism, 1, 0)
	check.Text("ProcessorID", &s.ProcessorID, hostName(), nil)
	check.Duration("ClaimDuration", &s.ClaimDuration, DefaultClaimDuration, 100*time.Millisecond)
	check.Duration("AckDeadline", &s.AckDeadline, DefaultAckDeadline, 0)
	if s.IsBrokerUnavailable == nil {
		s.IsBrokerUnavailable = BrokerUnavailable
	}
	check.Duration("BrokerBackoff", &s.BrokerBackoff, DefaultBrokerBackoff, 0)
	check.Duration("MaxBrokerBackoff", &s.MaxBrokerBackoff, max(DefaultMaxBrokerBackoff, s.BrokerBackoff), 0)
	check.AtLeast("MaxBrokerBackoff", s.MaxBrokerBackoff, "BrokerBackoff", s.BrokerBackoff)
	if s.LeaderElection != "" {
		check.Text("LeaderElection", &s.LeaderElection, "", nil)
		check.Duration("LeaderTTL", &s.LeaderTTL, DefaultLeaderTTL, 100*time.Millisecond)
	} else if s.LeaderTTL != 0 {
		check.Fail("LeaderTTL", "needs LeaderElection")
	} else {
		s.LeaderTTL = DefaultLeaderTTL
	}
	if s.SingleWriter && s.LeaderElection != "" {
		check.Fail("SingleWriter", "cannot be combined with LeaderElection: an elected relay is fenced")
	}
	check.Int("Partitions", &s.Partitions, 1, 1, maxPartitions)
	if s.PartitionBy != PartitionByKey && s.PartitionBy != PartitionByTenant {
		check.Fail("PartitionBy", "must be PartitionByKey or PartitionByTenant")
	}
	if s.VacuumInterval == 0 {
		s.VacuumInterval = DefaultVacuumInterval
	}
	check.NonNegativeInt("VacuumAfterRows", &s.VacuumAfterRows, DefaultVacuumAfterRows)
	if err := check.Err(); err != nil {
		return settings{}, err
	}
	if s.Logger == nil {
		s.Logger = defaultLogger
	}
	if c.Maintenance == nil || !c.Maintenance.Disabled {
		m, err := c.Maintenance.withDefaults()
		if err != nil {
			var ce *ConfigError
			if errors.As(err, &ce) {
				ce.Field = "Maintenance." + ce.Field
			}
			return settings{}, err
		}
		if m.Logger == nil {
			m.Logger = s.Logger
		}
		if m.MeterProvider == nil {
			m.MeterProvider = s.MeterProvider
		}
		s.maintenance = &m
	}
	return s, nil
}

// hostName is the default ProcessorID: the host's name, or "relay" when it has none.
func hostName() string {
	host, err := os.Hostname()
	if err != nil || strings.TrimSpace(host) == "" {
		return "relay"
	}
	return host
}

// Validate reports the first invalid setting as a *ConfigError (errors.Is(err, ErrInvalidConfig)).
func (c *RelayConfig) Validate() error {
	_, err := c.settings(nil)
	return err
}

// backoffFloor is the delay before retry number attempt (1 = after the first rejection), without jitter:
// RetryDelay doubled per earlier rejection, capped by MaxRetryDelay. It saturates at the cap, so no setting (up to
// the largest time.Duration) can wrap a delay around to a negative, immediate retry.
func (s *settings) backoffFloor(attempt int) time.Duration {
	return backoff.Exponential(s.RetryDelay, s.MaxRetryDelay, attempt-1)
}

// backoff is backoffFloor plus up to Jitter of it at random, still capped by MaxRetryDelay (never below the floor).
func (s *settings) backoff(attempt int) time.Duration {
	return backoff.Jittered(s.backoffFloor(attempt), s.MaxRetryDelay, s.Jitter)
}

// backoffCeiling is the longest backoff before retry number attempt: its floor plus the whole Jitter, capped.
func (s *settings) backoffCeiling(attempt int) time.Duration {
	floor := s.backoffFloor(attempt)
	return min(backoff.Add(floor, backoff.Fraction(floor, s.Jitter)), s.MaxRetryDelay)
}

// nextBrokerBackoff is the relay's pause after another unreachable broker: pause doubled, capped by
// MaxBrokerBackoff, without overflow.
func (s *settings) nextBrokerBackoff(pause time.Duration) time.Duration {
	return backoff.Double(pause, s.MaxBrokerBackoff)
}

// RetryHorizon is the longest time between a message's first rejected attempt and its dead-lettering under these
// settings (every backoff at its maximum, without the time the attempts themselves take). The inbox retention of
// consumers must outlast it, plus the broker's own redelivery window. It saturates at the largest time.Duration
// (about 292 years) rather than overflow, whatever MaxRetryCount, RetryDelay and MaxRetryDelay are.
func (c *RelayConfig) RetryHorizon() (time.Duration, error) {
	s, err := c.settings(nil)
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for i := 1; i <= s.maxRetryCount; i++ {
		d := s.backoffCeiling(i)
		if s.backoffFloor(i) >= s.MaxRetryDelay {
			// Every later retry waits the same capped delay: add them at once, so a huge MaxRetryCount costs nothing.
			return backoff.Add(total, backoff.Mul(d, s.maxRetryCount-i+1)), nil
		}
		total = backoff.Add(total, d)
	}
	return total, nil
}

func newLeaseOwner(processorID string) string {
	var b [6]byte
	_, _ = crand.Read(b[:])
	return fmt.Sprintf("%s/%s", processorID, hex.EncodeToString(b[:]))
}
