package eventstoretest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/stagehand-es/stagehand/eventstore"
)

// lifecycleCases are the cases of a store that implements eventstore.LifecycleStore (skipped otherwise).
var lifecycleCases = []struct {
	name string
	fn   func(t *testing.T, s eventstore.LifecycleStore)
}{
	{"Lifecycle/ArchivedStreamLoadsAndRefusesAppends", testArchiveStream},
	{"Lifecycle/ArchivedEventsStayInTheLog", testArchivedInLog},
	{"Lifecycle/DeletedStreamLeavesTombstonesTheLogPassesOver", testDeleteStream},
	{"Lifecycle/DeletionMarkerReachesReadersThatAskForIt", testDeletionMarker},
	{"Lifecycle/ArchivedStreamCanBeDeleted", testArchiveThenDelete},
	{"Lifecycle/InvalidRequestsAndReservedTypesAreRejected", testLifecycleInvalid},
	{"Lifecycle/ConcurrentAppendsNeverLandInAnArchivedStream", func(t *testing.T, s eventstore.LifecycleStore) {
		testLifecycleUnderAppends(t, s, false)
	}},
	{"Lifecycle/ConcurrentAppendsNeverLandInADeletedStream", func(t *testing.T, s eventstore.LifecycleStore) {
		testLifecycleUnderAppends(t, s, true)
	}},
}

// requireRefused checks that every kind of append to the stream fails with target and appends nothing.
func requireRefused(t *testing.T, s eventstore.Store, tenant, stream string, version int64, target error) {
	t.Helper()
	for _, expected := range []eventstore.ExpectedVersion{eventstore.ExpectedVersion(version), eventstore.AnyVersion,
		eventstore.StreamExists, eventstore.NoStream} {
		_, err := s.Append(ctx(), eventstore.AppendRequest{Tenant: tenant, StreamID: stream, StreamType: "t",
			Expected: expected, Events: events(1, "test.happened")})
		errorIs(t, err, target, "append expecting %s", expected)
		isFalse(t, errors.Is(err, eventstore.ErrConcurrencyConflict), "not a conflict: a retry cannot succeed")
	}
}

