package projection

import (
	"errors"
	"testing"
	"time"
)

// FuzzConfig: any projection configuration either validates or fails with a *ConfigError naming the field.
func FuzzConfig(f *testing.F) {
	f.Add("balances", "", 0, 0, int64(0), 0, "acme")
	f.Add("", "s", -1, 300, int64(-1), 9, "a\x00")
	f.Add("a#b", "\u20ac", 1, 1, int64(1), 1, "")
	f.Fuzz(func(t *testing.T, name, schema string, partitions, batch int, poll int64, mode int, tenant string) {
		_, err := (&Config{Name: name, Schema: schema, Partitions: partitions, BatchSize: batch,
			PollInterval: time.Duration(poll), OnFailure: FailureMode(mode),
			Tenants: []string{tenant}}).withDefaults()
		if err == nil {
			return
		}
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field == "" || !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("untyped configuration error %T: %v", err, err)
		}
	})
}
