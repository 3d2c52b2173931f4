// Package eventstoretest is the conformance suite every eventstore.Store implementation must pass. Each case's name
// says which part of the contract it checks; the PostgreSQL and in-memory stores both run it.
//
//	func TestConformance(t *testing.T) {
//		eventstoretest.Run(t, func(t *testing.T) eventstore.Store { return newStore(t) })
//	}
package eventstoretest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
)

// Factory returns a new, empty store for one test case. Register cleanups on t.
type Factory func(t *testing.T) eventstore.Store

// Run runs every conformance case against stores made by newStore. Cases that need transactions run only when the
// store implements eventstore.TransactionalStore, the stream lifecycle's cases only when it implements
// eventstore.LifecycleStore.
func Run(t *testing.T, newStore Factory) {
	cases := []struct {
		name string
		fn   func(t *testing.T, s eventstore.Store)
	}{
		{"AtomicAppend/AllEventsOfAnAppendGetConsecutiveVersions", testAppendAssignsVersions},
		{"AtomicAppend/DuplicateEventIDAppendsNothing", testDuplicateEventIDAppendsNothing},
		{"AtomicAppend/InvalidRequestsAreRejected", testInvalidAppend},
		{"AtomicAppend/HostileNamesAreRejectedWithTypedErrors", testHostileNames},
		{"OptimisticConcurrency/NoStream", testExpectNoStream},
		{"OptimisticConcurrency/RacingCreatesHaveOneWinner", testRacingCreates},
		{"OptimisticConcurrency/ExactVersion", testExpectExact},
		{"OptimisticConcurrency/AnyVersion", testExpectAny},
		{"OptimisticConcurrency/StreamExists", testExpectStreamExists},
		{"OptimisticConcurrency/ConcurrentWritersOnOneStreamNeverCorruptIt", testConcurrentWritersOneStream},
		{"StreamOrder/ReadStreamFromVersion", testReadStreamFrom},
		{"StreamOrder/MissingStreamIsNotFound", testReadMissingStream},
		{"GlobalLog/PositionsIncreaseAndPagesContinue", testLogPaging},
		{"GlobalLog/FiltersSkipButAdvance", testLogFilters},
		{"GlobalLog/ConcurrentAppendsAreReadExactlyOnceInOrder", testLogUnderConcurrentAppends},
		{"GlobalLog/HeadPosition", testHeadPosition},
		{"Tenancy/StreamIdentityIncludesTenant", testTenantIdentity},
		{"Tenancy/NoTenantRoundTrips", testNoTenant},
		{"Metadata/EventFieldsRoundTrip", testRoundTrip},
		{"Metadata/PerEventFieldsRoundTripInOneAppend", testPerEventFields},
		{"Snapshots/LatestVersionWins", testSnapshots},
		{"Snapshots/DeleteRemovesOneStreamsSnapshot", testDeleteSnapshot},
		{"Transactional/SnapshotTxCommitsAndRollsBackWithTheAppend", testSnapshotTx},
		{"Transactional/StageErrorRollsBackTheAppend", testStageErrorRollsBack},
		{"Transactional/ConflictDoesNotRunStage", testConflictSkipsStage},
		{"Transactional/AppendTxFollowsTheCallersTransaction", testAppendTx},
		{"GlobalLog/GapSafeWhenCommitsAndAbortsAreOutOfOrder", testGapSafeOutOfOrder},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, newStore(t))
		})
	}
	for _, c := range lifecycleCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s, ok := newStore(t).(eventstore.LifecycleStore)
			if !ok {
				t.Skip("the store does not implement eventstore.LifecycleStore")
			}
			c.fn(t, s)
		})
	}
}

func ctx() context.Context { return context.Background() }

