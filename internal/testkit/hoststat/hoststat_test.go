package hoststat

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseReadsStealFromTheAggregateLine(t *testing.T) {
	const stat = "cpu  100 5 50 800 10 1 2 32 7 3\ncpu0 50 2 25 400 5 0 1 16 3 1\nintr 12345\n"
	c, err := parse(strings.NewReader(stat))
	if err != nil {
		t.Fatal(err)
	}
	// Guest and guest_nice (7, 3) are part of user and nice already: not counted twice.
	if c.Total != 100+5+50+800+10+1+2+32 || c.Steal != 32 || c.Idle != 800+10 {
		t.Fatalf("got %+v, want total 1000, steal 32 and idle 810", c)
	}
}

func TestBusyLeavesOutIdleAndSteal(t *testing.T) {
	a, b := CPU{Total: 1000, Idle: 600, Steal: 100}, CPU{Total: 1400, Idle: 750, Steal: 150}
	if got := b.Busy(a); got != 2 { // 400 ticks, 150 idle, 50 steal: 200 ticks, 2 s
		t.Fatalf("got %v s, want 2", got)
	}
	if got := a.Busy(b); got != 0 {
		t.Fatalf("counters going backwards: got %v", got)
	}
}

func TestParseWithoutAStealColumn(t *testing.T) {
	c, err := parse(strings.NewReader("cpu 10 0 10 80\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Total != 100 || c.Steal != 0 {
		t.Fatalf("got %+v", c)
	}
}

func TestParseRejectsWhatIsNotProcStat(t *testing.T) {
	if _, err := parse(strings.NewReader("intr 1\n")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no cpu line: got %v, want ErrUnavailable", err)
	}
	if _, err := parse(strings.NewReader("cpu 1 x 3\n")); err == nil || !strings.Contains(err.Error(), "field 2") {
		t.Fatalf("a bad field: got %v", err)
	}
}

func TestStealSinceIsTheShareOfTheInterval(t *testing.T) {
	a, b := CPU{Total: 1000, Steal: 100}, CPU{Total: 1400, Steal: 200}
	if got := b.StealSince(a); got != 0.25 {
		t.Fatalf("got %v, want 0.25", got)
	}
	if got := a.StealSince(a); got != 0 {
		t.Fatalf("no time passed: got %v", got)
	}
	if got := a.StealSince(b); got != 0 {
		t.Fatalf("counters going backwards: got %v", got)
	}
}

func TestPercent(t *testing.T) {
	if got := Percent(0.234); got != "steal 23%" {
		t.Fatal(got)
	}
	if got := Percent(-1); got != "steal unknown" {
		t.Fatal(got)
	}
}

func TestReadOnThisMachine(t *testing.T) {
	c, err := Read()
	if runtime.GOOS != "linux" {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("got %v, want ErrUnavailable", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if c.Total == 0 || c.Steal > c.Total {
		t.Fatalf("implausible counters %+v", c)
	}
	share := Steal()()
	if share < 0 || share > 1 {
		t.Fatalf("steal share %v", share)
	}
}

func TestProcessCPUCountsThisProcessWork(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" {
		t.Skip("not read on " + runtime.GOOS)
	}
	before := ProcessCPU()
	// Spin until the process has used 50ms more CPU, or give up after 5s of wall time.
	deadline := time.Now().Add(5 * time.Second)
	x := 0
	for ProcessCPU()-before < 50*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatalf("5s of spinning added %v of process CPU", ProcessCPU()-before)
		}
		for i := range 1_000_000 {
			x += i
		}
	}
	if x == 0 {
		t.Fatal("the spin did nothing")
	}
}
