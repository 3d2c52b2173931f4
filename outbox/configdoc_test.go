package outbox

import (
	"context"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/internal/testkit/doctable"
)

// The README's tables of Config, RelayConfig and InboxConfig have a row for every field, with the defaults New,
// RelayConfig.settings and NewInbox apply to a zero configuration.
func TestREADMEConfigTables(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://doc@127.0.0.1:1/doc") // never connects
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	o, err := New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = o.Close() }()
	doctable.Check(t, doctable.Find(t, "README.md", "`outbox.Config` (nil allowed)"), reflect.TypeFor[Config](), "",
		map[string]any{"Schema": o.schema, "DisableNotify": false})

	s, err := (&RelayConfig{}).settings(nil)
	if err != nil {
		t.Fatal(err)
	}
	doctable.Check(t, doctable.Find(t, "README.md", "`outbox.RelayConfig` (nil means"), reflect.TypeFor[RelayConfig](),
		"", map[string]any{
			"BatchSize": s.BatchSize, "PollingInterval": s.PollingInterval, "ClaimInterval": s.ClaimInterval, "MaxRetryCount": s.maxRetryCount,
			"RetryDelay": s.RetryDelay, "MaxRetryDelay": s.MaxRetryDelay, "Jitter": s.Jitter,
			"MaxDegreeOfParallelism": s.MaxDegreeOfParallelism, "ClaimDuration": s.ClaimDuration, "AckDeadline": s.AckDeadline,
			"ReleaseKeyOnDeadLetter": s.ReleaseKeyOnDeadLetter, "BrokerBackoff": s.BrokerBackoff,
			"MaxBrokerBackoff": s.MaxBrokerBackoff, "DisableNotify": s.DisableNotify,
			"VacuumInterval": s.VacuumInterval, "VacuumAfterRows": s.VacuumAfterRows, "LeaderElection": s.LeaderElection, "LeaderTTL": s.LeaderTTL,
			"SingleWriter": s.SingleWriter, "Partitions": s.Partitions,
			"PartitionBy": map[PartitionBy]string{PartitionByKey: "PartitionByKey", PartitionByTenant: "PartitionByTenant"}[s.PartitionBy],
		})

	m, err := (*MaintenanceConfig)(nil).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	doctable.Check(t, doctable.Find(t, "README.md", "`outbox.MaintenanceConfig` (nil allowed"),
		reflect.TypeFor[MaintenanceConfig](), "", map[string]any{
			"Disabled": m.Disabled, "Interval": m.Interval, "SentRetention": m.SentRetention,
			"InboxRetention": m.InboxRetention, "DeadLetterRetention": m.DeadLetterRetention,
			"BatchSize": m.BatchSize, "LeaseTTL": m.LeaseTTL,
		})

	in, err := o.NewInbox(nil)
	if err != nil {
		t.Fatal(err)
	}
	doctable.Check(t, doctable.Find(t, "README.md", "`outbox.InboxConfig`"), reflect.TypeFor[InboxConfig](), "",
		map[string]any{"MaxAttempts": in.maxAttempts, "ContentionRetries": in.contention, "RetryDelay": in.retryDelay,
			"MaxRetryDelay": in.maxRetryDelay, "Jitter": in.jitter, "HandlerTimeout": in.timeout})
}
