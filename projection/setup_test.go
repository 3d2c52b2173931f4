package projection_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/projection"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helperMain(mode))
	}
	pgtest.Main(m)
}

// The test domain: bank accounts.
type Opened struct{ Owner string }
type Deposited struct{ Amount int64 }
type Withdrawn struct{ Amount int64 }

func registry() *aggregate.Registry {
	reg := aggregate.NewRegistry(nil)
	_ = aggregate.RegisterEvent[Opened](reg, "account.opened")
	_ = aggregate.RegisterEvent[Deposited](reg, "account.deposited")
	_ = aggregate.RegisterEvent[Withdrawn](reg, "account.withdrawn")
	return reg
}

type world struct {
	pool   *pgxpool.Pool
	schema string
	store  *eventstore.PostgresStore
	reg    *aggregate.Registry
}

func setup(t testing.TB) world {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	return worldOn(t, pool, schema)
}

func worldOn(t testing.TB, pool *pgxpool.Pool, schema string) world {
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema,
		MaxGapWait: 500 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	w := world{pool, schema, store, registry()}
	for _, prefix := range []string{"rm", "ref"} {
		createModel(t, pool, schema, prefix)
	}
	return w
}

// createModel creates a read model: one row per account, and one row per applied event (no unique key, so a
// double application shows up as two rows instead of an error).
func createModel(t testing.TB, pool *pgxpool.Pool, schema, prefix string) {
	_, err := pool.Exec(context.Background(), `CREATE TABLE IF NOT EXISTS `+pgtest.Q(schema, prefix+"_accounts")+` (
			tenant text, id text, owner text, balance bigint, events int, version bigint,
			PRIMARY KEY (tenant, id));
		CREATE TABLE IF NOT EXISTS `+pgtest.Q(schema, prefix+"_applied")+` (position bigint, by text)`)
	require.NoError(t, err)
}

// model is the projection's handler: an account list whose rows must receive each stream's events in version
// order, without gaps or repeats (the UPDATE checks the previous version), plus the applied log.
type model struct {
	schema, prefix, by string
	reg                *aggregate.Registry
	// fail, when set, makes the handler fail on the events it returns an error for.
	fail func(e projection.Event) error
	// hook runs after the event's writes, still in the transaction.
	hook func(ctx context.Context, tx pgx.Tx, e projection.Event) error
}

func (m *model) t(name string) string { return pgtest.Q(m.schema, m.prefix+"_"+name) }

func (m *model) mux() *projection.Mux {
	mux := projection.NewMux(m.reg)
	must(projection.On(mux, func(ctx context.Context, tx pgx.Tx, e projection.Event, d Opened) error {
		return m.apply(ctx, tx, e, func() (string, []any) {
			return `INSERT INTO ` + m.t("accounts") + ` VALUES ($1, $2, $3, 0, 1, $4)`,
				[]any{e.Tenant, e.StreamID, d.Owner, e.Version}
		})
	}))
	must(projection.On(mux, func(ctx context.Context, tx pgx.Tx, e projection.Event, d Deposited) error {
		return m.apply(ctx, tx, e, m.move(e, d.Amount))
	}))
	must(projection.On(mux, func(ctx context.Context, tx pgx.Tx, e projection.Event, d Withdrawn) error {
		return m.apply(ctx, tx, e, m.move(e, -d.Amount))
	}))
	mux.OnReset(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `TRUNCATE `+m.t("accounts")+`, `+m.t("applied"))
		return err
	})
	return mux
}

func (m *model) move(e projection.Event, amount int64) func() (string, []any) {
	return func() (string, []any) {
		return `UPDATE ` + m.t("accounts") + ` SET balance = balance + $3, events = events + 1, version = $4
			WHERE tenant = $1 AND id = $2 AND version = $4 - 1`, []any{e.Tenant, e.StreamID, amount, e.Version}
	}
}

