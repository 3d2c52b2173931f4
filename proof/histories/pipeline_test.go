package histories_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stagehand-es/stagehand/proof/histories"
)

type pipe struct{ ops []histories.Op }

func (p *pipe) op(kind string, proc, from, to int, out histories.Outcome, in, output any) *pipe {
	p.ops = append(p.ops, histories.Op{Index: len(p.ops), Process: proc, Kind: kind, Input: in, Output: output,
		Outcome: out, Invoke: time.Duration(from) * time.Millisecond, Complete: time.Duration(to) * time.Millisecond})
	return p
}

func msg(id, key string, seq int64) histories.PipelineMessage {
	return histories.PipelineMessage{ID: id, Key: key, Seq: seq}
}

func (p *pipe) save(from, to int, out histories.Outcome, msgs ...histories.PipelineMessage) *pipe {
	return p.op(histories.KindSave, 0, from, to, out, histories.SaveInput{Messages: msgs}, nil)
}

func (p *pipe) effect(from, to int, out histories.Outcome, m histories.PipelineMessage, duplicate bool) *pipe {
	var output any
	if out == histories.OK {
		output = histories.EffectOutput{Duplicate: duplicate}
	}
	return p.op(histories.KindEffect, 1, from, to, out, histories.EffectInput{Message: m}, output)
}

func pipelineFlags(t *testing.T, p *pipe, opts histories.PipelineOptions, kind string) {
	t.Helper()
	rep := histories.CheckPipeline(p.ops, 9, opts)
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

func TestPipelineCleanHistoryPasses(t *testing.T) {
	a1, a2, b1 := msg("a1", "a", 1), msg("a2", "a", 2), msg("b1", "b", 1)
	u1, f1 := msg("u1", "u", 1), msg("f1", "f", 1)
	p := (&pipe{}).
		save(0, 5, histories.OK, a1, a2).
		save(1, 6, histories.OK, b1).
		save(2, 7, histories.Info, u1). // indeterminate: may have one effect or none
		save(3, 8, histories.Fail, f1).
		effect(10, 12, histories.OK, a1, false).
		effect(11, 13, histories.OK, b1, false).
		effect(13, 14, histories.OK, a1, true). // redelivered, recognised by the inbox
		effect(15, 16, histories.Info, a2, false).
		effect(17, 18, histories.OK, a2, false). // the redelivery after the unknown commit applied it
		effect(19, 20, histories.OK, u1, false)
	rep := histories.CheckPipeline(p.ops, 9, histories.PipelineOptions{Ordered: true})
	if err := rep.Err(); err != nil {
		t.Fatalf("a clean pipeline history was flagged:\n%v", err)
	}
	rep = histories.CheckPipeline(p.ops, 9, histories.PipelineOptions{Ordered: true,
		Final: map[string]int{"a1": 1, "a2": 1, "b1": 1, "u1": 1}})
	if err := rep.Err(); err != nil {
		t.Fatalf("a clean pipeline history with its final state was flagged:\n%v", err)
	}
	if rep.Messages[histories.OK] != 3 || rep.Messages[histories.Info] != 1 || rep.Messages[histories.Fail] != 1 {
		t.Fatalf("message counts %v", rep.Messages)
	}
}

func TestPipelineFlagsLostMessage(t *testing.T) {
	pipelineFlags(t, (&pipe{}).save(0, 5, histories.OK, msg("m", "k", 1)), histories.PipelineOptions{}, "lost")
	// Its only effect was indeterminate, and the final state shows none.
	pipelineFlags(t, (&pipe{}).
		save(0, 5, histories.OK, msg("m", "k", 1)).
		effect(6, 7, histories.Info, msg("m", "k", 1), false),
		histories.PipelineOptions{Final: map[string]int{}}, "lost")
}

func TestPipelineFlagsDuplicateEffect(t *testing.T) {
	m := msg("m", "k", 1)
	pipelineFlags(t, (&pipe{}).
		save(0, 5, histories.OK, m).
		effect(6, 7, histories.OK, m, false).
		effect(8, 9, histories.OK, m, false), histories.PipelineOptions{}, "duplicate")
	// An indeterminate save's message applied twice, seen only in the final state.
	pipelineFlags(t, (&pipe{}).
		save(0, 5, histories.Info, m).
		effect(6, 7, histories.OK, m, false).
		effect(8, 9, histories.Info, m, false),
		histories.PipelineOptions{Final: map[string]int{"m": 2}}, "duplicate")
}

func TestPipelineFlagsEffectOfAbortedSave(t *testing.T) {
	m := msg("m", "k", 1)
	pipelineFlags(t, (&pipe{}).
		save(0, 5, histories.Fail, m).
		effect(6, 7, histories.OK, m, false), histories.PipelineOptions{}, "aborted")
}

func TestPipelineFlagsPhantomEffect(t *testing.T) {
	pipelineFlags(t, (&pipe{}).effect(6, 7, histories.OK, msg("ghost", "k", 1), false),
		histories.PipelineOptions{}, "phantom")
	pipelineFlags(t, &pipe{}, histories.PipelineOptions{Final: map[string]int{"ghost": 1}}, "phantom")
}

func TestPipelineFlagsReorderedKey(t *testing.T) {
	m1, m2 := msg("m1", "k", 1), msg("m2", "k", 2)
	p := (&pipe{}).
		save(0, 5, histories.OK, m1, m2).
		effect(6, 7, histories.OK, m2, false).
		effect(8, 9, histories.OK, m1, false)
	pipelineFlags(t, p, histories.PipelineOptions{Ordered: true}, "reordered")
	if err := histories.CheckPipeline(p.ops, 9, histories.PipelineOptions{}).Err(); err != nil {
		t.Fatalf("order is checked only where promised: %v", err)
	}
	// Overlapping effects of one key are not ordered by the observer: not flagged.
	overlap := (&pipe{}).
		save(0, 5, histories.OK, m1, m2).
		effect(6, 9, histories.OK, m2, false).
		effect(7, 8, histories.OK, m1, false)
	if err := histories.CheckPipeline(overlap.ops, 9, histories.PipelineOptions{Ordered: true}).Err(); err != nil {
		t.Fatalf("concurrent effects flagged as reordered: %v", err)
	}
}

func TestPipelineFlagsHistoryThatDisagreesWithFinalState(t *testing.T) {
	m := msg("m", "k", 1)
	pipelineFlags(t, (&pipe{}).
		save(0, 5, histories.OK, m).
		effect(6, 7, histories.OK, m, false).
		effect(8, 9, histories.OK, msg("m", "k", 1), false),
		histories.PipelineOptions{Final: map[string]int{"m": 1}}, "disagrees")
}
