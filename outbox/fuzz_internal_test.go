package outbox

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/jsonmeta"
)

// FuzzRelayConfig: any settings either validate, with every retry delay and the retry horizon within [0, max], or
// fail with a *ConfigError; none panics or hangs (a huge MaxRetryCount included).
func FuzzRelayConfig(f *testing.F) {
	f.Add(100, int64(time.Second), 5, int64(time.Minute), int64(math.MaxInt64), 0.2, 1, 30)
	f.Add(-1, int64(0), -1, int64(-1), int64(0), math.NaN(), 0, 0)
	f.Add(10000, int64(10*time.Millisecond), math.MaxInt, int64(math.MaxInt64), int64(math.MaxInt64), 1.0, 256, 200)
	f.Add(0, int64(0), 0, int64(1), int64(1), 1e-9, 257, math.MaxInt)
	f.Fuzz(func(t *testing.T, batch int, poll int64, retries int, delay, maxDelay int64, jitter float64,
		partitions, attempt int) {
		c := &RelayConfig{BatchSize: batch, PollingInterval: time.Duration(poll), MaxRetryCount: Retries(retries),
			RetryDelay: time.Duration(delay), MaxRetryDelay: time.Duration(maxDelay), Jitter: jitter,
			Partitions: partitions, ProcessorID: "fuzz"}
		s, err := c.settings(nil)
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("untyped configuration error %T: %v", err, err)
			}
			return
		}
		if d := s.backoff(attempt); d < 0 || d > s.MaxRetryDelay {
			t.Fatalf("backoff(%d) = %s outside [0, %s]", attempt, d, s.MaxRetryDelay)
		}
		h, err := c.RetryHorizon()
		if err != nil || h < 0 {
			t.Fatalf("RetryHorizon = %s, %v", h, err)
		}
	})
}

// FuzzMessageHeaders: a Watermill message with any metadata converts to an outbox Message or fails with
// ErrInvalidMessage (a scheduled-at header that is not a time); what converts passes or fails the stored-name
// checks with a typed error.
func FuzzMessageHeaders(f *testing.F) {
	f.Add("m1", "t", "2026-01-01T00:00:00Z", "acme", "k", "v")
	f.Add("m\x00", "t", "not a time", "evil,B", "\xff", "\x00")
	f.Add("", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, id, typ, scheduled, tenant, key, value string) {
		o := &Outbox{partitionKey: DefaultPartitionKey}
		msg := message.NewMessage(id, []byte("x"))
		msg.Metadata.Set(stagehand.HeaderMessageType, typ)
		msg.Metadata.Set(HeaderScheduledAt, scheduled)
		msg.Metadata.Set(stagehand.HeaderTenantID, tenant)
		msg.Metadata.Set(key, value)
		m, err := o.fromWatermill(context.Background(), "topic", msg)
		if err != nil {
			if !errors.Is(err, ErrInvalidMessage) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if err := checkMessage(0, &m, stagehand.NormalizeTenant(m.Tenant)); err != nil &&
			!errors.Is(err, ErrInvalidMessage) {
			t.Fatalf("untyped error %v", err)
		}
	})
}

// FuzzStoredMetadata: outbox and dead-letter metadata scan through jsonmeta.Map; valid JSON never fails it.
func FuzzStoredMetadata(f *testing.F) {
	for _, s := range []string{`{"retries": 1}`, `[1, 2]`, `null`, `{"a": {"b": null}}`, `"x"`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m jsonmeta.Map
		err := m.UnmarshalJSON(b)
		if err == nil {
			return
		}
		if _, derr := jsonmeta.Decode(b); derr == nil {
			t.Fatalf("Map refused what Decode reads: %v", err)
		}
	})
}
