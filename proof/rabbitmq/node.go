package rabbitmq

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A throwaway RabbitMQ node: the local rabbitmq-server started as a child process with everything of its own (a
// temporary directory for its database, configuration and cookie, a node name, its AMQP, distribution and epmd
// ports on 127.0.0.1), so it never touches, nor depends on, a system service. It runs as the current user, root
// included.

// ServerScript is where Debian's rabbitmq-server package puts the server's start script (the one in /usr/sbin
// switches to the rabbitmq user first, which a throwaway node in a temporary directory does not want).
const ServerScript = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// Node is a running (or stopped, between Kill and Restart) throwaway RabbitMQ node.
type Node struct {
	dir      string
	name     string
	amqpPort int
	distPort int
	epmdPort int
	script   string
	logger   *slog.Logger

	mu     sync.Mutex
	epmd   *process
	server *process
}

// process is a child process and its output's last lines.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
	tail   *tail
}

// Start starts a node and waits until it accepts AMQP connections (at most two minutes: a node boots in 5-10 s
// on a quiet machine). logger receives the node's warnings and errors (nil: discarded). Stop it when done; should
// this process die first, a watchdog process kills the node and removes its directory.
//
// The node's ports are free when drawn, but another process may bind one before the node does; a node that fails
// to start is started again on other ports, three times at most.
func Start(ctx context.Context, logger *slog.Logger) (*Node, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	script, err := findServer()
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		n, err := start(ctx, script, logger)
		if err == nil || attempt == 3 || ctx.Err() != nil {
			return n, err
		}
		logger.Warn("rabbitmq: the node did not start; trying other ports", "attempt", attempt, "error", err)
	}
}

// start starts a node with the server script on ports drawn free.
func start(ctx context.Context, script string, logger *slog.Logger) (*Node, error) {
	dir, err := os.MkdirTemp("", "stagehand-rabbitmq-")
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: node directory: %w", err)
	}
	n := &Node{dir: dir, script: script, logger: logger,
		name: fmt.Sprintf("stagehand-%d-%x@localhost", os.Getpid(), rand.Uint32())}
	fail := func(err error) (*Node, error) {
		n.stopProcesses()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	for _, p := range []*int{&n.amqpPort, &n.distPort, &n.epmdPort} {
		if *p, err = freePort(); err != nil {
			return fail(err)
		}
	}
	if err := n.writeConfig(); err != nil {
		return fail(err)
	}
	if err := n.startWatchdog(); err != nil {
		return fail(err)
	}
	epmd, err := exec.LookPath("epmd")
	if err != nil {
		return fail(fmt.Errorf("rabbitmq: epmd (Erlang's port mapper, part of erlang-base) not found: %w", err))
	}
	// An epmd of the node's own: without one on ERL_EPMD_PORT, Erlang would start a daemon that outlives the node.
	if n.epmd, err = n.spawn("epmd", epmd, "-port", strconv.Itoa(n.epmdPort), "-address", "127.0.0.1"); err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "epmd.pgid"), []byte(strconv.Itoa(n.epmd.cmd.Process.Pid)),
		0o600); err != nil {
		return fail(fmt.Errorf("rabbitmq: %w", err))
	}
	if err := n.Restart(ctx); err != nil {
		return fail(err)
	}
	return n, nil
}

// findServer returns the server start script: Debian's, else rabbitmq-server on PATH (a generic Unix install).
func findServer() (string, error) {
	if _, err := os.Stat(ServerScript); err == nil {
		return ServerScript, nil
	}
	if p, err := exec.LookPath("rabbitmq-server"); err == nil && !strings.HasPrefix(p, "/usr/sbin/") {
		return p, nil
	}
	return "", errors.New("rabbitmq: no RabbitMQ server found at " + ServerScript + " or on PATH: install it " +
		"(Debian/Ubuntu: apt-get install rabbitmq-server; nothing needs to be running) or point the test at a " +
		"broker of your own")
}

// URL is the node's AMQP URL (the default guest user, which RabbitMQ admits from the loopback interface only); it
// stays the same across restarts.
func (n *Node) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.amqpPort) }

// Name is the Erlang node name.
func (n *Node) Name() string { return n.name }

func (n *Node) writeConfig() error {
	conf := fmt.Sprintf(`listeners.tcp.default = 127.0.0.1:%d
log.console = true
log.console.level = warning
log.console.use_colors = off
log.file = false
disk_free_limit.absolute = 10MB
`, n.amqpPort)
	for name, body := range map[string]string{"rabbitmq.conf": conf, "enabled_plugins": "[].\n"} {
		if err := os.WriteFile(filepath.Join(n.dir, name), []byte(body), 0o600); err != nil {
			return fmt.Errorf("rabbitmq: write %s: %w", name, err)
		}
	}
	return nil
}

