package eventstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/eventstore/eventstoretest"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// smallPartitions are partitions of 20 positions (the first one takes positions 1 to 20), so the suites' appends
// cross partition boundaries, 25 of them ahead (a suite's case draws at most a few hundred positions, failed
// appends included).
func smallPartitions(schema string) *eventstore.PartitionConfig {
	return &eventstore.PartitionConfig{Schema: schema, Size: 20, Ahead: 25, Headroom: 1}
}

// newPartitioned returns a store on a new schema whose events table was converted to partitions (empty).
func newPartitioned(t *testing.T, cfg func(schema string) *eventstore.PartitionConfig) (*eventstore.PostgresStore,
	*eventstore.Partitions) {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	parts, err := eventstore.NewPartitions(pool, cfg(schema))
	require.NoError(t, err)
	_, err = parts.Convert(context.Background())
	require.NoError(t, err)
	s, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema, MaxGapWait: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s, parts
}

// The whole conformance suite on a partitioned events table: concurrency control through the stream heads,
// event-ID uniqueness through event_ids, the gap-safe log through the partitioned parent's lock.
func TestPartitionedConformance(t *testing.T) {
	t.Parallel()
	eventstoretest.Run(t, func(t *testing.T) eventstore.Store {
		s, _ := newPartitioned(t, smallPartitions)
		return s
	})
}

