package scalebench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/internal/testkit/hoststat"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// StartServer starts a durable throwaway cluster (fsync, synchronous_commit and full_page_writes on) with
// pg_stat_statements loaded and planning tracked, and creates the extension.
//
// With STAGEHAND_SCALE_EXPLAIN set to a duration (say 20ms), auto_explain also logs the plan, with actual rows and
// buffers, of every statement that took longer, and the server's log is copied to the file named by
// STAGEHAND_SCALE_SERVER_LOG (default /tmp/scalebench-server.log) when the benchmark stops the cluster (Stop).
func StartServer(ctx context.Context) (*Server, error) {
	settings := map[string]string{
		"shared_preload_libraries":          "'pg_stat_statements'",
		"pg_stat_statements.track_planning": "on",
		"pg_stat_statements.max":            "2000",
		"track_io_timing":                   "on",
	}
	explain := os.Getenv("STAGEHAND_SCALE_EXPLAIN")
	if explain != "" {
		settings["shared_preload_libraries"] = "'pg_stat_statements,auto_explain'"
		settings["auto_explain.log_min_duration"] = "'" + explain + "'"
		settings["auto_explain.log_analyze"] = "on"
		settings["auto_explain.log_buffers"] = "on"
		settings["auto_explain.log_nested_statements"] = "on"
		settings["log_min_messages"] = "log"
	}
	srv, err := pgtest.Start(ctx, pgtest.Options{Durable: true, Settings: settings})
	if err != nil {
		return nil, fmt.Errorf("scalebench: start PostgreSQL: %w", err)
	}
	pool, err := pgxpool.New(ctx, srv.URL())
	if err != nil {
		_ = srv.Stop()
		return nil, fmt.Errorf("scalebench: connect: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		_ = srv.Stop()
		return nil, fmt.Errorf("scalebench: pg_stat_statements: %w", err)
	}
	return &Server{Server: srv, keepLog: explain != ""}, nil
}

// Server is the benchmarks' cluster.
type Server struct {
	*pgtest.Server
	keepLog bool
}

// Stop stops the cluster, first copying its log when STAGEHAND_SCALE_EXPLAIN asked for plans.
func (s *Server) Stop() error {
	if s.keepLog {
		dst := os.Getenv("STAGEHAND_SCALE_SERVER_LOG")
		if dst == "" {
			dst = "/tmp/scalebench-server.log"
		}
		if b, err := os.ReadFile(filepath.Join(filepath.Dir(s.DataDir()), "server.log")); err == nil {
			_ = os.WriteFile(dst, b, 0o644)
		}
	}
	return s.Server.Stop()
}

// clockTicks is the kernel's USER_HZ, the unit of /proc's CPU times (100 on every Linux this runs on).
const clockTicks = 100

// ServerCPU is the CPU time the cluster's processes have used so far: the postmaster's own and its reaped
// children's (backends that exited), plus every live child's (backends, background workers, the WAL writer,
// the checkpointer, autovacuum).
func ServerCPU(dataDir string) (time.Duration, error) {
	pidFile, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("scalebench: postmaster.pid: %w", err)
	}
	first, _, _ := strings.Cut(string(pidFile), "\n")
	pm, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, fmt.Errorf("scalebench: postmaster.pid: %w", err)
	}
	ticks := int64(0)
	own, err := procStat(pm)
	if err != nil {
		return 0, err
	}
	ticks += own.utime + own.stime + own.cutime + own.cstime
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("scalebench: /proc: %w", err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := procStat(pid)
		if err != nil || st.ppid != int64(pm) {
			continue // gone meanwhile, or not the cluster's
		}
		ticks += st.utime + st.stime
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

type stat struct{ ppid, utime, stime, cutime, cstime int64 }

func procStat(pid int) (stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return stat{}, fmt.Errorf("scalebench: /proc/%d/stat: %w", pid, err)
	}
	// The command name, in parentheses, may hold spaces: fields are counted after its closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return stat{}, fmt.Errorf("scalebench: /proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return stat{}, fmt.Errorf("scalebench: /proc/%d/stat: malformed", pid)
	}
	n := func(k int) int64 { v, _ := strconv.ParseInt(f[k], 10, 64); return v }
	// After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
	return stat{ppid: n(1), utime: n(11), stime: n(12), cutime: n(13), cstime: n(14)}, nil
}

// MachineCPU is the machine's busy (steal included) and total CPU time so far, summed over its cores (/proc/stat).
func MachineCPU() (busy, total time.Duration, err error) {
	c, err := hoststat.Read()
	if err != nil {
		return 0, 0, fmt.Errorf("scalebench: %w", err)
	}
	tick := time.Second / clockTicks
	return time.Duration(c.Total-c.Idle) * tick, time.Duration(c.Total) * tick, nil
}

// LoadAvg is /proc/loadavg's three load averages.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// Statement is one normalized statement's figures from pg_stat_statements.
type Statement struct {
	Query    string
	Calls    int64
	Rows     int64
	ExecMS   float64 // total_exec_time
	PlanMS   float64 // total_plan_time
	WALBytes int64
}

// TimeMS is the statement's total execution and planning time.
func (s Statement) TimeMS() float64 { return s.ExecMS + s.PlanMS }

