package histories_test

import (
	"testing"
	"time"

	"github.com/stagehand-es/stagehand/proof/histories"
)

func TestEffectPaceMeasuresHandleAndGapPerKey(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	eff := func(key string, from, to int, outcome histories.Outcome) histories.Op {
		return histories.Op{Kind: histories.KindEffect, Key: key, Invoke: ms(from), Complete: ms(to), Outcome: outcome}
	}
	h := []histories.Op{
		eff("a", 5, 9, histories.OK), // before the drain: left out
		eff("a", 10, 20, histories.OK),
		eff("b", 12, 22, histories.OK),
		eff("a", 25, 35, histories.OK), // 5 ms after a's last
		{Kind: histories.KindSave, Key: "a", Invoke: ms(26), Complete: ms(27), Outcome: histories.OK},
		{Kind: histories.KindLoadTx, Key: "a", Invoke: ms(26), Complete: ms(28), Outcome: histories.OK},
		{Kind: histories.KindUpdateTx, Key: "a", Invoke: ms(28), Complete: ms(32), Outcome: histories.OK},
		{Kind: histories.KindLoadTx, Key: "a", Invoke: ms(1), Complete: ms(99), Outcome: histories.OK}, // before
		eff("b", 27, 37, histories.OK), // 5 ms after b's last
		eff("b", 38, 100, histories.Fail),
		eff("a", 40, 52, histories.OK), // 5 ms after a's last, 12 ms long
	}
	p := histories.EffectPace(h, ms(10))
	if p.Keys != 2 || p.Effects != 5 || p.Elapsed != ms(42) {
		t.Fatalf("pace %+v: want 2 keys, 5 effects in 42ms", p)
	}
	if p.Handle.P50 != ms(10) || p.Handle.P99 != ms(12) || p.Gap.N != 3 || p.Gap.Mean != ms(5) {
		t.Fatalf("handle %v, gap %v: want handle p50 10ms p99 12ms, three gaps of 5ms", p.Handle, p.Gap)
	}
	if p.Load.N != 1 || p.Load.Mean != ms(2) || p.Update.N != 1 || p.Update.Mean != ms(4) {
		t.Fatalf("load %v, update %v: want one of 2ms and one of 4ms", p.Load, p.Update)
	}
	if p.First.N != 1 || p.First.Mean != ms(10) || p.Last.N != 1 || p.Last.Mean != ms(12) {
		t.Fatalf("first tenth %v, last tenth %v: want 10ms and 12ms", p.First, p.Last)
	}
	if got, want := p.Rate(), 5/0.042; got < want-0.01 || got > want+0.01 {
		t.Fatalf("rate %.2f/s, want %.2f", got, want)
	}
	mean := (4*10 + 12) / 5.0 // ms
	if got, want := p.Bound(), 2/((mean+5)/1000); got < want-0.01 || got > want+0.01 {
		t.Fatalf("bound %.2f/s, want %.2f (2 keys at %.1fms a message)", got, want, mean+5)
	}
}