func TestPartitionConfigValidation(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for field, cfg := range map[string]*eventstore.PartitionConfig{
		"Schema":      {Schema: " "},
		"Size":        {Size: -1},
		"Ahead":       {Ahead: -1},
		"Headroom":    {Headroom: -5},
		"LockTimeout": {LockTimeout: -time.Second},
	} {
		_, err := eventstore.NewPartitions(pool, cfg)
		var ce *stagehand.ConfigError
		require.ErrorAs(t, err, &ce, field)
		require.Equal(t, field, ce.Field)
		require.ErrorIs(t, err, eventstore.ErrInvalidConfig)
	}
	_, err := eventstore.NewPartitions(nil, nil)
	require.ErrorIs(t, err, eventstore.ErrInvalidConfig)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func appendOne(t *testing.T, s eventstore.Store, stream string, expected eventstore.ExpectedVersion, n int) eventstore.AppendResult {
	t.Helper()
	evs := make([]eventstore.EventData, n)
	for i := range evs {
		evs[i] = eventstore.EventData{Type: "x", Payload: []byte(`{}`)}
	}
	res, err := s.Append(context.Background(), eventstore.AppendRequest{StreamID: stream, StreamType: "t",
		Expected: expected, Events: evs})
	require.NoError(t, err)
	return res
}

// A reader meeting a gap at the end of one partition, with later positions committed in the next, waits for the
// transaction that drew it: inserts through the partitioned parent hold RowExclusiveLock on the parent (the table
// the reader names), whichever partition the row goes to. An aborted position across the boundary is passed.
func TestPartitionedGapSafeAcrossBoundary(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s, _ := newPartitioned(t, func(schema string) *eventstore.PartitionConfig {
		return &eventstore.PartitionConfig{Schema: schema, Size: 10, Ahead: 2, Headroom: 1}
	}) // the first partition ends at position 10
	for i := range 8 {
		appendOne(t, s, fmt.Sprintf("before-%d", i), eventstore.NoStream, 1) // positions 1..8
	}
	begin := func() pgx.Tx {
		tx, err := s.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		return tx
	}
	held, aborted := begin(), begin()
	heldRes, err := s.AppendTx(ctx, held, eventstore.AppendRequest{StreamID: "held", Expected: eventstore.NoStream,
		Events: []eventstore.EventData{{Type: "x", Payload: []byte(`{}`)}}})
	require.NoError(t, err)
	abortedRes, err := s.AppendTx(ctx, aborted, eventstore.AppendRequest{StreamID: "aborted",
		Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: "x", Payload: []byte(`{}`)}}})
	require.NoError(t, err)
	require.Equal(t, int64(9), heldRes.Records[0].Position)
	require.Equal(t, int64(10), abortedRes.Records[0].Position) // the first partition's last position
	after := appendOne(t, s, "after", eventstore.NoStream, 2)   // positions 11, 12: the second partition
	require.Equal(t, int64(11), after.Records[0].Position)

	// Which relations the open appends lock: the parent, by the name the reader looks up.
	var parentHolders int64
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT count(DISTINCT virtualtransaction) FROM pg_locks
		WHERE relation = to_regclass($1) AND mode = 'RowExclusiveLock'`,
		pgx.Identifier{s.Schema(), "events"}.Sanitize()).Scan(&parentHolders))
	require.Equal(t, int64(2), parentHolders)

	read := func() eventstore.LogPage {
		page, err := s.ReadLog(ctx, eventstore.LogQuery{After: 8})
		require.NoError(t, err)
		return page
	}
	for range 3 {
		page := read()
		require.Equal(t, int64(8), page.Last, "the reader passed a position an open transaction can still commit")
		require.Empty(t, page.Records)
	}
	require.NoError(t, aborted.Rollback(ctx))
	page := read()
	require.Equal(t, int64(8), page.Last, "the held transaction can still commit position 9")
	require.NoError(t, held.Commit(ctx))
	page = read()
	var got []int64
	for _, r := range page.Records {
		got = append(got, r.Position)
	}
	require.Equal(t, []int64{9, 11, 12}, got, "9 committed last, 10 aborted, 11 and 12 in the next partition")
	require.Equal(t, int64(12), page.Last)
}

// An append whose position has no partition fails with a typed error and appends nothing; Ensure creates the
// partitions ahead and the next append succeeds.
func TestAppendPastTheLastPartitionFailsTyped(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s, parts := newPartitioned(t, func(schema string) *eventstore.PartitionConfig {
		return &eventstore.PartitionConfig{Schema: schema, Size: 10, Ahead: 1, Headroom: 1}
	})
	st, err := parts.Status(ctx)
	require.NoError(t, err)
	require.True(t, st.Partitioned)
	require.Equal(t, int64(21), st.End, "[1, 11) and one partition ahead")
	require.Equal(t, int64(20), st.Headroom())
	seq := pgx.Identifier{s.Schema(), "events_position_seq"}.Sanitize()
	pgtest.Exec(t, s.Pool(), `SELECT setval('`+seq+`', 20)`)

	_, err = s.Append(ctx, eventstore.AppendRequest{StreamID: "s", Expected: eventstore.NoStream,
		Events: []eventstore.EventData{{Type: "x", Payload: []byte(`{}`)}}})
	var np *eventstore.NoPartitionError
	require.ErrorAs(t, err, &np)
	require.ErrorIs(t, err, eventstore.ErrNoPartition)
	require.Equal(t, int64(21), np.Position)
	_, err = s.ReadStream(ctx, "", "s", 1)
	require.ErrorIs(t, err, eventstore.ErrStreamNotFound, "nothing appended, not even the stream's head")

	// The Transactional save's path (one batch) fails the same way.
	_, err = s.AppendQueued(ctx, eventstore.AppendRequest{StreamID: "s", Expected: eventstore.NoStream,
		Events: []eventstore.EventData{{Type: "x", Payload: []byte(`{}`)}}}, nil)
	require.ErrorIs(t, err, eventstore.ErrNoPartition)

	created, err := parts.Ensure(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, created)
	require.Equal(t, int64(21), created[0].From)
	res := appendOne(t, s, "s", eventstore.NoStream, 1)
	require.Equal(t, int64(23), res.Records[0].Position)
	again, err := parts.Ensure(ctx)
	require.NoError(t, err)
	require.Empty(t, again, "Ensure creates nothing when the partitions ahead exist")
}

// Ensure and Archive refuse an events table that was never converted; Status says it is not partitioned.
func TestPartitionsOnAnUnconvertedTable(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	pool, schema := pgtest.Migrated(t)
	parts, err := eventstore.NewPartitions(pool, &eventstore.PartitionConfig{Schema: schema})
	require.NoError(t, err)
	st, err := parts.Status(ctx)
	require.NoError(t, err)
	require.False(t, st.Partitioned)
	_, err = parts.Ensure(ctx)
	require.ErrorIs(t, err, eventstore.ErrNotPartitioned)
	_, err = parts.Archive(ctx, eventstore.ArchiveRequest{})
	require.ErrorIs(t, err, eventstore.ErrNotPartitioned)
	_, other := pgtest.Schema(t) // not migrated
	parts, err = eventstore.NewPartitions(pool, &eventstore.PartitionConfig{Schema: other})
	require.NoError(t, err)
	_, err = parts.Convert(ctx)
	require.ErrorContains(t, err, "stagehand.Migrate")
}

// seed inserts streams×versions events with SQL, positions in stream-major order.
func seed(t *testing.T, pool interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, schema string, streams, versions int) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO `+pgx.Identifier{schema, "events"}.Sanitize()+`
		(tenant_id, stream_id, stream_type, version, event_id, event_type, payload, occurred_at)
		SELECT '`+stagehand.NoTenant+`', 'seed-' || s, 'seed', v, gen_random_uuid(), 'seeded', '{"n":1}', now()
		FROM generate_series(1, $1) s, generate_series(1, $2) v ORDER BY s, v`, streams, versions)
	require.NoError(t, err)
}

