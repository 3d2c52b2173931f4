package faultsuite

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"
)

// EnvSize selects the size of the run: "ci" (the default) or "full".
const EnvSize = "STAGEHAND_FAULTS"

// Config is the size and the faults of a run. CI and Full return the two documented sizes.
type Config struct {
	// Name is the size's name, printed in the report.
	Name string
	// Broker is the broker the messages go through: BrokerNATS (the default), BrokerNATSCluster or BrokerRabbitMQ.
	Broker string
	// Partitions is the number of topics the messages are spread over by a hash of their key, each consumed one
	// message at a time so that each key's order reaches the handler. Default 8.
	Partitions int
	// Messages are produced by saving Keys aggregates (one partition key each) Messages/Keys events each, one
	// message per event. Messages must be a multiple of Keys.
	Messages, Keys int
	// Producers save aggregates concurrently, each owning Keys/Producers aggregates.
	Producers int
	// ProduceFor paces production so that it takes this long: the faults below happen while messages are being
	// saved, relayed and handled. Production may take longer on a loaded machine, never shorter.
	ProduceFor time.Duration
	// Relays is the number of relay processes; each is killed with SIGKILL a random time between KillMin and
	// KillMax after it reported ready (its router runs), and restarted at once, until production and every
	// scheduled fault are over.
	Relays           int
	KillMin, KillMax time.Duration
	// MinKills is the fewest kills the run must have made for its checks to mean anything.
	MinKills int
	// PostgresRestarts happen at these fractions of ProduceFor (pg_ctl restart -m fast).
	PostgresRestarts []float64
	// BrokerStopAt (a fraction of ProduceFor) is when the broker's fault begins: a node killed with SIGKILL (the
	// only one, or a cluster's stream leader), started again on the same ports and store BrokerOutage later.
	BrokerStopAt float64
	BrokerOutage time.Duration
	// RejectRate is the fraction of publishes each relay process's destination rejects (an error that is not
	// "broker unavailable", so the attempt counts and the message backs off).
	RejectRate float64
	// RedeliverRate is the fraction of deliveries the consumer nacks after the inbox committed its effects (as if
	// the acknowledgement were lost), so the broker delivers those messages again and the inbox must skip them.
	RedeliverRate float64
	// MaxRetryCount is the relays' RelayConfig.MaxRetryCount. The chance that one message is rejected on every one of
	// its MaxRetryCount+1 attempts is RejectRate^(MaxRetryCount+1); see DeadLetterOdds.
	MaxRetryCount int
	// ProduceTimeout bounds production: every planned message must be saved within this long of the window's
	// start, or the run fails saying how far production got. Production is paced to take ProduceFor; on a loaded
	// machine it takes longer. Default 3 × ProduceFor.
	ProduceTimeout time.Duration
	// DrainTimeout bounds the drain's stalls: after the last fault the run waits for every message to be handled,
	// and fails when DrainTimeout passes with no message handled (a drain that keeps going on a busy machine is
	// waited for, within the run's own deadline).
	DrainTimeout time.Duration
	// ProgressEvery is how often a progress line (events committed, messages handled, kills) is written while
	// messages are produced and drained. Default 10s.
	ProgressEvery time.Duration
	// Seed seeds the random choices of the parent (kill times, key order); 0 picks one. Printed in the report.
	Seed uint64
	// ChildCommand re-executes the test binary as a relay process (for example os.Args[0], "-test.run=^$"); the
	// binary's TestMain must call RunChildIfRequested.
	ChildCommand []string
	// Logger receives the components' logs (relay processes' too). Default: discarded.
	Logger *slog.Logger
	// Progress receives a line per phase and fault as the run goes. Default: discarded.
	Progress io.Writer
}

// CI is the size run by go test work (and so by .ci/run, with -race): 5,000 messages over 100 keys, 3 relay
// processes killed every 1-3 s for a 12 s window (at least 3 kills), one PostgreSQL restart, a 3 s broker outage.
func CI() Config {
	return Config{
		Name: "ci", Messages: 5000, Keys: 100, Producers: 4, ProduceFor: 12 * time.Second,
		Relays: 3, KillMin: time.Second, KillMax: 3 * time.Second, MinKills: 3,
		PostgresRestarts: []float64{0.3}, BrokerStopAt: 0.55, BrokerOutage: 3 * time.Second,
		RejectRate: 0.05, RedeliverRate: 0.01, MaxRetryCount: 10, ProduceTimeout: 3 * time.Minute,
		DrainTimeout: 90 * time.Second,
	}
}