func testArchiveStream(t *testing.T, s eventstore.LifecycleStore) {
	before := appendN(t, s, "acme", "s1", "t", eventstore.NoStream, 3)
	appendN(t, s, "acme", "s2", "t", eventstore.NoStream, 2)
	lc, err := s.ArchiveStream(ctx(), eventstore.LifecycleRequest{Tenant: "acme", StreamID: "s1", Actor: "ops"})
	noError(t, err)
	equal(t, eventstore.StreamArchived, lc.State)
	equal(t, int64(3), lc.Version)
	equal(t, int64(3), lc.Events)
	equal(t, "ops", lc.ArchivedBy)
	equal(t, before.Records[0].Position, lc.FirstPosition)
	equal(t, before.Records[2].Position, lc.LastPosition)
	greater(t, lc.MarkerPosition, lc.LastPosition)
	isFalse(t, lc.ArchivedAt.IsZero())

	got, err := s.ReadStream(ctx(), "acme", "s1", 1)
	noError(t, err, "an archived stream loads")
	length(t, got, 3)
	for i, r := range got {
		equal(t, before.Records[i].Position, r.Position)
		equal(t, before.Records[i].EventID, r.EventID)
		jsonEq(t, string(before.Records[i].Payload), string(r.Payload))
	}
	got, err = s.ReadStream(ctx(), "acme", "s1", 3)
	noError(t, err)
	equal(t, []int64{3}, versions(got), "read from a version")
	got, err = s.ReadStream(ctx(), "acme", "s1", 4)
	noError(t, err)
	empty(t, got, "the marker is never read")

	info, err := s.Stream(ctx(), "acme", "s1")
	noError(t, err)
	equal(t, eventstore.StreamArchived, info.State)
	equal(t, int64(3), info.Version)
	info, err = s.Stream(ctx(), "acme", "s2")
	noError(t, err)
	equal(t, eventstore.StreamActive, info.State)

	requireRefused(t, s, "acme", "s1", 3, eventstore.ErrStreamArchived)
	_, err = s.Append(ctx(), eventstore.AppendRequest{Tenant: "acme", StreamID: "s1", StreamType: "t",
		Expected: 3, Events: events(1, "test.happened")})
	var ae *eventstore.StreamArchivedError
	errorAs(t, err, &ae)
	equal(t, "s1", ae.StreamID)
	equal(t, "acme", ae.Tenant)
	got, err = s.ReadStream(ctx(), "acme", "s1", 1)
	noError(t, err)
	length(t, got, 3, "refused appends stored nothing")

	appendN(t, s, "acme", "s2", "t", 2, 1)
	appendN(t, s, "", "s1", "t", eventstore.NoStream, 1) // the same ID in another tenant is another stream

	_, err = s.ArchiveStream(ctx(), eventstore.LifecycleRequest{Tenant: "acme", StreamID: "s1"})
	errorIs(t, err, eventstore.ErrStreamArchived, "a second archive")
	_, err = s.ArchiveStream(ctx(), eventstore.LifecycleRequest{Tenant: "acme", StreamID: "nope"})
	errorIs(t, err, eventstore.ErrStreamNotFound)
	lc2, err := s.Lifecycle(ctx(), "acme", "s1")
	noError(t, err)
	equal(t, lc, lc2)
	lc2, err = s.Lifecycle(ctx(), "acme", "s2")
	noError(t, err)
	equal(t, eventstore.StreamActive, lc2.State)
	equal(t, int64(3), lc2.Version)
	_, err = s.Lifecycle(ctx(), "acme", "nope")
	errorIs(t, err, eventstore.ErrStreamNotFound)
}

func testArchivedInLog(t *testing.T, s eventstore.LifecycleStore) {
	appendN(t, s, "", "a", "t", eventstore.NoStream, 2)
	appendN(t, s, "", "b", "t", eventstore.NoStream, 2)
	appendN(t, s, "", "a", "t", 2, 2)
	all := readAll(t, s, eventstore.LogQuery{Limit: 3})
	_, err := s.ArchiveStream(ctx(), eventstore.LifecycleRequest{StreamID: "a"})
	noError(t, err)
	appendN(t, s, "", "b", "t", 2, 1)
	for _, q := range []eventstore.LogQuery{{Limit: 3}, {Limit: 1000}, {Limit: 2, EventTypes: []string{"test.happened"}},
		{Limit: 2, StreamTypes: []string{"t"}, Deletions: true}} {
		got := readAll(t, s, q)
		length(t, got, len(all)+1, "a rebuild from the start reads the archived events at their positions, no marker")
		for i := range all {
			equal(t, all[i].Position, got[i].Position)
			equal(t, all[i].EventID, got[i].EventID)
			jsonEq(t, string(all[i].Payload), string(got[i].Payload))
		}
		equal(t, "b", got[len(got)-1].StreamID)
	}
}

