package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/migrate"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// Statement templates are expanded in one pass, so a schema name holding a template marker is quoted and used as
// it is: a relay in every mode (fenced, partitioned) on schema "<name>{partition}" drains that schema, never the
// schema "<name>", and a schema such as "x{fence,}y" is never split out of its quotes.
func TestSchemaNamesHoldingTemplateMarkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	base := pgtest.NewSchemaName(t)[:20]
	plain := setupSchema(t, pool, base)
	_, err := plain.Stage(ctx, outbox.Message{ID: "plain-1", Topic: "t", PartitionKey: "k"})
	require.NoError(t, err)
	for _, marker := range []string{"{partition}", "{fence,}", "{with fence}", "{fenced}", "{takeover}",
		"{outbox}", "{dead}", "{dedup one}", "{dedup many}"} {
		name := base + marker + "x"
		ob := setupSchema(t, pool, name)
		e := &env{t: t, pool: pool, schema: name, ob: ob}
		n, err := ob.Stage(ctx, outbox.Message{ID: "hostile-1", Topic: "t", PartitionKey: "k"},
			outbox.Message{ID: "hostile-2", Topic: "t", PartitionKey: "k"}, outbox.Message{ID: "hostile-3", Topic: "t"})
		require.NoError(t, err, "schema %q", name)
		require.Equal(t, 3, n)
		for _, mode := range []func(*outbox.RelayConfig){
			nil,
			func(c *outbox.RelayConfig) { c.Partitions = 2 },
			func(c *outbox.RelayConfig) { c.LeaderElection = "hostile"; c.LeaderTTL = time.Second; c.Partitions = 2 },
		} {
			b := newBroker()
			_, err := e.relay(mode).Drain(ctx, b)
			require.NoError(t, err, "schema %q", name)
			for _, p := range b.snapshot() {
				require.NotEqual(t, "plain-1", p.id, "a relay on schema %q published schema %q's message", name, base)
			}
		}
		require.Zero(t, e.count("outbox"), "schema %q kept messages pending", name)
		require.Equal(t, int64(3), e.count("outbox_sent"))
	}
	require.Equal(t, int64(1), (&env{t: t, pool: pool, schema: base}).count("outbox"),
		"schema %q's message was touched by a relay of another schema", base)
}

// setupSchema migrates schema on pool and returns an outbox on it, dropped when the test ends.
func setupSchema(t *testing.T, pool migrate.Beginner, schema string) *outbox.Outbox {
	t.Helper()
	_, err := migrate.Up(context.Background(), pool, schema, nil)
	require.NoError(t, err, "migrate %q", schema)
	p := pgtest.Pool(t)
	t.Cleanup(func() { pgtest.DropSchema(t, p, schema) })
	ob, err := outbox.New(p, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ob.Close() })
	return ob
}