// Full is the full size: 100,000 messages over 1,000 keys, 3 relay processes killed every 1-3 s for a 60 s
// window, PostgreSQL restarted twice, the broker stopped for 10 s.
func Full() Config {
	return Config{
		Name: "full", Messages: 100_000, Keys: 1000, Producers: 8, ProduceFor: 60 * time.Second,
		Relays: 3, KillMin: time.Second, KillMax: 3 * time.Second, MinKills: 30,
		PostgresRestarts: []float64{0.25, 0.7}, BrokerStopAt: 0.4, BrokerOutage: 10 * time.Second,
		RejectRate: 0.05, RedeliverRate: 0.01, MaxRetryCount: 10, ProduceTimeout: 15 * time.Minute,
		DrainTimeout: 10 * time.Minute,
	}
}

// FromEnv returns the size named by STAGEHAND_FAULTS: CI when unset or "ci", Full for "full".
func FromEnv() (Config, error) {
	switch v := strings.ToLower(strings.TrimSpace(os.Getenv(EnvSize))); v {
	case "", "ci":
		return CI(), nil
	case "full":
		return Full(), nil
	default:
		return Config{}, fmt.Errorf("faultsuite: %s=%q: want ci or full", EnvSize, v)
	}
}

// DeadLetterOdds is the expected number of messages whose every attempt is rejected by the injected rejections
// alone (each attempt independently with RejectRate), which would dead-letter them: Messages × RejectRate^(retries+1).
func (c Config) DeadLetterOdds() float64 {
	p := 1.0
	for range c.MaxRetryCount + 1 {
		p *= c.RejectRate
	}
	return float64(c.Messages) * p
}

func (c *Config) validate() error {
	switch {
	case c.Messages <= 0 || c.Keys <= 0 || c.Messages%c.Keys != 0:
		return fmt.Errorf("faultsuite: Messages (%d) must be a positive multiple of Keys (%d)", c.Messages, c.Keys)
	case c.Producers <= 0 || c.Keys%c.Producers != 0:
		return fmt.Errorf("faultsuite: Keys (%d) must be a multiple of Producers (%d)", c.Keys, c.Producers)
	case c.Relays <= 0:
		return fmt.Errorf("faultsuite: Relays must be positive, got %d", c.Relays)
	case c.KillMin <= 0 || c.KillMax < c.KillMin:
		return fmt.Errorf("faultsuite: kill interval %s-%s is invalid", c.KillMin, c.KillMax)
	case c.ProduceFor <= 0 || c.DrainTimeout <= 0:
		return fmt.Errorf("faultsuite: ProduceFor and DrainTimeout must be positive")
	case c.ProduceTimeout != 0 && c.ProduceTimeout < c.ProduceFor:
		return fmt.Errorf("faultsuite: ProduceTimeout (%s) must not be below ProduceFor (%s)", c.ProduceTimeout,
			c.ProduceFor)
	case c.ProgressEvery < 0:
		return fmt.Errorf("faultsuite: ProgressEvery must not be negative")
	case c.RejectRate < 0 || c.RejectRate >= 1 || c.RedeliverRate < 0 || c.RedeliverRate >= 1:
		return fmt.Errorf("faultsuite: RejectRate and RedeliverRate must be in [0, 1)")
	case c.BrokerStopAt < 0 || c.BrokerStopAt >= 1:
		return fmt.Errorf("faultsuite: BrokerStopAt must be in [0, 1)")
	case c.Broker != "" && !slices.Contains(Brokers(), c.Broker):
		return fmt.Errorf("faultsuite: Broker %q: want one of %s", c.Broker, strings.Join(Brokers(), ", "))
	case c.Partitions < 0 || c.Partitions > 100:
		return fmt.Errorf("faultsuite: Partitions must be between 1 and 100 (0: 8), got %d", c.Partitions)
	case len(c.ChildCommand) == 0:
		return fmt.Errorf("faultsuite: ChildCommand is required (the test binary re-executed as a relay process)")
	case c.DeadLetterOdds() > 1e-6:
		return fmt.Errorf("faultsuite: MaxRetryCount %d is too low for RejectRate %g over %d messages: %.2g messages "+
			"would be expected to use up their attempts", c.MaxRetryCount, c.RejectRate, c.Messages, c.DeadLetterOdds())
	}
	for _, f := range c.PostgresRestarts {
		if f <= 0 || f >= 1 {
			return fmt.Errorf("faultsuite: PostgresRestarts must be fractions in (0, 1), got %g", f)
		}
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	if c.Broker == "" {
		c.Broker = BrokerNATS
	}
	if c.Partitions == 0 {
		c.Partitions = 8
	}
	if c.ProduceTimeout == 0 {
		c.ProduceTimeout = 3 * c.ProduceFor
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Logger = slog.New(quietInjected(c.Logger.Handler()))
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return nil
}
