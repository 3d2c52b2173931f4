package faultsuite

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// relayCounts is what the relay processes reported, summed over every process of the run.
type relayCounts struct {
	mu                 sync.Mutex
	starts             int
	kills              int
	killsMidWork       int // kills of a process that had published at least one message
	lastKill           time.Time
	injectedRejections int64
	unexpected         int64
	unreachable        int64
	deadLettered       int64
	samples            []string // the first few unexpected rejections and dead letters
}

func (c *relayCounts) sample(line string) {
	if len(c.samples) < 5 {
		c.samples = append(c.samples, line)
	}
}

// relayProcess is one running relay process.
type relayProcess struct {
	cmd       *exec.Cmd
	ready     chan struct{}
	exited    chan struct{}
	waitErr   error
	published int64 // guarded by relays.counts.mu
	stderr    *tailBuffer
}

// relays runs Config.Relays relay slots. Each slot runs a relay process, kills it with SIGKILL a random 1-3 s after
// it reported ready and starts a new one, until stopKilling; the process then running stays up until stop.
type relays struct {
	cfg    Config
	env    []string
	logger *slog.Logger
	rng    *rand.Rand
	rngMu  sync.Mutex
	counts relayCounts

	killing     chan struct{} // closed by stopKilling
	killingOnce sync.Once
	failed      chan error // a relay process exited by itself: the run fails
	wg          sync.WaitGroup

	mu      sync.Mutex
	running map[string]*relayProcess
	stopped bool
	sparing bool // the first slot's kills wait (see spare)
}

// sparedSlot is the slot whose kills wait while the broker's fault is on (see spare).
const sparedSlot = "r1"

// spare holds back (on) or lets go (off) the kills of the first slot. On NATS the run spares it from shortly
// before the broker's fault until the broker is back, so at least one relay process lives through the whole outage
// and finds the broker unreachable: a publish to a NATS stream without a leader fails only when its acknowledgement
// times out (2 s), and with a kill every 1-3 s per slot every process running during a 3 s outage was sometimes
// killed before that, so the run could not show that the outage reached the relays. RabbitMQ refuses the
// connection at once, so no slot is spared there. The other slots' kills go on meanwhile, so kills during the
// outage are still tested. A kill that falls due while its slot is spared happens when the sparing ends.
func (r *relays) spare(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sparing = on
}

func (r *relays) spared(slot string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sparing && slot == sparedSlot
}

func newRelays(cfg Config, dbURL, schema, brokerURL string, logger *slog.Logger) *relays {
	level := "WARN"
	if logger.Enabled(context.Background(), slog.LevelDebug) {
		level = "DEBUG"
	} else if logger.Enabled(context.Background(), slog.LevelInfo) {
		level = "INFO"
	}
	return &relays{
		cfg: cfg,
		env: []string{envChild + "=relay", envDB + "=" + dbURL, envSchema + "=" + schema, envBroker + "=" + cfg.Broker,
			envURL + "=" + brokerURL,
			envReject + "=" + strconv.FormatFloat(cfg.RejectRate, 'g', -1, 64),
			envRetries + "=" + strconv.Itoa(cfg.MaxRetryCount), envLogLevel + "=" + level},
		logger:  logger,
		rng:     rand.New(rand.NewPCG(cfg.Seed, 1)),
		killing: make(chan struct{}),
		failed:  make(chan error, cfg.Relays),
		running: map[string]*relayProcess{},
	}
}

// start starts every slot and waits until each slot's first process is ready.
func (r *relays) start(ctx context.Context) error {
	firstReady := make(chan struct{}, r.cfg.Relays)
	for i := range r.cfg.Relays {
		slot := fmt.Sprintf("r%d", i+1)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.runSlot(ctx, slot, firstReady)
		}()
	}
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	for range r.cfg.Relays {
		select {
		case <-firstReady:
		case err := <-r.failed:
			return err
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-deadline.C:
			return errors.New("faultsuite: the relay processes were not ready within 60s")
		}
	}
	return nil
}

func (r *relays) randomKillDelay() time.Duration {
	r.rngMu.Lock()
	defer r.rngMu.Unlock()
	return r.cfg.KillMin + time.Duration(r.rng.Int64N(int64(r.cfg.KillMax-r.cfg.KillMin)+1))
}

func (r *relays) runSlot(ctx context.Context, slot string, firstReady chan<- struct{}) {
	first := true
	for {
		p, err := r.spawn(slot)
		if err != nil {
			r.failed <- err
			return
		}
		// The kill is timed from the process's readiness: a process killed while it is still starting (a race
		// binary on a loaded machine can take seconds) would test nothing, and the first process of each slot
		// must get to relay for the run to start at all.
		select {
		case <-p.ready:
			if first {
				firstReady <- struct{}{}
				first = false
			}
		case <-p.exited:
			if !r.isStopped() {
				r.failed <- fmt.Errorf("faultsuite: relay process %s exited by itself before it was ready (%v); "+
					"its last output:\n%s", slot, p.waitErr, p.stderr.String())
			}
			return
		case <-r.killing:
			r.waitOut(slot, p)
			return
		case <-ctx.Done():
			r.waitOut(slot, p)
			return
		}
		killAt := time.NewTimer(r.randomKillDelay())
		killed := false
	waiting:
		for {
			select {
			case <-killAt.C:
				if r.spared(slot) {
					killAt.Reset(50 * time.Millisecond) // the kill falls due again once the sparing ends
					continue
				}
				if err := r.kill(p); err != nil {
					r.failed <- fmt.Errorf("faultsuite: relay %s: %w", slot, err)
					return
				}
				killed = true
				break waiting
			case <-p.exited:
				killAt.Stop()
				if !r.isStopped() {
					r.failed <- fmt.Errorf("faultsuite: relay process %s exited by itself (%v); its last output:\n%s",
						slot, p.waitErr, p.stderr.String())
				}
				return
			case <-r.killing:
				killAt.Stop()
				break waiting
			case <-ctx.Done():
				killAt.Stop()
				break waiting
			}
		}
		if killed {
			continue // and start the next process at once
		}
		r.waitOut(slot, p)
		return
	}
}

