package histories

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// PgBouncer is a throwaway PgBouncer (Debian's pgbouncer package) in front of one PostgreSQL server, in transaction
// pooling mode unless told otherwise: a child process with its own configuration in a temporary directory, on a
// free port of 127.0.0.1, trusting every user of the server (auth_type trust). When this process runs as root it
// runs as the postgres user (PgBouncer refuses to run as root). When it exits on its own it is started again on
// the same port, as a service manager would (Crashes lists how it ended each time). Stop it when done; it is
// killed if this process dies first.
type PgBouncer struct {
	dir    string
	port   int
	url    string
	newCmd func() *exec.Cmd

	mu       sync.Mutex
	cmd      *exec.Cmd
	stopping bool
	crashes  []string
	done     chan struct{}
	output   strings.Builder
}

// PgBouncerOptions configure StartPgBouncer.
type PgBouncerOptions struct {
	// PoolMode is pool_mode: "transaction" (default), "session" or "statement".
	PoolMode string
	// MaxPreparedStatements is max_prepared_statements (PgBouncer 1.21 and later track protocol-level prepared
	// statements in transaction mode when it is above 0). Default 0: the setting is left out, for the versions
	// that do not know it.
	MaxPreparedStatements int
}

// PgBouncerBinary is where Debian's pgbouncer package installs the server.
const PgBouncerBinary = "/usr/sbin/pgbouncer"

// StartPgBouncer starts PgBouncer in front of the server of serverURL (a postgres:// URL) and waits until it
// accepts connections. Its URL is serverURL with the host and port replaced by PgBouncer's.
func StartPgBouncer(ctx context.Context, serverURL string, opts PgBouncerOptions) (*PgBouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat(PgBouncerBinary); serr != nil {
			return nil, fmt.Errorf("histories: pgbouncer is not installed (Debian's pgbouncer package; "+
				"scripts/test-deps installs it): %w", err)
		}
		bin = PgBouncerBinary
	}
	target, err := ServerAddr(serverURL)
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return nil, fmt.Errorf("histories: %w", err)
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return nil, fmt.Errorf("histories: %w", err)
	}
	userName := u.User.Username()
	if userName == "" {
		userName = "postgres"
	}
	mode := opts.PoolMode
	if mode == "" {
		mode = "transaction"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("histories: free port: %w", err)
	}
	listen := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	dir, err := os.MkdirTemp("", "stagehand-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("histories: %w", err)
	}
	b := &PgBouncer{dir: dir, port: listen, done: make(chan struct{})}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
max_client_conn = 500
default_pool_size = 20
ignore_startup_parameters = extra_float_digits,options
`, host, port, listen, filepath.Join(dir, "userlist.txt"), mode)
	if opts.MaxPreparedStatements > 0 {
		ini += fmt.Sprintf("max_prepared_statements = %d\n", opts.MaxPreparedStatements)
	}
	files := map[string]string{"pgbouncer.ini": ini, "userlist.txt": fmt.Sprintf("%q \"\"\n", userName)}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("histories: %w", err)
		}
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		if cred, err = postgresUser(); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("histories: %w", err)
		}
	}
	b.newCmd = func() *exec.Cmd {
		cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred}
		cmd.Stdout, cmd.Stderr = (*bouncerLog)(b), (*bouncerLog)(b)
		return cmd
	}
	cmd := b.newCmd()
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("histories: start pgbouncer: %w", err)
	}
	b.cmd = cmd
	go b.supervise(cmd)
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(listen))
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	b.url = u.String()
	if err := b.waitReady(ctx); err != nil {
		_ = b.Stop()
		return nil, err
	}
	return b, nil
}

// postgresUser is the postgres user's credential, for running PgBouncer when this process is root.
func postgresUser() (*syscall.Credential, error) {
	pu, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("histories: pgbouncer cannot run as root, and there is no postgres user: %w", err)
	}
	uid, err := strconv.ParseUint(pu.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("histories: %w", err)
	}
	gid, err := strconv.ParseUint(pu.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("histories: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// supervise waits for PgBouncer to exit, and starts it again unless Stop ended it.
func (b *PgBouncer) supervise(cmd *exec.Cmd) {
	for {
		_ = cmd.Wait()
		b.mu.Lock()
		if b.stopping {
			b.mu.Unlock()
			close(b.done)
			return
		}
		b.crashes = append(b.crashes, cmd.ProcessState.String())
		b.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		next := b.newCmd()
		if err := next.Start(); err != nil {
			b.mu.Lock()
			b.crashes = append(b.crashes, "could not start it again: "+err.Error())
			b.mu.Unlock()
			close(b.done)
			return
		}
		b.mu.Lock()
		b.cmd = next
		if b.stopping {
			_ = next.Process.Kill()
		}
		b.mu.Unlock()
		cmd = next
	}
}

// Crashes lists how PgBouncer ended each time it exited on its own (it was started again after each).
func (b *PgBouncer) Crashes() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.crashes)
}

type bouncerLog PgBouncer

func (l *bouncerLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.output.Len() < 1<<16 {
		l.output.Write(p)
	}
	return len(p), nil
}

// Output is what PgBouncer wrote so far (its first 64 KiB).
func (b *PgBouncer) Output() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.output.String()
}

func (b *PgBouncer) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := pgx.Connect(cctx, b.url)
		if err == nil {
			err = c.Ping(cctx)
			_ = c.Close(cctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-b.done:
			return fmt.Errorf("histories: pgbouncer exited: %s", b.Output())
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.Join(fmt.Errorf("histories: pgbouncer did not accept connections: %s", b.Output()), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URL is the postgres:// URL that connects through PgBouncer.
func (b *PgBouncer) URL() string { return b.url }

// Addr is PgBouncer's "127.0.0.1:port".
func (b *PgBouncer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// Stop stops PgBouncer and removes its directory. Safe to call twice.
func (b *PgBouncer) Stop() error {
	b.mu.Lock()
	b.stopping = true
	cmd := b.cmd
	b.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.done:
		case <-time.After(5 * time.Second):
			b.mu.Lock()
			_ = b.cmd.Process.Kill()
			b.mu.Unlock()
			<-b.done
		}
	}
	return os.RemoveAll(b.dir)
}
