package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
)

// streams archive and delete ask for confirmation (--yes, or the stream ID typed on a terminal), then archive or
// delete the stream; show reports its lifecycle.
func TestStreamsArchiveAndDelete(t *testing.T) {
	t.Parallel()
	e := setup(t)
	store := e.store(nil)
	ctx := context.Background()
	for _, id := range []string{"old", "gone"} {
		_, err := store.Append(ctx, eventstore.AppendRequest{StreamID: id, StreamType: "bank.account",
			Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: "opened", Payload: []byte(`{}`)}}})
		require.NoError(t, err)
	}
	e.fails(exitUsage, "pass --yes to confirm", "streams", "archive", "old")
	e.fails(exitUsage, "--reason is required", "streams", "delete", "gone", "--yes")
	lc, err := store.Lifecycle(ctx, "", "old")
	require.NoError(t, err)
	require.Equal(t, eventstore.StreamActive, lc.State, "nothing changed without confirmation")

	// On a terminal, a wrong answer cancels; the stream ID confirms.
	term := func(answer string, args ...string) result {
		c, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		return invoke(c, options{stdin: strings.NewReader(answer + "\n"),
			isInputTerminal: func(io.Reader) bool { return true }},
			e.args(args...)...)
	}
	r := term("nope", "streams", "delete", "gone", "--reason", "erasure")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "Type the stream ID to confirm")
	require.Contains(t, r.stderr, "not confirmed")
	lc, err = store.Lifecycle(ctx, "", "gone")
	require.NoError(t, err)
	require.Equal(t, eventstore.StreamActive, lc.State)

	out := e.ok("streams", "archive", "old", "--yes", "--actor", "jane")
	require.Contains(t, out, "Stream old (tenant -, type bank.account): archived at version 1")
	require.Contains(t, out, "by jane")
	r = term("gone", "streams", "delete", "gone", "--reason", "erasure request 7", "--actor", "dpo")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "deleted at version 1")

	var js struct {
		State    string `json:"state"`
		Reason   string `json:"reason"`
		Events   int64  `json:"events"`
		StreamID string `json:"stream_id"`
	}
	e.json(&js, "streams", "show", "gone")
	require.Equal(t, "deleted", js.State)
	require.Equal(t, "erasure request 7", js.Reason)
	require.Equal(t, int64(1), js.Events)
	_, err = store.ReadStream(ctx, "", "gone", 1)
	require.ErrorIs(t, err, eventstore.ErrStreamDeleted)
	e.fails(exitFailure, "was deleted", "streams", "delete", "gone", "--reason", "again", "--yes")
	e.fails(exitFailure, "is archived", "streams", "archive", "old", "--yes")
	e.fails(exitFailure, "stream not found", "streams", "show", "nope")
}
