package scalebench

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/migrate"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/staging"
)

// The cost benchmark's domain: accounts receiving deposits. Each deposit is one event and one message keyed by the
// account, so a key has several messages in the outbox at once (parked and promoted) as in a busy system.
type account struct {
	aggregate.Root
	balance int64
}

type deposited struct {
	Amount int64 `json:"amount"`
}

func (a *account) Apply(e any) {
	if d, ok := e.(deposited); ok {
		a.balance += d.Amount
	}
}

// inboxBroker is the broker as the cost benchmark needs it: a publish hands each message to an inbox-wrapped
// handler at once, so the relay's publish includes the consumer's transaction.
type inboxBroker struct{ handle message.NoPublishHandlerFunc }

func (p inboxBroker) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		c := message.NewMessage(m.UUID, m.Payload)
		for k, v := range m.Metadata {
			c.Metadata.Set(k, v)
		}
		if err := p.handle(c); err != nil {
			return err
		}
	}
	return nil
}

func (inboxBroker) Close() error { return nil }

// category names the hot statement a pg_stat_statements entry is, from its text.
func category(q string) string {
	q = strings.Join(strings.Fields(q), " ")
	has := func(subs ...string) bool {
		for _, sub := range subs {
			if !strings.Contains(q, sub) {
				return false
			}
		}
		return true
	}
	upper := strings.ToUpper(q)
	switch {
	case strings.HasPrefix(upper, "BEGIN"), strings.HasPrefix(upper, "COMMIT"):
		return "BEGIN / COMMIT"
	case has("WITH RECURSIVE parked"):
		return "sweep"
	case has("heads AS"):
		return "claim"
	case has(`"outbox_sent"`, "DELETE FROM"):
		return "mark"
	case has("UPDATE", `"outbox"`, "next_attempt_at = 'infinity'"):
		return "promote"
	case has("SELECT min(next_attempt_at)"):
		return "next due"
	case has(`INSERT INTO "cost"."outbox"`):
		return "stage"
	case has(`INSERT INTO "cost"."events"`):
		return "append"
	case has(`INSERT INTO "cost"."inbox" `):
		return "inbox insert"
	case has(`"inbox`):
		return "inbox, other"
	case has("cost.effects"):
		return "handler's effect"
	case has("advisory"):
		return "key locks"
	case has(`"leases"`):
		return "leases"
	case has("pg_notify"):
		return "notify"
	case has("set_config"):
		return "relay settings"
	}
	return "other"
}

