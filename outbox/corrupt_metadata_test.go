package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

type metaCapture struct {
	mu   sync.Mutex
	meta map[string]message.Metadata
	fail bool
}

func (c *metaCapture) Publish(_ string, msgs ...*message.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail {
		return errRejected
	}
	for _, m := range msgs {
		c.meta[m.UUID] = m.Metadata
	}
	return nil
}

func (c *metaCapture) Close() error { return nil }

// Metadata written into outbox rows by another tool with values that are not strings, or that is not a JSON
// object at all, no longer fails every claim that meets it (stalling the whole relay): values are delivered as
// their JSON text, and a non-object under the "stagehand-invalid-metadata" header. Dead letters list the same way.
func TestRelayDeliversRowsWithForeignMetadata(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	_, err := e.ob.Stage(ctx, outbox.Message{ID: "m1", Topic: "t", Payload: []byte("x")},
		outbox.Message{ID: "m2", Topic: "t", Payload: []byte("x")},
		outbox.Message{ID: "m3", Topic: "t", Payload: []byte("x")})
	require.NoError(t, err)
	set := func(id, meta string) {
		_, err := e.pool.Exec(ctx, `UPDATE `+pgtest.Q(e.schema, "outbox")+` SET metadata = $2::jsonb
			WHERE message_id = $1`, id, meta)
		require.NoError(t, err)
	}
	set("m1", `{"retries": 1, "ok": true, "s": "v"}`)
	set("m2", `[1, 2]`)

	c := &metaCapture{meta: map[string]message.Metadata{}}
	res, err := e.relay(nil).Drain(ctx, c)
	require.NoError(t, err)
	require.Equal(t, 3, res.Published)
	require.Equal(t, "1", c.meta["m1"].Get("retries"))
	require.Equal(t, "true", c.meta["m1"].Get("ok"))
	require.Equal(t, "v", c.meta["m1"].Get("s"))
	require.Equal(t, "[1, 2]", c.meta["m2"].Get("stagehand-invalid-metadata"))

	// The same rows dead-lettered are listed, not an error.
	_, err = e.ob.Stage(ctx, outbox.Message{ID: "d1", Topic: "t", Payload: []byte("x")})
	require.NoError(t, err)
	set("d1", `{"n": 2.5}`)
	c.fail = true
	_, err = e.relay(func(c *outbox.RelayConfig) { c.MaxRetryCount = outbox.Retries(0) }).Drain(ctx, c)
	require.NoError(t, err)
	dls, err := e.ob.AllTenants().DeadLetters(ctx, outbox.ListOptions{})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, "2.5", dls[0].Metadata["n"])
}

// The relay reads stored metadata by the same rule as the event store, whatever its length: an object is metadata,
// null or {} is none, and anything else (42 and [] as much as 420 and ["x", 1]) is delivered under the
// "stagehand-invalid-metadata" header, as the dead letter lists it.
func TestRelayReadsMetadataByOneRuleForEveryLength(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	cases := map[string]string{ // stored metadata → the invalid-metadata header ("" for none)
		`{}`: "", `null`: "", `{"a": "b"}`: "",
		`42`: "42", `[]`: "[]", `""`: `""`, `1`: "1", `420`: "420", `["x", 1]`: `["x", 1]`, `"s"`: `"s"`,
		`true`: "true",
	}
	ids := map[string]string{}
	for stored := range cases {
		id := fmt.Sprintf("m%d", len(ids))
		ids[id] = stored
		_, err := e.ob.Stage(ctx, outbox.Message{ID: id, Topic: "t", Payload: []byte("x")})
		require.NoError(t, err)
		_, err = e.pool.Exec(ctx, `UPDATE `+pgtest.Q(e.schema, "outbox")+` SET metadata = $2::jsonb
			WHERE message_id = $1`, id, stored)
		require.NoError(t, err)
	}
	c := &metaCapture{meta: map[string]message.Metadata{}}
	res, err := e.relay(nil).Drain(ctx, c)
	require.NoError(t, err)
	require.Equal(t, len(cases), res.Published)
	for id, stored := range ids {
		require.Equal(t, cases[stored], c.meta[id].Get("stagehand-invalid-metadata"), "metadata %s", stored)
		if stored == `{"a": "b"}` {
			require.Equal(t, "b", c.meta[id].Get("a"))
		}
	}
}