// Converting a live, non-empty table: writers append throughout (through a store that was running before the
// conversion, and one made after), racing pairs still get concurrency conflicts and never a raw SQLSTATE, nothing
// is lost or duplicated, every stream's head equals its highest version, and the log reads every event once.
func TestConvertLiveTable(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	pool, schema := pgtest.Migrated(t)
	seed(t, pool, schema, 500, 40) // 20,000 events
	cfg := &eventstore.PostgresConfig{Schema: schema, MaxGapWait: 100 * time.Millisecond}
	before, err := eventstore.NewPostgres(pool, cfg)
	require.NoError(t, err)
	t.Cleanup(before.Close)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var once sync.Once
	halt := func() {
		once.Do(func() { close(stop) })
		wg.Wait()
	}
	t.Cleanup(halt) // before the schema's cleanup runs, even when the test fails
	var mu sync.Mutex
	var failures []error
	appended, conflicts := 0, 0
	fail := func(err error) {
		mu.Lock()
		failures = append(failures, err)
		mu.Unlock()
	}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := eventstore.ExpectedVersion(0)
			for {
				select {
				case <-stop:
					return
				default:
				}
				res, err := before.Append(ctx, eventstore.AppendRequest{StreamID: fmt.Sprintf("writer-%d", w),
					Expected: v, Events: []eventstore.EventData{{Type: "x", Payload: []byte(`{}`)}}})
				if err != nil {
					fail(fmt.Errorf("writer %d: %w", w, err))
					return
				}
				v = eventstore.ExpectedVersion(res.Version)
				mu.Lock()
				appended++
				mu.Unlock()
			}
		}()
	}
	// Two writers racing on one stream with exact versions, read back each time.
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				info, err := before.Stream(ctx, "", "raced")
				v := info.Version
				if err != nil && !errors.Is(err, eventstore.ErrStreamNotFound) {
					fail(fmt.Errorf("racer %d: %w", r, err))
					return
				}
				_, err = before.Append(ctx, eventstore.AppendRequest{StreamID: "raced",
					Expected: eventstore.ExpectedVersion(v), Events: []eventstore.EventData{{Type: "x",
						Payload: []byte(`{}`)}}})
				mu.Lock()
				switch {
				case err == nil:
					appended++
				case errors.Is(err, eventstore.ErrConcurrencyConflict):
					conflicts++
				default:
					failures = append(failures, fmt.Errorf("racer %d: %w", r, err))
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	parts, err := eventstore.NewPartitions(pool, &eventstore.PartitionConfig{Schema: schema, Size: 5000,
		Headroom: 5000})
	require.NoError(t, err)
	res, err := parts.Convert(ctx)
	require.NoError(t, err)
	t.Logf("converted 20,000 events live: copy %v, validate %v, swap (appends held) %v, total %v",
		res.Copy, res.Validate, res.Swap, res.Duration)
	// The first partition ends at the first multiple of Size (plus one) past the positions drawn when the bound was
	// set, plus Headroom: at least 20,000 were drawn (the seeded events), and how many the writers added by then
	// depends on the machine's speed.
	require.Zero(t, (res.First.To-1)%5000, "the first partition's bound is a multiple of Size, plus one")
	require.GreaterOrEqual(t, res.First.To, int64(25001), "the bound is past the seeded positions and Headroom")
	var firstMax int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(max(position), 0) FROM `+
		pgx.Identifier{schema, res.First.Name}.Sanitize()).Scan(&firstMax))
	require.Less(t, firstMax, res.First.To, "every event in the first partition is below its bound")
	require.NotEmpty(t, res.Created)
	after, err := eventstore.NewPostgres(pool, cfg)
	require.NoError(t, err)
	t.Cleanup(after.Close)
	appendOne(t, after, "made-after", eventstore.NoStream, 3)
	var lastMax int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(position) FROM `+
		pgx.Identifier{schema, "events"}.Sanitize()).Scan(&lastMax))
	// Positions drawn later are higher than those drawn when the bound was set, so this bounds them from above.
	require.LessOrEqual(t, res.First.To-1-5000, lastMax+5000,
		"the bound is the first multiple of Size past the drawn positions and Headroom, not beyond")
	time.Sleep(300 * time.Millisecond)
	halt()
	require.Empty(t, failures)
	t.Logf("%d appends during the test, %d conflicts", appended, conflicts)

	st, err := parts.Status(ctx)
	require.NoError(t, err)
	require.True(t, st.Partitioned)
	require.GreaterOrEqual(t, st.Headroom(), int64(5000), "partitions ahead of the log")
	again, err := parts.Convert(ctx)
	require.NoError(t, err)
	require.True(t, again.Already)

	events := pgx.Identifier{schema, "events"}.Sanitize()
	total := pgtest.Count(t, pool, `SELECT count(*) FROM `+events)
	require.Equal(t, int64(20000+appended+3), total)
	require.Equal(t, total, pgtest.Count(t, pool, `SELECT count(*) FROM `+pgx.Identifier{schema, "event_ids"}.Sanitize()))
	require.Zero(t, pgtest.Count(t, pool, `SELECT count(*) FROM (SELECT tenant_id, stream_id, max(version) AS v,
			count(*) AS n, min(position) AS first, max(position) AS last FROM `+events+` GROUP BY 1, 2) e
		FULL JOIN `+pgx.Identifier{schema, "event_streams"}.Sanitize()+` h USING (tenant_id, stream_id)
		WHERE h.version IS DISTINCT FROM e.v OR e.n <> e.v OR h.first_position IS DISTINCT FROM e.first
			OR h.last_position IS DISTINCT FROM e.last`), "every head is its stream's highest version and "+
		"positions, every stream's versions are 1..n")
	var n int64
	last := int64(0)
	for q := (eventstore.LogQuery{Limit: 5000}); ; {
		page, err := after.ReadLog(ctx, q)
		require.NoError(t, err)
		for _, r := range page.Records {
			require.Greater(t, r.Position, last)
			last = r.Position
		}
		n += int64(len(page.Records))
		if page.Last == q.After {
			break
		}
		q.After = page.Last
	}
	require.Equal(t, total, n, "the log reads every event once")
}

