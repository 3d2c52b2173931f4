package stagehandtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/stagehandtest"
	"github.com/stagehand-es/stagehand/staging"
)

// Migrated's pool resolves unqualified names in the test's schema: two tests creating the same read-model table
// do not collide, and nothing lands in public.
func TestMigratedPoolKeepsUnqualifiedTablesInTheTestSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schemas := make(chan string, 2)
	t.Run("group", func(t *testing.T) {
		for _, name := range []string{"a", "b"} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				pool, schema := stagehandtest.Migrated(t)
				schemas <- schema
				_, err := pool.Exec(ctx, `CREATE TABLE loans_view (id text PRIMARY KEY)`)
				require.NoError(t, err, "an unqualified table of the same name in each test")
				_, err = pool.Exec(ctx, `INSERT INTO loans_view VALUES ($1)`, name)
				require.NoError(t, err)
				var where string
				require.NoError(t, pool.QueryRow(ctx, `SELECT table_schema FROM information_schema.tables
					WHERE table_name = 'loans_view' AND table_schema = $1`, schema).Scan(&where))
				var ids []string
				rows, err := pool.Query(ctx, `SELECT id FROM loans_view`)
				require.NoError(t, err)
				ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
				require.NoError(t, err)
				require.Equal(t, []string{name}, ids, "each test sees its own table only")
			})
		}
	})
	close(schemas)
	pool := stagehandtest.Pool(t)
	var inPublic int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables
		WHERE table_name = 'loans_view' AND table_schema = 'public'`).Scan(&inPublic))
	require.Zero(t, inPublic, "nothing lands in public")
	for schema := range schemas {
		var left int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.schemata
			WHERE schema_name = $1`, schema).Scan(&left))
		require.Zero(t, left, "schema %s is dropped, with the table, when its test ends", schema)
	}
}

// The test domain: loans opened.
type LoanOpened struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
}

// pipeline is a user's service as a test wires it: events appended to the store, a projection writing a read
// model, a Deferred stager mapping events to messages, a relay publishing them to a gochannel broker, and an
// inbox-wrapped consumer. The projection and the consumer are slow, so a test that did not wait would see them
// behind.
type pipeline struct {
	pool   *pgxpool.Pool
	schema string
	store  *eventstore.PostgresStore
	ob     *outbox.Outbox
	reg    *aggregate.Registry
}

func newPipeline(t *testing.T) *pipeline {
	t.Helper()
	ctx := context.Background()
	pool, schema := stagehandtest.Migrated(t)
	_, err := pool.Exec(ctx, `CREATE TABLE loans_view (id text PRIMARY KEY, amount bigint);
		CREATE TABLE notified (id text PRIMARY KEY)`)
	require.NoError(t, err)
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ob.Close() })
	reg := aggregate.NewRegistry(nil)
	require.NoError(t, aggregate.RegisterEvent[LoanOpened](reg, "loan.opened"))
	return &pipeline{pool: pool, schema: schema, store: store, ob: ob, reg: reg}
}

// run starts every component until the test ends.
func (p *pipeline) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	goRun := func(run func(context.Context) error) {
		wg.Add(1)
		go func() { defer wg.Done(); _ = run(ctx) }()
	}

	view := projection.HandlerFunc(func(ctx context.Context, tx pgx.Tx, e projection.Event) error {
		time.Sleep(20 * time.Millisecond)
		var o LoanOpened
		if err := json.Unmarshal(e.Payload, &o); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO loans_view VALUES ($1, $2)`, o.ID, o.Amount)
		return err
	})
	proj, err := projection.New(p.pool, p.store, view, &projection.Config{Name: "loans", Schema: p.schema,
		BatchSize: 1})
	require.NoError(t, err)
	goRun(proj.Run)
	// A projection whose filter leaves every event out still reaches the head.
	none, err := projection.New(p.pool, p.store, view, &projection.Config{Name: "filtered", Schema: p.schema,
		EventTypes: []string{"loan.closed"}})
	require.NoError(t, err)
	goRun(none.Run)

	m := staging.NewMapping(p.reg)
	require.NoError(t, staging.Map(m, "loan.opened", func(_ eventstore.Record, e LoanOpened) ([]staging.Message,
		error) {
		return []staging.Message{{Topic: "loans", Type: "loan.opened", Payload: e}}, nil
	}))
	stager, err := staging.NewDeferredStager(p.store, p.ob, m, nil)
	require.NoError(t, err)
	goRun(stager.Run)

	relay, err := p.ob.NewRelay(&outbox.RelayConfig{PollingInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = relay.Close() })
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	t.Cleanup(func() { _ = broker.Close() })
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, nil)
	require.NoError(t, err)
	relay.AddToRouter(router, broker, nil)
	inbox, err := p.ob.NewInbox(nil)
	require.NoError(t, err)
	router.AddConsumerHandler("notify", "loans", broker, inbox.Handler("notify",
		func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher, msg *message.Message) error {
			time.Sleep(20 * time.Millisecond)
			var o LoanOpened
			if err := json.Unmarshal(msg.Payload, &o); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO notified VALUES ($1)`, o.ID)
			return err
		}))
	goRun(router.Run)
	t.Cleanup(func() { _ = router.Close() })
	select {
	case <-router.Running():
	case <-time.After(20 * time.Second):
		t.Fatal("the router did not start")
	}
}

