package scalebench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
)

// The measurements. Each starts its own durable cluster (fsync, synchronous_commit, full_page_writes on) with
// pg_stat_statements, so the cluster's CPU can be read from /proc:
//
//	go test ./scalebench -run '^$' -bench 'Scale' -benchtime 1x -timeout 60m
//	go test ./scalebench -run '^$' -bench 'Rebalance' -benchtime 1x -timeout 30m
//	go test ./scalebench -run '^$' -bench 'MessageCost' -benchtime 1x -timeout 30m
//
// STAGEHAND_SCALE_PROCS ("1,2,4"), STAGEHAND_SCALE_ROUNDS (3), STAGEHAND_SCALE_MESSAGES (40000: the relays'
// backlog per round) and STAGEHAND_SCALE_EVENTS (40000: the projections' log) change the sizes.

const partitions = 8

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func procCounts() []int {
	s := os.Getenv("STAGEHAND_SCALE_PROCS")
	if s == "" {
		return []int{1, 2, 4}
	}
	ns, err := parseInts(s)
	if err != nil || len(ns) == 0 {
		return []int{1, 2, 4}
	}
	return ns
}

// side is one side's figures for one process count, summed over its rounds.
type side struct {
	units     int64
	elapsed   time.Duration
	serverCPU time.Duration
	busy, all time.Duration // the machine's CPU
	dbTimeMS  float64       // pg_stat_statements: execution + planning
	wal       int64
	calls     int64
	walAll    int64 // the cluster's WAL, every statement and the checkpoints' page images included
	commits   int64
	syncs     int64                 // WAL flushes
	stmts     map[string]*Statement // by query, summed over rounds
	loads     []string
	spread    []string // how the partitions were spread over the processes
}

func (s *side) add(w *Window, units int64, sts []Statement) {
	s.units += units
	s.elapsed += w.Elapsed
	s.serverCPU += w.ServerCPU
	s.walAll += w.WALBytes
	s.commits += w.Commits
	s.syncs += w.WALSyncs
	s.busy += w.MachineBusy
	s.all += w.Machine
	t, wal, calls := Totals(sts)
	s.dbTimeMS += t
	s.wal += wal
	s.calls += calls
	if s.stmts == nil {
		s.stmts = map[string]*Statement{}
	}
	for _, st := range sts {
		if e, ok := s.stmts[st.Query]; ok {
			e.Calls += st.Calls
			e.Rows += st.Rows
			e.ExecMS += st.ExecMS
			e.PlanMS += st.PlanMS
			e.WALBytes += st.WALBytes
		} else {
			c := st
			s.stmts[st.Query] = &c
		}
	}
	s.loads = append(s.loads, w.LoadStart+" → "+w.LoadEnd)
}

func (s *side) rate() float64 { return float64(s.units) / s.elapsed.Seconds() }

// perUnit is the database's cost of one unit (message or event): statement time (µs), WAL (bytes), server CPU
// (µs).
func (s *side) perUnit() (timeUS, wal, cpuUS float64) {
	u := float64(s.units)
	return s.dbTimeMS * 1000 / u, float64(s.wal) / u, float64(s.serverCPU.Microseconds()) / u
}

func (s *side) per(n int64) float64 { return float64(n) / float64(s.units) }

func (s *side) cores() float64 { return s.serverCPU.Seconds() / s.elapsed.Seconds() }

func (s *side) machineBusy() float64 {
	if s.all == 0 {
		return 0
	}
	return s.busy.Seconds() / s.all.Seconds()
}

// breakdown prints the statements that cost most per unit.
func (s *side) breakdown(unit string, top int) string {
	var sts []*Statement
	for _, st := range s.stmts {
		sts = append(sts, st)
	}
	sort.Slice(sts, func(i, j int) bool { return sts[i].TimeMS() > sts[j].TimeMS() })
	var b strings.Builder
	u := float64(s.units)
	for i, st := range sts {
		if i == top {
			break
		}
		fmt.Fprintf(&b, "    %7.2f calls/%s %7.1f µs/%s (%5.1f%%) %7.0f WAL B/%s  %s\n", float64(st.Calls)/u, unit,
			st.TimeMS()*1000/u, unit, 100*st.TimeMS()/s.dbTimeMS, float64(st.WALBytes)/u, unit, oneLine(st.Query, 110))
	}
	return b.String()
}

func oneLine(q string, n int) string {
	q = strings.Join(strings.Fields(q), " ")
	if len(q) > n {
		q = q[:n] + "…"
	}
	return q
}