func testDeleteStream(t *testing.T, s eventstore.LifecycleStore) {
	appendN(t, s, "", "keep", "t", eventstore.NoStream, 1)
	gone := appendN(t, s, "", "gone", "t", eventstore.NoStream, 3)
	appendN(t, s, "", "keep", "t", 1, 1)
	noError(t, s.SaveSnapshot(ctx(), eventstore.Snapshot{StreamID: "gone", StreamType: "t", Version: 2,
		SchemaVersion: 1, Payload: []byte("two")}))
	lc, err := s.DeleteStream(ctx(), eventstore.LifecycleRequest{StreamID: "gone", Reason: "erasure request 7",
		Actor: "dpo"})
	noError(t, err)
	equal(t, eventstore.StreamDeleted, lc.State)
	equal(t, "erasure request 7", lc.Reason)
	equal(t, "dpo", lc.DeletedBy)
	equal(t, int64(3), lc.Events)
	equal(t, int64(3), lc.Version)
	isFalse(t, lc.DeletedAt.IsZero())
	isTrue(t, lc.ArchivedAt.IsZero())

	_, err = s.ReadStream(ctx(), "", "gone", 1)
	errorIs(t, err, eventstore.ErrStreamDeleted)
	errorIs(t, err, eventstore.ErrStreamNotFound, "a deleted stream is not found either")
	var de *eventstore.StreamDeletedError
	errorAs(t, err, &de)
	equal(t, "gone", de.StreamID)
	_, err = s.Stream(ctx(), "", "gone")
	errorIs(t, err, eventstore.ErrStreamDeleted)
	_, err = s.LoadSnapshot(ctx(), "", "gone")
	errorIs(t, err, eventstore.ErrSnapshotNotFound, "the snapshot is deleted with the stream")
	requireRefused(t, s, "", "gone", 3, eventstore.ErrStreamDeleted)

	head, err := s.HeadPosition(ctx())
	noError(t, err)
	for _, limit := range []int{1, 2, 1000} {
		q := eventstore.LogQuery{Limit: limit}
		var recs []eventstore.Record
		for {
			page, err := s.ReadLog(ctx(), q)
			noError(t, err)
			recs = append(recs, page.Records...)
			if page.Last == q.After {
				break
			}
			q.After = page.Last
		}
		equal(t, head, q.After, "readers pass over the tombstones and the marker up to the head")
		for _, r := range recs {
			equal(t, "keep", r.StreamID, "no tombstone and no marker reaches a reader that did not ask")
		}
		length(t, recs, 2)
	}
	page, err := s.ReadLog(ctx(), eventstore.LogQuery{After: gone.Records[0].Position - 1, Limit: 1})
	noError(t, err)
	equal(t, gone.Records[0].Position, page.Last, "a tombstone is passed at once, not waited on")
	empty(t, page.Records)

	_, err = s.DeleteStream(ctx(), eventstore.LifecycleRequest{StreamID: "gone", Reason: "again"})
	errorIs(t, err, eventstore.ErrStreamDeleted, "a second delete")
	_, err = s.ArchiveStream(ctx(), eventstore.LifecycleRequest{StreamID: "gone"})
	errorIs(t, err, eventstore.ErrStreamDeleted, "a deleted stream cannot be archived")
	lc2, err := s.Lifecycle(ctx(), "", "gone")
	noError(t, err)
	equal(t, lc, lc2)
	appendN(t, s, "", "keep", "t", 2, 1)
}

func testDeletionMarker(t *testing.T, s eventstore.LifecycleStore) {
	appendN(t, s, "acme", "gone", "person", eventstore.NoStream, 2)
	appendN(t, s, "acme", "other", "order", eventstore.NoStream, 1)
	lc, err := s.DeleteStream(ctx(), eventstore.LifecycleRequest{Tenant: "acme", StreamID: "gone", Reason: "r"})
	noError(t, err)
	appendN(t, s, "acme", "other", "order", 1, 1)
	for _, q := range []eventstore.LogQuery{{Deletions: true}, {Deletions: true, Limit: 1},
		{Deletions: true, EventTypes: []string{"other.type"}}, {Deletions: true, StreamTypes: []string{"person"}},
		{Deletions: true, Tenants: []string{"acme"}}} {
		var markers []eventstore.Record
		for _, r := range readAll(t, s, q) {
			if r.Type == eventstore.StreamDeletedType {
				markers = append(markers, r)
			} else {
				isFalse(t, r.StreamID == "gone", "a tombstone reached a reader")
			}
		}
		length(t, markers, 1, "query %+v", q)
		m := markers[0]
		equal(t, lc.MarkerPosition, m.Position)
		equal(t, "gone", m.StreamID)
		equal(t, "acme", m.Tenant)
		equal(t, "person", m.StreamType)
		equal(t, int64(3), m.Version, "the marker takes the stream's next version")
	}
	for _, q := range []eventstore.LogQuery{{Deletions: true, StreamTypes: []string{"order"}},
		{Deletions: true, Tenants: []string{"other"}}, {}} {
		for _, r := range readAll(t, s, q) {
			notEqual(t, eventstore.StreamDeletedType, r.Type, "query %+v", q)
		}
	}
}

