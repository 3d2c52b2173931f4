package faultsuite

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// A spared slot keeps its process while the other slots' processes are killed, and is killed again once the
// sparing ends. The relay processes here are stand-ins that report ready and wait.
func TestASparedSlotIsNotKilledUntilTheSparingEnds(t *testing.T) {
	cfg := Config{Relays: 2, KillMin: 20 * time.Millisecond, KillMax: 40 * time.Millisecond, Seed: 1,
		ChildCommand: []string{"sh", "-c", "echo ready; exec sleep 60"}}
	r := newRelays(cfg, "", "", "", slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.spare(true)
	if err := r.start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.stop()
	process := func(slot string) *relayProcess {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.running[slot]
	}
	kills := func() int {
		r.counts.mu.Lock()
		defer r.counts.mu.Unlock()
		return r.counts.kills
	}
	spared := process(sparedSlot)
	deadline := time.Now().Add(30 * time.Second)
	for kills() < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d kills of the other slot in 30s", kills())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if p := process(sparedSlot); p != spared {
		t.Fatalf("slot %s was killed while spared (%d kills in all)", sparedSlot, kills())
	}
	r.spare(false)
	for process(sparedSlot) == spared {
		if time.Now().After(deadline) {
			t.Fatalf("slot %s was not killed within 30s of the sparing's end", sparedSlot)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-r.failed:
		t.Fatal(err)
	default:
	}
}
