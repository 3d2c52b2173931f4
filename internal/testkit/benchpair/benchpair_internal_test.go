package benchpair

import (
	"testing"
	"time"

	"github.com/stagehand-es/stagehand/internal/testkit/hoststat"
)

func TestRoundRange(t *testing.T) {
	for _, c := range []struct {
		name      string
		rounds    [][2]float64
		low, high float64
	}{
		{"one round", [][2]float64{{90, 100}}, 0.9, 0.9},
		{"spread", [][2]float64{{80, 100}, {120, 100}, {100, 100}}, 0.8, 1.2},
		{"lowest last", [][2]float64{{100, 100}, {50, 100}}, 0.5, 1},
		{"no baseline rate in a round", [][2]float64{{10, 0}, {90, 100}}, 0.9, 0.9},
		{"none", nil, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			low, high := roundRange(c.rounds)
			if low != c.low || high != c.high {
				t.Errorf("roundRange(%v) = %v, %v; want %v, %v", c.rounds, low, high, c.low, c.high)
			}
		})
	}
}

func TestCPUTimeSumsRoundsAndForgetsAnUnreadableOne(t *testing.T) {
	at := func(busyTicks, idleTicks uint64, process time.Duration) cpuSample {
		return cpuSample{machine: hoststat.CPU{Total: busyTicks + idleTicks, Idle: idleTicks}, process: process, ok: true}
	}
	var c cpuTime
	c.add(at(0, 0, 0), at(150, 50, 400*time.Millisecond)) // 1.5 CPU-seconds busy
	c.add(at(1000, 0, time.Second), at(1050, 0, 1100*time.Millisecond))
	if !c.known() || c.machine != 2 || c.process != 500*time.Millisecond {
		t.Fatalf("after two rounds: known %v, machine %v s, process %v; want true, 2, 500ms", c.known(), c.machine,
			c.process)
	}
	c.add(cpuSample{}, at(2000, 0, 0))
	if c.known() {
		t.Fatal("a round without a reading left the side's CPU known")
	}
	if (&cpuTime{}).known() {
		t.Fatal("a side without rounds has a known CPU")
	}
}

func TestCPUText(t *testing.T) {
	cfg := Config{Unit: "saves", Names: [2]string{"stagehand", "raw"}}
	r := Result{CPU: [2]time.Duration{410 * time.Microsecond, 350 * time.Microsecond},
		ProcessCPU: [2]time.Duration{95 * time.Microsecond, 85 * time.Microsecond}}
	want := ", CPU per save: stagehand 410 µs (this process 95 µs), raw 350 µs (85 µs), 1.17x"
	if got := r.cpuText(cfg); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	r.CPU[1] = 0
	if got := r.cpuText(cfg); got != "" {
		t.Fatalf("with the baseline's CPU unknown: got %q, want nothing", got)
	}
}