func (p *pipeline) open(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		name, version, payload, err := p.reg.Encode(LoanOpened{ID: id, Amount: 100})
		require.NoError(t, err)
		_, err = p.store.Append(context.Background(), eventstore.AppendRequest{StreamID: id, StreamType: "loan",
			Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: name, TypeVersion: version,
				Payload: payload}}})
		require.NoError(t, err)
	}
}

func (p *pipeline) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, p.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n))
	return n
}

// WaitIdle returns once the projection has applied every event appended before the call, the stager has staged
// their messages, the relay has sent them and the named consumer has handled each: the test reads the results at
// once, without polling.
func TestWaitIdleWaitsForTheWholePipeline(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	p.run(t)
	for round := range 2 {
		ids := make([]string, 8)
		for i := range ids {
			ids[i] = fmt.Sprintf("loan-%d-%d", round, i)
		}
		p.open(t, ids...)
		stagehandtest.WaitIdle(t, p.pool, p.schema, &stagehandtest.IdleConfig{
			Handlers: map[string][]string{"loans": {"notify"}}, Followers: []string{"loans", "filtered", "stager:default"},
			Timeout: 30 * time.Second})
		require.Equal(t, 8*(round+1), p.count(t, "loans_view"), "the read model is up to date")
		require.Equal(t, 8*(round+1), p.count(t, "notified"), "every message is handled")
	}
}

// recordingTB records WaitIdle's failure instead of ending the test.
type recordingTB struct {
	testing.TB
	failed bool
	msg    string
}

func (r *recordingTB) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
}

// A message no relay sends keeps WaitIdle waiting; at its timeout it fails naming the message, its topic and type.
func TestWaitIdleFailsOnAPendingMessage(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	_, err := p.ob.Stage(context.Background(), outbox.Message{ID: "stuck-1", Topic: "loans", Type: "loan.opened",
		Payload: []byte(`{}`)}, outbox.Message{ID: "stuck-2", Topic: "loans", Payload: []byte(`{}`)})
	require.NoError(t, err)
	rec := &recordingTB{TB: t}
	began := time.Now()
	stagehandtest.WaitIdle(rec, p.pool, p.schema, &stagehandtest.IdleConfig{Timeout: 300 * time.Millisecond})
	require.True(t, rec.failed)
	require.GreaterOrEqual(t, time.Since(began), 300*time.Millisecond, "it waited for its timeout")
	require.Contains(t, rec.msg, "not idle after")
	require.Contains(t, rec.msg, "2 message(s) pending in the outbox")
	require.Contains(t, rec.msg, `message "stuck-1" (topic "loans", type "loan.opened", 0 attempt(s))`)
	require.Contains(t, rec.msg, `message "stuck-2"`)
}

