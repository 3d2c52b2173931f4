package staging

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
)

// A worker that cannot stage an event's messages stops at it with a *WorkerError: a public type that names the
// worker and the event, matches ErrWorkerStopped, unwraps to the mapping's error, and names no internal package.
func TestWorkerStopsWithAPublicError(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	r, _ := e.repo(e.store, &Config{Strategy: Deferred})
	_, err := r.Create(ctx, orderID(1), func(o *Order) error { o.Place(10); return nil })
	require.NoError(t, err)

	bad := errors.New("no topic for this one")
	m := NewMapping(e.reg)
	require.NoError(t, m.MapRaw("broken", "shop.order.placed", func(eventstore.Record) ([]Message, error) {
		return nil, bad
	}))
	w, err := NewDeferredStager(e.store, e.outbox, m, &WorkerConfig{Name: "broken", PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = w.Run(ctx)
	require.ErrorIs(t, err, ErrWorkerStopped)
	require.ErrorIs(t, err, bad)
	var werr *WorkerError
	require.ErrorAs(t, err, &werr)
	require.Equal(t, "stager:broken", werr.Worker)
	require.Equal(t, "shop.order.placed", werr.Record.Type)
	require.True(t, strings.HasPrefix(err.Error(), "staging: stager:broken stopped: event "), err.Error())
	require.NotContains(t, err.Error(), "logfollow")
}

// An invalid worker setting is a staging configuration error naming the field, in the package's own words.
func TestWorkerConfigErrorNamesTheField(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := NewReconciler(e.store, e.outbox, e.m, &WorkerConfig{BatchSize: 10001})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "staging: invalid configuration: reconciler:default: BatchSize")
	require.Equal(t, 1, strings.Count(err.Error(), "invalid configuration"), err.Error())
}
