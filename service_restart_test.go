package stagehand_test

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
)

// The service below runs on the pool stagehand.PoolSize gives for it (the documented formula): one relay
// subscription, one projection and restartHandlers inbox handler runs at once, nothing else.
const (
	restartHandlers = 4
	restartRuns     = 20
	restartBacklog  = 8 // messages staged before each start
	restartRunLimit = 20 * time.Second
)

// The service's domain: members joining and visiting.
type member struct {
	aggregate.Root
	Visits int
}

type memberJoined struct{}
type memberVisited struct{}

func (m *member) Apply(e any) {
	switch e.(type) {
	case memberJoined, memberVisited:
		m.Visits++
	}
}

func visit(m *member) error {
	aggregate.Raise(m, memberVisited{})
	return nil
}

// A service written as the docs show it, on one pool of handlers + the documented overhead: inbox-wrapped handlers
// that load members that mostly do not exist (LoadTx, then SaveTx or UpdateTx, and an UpdateTx of a member that
// never exists), publishing through the inbox's publisher; a relay publishing the outbox to a Watermill gochannel;
// a projection of the members' events. It is stopped and started again 20 times, each time with a backlog staged
// while it was down: every run handles every message once per handler, and nothing hangs (the run's deadline).
func TestServiceRestartsWithABacklogOnAMinimalPool(t *testing.T) {
	t.Parallel()
	_, schema := pgtest.Migrated(t)
	ctx := context.Background()
	setup := pgtest.Pool(t)
	pgtest.Exec(t, setup, `CREATE TABLE `+pgtest.Q(schema, "handled")+` (run int, handler text, message text);
		CREATE TABLE `+pgtest.Q(schema, "member_events")+` (position bigint)`)
	reg := aggregate.NewRegistry(nil)
	require.NoError(t, aggregate.RegisterAggregate(reg, "member",
		func(id string) *member { return &member{Root: aggregate.NewRoot(id)} }))
	require.NoError(t, aggregate.RegisterEvent[memberJoined](reg, "member.joined"))
	require.NoError(t, aggregate.RegisterEvent[memberVisited](reg, "member.visited"))

	for run := range restartRuns {
		// Staged while the service is down: most name a member that does not exist yet, some a regular.
		ob, err := outbox.New(setup, &outbox.Config{Schema: schema})
		require.NoError(t, err)
		msgs := make([]outbox.Message, restartBacklog)
		for i := range msgs {
			who := fmt.Sprintf("r%d-m%d", run, i)
			if i%4 == 0 {
				who = fmt.Sprintf("regular-%d", i%3)
			}
			msgs[i] = outbox.Message{ID: fmt.Sprintf("join-%d-%d", run, i), Topic: "joins", Payload: []byte(who)}
		}
		_, err = ob.Stage(ctx, msgs...)
		require.NoError(t, err)
		require.NoError(t, ob.Close())

		start := time.Now()
		runService(t, schema, reg, run)
		t.Logf("run %d: %v", run, time.Since(start).Round(time.Millisecond))
	}
}