func events(n int, typ string) []eventstore.EventData {
	out := make([]eventstore.EventData, n)
	for i := range out {
		out[i] = eventstore.EventData{Type: typ, Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	return out
}

func appendN(t *testing.T, s eventstore.Store, tenant, stream, streamType string, expected eventstore.ExpectedVersion,
	n int) eventstore.AppendResult {
	t.Helper()
	res, err := s.Append(ctx(), eventstore.AppendRequest{Tenant: tenant, StreamID: stream, StreamType: streamType,
		Expected: expected, Events: events(n, "test.happened")})
	noError(t, err)
	return res
}

func readAll(t *testing.T, s eventstore.Store, q eventstore.LogQuery) []eventstore.Record {
	t.Helper()
	var out []eventstore.Record
	for {
		page, err := s.ReadLog(ctx(), q)
		noError(t, err)
		out = append(out, page.Records...)
		if page.Last == q.After {
			return out
		}
		q.After = page.Last
	}
}

func versions(rs []eventstore.Record) []int64 {
	out := make([]int64, len(rs))
	for i, r := range rs {
		out[i] = r.Version
	}
	return out
}

func seq(from, to int64) []int64 {
	var out []int64
	for v := from; v <= to; v++ {
		out = append(out, v)
	}
	return out
}

func testAppendAssignsVersions(t *testing.T, s eventstore.Store) {
	res := appendN(t, s, "", "a-1", "acct", eventstore.NoStream, 3)
	equal(t, int64(3), res.Version)
	equal(t, []int64{1, 2, 3}, versions(res.Records))
	for i := 1; i < len(res.Records); i++ {
		greater(t, res.Records[i].Position, res.Records[i-1].Position)
	}
	res = appendN(t, s, "", "a-1", "acct", 3, 2)
	equal(t, []int64{4, 5}, versions(res.Records))
	got, err := s.ReadStream(ctx(), "", "a-1", 0)
	noError(t, err)
	equal(t, seq(1, 5), versions(got))
}

func testDuplicateEventIDAppendsNothing(t *testing.T, s eventstore.Store) {
	first := appendN(t, s, "", "a-1", "acct", eventstore.NoStream, 1)
	evs := events(3, "test.happened")
	evs[2].EventID = first.Records[0].EventID // already stored, in another stream
	_, err := s.Append(ctx(), eventstore.AppendRequest{StreamID: "a-2", StreamType: "acct",
		Expected: eventstore.NoStream, Events: evs})
	errorIs(t, err, eventstore.ErrDuplicateEventID)
	_, err = s.ReadStream(ctx(), "", "a-2", 0)
	errorIs(t, err, eventstore.ErrStreamNotFound, "a failed append must append none of its events")

	id := uuid.Must(uuid.NewV7())
	evs = events(2, "test.happened")
	evs[0].EventID, evs[1].EventID = id, id
	_, err = s.Append(ctx(), eventstore.AppendRequest{StreamID: "a-3", Expected: eventstore.AnyVersion, Events: evs})
	errorIs(t, err, eventstore.ErrDuplicateEventID)
	head, err := s.HeadPosition(ctx())
	noError(t, err)
	equal(t, first.Records[0].Position, head, "nothing after the first append may be visible")
}

func testInvalidAppend(t *testing.T, s eventstore.Store) {
	_, err := s.Append(ctx(), eventstore.AppendRequest{StreamID: "", Events: events(1, "x")})
	errorIs(t, err, eventstore.ErrInvalidAppend)
	_, err = s.Append(ctx(), eventstore.AppendRequest{StreamID: "s"})
	errorIs(t, err, eventstore.ErrInvalidAppend)
	_, err = s.Append(ctx(), eventstore.AppendRequest{StreamID: "s", Events: []eventstore.EventData{{Type: ""}}})
	errorIs(t, err, eventstore.ErrInvalidAppend)
	_, err = s.Append(ctx(), eventstore.AppendRequest{StreamID: "s", Expected: -7, Events: events(1, "x")})
	errorIs(t, err, eventstore.ErrInvalidAppend)
}

// testHostileNames: a tenant, stream ID, type or metadata value that PostgreSQL cannot store (NUL, invalid UTF-8),
// or one past the documented lengths, fails before anything is stored with ErrInvalidAppend naming the field, in
// every store alike, and never with a raw SQLSTATE. A log filter on such a tenant fails the same way.
func testHostileNames(t *testing.T, s eventstore.Store) {
	long := func(n int) string { return string(make([]byte, n)) }
	big := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = 'a'
		}
		return string(b)
	}
	cases := []struct {
		name, want string
		req        eventstore.AppendRequest
	}{
		{"tenant NUL", "NUL", eventstore.AppendRequest{Tenant: "a\x00b", StreamID: "s", Events: events(1, "x")}},
		{"tenant 1MB", "longer than 255", eventstore.AppendRequest{Tenant: big(1 << 20), StreamID: "s",
			Events: events(1, "x")}},
		{"tenant bad UTF-8", "UTF-8", eventstore.AppendRequest{Tenant: "a\xffb", StreamID: "s", Events: events(1, "x")}},
		{"stream NUL", "StreamID", eventstore.AppendRequest{StreamID: long(3), Events: events(1, "x")}},
		{"stream too long", "StreamID", eventstore.AppendRequest{StreamID: big(eventstore.MaxStreamIDLen + 1),
			Events: events(1, "x")}},
		{"stream type", "StreamType", eventstore.AppendRequest{StreamID: "s", StreamType: "t\x00",
			Events: events(1, "x")}},
		{"event type", "Type", eventstore.AppendRequest{StreamID: "s", Events: events(1, "x\xc3")}},
		{"metadata value", "metadata value", eventstore.AppendRequest{StreamID: "s", Events: []eventstore.EventData{
			{Type: "x", Payload: []byte(`{}`), Metadata: eventstore.Metadata{"k": "v\x00"}}}}},
	}
	for _, c := range cases {
		_, err := s.Append(ctx(), c.req)
		errorIs(t, err, eventstore.ErrInvalidAppend, c.name)
		errorContains(t, err, c.want, c.name)
		notContains(t, err.Error(), "SQLSTATE", c.name)
	}
	_, err := s.Append(ctx(), eventstore.AppendRequest{Tenant: "a\x00", StreamID: "s", Events: events(1, "x")})
	errorIs(t, err, stagehand.ErrInvalidTenant)
	_, err = s.ReadLog(ctx(), eventstore.LogQuery{Tenants: []string{"a\x00b"}})
	errorIs(t, err, stagehand.ErrInvalidTenant)
	head, err := s.HeadPosition(ctx())
	noError(t, err)
	zero(t, head, "nothing was stored")
	// Separators and non-ASCII are ordinary tenant characters.
	_, err = s.Append(ctx(), eventstore.AppendRequest{Tenant: "evil,B;€", StreamID: "s", Events: events(1, "x")})
	noError(t, err)
}