// A message scheduled for later than the call is not due, so it is not waited for; one that was due by then is.
func TestWaitIdleDoesNotWaitForMessagesScheduledLater(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	_, err := p.ob.Stage(context.Background(),
		outbox.Message{ID: "later", Topic: "loans", Payload: []byte(`{}`), ScheduledAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	stagehandtest.WaitIdle(t, p.pool, p.schema, &stagehandtest.IdleConfig{Timeout: 2 * time.Second})

	_, err = p.ob.Stage(context.Background(),
		outbox.Message{ID: "due", Topic: "loans", Payload: []byte(`{}`), ScheduledAt: time.Now().Add(-time.Second)})
	require.NoError(t, err)
	rec := &recordingTB{TB: t}
	stagehandtest.WaitIdle(rec, p.pool, p.schema, &stagehandtest.IdleConfig{Timeout: 300 * time.Millisecond})
	require.True(t, rec.failed, "no relay runs: the due message stays pending")
	require.Contains(t, rec.msg, "1 message(s) pending in the outbox")
	require.Contains(t, rec.msg, `message "due"`)
	require.NotContains(t, rec.msg, `message "later"`)
}

// A projection stuck on an event keeps WaitIdle waiting; it fails naming the projection, its position, the head
// and the error it is retrying.
func TestWaitIdleFailsOnAStuckProjection(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	p.open(t, "ok-1", "ok-2", "bad-3")
	ctx, cancel := context.WithCancel(context.Background())
	h := projection.HandlerFunc(func(_ context.Context, _ pgx.Tx, e projection.Event) error {
		if e.StreamID == "bad-3" {
			return errors.New("no such loan product")
		}
		return nil
	})
	proj, err := projection.New(p.pool, p.store, h, &projection.Config{Name: "stuck", Schema: p.schema,
		BatchSize: 1, MaxAttempts: 1 << 20, RetryDelay: time.Millisecond, MaxRetryDelay: 5 * time.Millisecond})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { defer close(done); _ = proj.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	rec := &recordingTB{TB: t}
	stagehandtest.WaitIdle(rec, p.pool, p.schema, &stagehandtest.IdleConfig{Followers: []string{"stuck"},
		Timeout: 2 * time.Second})
	require.True(t, rec.failed)
	require.Contains(t, rec.msg, `projection "stuck" at position 2 of head 3 (running), retrying position 3: `)
	require.Contains(t, rec.msg, "no such loan product")
}

// A follower named in Followers that never started is waited for, and named when the wait times out.
func TestWaitIdleWaitsForANamedFollower(t *testing.T) {
	t.Parallel()
	p := newPipeline(t)
	rec := &recordingTB{TB: t}
	stagehandtest.WaitIdle(rec, p.pool, p.schema, &stagehandtest.IdleConfig{Followers: []string{"loans"},
		Timeout: 100 * time.Millisecond})
	require.True(t, rec.failed)
	require.Contains(t, rec.msg, `follower "loans" has no checkpoint yet`)
	// With nothing appended, staged or named, the schema is idle at once.
	stagehandtest.WaitIdle(t, p.pool, p.schema, nil)
	err := stagehandtest.Idle(context.Background(), p.pool, strings.Repeat("s", 64), nil)
	require.ErrorIs(t, err, stagehand.ErrInvalidConfig)
}

type rejecting struct{}

func (rejecting) Publish(string, ...*message.Message) error { return errors.New("broker says no") }
func (rejecting) Close() error                              { return nil }

type discarding struct{}

func (discarding) Publish(string, ...*message.Message) error { return nil }
func (discarding) Close() error                              { return nil }

// A dead letter will never be handled: Idle fails at once (Failed), naming the message and its error. A message
// sent but not handled by a named handler is waited for, and named at the timeout.
func TestIdleFailsAtOnceOnADeadLetterAndNamesUnhandledMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPipeline(t)
	_, err := p.ob.Stage(ctx, outbox.Message{ID: "sent-1", Topic: "loans", Type: "loan.opened",
		Payload: []byte(`{}`)})
	require.NoError(t, err)
	relay, err := p.ob.NewRelay(&outbox.RelayConfig{MaxRetryCount: outbox.Retries(0)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = relay.Close() })
	_, err = relay.Drain(ctx, discarding{})
	require.NoError(t, err)

	err = stagehandtest.Idle(ctx, p.pool, p.schema, &stagehandtest.IdleConfig{
		Handlers: map[string][]string{"loans": {"notify", "audit"}}, Timeout: 200 * time.Millisecond})
	var ni *stagehandtest.NotIdleError
	require.ErrorAs(t, err, &ni)
	require.False(t, ni.Failed)
	require.Contains(t, err.Error(), "2 sent message(s) not handled yet")
	require.Contains(t, err.Error(), `message "sent-1" (topic "loans", type "loan.opened") by handler "audit"`)
	require.Contains(t, err.Error(), `by handler "notify"`)
	require.NoError(t, stagehandtest.Idle(ctx, p.pool, p.schema, nil), "sent is done when no handler is named")

	_, err = p.ob.Stage(ctx, outbox.Message{ID: "dead-1", Topic: "loans", Type: "loan.opened",
		Payload: []byte(`{}`)})
	require.NoError(t, err)
	_, err = relay.Drain(ctx, rejecting{})
	require.NoError(t, err)
	began := time.Now()
	err = stagehandtest.Idle(ctx, p.pool, p.schema, &stagehandtest.IdleConfig{Timeout: 10 * time.Second})
	require.ErrorAs(t, err, &ni)
	require.True(t, ni.Failed)
	require.Less(t, time.Since(began), 5*time.Second, "a dead letter ends the wait at once")
	require.Contains(t, err.Error(), "will not become idle")
	require.Contains(t, err.Error(), `message "dead-1" (topic "loans", type "loan.opened") dead-lettered after 1 attempt(s): `)
	require.Contains(t, err.Error(), "broker says no")
	require.True(t, strings.HasPrefix(err.Error(), "stagehandtest: "))
}
