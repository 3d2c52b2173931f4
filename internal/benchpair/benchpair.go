// Package benchpair measures a stagehand operation beside its raw baseline in the same run and prints the
// throughput ratio, so figures are always relative to the ceiling measured on the same machine at the same moment.
//
// After one unmeasured warm-up round each, the two sides alternate in short rounds (subject, baseline, baseline,
// subject, ...) so that drift in the machine's load (other processes, checkpoints, autovacuum) falls on both sides
// alike. The RATIO line gives the ratio over all rounds and the range of the single rounds' ratios (how far it
// moves within the run). It also says how much of the machine's CPU time the hypervisor took (steal, package hoststat)
// while the rounds ran: a figure measured on a busy host is not comparable with one from a quiet host.
package benchpair

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stagehand-es/stagehand/internal/hoststat"
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
}

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
			n, d, err := run(sides[side], cfg.Clients, cfg.Round)
			if err != nil {
				b.Fatalf("benchpair: %s: %v", cfg.Names[side], err)
			}
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
	b.ReportMetric(res.Subject, cfg.Unit+"/s")
	b.ReportMetric(res.Baseline, "raw-"+cfg.Unit+"/s")
	b.ReportMetric(res.Ratio(), "ratio")
	b.ReportMetric(res.Low, "ratio-low")
	b.ReportMetric(res.High, "ratio-high")
	if stolen >= 0 {
		b.ReportMetric(stolen*100, "steal-%")
	}
	fmt.Printf("RATIO %s: %s %s %s/s, %s %s %s/s, ratio %.2fx, rounds %.2f-%.2fx (%s)\n", b.Name(), cfg.Names[0],
		human(res.Subject), cfg.Unit, cfg.Names[1], human(res.Baseline), cfg.Unit, res.Ratio(), res.Low, res.High,
		hoststat.Percent(stolen))
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
