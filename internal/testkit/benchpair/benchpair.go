// Package benchpair measures a stagehand operation beside its raw baseline in the same run and prints the
// throughput ratio, so figures are always relative to the ceiling measured on the same machine at the same moment.
//
// After one unmeasured warm-up round each, the two sides alternate in short rounds (subject, baseline, baseline,
// subject, ...) so that drift in the machine's load (other processes, checkpoints, autovacuum) falls on both sides
// alike. The RATIO line gives the ratio over all rounds and the range of the single rounds' ratios (how far it
// moves within the run). It also says how much of the machine's CPU time the hypervisor took (steal, package hoststat)
// while the rounds ran: a figure measured on a busy host is not comparable with one from a quiet host. And it gives
// each side's CPU per unit: the machine's busy time over its rounds (every process, the database server's included)
// and this process's share of it (the client's). Where the clients saturate the machine's CPUs, the rates' ratio is
// about the inverse of their ratio: the line tells a gap in CPU from a gap in waiting.
package benchpair

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehand-es/stagehand/internal/testkit/hoststat"
)

// Op performs one operation on behalf of worker (0..clients-1). Workers keep their own state by index.
type Op func(worker int) error

// Config describes a comparison.
type Config struct {
	// Unit names what one operation produces ("events", "messages"); UnitsPerOp scales operations to it.
	Unit       string
	UnitsPerOp int
	// Clients is the number of concurrent workers. Default 1.
	Clients int
	// Rounds and Round set how long each side runs: Rounds rounds of Round each. Defaults 6 and 500ms; the
	// environment variable STAGEHAND_BENCH_ROUND (a duration) overrides Round.
	Rounds int
	Round  time.Duration
	// Names label the subject and the baseline in the RATIO line and in errors. Default "stagehand" and "raw".
	Names [2]string
}

// Result holds the measured rates in units per second, and the range of the ratios of single rounds.
type Result struct {
	Subject, Baseline float64
	// Low and High are the lowest and the highest ratio of one round's subject to the baseline round run next to
	// it: how far the ratio moves within the run, which a single figure hides.
	Low, High float64
	// CPU is the machine's CPU time (busy: neither idle nor steal, every process on it) per unit over each side's
	// measured rounds, subject first; ProcessCPU is this process's share of it (the client). Zero where /proc/stat
	// cannot be read. On a machine a comparison saturates, the rates' ratio follows the inverse of these.
	CPU, ProcessCPU [2]time.Duration
}

// cpuTime sums the CPU a side used over its rounds: the machine's busy time (every process, the database server's
// included) and this process's own.
type cpuTime struct {
	machine float64 // seconds of one CPU
	process time.Duration
	rounds  int
	failed  bool // a sample could not be read: the side's CPU is unknown
}

// cpuSample is the machine's and this process's CPU counters at one moment (ok false where /proc/stat cannot be
// read).
type cpuSample struct {
	machine hoststat.CPU
	process time.Duration
	ok      bool
}

func readCPU() cpuSample {
	c, err := hoststat.Read()
	return cpuSample{machine: c, process: hoststat.ProcessCPU(), ok: err == nil}
}

// add counts the CPU used between before and after; one unreadable sample leaves the side's CPU unknown.
func (t *cpuTime) add(before, after cpuSample) {
	if !before.ok || !after.ok {
		t.failed = true
		return
	}
	t.machine += after.machine.Busy(before.machine)
	t.process += after.process - before.process
	t.rounds++
}

// known reports whether every round's CPU was read.
func (t *cpuTime) known() bool { return !t.failed && t.rounds > 0 }