func testArchiveThenDelete(t *testing.T, s eventstore.LifecycleStore) {
	appendN(t, s, "", "s", "t", eventstore.NoStream, 4)
	archived, err := s.ArchiveStream(ctx(), eventstore.LifecycleRequest{StreamID: "s"})
	noError(t, err)
	lc, err := s.DeleteStream(ctx(), eventstore.LifecycleRequest{StreamID: "s", Reason: "retention ended"})
	noError(t, err)
	equal(t, eventstore.StreamDeleted, lc.State)
	equal(t, int64(4), lc.Version)
	equal(t, int64(4), lc.Events)
	equal(t, archived.ArchivedAt, lc.ArchivedAt, "the archive stays on record")
	greater(t, lc.MarkerPosition, archived.MarkerPosition)
	_, err = s.ReadStream(ctx(), "", "s", 1)
	errorIs(t, err, eventstore.ErrStreamDeleted)
	requireRefused(t, s, "", "s", 4, eventstore.ErrStreamDeleted)
	recs := readAll(t, s, eventstore.LogQuery{Deletions: true})
	length(t, recs, 1, "only the deletion marker: tombstones and the archive marker are passed over")
	equal(t, eventstore.StreamDeletedType, recs[0].Type)
	equal(t, int64(6), recs[0].Version)
}

func testLifecycleInvalid(t *testing.T, s eventstore.LifecycleStore) {
	appendN(t, s, "", "s", "t", eventstore.NoStream, 1)
	_, err := s.DeleteStream(ctx(), eventstore.LifecycleRequest{StreamID: "s"})
	errorIs(t, err, eventstore.ErrInvalidAppend, "a deletion needs a reason")
	errorContains(t, err, "Reason")
	_, err = s.DeleteStream(ctx(), eventstore.LifecycleRequest{StreamID: "s", Reason: "   "})
	errorIs(t, err, eventstore.ErrInvalidAppend, "a blank reason")
	_, err = s.ArchiveStream(ctx(), eventstore.LifecycleRequest{StreamID: " "})
	errorIs(t, err, eventstore.ErrInvalidAppend)
	_, err = s.ArchiveStream(ctx(), eventstore.LifecycleRequest{StreamID: "s\x00"})
	errorIs(t, err, eventstore.ErrInvalidAppend)
	_, err = s.DeleteStream(ctx(), eventstore.LifecycleRequest{StreamID: "s", Reason: "r\x00"})
	errorIs(t, err, eventstore.ErrInvalidAppend)
	for _, typ := range []string{eventstore.StreamDeletedType, eventstore.StreamArchivedType, "$stagehand.x"} {
		_, err = s.Append(ctx(), eventstore.AppendRequest{StreamID: "s", StreamType: "t",
			Expected: eventstore.AnyVersion, Events: events(1, typ)})
		errorIs(t, err, eventstore.ErrInvalidAppend, "type %q is reserved", typ)
	}
	lc, err := s.Lifecycle(ctx(), "", "s")
	noError(t, err)
	equal(t, eventstore.StreamActive, lc.State, "nothing was changed")
	equal(t, int64(1), lc.Version)
}

