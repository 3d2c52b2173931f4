package aggregate_test

import (
	"errors"
	"testing"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
)

type fuzzPlaced struct {
	Total int64
	Lines []struct {
		SKU string
		Qty int
	}
	Note *string
}

// FuzzDecodePayload: any stored payload, type name and type version decodes or fails with a typed error
// (ErrUnknownEvent or ErrDecode) naming the event; none panics.
func FuzzDecodePayload(f *testing.F) {
	f.Add("placed", 1, []byte(`{"Total": 3, "Lines": [{"SKU": "a", "Qty": 1}]}`))
	f.Add("placed", 1, []byte(`{"Total": "x"}`))
	f.Add("placed", 2, []byte(`{}`))
	f.Add("other", 1, []byte(`null`))
	f.Add("placed", 0, []byte(`not json`))
	f.Add("placed", -1, []byte(`{"Total": 1e999}`))
	reg := aggregate.NewRegistry(nil)
	if err := aggregate.RegisterEvent[fuzzPlaced](reg, "placed"); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, typ string, version int, payload []byte) {
		_, err := reg.Decode(eventstore.Record{Type: typ, TypeVersion: version, Payload: payload, StreamID: "s"})
		if err != nil && !errors.Is(err, aggregate.ErrUnknownEvent) && !errors.Is(err, aggregate.ErrDecode) {
			t.Fatalf("untyped error %T: %v", err, err)
		}
	})
}
