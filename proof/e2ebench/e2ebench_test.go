package e2ebench_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/proof/e2ebench"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// BenchmarkEndToEnd is the end-to-end benchmark: append → handled through stagehand (Transactional
// staging, the relay, NATS JetStream, an inbox-wrapped consumer) beside watermill-sql's default schema with
// Watermill's forwarder to the same broker and the same consumer logic, on a durable cluster, in the same run.
// It times itself: run it once. STAGEHAND_E2E_RELAY=high-throughput runs the relay with outbox.HighThroughput()
// instead of the default Balanced(); STAGEHAND_E2E_CLAIM_INTERVAL (a duration, 10ms say) sets its ClaimInterval;
// STAGEHAND_E2E_FRACTIONS (comma-separated, 0.25,0.5,0.75 say) the paced rates as fractions of the maximum.
//
//	go test ./proof/e2ebench -run '^$' -bench EndToEnd -benchtime 1x -timeout 30m
func BenchmarkEndToEnd(b *testing.B) {
	url := pgtest.DurableURL(b)
	_, schema := pgtest.MigratedOn(b, url)
	cfg := e2ebench.Config{URL: url, Schema: schema, Progress: os.Stdout}
	switch profile := os.Getenv("STAGEHAND_E2E_RELAY"); profile {
	case "", "balanced":
	case "high-throughput":
		cfg.Relay = outbox.HighThroughput()
	default:
		b.Fatalf("STAGEHAND_E2E_RELAY=%q: want balanced or high-throughput", profile)
	}
	if v := os.Getenv("STAGEHAND_E2E_CLAIM_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("STAGEHAND_E2E_CLAIM_INTERVAL=%q: %v", v, err)
		}
		if cfg.Relay == nil {
			cfg.Relay = outbox.Balanced()
		}
		cfg.Relay.ClaimInterval = d
	}
	if v := os.Getenv("STAGEHAND_E2E_FRACTIONS"); v != "" {
		for _, f := range strings.Split(v, ",") {
			x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil {
				b.Fatalf("STAGEHAND_E2E_FRACTIONS=%q: %v", v, err)
			}
			cfg.Fractions = append(cfg.Fractions, x)
		}
	}
	var res *e2ebench.Results
	for range b.N { // -benchtime 1x: once
		var err error
		res, err = e2ebench.Run(context.Background(), cfg)
		if res != nil {
			fmt.Println(res.String())
		}
		require.NoError(b, err)
		require.NoError(b, res.Check())
	}
	b.ReportMetric(res.MaxStagehand, "stagehand-msgs/s")
	b.ReportMetric(res.MaxForwarder, "forwarder-msgs/s")
	b.ReportMetric(res.Ratio(), "stagehand/forwarder")
	for _, p := range res.Paced {
		b.ReportMetric(float64(p.Stagehand.P99.Microseconds())/1000, fmt.Sprintf("stagehand-p99-ms@%.0f%%", p.Fraction*100))
		b.ReportMetric(float64(p.Forwarder.P99.Microseconds())/1000, fmt.Sprintf("forwarder-p99-ms@%.0f%%", p.Fraction*100))
	}
	b.ReportMetric(0, "ns/op")
}

