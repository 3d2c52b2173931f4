package main

import (
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// Usage errors exit 2 with one line naming the problem and the help to read, and touch no database (none is
// configured here).
func TestUsageErrorsExitTwo(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `unknown command "bogus" for "stagehand"`},
		{[]string{"outbox", "bogus"}, `unknown command "bogus" for "stagehand outbox"`},
		{[]string{"outbox"}, "missing command: one of cleanup, dead, maintenance, stats"},
		{[]string{"outbox", "dead"}, "missing command"},
		{[]string{}, "missing command"},
		{[]string{"outbox", "stats", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"migrate", "up", "--tenant", "a"}, "unknown flag: --tenant"},
		{[]string{"outbox", "dead", "show"}, "accepts 1 arg(s), received 0"},
		{[]string{"outbox", "dead", "discard"}, "requires at least 1 arg(s)"},
		{[]string{"outbox", "dead", "redrive"}, "give at least one message ID, or --all"},
		{[]string{"outbox", "dead", "redrive", "x", "--all"}, "not both"},
		{[]string{"outbox", "cleanup"}, "--older-than is required"},
		{[]string{"outbox", "cleanup", "--older-than", "soon"}, `--older-than "soon": not a duration`},
		{[]string{"outbox", "cleanup", "--older-than", "-1h"}, "must not be negative"},
		{[]string{"outbox", "cleanup", "--older-than", "1d", "--batch-size", "0"}, "--batch-size"},
		{[]string{"inbox", "cleanup", "--older-than", "0s"}, "--older-than must be positive"},
		{[]string{"projection", "rebuild"}, "accepts 1 arg(s), received 0"},
		{[]string{"projection", "parked", "replay", "abc"}, `"abc" is not a parked event ID`},
		{[]string{"projection", "parked", "replay"}, "--projection NAME"},
		{[]string{"events", "tail", "--limit", "-1"}, "--limit must not be negative"},
		{[]string{"events", "tail", "--poll-interval", "1ms"}, "--poll-interval"},
		{[]string{"events", "stream", "a", "--from-version", "0"}, "--from-version"},
		{[]string{"events", "tail", "--follow=maybe"}, "invalid argument"},
	}
	for _, c := range cases {
		r := invoke(context.Background(), options{}, c.args...)
		requireFailure(t, r, exitUsage, c.want)
		require.Contains(t, r.stderr, "--help')", "stagehand %v", c.args)
		require.Empty(t, r.stdout, "stagehand %v", c.args)
	}
}

// With neither --database-url nor DATABASE_URL the CLI says so; DATABASE_URL alone is enough.
func TestDatabaseURLFromFlagOrEnvironment(t *testing.T) {
	t.Parallel()
	r := invoke(context.Background(), options{}, "migrate", "status")
	requireFailure(t, r, exitUsage, "no database: pass --database-url or set DATABASE_URL")

	url := pgtest.URL(t)
	_, schema := pgtest.Migrated(t)
	env := func(k string) string {
		if k == envDatabaseURL {
			return url
		}
		return ""
	}
	r = invoke(context.Background(), options{getenv: env}, "migrate", "status", "--schema", schema)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "0 pending")
}

// A database that cannot be reached is a runtime failure (exit 1) with a clear message; a URL that cannot be
// parsed is a usage error (exit 2).
func TestWrongDatabaseURL(t *testing.T) {
	t.Parallel()
	r := invoke(context.Background(), options{}, "outbox", "stats", "--database-url",
		"postgres://nobody:secret@127.0.0.1:1/none?connect_timeout=5")
	requireFailure(t, r, exitFailure, "cannot connect to the database")
	require.NotContains(t, r.stderr, "secret", "the password is never printed")

	r = invoke(context.Background(), options{}, "outbox", "stats", "--database-url", "postgres://a:b@host:notaport/x")
	requireFailure(t, r, exitUsage, "invalid database URL")
	require.NotContains(t, r.stderr, ":b@", "the password is never printed")
}