func requireConflict(t *testing.T, err error, stream string, expected eventstore.ExpectedVersion, actual int64) {
	t.Helper()
	errorIs(t, err, eventstore.ErrConcurrencyConflict)
	var ce *eventstore.ConflictError
	errorAs(t, err, &ce)
	equal(t, stream, ce.StreamID)
	equal(t, expected, ce.Expected)
	equal(t, actual, ce.Actual)
	equal(t, "", ce.Reason, "a failed version check is not a transaction conflict")
	contains(t, err.Error(), stream)
	notContains(t, err.Error(), "SQLSTATE", "no raw driver error may reach the user")
}

func testExpectNoStream(t *testing.T, s eventstore.Store) {
	appendN(t, s, "", "s", "t", eventstore.NoStream, 2)
	_, err := s.Append(ctx(), eventstore.AppendRequest{StreamID: "s", Expected: eventstore.NoStream,
		Events: events(1, "x")})
	requireConflict(t, err, "s", eventstore.NoStream, 2)
	got, _ := s.ReadStream(ctx(), "", "s", 0)
	length(t, got, 2, "a conflicting append appends nothing")
}

// testRacingCreates: appends that all expect no stream race to create one: exactly one wins, and every other fails
// its version check (Expected NoStream, no transaction-conflict Reason), which is how a caller tells "already
// exists" from other conflicts. Nothing of the losers is stored.
func testRacingCreates(t *testing.T, s eventstore.Store) {
	const writers = 16
	var wg sync.WaitGroup
	var mu sync.Mutex
	var winners []eventstore.AppendResult
	var unexpected []error
	start := make(chan struct{})
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := s.Append(ctx(), eventstore.AppendRequest{StreamID: "new", StreamType: "t",
				Expected: eventstore.NoStream, Events: events(2, "x")})
			mu.Lock()
			defer mu.Unlock()
			var ce *eventstore.ConflictError
			switch {
			case err == nil:
				winners = append(winners, res)
			case !errors.As(err, &ce) || ce.Expected != eventstore.NoStream || ce.Reason != "":
				unexpected = append(unexpected, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	empty(t, unexpected, "every loser must fail the no-stream check")
	length(t, winners, 1, "exactly one create wins")
	got, err := s.ReadStream(ctx(), "", "new", 0)
	noError(t, err)
	equal(t, []int64{1, 2}, versions(got), "only the winner's events are stored")
	equal(t, winners[0].Records[0].EventID, got[0].EventID)
}

func testExpectExact(t *testing.T, s eventstore.Store) {
	_, err := s.Append(ctx(), eventstore.AppendRequest{StreamID: "s", Expected: 3, Events: events(1, "x")})
	requireConflict(t, err, "s", 3, 0)
	appendN(t, s, "", "s", "t", eventstore.NoStream, 2)
	_, err = s.Append(ctx(), eventstore.AppendRequest{StreamID: "s", Expected: 1, Events: events(1, "x")})
	requireConflict(t, err, "s", 1, 2)
	_, err = s.Append(ctx(), eventstore.AppendRequest{StreamID: "s", Expected: 3, Events: events(1, "x")})
	requireConflict(t, err, "s", 3, 2)
	res := appendN(t, s, "", "s", "t", 2, 1)
	equal(t, int64(3), res.Version)
}

func testExpectAny(t *testing.T, s eventstore.Store) {
	equal(t, int64(2), appendN(t, s, "", "s", "t", eventstore.AnyVersion, 2).Version)
	equal(t, int64(3), appendN(t, s, "", "s", "t", eventstore.AnyVersion, 1).Version)
}

func testExpectStreamExists(t *testing.T, s eventstore.Store) {
	_, err := s.Append(ctx(), eventstore.AppendRequest{StreamID: "s", Expected: eventstore.StreamExists,
		Events: events(1, "x")})
	requireConflict(t, err, "s", eventstore.StreamExists, 0)
	appendN(t, s, "", "s", "t", eventstore.NoStream, 1)
	equal(t, int64(2), appendN(t, s, "", "s", "t", eventstore.StreamExists, 1).Version)
}

func testConcurrentWritersOneStream(t *testing.T, s eventstore.Store) {
	const writers, rounds = 16, 5
	var wg sync.WaitGroup
	var mu sync.Mutex
	successes := 0
	var unexpected []error
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				var expected eventstore.ExpectedVersion
				info, err := s.Stream(ctx(), "", "hot")
				if err == nil {
					expected = eventstore.ExpectedVersion(info.Version)
				} else if !errors.Is(err, eventstore.ErrStreamNotFound) {
					mu.Lock()
					unexpected = append(unexpected, err)
					mu.Unlock()
					return
				}
				_, err = s.Append(ctx(), eventstore.AppendRequest{StreamID: "hot", StreamType: "t",
					Expected: expected, Events: events(1, "x")})
				mu.Lock()
				switch {
				case err == nil:
					successes++
				case !errors.Is(err, eventstore.ErrConcurrencyConflict):
					unexpected = append(unexpected, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	empty(t, unexpected, "every failure must be the typed conflict")
	positive(t, successes)
	got, err := s.ReadStream(ctx(), "", "hot", 0)
	noError(t, err)
	equal(t, seq(1, int64(successes)), versions(got), "versions must be 1..n, no gaps, no duplicates")
}

func testReadStreamFrom(t *testing.T, s eventstore.Store) {
	appendN(t, s, "", "s", "t", eventstore.NoStream, 5)
	got, err := s.ReadStream(ctx(), "", "s", 3)
	noError(t, err)
	equal(t, []int64{3, 4, 5}, versions(got))
	got, err = s.ReadStream(ctx(), "", "s", 6)
	noError(t, err)
	empty(t, got, "reading past the end of an existing stream is empty, not an error")
}

func testReadMissingStream(t *testing.T, s eventstore.Store) {
	_, err := s.ReadStream(ctx(), "", "nope", 0)
	errorIs(t, err, eventstore.ErrStreamNotFound)
	_, err = s.Stream(ctx(), "", "nope")
	errorIs(t, err, eventstore.ErrStreamNotFound)
}

func testLogPaging(t *testing.T, s eventstore.Store) {
	for i := range 7 {
		appendN(t, s, "", fmt.Sprintf("s-%d", i), "t", eventstore.NoStream, 3)
	}
	page, err := s.ReadLog(ctx(), eventstore.LogQuery{Limit: 5})
	noError(t, err)
	length(t, page.Records, 5)
	equal(t, page.Records[4].Position, page.Last)
	all := readAll(t, s, eventstore.LogQuery{Limit: 4})
	length(t, all, 21)
	for i := 1; i < len(all); i++ {
		greater(t, all[i].Position, all[i-1].Position)
	}
	end, err := s.ReadLog(ctx(), eventstore.LogQuery{After: all[len(all)-1].Position})
	noError(t, err)
	empty(t, end.Records)
	equal(t, all[len(all)-1].Position, end.Last, "an empty page keeps the position")
}

func testLogFilters(t *testing.T, s eventstore.Store) {
	_, err := s.Append(ctx(), eventstore.AppendRequest{Tenant: "t1", StreamID: "o-1", StreamType: "order",
		Expected: eventstore.NoStream, Events: append(events(1, "order.placed"), events(1, "order.paid")...)})
	noError(t, err)
	appendN(t, s, "t2", "a-1", "account", eventstore.NoStream, 2)
	last := appendN(t, s, "t1", "o-2", "order", eventstore.NoStream, 1)

	byType := readAll(t, s, eventstore.LogQuery{EventTypes: []string{"order.paid"}})
	length(t, byType, 1)
	equal(t, "order.paid", byType[0].Type)
	jsonEq(t, `{"n":0}`, string(byType[0].Payload))

	byStream := readAll(t, s, eventstore.LogQuery{StreamTypes: []string{"account"}})
	length(t, byStream, 2)
	byTenant := readAll(t, s, eventstore.LogQuery{Tenants: []string{"t1"}})
	length(t, byTenant, 3)

	page, err := s.ReadLog(ctx(), eventstore.LogQuery{EventTypes: []string{"nothing.matches"}})
	noError(t, err)
	empty(t, page.Records)
	equal(t, last.Records[0].Position, page.Last, "filtered-out events still advance the position")

	// A blank tenant in the filter is NoTenant, as in an append: it reads the events appended without a tenant.
	appendN(t, s, "", "n-1", "note", eventstore.NoStream, 2)
	for _, blank := range []string{"", " ", "\t"} {
		q := eventstore.LogQuery{Tenants: []string{blank}}
		noTenant := readAll(t, s, q)
		length(t, noTenant, 2)
		equal(t, stagehand.NoTenant, noTenant[0].Tenant)
		equal(t, blank, q.Tenants[0], "the caller's filter is left as it was")
		both := readAll(t, s, eventstore.LogQuery{Tenants: []string{"t2", blank}})
		length(t, both, 4)
	}
}

func testLogUnderConcurrentAppends(t *testing.T, s eventstore.Store) {
	const writers, perWriter = 8, 25
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				_, err := s.Append(ctx(), eventstore.AppendRequest{StreamID: fmt.Sprintf("w%d-%d", w, i%5),
					StreamType: "t", Expected: eventstore.AnyVersion, Events: events(1+i%3, "x")})
				if err != nil {
					t.Errorf("append: %v", err)
					return
				}
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()

	var got []eventstore.Record
	q := eventstore.LogQuery{Limit: 7}
	finished := false
	for {
		page, err := s.ReadLog(ctx(), q)
		noError(t, err)
		got = append(got, page.Records...)
		q.After = page.Last
		if finished && len(page.Records) == 0 {
			break
		}
		select {
		case <-done:
			finished = true
		default:
			time.Sleep(time.Millisecond)
		}
	}
	head, err := s.HeadPosition(ctx())
	noError(t, err)
	want := readAll(t, s, eventstore.LogQuery{})
	equal(t, len(want), len(got), "the follower must see every committed event exactly once")
	seen := map[uuid.UUID]bool{}
	for i, r := range got {
		isFalse(t, seen[r.EventID], "event %s read twice", r.EventID)
		seen[r.EventID] = true
		equal(t, want[i].Position, r.Position, "the follower must read in position order")
	}
	equal(t, head, got[len(got)-1].Position)
	// Per stream, the log shows versions in order.
	last := map[string]int64{}
	for _, r := range got {
		equal(t, last[r.StreamID]+1, r.Version, "stream %s out of order in the log", r.StreamID)
		last[r.StreamID] = r.Version
	}
}

func testHeadPosition(t *testing.T, s eventstore.Store) {
	head, err := s.HeadPosition(ctx())
	noError(t, err)
	zero(t, head)
	res := appendN(t, s, "", "s", "t", eventstore.NoStream, 3)
	head, err = s.HeadPosition(ctx())
	noError(t, err)
	equal(t, res.Records[2].Position, head)
}

func testTenantIdentity(t *testing.T, s eventstore.Store) {
	appendN(t, s, "acme", "acct-1", "acct", eventstore.NoStream, 2)
	appendN(t, s, "globex", "acct-1", "acct", eventstore.NoStream, 1) // same ID, another tenant: another stream
	a, err := s.ReadStream(ctx(), "acme", "acct-1", 0)
	noError(t, err)
	g, err := s.ReadStream(ctx(), "globex", "acct-1", 0)
	noError(t, err)
	length(t, a, 2)
	length(t, g, 1)
	for _, r := range a {
		equal(t, "acme", r.Tenant)
	}
	equal(t, "globex", g[0].Tenant)
	_, err = s.ReadStream(ctx(), "", "acct-1", 0)
	errorIs(t, err, eventstore.ErrStreamNotFound, "the untenanted stream is a third stream")
	_, err = s.Append(ctx(), eventstore.AppendRequest{Tenant: "globex", StreamID: "acct-1", Expected: 2,
		Events: events(1, "x")})
	requireConflict(t, err, "acct-1", 2, 1)
}

func testNoTenant(t *testing.T, s eventstore.Store) {
	appendN(t, s, "", "s", "t", eventstore.NoStream, 1)
	got, err := s.ReadStream(ctx(), stagehand.NoTenant, "s", 0)
	noError(t, err)
	equal(t, stagehand.NoTenant, got[0].Tenant, "no tenant is stored as the reserved value, never empty")
	info, err := s.Stream(ctx(), "", "s")
	noError(t, err)
	equal(t, stagehand.NoTenant, info.Tenant)
}

func testRoundTrip(t *testing.T, s eventstore.Store) {
	id := uuid.Must(uuid.NewV7())
	at := time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.FixedZone("X", 3600))
	_, err := s.Append(ctx(), eventstore.AppendRequest{Tenant: "acme", StreamID: "o-1", StreamType: "order",
		Expected: eventstore.NoStream, Events: []eventstore.EventData{{
			EventID: id, Type: "order.placed", TypeVersion: 3, Payload: []byte(`{"total": 42, "items": ["a"]}`),
			Metadata:   eventstore.Metadata{stagehand.HeaderCorrelationID: "corr-1", "user": "ann"},
			OccurredAt: at,
		}}})
	noError(t, err)
	got, err := s.ReadStream(ctx(), "acme", "o-1", 0)
	noError(t, err)
	length(t, got, 1)
	r := got[0]
	equal(t, id, r.EventID)
	equal(t, "order.placed", r.Type)
	equal(t, 3, r.TypeVersion)
	equal(t, "order", r.StreamType)
	jsonEq(t, `{"total": 42, "items": ["a"]}`, string(r.Payload))
	equal(t, eventstore.Metadata{stagehand.HeaderCorrelationID: "corr-1", "user": "ann"}, r.Metadata)
	isTrue(t, at.Truncate(time.Microsecond).Equal(r.OccurredAt), "occurred-at %s != %s", r.OccurredAt, at)
	equal(t, time.UTC, r.OccurredAt.Location())
	isFalse(t, r.RecordedAt.IsZero())

	logged := readAll(t, s, eventstore.LogQuery{})
	length(t, logged, 1)
	equal(t, r.Metadata, logged[0].Metadata)
	equal(t, r.Position, logged[0].Position)
}

func testPerEventFields(t *testing.T, s eventstore.Store) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	in := []eventstore.EventData{
		{Type: "a", TypeVersion: 1, Payload: []byte(`{"i":0}`), Metadata: eventstore.Metadata{"k": "0"}, OccurredAt: t0},
		{Type: "b", TypeVersion: 2, Payload: []byte(`{"i":1}`), Metadata: eventstore.Metadata{"k": "1"},
			OccurredAt: t0.Add(time.Second)},
		{Type: "c", TypeVersion: 3, Payload: []byte(`{"i":2}`), OccurredAt: t0.Add(2 * time.Second)},
	}
	shared := []eventstore.EventData{
		{Type: "a", Payload: []byte(`{"i":3}`), Metadata: eventstore.Metadata{"k": "same"}, OccurredAt: t0},
		{Type: "b", Payload: []byte(`{"i":4}`), Metadata: eventstore.Metadata{"k": "same"}, OccurredAt: t0},
	}
	_, err := s.Append(ctx(), eventstore.AppendRequest{StreamID: "p", Expected: eventstore.NoStream, Events: in})
	noError(t, err)
	_, err = s.Append(ctx(), eventstore.AppendRequest{StreamID: "p", Expected: 3, Events: shared})
	noError(t, err)
	got, err := s.ReadStream(ctx(), "", "p", 0)
	noError(t, err)
	length(t, got, 5)
	for i, e := range append(in, shared...) {
		r := got[i]
		equal(t, int64(i+1), r.Version)
		equal(t, e.Type, r.Type)
		equal(t, max(e.TypeVersion, 1), r.TypeVersion)
		jsonEq(t, string(e.Payload), string(r.Payload))
		if len(e.Metadata) == 0 {
			empty(t, r.Metadata)
		} else {
			equal(t, e.Metadata, r.Metadata)
		}
		isTrue(t, e.OccurredAt.Equal(r.OccurredAt), "event %d occurred-at %s != %s", i, r.OccurredAt,
			e.OccurredAt)
	}
}

func testSnapshots(t *testing.T, s eventstore.Store) {
	_, err := s.LoadSnapshot(ctx(), "", "s")
	errorIs(t, err, eventstore.ErrSnapshotNotFound)
	noError(t, s.SaveSnapshot(ctx(), eventstore.Snapshot{StreamID: "s", StreamType: "t", Version: 5,
		SchemaVersion: 2, Payload: []byte("five")}))
	noError(t, s.SaveSnapshot(ctx(), eventstore.Snapshot{StreamID: "s", StreamType: "t", Version: 3,
		SchemaVersion: 2, Payload: []byte("three")}))
	snap, err := s.LoadSnapshot(ctx(), "", "s")
	noError(t, err)
	equal(t, int64(5), snap.Version, "an older snapshot never replaces a newer one")
	equal(t, 2, snap.SchemaVersion)
	equal(t, []byte("five"), snap.Payload)
	noError(t, s.SaveSnapshot(ctx(), eventstore.Snapshot{StreamID: "s", StreamType: "t", Version: 9,
		SchemaVersion: 3, Payload: []byte("nine")}))
	snap, err = s.LoadSnapshot(ctx(), "", "s")
	noError(t, err)
	equal(t, int64(9), snap.Version)
	_, err = s.LoadSnapshot(ctx(), "other-tenant", "s")
	errorIs(t, err, eventstore.ErrSnapshotNotFound)
}

func testDeleteSnapshot(t *testing.T, s eventstore.Store) {
	errorIs(t, s.DeleteSnapshot(ctx(), "", "s"), eventstore.ErrSnapshotNotFound, "nothing to delete")
	for _, tenant := range []string{"", "acme"} {
		noError(t, s.SaveSnapshot(ctx(), eventstore.Snapshot{Tenant: tenant, StreamID: "s", StreamType: "t",
			Version: 4, SchemaVersion: 1, Payload: []byte("four")}))
	}
	noError(t, s.DeleteSnapshot(ctx(), "acme", "s"))
	_, err := s.LoadSnapshot(ctx(), "acme", "s")
	errorIs(t, err, eventstore.ErrSnapshotNotFound, "the deleted snapshot is gone")
	snap, err := s.LoadSnapshot(ctx(), "", "s")
	noError(t, err, "another tenant's snapshot of the same stream ID stays")
	equal(t, int64(4), snap.Version)
	errorIs(t, s.DeleteSnapshot(ctx(), "acme", "s"), eventstore.ErrSnapshotNotFound, "a second delete")
	noError(t, s.SaveSnapshot(ctx(), eventstore.Snapshot{Tenant: "acme", StreamID: "s", StreamType: "t",
		Version: 2, SchemaVersion: 1, Payload: []byte("two")}))
	snap, err = s.LoadSnapshot(ctx(), "acme", "s")
	noError(t, err)
	equal(t, int64(2), snap.Version, "after a delete any version may be stored again")
}

// testSnapshotTx: a snapshot written on the appending transaction commits and rolls back with it, and is not
// visible outside it before the commit.
func testSnapshotTx(t *testing.T, s eventstore.Store) {
	ts := transactional(t, s)
	for _, commit := range []bool{false, true} {
		tx, err := ts.Begin(ctx())
		noError(t, err)
		_, err = ts.AppendTx(ctx(), tx, eventstore.AppendRequest{StreamID: "s", StreamType: "t",
			Expected: eventstore.NoStream, Events: []eventstore.EventData{{Type: "e", Payload: []byte(`{}`)}}})
		noError(t, err)
		noError(t, ts.SaveSnapshotTx(ctx(), tx, eventstore.Snapshot{StreamID: "s", StreamType: "t",
			Version: 1, SchemaVersion: 1, Payload: []byte("one")}))
		_, err = ts.LoadSnapshot(ctx(), "", "s")
		errorIs(t, err, eventstore.ErrSnapshotNotFound, "not visible outside the transaction")
		snap, err := ts.LoadSnapshotTx(ctx(), tx, "", "s")
		noError(t, err, "visible inside it")
		equal(t, int64(1), snap.Version)
		recs, err := ts.ReadStreamTx(ctx(), tx, "", "s", 1)
		noError(t, err)
		length(t, recs, 1, "ReadStreamTx sees the transaction's own append")
		if !commit {
			noError(t, tx.Rollback(ctx()))
			_, err = ts.LoadSnapshot(ctx(), "", "s")
			errorIs(t, err, eventstore.ErrSnapshotNotFound, "rolled back with the events")
			continue
		}
		noError(t, tx.Commit(ctx()))
		snap, err = ts.LoadSnapshot(ctx(), "", "s")
		noError(t, err, "committed with the events")
		equal(t, []byte("one"), snap.Payload)
		isFalse(t, snap.CreatedAt.Before(recs[0].RecordedAt),
			"a snapshot is never older than the event it was taken at")
	}
}

func transactional(t *testing.T, s eventstore.Store) eventstore.TransactionalStore {
	ts, ok := s.(eventstore.TransactionalStore)
	if !ok {
		t.Skipf("%T does not implement eventstore.TransactionalStore (transactional appends are PostgreSQL-only)", s)
	}
	return ts
}

func testStageErrorRollsBack(t *testing.T, s eventstore.Store) {
	ts := transactional(t, s)
	boom := errors.New("staging failed")
	ran := false
	_, err := ts.AppendWith(ctx(), eventstore.AppendRequest{StreamID: "s", Expected: eventstore.NoStream,
		Events: events(2, "x")}, func(ctx context.Context, tx pgx.Tx, res eventstore.AppendResult) error {
		ran = true
		length(t, res.Records, 2)
		return boom
	})
	errorIs(t, err, boom)
	isTrue(t, ran)
	_, err = s.ReadStream(ctx(), "", "s", 0)
	errorIs(t, err, eventstore.ErrStreamNotFound, "a staging error must roll the append back")
	head, err := s.HeadPosition(ctx())
	noError(t, err)
	zero(t, head)
}

func testConflictSkipsStage(t *testing.T, s eventstore.Store) {
	ts := transactional(t, s)
	appendN(t, s, "", "s", "t", eventstore.NoStream, 1)
	ran := false
	_, err := ts.AppendWith(ctx(), eventstore.AppendRequest{StreamID: "s", Expected: eventstore.NoStream,
		Events: events(1, "x")}, func(context.Context, pgx.Tx, eventstore.AppendResult) error {
		ran = true
		return nil
	})
	requireConflict(t, err, "s", eventstore.NoStream, 1)
	isFalse(t, ran, "staging must not run when the version check fails")
}

func testAppendTx(t *testing.T, s eventstore.Store) {
	ts := transactional(t, s)
	tx, err := ts.Begin(ctx())
	noError(t, err)
	_, err = ts.AppendTx(ctx(), tx, eventstore.AppendRequest{StreamID: "rolled", Expected: eventstore.NoStream,
		Events: events(1, "x")})
	noError(t, err)
	noError(t, tx.Rollback(ctx()))
	_, err = s.ReadStream(ctx(), "", "rolled", 0)
	errorIs(t, err, eventstore.ErrStreamNotFound)

	tx, err = ts.Begin(ctx())
	noError(t, err)
	defer func() { _ = tx.Rollback(ctx()) }()
	_, err = ts.AppendTx(ctx(), tx, eventstore.AppendRequest{StreamID: "kept", Expected: eventstore.NoStream,
		Events: events(2, "x")})
	noError(t, err)
	// A conflict inside the caller's transaction leaves it usable.
	_, err = ts.AppendTx(ctx(), tx, eventstore.AppendRequest{StreamID: "kept", Expected: eventstore.NoStream,
		Events: events(1, "x")})
	requireConflict(t, err, "kept", eventstore.NoStream, 2)
	_, err = ts.AppendTx(ctx(), tx, eventstore.AppendRequest{StreamID: "kept", Expected: 2, Events: events(1, "x")})
	noError(t, err)
	noError(t, tx.Commit(ctx()))
	got, err := s.ReadStream(ctx(), "", "kept", 0)
	noError(t, err)
	equal(t, []int64{1, 2, 3}, versions(got))
}

// testGapSafeOutOfOrder holds one append's transaction open while later ones commit, rolls another back, and has a
// reader poll throughout: it must end with every committed event exactly once, in position order, and none of the
// rolled-back ones.
func testGapSafeOutOfOrder(t *testing.T, s eventstore.Store) {
	ts := transactional(t, s)
	appendN(t, s, "", "before", "t", eventstore.NoStream, 1)

	begin := func() pgx.Tx {
		tx, err := ts.Begin(ctx())
		noError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx()) })
		return tx
	}
	appendTx := func(tx pgx.Tx, stream string, n int) eventstore.AppendResult {
		res, err := ts.AppendTx(ctx(), tx, eventstore.AppendRequest{StreamID: stream, Expected: eventstore.NoStream,
			Events: events(n, "x")})
		noError(t, err)
		return res
	}

	held := begin()
	heldRes := appendTx(held, "held", 2) // draws the lowest positions, commits last
	aborted := begin()
	abortedRes := appendTx(aborted, "aborted", 2)
	appendN(t, s, "", "c1", "t", eventstore.NoStream, 1) // commits while the two above are open
	noError(t, aborted.Rollback(ctx()))
	appendN(t, s, "", "c2", "t", eventstore.NoStream, 2)

	var got []eventstore.Record
	q := eventstore.LogQuery{Limit: 3}
	poll := func() {
		c, cancel := context.WithTimeout(ctx(), 5*time.Second)
		defer cancel()
		page, err := s.ReadLog(c, q)
		noError(t, err)
		got = append(got, page.Records...)
		q.After = page.Last
	}
	// While the held transaction is open, the reader must not pass its positions.
	for range 5 {
		poll()
		for _, r := range got {
			less(t, r.Position, heldRes.Records[0].Position,
				"the reader passed a position an open transaction can still commit")
		}
	}
	commitDone := make(chan error, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		commitDone <- held.Commit(ctx())
	}()
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < 6 && time.Now().Before(deadline) {
		poll()
	}
	noError(t, <-commitDone)
	poll()

	var streams []string
	seen := map[uuid.UUID]bool{}
	for i, r := range got {
		isFalse(t, seen[r.EventID], "event read twice")
		seen[r.EventID] = true
		if i > 0 {
			greater(t, r.Position, got[i-1].Position)
		}
		streams = append(streams, r.StreamID)
		for _, a := range abortedRes.Records {
			notEqual(t, a.Position, r.Position, "a rolled-back event was read")
		}
	}
	sort.Strings(streams)
	equal(t, []string{"before", "c1", "c2", "c2", "held", "held"}, streams)
}
