package faultsuite_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/proof/faultsuite"
)

func TestMain(m *testing.M) {
	faultsuite.RunChildIfRequested() // a relay process: runs and exits here
	pgtest.Main(m)                   // stops the shared cluster of the tests that use one
}

// TestFaultSuite is the fault-injection suite, once per broker (a subtest each: nats, nats-cluster, rabbitmq):
// relays killed with SIGKILL, PostgreSQL restarted, a broker node killed with SIGKILL and restarted, publishes
// rejected and acknowledgements dropped, all while messages are produced; afterwards nothing may be lost, no key
// reordered at the broker or at the handler, and no effect applied twice behind the inbox. The CI size runs by
// default; STAGEHAND_FAULTS=full runs the full size, STAGEHAND_FAULTS_BROKERS=nats-cluster,rabbitmq only the
// brokers named. STAGEHAND_FAULTS_VERBOSE=1 streams the components' logs to standard error (otherwise the last
// lines are printed only when the run fails).
func TestFaultSuite(t *testing.T) {
	brokers := faultsuite.Brokers()
	if v := os.Getenv("STAGEHAND_FAULTS_BROKERS"); v != "" {
		brokers = strings.Split(v, ",")
	}
	for _, b := range brokers {
		t.Run(b, func(t *testing.T) { runFaultSuite(t, b) })
	}
}

func runFaultSuite(t *testing.T, broker string) {
	pgtest.CheckLeaks(t)
	cfg, err := faultsuite.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Broker = broker
	cfg.ChildCommand = []string{os.Args[0], "-test.run=^$"}
	logs := &ringWriter{max: 400}
	var sink io.Writer = logs
	level := slog.LevelInfo
	if os.Getenv("STAGEHAND_FAULTS_VERBOSE") != "" {
		sink, level = io.MultiWriter(logs, os.Stderr), slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewTextHandler(sink, &slog.HandlerOptions{Level: level}))
	cfg.Progress = testWriter{t}

	ctx, cancel := context.WithTimeout(context.Background(), cfg.ProduceTimeout+cfg.DrainTimeout+3*time.Minute)
	defer cancel()
	rep, err := faultsuite.Run(ctx, cfg)
	if rep != nil {
		t.Log("\n" + rep.String())
	}
	if err == nil {
		err = rep.Check()
	}
	if err != nil {
		t.Logf("the last log lines of the run:\n%s", logs.String())
		t.Fatal(err)
	}
}

// testWriter writes each line to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// ringWriter keeps the last max lines written to it.
type ringWriter struct {
	mu    sync.Mutex
	max   int
	lines []string
}

func (r *ringWriter) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, strings.Split(strings.TrimRight(string(p), "\n"), "\n")...)
	if len(r.lines) > r.max {
		r.lines = append([]string(nil), r.lines[len(r.lines)-r.max:]...)
	}
	return len(p), nil
}

func (r *ringWriter) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.lines, "\n")
}
