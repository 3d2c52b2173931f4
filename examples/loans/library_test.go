package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/stagehandtest"
)

func TestMain(m *testing.M) { stagehandtest.Main(m) }

// The demo runs to completion: two loans open, one reminder, a clean stop.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), &out, stagehandtest.URL(t), stagehandtest.SchemaName(t))
	require.NoError(t, err, out.String())
	require.Contains(t, out.String(), "open: ann has Dune")
	require.Contains(t, out.String(), "open: ann has Emma")
	require.NotContains(t, out.String(), "open: bob")
	require.Contains(t, out.String(), "reminded: [ann]")
	require.Contains(t, out.String(), "stopped cleanly")
}

// startLibrary runs the service on a migrated test schema until the test ends.
func startLibrary(t *testing.T) *Library {
	t.Helper()
	pool, schema := stagehandtest.Migrated(t)
	ctx := context.Background()
	require.NoError(t, createReadModel(ctx, pool))
	lib, err := Open(pool, schema, newBroker(nil), nil)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- lib.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
		lib.Close()
	})
	return lib
}

// A member's first loan creates the member (in the handler's transaction); the fourth is refused by the member,
// and the read model shows what is open.
func TestMembersFollowTheirLoans(t *testing.T) {
	lib := startLibrary(t)
	ctx := context.Background()
	later := time.Now().Add(time.Hour)
	var loans []string
	for _, book := range []string{"Dune", "Emma", "Ulysses"} {
		id, err := lib.Lend(ctx, "cy", book, later)
		require.NoError(t, err)
		loans = append(loans, id)
	}
	require.NoError(t, lib.Return(ctx, loans[1]))

	// Everything staged so far is sent and handled by the members handler, and the read model is up to date.
	// (The reminders are scheduled an hour ahead: not due, not waited for.)
	stagehandtest.WaitIdle(t, lib.store.Pool(), lib.schema, &stagehandtest.IdleConfig{
		Handlers: map[string][]string{TopicLoans: {"members"}},
	})
	m, err := lib.members.Load(ctx, "cy")
	require.NoError(t, err)
	require.ElementsMatch(t, []string{loans[0], loans[2]}, m.OnLoan)
	open, err := lib.OpenLoans(ctx)
	require.NoError(t, err)
	require.Len(t, open, 2)
}
