package aggregate_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
)

// Load of a stream holding a row the store cannot read (metadata that is not a JSON object, written by another
// tool) returns the typed *eventstore.RecordError naming the stream, version and position; a metadata value that
// is merely not a string loads.
func TestLoadOfACorruptRowIsTyped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := postgresStore(t)
	r := repo(t, store, nil)
	a := r.New("a-1")
	require.NoError(t, a.Open("ann"))
	require.NoError(t, a.Deposit(5))
	require.NoError(t, r.Save(ctx, a))
	events := pgx.Identifier{store.Schema(), "events"}.Sanitize()
	_, err := store.Pool().Exec(ctx, `UPDATE `+events+` SET metadata = '{"retries": 1}' WHERE version = 1`)
	require.NoError(t, err)
	got, err := r.Load(ctx, "a-1")
	require.NoError(t, err)
	require.Equal(t, int64(5), got.Balance)

	_, err = store.Pool().Exec(ctx, `UPDATE `+events+` SET metadata = '"x"' WHERE version = 2`)
	require.NoError(t, err)
	_, err = r.Load(ctx, "a-1")
	require.ErrorIs(t, err, eventstore.ErrCorruptRecord)
	var re *eventstore.RecordError
	require.ErrorAs(t, err, &re)
	require.Equal(t, "a-1", re.Record.StreamID)
	require.Equal(t, int64(2), re.Record.Version)
	require.NotContains(t, err.Error(), "SQLSTATE")
}
