package shred_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/shred"
)

// Both key stores keep one contract: keys made on first use, rotation, forget with its versions, unknown keys,
// and the audit.
func TestKeyStoreContract(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	pg, err := shred.NewPostgresKeyStore(pool, &shred.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	for name, ks := range map[string]shred.KeyStore{"postgres": pg, "memory": shred.NewMemoryKeyStore()} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			k1, err := ks.CurrentKey(ctx, "alice")
			require.NoError(t, err)
			require.Equal(t, 1, k1.Version)
			require.Len(t, k1.Material, shred.KeySize)
			again, err := ks.CurrentKey(ctx, "alice")
			require.NoError(t, err)
			require.Equal(t, k1, again)
			other, err := ks.CurrentKey(ctx, "bob")
			require.NoError(t, err)
			require.NotEqual(t, k1.Material, other.Material)

			k2, err := ks.Rotate(ctx, "alice", shred.Audit{Actor: "ops", Reason: "yearly"})
			require.NoError(t, err)
			require.Equal(t, 2, k2.Version)
			cur, err := ks.CurrentKey(ctx, "alice")
			require.NoError(t, err)
			require.Equal(t, k2, cur)
			old, err := ks.Key(ctx, "alice", 1)
			require.NoError(t, err)
			require.Equal(t, k1, old)

			_, err = ks.Key(ctx, "alice", 3)
			require.ErrorIs(t, err, shred.ErrUnknownKey)
			_, err = ks.Key(ctx, "carol", 1)
			require.ErrorIs(t, err, shred.ErrUnknownKey)

			versions, err := ks.Forget(ctx, "alice", shred.Audit{Actor: "dpo", Reason: "ticket 7"})
			require.NoError(t, err)
			require.Equal(t, []int{1, 2}, versions)
			for _, v := range []int{1, 2} {
				_, err = ks.Key(ctx, "alice", v)
				require.ErrorIs(t, err, shred.ErrForgotten)
			}
			versions, err = ks.Forget(ctx, "alice", shred.Audit{Actor: "dpo"})
			require.NoError(t, err)
			require.Empty(t, versions, "forgetting again deletes nothing, and is recorded")
			k3, err := ks.CurrentKey(ctx, "alice")
			require.NoError(t, err)
			require.Equal(t, 3, k3.Version)
			_, err = ks.Key(ctx, "bob", 1)
			require.NoError(t, err, "another subject is untouched")

			hist, err := ks.History(ctx, "alice")
			require.NoError(t, err)
			require.Len(t, hist, 3)
			require.Equal(t, "rotate", hist[0].Action)
			require.Equal(t, []int{2}, hist[0].Versions)
			require.Equal(t, "ops", hist[0].Actor)
			require.Equal(t, "forget", hist[1].Action)
			require.Equal(t, []int{1, 2}, hist[1].Versions)
			require.Equal(t, "dpo", hist[1].Actor)
			require.Equal(t, "ticket 7", hist[1].Reason)
			require.Empty(t, hist[2].Versions)
			require.False(t, hist[1].At.IsZero())

			_, err = ks.CurrentKey(ctx, "")
			require.ErrorIs(t, err, shred.ErrInvalidSubject)
			_, err = ks.Forget(ctx, "a\x00", shred.Audit{})
			require.ErrorIs(t, err, shred.ErrInvalidSubject)
		})
	}
	// Forget deleted the material itself.
	require.Zero(t, pgtest.Count(t, pool, `SELECT count(*) FROM `+pgtest.Q(schema, "shred_keys")+
		` WHERE subject = 'alice' AND version < 3`))
}