func (m *model) apply(ctx context.Context, tx pgx.Tx, e projection.Event, q func() (string, []any)) error {
	if m.fail != nil {
		if err := m.fail(e); err != nil {
			return err
		}
	}
	sql, args := q()
	tag, err := tx.Exec(ctx, sql, args...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("order violated: %s version %d does not follow the stored version", e.StreamID,
			e.Version)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+m.t("applied")+` VALUES ($1, $2)`, e.Position, m.by); err != nil {
		return err
	}
	if m.hook != nil {
		return m.hook(ctx, tx, e)
	}
	return nil
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func (w world) model(prefix string) *model {
	return &model{schema: w.schema, prefix: prefix, by: "test", reg: w.reg}
}

// open appends an account's first event; deposit appends deposits of 1..n (amount i at version i+1).
func (w world) open(t testing.TB, store eventstore.Store, id string) {
	t.Helper()
	w.appendEvents(t, store, id, eventstore.NoStream, Opened{Owner: "owner-" + id})
}

func (w world) appendEvents(t testing.TB, store eventstore.Store, id string, expected eventstore.ExpectedVersion,
	events ...any) {
	t.Helper()
	_, err := store.Append(context.Background(), w.request(t, id, expected, events...))
	require.NoError(t, err)
}

func (w world) request(t testing.TB, id string, expected eventstore.ExpectedVersion,
	events ...any) eventstore.AppendRequest {
	req := eventstore.AppendRequest{StreamID: id, StreamType: "account", Expected: expected}
	for _, e := range events {
		name, version, payload, err := w.reg.Encode(e)
		require.NoError(t, err)
		req.Events = append(req.Events, eventstore.EventData{Type: name, TypeVersion: version, Payload: payload})
	}
	return req
}

// seed opens accounts a0..a(n-1) and gives each deposits events, interleaved across accounts.
func (w world) seed(t testing.TB, store eventstore.Store, accounts, deposits int) {
	t.Helper()
	for i := range accounts {
		w.open(t, store, fmt.Sprintf("a%d", i))
	}
	for d := range deposits {
		for i := range accounts {
			w.appendEvents(t, store, fmt.Sprintf("a%d", i), eventstore.AnyVersion, Deposited{Amount: int64(d + 1)})
		}
	}
}

func (w world) newProjection(t testing.TB, h projection.Handler, cfg projection.Config) *projection.Projection {
	t.Helper()
	cfg.Schema = w.schema
	if cfg.Name == "" {
		cfg.Name = "accounts"
	}
	if cfg.LeaseTTL == 0 {
		// Long enough that no renewal is late on a loaded machine; takeovers in the tests follow a release.
		cfg.LeaseTTL, cfg.LeaseAcquireInterval = 5*time.Second, 20*time.Millisecond
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = time.Millisecond
	}
	p, err := projection.New(w.pool, w.store, h, &cfg)
	require.NoError(t, err)
	return p
}

// start runs p until the test ends; stop ends it and returns Run's result.
func start(t testing.TB, p interface{ Run(context.Context) error }) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				err = errors.New("Run did not return after its context ended")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func (w world) count(t testing.TB, sql string, args ...any) int64 {
	return pgtest.Count(t, w.pool, sql, args...)
}

func (w world) applied(t testing.TB, prefix string) int64 {
	return w.count(t, `SELECT count(*) FROM `+pgtest.Q(w.schema, prefix+"_applied"))
}

// requireOnce checks that the read model applied exactly the events at positions, each once.
func (w world) requireOnce(t testing.TB, prefix string, positions []int64) {
	t.Helper()
	var got []int64
	rows, err := w.pool.Query(context.Background(), `SELECT position FROM `+pgtest.Q(w.schema, prefix+"_applied")+
		` ORDER BY position`)
	require.NoError(t, err)
	got, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, positions, got, "every committed event applied exactly once")
}

// logPositions returns every committed position (straight from the events table: the test's ground truth).
func (w world) logPositions(t testing.TB) []int64 {
	rows, err := w.pool.Query(context.Background(), `SELECT position FROM `+pgtest.Q(w.schema, "events")+
		` ORDER BY position`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return out
}

// snapshot renders a read model's account rows.
func (w world) snapshot(t testing.TB, prefix string) string {
	t.Helper()
	rows, err := w.pool.Query(context.Background(), `SELECT tenant, id, owner, balance, events, version FROM `+
		pgtest.Q(w.schema, prefix+"_accounts")+` ORDER BY tenant, id`)
	require.NoError(t, err)
	var b strings.Builder
	for rows.Next() {
		vals, err := rows.Values()
		require.NoError(t, err)
		fmt.Fprintln(&b, vals...)
	}
	require.NoError(t, rows.Err())
	return b.String()
}

func status(t testing.TB, p *projection.Projection) projection.Status {
	t.Helper()
	st, err := p.Status(context.Background())
	require.NoError(t, err)
	if len(st) == 0 {
		return projection.Status{}
	}
	return st[0]
}

func caughtUp(t testing.TB, w world, p *projection.Projection) func() bool {
	return func() bool {
		head, err := w.store.HeadPosition(context.Background())
		require.NoError(t, err)
		st, err := p.Status(context.Background())
		require.NoError(t, err)
		// A partition's checkpoint appears when its worker first runs: until every partition has one, those
		// listed being at the head says nothing about the others.
		if len(st) == 0 || len(st) < st[0].Partitions {
			return false
		}
		for _, s := range st {
			if s.Position < head || s.Rebuilding {
				return false
			}
		}
		return true
	}
}