// runService starts the service on a pool of its own, waits until it has handled the backlog of run (and projected
// every event), and stops it, all within restartRunLimit.
func runService(t *testing.T, schema string, reg *aggregate.Registry, run int) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.MaxConns = int32(stagehand.PoolSize(stagehand.PoolUse{RelaySubscriptions: 1, Followers: 1,
		InboxHandlers: restartHandlers}))
	deadline, cancelDeadline := context.WithTimeout(context.Background(), restartRunLimit)
	defer cancelDeadline()
	pool, err := pgxpool.NewWithConfig(deadline, cfg)
	require.NoError(t, err)
	defer pool.Close()
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	defer store.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(t, err)
	defer func() { _ = ob.Close() }()
	repo, err := aggregate.NewRepository[*member](store, reg, nil)
	require.NoError(t, err)

	relay, err := ob.NewRelay(&outbox.RelayConfig{PollingInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	// As the docs set gochannel up: the relay's publish waits for the handlers' acknowledgement, so at most its
	// MaxDegreeOfParallelism (4, restartHandlers) handler runs are under way at once.
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true, BlockPublishUntilSubscriberAck: true}, nil)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, nil)
	require.NoError(t, err)
	relay.AddToRouter(router, broker, nil)
	inbox, err := ob.NewInbox(nil)
	require.NoError(t, err)
	handled := pgtest.Q(schema, "handled")
	for h := range restartHandlers {
		name := fmt.Sprintf("members-%d", h)
		router.AddConsumerHandler(name, "joins", broker, inbox.Handler(name, func(ctx context.Context, tx pgx.Tx,
			out *outbox.Publisher, msg *message.Message) error {
			id := fmt.Sprintf("h%d-%s", h, msg.Payload)
			_, err := repo.LoadTx(ctx, tx, id)
			switch {
			case errors.Is(err, aggregate.ErrNotFound):
				m := repo.New(id)
				aggregate.Raise(m, memberJoined{})
				err = repo.SaveTx(ctx, tx, m)
			case err == nil:
				_, err = repo.UpdateTx(ctx, tx, id, visit)
			}
			if err != nil {
				return err
			}
			if _, err := repo.UpdateTx(ctx, tx, "ghost-"+id, visit); !errors.Is(err, aggregate.ErrNotFound) {
				return fmt.Errorf("update of a member that never exists: %v", err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+handled+` VALUES ($1, $2, $3)`, run, name,
				msg.UUID); err != nil {
				return err
			}
			return out.Publish("welcomes", message.NewMessage("welcome-"+msg.UUID+"-"+name, []byte(`{}`)))
		}))
	}
	proj, err := projection.New(pool, store, projection.HandlerFunc(func(ctx context.Context, tx pgx.Tx,
		e projection.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+pgtest.Q(schema, "member_events")+` VALUES ($1)`, e.Position)
		return err
	}), &projection.Config{Name: "members", Schema: schema, PollInterval: 50 * time.Millisecond,
		LeaseAcquireInterval: 50 * time.Millisecond})
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(deadline)
	defer stop()
	routerDone, projDone := make(chan error, 1), make(chan error, 1)
	go func() { routerDone <- router.Run(runCtx) }()
	go func() { projDone <- proj.Run(runCtx) }()

	count := func(sql string, args ...any) int64 {
		var n int64
		if err := pool.QueryRow(deadline, sql, args...).Scan(&n); err != nil {
			t.Fatalf("run %d: %v (the service hung: %s)", run, err, poolState(pool))
		}
		return n
	}
	want := int64(restartHandlers * restartBacklog)
	for {
		n := count(`SELECT count(*) FROM `+handled+` WHERE run = $1`, run)
		projected := count(`SELECT (SELECT count(*) FROM ` + pgtest.Q(schema, "events") + `) -
			(SELECT count(*) FROM ` + pgtest.Q(schema, "member_events") + `)`)
		if n >= want && projected == 0 {
			break
		}
		select {
		case <-deadline.Done():
			t.Fatalf("run %d: %d of %d handled, %d events not projected after %v: the service hung (%s)", run, n,
				want, projected, restartRunLimit, poolState(pool))
		case <-time.After(20 * time.Millisecond):
		}
	}
	require.Equal(t, want, count(`SELECT count(DISTINCT (handler, message)) FROM `+handled+` WHERE run = $1`, run))
	require.Equal(t, want, count(`SELECT count(*) FROM `+handled+` WHERE run = $1`, run),
		"every message handled once by each handler")

	stop()
	require.NoError(t, router.Close())
	for _, done := range []chan error{routerDone, projDone} {
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(restartRunLimit):
			t.Fatalf("run %d: the service did not stop (%s)", run, poolState(pool))
		}
	}
	require.NoError(t, relay.Close())
	require.NoError(t, broker.Close())
}

func poolState(pool *pgxpool.Pool) string {
	s := pool.Stat()
	return fmt.Sprintf("pool: %d of %d connections acquired, %d acquires waited", s.AcquiredConns(), s.MaxConns(),
		s.EmptyAcquireCount())
}
