package eventstore

import (
	"encoding/json"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/stagehand-es/stagehand/internal/jsonmeta"
)

// FuzzFinishRecord: any metadata column either reads (non-string values as JSON text) or fails with a
// *RecordError naming the event; none panics. The event store and the outbox read by one rule: a column the store
// refuses is exactly one the outbox's reader keeps under jsonmeta.InvalidKey, and one it reads, the outbox reads
// the same.
func FuzzFinishRecord(f *testing.F) {
	for _, s := range []string{`{"retries": 1}`, `{"a": "b"}`, `[1, 2]`, `null`, `"x"`, `{"n": {"x": [1, null]}}`,
		`{"\u20ac": "\u0000"}`, `{`, ``, `42`, `[]`, `1`, `""`, `{}`, ` {} `, `420`, `["x", 1]`, `true`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, meta []byte) {
		r := Record{Position: 7, StreamID: "s", Version: 2}
		err := finishRecord(&r, meta)
		if err != nil {
			var re *RecordError
			if !errors.As(err, &re) || !errors.Is(err, ErrCorruptRecord) || re.Record.Position != 7 {
				t.Fatalf("untyped or unnamed error %T: %v", err, err)
			}
		}
		if !json.Valid(meta) {
			return
		}
		var outbox jsonmeta.Map
		if uerr := json.Unmarshal(meta, &outbox); uerr != nil {
			t.Fatalf("the outbox cannot read valid JSON %q: %v", meta, uerr)
		}
		_, invalid := outbox[jsonmeta.InvalidKey]
		switch {
		case err != nil && !invalid:
			t.Fatalf("the store refuses %q, the outbox reads it as %v", meta, outbox)
		case err == nil && !maps.Equal(map[string]string(outbox), r.Metadata):
			t.Fatalf("the store reads %q as %v, the outbox as %v", meta, r.Metadata, outbox)
		}
	})
}

// FuzzPrepare: any append request either validates or fails with a typed error (ErrInvalidAppend, or
// ErrDuplicateEventID); none panics.
func FuzzPrepare(f *testing.F) {
	f.Add("acme", "s-1", "t", "e", int64(-1), "k", "v", []byte(`{}`))
	f.Add("a\x00", "\xff", "t\x00", "", int64(-9), "\x00", "\x00", []byte(`not json`))
	f.Add("", "", "", "e", int64(3), "", "", []byte(nil))
	f.Fuzz(func(t *testing.T, tenant, stream, streamType, typ string, expected int64, k, v string, payload []byte) {
		_, err := prepare(AppendRequest{Tenant: tenant, StreamID: stream, StreamType: streamType,
			Expected: ExpectedVersion(expected), Events: []EventData{{Type: typ, Payload: payload,
				Metadata: Metadata{k: v}}}}, time.Now())
		if err != nil && !errors.Is(err, ErrInvalidAppend) && !errors.Is(err, ErrDuplicateEventID) {
			t.Fatalf("untyped error %v", err)
		}
	})
}

// FuzzPostgresConfig: any configuration either validates or fails with a *ConfigError naming the field.
func FuzzPostgresConfig(f *testing.F) {
	f.Add("stagehand", int64(0))
	f.Add("", int64(-1))
	f.Add("\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac\u20ac"+
		"\u20ac\u20ac\u20ac\u20ac\u20ac", int64(1))
	f.Add("a\x00b", int64(1))
	f.Fuzz(func(t *testing.T, schema string, gap int64) {
		_, err := (&PostgresConfig{Schema: schema, MaxGapWait: time.Duration(gap)}).withDefaults()
		if err == nil {
			return
		}
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field == "" || !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("untyped configuration error %v", err)
		}
	})
}
