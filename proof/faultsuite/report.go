package faultsuite

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Report is what a run measured. String prints it; Check says which guarantee (or which precondition of a check)
// failed.
type Report struct {
	Config Config
	// Broker describes the broker the run went through.
	Broker string

	// Faults injected.
	RelayStarts, Kills, KillsMidWork int
	PostgresRestarts                 int
	PostgresDown                     []time.Duration
	BrokerStops                      int
	BrokerFault                      string        // what the broker's fault was
	BrokerOutage                     time.Duration // from the kill until the node was back
	BrokerLeaderless                 time.Duration // from the kill until the stream had a leader again

	// Production.
	CommittedEvents int64
	KeysWithEvents  int
	MaxPerKey       int
	SaveRetries     int64
	ProduceTime     time.Duration

	// The outbox and the relays.
	Staged                int64
	OutboxPending         int64
	OutboxDeadLetters     int64
	InjectedRejections    int64
	UnexpectedRejections  int64
	UnreachableDeliveries int64
	RelayDeadLetters      int64
	RelaySamples          []string

	// The broker's stream.
	BrokerStored, BrokerUnique, BrokerUnexpected, BrokerMissing int64
	OrderViolations                                             int64
	OrderExamples                                               []string
	// OrderTimelines describe the first keys with a violation, message by message (keyTimelines).
	OrderTimelines    []string
	KeysChecked       int
	VersionMismatches int64

	// The consumers and the inbox.
	Deliveries, FirstHandlings, InboxSkipped, HandlerFailures, DroppedAcks int64
	InboxHandled, InboxDeadLetters, InboxFailing                           int64
	EffectRows, UniqueHandled, DuplicateEffects                            int64
	EffectsMissing, EffectsUnexpected                                      int64
	DuplicateExamples                                                      []string
	HandlerOrderViolations                                                 int64
	HandlerOrderExamples                                                   []string

	DrainAfterLastFault time.Duration
	Total               time.Duration
}

// String renders the report.
func (r *Report) String() string {
	c := r.Config
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	var pgDown []string
	for _, d := range r.PostgresDown {
		pgDown = append(pgDown, fmt.Sprintf("%.1fs", d.Seconds()))
	}
	w("fault suite, size %s, broker %s (seed %d): %d messages over %d keys and %d partitions, %d relay processes, "+
		"total %s", c.Name, c.Broker, c.Seed, c.Messages, c.Keys, c.Partitions, c.Relays,
		r.Total.Round(100*time.Millisecond))
	w("broker: %s", r.Broker)
	w("faults injected:")
	w("  relay processes killed (SIGKILL):  %d (%d of them after publishing; %d processes started), one every %s-%s per relay",
		r.Kills, r.KillsMidWork, r.RelayStarts, c.KillMin, c.KillMax)
	w("  PostgreSQL restarts (-m fast):     %d (down %s)", r.PostgresRestarts, strings.Join(pgDown, ", "))
	leaderless := ""
	if r.BrokerLeaderless > 0 {
		leaderless = fmt.Sprintf(", the stream without a leader for %.1fs", r.BrokerLeaderless.Seconds())
	}
	w("  broker fault:                      %d (%s; back after %.1fs%s)", r.BrokerStops, r.BrokerFault,
		r.BrokerOutage.Seconds(), leaderless)
	w("  publishes rejected on purpose:     %d (%.0f%% of publishes, MaxRetryCount %d: expected dead letters %.1g)",
		r.InjectedRejections, c.RejectRate*100, c.MaxRetryCount, c.DeadLetterOdds())
	w("  acknowledgements dropped on purpose after the inbox committed: %d (%.0f%% of deliveries)", r.DroppedAcks,
		c.RedeliverRate*100)
	w("production:")
	w("  committed events:                  %d (%d keys, %d per key; %d saves retried after a failure; %s)",
		r.CommittedEvents, r.KeysWithEvents, r.MaxPerKey, r.SaveRetries, r.ProduceTime.Round(100*time.Millisecond))
	w("  messages staged:                   %d (outbox: %d pending, %d dead letters at the end)", r.Staged,
		r.OutboxPending, r.OutboxDeadLetters)
	w("relays:")
	w("  deliveries found the broker unreachable (no attempt counted): %d", r.UnreachableDeliveries)
	w("  other rejected deliveries:         %d", r.UnexpectedRejections)
	for _, s := range r.RelaySamples {
		w("    %s", s)
	}
	w("at the broker (every copy it stored, in its order):")
	w("  messages stored:                   %d (%d unique; %d not staged by any event; %d staged and never published)",
		r.BrokerStored, r.BrokerUnique, r.BrokerUnexpected, r.BrokerMissing)
	w("  duplicate deliveries at the broker: %d", r.BrokerStored-r.BrokerUnique)
	w("  per-key first-publication order violations: %d (%d keys checked)", r.OrderViolations, r.KeysChecked)
	for _, s := range r.OrderExamples {
		w("    %s", s)
	}
	for _, s := range r.OrderTimelines {
		w("    %s", s)
	}
	w("consumers (behind the inbox):")
	w("  deliveries:                        %d (%d handled, %d skipped by the inbox as duplicates, %d failed and redelivered)",
		r.Deliveries, r.FirstHandlings, r.InboxSkipped, r.HandlerFailures)
	w("  unique messages handled:           %d (of %d staged; inbox entries %d; %d staged messages without an effect)",
		r.UniqueHandled, r.Staged, r.InboxHandled, r.EffectsMissing)
	w("  duplicate effects behind the inbox: %d (%d effect rows)", r.DuplicateEffects, r.EffectRows)
	for _, s := range r.DuplicateExamples {
		w("    %s", s)
	}
	w("  per-key order violations at the handler: %d (first effects applied out of staging order)",
		r.HandlerOrderViolations)
	for _, s := range r.HandlerOrderExamples {
		w("    %s", s)
	}
	w("  inbox dead letters:                %d (%d failing)", r.InboxDeadLetters, r.InboxFailing)
	w("time to drain after the last fault:  %.1fs", r.DrainAfterLastFault.Seconds())
	return b.String()
}