// cpuText is ", CPU per save: stagehand 410 µs (this process 95 µs), raw 350 µs (85 µs), 1.17x" for the RATIO
// line, or "" when either side's CPU is unknown.
func (r Result) cpuText(cfg Config) string {
	if r.CPU[0] <= 0 || r.CPU[1] <= 0 {
		return ""
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
	return fmt.Sprintf(", CPU per %s: %s %.0f µs (this process %.0f µs), %s %.0f µs (%.0f µs), %.2fx",
		unitName(cfg.Unit), cfg.Names[0], us(r.CPU[0]), us(r.ProcessCPU[0]), cfg.Names[1], us(r.CPU[1]), us(r.ProcessCPU[1]),
		us(r.CPU[0])/us(r.CPU[1]))
}

// unitName is the singular of a unit ("saves" -> "save", "events" -> "event").
func unitName(unit string) string { return strings.TrimSuffix(unit, "s") }

// Ratio is Subject / Baseline.
func (r Result) Ratio() float64 {
	if r.Baseline == 0 {
		return 0
	}
	return r.Subject / r.Baseline
}

// Compare runs subject and baseline alternately and reports both rates and their ratio as benchmark metrics, and
// prints a RATIO line. Run it with -benchtime 1x: it times itself.
func Compare(b *testing.B, cfg Config, subject, baseline Op) Result {
	b.Helper()
	if cfg.Clients <= 0 {
		cfg.Clients = 1
	}
	if cfg.UnitsPerOp <= 0 {
		cfg.UnitsPerOp = 1
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 6
	}
	if cfg.Round <= 0 {
		cfg.Round = 500 * time.Millisecond
	}
	if cfg.Names == [2]string{} {
		cfg.Names = [2]string{"stagehand", "raw"}
	}
	if d, err := time.ParseDuration(os.Getenv("STAGEHAND_BENCH_ROUND")); err == nil && d > 0 {
		cfg.Round = d
	}
	var ops [2]int64
	var spent [2]time.Duration
	var cpu [2]cpuTime                      // each side's CPU over its measured rounds
	rates := make([][2]float64, cfg.Rounds) // per round, each side's operations per second
	sides := [2]Op{subject, baseline}
	// One unmeasured round per side first: fresh tables extend their files, indexes split their first pages and
	// connections are opened, and whichever side ran first would pay for all of it.
	for side := range sides {
		if _, _, err := run(sides[side], cfg.Clients, cfg.Round); err != nil {
			b.Fatalf("benchpair: warm-up of %s: %v", cfg.Names[side], err)
		}
	}
	b.ResetTimer()
	steal := hoststat.Steal()
	for round := range cfg.Rounds {
		order := [2]int{0, 1}
		if round%2 == 1 {
			order = [2]int{1, 0}
		}
		for _, side := range order {
			before := readCPU()
			n, d, err := run(sides[side], cfg.Clients, cfg.Round)
			if err != nil {
				b.Fatalf("benchpair: %s: %v", cfg.Names[side], err)
			}
			cpu[side].add(before, readCPU())
			ops[side] += n
			spent[side] += d
			rates[round][side] = float64(n) / d.Seconds()
		}
	}
	b.StopTimer()
	stolen := steal()
	res := Result{
		Subject:  float64(ops[0]*int64(cfg.UnitsPerOp)) / spent[0].Seconds(),
		Baseline: float64(ops[1]*int64(cfg.UnitsPerOp)) / spent[1].Seconds(),
	}
	res.Low, res.High = roundRange(rates)
	for side := range sides {
		units := float64(ops[side] * int64(cfg.UnitsPerOp))
		if cpu[side].known() && units > 0 {
			res.CPU[side] = time.Duration(cpu[side].machine * float64(time.Second) / units)
			res.ProcessCPU[side] = time.Duration(float64(cpu[side].process) / units)
		}
	}
	b.ReportMetric(res.Subject, cfg.Unit+"/s")
	b.ReportMetric(res.Baseline, "raw-"+cfg.Unit+"/s")
	b.ReportMetric(res.Ratio(), "ratio")
	b.ReportMetric(res.Low, "ratio-low")
	b.ReportMetric(res.High, "ratio-high")
	if stolen >= 0 {
		b.ReportMetric(stolen*100, "steal-%")
	}
	if res.CPU[0] > 0 && res.CPU[1] > 0 {
		b.ReportMetric(float64(res.CPU[0].Nanoseconds())/1000, "cpu-us/"+unitName(cfg.Unit))
		b.ReportMetric(float64(res.CPU[1].Nanoseconds())/1000, "raw-cpu-us/"+unitName(cfg.Unit))
	}
	fmt.Printf("RATIO %s: %s %s %s/s, %s %s %s/s, ratio %.2fx, rounds %.2f-%.2fx (%s)%s\n", b.Name(), cfg.Names[0],
		human(res.Subject), cfg.Unit, cfg.Names[1], human(res.Baseline), cfg.Unit, res.Ratio(), res.Low, res.High,
		hoststat.Percent(stolen), res.cpuText(cfg))
	return res
}

// roundRange returns the lowest and the highest ratio of subject to baseline rate over rounds (each [subject,
// baseline]); rounds with a baseline rate of zero have no ratio and are skipped (0, 0 when none has one).
func roundRange(rounds [][2]float64) (low, high float64) {
	first := true
	for _, r := range rounds {
		if r[1] == 0 {
			continue
		}
		q := r[0] / r[1]
		if first || q < low {
			low = q
		}
		if first || q > high {
			high = q
		}
		first = false
	}
	return low, high
}

func run(op Op, clients int, d time.Duration) (int64, time.Duration, error) {
	var n atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if err := op(w); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	return n.Load(), time.Since(start), firstErr
}

func human(v float64) string {
	switch {
	case v >= 10000:
		return strconv.FormatFloat(v/1000, 'f', 1, 64) + "k"
	default:
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
}
