package histories_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/stagehand-es/stagehand/proof/histories"
)

// hist builds a history by hand: each op's times are given in milliseconds.
type hist struct{ ops []histories.Op }

func (h *hist) add(p int, kind string, from, to int, out histories.Outcome, in, output any) *hist {
	h.ops = append(h.ops, histories.Op{Index: len(h.ops), Process: p, Kind: kind, Key: "s1", Input: in,
		Output: output, Outcome: out, Invoke: time.Duration(from) * time.Millisecond,
		Complete: time.Duration(to) * time.Millisecond})
	return h
}

func (h *hist) appendOp(p, from, to int, out histories.Outcome, expected int64, version int64, ids ...string) *hist {
	var output any
	if out == histories.OK {
		output = histories.AppendOutput{Version: version}
	}
	return h.add(p, histories.KindAppend, from, to, out, histories.AppendInput{Expected: expected, Events: ids}, output)
}

func (h *hist) conflict(p, from, to int, expected int64, reason string, ids ...string) *hist {
	return h.add(p, histories.KindAppend, from, to, histories.Fail, histories.AppendInput{Expected: expected,
		Events: ids}, histories.AppendOutput{Conflict: true, Reason: reason})
}

func (h *hist) load(p, from, to int, ids ...string) *hist {
	return h.add(p, histories.KindLoad, from, to, histories.OK, nil,
		histories.LoadOutput{Version: int64(len(ids)), Events: ids})
}