// Archiving: refused while a log follower, an outbox watermark, parked events or stream loads still need the
// partition; then archived oldest first without breaking what remains: a stream read from a snapshot taken after
// the archived events, appends to streams whose history is archived, the log after the archived range, the
// migration history, and the position sequence (owned by the partitioned table, not by the first partition).
// Reads that need archived events fail with a typed error naming the stream and the range.
func TestArchive(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s, parts := newPartitioned(t, func(schema string) *eventstore.PartitionConfig {
		return &eventstore.PartitionConfig{Schema: schema, Size: 10, Ahead: 3, Headroom: 1}
	})
	pool, schema := s.Pool(), s.Schema()
	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	appendOne(t, s, "covered", eventstore.NoStream, 5) // positions 1..5
	appendOne(t, s, "bare", eventstore.NoStream, 3)    // 6..8
	appendOne(t, s, "long", eventstore.NoStream, 2)    // 9, 10: the first partition is full
	appendOne(t, s, "long", 2, 2)                      // 11, 12
	covered := appendOne(t, s, "covered", 5, 1)        // 13
	require.Equal(t, int64(13), covered.Records[0].Position)
	require.NoError(t, s.SaveSnapshot(ctx, eventstore.Snapshot{StreamID: "covered", StreamType: "t", Version: 6,
		SchemaVersion: 1, Payload: []byte("state at 6")}))

	pgtest.Exec(t, pool, `INSERT INTO `+q("checkpoints")+` (name, kind, reset_group, position)
		VALUES ('projection:slow', 'projection', 'slow', 7)`)
	pgtest.Exec(t, pool, `INSERT INTO `+q("outbox_watermarks")+` (name, position, updated_at)
		VALUES ('reconciler:r', 4, now())`)
	pgtest.Exec(t, pool, `INSERT INTO `+q("projection_parked")+` (projection, checkpoint, position, tenant_id,
		stream_id, stream_type, version, event_id, event_type, attempts, last_error)
		VALUES ('p', 'p', 3, '`+stagehand.NoTenant+`', 'covered', 't', 3, gen_random_uuid(), 'x', 5, 'boom')`)

	_, err := parts.Archive(ctx, eventstore.ArchiveRequest{})
	var refused *eventstore.ArchiveRefusedError
	require.ErrorAs(t, err, &refused)
	require.ErrorIs(t, err, eventstore.ErrArchiveRefused)
	require.Equal(t, "events_p0000000000000000001", refused.Partition)
	require.Len(t, refused.Reasons, 4, "%q", refused.Reasons)
	require.Contains(t, refused.Reasons[0], `log follower "projection:slow" (projection) is at position 7`)
	require.Contains(t, refused.Reasons[1], `outbox watermark "reconciler:r" is at position 4`)
	require.Contains(t, refused.Reasons[2], "1 events parked by projections")
	require.Contains(t, refused.Reasons[3], "2 streams with events in it have no snapshot")

	pgtest.Exec(t, pool, `UPDATE `+q("checkpoints")+` SET position = 13`)
	pgtest.Exec(t, pool, `UPDATE `+q("checkpoints")+` SET reset_requested = true`)
	pgtest.Exec(t, pool, `UPDATE `+q("outbox_watermarks")+` SET position = 10`)
	pgtest.Exec(t, pool, `DELETE FROM `+q("projection_parked"))
	_, err = parts.Archive(ctx, eventstore.ArchiveRequest{})
	require.ErrorAs(t, err, &refused)
	require.Len(t, refused.Reasons, 2, "%q", refused.Reasons)
	require.Contains(t, refused.Reasons[0], "has a rebuild pending")
	pgtest.Exec(t, pool, `UPDATE `+q("checkpoints")+` SET reset_requested = false`)

	_, err = parts.Archive(ctx, eventstore.ArchiveRequest{Partition: "events_p0000000000000000021"})
	require.ErrorContains(t, err, "oldest first")

	res, err := parts.Archive(ctx, eventstore.ArchiveRequest{AllowUncovered: true})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Uncovered, "bare and long")
	require.Equal(t, eventstore.PartitionMoved, res.Partition.State)
	require.Equal(t, int64(10), res.Partition.Events)
	require.Equal(t, schema+"_archive", res.Partition.ArchiveSchema)
	t.Cleanup(func() { pgtest.DropSchema(t, pool, schema+"_archive") })
	require.Equal(t, int64(10), pgtest.Count(t, pool, `SELECT count(*) FROM `+
		pgx.Identifier{schema + "_archive", "events_p0000000000000000001"}.Sanitize()))
	require.Equal(t, int64(3), pgtest.Count(t, pool, `SELECT count(*) FROM `+q("event_ids")),
		"the archived events' IDs are gone, the others kept")

	for _, store := range []*eventstore.PostgresStore{s, fresh(t, s)} {
		// A load from the snapshot reads from the snapshot's own event on: not archived.
		recs, err := store.ReadStream(ctx, "", "covered", 6)
		require.NoError(t, err)
		require.Len(t, recs, 1)

		var archived *eventstore.ArchivedError
		_, err = store.ReadStream(ctx, "", "covered", 1)
		require.ErrorAs(t, err, &archived)
		require.ErrorIs(t, err, eventstore.ErrArchived)
		require.Equal(t, eventstore.ArchivedError{Tenant: stagehand.NoTenant, StreamID: "covered", FromVersion: 1,
			ToVersion: 5, ArchivedFrom: 1, ArchivedTo: 11}, *archived)
		_, err = store.ReadStream(ctx, "", "bare", 0)
		require.ErrorAs(t, err, &archived)
		require.Equal(t, int64(3), archived.ToVersion, "every event of bare is archived; its head says how many")
		_, err = store.Stream(ctx, "", "bare")
		require.ErrorIs(t, err, eventstore.ErrArchived)
		_, err = store.ReadStream(ctx, "", "long", 1)
		require.ErrorAs(t, err, &archived)
		require.Equal(t, int64(2), archived.ToVersion)
		_, err = store.ReadStream(ctx, "", "never", 1)
		require.ErrorIs(t, err, eventstore.ErrStreamNotFound)

		_, err = store.ReadLog(ctx, eventstore.LogQuery{After: 0})
		require.ErrorAs(t, err, &archived)
		require.Equal(t, int64(10), archived.ArchivedTo-1)
		page, err := store.ReadLog(ctx, eventstore.LogQuery{After: 10})
		require.NoError(t, err)
		require.Equal(t, int64(11), page.Records[0].Position, "the log after the archived range reads on")
	}
	_, err = s.Append(ctx, eventstore.AppendRequest{StreamID: "bare", Expected: 2,
		Events: []eventstore.EventData{{Type: "x", Payload: []byte(`{}`)}}})
	require.ErrorIs(t, err, eventstore.ErrConcurrencyConflict, "the head outlives the archived events")
	res4 := appendOne(t, s, "bare", 3, 1)
	require.Equal(t, int64(4), res4.Version)

	// The migration history is untouched: migrating again applies nothing.
	applied, err := stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: schema})
	require.NoError(t, err)
	require.Empty(t, applied)
	list, err := stagehand.Migrations(ctx, pool, schema)
	require.NoError(t, err)
	for _, m := range list {
		require.True(t, m.Applied(), "%03d", m.Version)
	}

	// The next partition is dropped instead; the sequence lives on (the first partition, the old table, is gone
	// from this schema and the next drop is of a partition created as one).
	for range 8 {
		appendOne(t, s, "filler", eventstore.AnyVersion, 1) // to position 22: the second partition is full
	}
	pgtest.Exec(t, pool, `UPDATE `+q("checkpoints")+` SET position = 30`)
	pgtest.Exec(t, pool, `UPDATE `+q("outbox_watermarks")+` SET position = 30`)
	res, err = parts.Archive(ctx, eventstore.ArchiveRequest{Disposition: eventstore.ArchiveDrop,
		AllowUncovered: true})
	require.NoError(t, err)
	require.Equal(t, "events_p0000000000000000011", res.Partition.Name)
	require.Equal(t, eventstore.PartitionDropped, res.Partition.State)
	require.Zero(t, pgtest.Count(t, pool, `SELECT count(*) FROM pg_class WHERE oid = to_regclass($1)`,
		q("events_p0000000000000000011")))
	st, err := parts.Status(ctx)
	require.NoError(t, err)
	require.Len(t, st.Archived, 2)
	require.Equal(t, int64(21), st.Attached[0].From)
	_, err = fresh(t, s).ReadLog(ctx, eventstore.LogQuery{After: 10})
	require.ErrorIs(t, err, eventstore.ErrArchived)
	appendOne(t, s, "after-archive", eventstore.NoStream, 2)
}

