// Package pgtest starts throwaway PostgreSQL clusters for tests, benchmarks and examples, and hands each test an
// isolated schema.
//
// Order of preference: DATABASE_URL when set; else the local PostgreSQL binaries (pg_config --bindir, or initdb on
// PATH), started on a free 127.0.0.1 port with the socket in a temporary directory, as the postgres OS user when
// running as root (initdb refuses root). The cluster is removed when Stop is called and, through a watchdog
// process, when the process that started it dies. When neither is available the error says how to get PostgreSQL.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options configure a throwaway cluster.
type Options struct {
	// Durable keeps fsync, synchronous_commit and full_page_writes on, as in production. Benchmarks use it;
	// functional tests leave it off for speed. Default false.
	Durable bool
	// Settings are extra postgresql.conf lines (name -> value), applied after the defaults.
	Settings map[string]string
}

// Server is a throwaway PostgreSQL cluster.
type Server struct {
	url      string
	dir      string
	dataDir  string
	bindir   string
	port     int
	cred     *syscall.Credential
	stopOnce sync.Once
	stopErr  error
}

// ErrNoPostgres is returned when no PostgreSQL binaries are found and DATABASE_URL is unset.
var ErrNoPostgres = errors.New("pgtest: no PostgreSQL found: set DATABASE_URL to a server you own, " +
	"or install PostgreSQL 14+ (Debian/Ubuntu: apt-get install postgresql) so initdb and pg_ctl are available")

// Start initialises and starts a new cluster. It always starts a fresh cluster: it does not look at DATABASE_URL.
func Start(ctx context.Context, opts Options) (*Server, error) {
	bindir, err := findBindir()
	if err != nil {
		return nil, err
	}
	s := &Server{bindir: bindir}
	if os.Geteuid() == 0 {
		cred, err := postgresCredential()
		if err != nil {
			return nil, err
		}
		s.cred = cred
	}
	s.dir, err = os.MkdirTemp("", "stagehand-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: temp dir: %w", err)
	}
	if err := os.Chmod(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("pgtest: chmod: %w", err)
	}
	if s.cred != nil {
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			_ = os.RemoveAll(s.dir)
			return nil, fmt.Errorf("pgtest: chown %s: %w", s.dir, err)
		}
	}
	s.dataDir = filepath.Join(s.dir, "data")
	if err := s.run(ctx, "initdb", "-D", s.dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8",
		"--no-locale", "--no-sync"); err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, err
	}
	if err := s.startWatchdog(); err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		s.port, err = freePort()
		if err != nil {
			return nil, err
		}
		if err := s.writeConf(opts); err != nil {
			return nil, err
		}
		if lastErr = s.pgctl(ctx, "start"); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		_ = s.Stop()
		return nil, lastErr
	}
	s.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
	if err := s.waitReady(ctx); err != nil {
		_ = s.Stop()
		return nil, err
	}
	return s, nil
}

// URL is the connection string of the cluster's postgres database.
func (s *Server) URL() string { return s.url }

// Port is the TCP port the cluster listens on (127.0.0.1).
func (s *Server) Port() int { return s.port }

// DataDir is the cluster's data directory.
func (s *Server) DataDir() string { return s.dataDir }

// Restart restarts the cluster with pg_ctl restart -m fast, which disconnects every client. The port is kept.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.pgctl(ctx, "restart", "-m", "fast"); err != nil {
		return err
	}
	return s.waitReady(ctx)
}

// RestartImmediate restarts the cluster with pg_ctl restart -m immediate: every server process quits at once,
// without a checkpoint, and the server recovers from its write-ahead log on start, as after a crash. Commits
// acknowledged before it survive only with synchronous_commit on (Options.Settings; the default here is off).
// The port is kept.
func (s *Server) RestartImmediate(ctx context.Context) error {
	if err := s.pgctl(ctx, "restart", "-m", "immediate"); err != nil {
		return err
	}
	return s.waitReady(ctx)
}

// Stop stops the cluster and removes its files. It is safe to call more than once.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := os.Stat(filepath.Join(s.dataDir, "postmaster.pid")); err == nil {
			if err := s.pgctl(ctx, "stop", "-m", "immediate"); err != nil {
				s.stopErr = err
			}
		}
		if err := os.RemoveAll(s.dir); err != nil && s.stopErr == nil {
			s.stopErr = fmt.Errorf("pgtest: remove %s: %w", s.dir, err)
		}
	})
	return s.stopErr
}

func (s *Server) writeConf(opts Options) error {
	settings := map[string]string{
		"port":                      strconv.Itoa(s.port),
		"listen_addresses":          "'127.0.0.1'",
		"unix_socket_directories":   "'" + s.dir + "'",
		"max_connections":           "400",
		"shared_buffers":            "128MB",
		"max_locks_per_transaction": "256",
		// Prepared transactions: a transaction that has prepared can no longer be cancelled, which is how a test
		// makes PostgreSQL cancel a read under SERIALIZABLE instead.
		"max_prepared_transactions": "16",
		"log_min_messages":          "warning",
		"logging_collector":         "off",
	}
	if !opts.Durable {
		settings["fsync"] = "off"
		settings["synchronous_commit"] = "off"
		settings["full_page_writes"] = "off"
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	var b strings.Builder
	for k, v := range settings {
		fmt.Fprintf(&b, "%s = %s\n", k, v)
	}
	path := filepath.Join(s.dataDir, "postgresql.auto.conf")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("pgtest: write %s: %w", path, err)
	}
	if s.cred != nil {
		if err := os.Chown(path, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fmt.Errorf("pgtest: chown %s: %w", path, err)
		}
	}
	return nil
}

func (s *Server) pgctl(ctx context.Context, args ...string) error {
	full := append([]string{"-D", s.dataDir, "-w", "-t", "60", "-l", filepath.Join(s.dir, "server.log")}, args...)
	return s.run(ctx, "pg_ctl", full...)
}

// run executes a PostgreSQL binary as the postgres user when running as root, in its own session so terminal
// signals meant for the test process do not reach the server.
func (s *Server) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bindir, name), args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: s.cred}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	// pg_ctl start leaves the server holding inherited descriptors; do not wait for them.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
		return fmt.Errorf("pgtest: %s %s: %w\n%s\n%s", name, strings.Join(args, " "), err, out.String(), tail(log, 2000))
	}
	return nil
}

// startWatchdog starts a detached process that stops the cluster and removes its files once this process has
// died, so a test binary killed by a timeout leaves nothing behind.
func (s *Server) startWatchdog() error {
	script := fmt.Sprintf(`while [ -d /proc/%d ]; do sleep 1; done
if [ -f %q ]; then %q -D %q stop -m immediate >/dev/null 2>&1; fi
rm -rf %q`, os.Getpid(), filepath.Join(s.dataDir, "postmaster.pid"), filepath.Join(s.bindir, "pg_ctl"),
		s.dataDir, s.dir)
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: s.cred}
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgtest: start watchdog: %w", err)
	}
	// It outlives this process by design; nothing waits for it.
	_ = cmd.Process.Release()
	return nil
}

func (s *Server) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := pgx.Connect(ctx, s.url)
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("pgtest: server at %s not ready: %w", s.url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func findBindir() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) > 0 {
		return filepath.Dir(matches[len(matches)-1]), nil
	}
	return "", ErrNoPostgres
}

func postgresCredential() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root needs a 'postgres' OS user to run initdb (it refuses "+
			"root): %w; install PostgreSQL from your distribution, or set DATABASE_URL", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgtest: uid of postgres: %w", err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgtest: gid of postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
