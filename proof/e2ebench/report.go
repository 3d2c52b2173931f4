package e2ebench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/internal/testkit/hoststat"
)

// Machine describes where a run measured.
type Machine struct {
	CPUModel   string
	NumCPU     int // runtime.NumCPU
	Nproc      int // what nproc prints (0 if it could not run)
	GOMAXPROCS int
	GoVersion  string
	// PostgreSQL's version and durability settings, read from the server.
	Postgres, Fsync, SynchronousCommit, FullPageWrites string
	// LoadBefore and LoadAfter are /proc/loadavg's 1-minute load average at the start and the end: on a shared
	// machine, other work competes for the same cores.
	LoadBefore, LoadAfter float64
	// Steal is the share of the machine's CPU time the hypervisor gave to something else over the whole run (-1
	// where /proc/stat cannot be read): on a virtual machine, a busy host takes CPU from both paths.
	Steal float64
}

func (m Machine) String() string {
	return fmt.Sprintf("%s, %d CPUs (nproc %d, GOMAXPROCS %d), %s; PostgreSQL %s (fsync %s, synchronous_commit %s, "+
		"full_page_writes %s); load average %.1f at the start", m.CPUModel, m.NumCPU, m.Nproc, m.GOMAXPROCS,
		m.GoVersion, m.Postgres, m.Fsync, m.SynchronousCommit, m.FullPageWrites, m.LoadBefore)
}

func describeMachine(ctx context.Context, pool *pgxpool.Pool) Machine {
	m := Machine{NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(),
		CPUModel: "unknown CPU", LoadBefore: loadAverage()}
	if out, err := exec.CommandContext(ctx, "nproc").Output(); err == nil {
		m.Nproc, _ = strconv.Atoi(strings.TrimSpace(string(out)))
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		_ = f.Close()
	}
	for _, s := range []struct {
		name string
		to   *string
	}{{"server_version", &m.Postgres}, {"fsync", &m.Fsync}, {"synchronous_commit", &m.SynchronousCommit},
		{"full_page_writes", &m.FullPageWrites}} {
		if err := pool.QueryRow(ctx, "SELECT current_setting($1)", s.name).Scan(s.to); err != nil {
			*s.to = "?"
		}
	}
	return m
}

// loadAverage is the 1-minute load average (0 where /proc/loadavg is missing).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(strings.Fields(string(b) + " 0")[0], 64)
	return f
}

// ms formats d in milliseconds.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%.2f ms", v)
	}
}

// Table renders the results as Markdown tables, ready to paste into a README.
func (r *Results) Table() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	c := r.Config
	w("Machine: %s; load average %.1f at the end; CPU %s over the run. Durable cluster, client, relay, forwarder, "+
		"NATS and consumers on the same machine.", r.Machine, r.Machine.LoadAfter, hoststat.Percent(r.Machine.Steal))
	w("")
	w("| maximum sustainable rate (closed loop, %d producers, %d × %s per path) | stagehand | forwarder | ratio |",
		c.SaturationWorkers, c.SaturationRounds, c.Saturation)
	w("| --- | ---: | ---: | ---: |")
	w("| append → handled, msgs/s | %.0f | %.0f | **%.2f×** |", r.MaxStagehand, r.MaxForwarder, r.Ratio())
	w("")
	w("| paced rate (%s per path, in %d slices alternating the paths) | stagehand append → handled p50 / p99 | "+
		"forwarder append → handled p50 / p99 | of which append, stagehand / forwarder (p50; p99) | "+
		"delivered stagehand / forwarder, msgs/s |", c.Paced, c.PacedSlices)
	w("| --- | ---: | ---: | ---: | ---: |")
	for _, p := range r.Paced {
		w("| %.0f msgs/s (%.0f%% of stagehand's max; %.0f%% of the forwarder's) | %s / %s%s | %s / %s%s | %s / %s; %s / %s | %.0f / %.0f |",
			p.Rate, p.Fraction*100, 100*p.Rate/max(r.MaxForwarder, 1), ms(p.Stagehand.P50), ms(p.Stagehand.P99),
			behind(p.Stagehand), ms(p.Forwarder.P50), ms(p.Forwarder.P99), behind(p.Forwarder),
			ms(p.Stagehand.AppendP50), ms(p.Forwarder.AppendP50), ms(p.Stagehand.AppendP99), ms(p.Forwarder.AppendP99),
			p.Stagehand.Throughput, p.Forwarder.Throughput)
	}
	return b.String()
}

// msList formats durations as "12.3 / 45.6 ms" ("-" for none).
func msList(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = strings.TrimSuffix(ms(d), " ms")
	}
	return strings.Join(parts, " / ") + " ms"
}

// behind marks a round whose path did not keep up with the offered rate (its latency then grows with the backlog).
func behind(rd Round) string {
	if rd.KeptUp() {
		return ""
	}
	return " (fell behind)"
}

// String is the tables, the closed-loop rounds and the integrity check.
func (r *Results) String() string {
	var b strings.Builder
	b.WriteString(r.Table())
	b.WriteString("\nclosed-loop rounds:\n")
	for _, rd := range r.Saturation {
		fmt.Fprintf(&b, "  %-9s appended %6d at %5.0f/s, delivered end to end %5.0f msgs/s, last handled %.1fs after "+
			"the producers stopped, %s\n", rd.Path, rd.Produced, rd.ProduceRate, rd.Throughput, rd.Lag.Seconds(),
			hoststat.Percent(rd.Steal))
	}
	b.WriteString("paced slices, append → handled p99 of each in the order run:\n")
	for _, p := range r.Paced {
		fmt.Fprintf(&b, "  %3.0f%%: stagehand %s; forwarder %s\n", p.Fraction*100, msList(p.Stagehand.SliceP99),
			msList(p.Forwarder.SliceP99))
	}
	fmt.Fprintf(&b, "integrity: stagehand %d missing, %d duplicate effects; forwarder %d missing, %d duplicate effects\n",
		r.Missing[PathStagehand], r.Duplicates[PathStagehand], r.Missing[PathForwarder], r.Duplicates[PathForwarder])
	fmt.Fprintf(&b, "total %s\n", r.Total.Round(time.Second))
	return b.String()
}
