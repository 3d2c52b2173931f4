package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// events partitions: list an unconverted table, convert it with appends already stored, create partitions ahead,
// archive refused (a stream no snapshot covers) then allowed, and list attached and archived partitions.
func TestEventsPartitions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	store := e.store(nil)
	ctx := context.Background()
	for i := range 12 {
		_, err := store.Append(ctx, eventstore.AppendRequest{StreamID: fmt.Sprintf("acc-%d", i), StreamType: "acct",
			Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: "opened", Payload: []byte(`{}`)}}})
		require.NoError(t, err)
	}
	require.Contains(t, e.ok("events", "partitions", "list"), "is not partitioned")

	var conv convertJSON
	e.json(&conv, "events", "partitions", "convert", "--size", "10", "--headroom", "1", "--ahead", "1")
	require.False(t, conv.Already)
	require.Equal(t, "events_p0000000000000000001", conv.First.Name)
	require.Equal(t, int64(21), conv.First.To, "positions 1..12 drawn, plus 1, rounded up to a multiple of 10 + 1")
	require.EqualValues(t, 12, conv.Streams)
	require.EqualValues(t, 12, conv.Events)
	require.Len(t, conv.Created, 1)
	// Again: only partitions ahead (Ahead 2 by default), of the newest partition's size.
	require.Contains(t, e.ok("events", "partitions", "convert"), "already partitioned; created 1 partition(s)")

	seq := pgx.Identifier{e.schema, "events_position_seq"}.Sanitize()
	pgtest.Exec(t, e.pool, `SELECT setval('`+seq+`', 35)`)
	r := e.run("events", "partitions", "list")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stderr, "only 5 positions left", r.stdout)
	require.Contains(t, e.ok("events", "partitions", "create"), "Created 2 partition(s): events_p0000000000000000041, events_p0000000000000000051")

	var list partitionsListJSON
	e.json(&list, "events", "partitions", "list")
	require.True(t, list.Partitioned)
	require.EqualValues(t, 35, list.Drawn)
	require.EqualValues(t, 61, list.End)
	require.EqualValues(t, 25, list.Headroom)
	require.Len(t, list.Attached, 5)
	require.Empty(t, list.Archived)

	e.fails(exitFailure, "12 streams with events in it have no snapshot", "events", "partitions", "archive")
	var arch archiveJSON
	e.json(&arch, "events", "partitions", "archive", "--allow-uncovered", "--to", "detach")
	require.Equal(t, "events_p0000000000000000001", arch.Partition.Name)
	require.Equal(t, "detached", arch.Partition.State)
	require.EqualValues(t, 12, arch.Partition.Events)
	require.EqualValues(t, 12, arch.Uncovered)
	_, err := store.ReadStream(ctx, "", "acc-3", 1)
	require.ErrorIs(t, err, eventstore.ErrArchived)

	text := e.ok("events", "partitions", "list")
	require.Regexp(t, `events_p0000000000000000001\s+1\s+20\s+12\s+.*detached, in schema`, text)
	require.Regexp(t, `events_p0000000000000000021\s+21\s+30\s+~0`, text)

	e.fails(exitUsage, "--after must not be negative", "projection", "rebuild", "p", "--after", "-1")

	e.fails(exitUsage, `--to "later"`, "events", "partitions", "archive", "--to", "later")
	e.fails(exitUsage, "Size", "events", "partitions", "create", "--size", "-3")
	e.fails(exitFailure, "oldest", "events", "partitions", "archive", "--partition", "events_p0000000000000000041")
}