// TestSmoke runs one short round of everything the benchmark does (on the functional-test cluster, not a durable
// one: the figures mean nothing, the plumbing is what is checked): both paths deliver every message exactly once,
// and the results hang together.
func TestSmoke(t *testing.T) {
	pgtest.CheckLeaks(t)
	url := pgtest.URL(t)
	_, schema := pgtest.Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := e2ebench.Run(ctx, e2ebench.Config{URL: url, Schema: schema,
		Saturation: 500 * time.Millisecond, SaturationRounds: 1, SaturationWorkers: 4,
		Paced: 500 * time.Millisecond, PacedSlices: 2, Fractions: []float64{0.5}, PacedWorkers: 8,
		Warmup: 100 * time.Millisecond, WarmupSaturation: 200 * time.Millisecond, DrainTimeout: 30 * time.Second, Progress: testWriter{t}})
	require.NoError(t, err)
	t.Log("\n" + res.String())
	require.NoError(t, res.Check())

	require.Len(t, res.Saturation, 2)
	require.Equal(t, e2ebench.PathStagehand, res.Saturation[0].Path)
	require.Equal(t, e2ebench.PathForwarder, res.Saturation[1].Path)
	for _, rd := range res.Saturation {
		require.Positive(t, rd.Produced, rd.Path)
		require.Equal(t, rd.Produced, rd.Handled, rd.Path)
		require.Positive(t, rd.Throughput, rd.Path)
		require.LessOrEqual(t, rd.Throughput, rd.ProduceRate*1.0001, "%s: delivered faster than appended", rd.Path)
	}
	// What each round reports of the machine and of the relay: CPU per message on both paths, the relay's claims and
	// marks on stagehand's only.
	for _, rd := range res.Saturation {
		if runtime.GOOS == "linux" {
			require.Positive(t, rd.CPU, rd.Path)
			require.Positive(t, rd.GoCPU, rd.Path)
		}
	}
	sh, fw := res.Saturation[0].Relay, res.Saturation[1].Relay
	require.Positive(t, sh.Claims)
	require.Positive(t, sh.ClaimedRows)
	require.Positive(t, sh.Marks)
	require.LessOrEqual(t, sh.Marks, sh.MarkedRows)
	require.Contains(t, sh.String(), "rows/claim")
	require.Zero(t, fw, "the forwarder's round counted relay work")
	require.Equal(t, res.Saturation[0].Throughput, res.MaxStagehand)
	require.Equal(t, res.Saturation[1].Throughput, res.MaxForwarder)
	require.InDelta(t, res.MaxStagehand/res.MaxForwarder, res.Ratio(), 1e-9)

	require.Len(t, res.Paced, 1)
	p := res.Paced[0]
	require.InDelta(t, 0.5*res.MaxStagehand, p.Rate, 1e-9)
	for _, rd := range []e2ebench.Round{p.Stagehand, p.Forwarder} {
		require.Equal(t, p.Rate, rd.Offered, rd.Path)
		require.Positive(t, rd.Produced, rd.Path)
		require.Equal(t, rd.Produced, rd.Handled, rd.Path)
		// Paced producers append no faster than offered (each slice's first append is due at once, hence one extra
		// per slice).
		require.LessOrEqual(t, float64(rd.Produced), p.Rate*0.5+2, rd.Path)
		require.Len(t, rd.SliceP99, 2, "%s: the p99 of each slice", rd.Path)
		require.LessOrEqual(t, slices.Min(rd.SliceP99), rd.P99, rd.Path)
		require.GreaterOrEqual(t, slices.Max(rd.SliceP99), rd.P99, rd.Path)
		require.Positive(t, rd.P50, rd.Path)
		require.LessOrEqual(t, rd.P50, rd.P99, rd.Path)
		require.LessOrEqual(t, rd.P99, rd.Max, rd.Path)
		require.Positive(t, rd.AppendP50, rd.Path)
		require.LessOrEqual(t, rd.AppendP50, rd.AppendP99, rd.Path)
		require.LessOrEqual(t, rd.AppendP50, rd.P50, "%s: a message is handled after its append returned", rd.Path)
	}
	require.Equal(t, e2ebench.PathStagehand, p.Stagehand.Path)
	require.Equal(t, e2ebench.PathForwarder, p.Forwarder.Path)

	table := res.Table()
	require.Contains(t, table, "| append → handled, msgs/s |")
	require.Contains(t, table, "per path, in 2 slices alternating the paths)")
	require.Contains(t, res.String(), "  50%: stagehand ")
	require.Contains(t, table, fmt.Sprintf("| %.0f msgs/s (50%% of stagehand's max;", p.Rate))
	require.Contains(t, table, "PostgreSQL ")
	require.Positive(t, res.Machine.NumCPU)
	require.NotEmpty(t, res.Machine.Postgres)

	// The host's steal is measured per round and over the run (Linux's /proc/stat), and the report says it.
	steals := []float64{res.Machine.Steal, p.Stagehand.Steal, p.Forwarder.Steal}
	for _, rd := range res.Saturation {
		steals = append(steals, rd.Steal)
	}
	for _, st := range steals {
		if runtime.GOOS == "linux" {
			require.True(t, st >= 0 && st <= 1, "steal share %v", st)
		} else {
			require.Equal(t, -1.0, st)
		}
	}
	require.Contains(t, table, "; CPU steal ")
	require.Contains(t, res.String(), "the producers stopped, steal ")
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  e2ebench.Config
		want string
	}{
		{e2ebench.Config{Schema: "s"}, "URL is required"},
		{e2ebench.Config{URL: "postgres://x"}, "Schema is required"},
		{e2ebench.Config{URL: "postgres://x", Schema: "s", Fractions: []float64{0.5, 1.5}}, "Fractions must be in (0, 1]"},
		{e2ebench.Config{URL: "postgres://x", Schema: "s", Paced: -time.Second}, "must not be negative"},
		{e2ebench.Config{URL: "postgres://x", Schema: "s", PacedWorkers: -1}, "PacedWorkers must not be negative"},
		{e2ebench.Config{URL: "postgres://x", Schema: "s", PacedSlices: -1}, "PacedSlices must not be negative"},
		{e2ebench.Config{URL: "postgres://x", Schema: "s", PoolSize: -2}, "PoolSize must not be negative, got -2"},
	} {
		_, err := e2ebench.Run(context.Background(), c.cfg)
		require.ErrorContains(t, err, c.want)
	}
}