// Concurrent first writes of one subject, in several processes' codecs, agree on one key.
func TestConcurrentFirstWritesShareOneKey(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Migrated(t)
	ks, err := shred.NewPostgresKeyStore(pool, &shred.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	var wg sync.WaitGroup
	keys := make([]shred.Key, 16)
	errs := make([]error, 16)
	for i := range keys {
		wg.Go(func() { keys[i], errs[i] = ks.CurrentKey(context.Background(), "alice") })
	}
	wg.Wait()
	for i := range keys {
		require.NoError(t, errs[i])
		require.Equal(t, keys[0], keys[i])
	}
	require.Equal(t, int64(1), pgtest.Count(t, pool, `SELECT count(*) FROM `+pgtest.Q(schema, "shred_keys")))
}

// The whole path: events, staged messages, dead letters, snapshots and parked events of a forgotten subject hold
// no plaintext (every table of the schema is searched), and loads, a projection's parked-event replay and
// rebuild, and a redrive of the dead letters read redacted values without an error.
func TestForgetLeavesNoPlaintextAnywhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t, nil)
	alice, bob, plan := marker("alice"), marker("bob"), marker("plan")
	w.register("c-alice", "Alice "+alice, alice+"@example.com", plan)
	w.changeEmail("c-alice", alice+"-2@example.com", plan) // a snapshot at version 2
	w.register("c-bob", "Bob "+bob, bob+"@example.com", plan)
	w.changeEmail("c-bob", bob+"-2@example.com", plan)

	// Each customer's first message dead-lettered (holding its key, so the second waits in the outbox), then one
	// more staged behind alice's.
	res := w.drain(&broker{reject: true})
	require.Equal(t, 2, res.DeadLettered)
	w.changeEmail("c-alice", alice+"-3@example.com", plan)

	// A projection that cannot handle alice's events parks them.
	var mu sync.Mutex
	view := map[string]string{}
	var broken atomic.Bool
	broken.Store(true)
	h := handler{fn: func(e projection.Event) error {
		mu.Lock()
		defer mu.Unlock()
		switch d := e.Data.(type) {
		case CustomerRegistered:
			if broken.Load() && d.CustomerID == "c-alice" {
				return errors.New("cannot handle this customer")
			}
			view[d.CustomerID] = d.Name
		case EmailChanged:
			if broken.Load() && d.CustomerID == "c-alice" {
				return errors.New("cannot handle this customer")
			}
		}
		return nil
	}, reset: func() { mu.Lock(); clear(view); mu.Unlock() }}
	p, err := projection.New(w.pool, w.store, h, &projection.Config{Name: "customers", Schema: w.schema,
		Registry: w.reg, OnFailure: projection.Park, MaxAttempts: 1, PollInterval: 20 * time.Millisecond,
		RetryDelay: time.Millisecond, LeaseTTL: 5 * time.Second, LeaseAcquireInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	stop := start(t, p)
	pgtest.Eventually(t, 20*time.Second, caughtUp(t, w, p), "the projection catches up")
	require.Equal(t, int64(3), w.rows("projection_parked"), "alice's three events are parked")

	// Before: the scan finds the clear field in every table that holds a copy of an event or message, and no
	// plaintext of either subject anywhere (personal data is encrypted before it is written).
	canary := w.tablesHolding(plan)
	for _, table := range []string{"events", "snapshots", "outbox", "outbox_dead_letters"} {
		require.Positive(t, canary[table], "the scan sees %s: %v", table, canary)
	}
	require.Equal(t, int64(3), w.rows("outbox"))
	require.Empty(t, w.tablesHolding(alice))
	require.Empty(t, w.tablesHolding(bob))
	c := w.load("c-alice")
	require.Equal(t, "Alice "+alice, c.Name)
	require.Equal(t, alice+"-3@example.com", c.Email)

	versions, err := w.codec.Forget(ctx, "c-alice", shred.Audit{Actor: "test", Reason: "erasure request"})
	require.NoError(t, err)
	require.Equal(t, []int{1}, versions)

	// After: loads (from the snapshot, and by full replay), the parked events' replay, a rebuild and a redrive
	// read redacted values, never an error; bob is untouched.
	c = w.load("c-alice")
	require.Equal(t, shred.Redacted, c.Name)
	require.Equal(t, shred.Redacted, c.Email)
	require.Equal(t, plan, c.Plan)
	require.NoError(t, w.repo.DropSnapshot(ctx, "c-alice"))
	c = w.load("c-alice")
	require.Equal(t, shred.Redacted, c.Name)
	require.Equal(t, "Bob "+bob, w.load("c-bob").Name)

	broken.Store(false)
	parked, err := p.Parked(ctx)
	require.NoError(t, err)
	require.Len(t, parked, 3)
	for _, pe := range parked {
		require.NoError(t, p.ReplayParked(ctx, pe.ID))
	}
	mu.Lock()
	require.Equal(t, map[string]string{"c-alice": shred.Redacted, "c-bob": "Bob " + bob}, view)
	clear(view)
	view["stale"] = "x"
	mu.Unlock()
	require.NoError(t, p.Rebuild(ctx))
	pgtest.Eventually(t, 20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(view) == 2 && view["stale"] == ""
	}, "the rebuild replays the log")
	require.NoError(t, stop())
	mu.Lock()
	require.Equal(t, map[string]string{"c-alice": shred.Redacted, "c-bob": "Bob " + bob}, view)
	mu.Unlock()

	dead, err := w.ob.AllTenants().DeadLetters(ctx, outbox.ListOptions{})
	require.NoError(t, err)
	require.Len(t, dead, 2)
	ids := make([]string, len(dead))
	for i, d := range dead {
		ids[i] = d.ID
	}
	n, err := w.ob.AllTenants().Redrive(ctx, ids...)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	b := &broker{}
	res = w.drain(b)
	require.Equal(t, 5, res.Published)
	consumer, err := shred.NewCodec(w.keys, nil) // another process's codec
	require.NoError(t, err)
	emails := map[string][]string{}
	for _, m := range b.sent {
		var msg CustomerMessage
		require.NoError(t, consumer.Unmarshal(m.Payload, &msg))
		emails[msg.CustomerID] = append(emails[msg.CustomerID], msg.Email)
	}
	sort.Strings(emails["c-bob"])
	require.Equal(t, []string{shred.Redacted, shred.Redacted, shred.Redacted}, emails["c-alice"])
	require.Equal(t, []string{bob + "-2@example.com", bob + "@example.com"}, emails["c-bob"])

	require.Empty(t, w.tablesHolding(alice), "no plaintext of the forgotten subject in any table")
	require.Zero(t, pgtest.Count(t, w.pool, `SELECT count(*) FROM `+pgtest.Q(w.schema, "shred_keys")+
		` WHERE subject = 'c-alice'`), "the key material is deleted")
	hist, err := w.keys.History(ctx, "c-alice")
	require.NoError(t, err)
	require.Len(t, hist, 1)
	require.Equal(t, "erasure request", hist[0].Reason)
}

