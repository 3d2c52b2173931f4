package staging

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// poolVia opens a pool on the test database through host instead of the address in its URL.
func poolVia(t *testing.T, host string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.Host = host
	cfg.ConnConfig.Fallbacks = nil
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// An event store on 127.0.0.1 and an outbox on localhost are one database: Auto resolves to Transactional, an
// explicit Transactional is accepted, and a save stages in the append's transaction.
func TestOneDatabaseByTwoHostNamesIsTransactional(t *testing.T) {
	t.Parallel()
	e := setup(t)
	require.Equal(t, "127.0.0.1", e.pool.Config().ConnConfig.Host, "the test server's URL names 127.0.0.1")
	ob, err := outbox.New(poolVia(t, "localhost"), &outbox.Config{Schema: e.schema})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ob.Close() })

	st, err := New(e.store, &Config{Outbox: ob, Mapping: e.m})
	require.NoError(t, err)
	require.Equal(t, Transactional, st.Strategy())

	r, st := e.repo(e.store, &Config{Strategy: Transactional, Outbox: ob})
	require.Equal(t, Transactional, st.Strategy())
	_, err = r.Create(context.Background(), orderID(1), func(o *Order) error { o.Place(10); return nil })
	require.NoError(t, err)
	require.Len(t, e.stagedIDs(), 3, "the save's messages are staged")
}

// Two databases on one server share the server's identity but not the database: never one transaction.
func TestTwoDatabasesOnOneServerAreNotOne(t *testing.T) {
	t.Parallel()
	e := setup(t)
	other := otherDatabase(t)
	same, err := samePoolDatabase(e.pool, other)
	require.NoError(t, err)
	require.False(t, same)

	// Reached by another host name too, so the configurations differ in more than the database name.
	cfg := other.Config()
	cfg.ConnConfig.Host, cfg.ConnConfig.Fallbacks = "localhost", nil
	viaLocalhost, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(viaLocalhost.Close)
	same, err = samePoolDatabase(e.pool, viaLocalhost)
	require.NoError(t, err)
	require.False(t, same)
	same, err = samePoolDatabase(other, viaLocalhost)
	require.NoError(t, err)
	require.True(t, same, "the second database by two names is one")

	ob, err := outbox.New(viaLocalhost, &outbox.Config{Schema: e.schema})
	require.NoError(t, err)
	st, err := New(e.store, &Config{Outbox: ob, Mapping: e.m})
	require.NoError(t, err)
	require.Equal(t, EventuallyConsistent, st.Strategy())
	_, err = New(e.store, &Config{Strategy: Transactional, Outbox: ob, Mapping: e.m})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "different databases")
}

// When a database cannot say who it is (here: it does not exist), the stager does not guess that it is the event
// store's: an explicit Transactional fails naming the cause, Auto falls back to EventuallyConsistent.
func TestUnanswerableIdentityIsNotOneDatabase(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.Database = "no_such_database"
	missing, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(missing.Close)
	ob, err := outbox.New(missing, &outbox.Config{Schema: e.schema})
	require.NoError(t, err)

	_, err = New(e.store, &Config{Strategy: Transactional, Outbox: ob, Mapping: e.m})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "could not tell whether their pools reach one database")
	require.ErrorContains(t, err, "no_such_database")
	st, err := New(e.store, &Config{Outbox: ob, Mapping: e.m})
	require.NoError(t, err)
	require.Equal(t, EventuallyConsistent, st.Strategy())
}

// A role that may not read the cluster's system identifier still gets an answer (from the server's start, port
// and database name), and its pool and a privileged pool on the same database are one database.
func TestIdentityWithoutTheSystemIdentifier(t *testing.T) {
	t.Parallel()
	db := otherDatabase(t) // a database of this test's own: the revoke below stays in it
	role := pgtest.NewSchemaName(t)
	admin := pgtest.Pool(t)
	pgtest.Exec(t, admin, "CREATE ROLE "+role+" LOGIN")
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	pgtest.Exec(t, db, "REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC")

	cfg := db.Config()
	cfg.ConnConfig.User, cfg.ConnConfig.Host, cfg.ConnConfig.Fallbacks = role, "localhost", nil
	restricted, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(restricted.Close)
	_, err = restricted.Exec(context.Background(), identityQuery)
	require.ErrorContains(t, err, "permission denied", "the role cannot read the system identifier")

	id, err := identityOf(context.Background(), restricted)
	require.NoError(t, err)
	require.Zero(t, id.system)
	same, err := samePoolDatabase(db, restricted)
	require.NoError(t, err)
	require.True(t, same)
	e := setup(t)
	same, err = samePoolDatabase(e.pool, restricted)
	require.NoError(t, err)
	require.False(t, same, "another database of the same server")
}