// row prints one table row: processes | stagehand | raw | ratio | db CPU | per-unit cost.
func row(kind string, procs int, unit string, sh, raw *side) string {
	t1, w1, c1 := sh.perUnit()
	t2, w2, c2 := raw.perUnit()
	return fmt.Sprintf("SCALE %s procs=%d: stagehand %.0f %s/s, raw %.0f, ratio %.2fx | db CPU %.2f / %.2f cores, "+
		"machine busy %.0f%% / %.0f%% | per %s: db time %.1f / %.1f µs, WAL %.0f / %.0f B, db CPU %.1f / %.1f µs "+
		"| cluster WAL %.0f / %.0f B, commits %.3f / %.3f, WAL flushes %.3f / %.3f | load %s / %s | spread %s",
		kind, procs, sh.rate(), unit, raw.rate(), sh.rate()/raw.rate(), sh.cores(), raw.cores(), 100*sh.machineBusy(),
		100*raw.machineBusy(), unit, t1, t2, w1, w2, c1, c2, sh.per(sh.walAll), raw.per(raw.walAll),
		sh.per(sh.commits), raw.per(raw.commits), sh.per(sh.syncs), raw.per(raw.syncs), strings.Join(sh.loads, ", "),
		strings.Join(raw.loads, ", "), strings.Join(sh.spread, " "))
}

// BenchmarkScale runs 1, 2 and 4 relay processes, then 1, 2 and 4 projection processes, against one
// PostgreSQL, each beside the hand-written ceiling run from as many processes, in alternating rounds.
func BenchmarkScale(b *testing.B) {
	ctx := context.Background()
	srv, err := StartServer(ctx)
	require.NoError(b, err)
	b.Cleanup(func() { _ = srv.Stop() })
	rounds := envInt("STAGEHAND_SCALE_ROUNDS", 3)
	b.Run("relays", func(b *testing.B) {
		r := newRig(b, rigConfig{url: srv.URL(), dataDir: srv.DataDir(), partitions: partitions, ttl: 5 * time.Second,
			batch: 100})
		n := envInt("STAGEHAND_SCALE_MESSAGES", 40000)
		keys, err := Keys(ctx, r.pool, partitions, 500) // 4,000 keys: 10 messages each per round
		require.NoError(b, err)
		flat := flatKeys(keys)
		var lines []string
		for _, procs := range procCounts() {
			sh, raw := &side{}, &side{}
			for round := range 2 * rounds {
				// Turns alternate sh, raw, raw, sh, ... so drift falls on both.
				if round%4 == 0 || round%4 == 3 {
					r.relayRound(sh, procs, fmt.Sprintf("sh%d-%d", procs, round), flat, n)
				} else {
					r.rawRelayRound(raw, procs, fmt.Sprintf("raw%d-%d", procs, round), flat, n)
				}
			}
			line := row("relays", procs, "msg", sh, raw)
			fmt.Println(line)
			fmt.Printf("  stagehand relay, costliest statements:\n%s", sh.breakdown("msg", 8))
			fmt.Printf("  raw relay:\n%s", raw.breakdown("msg", 4))
			lines = append(lines, line)
			b.ReportMetric(sh.rate(), fmt.Sprintf("p%d-msgs/s", procs))
			b.ReportMetric(sh.rate()/raw.rate(), fmt.Sprintf("p%d-ratio", procs))
		}
		fmt.Println(strings.Join(lines, "\n"))
	})
	b.Run("projections", func(b *testing.B) {
		r := newRig(b, rigConfig{url: srv.URL(), dataDir: srv.DataDir(), partitions: partitions, ttl: 5 * time.Second,
			batch: 1000})
		store, err := eventstore.NewPostgres(r.pool, &eventstore.PostgresConfig{Schema: r.schema})
		require.NoError(b, err)
		b.Cleanup(store.Close)
		events := envInt("STAGEHAND_SCALE_EVENTS", 40000)
		var lines []string
		for _, procs := range procCounts() {
			sh, raw := &side{}, &side{}
			for round := range 2 * rounds {
				if round%4 == 0 || round%4 == 3 {
					// One projection per side for every process count: each round catches up with the events
					// the other side's rounds appended (untimed), then applies its own.
					r.projectionRound(sh, store, procs, "rm", fmt.Sprintf("e%d-%d", procs, round), events)
				} else {
					r.rawProjectionRound(raw, store, procs, "raw", fmt.Sprintf("e%d-%d", procs, round), events)
				}
			}
			line := row("projections", procs, "event", sh, raw)
			fmt.Println(line)
			fmt.Printf("  stagehand projection, costliest statements:\n%s", sh.breakdown("event", 6))
			fmt.Printf("  raw projection:\n%s", raw.breakdown("event", 4))
			lines = append(lines, line)
			b.ReportMetric(sh.rate(), fmt.Sprintf("p%d-events/s", procs))
			b.ReportMetric(sh.rate()/raw.rate(), fmt.Sprintf("p%d-ratio", procs))
		}
		fmt.Println(strings.Join(lines, "\n"))
	})
}