// ResetStatements empties pg_stat_statements.
func ResetStatements(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		return fmt.Errorf("scalebench: reset pg_stat_statements: %w", err)
	}
	return nil
}

// Statements reads pg_stat_statements for the current database, costliest first, leaving out the benchmark's own
// bookkeeping (its polls of the tables, pg_stat_statements itself).
func Statements(ctx context.Context, pool *pgxpool.Pool) ([]Statement, error) {
	rows, err := pool.Query(ctx, `SELECT query, calls, rows, total_exec_time, total_plan_time, wal_bytes::bigint
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	if err != nil {
		return nil, fmt.Errorf("scalebench: read pg_stat_statements: %w", err)
	}
	defer rows.Close()
	var out []Statement
	for rows.Next() {
		var s Statement
		if err := rows.Scan(&s.Query, &s.Calls, &s.Rows, &s.ExecMS, &s.PlanMS, &s.WALBytes); err != nil {
			return nil, fmt.Errorf("scalebench: read pg_stat_statements: %w", err)
		}
		if strings.Contains(s.Query, "/* scalebench */") || strings.Contains(s.Query, "pg_stat_statements") {
			continue
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("scalebench: read pg_stat_statements: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TimeMS() > out[j].TimeMS() })
	return out, nil
}

// Totals sums statements' time and WAL.
func Totals(sts []Statement) (timeMS float64, wal int64, calls int64) {
	for _, s := range sts {
		timeMS += s.TimeMS()
		wal += s.WALBytes
		calls += s.Calls
	}
	return timeMS, wal, calls
}

// Window measures one timed stretch: elapsed time, the cluster's CPU, the machine's CPU and its load, and (with
// a pool) the WAL written, the transactions committed and the WAL flushes of the whole cluster.
type Window struct {
	dataDir               string
	pool                  *pgxpool.Pool
	start                 time.Time
	pg0, busy0, total0    time.Duration
	db0                   dbCounters
	LoadStart             string
	Elapsed               time.Duration
	ServerCPU             time.Duration
	MachineBusy, Machine  time.Duration
	LoadEnd               string
	WALBytes              int64 // pg_current_wal_lsn() moved by
	Commits               int64 // pg_stat_database.xact_commit, every database
	WALSyncs              int64 // pg_stat_wal.wal_sync: flushes of the WAL to disk
	serverErr, machineErr error
}

type dbCounters struct {
	lsn            string
	commits, syncs int64
	err            error
}

func readCounters(pool *pgxpool.Pool) dbCounters {
	var c dbCounters
	if pool == nil {
		return c
	}
	c.err = pool.QueryRow(context.Background(), `/* scalebench */ SELECT pg_current_wal_lsn()::text,
		(SELECT sum(xact_commit)::bigint FROM pg_stat_database), (SELECT wal_sync FROM pg_stat_wal)`).
		Scan(&c.lsn, &c.commits, &c.syncs)
	return c
}

// StartWindow begins a measurement of the cluster whose data directory is dataDir; pool, when not nil, also
// reads the WAL position and the commit and flush counters.
func StartWindow(dataDir string, pool *pgxpool.Pool) *Window {
	w := &Window{dataDir: dataDir, pool: pool, LoadStart: LoadAvg()}
	w.pg0, w.serverErr = ServerCPU(dataDir)
	w.busy0, w.total0, w.machineErr = MachineCPU()
	w.db0 = readCounters(pool)
	w.start = time.Now()
	return w
}

// End ends the window.
func (w *Window) End() error {
	w.Elapsed = time.Since(w.start)
	if w.pool != nil {
		c := readCounters(w.pool)
		if c.err == nil && w.db0.err == nil {
			w.Commits, w.WALSyncs = c.commits-w.db0.commits, c.syncs-w.db0.syncs
			c.err = w.pool.QueryRow(context.Background(), `/* scalebench */ SELECT pg_wal_lsn_diff($1, $2)::bigint`,
				c.lsn, w.db0.lsn).Scan(&w.WALBytes)
		}
		if c.err != nil || w.db0.err != nil {
			return fmt.Errorf("scalebench: database counters: %w", errors.Join(c.err, w.db0.err))
		}
	}
	pg, err := ServerCPU(w.dataDir)
	if w.serverErr == nil {
		w.serverErr = err
	}
	busy, total, err := MachineCPU()
	if w.machineErr == nil {
		w.machineErr = err
	}
	w.ServerCPU, w.MachineBusy, w.Machine = pg-w.pg0, busy-w.busy0, total-w.total0
	w.LoadEnd = LoadAvg()
	if w.serverErr != nil {
		return w.serverErr
	}
	return w.machineErr
}

// ServerCores is the cluster's CPU use in cores (1.0 = one core busy throughout).
func (w *Window) ServerCores() float64 { return w.ServerCPU.Seconds() / w.Elapsed.Seconds() }

// MachineBusyShare is the machine's CPU use as a share of all its cores.
func (w *Window) MachineBusyShare() float64 {
	if w.Machine <= 0 {
		return 0
	}
	return w.MachineBusy.Seconds() / w.Machine.Seconds()
}