// env is the server's environment: every path and port its own, and no system-wide environment file.
func (n *Node) env() []string {
	d := func(name string) string { return filepath.Join(n.dir, name) }
	return append(os.Environ(),
		"HOME="+n.dir, // the Erlang cookie
		"ERL_EPMD_PORT="+strconv.Itoa(n.epmdPort),
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_DIST_PORT="+strconv.Itoa(n.distPort),
		"RABBITMQ_MNESIA_BASE="+d("mnesia"),
		"RABBITMQ_LOG_BASE="+d("log"),
		"RABBITMQ_CONFIG_FILE="+d("rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+d("advanced.config"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+d("enabled_plugins"),
		"RABBITMQ_CONF_ENV_FILE="+d("rabbitmq-env.conf"), // absent: /etc/rabbitmq's is not read
		"RABBITMQ_PID_FILE="+d("rabbitmq.pid"),
	)
}

// Restart starts the server again (after Kill or Shutdown) on the same directory and ports, so durable queues and
// persistent messages are there again, and waits until it accepts AMQP connections.
func (n *Node) Restart(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.server != nil {
		select {
		case <-n.server.exited:
		default:
			return errors.New("rabbitmq: the node is already running")
		}
	}
	p, err := n.spawn("server", n.script)
	if err != nil {
		return err
	}
	n.server = p
	// The watchdog reads the process group to kill from here.
	if err := os.WriteFile(filepath.Join(n.dir, "server.pgid"), []byte(strconv.Itoa(p.cmd.Process.Pid)),
		0o600); err != nil {
		return fmt.Errorf("rabbitmq: %w", err)
	}
	return n.waitReady(ctx, p)
}

func (n *Node) waitReady(ctx context.Context, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		conn, err := amqp.DialConfig(n.URL(), amqp.Config{Dial: amqp.DefaultDial(time.Second)})
		if err == nil {
			_ = conn.Close()
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("rabbitmq: the node exited while starting (%v); its last output:\n%s", p.err,
				p.tail.String())
		case <-ctx.Done():
			return fmt.Errorf("rabbitmq: the node did not accept connections at %s: %w; its last output:\n%s",
				n.URL(), err, p.tail.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Kill kills the server with SIGKILL (its whole process group) and waits for it to die: a crash. Restart starts
// it again.
func (n *Node) Kill() error { return n.signal(syscall.SIGKILL) }

// Shutdown stops the server with SIGTERM, which RabbitMQ handles as a clean shutdown, and waits for it.
func (n *Node) Shutdown() error { return n.signal(syscall.SIGTERM) }

func (n *Node) signal(sig syscall.Signal) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.server == nil {
		return nil
	}
	select {
	case <-n.server.exited:
		return nil
	default:
	}
	if err := syscall.Kill(-n.server.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("rabbitmq: signal the node: %w", err)
	}
	select {
	case <-n.server.exited:
	case <-time.After(time.Minute):
		_ = syscall.Kill(-n.server.cmd.Process.Pid, syscall.SIGKILL)
		<-n.server.exited
	}
	// The server's helpers (erl_child_setup, inet_gethost) share its process group; a SIGKILL leaves none.
	_ = syscall.Kill(-n.server.cmd.Process.Pid, syscall.SIGKILL)
	return nil
}

// Stop shuts the node down, stops its epmd and removes its directory. Safe to call twice.
func (n *Node) Stop() error {
	err := n.Shutdown()
	n.stopProcesses()
	if rerr := os.RemoveAll(n.dir); rerr != nil {
		err = errors.Join(err, fmt.Errorf("rabbitmq: remove %s: %w", n.dir, rerr))
	}
	return err
}

func (n *Node) stopProcesses() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range []*process{n.server, n.epmd} {
		if p == nil {
			continue
		}
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

// spawn starts a child process in a process group of its own (so terminal signals meant for this process do not
// reach it, and a kill reaches its helpers) and forwards its output to the logger.
func (n *Node) spawn(what, path string, args ...string) (*process, error) {
	cmd := exec.Command(path, args...)
	cmd.Dir = n.dir
	cmd.Env = n.env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: %s: %w", what, err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("rabbitmq: start %s: %w", what, err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{}), tail: &tail{max: 8192}}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" {
				continue
			}
			p.tail.add(line)
			level := slog.LevelDebug
			if strings.Contains(line, "[warning]") || strings.Contains(line, "[error]") {
				level = slog.LevelWarn
			}
			n.logger.Log(context.Background(), level, "rabbitmq: "+line, "node", n.name, "process", what)
		}
		_, _ = io.Copy(io.Discard, out)
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// startWatchdog starts a detached process that kills the node and its epmd and removes the directory once this
// process has died, so a test binary killed by a timeout leaves nothing behind.
func (n *Node) startWatchdog() error {
	script := fmt.Sprintf(`while [ -d /proc/%d ]; do sleep 1; done
for f in %q %q; do [ -f "$f" ] && kill -9 -- -"$(cat "$f")" 2>/dev/null; done
rm -rf %q`, os.Getpid(), filepath.Join(n.dir, "server.pgid"), filepath.Join(n.dir, "epmd.pgid"), n.dir)
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("rabbitmq: start the watchdog: %w", err)
	}
	return cmd.Process.Release() // it outlives this process by design
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("rabbitmq: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tail keeps the last max bytes of lines.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(append(t.b, line...), '\n')
	if len(t.b) > t.max {
		t.b = append([]byte(nil), t.b[len(t.b)-t.max:]...)
	}
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