// relayRound starts procs relay processes, waits until they lead their shares of the partitions, stages a
// backlog of n messages in one transaction and times its drain from the commit to an empty outbox.
func (r *rig) relayRound(s *side, procs int, round string, keys []string, n int) {
	r.tb.Helper()
	ctx := context.Background()
	ws := r.start("relay", "r", procs)
	r.evenly(60*time.Second, "", ws...)
	h, err := r.held(ctx, "")
	require.NoError(r.tb, err)
	s.spread = append(s.spread, spreadString(h, ws))
	require.NoError(r.tb, stageBacklogQuiet(ctx, r, round, keys, n))
	require.NoError(r.tb, ResetStatements(ctx, r.pool))
	maint0 := r.maintenance(ctx)
	w := StartWindow(r.dataDir, r.pool)
	r.ob.Notify()
	r.waitFor(10*time.Minute, "backlog drained", r.empty("outbox"), ws...)
	require.NoError(r.tb, w.End())
	sts, err := Statements(ctx, r.pool)
	require.NoError(r.tb, err)
	s.add(w, int64(n), sts)
	fmt.Printf("  round %s: %d relay processes, %.0f msgs/s, db CPU %.0f µs/msg, load %s, outbox vacuums and "+
		"analyzes during the round (auto/relay): %s\n", round, procs, float64(n)/w.Elapsed.Seconds(),
		float64(w.ServerCPU.Microseconds())/float64(n), w.LoadEnd, r.maintenance(ctx).since(maint0))
	for _, x := range ws {
		x.Stop(10 * time.Second)
	}
	r.exec("TRUNCATE " + r.q("outbox_sent"))
	r.exec("VACUUM " + r.q("outbox"))
}

// stageBacklogQuiet is stageBacklog without the wake-up: the round starts its clock first.
func stageBacklogQuiet(ctx context.Context, r *rig, round string, keys []string, n int) error {
	return stageBacklog(ctx, r.pool, r.ob, round, keys, n, false)
}

// rawRelayRound is relayRound for the hand-written ceiling: procs processes running the partitions' count of claim
// loops between them.
func (r *rig) rawRelayRound(s *side, procs int, round string, keys []string, n int) {
	r.tb.Helper()
	ctx := context.Background()
	ws := r.start("rawrelay", "w", procs)
	require.NoError(r.tb, ResetStatements(ctx, r.pool))
	// The raw loops poll every 10 ms and start on the insert's commit: the clock starts just before it.
	w := StartWindow(r.dataDir, r.pool)
	require.NoError(r.tb, rawBacklog(ctx, r.pool, r.schema, round, keys, n))
	r.waitFor(10*time.Minute, "raw backlog drained", r.empty("raw_outbox"), ws...)
	require.NoError(r.tb, w.End())
	sts, err := Statements(ctx, r.pool)
	require.NoError(r.tb, err)
	s.add(w, int64(n), withoutFill(sts))
	for _, x := range ws {
		x.Stop(10 * time.Second)
	}
	r.exec("TRUNCATE " + r.q("raw_sent"))
	r.exec("VACUUM " + r.q("raw_outbox"))
}

// withoutFill leaves out the statement that filled the raw outbox (it ran inside the window).
func withoutFill(sts []Statement) []Statement {
	var out []Statement
	for _, s := range sts {
		if !strings.Contains(s.Query, "unnest($1::text[], $2::text[])") {
			out = append(out, s)
		}
	}
	return out
}

func spreadString(h map[int]string, ws []*Worker) string {
	sp := spread(h)
	var parts []string
	for _, w := range ws {
		parts = append(parts, strconv.Itoa(sp[w.Slot]))
	}
	return strings.Join(parts, "/")
}