// testLifecycleUnderAppends archives (or deletes) a stream while writers append to it, with exact versions and
// with AnyVersion: every append either succeeded before, and its events are in the stream (archived, or deleted:
// passed over by the log), or failed with the typed error (or a conflict, which is then retried and ends with the
// typed error); the stream's versions stay 1..n, and the log holds each event exactly once.
func testLifecycleUnderAppends(t *testing.T, s eventstore.LifecycleStore, del bool) {
	const writers = 8
	appendN(t, s, "", "hot", "t", eventstore.NoStream, 1)
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		stored    = map[uuid.UUID]int64{} // event ID -> version, of the appends that succeeded
		refused   int
		unexpect  []error
		started   = make(chan struct{}, writers)
		target    = eventstore.ErrStreamArchived
		archiveWG sync.WaitGroup
		failed    = make(chan struct{})
		opDone    = make(chan struct{})
	)
	if del {
		target = eventstore.ErrStreamDeleted
	}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			version := int64(0)
			for i := 0; ; i++ {
				if i == 3 {
					started <- struct{}{}
				}
				select {
				case <-failed: // the operation failed: the test reports it
					return
				default:
				}
				if i == 25 { // enough positions drawn (a partitioned test store has few): append once more after it
					<-opDone
				}
				expected := eventstore.AnyVersion
				if w%2 == 0 {
					expected = eventstore.ExpectedVersion(version)
					if info, err := s.Stream(ctx(), "", "hot"); err == nil {
						expected = eventstore.ExpectedVersion(info.Version)
					}
				}
				id := uuid.New()
				res, err := s.Append(ctx(), eventstore.AppendRequest{StreamID: "hot", StreamType: "t",
					Expected: expected, Events: []eventstore.EventData{{EventID: id, Type: "test.happened",
						Payload: fmt.Appendf(nil, `{"w":%d}`, w)}}})
				mu.Lock()
				switch {
				case err == nil:
					stored[id] = res.Version
					version = res.Version
				case errors.Is(err, target):
					refused++
					mu.Unlock()
					return
				case errors.Is(err, eventstore.ErrConcurrencyConflict):
				default:
					unexpect = append(unexpect, err)
					mu.Unlock()
					return
				}
				mu.Unlock()
			}
		}()
	}
	for range writers {
		<-started
	}
	archiveWG.Add(1)
	var lc eventstore.StreamLifecycle
	var opErr error
	go func() {
		defer archiveWG.Done()
		if del {
			lc, opErr = s.DeleteStream(ctx(), eventstore.LifecycleRequest{StreamID: "hot", Reason: "test"})
		} else {
			lc, opErr = s.ArchiveStream(ctx(), eventstore.LifecycleRequest{StreamID: "hot"})
		}
		if opErr != nil {
			close(failed)
		}
		close(opDone)
	}()
	archiveWG.Wait()
	wg.Wait()
	noError(t, opErr)
	empty(t, unexpect, "every failure is a conflict or the typed error")
	equal(t, writers, refused, "every writer ends refused with the typed error")
	n := int64(len(stored)) + 1
	equal(t, n, lc.Version, "the stream holds exactly the appends that succeeded")
	equal(t, n, lc.Events)

	log := readAll(t, s, eventstore.LogQuery{Limit: 7})
	seen := map[uuid.UUID]bool{}
	for _, r := range log {
		isFalse(t, seen[r.EventID], "event %s read twice", r.EventID)
		seen[r.EventID] = true
		isFalse(t, eventstore.IsLifecycleMarker(r.Type), "a marker reached a reader that did not ask for it")
	}
	if del {
		empty(t, log, "the deleted stream's events are tombstones")
		_, err := s.ReadStream(ctx(), "", "hot", 1)
		errorIs(t, err, eventstore.ErrStreamDeleted)
		return
	}
	length(t, log, int(n))
	for id, v := range stored {
		isTrue(t, seen[id], "a successful append's event (version %d) is in the log", v)
	}
	recs, err := s.ReadStream(ctx(), "", "hot", 1)
	noError(t, err)
	equal(t, seq(1, n), versions(recs), "versions 1..n, no gaps, no duplicates")
	for _, r := range recs[1:] {
		equal(t, stored[r.EventID], r.Version, "the archived event is the one that was appended")
	}
}