// Many goroutines save for many subjects while subjects are forgotten: no save and no read fails; what was saved
// before a subject's forget began reads redacted, what was saved after it returned reads in clear (a fresh key),
// and no plaintext of any subject is in any table.
func TestConcurrentSavesAndForget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t, nil)
	const writers, perWriter, rounds = 8, 4, 6
	secret := marker("s")
	type save struct {
		id             string
		version        int64
		email          string
		started, ended time.Time
	}
	type forget struct{ started, ended time.Time }
	var mu sync.Mutex
	var saves []save
	forgets := map[string]forget{}
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for r := range rounds {
				for i := range perWriter {
					id := fmt.Sprintf("c-%d-%d", g, i)
					email := fmt.Sprintf("%s-%s-%d@example.com", secret, id, r)
					started := time.Now()
					c, err := w.repo.Upsert(ctx, id, func(c *Customer) error {
						if c.Version() == 0 {
							aggregate.Raise(c, CustomerRegistered{CustomerID: id, Name: secret, Email: email})
						} else {
							aggregate.Raise(c, EmailChanged{CustomerID: id, Email: email})
						}
						return nil
					})
					if !assertNoError(t, err) {
						return
					}
					mu.Lock()
					saves = append(saves, save{id: id, version: c.Version(), email: email, started: started,
						ended: time.Now()})
					mu.Unlock()
				}
			}
		})
	}
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		for range writers {
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
			id := fmt.Sprintf("c-%d-%d", rng.IntN(writers), rng.IntN(perWriter))
			mu.Lock()
			_, done := forgets[id]
			mu.Unlock()
			if done {
				continue
			}
			started := time.Now()
			_, err := w.codec.Forget(ctx, id, shred.Audit{Actor: "test"})
			if !assertNoError(t, err) {
				return
			}
			mu.Lock()
			forgets[id] = forget{started, time.Now()}
			mu.Unlock()
		}
	})
	wg.Wait()
	require.NotEmpty(t, forgets)

	redactedSeen, clearSeen := 0, 0
	for _, s := range saves {
		recs, err := w.store.ReadStream(ctx, "", s.id, s.version)
		require.NoError(t, err)
		ev, err := w.reg.Decode(recs[0])
		require.NoError(t, err, "no read fails")
		var got string
		switch e := ev.(type) {
		case CustomerRegistered:
			got = e.Email
		case EmailChanged:
			got = e.Email
		}
		f, forgotten := forgets[s.id]
		switch {
		case forgotten && s.ended.Before(f.started):
			require.Equal(t, shred.Redacted, got, "%s v%d saved before its forget", s.id, s.version)
			redactedSeen++
		case forgotten && s.started.After(f.ended):
			require.Equal(t, s.email, got, "%s v%d saved after its forget", s.id, s.version)
			clearSeen++
		case !forgotten:
			require.Equal(t, s.email, got)
		default:
			require.Contains(t, []string{s.email, shred.Redacted}, got, "saved during the forget")
		}
		_, err = w.repo.Load(ctx, s.id)
		require.NoError(t, err)
	}
	t.Logf("%d saves, %d subjects forgotten: %d events read redacted after their forget, %d written after it read "+
		"in clear", len(saves), len(forgets), redactedSeen, clearSeen)
	require.Empty(t, w.tablesHolding(secret), "no plaintext of any subject in any table")
}

// assertNoError reports err from a goroutine (require must not be called off the test's goroutine).
func assertNoError(t *testing.T, err error) bool {
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}

type handler struct {
	fn    func(projection.Event) error
	reset func()
}

func (h handler) Handle(_ context.Context, _ pgx.Tx, e projection.Event) error { return h.fn(e) }

func (h handler) Reset(context.Context, pgx.Tx) error { h.reset(); return nil }

// start runs p until the test ends; stop ends it and returns Run's result.
func start(t *testing.T, p *projection.Projection) (stop func() error) {
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

func caughtUp(t *testing.T, w *world, p *projection.Projection) func() bool {
	return func() bool {
		head, err := w.store.HeadPosition(context.Background())
		require.NoError(t, err)
		st, err := p.Status(context.Background())
		require.NoError(t, err)
		return len(st) == 1 && st[0].Position >= head && !st[0].Rebuilding
	}
}
