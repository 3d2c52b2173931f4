package aggregate_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func postgresStore(t *testing.T) *eventstore.PostgresStore {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	s, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

// stores runs fn against both stores: the repository's behaviour must not depend on which one it is given.
func stores(t *testing.T, fn func(t *testing.T, store eventstore.Store)) {
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, postgresStore(t))
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		fn(t, eventstore.NewMemory(nil))
	})
}

func repo(t *testing.T, store eventstore.Store, cfg *aggregate.RepositoryConfig) *aggregate.Repository[*Account] {
	t.Helper()
	r, err := aggregate.NewRepository[*Account](store, newRegistry(), cfg)
	require.NoError(t, err)
	return r
}

func TestSaveAndLoad(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store eventstore.Store) {
		ctx := context.Background()
		r := repo(t, store, nil)
		a := r.New("a-1")
		require.NoError(t, a.Open("ann"))
		require.NoError(t, a.Deposit(50))
		require.NoError(t, a.Deposit(25))
		require.Equal(t, int64(3), a.Version())
		require.Zero(t, a.StoredVersion())
		require.NoError(t, r.Save(ctx, a))
		require.Empty(t, a.Changes(), "saved changes are cleared")
		require.Equal(t, int64(3), a.StoredVersion())
		require.NoError(t, r.Save(ctx, a), "saving without changes is a no-op")

		got, err := r.Load(ctx, "a-1")
		require.NoError(t, err)
		require.Equal(t, "ann", got.Owner)
		require.Equal(t, int64(75), got.Balance)
		require.Equal(t, int64(3), got.Version())
		require.Empty(t, got.Changes(), "loaded history is not a change")

		_, err = r.Load(ctx, "missing")
		require.ErrorIs(t, err, aggregate.ErrNotFound)
		require.ErrorIs(t, err, eventstore.ErrStreamNotFound)

		_, err = r.Create(ctx, "a-1", func(a *Account) error { return a.Open("bob") })
		require.ErrorIs(t, err, eventstore.ErrConcurrencyConflict, "creating an existing aggregate conflicts")
	})
}

// 32 goroutines update the same aggregate: the final version equals the number of successful saves, versions are
// 1..n without gaps or duplicates, and every failure is the typed conflict.
func TestConcurrentSavesOfOneAggregate(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store eventstore.Store) {
		ctx := context.Background()
		r := repo(t, store, nil)
		_, err := r.Create(ctx, "hot", func(a *Account) error { return a.Open("ann") })
		require.NoError(t, err)

		const workers = 32
		var wg sync.WaitGroup
		var mu sync.Mutex
		successes, conflicts := 0, 0
		var unexpected []error
		start := make(chan struct{})
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for range 3 {
					a, err := r.Load(ctx, "hot")
					if err == nil {
						_ = a.Deposit(1)
						err = r.Save(ctx, a)
					}
					mu.Lock()
					switch {
					case err == nil:
						successes++
					case errors.Is(err, eventstore.ErrConcurrencyConflict):
						conflicts++
						var ce *eventstore.ConflictError
						if !errors.As(err, &ce) || ce.StreamID != "hot" {
							unexpected = append(unexpected, err)
						}
					default:
						unexpected = append(unexpected, err)
					}
					mu.Unlock()
				}
			}()
		}
		close(start)
		wg.Wait()
		require.Empty(t, unexpected, "every failure must be the typed conflict")
		t.Logf("%d saves succeeded, %d conflicted", successes, conflicts)

		final, err := r.Load(ctx, "hot")
		require.NoError(t, err)
		require.Equal(t, int64(1+successes), final.Version(), "final version = opening + successful saves")
		require.Equal(t, int64(successes), final.Balance)
		records, err := store.ReadStream(ctx, "", "hot", 0)
		require.NoError(t, err)
		for i, rec := range records {
			require.Equal(t, int64(i+1), rec.Version, "versions must be 1..n without gaps or duplicates")
		}
	})
}

