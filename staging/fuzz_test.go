package staging

import (
	"errors"
	"testing"
	"time"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
)

// FuzzConfig: any Strategy (with or without a Mapping) and any worker settings either build or fail with a
// *stagehand.ConfigError naming the field; none panics.
func FuzzConfig(f *testing.F) {
	f.Add(0, true, 0, int64(0), 0, "default")
	f.Add(99, true, -1, int64(-1), 7, "")
	f.Add(-3, false, 20000, int64(time.Hour), 1, "a\x00b")
	f.Add(1, true, 1, int64(1), 1, "x")
	f.Add(2, true, 1, int64(1), 1, "x")
	e := setup(f)
	mem := eventstore.NewMemory(nil)
	f.Fuzz(func(t *testing.T, strategy int, withMapping bool, batch int, poll int64, onFailure int, name string) {
		cfg := &Config{Strategy: Strategy(strategy)}
		if withMapping {
			cfg.Mapping = e.m
		}
		check := func(err error) {
			if err == nil {
				return
			}
			// A missing part of an explicitly requested strategy is named in the message (ErrInvalidConfig).
			var ce *stagehand.ConfigError
			if !errors.Is(err, ErrInvalidConfig) || (errors.As(err, &ce) && ce.Field == "") {
				t.Fatalf("untyped configuration error %T: %v", err, err)
			}
		}
		_, err := New(mem, cfg)
		check(err)
		_, err = NewDeferredStager(mem, e.outbox, e.m, &WorkerConfig{BatchSize: batch,
			PollInterval: time.Duration(poll), OnFailure: FailureMode(onFailure), Name: name})
		check(err)
	})
}
