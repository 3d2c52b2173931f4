package histories

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// A worker process: the test binary re-executed with envWorker set. It runs the pipeline's outbox relay and one
// handler per partition topic behind the inbox, as RunPipeline does in its own process without a worker, on pools
// of its own through the run's fault proxy, with a GoChannel of its own between them. The nemesis kills it with
// SIGKILL mid-work (no graceful shutdown: its transactions end with its connections, its claims stay until they
// expire) and starts another, whose relay delivers again what the killed one had claimed once the claims expire.
//
// It reports its handlers' operations on standard output, one JSON line per invocation or completion, written
// at once (unbuffered) with the wall-clock time it read, so the parent records them in the run's history as they
// happened; an operation whose completion a SIGKILL cut off stays pending (indeterminate) there. Its logs go to
// standard error, which the parent forwards to its logger.

const (
	envWorker = "STAGEHAND_HISTORIES_WORKER" // the worker's settings (workerSettings, JSON)
)

// workerSettings is what a worker process is told.
type workerSettings struct {
	Through     string        // the fault proxy's URL
	AppPrefix   string        // the run's application_name prefix
	Schema      string        //
	Partitions  int           //
	PollOnly    bool          //
	OpTimeout   time.Duration //
	Incarnation int           // how many workers started before this one
	Broker      string        // PipelineRunConfig.WorkerBroker: empty for a GoChannel of its own
}

// A WorkerBroker builds, in a worker process, the broker its relay publishes to and its handlers consume from,
// from the spec of PipelineRunConfig.WorkerBroker. It returns the broker (Publisher, Subscriber and Unavailable
// are used) and a function that closes it.
type WorkerBroker func(ctx context.Context, spec string, logger *slog.Logger) (*Broker, func(), error)

// workerLine is one line of a worker's report.
type workerLine struct {
	Event   string          `json:"e"` // "ready", "invoke", "ok", "fail", "info"
	ID      int64           `json:"id,omitempty"`
	Process int             `json:"p,omitempty"`
	Kind    string          `json:"k,omitempty"`
	Key     string          `json:"key,omitempty"`
	Message PipelineMessage `json:"m"`
	// Duplicate is the output of an ok effect; Version and Ticks of an ok LoadTx.
	Duplicate bool   `json:"dup,omitempty"`
	Version   int64  `json:"v,omitempty"`
	Ticks     int64  `json:"ticks,omitempty"`
	Err       string `json:"err,omitempty"`
	At        int64  `json:"t"` // Unix nanoseconds
}

// RunWorkerIfRequested runs a worker process and exits when this process was started as one (by RunPipeline,
// through PipelineRunConfig.WorkerCommand); otherwise it returns at once. Call it first in the test binary's
// TestMain. broker builds the worker's broker when the run has a WorkerBroker spec; it may be nil when no run of
// the binary has one.
func RunWorkerIfRequested(broker WorkerBroker) {
	v := os.Getenv(envWorker)
	if v == "" {
		return
	}
	if err := runWorker(v, broker); err != nil {
		fmt.Fprintf(os.Stderr, "level=ERROR msg=\"histories: worker process failed\" error=%q\n", err.Error())
		os.Exit(1)
	}
	os.Exit(0)
}

func runWorker(settings string, broker WorkerBroker) error {
	var ws workerSettings
	if err := json.Unmarshal([]byte(settings), &ws); err != nil {
		return fmt.Errorf("%s: %w", envWorker, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go exitWithParent(ctx, stop)
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	reg, err := newPipelineRegistry()
	if err != nil {
		return err
	}
	var brk *Broker
	switch {
	case ws.Broker == "":
		gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true, BlockPublishUntilSubscriberAck: true},
			watermill.NewSlogLogger(logger))
		defer func() { _ = gc.Close() }()
		brk = &Broker{Name: "worker GoChannel", Publisher: gc, Subscriber: gc}
	case broker == nil:
		return fmt.Errorf("the run names a worker broker (%q) and RunWorkerIfRequested was given none to build it",
			ws.Broker)
	default:
		b, closeBroker, err := broker(ctx, ws.Broker, logger)
		if err != nil {
			return fmt.Errorf("worker broker %q: %w", ws.Broker, err)
		}
		defer closeBroker()
		brk = b
	}
	out := &lineWriter{w: os.Stdout}
	p := &pipeline{cfg: PipelineRunConfig{Schema: ws.Schema, Partitions: ws.Partitions, PollOnly: ws.PollOnly,
		OpTimeout: ws.OpTimeout, Logger: logger}, through: ws.Through, appPrefix: ws.AppPrefix, reg: reg,
		brk: brk, record: out.invoke}
	defer p.closeAll()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	if err := p.startConsumers(ctx, &wg, "worker-inbox", 300+1000*ws.Incarnation); err != nil {
		return err
	}
	if err := p.startRelay(ctx, &wg, "worker-relay", fmt.Sprintf("histories-worker-%d", ws.Incarnation)); err != nil {
		return err
	}
	out.write(workerLine{Event: "ready"})
	<-ctx.Done()
	return nil
}