func TestRoundKeptUp(t *testing.T) {
	t.Parallel()
	ok := e2ebench.Round{Offered: 1000, Produced: 5000, Handled: 5000, Throughput: 990, Lag: 20 * time.Millisecond}
	require.True(t, ok.KeptUp())
	for name, rd := range map[string]e2ebench.Round{
		"slower":   {Offered: 1000, Produced: 5000, Handled: 5000, Throughput: 900, Lag: 20 * time.Millisecond},
		"backlog":  {Offered: 1000, Produced: 5000, Handled: 5000, Throughput: 990, Lag: 3 * time.Second},
		"not done": {Offered: 1000, Produced: 5000, Handled: 4999, Throughput: 990, Lag: 20 * time.Millisecond},
	} {
		require.False(t, rd.KeptUp(), name)
	}
}

func TestTableMarksRoundsThatFellBehind(t *testing.T) {
	t.Parallel()
	kept := e2ebench.Round{Offered: 500, Produced: 100, Handled: 100, Throughput: 500, P50: 3 * time.Millisecond,
		P99: 12500 * time.Microsecond, AppendP50: 1200 * time.Microsecond, AppendP99: 4 * time.Millisecond}
	fell := kept
	fell.Throughput, fell.P99 = 300, 1500*time.Millisecond
	res := &e2ebench.Results{MaxStagehand: 1000, MaxForwarder: 400,
		Paced: []e2ebench.Paced{{Fraction: 0.5, Rate: 500, Stagehand: kept, Forwarder: fell}}}
	table := res.Table()
	require.Contains(t, table, "| 1000 | 400 | **2.50×** |")
	require.Contains(t, table, "| 500 msgs/s (50% of stagehand's max; 125% of the forwarder's) | 3.00 ms / 12.5 ms | "+
		"3.00 ms / 1500 ms (fell behind) | 1.20 ms / 1.20 ms; 4.00 ms / 4.00 ms | 500 / 300 |")
	require.False(t, strings.Contains(table, "12.5 ms (fell behind)"))
}

// testWriter writes each line to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
