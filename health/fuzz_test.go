package health_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/health"
)

// FuzzConfig: any configuration either builds a Checker or fails with a *stagehand.ConfigError naming the field.
func FuzzConfig(f *testing.F) {
	f.Add(int64(0), int64(0), 0.0, 0.0, int64(0), 0, int64(0))
	f.Add(int64(-1), int64(time.Minute), 50.0, 10.0, int64(time.Millisecond), -1, int64(-5))
	f.Add(int64(math.MaxInt64), int64(1), math.NaN(), math.Inf(1), int64(math.MaxInt64), math.MaxInt, int64(1))
	f.Fuzz(func(t *testing.T, degraded, unhealthy int64, dRate, uRate float64, window int64, minDel int,
		timeout int64) {
		_, err := health.New(&health.Config{DegradedInactivity: time.Duration(degraded),
			UnhealthyInactivity: time.Duration(unhealthy), DegradedFailureRate: dRate, UnhealthyFailureRate: uRate,
			FailureWindow: time.Duration(window), MinDeliveries: minDel, Timeout: time.Duration(timeout)})
		if err == nil {
			return
		}
		var ce *stagehand.ConfigError
		if !errors.As(err, &ce) || ce.Field == "" || ce.Package != "health" {
			t.Fatalf("untyped configuration error %T: %v", err, err)
		}
	})
}