// projectionRound starts procs processes running the projection name (from its checkpoint), waits until they
// have caught up with the log and lead their shares of the partitions, appends events new events in one
// transaction (prefix names the streams) and times their application from the commit until the read model holds
// them all.
func (r *rig) projectionRound(s *side, store *eventstore.PostgresStore, procs int, name, prefix string, events int) {
	r.tb.Helper()
	ctx := context.Background()
	ws := r.start("projection", "p", procs)
	for _, x := range ws {
		require.NoError(r.tb, x.Send("go "+name))
	}
	head := r.logSize(ctx)
	r.waitFor(10*time.Minute, "projection caught up before the round", r.readModelHas(ctx, "read_model", head),
		ws...)
	r.evenly(2*time.Minute, name, ws...)
	h, err := r.held(ctx, name)
	require.NoError(r.tb, err)
	s.spread = append(s.spread, spreadString(h, ws))
	require.NoError(r.tb, appendLog(ctx, store, prefix, events/10, 10))
	require.NoError(r.tb, ResetStatements(ctx, r.pool))
	w := StartWindow(r.dataDir, r.pool)
	store.Notify()
	r.waitFor(10*time.Minute, "projection caught up", r.readModelHas(ctx, "read_model", head+int64(events)), ws...)
	require.NoError(r.tb, w.End())
	sts, err := Statements(ctx, r.pool)
	require.NoError(r.tb, err)
	s.add(w, int64(events), sts)
	for _, x := range ws {
		x.Stop(10 * time.Second)
	}
}

// rawProjectionRound is projectionRound for the hand-written ceiling: the same partitions dealt out to procs
// processes.
func (r *rig) rawProjectionRound(s *side, store *eventstore.PostgresStore, procs int, name, prefix string,
	events int) {
	r.tb.Helper()
	ctx := context.Background()
	r.exec("INSERT INTO "+r.q("raw_checkpoints")+" (name, part) SELECT $1, p FROM generate_series(0, $2 - 1) p "+
		"ON CONFLICT DO NOTHING", name, r.partitions)
	ws := r.start("rawproj", "q", procs)
	for _, x := range ws {
		require.NoError(r.tb, x.Send("go "+name))
	}
	head := r.logSize(ctx)
	r.waitFor(10*time.Minute, "raw projection caught up before the round",
		r.readModelHas(ctx, "raw_read_model", head), ws...)
	require.NoError(r.tb, appendLog(ctx, store, prefix, events/10, 10))
	require.NoError(r.tb, ResetStatements(ctx, r.pool))
	w := StartWindow(r.dataDir, r.pool) // the raw followers poll every 10 ms; no wake-up
	r.waitFor(10*time.Minute, "raw projection caught up",
		r.readModelHas(ctx, "raw_read_model", head+int64(events)), ws...)
	require.NoError(r.tb, w.End())
	sts, err := Statements(ctx, r.pool)
	require.NoError(r.tb, err)
	s.add(w, int64(events), sts)
	for _, x := range ws {
		x.Stop(10 * time.Second)
	}
}

// logSize is the number of events in the log.
func (r *rig) logSize(ctx context.Context) int64 {
	var n int64
	require.NoError(r.tb, r.pool.QueryRow(ctx, `/* scalebench */ SELECT count(*) FROM `+r.q("events")).Scan(&n))
	return n
}

func (r *rig) readModelHas(ctx context.Context, table string, events int64) func() (bool, error) {
	q := `/* scalebench */ SELECT coalesce(sum(events), 0)::bigint FROM ` + r.q(table)
	return func() (bool, error) {
		var n int64
		err := r.pool.QueryRow(ctx, q).Scan(&n)
		return n >= events, err
	}
}

// maintenanceCounts are the outbox table's vacuum and analyze counters.
type maintenanceCounts struct{ autoVacuum, autoAnalyze, vacuum, analyze int64 }

func (r *rig) maintenance(ctx context.Context) maintenanceCounts {
	var m maintenanceCounts
	require.NoError(r.tb, r.pool.QueryRow(ctx, `/* scalebench */ SELECT autovacuum_count, autoanalyze_count,
		vacuum_count, analyze_count FROM pg_stat_user_tables WHERE relid = $1::regclass`, r.q("outbox")).
		Scan(&m.autoVacuum, &m.autoAnalyze, &m.vacuum, &m.analyze))
	return m
}

func (m maintenanceCounts) since(o maintenanceCounts) string {
	return fmt.Sprintf("autovacuum %d, autoanalyze %d, vacuum %d, analyze %d", m.autoVacuum-o.autoVacuum,
		m.autoAnalyze-o.autoAnalyze, m.vacuum-o.vacuum, m.analyze-o.analyze)
}