func check(t *testing.T, h *hist) histories.StreamReport {
	t.Helper()
	rep, err := histories.CheckStreams(h.ops, histories.StreamCheckOptions{Seed: 7, VisualizationDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func mustPass(t *testing.T, h *hist) {
	t.Helper()
	if err := check(t, h).Err(); err != nil {
		t.Fatalf("a linearizable history was flagged:\n%v", err)
	}
}

// mustFlag checks the history is flagged, with the seed, a window and a rendering that exists.
func mustFlag(t *testing.T, h *hist) histories.StreamResult {
	t.Helper()
	rep := check(t, h)
	err := rep.Err()
	if err == nil {
		t.Fatal("an anomaly was not flagged")
	}
	if len(rep.Streams) != 1 || rep.Streams[0].Result != porcupine.Illegal {
		t.Fatalf("report %+v: want stream s1 illegal", rep.Streams)
	}
	res := rep.Streams[0]
	if _, statErr := os.Stat(res.Visualization); statErr != nil {
		t.Fatalf("the rendering %q: %v", res.Visualization, statErr)
	}
	if !strings.Contains(err.Error(), "seed 7") || !strings.Contains(err.Error(), res.Visualization) {
		t.Fatalf("the failure does not print the seed and the rendering's path:\n%v", err)
	}
	t.Logf("flagged as expected:\n%v", err)
	return res
}

func TestStreamsCleanHistoryPasses(t *testing.T) {
	h := (&hist{}).
		appendOp(0, 0, 10, histories.OK, 0, 1, "a").
		load(1, 5, 8).                   // concurrent with the append: may see before it
		load(1, 11, 12, "a").            // after it: must see it
		conflict(2, 13, 20, 0, "", "x"). // stale expectation
		appendOp(0, 14, 30, histories.OK, 1, 3, "b", "c").
		appendOp(2, 21, 25, histories.Fail, 1, 0, "y"). // failed definitely: never seen
		conflict(3, 22, 26, 1, "serialization failure", "z").
		load(1, 31, 32, "a", "b", "c").
		appendOp(2, 33, 40, histories.OK, histories.AnyVersion, 4, "d").
		conflict(3, 34, 39, histories.AnyVersion, "", "w"). // gave up racing other appends: no effect
		load(1, 41, 42, "a", "b", "c", "d")
	mustPass(t, h)
}

func TestStreamsIndeterminateAppendMayOrMayNotApply(t *testing.T) {
	applied := (&hist{}).
		appendOp(0, 0, 10, histories.Info, 0, 0, "a").
		load(1, 20, 21, "a").
		appendOp(1, 22, 30, histories.OK, 1, 2, "b")
	mustPass(t, applied)
	notApplied := (&hist{}).
		appendOp(0, 0, 10, histories.Info, 0, 0, "a").
		load(1, 20, 21).
		appendOp(1, 22, 30, histories.OK, 0, 1, "b").
		load(1, 31, 32, "b")
	mustPass(t, notApplied)
	// Applied late: seen only after a load that did not see it.
	late := (&hist{}).
		appendOp(0, 0, 10, histories.Info, 0, 0, "a").
		load(1, 20, 21).
		load(1, 22, 23, "a")
	mustPass(t, late)
}

func TestStreamsFlagsLoadOfUncommittedVersion(t *testing.T) {
	// The store said the append did not commit (a definite failure), yet a load saw its event.
	res := mustFlag(t, (&hist{}).
		load(1, 0, 1).
		appendOp(0, 2, 10, histories.Fail, 0, 0, "a").
		load(1, 11, 12, "a").
		load(1, 13, 14, "a"))
	if len(res.Window) != 3 {
		t.Fatalf("window of %d operations, want the 3 up to the bad load", len(res.Window))
	}
	// A load that saw a version no append produced.
	mustFlag(t, (&hist{}).
		appendOp(0, 0, 10, histories.OK, 0, 1, "a").
		load(1, 11, 12, "a", "ghost"))
}

func TestStreamsFlagsLostAcknowledgedAppend(t *testing.T) {
	mustFlag(t, (&hist{}).
		appendOp(0, 0, 10, histories.OK, 0, 1, "a").
		load(1, 11, 12))
	// Lost after a later append built on it.
	mustFlag(t, (&hist{}).
		appendOp(0, 0, 10, histories.OK, 0, 1, "a").
		appendOp(0, 11, 20, histories.OK, 1, 2, "b").
		load(1, 21, 22, "b"))
}

func TestStreamsFlagsTwoAppendsAcknowledgedAtOneVersion(t *testing.T) {
	mustFlag(t, (&hist{}).
		appendOp(0, 0, 10, histories.OK, 0, 1, "a").
		appendOp(1, 1, 9, histories.OK, 0, 1, "b"))
}

func TestStreamsFlagsConflictWhileTheVersionFitted(t *testing.T) {
	mustFlag(t, (&hist{}).
		appendOp(0, 0, 10, histories.OK, 0, 1, "a").
		conflict(1, 11, 12, 1, "", "b"))
}

func TestStreamsFlagsWrongAcknowledgedVersion(t *testing.T) {
	mustFlag(t, (&hist{}).
		appendOp(0, 0, 10, histories.OK, 0, 2, "a"))
}

func TestStreamsFlagsAcknowledgedAppendWithOtherEvents(t *testing.T) {
	h := &hist{}
	h.add(0, histories.KindAppend, 0, 10, histories.OK, histories.AppendInput{Expected: 0, Events: []string{"a"}},
		histories.AppendOutput{Version: 1, Events: []string{"b"}})
	mustFlag(t, h)
}

func TestRecorderTimesAndOutcomes(t *testing.T) {
	r := histories.NewRecorder()
	a := r.Invoke(0, histories.KindAppend, "s", histories.AppendInput{Expected: 0, Events: []string{"a"}})
	b := r.Invoke(1, histories.KindLoad, "s", nil)
	time.Sleep(time.Millisecond)
	b.OK(histories.LoadOutput{})
	a.Info(os.ErrDeadlineExceeded)
	r.Invoke(2, histories.KindLoad, "s", nil) // never completes
	h := r.History()
	if len(h) != 3 || h[0].Outcome != histories.Info || h[1].Outcome != histories.OK || h[2].Outcome != histories.Pending {
		t.Fatalf("history %v", h)
	}
	if !(h[0].Invoke <= h[1].Invoke && h[1].Invoke < h[1].Complete && h[1].Complete <= h[0].Complete) {
		t.Fatalf("times out of order: %v", h)
	}
	if h[0].Err == "" {
		t.Fatal("the info operation lost its error")
	}
	if got := histories.FormatCounts(h); got != "append/info=1 load/ok=1 load/pending=1" {
		t.Fatalf("counts %q", got)
	}
}