func TestUpdateRetriesConflicts(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store eventstore.Store) {
		ctx := context.Background()
		r := repo(t, store, &aggregate.RepositoryConfig{UpdateRetries: 100})
		_, err := r.Create(ctx, "a", func(a *Account) error { return a.Open("ann") })
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := r.Update(ctx, "a", func(a *Account) error { return a.Deposit(10) })
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err, "with enough retries every update lands")
		}
		a, err := r.Load(ctx, "a")
		require.NoError(t, err)
		require.Equal(t, int64(160), a.Balance)

		_, err = r.Update(ctx, "a", func(a *Account) error { return a.Withdraw(1000) })
		require.ErrorIs(t, err, ErrInsufficientFunds, "a command error is returned as is")
		a, _ = r.Load(ctx, "a")
		require.Equal(t, int64(17), a.Version(), "a failed command saves nothing")
	})
}

func TestUpdateGivesUpAfterRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := eventstore.NewMemory(nil)
	r := repo(t, store, &aggregate.RepositoryConfig{UpdateRetries: 2})
	_, err := r.Create(ctx, "a", func(a *Account) error { return a.Open("ann") })
	require.NoError(t, err)
	attempts := 0
	_, err = r.Update(ctx, "a", func(a *Account) error {
		attempts++
		// Another writer slips in between every load and save.
		_, err := store.Append(ctx, eventstore.AppendRequest{StreamID: "a", StreamType: "bank.account",
			Expected: eventstore.AnyVersion, Events: []eventstore.EventData{{Type: "bank.account.deposited",
				Payload: []byte(`{"Amount":1}`)}}})
		require.NoError(t, err)
		return a.Deposit(5)
	})
	require.ErrorIs(t, err, eventstore.ErrConcurrencyConflict)
	require.Equal(t, 3, attempts, "UpdateRetries 2 = 3 attempts")
	require.ErrorContains(t, err, "3 attempts")
}

// countingStore records the fromVersion of every stream read.
type countingStore struct {
	eventstore.Store
	mu    sync.Mutex
	froms []int64
}

func (c *countingStore) ReadStream(ctx context.Context, tenant, id string, from int64) ([]eventstore.Record, error) {
	c.mu.Lock()
	c.froms = append(c.froms, from)
	c.mu.Unlock()
	return c.Store.ReadStream(ctx, tenant, id, from)
}

func TestSnapshots(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store eventstore.Store) {
		ctx := context.Background()
		cs := &countingStore{Store: store}
		snapRepo := repo(t, cs, &aggregate.RepositoryConfig{SnapshotEvery: 10, SnapshotSchemaVersion: 2})
		plain := repo(t, store, nil)

		a := snapRepo.New("s")
		require.NoError(t, a.Open("ann"))
		require.NoError(t, snapRepo.Save(ctx, a))
		for i := range 24 {
			require.NoError(t, a.Deposit(int64(i+1)))
			if i%5 == 4 {
				require.NoError(t, snapRepo.Save(ctx, a))
			}
		}
		require.NoError(t, snapRepo.Save(ctx, a)) // version 25

		snap, err := store.LoadSnapshot(ctx, "", "s")
		require.NoError(t, err)
		require.Equal(t, int64(21), snap.Version, "snapshot taken by the save that crossed 20")

		fromSnap, err := snapRepo.Load(ctx, "s")
		require.NoError(t, err)
		full, err := plain.Load(ctx, "s")
		require.NoError(t, err)
		require.Equal(t, full.Balance, fromSnap.Balance)
		require.Equal(t, full.Owner, fromSnap.Owner)
		require.Equal(t, full.Version(), fromSnap.Version())
		require.Equal(t, 4, fromSnap.applied, "only the tail after the snapshot is replayed")
		require.Equal(t, int64(21), cs.froms[len(cs.froms)-1], "read from the snapshot's own event, to check it")

		// A repository expecting another snapshot schema ignores the stale snapshot and replays everything.
		newer := repo(t, cs, &aggregate.RepositoryConfig{SnapshotEvery: 10, SnapshotSchemaVersion: 3})
		replayed, err := newer.Load(ctx, "s")
		require.NoError(t, err)
		require.Equal(t, 25, replayed.applied)
		require.Equal(t, full.Balance, replayed.Balance)
		require.Equal(t, int64(1), cs.froms[len(cs.froms)-1])
	})
}

// OpenedV1 is the first shape of the opening event: a single "Name" field, since split into owner and currency.
type OpenedV1 struct{ Name string }

// OpenedV2 is the current shape, under the same stable name at version 2.
type OpenedV2 struct {
	Owner    string
	Currency string
}

type upcastAccount struct {
	aggregate.Root
	Owner, Currency string
}