// waitOut lets p relay until the run stops it (no more kills); it exiting before then fails the run.
func (r *relays) waitOut(slot string, p *relayProcess) {
	<-p.exited
	if !r.isStopped() {
		r.failed <- fmt.Errorf("faultsuite: relay process %s exited by itself (%v); its last output:\n%s",
			slot, p.waitErr, p.stderr.String())
	}
}

func (r *relays) isStopped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopped
}

// spawn starts a relay process for slot and the goroutines reading its output.
func (r *relays) spawn(slot string) (*relayProcess, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return nil, errors.New("faultsuite: relays stopped")
	}
	cmd := exec.Command(r.cfg.ChildCommand[0], r.cfg.ChildCommand[1:]...)
	cmd.Env = append(append(os.Environ(), r.env...), envSlot+"="+slot)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("faultsuite: relay %s: %w", slot, err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("faultsuite: relay %s: %w", slot, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("faultsuite: start relay %s: %w", slot, err)
	}
	p := &relayProcess{cmd: cmd, ready: make(chan struct{}), exited: make(chan struct{}),
		stderr: &tailBuffer{max: 4096}}
	r.running[slot] = p
	r.counts.mu.Lock()
	r.counts.starts++
	r.counts.mu.Unlock()
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		r.readReports(slot, p, stdout)
	}()
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			p.stderr.WriteLine(sc.Text())
			r.logger.Info("relay process: "+sc.Text(), "relay", slot, "pid", cmd.Process.Pid)
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	go func() {
		readers.Wait() // the pipes are read to their end before Wait closes them
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// readReports counts what a relay process reports (see relaychild.go for the lines).
func (r *relays) readReports(slot string, p *relayProcess, stdout io.Reader) {
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	readyOnce := sync.OnceFunc(func() { close(p.ready) })
	for sc.Scan() {
		line := sc.Text()
		word, rest, _ := strings.Cut(line, " ")
		c := &r.counts
		c.mu.Lock()
		switch word {
		case "ready":
			readyOnce()
		case "published":
			if n, err := strconv.ParseInt(rest, 10, 64); err == nil {
				p.published = n
			}
		case "reject":
			c.injectedRejections++
		case "unexpected":
			c.unexpected++
			c.sample(slot + ": rejected: " + rest)
		case "unreachable":
			c.unreachable++
		case "deadletter":
			c.deadLettered++
			c.sample(slot + ": dead-lettered: " + rest)
		default:
			r.logger.Info("relay process output: "+line, "relay", slot)
		}
		c.mu.Unlock()
	}
	_, _ = io.Copy(io.Discard, stdout)
}

// kill sends SIGKILL to p and waits for it to die. It fails if the process had already exited by itself.
func (r *relays) kill(p *relayProcess) error {
	select {
	case <-p.exited:
		return fmt.Errorf("the relay process exited by itself before its kill (%v); its last output:\n%s",
			p.waitErr, p.stderr.String())
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		return errors.New("the relay process did not die within 30s of SIGKILL")
	}
	var ws syscall.WaitStatus
	if st, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		ws = st
	}
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return fmt.Errorf("the relay process ended with %v, not by the SIGKILL; its last output:\n%s",
			p.cmd.ProcessState, p.stderr.String())
	}
	c := &r.counts
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kills++
	if p.published > 0 {
		c.killsMidWork++
	}
	c.lastKill = time.Now()
	return nil
}

// stopKilling ends the kills; the processes running now stay up.
func (r *relays) stopKilling() {
	r.killingOnce.Do(func() { close(r.killing) })
}

// stop ends every relay process: SIGTERM, then SIGKILL after 10 s; and waits for the slots. Safe to call twice.
func (r *relays) stop() {
	r.stopKilling()
	r.mu.Lock()
	r.stopped = true
	procs := make([]*relayProcess, 0, len(r.running))
	for _, p := range r.running {
		procs = append(procs, p)
	}
	r.mu.Unlock()
	for _, p := range procs {
		select {
		case <-p.exited:
			continue
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.exited
		}
	}
	r.wg.Wait()
}

// snapshot returns a copy of the counts.
func (r *relays) snapshot() relayCountsView {
	c := &r.counts
	c.mu.Lock()
	defer c.mu.Unlock()
	return relayCountsView{starts: c.starts, kills: c.kills, killsMidWork: c.killsMidWork, lastKill: c.lastKill,
		injectedRejections: c.injectedRejections, unexpected: c.unexpected, unreachable: c.unreachable,
		deadLettered: c.deadLettered, samples: append([]string(nil), c.samples...)}
}

type relayCountsView struct {
	starts, kills, killsMidWork                               int
	lastKill                                                  time.Time
	injectedRejections, unexpected, unreachable, deadLettered int64
	samples                                                   []string
}

// tailBuffer keeps the last max bytes of lines written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) WriteLine(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, s...)
	t.b = append(t.b, '\n')
	if len(t.b) > t.max {
		t.b = append([]byte(nil), t.b[len(t.b)-t.max:]...)
	}
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
