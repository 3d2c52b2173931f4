package faultsuite

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stagehand-es/stagehand/proof/natsjs"
)

// A NATS server process: the test binary re-executed with envChild=nats, running one natsjs node until SIGTERM
// (or SIGKILL, which is the fault). Killing a process, not shutting down an in-process server, is what makes the
// fault a crash: an in-process Shutdown hands the stream's leadership over first (measured: no publish failed
// while a leader was shut down that way), a SIGKILL leaves the cluster without a leader until it elects one.

const envNATSNode = "STAGEHAND_FAULTSUITE_NATS_NODE" // name,port,dir,cluster,clusterPort,route,route,...

// natsNodeProcess is one server of the broker and the process running it now.
type natsNodeProcess struct {
	node    natsjs.Node
	command []string
	logger  *slog.Logger

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	tail   *tailBuffer
}

func (n *natsNodeProcess) env() string {
	parts := []string{n.node.Name, strconv.Itoa(n.node.Port), n.node.Dir, n.node.Cluster,
		strconv.Itoa(n.node.ClusterPort)}
	for _, r := range n.node.Routes {
		parts = append(parts, strconv.Itoa(r))
	}
	return strings.Join(parts, ",")
}

// start starts the node's process and waits until it accepts client connections.
func (n *natsNodeProcess) start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	cmd := exec.Command(n.command[0], n.command[1:]...)
	cmd.Env = append(os.Environ(), envChild+"=nats", envNATSNode+"="+n.env())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // terminal signals are the parent's
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("faultsuite: nats node %s: %w", n.node.Name, err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return fmt.Errorf("faultsuite: nats node %s: %w", n.node.Name, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("faultsuite: start nats node %s: %w", n.node.Name, err)
	}
	n.cmd, n.exited, n.tail = cmd, make(chan struct{}), &tailBuffer{max: 4096}
	ready := make(chan struct{})
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			n.tail.WriteLine(sc.Text())
			n.logger.Info("nats node: "+sc.Text(), "node", n.node.Name)
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	exited := n.exited
	go func() {
		readers.Wait()
		_ = cmd.Wait()
		close(exited)
	}()
	select {
	case <-ready:
		return nil
	case <-exited:
		return fmt.Errorf("faultsuite: nats node %s exited while starting; its last output:\n%s", n.node.Name,
			n.tail.String())
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("faultsuite: nats node %s was not ready within 2 minutes", n.node.Name)
	}
}

// kill kills the node's process with SIGKILL and waits for it.
func (n *natsNodeProcess) kill() { n.signal(syscall.SIGKILL) }

// stop ends the node's process with SIGTERM (SIGKILL after 10 s) and waits for it.
func (n *natsNodeProcess) stop() { n.signal(syscall.SIGTERM) }

func (n *natsNodeProcess) signal(sig syscall.Signal) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(sig)
	select {
	case <-n.exited:
	case <-time.After(10 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.exited
	}
}

// runNATSChild is the NATS server process: it runs the node described by envNATSNode until SIGTERM, or until its
// parent is gone.
func runNATSChild() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go exitWithParent(ctx, stop)
	parts := strings.Split(os.Getenv(envNATSNode), ",")
	if len(parts) < 5 {
		return fmt.Errorf("%s=%q: want name,port,dir,cluster,clusterPort[,route...]", envNATSNode,
			os.Getenv(envNATSNode))
	}
	atoi := func(s string) int { v, _ := strconv.Atoi(s); return v }
	node := natsjs.Node{Name: parts[0], Port: atoi(parts[1]), Dir: parts[2], Cluster: parts[3],
		ClusterPort: atoi(parts[4])}
	for _, r := range parts[5:] {
		node.Routes = append(node.Routes, atoi(r))
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := natsjs.StartNode(node, logger)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	<-ctx.Done()
	srv.Shutdown()
	srv.WaitForShutdown()
	if errors.Is(ctx.Err(), context.Canceled) {
		return nil
	}
	return ctx.Err()
}