func (a *upcastAccount) Apply(e any) {
	if o, ok := e.(OpenedV2); ok {
		a.Owner, a.Currency = o.Owner, o.Currency
	}
}

func TestUpcastingOldEventVersion(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store eventstore.Store) {
		ctx := context.Background()
		// History written by an older release: version 1 of "acct.opened".
		_, err := store.Append(ctx, eventstore.AppendRequest{StreamID: "u", StreamType: "acct",
			Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: "acct.opened", TypeVersion: 1,
				Payload: []byte(`{"Name":"ann"}`)}}})
		require.NoError(t, err)

		reg := aggregate.NewRegistry(nil)
		require.NoError(t, aggregate.RegisterAggregate(reg, "acct",
			func(id string) *upcastAccount { return &upcastAccount{Root: aggregate.NewRoot(id)} }))
		require.NoError(t, aggregate.RegisterEvent[OpenedV2](reg, "acct.opened", aggregate.Version(2)))
		require.NoError(t, aggregate.RegisterUpcaster(reg, "acct.opened", 1, func(o OpenedV1) (OpenedV2, error) {
			return OpenedV2{Owner: o.Name, Currency: "EUR"}, nil
		}))
		r, err := aggregate.NewRepository[*upcastAccount](store, reg, nil)
		require.NoError(t, err)
		a, err := r.Load(ctx, "u")
		require.NoError(t, err)
		require.Equal(t, "ann", a.Owner)
		require.Equal(t, "EUR", a.Currency)

		// Without the upcaster the old version is a clear decode error, not a panic.
		reg2 := aggregate.NewRegistry(nil)
		require.NoError(t, aggregate.RegisterAggregate(reg2, "acct",
			func(id string) *upcastAccount { return &upcastAccount{Root: aggregate.NewRoot(id)} }))
		require.NoError(t, aggregate.RegisterEvent[OpenedV2](reg2, "acct.opened", aggregate.Version(2)))
		r2, err := aggregate.NewRepository[*upcastAccount](store, reg2, nil)
		require.NoError(t, err)
		_, err = r2.Load(ctx, "u")
		require.ErrorIs(t, err, aggregate.ErrDecode)
		require.ErrorContains(t, err, "no upcaster")
	})
}

// RenamedDeposit is Deposited renamed in Go; it keeps its stable name, so stored history stays readable.
type RenamedDeposit struct{ Amount int64 }

type renamedAccount struct {
	aggregate.Root
	Balance int64
}

func (a *renamedAccount) Apply(e any) {
	if d, ok := e.(RenamedDeposit); ok {
		a.Balance += d.Amount
	}
}

func TestRenamingGoTypeKeepsHistoryReadable(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store eventstore.Store) {
		ctx := context.Background()
		old := repo(t, store, nil)
		_, err := old.Create(ctx, "r", func(a *Account) error { return a.Deposit(42) })
		require.NoError(t, err)

		reg := aggregate.NewRegistry(nil)
		require.NoError(t, aggregate.RegisterAggregate(reg, "bank.account",
			func(id string) *renamedAccount { return &renamedAccount{Root: aggregate.NewRoot(id)} }))
		require.NoError(t, aggregate.RegisterEvent[RenamedDeposit](reg, "bank.account.deposited"))
		r, err := aggregate.NewRepository[*renamedAccount](store, reg, nil)
		require.NoError(t, err)
		a, err := r.Load(ctx, "r")
		require.NoError(t, err)
		require.Equal(t, int64(42), a.Balance)
	})
}

