package faultsuite_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/proof/faultsuite"
)

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	base := func() faultsuite.Config {
		c := faultsuite.CI()
		c.ChildCommand = []string{"/bin/false"}
		return c
	}
	for _, c := range []struct {
		edit func(*faultsuite.Config)
		want string
	}{
		{func(c *faultsuite.Config) { c.Messages = 5001 }, "Messages (5001) must be a positive multiple of Keys"},
		{func(c *faultsuite.Config) { c.ProduceTimeout = time.Second }, "ProduceTimeout (1s) must not be below ProduceFor"},
		{func(c *faultsuite.Config) { c.ProgressEvery = -time.Second }, "ProgressEvery must not be negative"},
		{func(c *faultsuite.Config) { c.ChildCommand = nil }, "ChildCommand is required"},
		{func(c *faultsuite.Config) { c.MaxRetryCount = 2 }, "MaxRetryCount 2 is too low"},
		{func(c *faultsuite.Config) { c.PostgresRestarts = []float64{1.5} }, "PostgresRestarts must be fractions"},
		{func(c *faultsuite.Config) { c.Broker = "kafka" }, `Broker "kafka": want one of nats, nats-cluster, rabbitmq`},
	} {
		cfg := base()
		c.edit(&cfg)
		rep, err := faultsuite.Run(context.Background(), cfg) // fails before starting anything
		require.ErrorContains(t, err, c.want)
		require.Nil(t, rep)
	}
}

// passing is the report of a CI-size run in which every guarantee held.
func passing() *faultsuite.Report {
	c := faultsuite.CI()
	return &faultsuite.Report{Config: c,
		RelayStarts: 12, Kills: 9, KillsMidWork: 8, PostgresRestarts: 1, PostgresDown: []time.Duration{3 * time.Second},
		BrokerStops: 1, BrokerOutage: 3200 * time.Millisecond,
		CommittedEvents: 5000, KeysWithEvents: 100, MaxPerKey: 50, Staged: 5000,
		InjectedRejections: 260, UnreachableDeliveries: 20,
		BrokerStored: 5300, BrokerUnique: 5000, KeysChecked: 100,
		Deliveries: 5350, FirstHandlings: 5000, InboxSkipped: 300, DroppedAcks: 50,
		InboxHandled: 5000, EffectRows: 5000, UniqueHandled: 5000}
}

func TestCheckPassesWhenEveryGuaranteeHeld(t *testing.T) {
	t.Parallel()
	require.NoError(t, passing().Check())
	require.Contains(t, passing().String(), "per-key first-publication order violations: 0 (100 keys checked)")
}

func TestCheckNamesEveryBrokenGuarantee(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		edit func(*faultsuite.Report)
		want string
	}{
		{func(r *faultsuite.Report) { r.BrokerMissing = 1 }, "the broker is missing 1 staged messages"},
		{func(r *faultsuite.Report) { r.OrderViolations = 1 }, "1 per-key first-publication order violations"},
		{func(r *faultsuite.Report) { r.HandlerOrderViolations = 1 }, "1 per-key order violations at the handler"},
		{func(r *faultsuite.Report) { r.DuplicateEffects, r.EffectRows = 1, 5001 }, "1 duplicate effects behind the inbox"},
		{func(r *faultsuite.Report) { r.UniqueHandled, r.EffectsMissing = 4999, 1 }, "4999 unique messages handled for 5000 staged"},
		{func(r *faultsuite.Report) { r.OutboxDeadLetters = 1 }, "1 dead letters"},
		{func(r *faultsuite.Report) { r.UnexpectedRejections = 1 }, "rejected for a reason other than the injected"},
		{func(r *faultsuite.Report) { r.Staged = 4999 }, "4999 messages staged for 5000 committed events"},
		// Vacuous runs fail too: the faults must have happened and duplicates must have reached the inbox.
		{func(r *faultsuite.Report) { r.Kills = 2 }, "only 2 relay kills"},
		{func(r *faultsuite.Report) { r.PostgresRestarts = 0 }, "0 PostgreSQL restarts, want 1"},
		{func(r *faultsuite.Report) { r.UnreachableDeliveries = 0 }, "the outage did not reach the relays"},
		{func(r *faultsuite.Report) { r.InboxSkipped = 0 }, "proves nothing"},
		{func(r *faultsuite.Report) { r.DroppedAcks = 0 }, "no acknowledgement was dropped on purpose"},
		{func(r *faultsuite.Report) { r.Config.Broker = faultsuite.BrokerNATSCluster }, "never went without a leader"},
	} {
		r := passing()
		c.edit(r)
		require.ErrorContains(t, r.Check(), c.want)
	}
}
