package scalebench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Worker is a worker process started by a Fleet (see child.go for what it runs and reports).
type Worker struct {
	Slot  string
	Role  string
	cmd   *exec.Cmd
	stdin io.WriteCloser

	ready   chan struct{}
	exited  chan struct{}
	waitErr error

	mu     sync.Mutex
	count  int64
	parts  map[int]int64
	stderr []string // the last lines
}

// Count is the worker's last reported count.
func (w *Worker) Count() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.count
}

// Parts is the worker's last reported publishes per partition.
func (w *Worker) Parts() map[int]int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[int]int64, len(w.parts))
	for p, n := range w.parts {
		out[p] = n
	}
	return out
}

// Send writes a command line to the worker's standard input.
func (w *Worker) Send(line string) error {
	if _, err := io.WriteString(w.stdin, line+"\n"); err != nil {
		return fmt.Errorf("scalebench: %s %s: send %q: %w", w.Role, w.Slot, line, err)
	}
	return nil
}

// Ready is closed once the worker has said it runs.
func (w *Worker) Ready() <-chan struct{} { return w.ready }

// Exited is closed once the worker has exited.
func (w *Worker) Exited() <-chan struct{} { return w.exited }

func (w *Worker) lastOutput() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.stderr, "\n")
}

// Kill ends the worker with SIGKILL and waits for it.
func (w *Worker) Kill() {
	_ = w.cmd.Process.Signal(syscall.SIGKILL)
	<-w.exited
}

// Stop closes the worker's standard input (it stops gracefully, releasing its leases) and waits up to timeout
// before killing it.
func (w *Worker) Stop(timeout time.Duration) {
	_ = w.stdin.Close()
	select {
	case <-w.exited:
	case <-time.After(timeout):
		w.Kill()
	}
}

// Fleet starts worker processes, the test binary re-executed, and ends them all on Close.
type Fleet struct {
	// Command is the program and arguments of a worker process: the test binary, with arguments that run no test
	// (RunChildIfRequested takes over before any test runs).
	Command []string
	// Env is added to every worker's environment (database, schema, settings).
	Env []string

	mu      sync.Mutex
	workers []*Worker
}

// Start starts a worker process of role in slot, with extra environment entries.
func (f *Fleet) Start(role, slot string, env ...string) (*Worker, error) {
	cmd := exec.Command(f.Command[0], f.Command[1:]...)
	cmd.Env = append(append(append(os.Environ(), f.Env...), env...), envRole+"="+role, envSlot+"="+slot)
	// Its own process group, so a terminal's signals meant for the benchmark do not reach it; it ends when its
	// standard input does (Close, or this process dying).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("scalebench: %s %s: %w", role, slot, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("scalebench: %s %s: %w", role, slot, err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("scalebench: %s %s: %w", role, slot, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("scalebench: start %s %s: %w", role, slot, err)
	}
	w := &Worker{Slot: slot, Role: role, cmd: cmd, stdin: stdin, ready: make(chan struct{}),
		exited: make(chan struct{}), parts: map[int]int64{}}
	f.mu.Lock()
	f.workers = append(f.workers, w)
	f.mu.Unlock()
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		w.readReports(stdout)
	}()
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			w.mu.Lock()
			w.stderr = append(w.stderr, sc.Text())
			if len(w.stderr) > 20 {
				w.stderr = w.stderr[1:]
			}
			w.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	go func() {
		readers.Wait() // the pipes are read to their end before Wait closes them
		w.waitErr = cmd.Wait()
		close(w.exited)
	}()
	return w, nil
}

func (w *Worker) readReports(stdout io.Reader) {
	sc := bufio.NewScanner(stdout)
	readyOnce := sync.OnceFunc(func() { close(w.ready) })
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		w.mu.Lock()
		switch {
		case f[0] == "ready":
			readyOnce()
		case f[0] == "count" && len(f) == 2:
			if n, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				w.count = n
			}
		case f[0] == "part" && len(f) == 3:
			p, err1 := strconv.Atoi(f[1])
			n, err2 := strconv.ParseInt(f[2], 10, 64)
			if err1 == nil && err2 == nil {
				w.parts[p] = n
			}
		}
		w.mu.Unlock()
	}
	_, _ = io.Copy(io.Discard, stdout)
}

// WaitReady waits until every worker said it runs, failing when one exits first or timeout passes.
func WaitReady(timeout time.Duration, ws ...*Worker) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for _, w := range ws {
		select {
		case <-w.ready:
		case <-w.exited:
			return fmt.Errorf("scalebench: %s %s exited before it was ready (%v): %s", w.Role, w.Slot, w.waitErr,
				w.lastOutput())
		case <-deadline.C:
			return fmt.Errorf("scalebench: %s %s not ready within %s: %s", w.Role, w.Slot, timeout, w.lastOutput())
		}
	}
	return nil
}

// Failed returns an error when a worker that was not stopped or killed has exited.
func (f *Fleet) Failed(ws ...*Worker) error {
	var errs []error
	for _, w := range ws {
		select {
		case <-w.exited:
			errs = append(errs, fmt.Errorf("scalebench: %s %s exited (%v): %s", w.Role, w.Slot, w.waitErr,
				w.lastOutput()))
		default:
		}
	}
	return errors.Join(errs...)
}

// Close stops every worker still running: gracefully, then with SIGKILL after a few seconds.
func (f *Fleet) Close() {
	f.mu.Lock()
	ws := f.workers
	f.workers = nil
	f.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.Stop(10 * time.Second)
		}()
	}
	wg.Wait()
}