func TestContextMetadataArrivesOnStoredEvents(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store eventstore.Store) {
		ctx := stagehand.WithTenant(context.Background(), "acme")
		ctx = stagehand.WithCorrelationID(ctx, "corr-7")
		ctx = stagehand.WithCausationID(ctx, "cmd-3")
		ctx = stagehand.WithMetadata(ctx, "user", "ann")
		fixed := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		r := repo(t, store, &aggregate.RepositoryConfig{Clock: func() time.Time { return fixed }})
		a := r.New("m")
		require.NoError(t, a.Open("ann"))
		aggregate.Raise(a, Deposited{Amount: 5}, aggregate.WithEventMetadata("channel", "atm"))
		require.NoError(t, r.Save(ctx, a))

		recs, err := store.ReadStream(ctx, "acme", "m", 0)
		require.NoError(t, err)
		require.Len(t, recs, 2)
		for _, rec := range recs {
			require.Equal(t, "acme", rec.Tenant)
			require.Equal(t, "bank.account", rec.StreamType)
			require.Equal(t, "corr-7", rec.Metadata[stagehand.HeaderCorrelationID])
			require.Equal(t, "cmd-3", rec.Metadata[stagehand.HeaderCausationID])
			require.Equal(t, "ann", rec.Metadata["user"])
			require.True(t, fixed.Equal(rec.OccurredAt))
			require.Equal(t, uuid.Version(7), rec.EventID.Version(), "event IDs are UUIDv7")
		}
		require.Equal(t, "bank.account.opened", recs[0].Type)
		require.Empty(t, recs[0].Metadata["channel"])
		require.Equal(t, "atm", recs[1].Metadata["channel"])
		require.Less(t, recs[0].EventID.String(), recs[1].EventID.String(), "UUIDv7 IDs sort by creation")

		_, err = r.Load(context.Background(), "m")
		require.ErrorIs(t, err, aggregate.ErrNotFound, "another tenant's stream is invisible")
		loaded, err := r.Load(ctx, "m")
		require.NoError(t, err)
		require.NoError(t, loaded.Deposit(1))
		err = r.Save(stagehand.WithTenant(context.Background(), "globex"), loaded)
		require.ErrorIs(t, err, aggregate.ErrTenantMismatch)
	})
}

func TestUnknownAndCorruptEventsNameTypeAndStream(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store eventstore.Store) {
		ctx := context.Background()
		r := repo(t, store, nil)
		_, err := store.Append(ctx, eventstore.AppendRequest{StreamID: "u-1", StreamType: "bank.account",
			Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: "bank.account.frozen",
				Payload: []byte(`{}`)}}})
		require.NoError(t, err)
		_, err = r.Load(ctx, "u-1")
		require.ErrorIs(t, err, aggregate.ErrUnknownEvent)
		require.ErrorContains(t, err, `"bank.account.frozen"`)
		require.ErrorContains(t, err, `"u-1"`)
		var ue *aggregate.UnknownEventError
		require.ErrorAs(t, err, &ue)
		require.Equal(t, "u-1", ue.Record.StreamID)

		_, err = store.Append(ctx, eventstore.AppendRequest{StreamID: "c-1", StreamType: "bank.account",
			Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: "bank.account.deposited",
				Payload: []byte(`{"Amount":"lots"}`)}}})
		require.NoError(t, err)
		_, err = r.Load(ctx, "c-1")
		require.ErrorIs(t, err, aggregate.ErrDecode)
		require.ErrorContains(t, err, `"bank.account.deposited"`)
		require.ErrorContains(t, err, `"c-1"`)

		_, err = store.Append(ctx, eventstore.AppendRequest{StreamID: "o-1", StreamType: "shop.order",
			Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: "bank.account.opened",
				Payload: []byte(`{}`)}}})
		require.NoError(t, err)
		_, err = r.Load(ctx, "o-1")
		require.ErrorIs(t, err, aggregate.ErrWrongType)
	})
}

type unregistered struct{}

func TestInvalidConfigurationAndRegistration(t *testing.T) {
	t.Parallel()
	store := eventstore.NewMemory(nil)
	_, err := aggregate.NewRepository[*Account](store, newRegistry(),
		&aggregate.RepositoryConfig{SnapshotEvery: -5})
	require.ErrorIs(t, err, aggregate.ErrInvalidConfig)
	require.ErrorContains(t, err, "SnapshotEvery")
	_, err = aggregate.NewRepository[*Account](store, newRegistry(), &aggregate.RepositoryConfig{UpdateRetries: -2})
	require.ErrorContains(t, err, "UpdateRetries")
	_, err = aggregate.NewRepository[*Account](nil, newRegistry(), nil)
	require.ErrorContains(t, err, "store")

	reg := newRegistry()
	require.ErrorIs(t, aggregate.RegisterEvent[Deposited](reg, "other.name"), aggregate.ErrRegistration)
	require.ErrorIs(t, aggregate.RegisterEvent[unregistered](reg, "bank.account.opened"), aggregate.ErrRegistration)
	require.ErrorIs(t, aggregate.RegisterEvent[*unregistered](reg, "ptr"), aggregate.ErrRegistration)
	require.ErrorIs(t, aggregate.RegisterEvent[unregistered](reg, ""), aggregate.ErrRegistration)
	_, err = aggregate.NewRepository[*Account](store, reg, nil)
	require.ErrorIs(t, err, aggregate.ErrRegistration, "a registry with errors refuses to build repositories")

	_, err = aggregate.NewRepository[*upcastAccount](store, newRegistry(), nil)
	require.ErrorContains(t, err, "not registered")

	r := repo(t, store, nil)
	a := r.New("x")
	aggregate.Raise(a, unregistered{})
	err = r.Save(context.Background(), a)
	require.ErrorIs(t, err, aggregate.ErrUnregisteredEvent)
	require.ErrorContains(t, err, "unregistered")
}

func TestSaveTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := postgresStore(t)
	r := repo(t, store, nil)

	tx, err := store.Begin(ctx)
	require.NoError(t, err)
	a := r.New("tx-1")
	require.NoError(t, a.Open("ann"))
	require.NoError(t, r.SaveTx(ctx, tx, a))
	require.NoError(t, tx.Rollback(ctx))
	_, err = r.Load(ctx, "tx-1")
	require.ErrorIs(t, err, aggregate.ErrNotFound, "rolled back with the caller's transaction")

	tx, err = store.Begin(ctx)
	require.NoError(t, err)
	a = r.New("tx-1")
	require.NoError(t, a.Open("ann"))
	require.NoError(t, r.SaveTx(ctx, tx, a))
	_, err = tx.Exec(ctx, "SELECT 1") // the caller's own work in the same transaction
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	got, err := r.Load(ctx, "tx-1")
	require.NoError(t, err)
	require.Equal(t, "ann", got.Owner)

	mem := repo(t, eventstore.NewMemory(nil), nil)
	m := mem.New("m")
	require.NoError(t, m.Open("x"))
	require.ErrorIs(t, mem.SaveTx(ctx, nil, m), aggregate.ErrNotTransactional)
}

// recordingStager is a Stager that appends through the store and records what the repository handed it.
type recordingStager struct {
	batches []aggregate.Batch
	tx      bool
}

func (s *recordingStager) Append(ctx context.Context, store eventstore.Store, b aggregate.Batch) (
	eventstore.AppendResult, error) {
	s.batches = append(s.batches, b)
	return store.Append(ctx, b.Request)
}

func (s *recordingStager) AppendTx(ctx context.Context, tx pgx.Tx, store eventstore.TransactionalStore,
	b aggregate.Batch) (eventstore.AppendResult, error) {
	s.batches = append(s.batches, b)
	s.tx = true
	return store.AppendTx(ctx, tx, b.Request)
}

func TestStagerReceivesDomainEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := postgresStore(t)
	st := &recordingStager{}
	r := repo(t, store, &aggregate.RepositoryConfig{Stager: st})
	a := r.New("st")
	require.NoError(t, a.Open("ann"))
	require.NoError(t, a.Deposit(3))
	require.NoError(t, r.Save(ctx, a))
	require.Len(t, st.batches, 1)
	require.Equal(t, []any{Opened{Owner: "ann"}, Deposited{Amount: 3}}, st.batches[0].Events)
	require.Equal(t, "bank.account.deposited", st.batches[0].Request.Events[1].Type)
	require.Equal(t, eventstore.NoStream, st.batches[0].Request.Expected)

	tx, err := store.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, a.Withdraw(1))
	require.NoError(t, r.SaveTx(ctx, tx, a))
	require.True(t, st.tx)
	require.Equal(t, eventstore.ExpectedVersion(2), st.batches[1].Request.Expected)
}

func TestManyAggregatesInterleaved(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store eventstore.Store) {
		ctx := context.Background()
		r := repo(t, store, nil)
		for i := range 20 {
			_, err := r.Create(ctx, fmt.Sprintf("acct-%d", i), func(a *Account) error {
				if err := a.Open("owner"); err != nil {
					return err
				}
				return a.Deposit(int64(i + 1))
			})
			require.NoError(t, err)
		}
		for i := range 20 {
			a, err := r.Load(ctx, fmt.Sprintf("acct-%d", i))
			require.NoError(t, err)
			require.Equal(t, int64(i+1), a.Balance)
		}
	})
}