// exitWithParent ends the worker when the process that started it is gone (a parent killed by a test timeout),
// so no worker outlives its run.
func exitWithParent(ctx context.Context, stop func()) {
	parent := os.Getppid()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if os.Getppid() != parent {
				stop()
				return
			}
		}
	}
}

// lineWriter writes a worker's report, one whole line per write.
type lineWriter struct {
	mu   sync.Mutex
	w    io.Writer
	next atomic.Int64
}

func (l *lineWriter) write(line workerLine) {
	line.At = time.Now().UnixNano()
	b, err := json.Marshal(line)
	if err != nil {
		panic(err) // the line's fields always encode
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.Write(append(b, '\n'))
}

func (l *lineWriter) invoke(process int, kind, key string, input any) opInvocation {
	in, _ := input.(EffectInput)
	id := l.next.Add(1)
	l.write(workerLine{Event: "invoke", ID: id, Process: process, Kind: kind, Key: key, Message: in.Message})
	return &lineInvocation{l: l, id: id}
}

type lineInvocation struct {
	l  *lineWriter
	id int64
}

func (i *lineInvocation) OK(output any) {
	line := workerLine{Event: "ok", ID: i.id}
	switch o := output.(type) {
	case EffectOutput:
		line.Duplicate = o.Duplicate
	case LoadTxOutput:
		line.Version, line.Ticks = o.Version, o.Ticks
	}
	i.l.write(line)
}

func (i *lineInvocation) Fail(_ any, err error) {
	i.l.write(workerLine{Event: "fail", ID: i.id, Err: errOr(err, "failed").Error()})
}

func (i *lineInvocation) Info(err error) {
	i.l.write(workerLine{Event: "info", ID: i.id, Err: errOr(err, "unknown").Error()})
}

// opInvocation is an invocation to complete: the recorder's, or a worker's line.
type opInvocation interface {
	OK(output any)
	Fail(output any, err error)
	Info(err error)
}

// WorkerStats is what the worker processes of a pipeline run did.
type WorkerStats struct {
	// Starts counts the worker processes started; Kills those killed with SIGKILL by the nemesis, KillsMidWork
	// those of them with an operation in flight when killed.
	Starts, Kills, KillsMidWork int
	// Effects counts the deliveries the workers' handlers completed as ok (duplicates included).
	Effects int
}

// workers runs one worker process at a time, and kills and replaces it on the nemesis's command.
type workers struct {
	command  []string
	settings workerSettings
	rec      *Recorder
	logger   *slog.Logger

	mu    sync.Mutex
	cur   *workerProc
	stats WorkerStats
}

// workerProc is one worker process and the reading of its report.
type workerProc struct {
	cmd      *exec.Cmd
	read     chan struct{} // closed when its report and its logs were read to the end
	ready    chan struct{} // closed when it reported ready
	effects  atomic.Int64  // ok deliveries completed
	inflight atomic.Int64  // operations invoked and not completed
}

// start starts a worker process; it reports ready on its own time.
func (w *workers) start() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.settings
	s.Incarnation = w.stats.Starts
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("histories: worker settings: %w", err)
	}
	cmd := exec.Command(w.command[0], w.command[1:]...)
	cmd.Env = append(os.Environ(), envWorker+"="+string(b))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("histories: worker: %w", err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return fmt.Errorf("histories: worker: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("histories: start a worker process: %w", err)
	}
	wp := &workerProc{cmd: cmd, read: make(chan struct{}), ready: make(chan struct{})}
	var reading sync.WaitGroup
	reading.Add(2)
	go func() { defer reading.Done(); w.readReport(wp, stdout) }()
	go func() {
		defer reading.Done()
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			w.logger.Warn("histories: worker process", "pid", cmd.Process.Pid, "line", sc.Text())
		}
	}()
	go func() { reading.Wait(); close(wp.read) }()
	w.cur = wp
	w.stats.Starts++
	return nil
}

