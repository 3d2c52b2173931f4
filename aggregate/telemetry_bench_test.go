package aggregate_test

// The cost of instrumentation on a save, on the in-memory store so the database does not hide it:
//
//	go test ./aggregate -run '^$' -bench SaveInstrumentation -benchmem

import (
	"context"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/telemetry/telemetrytest"
)

// BenchmarkSaveInstrumentation saves one event per op with the global providers (no SDK installed: what an
// application that does not trace pays) and with SDK providers recording every span and counting every event.
func BenchmarkSaveInstrumentation(b *testing.B) {
	for _, mode := range []string{"global-noop", "sdk"} {
		b.Run(mode, func(b *testing.B) {
			var cfg *aggregate.RepositoryConfig
			if mode == "sdk" {
				rec := telemetrytest.New(b)
				tp := sdktrace.NewTracerProvider() // sampled, no exporter: the span cost without export
				b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				cfg = &aggregate.RepositoryConfig{TracerProvider: tp, MeterProvider: rec.MeterProvider}
			}
			r, err := aggregate.NewRepository[*Account](eventstore.NewMemory(nil), newRegistry(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			a := r.New(fmt.Sprintf("bench-%s", mode))
			b.ReportAllocs()
			for b.Loop() {
				_ = a.Deposit(1)
				if err := r.Save(ctx, a); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