// BenchmarkMessageCost is the database's cost of one message on the whole path, measured with pg_stat_statements
// and /proc while 8 clients save (Transactional staging: the event and its message in one transaction), a relay
// (8 partitions under leader election, as for scale-out) publishes, and an inbox-wrapped handler applies each
// message with one INSERT in the inbox's transaction: per hot statement, calls, time (execution + planning) and
// WAL per message; for the whole cluster, CPU, WAL, commits and WAL flushes per message.
//
//	go test ./scalebench -run '^$' -bench MessageCost -benchtime 1x
//
// STAGEHAND_SCALE_COST_SECONDS (15) sets the measured stretch.
func BenchmarkMessageCost(b *testing.B) {
	ctx := context.Background()
	srv, err := StartServer(ctx)
	require.NoError(b, err)
	b.Cleanup(func() { _ = srv.Stop() })
	pc, err := pgxpool.ParseConfig(srv.URL())
	require.NoError(b, err)
	pc.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	const schema = "cost"
	_, err = migrate.Up(ctx, pool, schema, nil)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `CREATE TABLE cost.effects (message_id text PRIMARY KEY, applied_at timestamptz NOT NULL
		DEFAULT now())`)
	require.NoError(b, err)

	reg := aggregate.NewRegistry(nil)
	_ = aggregate.RegisterAggregate(reg, "account", func(id string) *account {
		return &account{Root: aggregate.NewRoot(id)}
	})
	_ = aggregate.RegisterEvent[deposited](reg, "account.deposited")
	require.NoError(b, reg.Err())
	mapping := staging.NewMapping(reg)
	_ = staging.Map(mapping, "deposits.v1", func(src eventstore.Record, e deposited) ([]staging.Message, error) {
		return []staging.Message{{Topic: "deposits", Type: "accounts.v1.Deposited", Payload: e}}, nil
	})
	require.NoError(b, mapping.Err())
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(b, err)
	b.Cleanup(store.Close)
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	require.NoError(b, err)
	b.Cleanup(func() { _ = ob.Close() })
	stager, err := staging.New(store, &staging.Config{Strategy: staging.Transactional, Outbox: ob, Mapping: mapping})
	require.NoError(b, err)
	repo, err := aggregate.NewRepository[*account](store, reg, &aggregate.RepositoryConfig{Stager: stager})
	require.NoError(b, err)
	inbox, err := ob.NewInbox(nil)
	require.NoError(b, err)
	var handled atomic.Int64
	handler := inbox.Handler("ledger", func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher,
		msg *message.Message) error {
		if _, err := tx.Exec(ctx, `INSERT INTO cost.effects (message_id) VALUES ($1)`, msg.UUID); err != nil {
			return fmt.Errorf("effect: %w", err)
		}
		handled.Add(1)
		return nil
	})
	relay, err := ob.NewRelay(&outbox.RelayConfig{BatchSize: 100, PollingInterval: 100 * time.Millisecond,
		MaxDegreeOfParallelism: 4, LeaderElection: "cost", Partitions: partitions})
	require.NoError(b, err)
	b.Cleanup(func() { _ = relay.Close() })
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, nil)
	require.NoError(b, err)
	relay.AddToRouter(router, inboxBroker{handle: handler}, nil)
	rctx, cancel := context.WithCancel(ctx)
	routerDone := make(chan struct{})
	go func() { defer close(routerDone); _ = router.Run(rctx) }()
	b.Cleanup(func() { cancel(); <-routerDone })
	<-router.Running()

	const clients, perClient = 8, 125 // 1,000 accounts
	accounts := make([][]*account, clients)
	for c := range accounts {
		for j := range perClient {
			accounts[c] = append(accounts[c], repo.New(fmt.Sprintf("acct-%d-%d", c, j)))
		}
	}
	var saved atomic.Int64
	phase := func(d time.Duration) {
		var wg sync.WaitGroup
		deadline := time.Now().Add(d)
		errs := make(chan error, clients)
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; time.Now().Before(deadline); j++ {
					a := accounts[c][j%perClient]
					aggregate.Raise(a, deposited{Amount: 1})
					if err := repo.Save(ctx, a); err != nil {
						errs <- err
						return
					}
					saved.Add(1)
				}
			}()
		}
		wg.Wait()
		close(errs)
		require.NoError(b, <-errs)
		start := time.Now()
		for handled.Load() < saved.Load() { // every message relayed and handled
			require.Less(b, time.Since(start), 5*time.Minute, "the relay did not keep up")
			time.Sleep(10 * time.Millisecond)
		}
	}
	phase(3 * time.Second) // warm-up: connections, plans, the relay's leases
	require.NoError(b, ResetStatements(ctx, pool))
	saved0 := saved.Load()
	w := StartWindow(srv.DataDir(), pool)
	phase(time.Duration(envInt("STAGEHAND_SCALE_COST_SECONDS", 15)) * time.Second)
	require.NoError(b, w.End())
	msgs := saved.Load() - saved0
	sts, err := Statements(ctx, pool)
	require.NoError(b, err)

	u := float64(msgs)
	cats := map[string]*Statement{}
	var order []string
	for _, s := range sts {
		c := category(s.Query)
		if cats[c] == nil {
			cats[c] = &Statement{Query: c}
			order = append(order, c)
		}
		cats[c].Calls += s.Calls
		cats[c].Rows += s.Rows
		cats[c].ExecMS += s.ExecMS
		cats[c].PlanMS += s.PlanMS
		cats[c].WALBytes += s.WALBytes
	}
	sort.Slice(order, func(i, j int) bool { return cats[order[i]].TimeMS() > cats[order[j]].TimeMS() })
	total, wal, _ := Totals(sts)
	fmt.Printf("COST %d messages in %s: %.0f msgs/s saved, relayed and handled; load %s → %s; machine busy %.0f%%\n",
		msgs, w.Elapsed.Round(time.Millisecond), u/w.Elapsed.Seconds(), w.LoadStart, w.LoadEnd,
		100*w.MachineBusyShare())
	fmt.Printf("COST per message: db CPU %.0f µs (%.2f cores), statement time %.0f µs, statement WAL %.0f B, cluster WAL "+
		"%.0f B, commits %.2f, WAL flushes %.2f\n", float64(w.ServerCPU.Microseconds())/u, w.ServerCores(),
		total*1000/u, float64(wal)/u, float64(w.WALBytes)/u, float64(w.Commits)/u, float64(w.WALSyncs)/u)
	fmt.Printf("COST %-24s %10s %12s %12s %12s %10s\n", "statement", "calls/msg", "µs/call", "µs/msg", "WAL B/msg",
		"share")
	for _, c := range order {
		s := cats[c]
		perCall := 0.0
		if s.Calls > 0 {
			perCall = s.TimeMS() * 1000 / float64(s.Calls)
		}
		fmt.Printf("COST %-24s %10.3f %12.1f %12.1f %12.0f %9.1f%%\n", c, float64(s.Calls)/u, perCall,
			s.TimeMS()*1000/u, float64(s.WALBytes)/u, 100*s.TimeMS()/total)
	}
	fmt.Println("COST statements, costliest first:")
	for i, s := range sts {
		if i == 25 {
			break
		}
		fmt.Printf("    %-22s %8.3f calls/msg %8.1f µs/msg %6.0f WAL B/msg  %s\n", category(s.Query),
			float64(s.Calls)/u, s.TimeMS()*1000/u, float64(s.WALBytes)/u, oneLine(s.Query, 100))
	}
	b.ReportMetric(float64(w.ServerCPU.Microseconds())/u, "db-cpu-µs/msg")
	b.ReportMetric(float64(w.WALBytes)/u, "wal-B/msg")
}
