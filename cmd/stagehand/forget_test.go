package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/shred"
)

// forget deletes every key of the subjects named, records who and why, and the data they encrypted reads as
// redacted from then on; another subject's keys stay.
func TestForget(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	keys, err := shred.NewPostgresKeyStore(e.pool, &shred.PostgresConfig{Schema: e.schema})
	require.NoError(t, err)
	codec, err := shred.NewCodec(keys, &shred.CodecConfig{CacheTTL: -1}) // another process's view, uncached
	require.NoError(t, err)
	type profile struct {
		ID    string
		Email string `stagehand:"pii,subject=ID"`
	}
	data := map[string][]byte{}
	for _, id := range []string{"c-1", "c-2", "c-3"} {
		data[id], err = codec.Marshal(profile{ID: id, Email: id + "@example.com"})
		require.NoError(t, err)
	}
	_, err = keys.Rotate(ctx, "c-1", shred.Audit{})
	require.NoError(t, err)
	email := func(id string) string {
		var p profile
		require.NoError(t, codec.Unmarshal(data[id], &p))
		return p.Email
	}

	require.Equal(t, "Forgot subject c-1: deleted key version(s) 1, 2; recorded in the audit.\n",
		e.ok("forget", "--subject", "c-1", "--reason", "erasure request 118"))
	require.Equal(t, shred.Redacted, email("c-1"))
	require.Equal(t, "c-2@example.com", email("c-2"))
	hist, err := keys.History(ctx, "c-1")
	require.NoError(t, err)
	require.Len(t, hist, 2)
	require.Equal(t, "forget", hist[1].Action)
	require.Equal(t, []int{1, 2}, hist[1].Versions)
	require.Equal(t, "stagehand-cli", hist[1].Actor)
	require.Equal(t, "erasure request 118", hist[1].Reason)

	var out []struct {
		Schema   string `json:"schema"`
		Subject  string `json:"subject"`
		Versions []int  `json:"versions"`
		Actor    string `json:"actor"`
		Reason   string `json:"reason"`
	}
	e.json(&out, "forget", "--subject", "c-3", "--subject", "never-seen", "--actor", "dpo")
	require.Len(t, out, 2)
	require.Equal(t, "c-3", out[0].Subject)
	require.Equal(t, []int{1}, out[0].Versions)
	require.Equal(t, "dpo", out[0].Actor)
	require.Equal(t, e.schema, out[0].Schema)
	require.Equal(t, "never-seen", out[1].Subject)
	require.Empty(t, out[1].Versions)
	require.Equal(t, shred.Redacted, email("c-3"))
	require.Equal(t, "c-2@example.com", email("c-2"))
	hist, err = keys.History(ctx, "never-seen")
	require.NoError(t, err)
	require.Len(t, hist, 1, "a subject without keys is recorded as forgotten")

	e.fails(exitUsage, "--subject is required", "forget")
	e.fails(exitUsage, "invalid subject", "forget", "--subject", "")
	e.fails(exitUsage, "unknown command", "forget", "c-1")
}
