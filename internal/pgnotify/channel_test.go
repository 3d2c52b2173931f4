package pgnotify_test

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/pgnotify"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// Channel names are always whole, valid identifiers: never longer than 63 bytes, never cut inside a UTF-8
// character (a schema of multibyte characters made pg_notify fail with SQLSTATE 22021), and distinct for schemas
// that share a long prefix or suffix.
func TestChannelIsAlwaysValid(t *testing.T) {
	t.Parallel()
	require.Equal(t, "stagehand.acme.events", pgnotify.Channel("acme", "events"))
	seen := map[string]string{}
	for _, schema := range []string{strings.Repeat("€", 20), strings.Repeat("€", 21), strings.Repeat("€", 70),
		"a" + strings.Repeat("€", 20), strings.Repeat("€", 20) + "a", strings.Repeat("x", 63), strings.Repeat("x", 62) + "y"} {
		for _, component := range []string{"events", "outbox", strings.Repeat("c", 70)} {
			ch := pgnotify.Channel(schema, component)
			require.LessOrEqual(t, len(ch), 63, schema)
			require.True(t, utf8.ValidString(ch), schema)
			key := schema + "|" + component
			if other, dup := seen[ch]; dup {
				t.Fatalf("%q and %q share channel %q", other, key, ch)
			}
			seen[ch] = key
		}
	}
}

func TestNotifyOnAMultibyteSchemaChannel(t *testing.T) {
	pgtest.CheckLeaks(t)
	pool := pgtest.Pool(t)
	channel := pgnotify.Channel(strings.Repeat("€", 21)+pgtest.NewSchemaName(t), "events")
	wake, stop := pgnotify.Listen(context.Background(), pool, channel, 50*time.Millisecond, nil)
	defer stop()
	waitWake(t, wake, 5*time.Second)
	_, err := pool.Exec(context.Background(), `SELECT pg_notify($1, '')`, channel)
	require.NoError(t, err)
	waitWake(t, wake, 5*time.Second)
}
