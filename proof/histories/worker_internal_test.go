package histories

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A worker's report becomes operations of the run's history at the times the worker read: an operation whose
// completion never came (the worker was killed first) stays pending, an ok effect and an ok LoadTx carry their
// outputs, and a completion stamped before its invocation is not placed before it.
func TestWorkerReportIsRecorded(t *testing.T) {
	rec := NewRecorder()
	t0 := time.Now().Add(time.Second)
	msg := PipelineMessage{ID: "counter-01@3/s", Key: "counter-01", Seq: 3}
	var b strings.Builder
	for _, l := range []workerLine{
		{Event: "ready"},
		{Event: "invoke", ID: 1, Process: 300, Kind: KindEffect, Key: msg.Key, Message: msg},
		{Event: "invoke", ID: 2, Process: 300, Kind: KindLoadTx, Key: msg.Key, Message: msg},
		{Event: "ok", ID: 2, Version: 3, Ticks: 3},
		{Event: "ok", ID: 1, Duplicate: true},
		{Event: "invoke", ID: 3, Process: 301, Kind: KindEffect, Key: "counter-02"},
		{Event: "info", ID: 4, Err: "never invoked"},
		{Event: "invoke", ID: 5, Process: 302, Kind: KindEffect, Key: "counter-03"},
		{Event: "fail", ID: 5, Err: "handler never ran"},
	} {
		if l.Event != "ready" {
			l.At = t0.Add(time.Duration(l.ID) * 10 * time.Millisecond).UnixNano()
		}
		if l.ID == 5 && l.Event == "fail" {
			l.At = t0.UnixNano() // stamped before its invocation
		}
		line, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(append(line, '\n'))
	}
	w := &workers{rec: rec, logger: slog.New(slog.DiscardHandler)}
	wp := &workerProc{ready: make(chan struct{}), read: make(chan struct{})}
	w.readReport(wp, strings.NewReader(b.String()))

	select {
	case <-wp.ready:
	default:
		t.Fatal("the ready line was not seen")
	}
	if e, f := wp.effects.Load(), wp.inflight.Load(); e != 1 || f != 1 {
		t.Fatalf("effects %d, in flight %d; want 1 and 1", e, f)
	}
	h := rec.History()
	if len(h) != 4 {
		t.Fatalf("%d operations, want 4: %v", len(h), h)
	}
	base := t0.Round(0).Sub(rec.start.Round(0))
	effect, load, killed, failed := h[0], h[1], h[2], h[3]
	if effect.Outcome != OK || effect.Output != (EffectOutput{Duplicate: true}) || effect.Process != 300 ||
		effect.Input != (EffectInput{Message: msg}) || effect.Invoke != base+10*time.Millisecond ||
		effect.Complete != base+10*time.Millisecond {
		t.Errorf("effect: %v", effect)
	}
	if load.Outcome != OK || load.Output != (LoadTxOutput{Version: 3, Ticks: 3}) || load.Invoke != base+20*time.Millisecond ||
		load.Complete != base+20*time.Millisecond {
		t.Errorf("loadtx: %v", load)
	}
	if killed.Outcome != Pending || killed.Key != "counter-02" {
		t.Errorf("the operation cut off by the kill: %v, want pending", killed)
	}
	if failed.Outcome != Fail || failed.Err != "handler never ran" || failed.Complete != failed.Invoke {
		t.Errorf("failed: %v, want fail completed at its invocation", failed)
	}
}

// A worker command needs the default broker or a broker spec its processes build theirs from, and a broker spec
// needs a worker command.
func TestWorkerCommandNeedsTheDefaultBrokerOrASpec(t *testing.T) {
	_, err := PipelineRunConfig{DatabaseURL: "postgres://x", Schema: "s", Admin: nil, WorkerCommand: []string{"x"},
		Broker: &Broker{}}.withDefaults()
	if err == nil || !strings.Contains(err.Error(), "WorkerCommand") {
		t.Fatalf("err = %v, want one naming WorkerCommand", err)
	}
	_, err = PipelineRunConfig{DatabaseURL: "postgres://x", Schema: "s", Admin: nil, WorkerBroker: "amqp://x"}.
		withDefaults()
	if err == nil || !strings.Contains(err.Error(), "WorkerBroker") {
		t.Fatalf("err = %v, want one naming WorkerBroker", err)
	}
}

// A worker told to build a broker from a spec, in a binary that gave RunWorkerIfRequested no function to build it
// with, fails at once and names the spec, rather than running with a GoChannel its parent does not know of.
func TestWorkerWithABrokerSpecNeedsABuilder(t *testing.T) {
	b, err := json.Marshal(workerSettings{Broker: "amqp://guest@127.0.0.1:1/"})
	if err != nil {
		t.Fatal(err)
	}
	err = runWorker(string(b), nil)
	if err == nil || !strings.Contains(err.Error(), "amqp://guest@127.0.0.1:1/") {
		t.Fatalf("err = %v, want one naming the broker spec", err)
	}
}
