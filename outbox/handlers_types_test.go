package outbox_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/outbox"
)

func TestHandlersTypesListsHandledTypesSorted(t *testing.T) {
	t.Parallel()
	hs := outbox.NewHandlers(nil, false)
	require.Empty(t, hs.Types())
	noop := func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message, struct{}) error { return nil }
	outbox.Handle(hs, "b.second", noop)
	outbox.Handle(hs, "a.first", noop)
	outbox.Handle(hs, "b.second", noop) // replaces, listed once
	require.Equal(t, []string{"a.first", "b.second"}, hs.Types())
}
