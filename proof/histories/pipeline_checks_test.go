package histories_test

import (
	"strings"
	"testing"

	"github.com/stagehand-es/stagehand/proof/histories"
)

func (p *pipe) savedAs(id string, from, to int, out histories.Outcome, msgs ...histories.PipelineMessage) *pipe {
	return p.op(histories.KindSave, 0, from, to, out, histories.SaveInput{Save: id, Messages: msgs}, nil)
}

func TestResolveSavesFlagsAnAcknowledgedSaveMissingFromTheLog(t *testing.T) {
	p := (&pipe{}).savedAs("s1", 0, 5, histories.OK, msg("a1", "a", 1))
	_, vs := histories.ResolveSaves(p.ops, map[string]bool{})
	if len(vs) != 1 || vs[0].Kind != "lost save" {
		t.Fatalf("want one lost save, got %+v", vs)
	}
}

func TestResolveSavesFlagsAFailedSaveThatCommitted(t *testing.T) {
	p := (&pipe{}).savedAs("s1", 0, 5, histories.Fail, msg("a1", "a", 1))
	_, vs := histories.ResolveSaves(p.ops, map[string]bool{"s1": true})
	if len(vs) != 1 || vs[0].Kind != "failed save committed" {
		t.Fatalf("want one failed save committed, got %+v", vs)
	}
}

// An indeterminate save that committed is held to an acknowledged save's rules once resolved: its message must
// have an effect, which CheckPipeline could not require of an indeterminate save.
func TestResolveSavesHoldsACommittedIndeterminateSaveToItsMessages(t *testing.T) {
	a1, b1 := msg("a1", "a", 1), msg("b1", "b", 1)
	p := (&pipe{}).
		savedAs("s1", 0, 5, histories.Info, a1).
		savedAs("s2", 1, 6, histories.Info, b1)
	if err := histories.CheckPipeline(p.ops, 9, histories.PipelineOptions{}).Err(); err != nil {
		t.Fatalf("unresolved, the history is allowed: %v", err)
	}
	resolved, vs := histories.ResolveSaves(p.ops, map[string]bool{"s1": true})
	if len(vs) != 0 {
		t.Fatalf("no violation expected, got %+v", vs)
	}
	if resolved[0].Outcome != histories.OK || resolved[1].Outcome != histories.Fail {
		t.Fatalf("resolved to %s and %s, want ok and fail", resolved[0].Outcome, resolved[1].Outcome)
	}
	pipelineFlags(t, &pipe{ops: resolved}, histories.PipelineOptions{}, "lost")
}

func loadTx(p *pipe, m histories.PipelineMessage, version int64) *pipe {
	return loadTxState(p, m, version, version)
}

func loadTxState(p *pipe, m histories.PipelineMessage, version, ticks int64) *pipe {
	return p.op(histories.KindLoadTx, 1, 0, 1, histories.OK, histories.EffectInput{Message: m},
		histories.LoadTxOutput{Version: version, Ticks: ticks})
}

func TestCheckHandlerLoadsFlagsALoadThatMissedItsCause(t *testing.T) {
	ok := loadTx(&pipe{}, msg("a3", "a", 3), 3)
	if vs := histories.CheckHandlerLoads(ok.ops); len(vs) != 0 {
		t.Fatalf("a load that saw its cause was flagged: %+v", vs)
	}
	bad := loadTx(&pipe{}, msg("a3", "a", 3), 2)
	vs := histories.CheckHandlerLoads(bad.ops)
	if len(vs) != 1 || vs[0].Kind != "cause not visible" {
		t.Fatalf("want one cause not visible, got %+v", vs)
	}
}

func TestCheckHandlerLoadsFlagsAStateOfAnotherVersion(t *testing.T) {
	bad := loadTxState(&pipe{}, msg("a3", "a", 3), 5, 4) // version 5 holding the state of version 4
	vs := histories.CheckHandlerLoads(bad.ops)
	if len(vs) != 1 || vs[0].Kind != "state not of its version" {
		t.Fatalf("want one state not of its version, got %+v", vs)
	}
}

func (p *pipe) read(proc, from, to int, counts map[string]int64) *pipe {
	return p.op(histories.KindProjectionRead, proc, from, to, histories.OK, nil, histories.ReadModel{Counts: counts})
}

// The log a, b, a, c: its prefixes fold to {}, {a:1}, {a:1 b:1}, {a:2 b:1}, {a:2 b:1 c:1}.
var projLog = []histories.LogEvent{{Key: "a"}, {Key: "b"}, {Key: "a"}, {Key: "c"}}

func projectionFlags(t *testing.T, p *pipe, kind string) {
	t.Helper()
	rep := histories.CheckProjectionReads(p.ops, projLog, 9)
	err := rep.Err()
	if err == nil {
		t.Fatalf("the %s anomaly was not flagged", kind)
	}
	for _, v := range rep.Violations {
		if v.Kind != kind {
			t.Fatalf("flagged %s, want only %s:\n%v", v.Kind, kind, err)
		}
	}
	if !strings.Contains(err.Error(), "seed 9") {
		t.Fatalf("the failure does not name the seed:\n%v", err)
	}
	t.Logf("flagged as expected:\n%v", err)
}

func TestProjectionReadsOfPrefixesPass(t *testing.T) {
	p := (&pipe{}).
		read(1, 0, 1, nil).
		read(1, 2, 3, map[string]int64{"a": 1}).
		read(1, 4, 5, map[string]int64{"a": 1, "b": 1}).
		read(2, 4, 9, map[string]int64{"a": 1}). // overlaps the one before: may be older
		read(1, 6, 7, map[string]int64{"a": 2, "b": 1, "c": 1})
	p.op(histories.KindProjectionRead, 1, 8, 9, histories.Fail, nil, nil) // failed reads are ignored
	rep := histories.CheckProjectionReads(p.ops, projLog, 9)
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if rep.Reads != 5 {
		t.Fatalf("checked %d reads, want 5", rep.Reads)
	}
}

func TestProjectionReadsFlagAFoldOfNoPrefix(t *testing.T) {
	// a's second event without b's, which comes before it in the log: applied out of log order.
	projectionFlags(t, (&pipe{}).read(1, 0, 1, map[string]int64{"a": 2}), "no prefix")
}

func TestProjectionReadsFlagAKeySkipped(t *testing.T) {
	// c without b and a's second: a read that skipped events.
	projectionFlags(t, (&pipe{}).read(1, 0, 1, map[string]int64{"a": 1, "c": 1}), "no prefix")
}

func TestProjectionReadsFlagAnEventAppliedTwice(t *testing.T) {
	projectionFlags(t, (&pipe{}).read(1, 0, 1, map[string]int64{"a": 3, "b": 1, "c": 1}), "no prefix")
}

func TestProjectionReadsFlagAnUnknownKey(t *testing.T) {
	projectionFlags(t, (&pipe{}).read(1, 0, 1, map[string]int64{"z": 1}), "no prefix")
}

func TestProjectionReadsFlagAReadThatWentBack(t *testing.T) {
	p := (&pipe{}).
		read(1, 0, 1, map[string]int64{"a": 2, "b": 1}).
		read(2, 2, 3, map[string]int64{"a": 1})
	projectionFlags(t, p, "went back")
}