// Check returns an error naming every guarantee that did not hold, and every check that could have passed
// vacuously because a fault or a precondition did not happen; nil when all held.
func (r *Report) Check() error {
	c := r.Config
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	// The faults happened (otherwise the checks below prove little).
	if r.Kills < c.MinKills {
		fail("only %d relay kills, want at least %d", r.Kills, c.MinKills)
	}
	if r.KillsMidWork < c.MinKills {
		fail("only %d relay kills hit a relay that had published, want at least %d", r.KillsMidWork, c.MinKills)
	}
	if r.PostgresRestarts != len(c.PostgresRestarts) {
		fail("%d PostgreSQL restarts, want %d", r.PostgresRestarts, len(c.PostgresRestarts))
	}
	if c.BrokerOutage > 0 && (r.BrokerStops != 1 || r.BrokerOutage < c.BrokerOutage) {
		fail("broker fault injected %d times for %s, want once for at least %s", r.BrokerStops, r.BrokerOutage,
			c.BrokerOutage)
	}
	if c.BrokerOutage > 0 && c.Broker == BrokerNATSCluster && r.BrokerLeaderless <= 0 {
		fail("the stream never went without a leader: the cluster's fault did not hit its leader")
	}
	if c.BrokerOutage > 0 && r.UnreachableDeliveries == 0 {
		fail("no relay ever found the broker unreachable: the outage did not reach the relays")
	}
	if c.RejectRate > 0 && r.InjectedRejections == 0 {
		fail("no publish was rejected on purpose")
	}
	if c.RedeliverRate > 0 && r.DroppedAcks == 0 {
		fail("no acknowledgement was dropped on purpose")
	}

	// Production: every planned event committed, one message staged for each.
	if r.CommittedEvents != int64(c.Messages) || r.KeysWithEvents != c.Keys {
		fail("%d committed events over %d keys, want %d over %d", r.CommittedEvents, r.KeysWithEvents, c.Messages,
			c.Keys)
	}
	if r.Staged != r.CommittedEvents {
		fail("%d messages staged for %d committed events", r.Staged, r.CommittedEvents)
	}

	// Nothing lost (contract 5), nothing dead-lettered.
	if r.BrokerMissing != 0 || r.BrokerUnexpected != 0 {
		fail("the broker is missing %d staged messages and holds %d unknown ones", r.BrokerMissing,
			r.BrokerUnexpected)
	}
	if r.OutboxPending != 0 || r.OutboxDeadLetters != 0 || r.RelayDeadLetters != 0 {
		fail("the outbox holds %d pending messages and %d dead letters (%d dead-lettered by relays)",
			r.OutboxPending, r.OutboxDeadLetters, r.RelayDeadLetters)
	}
	if r.UnexpectedRejections != 0 {
		fail("%d deliveries were rejected for a reason other than the injected rejections (an attempt counted): %v",
			r.UnexpectedRejections, r.RelaySamples)
	}
	if r.UniqueHandled != r.Staged || r.EffectsMissing != 0 || r.EffectsUnexpected != 0 {
		fail("%d unique messages handled for %d staged (%d without an effect, %d unknown)", r.UniqueHandled,
			r.Staged, r.EffectsMissing, r.EffectsUnexpected)
	}
	if r.InboxDeadLetters != 0 || r.InboxHandled != r.Staged {
		fail("the inbox has %d dead letters and %d entries for %d staged messages", r.InboxDeadLetters,
			r.InboxHandled, r.Staged)
	}

	// Per-key order at the broker (contract 6).
	if r.OrderViolations != 0 || r.VersionMismatches != 0 {
		fail("%d per-key first-publication order violations at the broker (%d version headers out of place): %v",
			r.OrderViolations, r.VersionMismatches, r.OrderExamples)
	}
	if r.KeysChecked != c.Keys || r.MaxPerKey < 2 {
		fail("order checked on %d keys with up to %d messages each, want %d keys with several messages",
			r.KeysChecked, r.MaxPerKey, c.Keys)
	}

	// Effectively once behind the inbox (contract 7), with duplicates that actually reached it.
	if r.DuplicateEffects != 0 {
		fail("%d duplicate effects behind the inbox: %v", r.DuplicateEffects, r.DuplicateExamples)
	}
	// Per-key order at the handler (contract 6, carried on by one unacknowledged message per partition).
	if r.HandlerOrderViolations != 0 {
		fail("%d per-key order violations at the handler: %v", r.HandlerOrderViolations, r.HandlerOrderExamples)
	}
	if r.InboxSkipped == 0 {
		fail("the inbox never saw a duplicate delivery, so the duplicate-effect check proves nothing")
	}
	return errors.Join(errs...)
}
