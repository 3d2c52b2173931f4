package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
)

// snapshots drop deletes the named streams' snapshots of one tenant, reports IDs without one and then fails.
func TestSnapshotsDrop(t *testing.T) {
	t.Parallel()
	e := setup(t)
	store := e.store(nil)
	ctx := context.Background()
	save := func(tenant, id string) {
		require.NoError(t, store.SaveSnapshot(ctx, eventstore.Snapshot{Tenant: tenant, StreamID: id,
			StreamType: "bank.account", Version: 3, SchemaVersion: 1, Payload: []byte("{}")}))
	}
	save("", "acc-1")
	save("", "acc-2")
	save("acme", "acc-1")

	require.Equal(t, "Dropped 1 snapshot(s) (tenant -).\n", e.ok("snapshots", "drop", "acc-1"))
	_, err := store.LoadSnapshot(ctx, "", "acc-1")
	require.ErrorIs(t, err, eventstore.ErrSnapshotNotFound)
	_, err = store.LoadSnapshot(ctx, "acme", "acc-1")
	require.NoError(t, err, "another tenant's snapshot of the same ID stays")

	var out struct {
		Schema    string   `json:"schema"`
		Tenant    string   `json:"tenant"`
		StreamIDs []string `json:"stream_ids"`
		Count     int      `json:"count"`
		Unknown   []string `json:"unknown"`
	}
	e.json(&out, "snapshots", "drop", "acc-1", "--tenant", "acme")
	require.Equal(t, e.schema, out.Schema)
	require.Equal(t, "acme", out.Tenant)
	require.Equal(t, []string{"acc-1"}, out.StreamIDs)
	require.Equal(t, 1, out.Count)
	require.Empty(t, out.Unknown)
	_, err = store.LoadSnapshot(ctx, "acme", "acc-1")
	require.ErrorIs(t, err, eventstore.ErrSnapshotNotFound)

	r := e.fails(exitFailure, "no snapshot of stream acc-1, acc-9 (tenant -); the others were dropped",
		"snapshots", "drop", "acc-9", "acc-2", "acc-1")
	require.Equal(t, "Dropped 1 snapshot(s) (tenant -).\n", r.stdout)
	_, err = store.LoadSnapshot(ctx, "", "acc-2")
	require.ErrorIs(t, err, eventstore.ErrSnapshotNotFound, "the known ID was dropped")

	e.fails(exitUsage, "requires at least 1 arg", "snapshots", "drop")
	e.fails(exitUsage, "missing command", "snapshots")
}
