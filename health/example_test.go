package health_test

import (
	"context"
	"fmt"
	"time"

	"github.com/stagehand-es/stagehand/health"
	"github.com/stagehand-es/stagehand/staging"
)

// stuckStager is a staging worker 40 positions behind the log that never moves.
type stuckStager struct{}

func (stuckStager) Name() string { return "stager:orders" }
func (stuckStager) Lag(context.Context) (staging.Lag, error) {
	return staging.Lag{Position: 60, Head: 100, Events: 40}, nil
}

// A worker with lag whose position stands still is Degraded after 2 minutes and Unhealthy after 5, though it
// reports no error. The injected clock stands in for minutes of waiting.
func ExampleChecker() {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	checker, err := health.New(&health.Config{
		Workers: []health.Worker{stuckStager{}},
		Clock:   func() time.Time { return now },
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, wait := range []time.Duration{0, 2 * time.Minute, 3 * time.Minute} {
		now = now.Add(wait)
		r := checker.Check(ctx)
		fmt.Println(r.Status, r.Reasons)
	}
	// In a service: http.Handle("/healthz", checker), and relays built with
	// outbox.RelayConfig{Hooks: checker.RelayHooks(outbox.Hooks{})} for the failure rate.

	// Output:
	// healthy []
	// degraded [worker:stager:orders: 40 positions behind (oldest waiting 0s), position 60 has not moved for 2m0s]
	// unhealthy [worker:stager:orders: 40 positions behind (oldest waiting 0s), position 60 has not moved for 5m0s]
}