// fresh returns another store on s's schema: one that never cached the layout.
func fresh(t *testing.T, s *eventstore.PostgresStore) *eventstore.PostgresStore {
	t.Helper()
	f, err := eventstore.NewPostgres(s.Pool(), &eventstore.PostgresConfig{Schema: s.Schema(),
		MaxGapWait: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(f.Close)
	return f
}

// A stream read on a partitioned table visits only the partitions between the stream's first and last events
// (pruned while the statement runs, from the bounds in its head), not an index of every partition.
func TestStreamReadVisitsOnlyItsPartitions(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s, _ := newPartitioned(t, func(schema string) *eventstore.PartitionConfig {
		return &eventstore.PartitionConfig{Schema: schema, Size: 10, Ahead: 6, Headroom: 1}
	})
	for i := range 25 { // positions 1..25: three partitions
		appendOne(t, s, fmt.Sprintf("filler-%d", i), eventstore.NoStream, 1)
	}
	appendOne(t, s, "late", eventstore.NoStream, 3) // 26..28, in the third partition
	appendOne(t, s, "spread", eventstore.NoStream, 1)
	for range 12 {
		appendOne(t, s, "filler-0", eventstore.AnyVersion, 1)
	}
	appendOne(t, s, "spread", 1, 1) // 29 and 42: the third and the fifth partitions
	plan := func(stream string) string {
		var lines []string
		rows, err := s.Pool().Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) `+
			eventstore.ReadStreamSQL(ctx, s), "__untenanted__", stream, int64(1), nil)
		require.NoError(t, err)
		for rows.Next() {
			var l string
			require.NoError(t, rows.Scan(&l))
			lines = append(lines, l)
		}
		require.NoError(t, rows.Err())
		return strings.Join(lines, "\n")
	}
	visited := func(p string) int {
		n := 0
		for _, l := range strings.Split(p, "\n") {
			if strings.Contains(l, "Index Scan") && !strings.Contains(l, "never executed") {
				n++
			}
		}
		return n - 2 // the two subqueries on the stream's head
	}
	p := plan("late")
	require.Equal(t, 1, visited(p), p)
	p = plan("spread")
	require.Equal(t, 3, visited(p), p)
	recs, err := s.ReadStream(ctx, "", "spread", 1)
	require.NoError(t, err)
	require.Len(t, recs, 2)
}

// A conversion waits at most LockTimeout behind an append in flight (so appends never queue behind it for longer),
// fails without changing the table's layout, and succeeds when run again.
func TestConvertGivesUpOnLockTimeoutAndResumes(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	pool, schema := pgtest.Migrated(t)
	s, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	appendOne(t, s, "a", eventstore.NoStream, 2)
	tx, err := s.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = s.AppendTx(ctx, tx, eventstore.AppendRequest{StreamID: "b", Expected: eventstore.NoStream,
		Events: []eventstore.EventData{{Type: "x", Payload: []byte(`{}`)}}})
	require.NoError(t, err)

	parts, err := eventstore.NewPartitions(pool, &eventstore.PartitionConfig{Schema: schema, Size: 10, Headroom: 1,
		LockTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	start := time.Now()
	_, err = parts.Convert(ctx)
	require.ErrorContains(t, err, "lock timeout")
	require.Less(t, time.Since(start), 5*time.Second)
	st, err := parts.Status(ctx)
	require.NoError(t, err)
	require.False(t, st.Partitioned)

	require.NoError(t, tx.Commit(ctx))
	res, err := parts.Convert(ctx)
	require.NoError(t, err)
	require.False(t, res.Already)
	require.EqualValues(t, 2, res.Streams)
	recs, err := s.ReadStream(ctx, "", "b", 1)
	require.NoError(t, err)
	require.Len(t, recs, 1, "the append that held the conversion back is there")
}

// An archive that stopped after its detach (the partition detached, its IDs not yet removed, not yet moved) is
// finished by the next Archive, whatever it asks.
func TestArchiveResumesAfterAnInterruptedDetach(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s, parts := newPartitioned(t, func(schema string) *eventstore.PartitionConfig {
		return &eventstore.PartitionConfig{Schema: schema, Size: 10, Ahead: 2, Headroom: 1}
	})
	q := func(name string) string { return pgx.Identifier{s.Schema(), name}.Sanitize() }
	for i := range 12 {
		appendOne(t, s, fmt.Sprintf("s-%d", i), eventstore.NoStream, 1)
	}
	// What Archive leaves when it stops between its detach and the rest.
	pgtest.Exec(t, s.Pool(), `INSERT INTO `+q("event_archives")+` (partition, from_position, to_position, events,
		state) VALUES ('events_p0000000000000000001', 1, 11, 10, 'detaching')`)
	pgtest.Exec(t, s.Pool(), `ALTER TABLE `+q("events")+` DETACH PARTITION `+q("events_p0000000000000000001"))
	st, err := parts.Status(ctx)
	require.NoError(t, err)
	require.Len(t, st.Archived, 1)
	require.Equal(t, eventstore.PartitionDetaching, st.Archived[0].State)

	res, err := parts.Archive(ctx, eventstore.ArchiveRequest{Disposition: eventstore.ArchiveDrop})
	require.NoError(t, err)
	require.Equal(t, "events_p0000000000000000001", res.Partition.Name, "the interrupted archive first")
	require.Equal(t, eventstore.PartitionDropped, res.Partition.State)
	require.EqualValues(t, 10, res.Partition.Events)
	require.Equal(t, int64(2), pgtest.Count(t, s.Pool(), `SELECT count(*) FROM `+q("event_ids")))
	st, err = parts.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, eventstore.PartitionDropped, st.Archived[0].State)
	require.Equal(t, int64(11), st.Attached[0].From)
}

// Keep creates partitions ahead as the log advances, and returns when its context ends.
func TestKeepCreatesPartitionsAhead(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s, parts := newPartitioned(t, func(schema string) *eventstore.PartitionConfig {
		return &eventstore.PartitionConfig{Schema: schema, Size: 10, Ahead: 1, Headroom: 1}
	})
	_, err := parts.Ensure(ctx)
	require.NoError(t, err)
	_, err = parts.Ensure(ctx)
	require.NoError(t, err)
	require.ErrorContains(t, parts.Keep(ctx, 0), "interval must be positive")
	kctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- parts.Keep(kctx, 20*time.Millisecond) }()
	seq := pgx.Identifier{s.Schema(), "events_position_seq"}.Sanitize()
	pgtest.Exec(t, s.Pool(), `SELECT setval('`+seq+`', 55)`) // past the last partition (it ends at 20)
	pgtest.Eventually(t, 10*time.Second, func() bool {
		st, err := parts.Status(ctx)
		require.NoError(t, err)
		return st.End == 71
	}, "partitions up to the one holding 56, and one more")
	appendOne(t, s, "after", eventstore.NoStream, 1)
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Keep did not return after its context ended")
	}
}