// A schema that was never migrated gives a hint to migrate it.
func TestUnmigratedSchemaHint(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Schema(t)
	r := invoke(context.Background(), options{}, "outbox", "stats", "--database-url", pgtest.URL(t), "--schema",
		schema)
	requireFailure(t, r, exitFailure, "run 'stagehand migrate up --schema "+schema+"'")
}

// A schema every constructor refuses (longer than PostgreSQL keeps, a NUL byte) is a usage error naming --schema,
// before anything reaches the database, for every command alike.
func TestInvalidSchemaIsAUsageError(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	for _, schema := range []string{strings.Repeat("s", 64), "a\x00b"} {
		for _, cmd := range [][]string{{"migrate", "up"}, {"migrate", "status"}, {"outbox", "stats"},
			{"projection", "status"}, {"worker", "status"}} {
			args := append(append([]string{}, cmd...), "--database-url", url, "--schema", schema)
			r := invoke(context.Background(), options{}, args...)
			requireFailure(t, r, exitUsage, "--schema ")
		}
	}
}

// A projection or worker name the library refuses (not storable text) is a usage error too, as every constructor
// and function refuses it with stagehand.ErrInvalidConfig.
func TestInvalidNameIsAUsageError(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := invoke(context.Background(), options{}, e.args("projection", "parked", "list", "bad\tname")...)
	requireFailure(t, r, exitUsage, "control character")
}

// Every command answers --help with exit 0, and every command that does something shows an example.
func TestHelpOnEveryCommand(t *testing.T) {
	t.Parallel()
	a := &app{}
	var walk func(c *cobra.Command, path []string)
	count := 0
	walk = func(c *cobra.Command, path []string) {
		if c.Name() == "help" {
			return
		}
		count++
		r := invoke(context.Background(), options{}, append(path, "--help")...)
		require.Equal(t, exitOK, r.code, "stagehand %v --help: %s", path, r.stderr)
		require.Contains(t, r.stdout, "Usage:", "stagehand %v --help", path)
		if !c.HasSubCommands() {
			require.NotEmpty(t, c.Example, "stagehand %v has no example", path)
			require.Contains(t, r.stdout, "Examples:", "stagehand %v --help", path)
		}
		for _, sub := range c.Commands() {
			walk(sub, append(append([]string(nil), path...), sub.Name()))
		}
	}
	walk(a.rootCommand(), nil)
	require.GreaterOrEqual(t, count, 20, "commands walked")
}

// migrate up applies everything once; a second run is a no-op; migrate status shows them applied.
func TestMigrateUpTwiceAndStatus(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Schema(t)
	e := &env{t: t, schema: schema, url: pgtest.URL(t)}

	type migration struct {
		Version int    `json:"version"`
		Name    string `json:"name"`
		Applied bool   `json:"applied"`
	}
	var status struct {
		Schema     string      `json:"schema"`
		Migrations []migration `json:"migrations"`
		Pending    int         `json:"pending"`
	}
	e.json(&status, "migrate", "status")
	require.Equal(t, schema, status.Schema)
	require.NotEmpty(t, status.Migrations)
	require.Equal(t, len(status.Migrations), status.Pending, "nothing applied to a new schema")

	var up struct {
		Applied  []migration `json:"applied"`
		UpToDate bool        `json:"up_to_date"`
		Total    int         `json:"total"`
	}
	e.json(&up, "migrate", "up")
	require.Len(t, up.Applied, len(status.Migrations))
	require.False(t, up.UpToDate)
	require.Equal(t, status.Migrations[0].Name, up.Applied[0].Name)

	e.json(&up, "migrate", "up")
	require.Empty(t, up.Applied, "the second run applies nothing")
	require.True(t, up.UpToDate)
	require.Contains(t, e.ok("migrate", "up"), "is up to date")

	e.json(&status, "migrate", "status")
	require.Zero(t, status.Pending)
	for _, m := range status.Migrations {
		require.True(t, m.Applied, "%03d_%s", m.Version, m.Name)
	}
	human := e.ok("migrate", "status")
	require.Contains(t, human, "VERSION")
	require.Contains(t, human, status.Migrations[0].Name)
	require.Contains(t, human, "applied, 0 pending")
	require.Equal(t, len(status.Migrations), strings.Count(human, " applied "), human)
}