// readReport records the worker's operations in the run's history until its standard output ends. Operations
// left uncompleted stay pending: indeterminate.
func (w *workers) readReport(wp *workerProc, r io.Reader) {
	type invoked struct {
		inv  Invocation
		kind string
	}
	invs := map[int64]invoked{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		var l workerLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			w.logger.Warn("histories: worker process wrote an unreadable line", "line", sc.Text(), "error", err)
			continue
		}
		at := time.Unix(0, l.At)
		switch l.Event {
		case "ready":
			close(wp.ready)
		case "invoke":
			invs[l.ID] = invoked{w.rec.invokeAt(at, l.Process, l.Kind, l.Key, EffectInput{Message: l.Message}), l.Kind}
			wp.inflight.Add(1)
		case "ok", "fail", "info":
			o, ok := invs[l.ID]
			if !ok {
				w.logger.Warn("histories: worker process completed an operation it never invoked", "line", sc.Text())
				continue
			}
			delete(invs, l.ID)
			inv := o.inv
			wp.inflight.Add(-1)
			switch l.Event {
			case "ok":
				var out any
				switch o.kind {
				case KindEffect:
					out = EffectOutput{Duplicate: l.Duplicate}
					wp.effects.Add(1)
				case KindLoadTx:
					out = LoadTxOutput{Version: l.Version, Ticks: l.Ticks}
				}
				inv.completeAt(at, OK, out, nil)
			case "fail":
				inv.completeAt(at, Fail, nil, errors.New(l.Err))
			default:
				inv.completeAt(at, Info, nil, errors.New(l.Err))
			}
		}
	}
}

// waitReady waits for the current worker to report ready.
func (w *workers) waitReady(ctx context.Context, timeout time.Duration) error {
	w.mu.Lock()
	wp := w.cur
	w.mu.Unlock()
	select {
	case <-wp.ready:
		return nil
	case <-wp.read:
		return errors.New("histories: the worker process ended before it was ready (its log lines are in the run's log)")
	case <-time.After(timeout):
		return fmt.Errorf("histories: the worker process was not ready within %s", timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// kill waits (up to 3 s) for the current worker to be working, kills it with SIGKILL, waits for it
// to end and starts another. It returns the fault's name.
func (w *workers) kill(ctx context.Context) (string, error) {
	w.mu.Lock()
	wp := w.cur
	w.mu.Unlock()
	// Kill it at work: once it is ready and has handled something (or a few seconds have passed).
	wait, cancel := context.WithTimeout(ctx, 3*time.Second)
	select {
	case <-wp.ready:
	case <-wait.Done():
	}
	for wp.effects.Load() == 0 && wait.Err() == nil {
		sleep(wait, 10*time.Millisecond)
	}
	cancel()
	midWork := wp.inflight.Load() > 0
	if err := wp.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return "", fmt.Errorf("histories: kill the worker process: %w", err)
	}
	<-wp.read
	err := wp.cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() {
		return "", fmt.Errorf("histories: the worker process ended otherwise than killed: %v", err)
	}
	w.mu.Lock()
	w.stats.Kills++
	if midWork {
		w.stats.KillsMidWork++
	}
	w.stats.Effects += int(wp.effects.Load())
	w.mu.Unlock()
	if err := w.start(); err != nil {
		return "", err
	}
	return kindNames[faultKillWorker], nil
}

// stop ends the current worker with SIGTERM (SIGKILL after 15 s) and returns what the workers did.
func (w *workers) stop() WorkerStats {
	w.mu.Lock()
	wp := w.cur
	w.cur = nil
	w.mu.Unlock()
	if wp != nil {
		_ = wp.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-wp.read:
		case <-time.After(15 * time.Second):
			w.logger.Warn("histories: the worker process did not end on SIGTERM; killing it")
			_ = wp.cmd.Process.Signal(syscall.SIGKILL)
			<-wp.read
		}
		if err := wp.cmd.Wait(); err != nil {
			w.logger.Warn("histories: the worker process ended with an error", "error", err)
		}
		w.mu.Lock()
		w.stats.Effects += int(wp.effects.Load())
		w.mu.Unlock()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}
