package console

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/health"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/staging"
)

// The overview's rates and backlogs come from counters the database already keeps, so they count the work of every
// process: the log's head position (appended), the staging, publication and handling times the outbox, its sent
// ledger and the inbox record (staged, published, handled, failed), the outbox's pending rows, and the projections'
// and workers' checkpoints. A sample reads what was recorded since the previous one; the console keeps the last
// History of them in a ring, in memory.

// settle is how far behind the clock a sample's window ends: times are stamped by the writing processes before
// their transactions commit, so the last second or two is not complete yet.
const settle = 2 * time.Second

// latencyWindow is how far back the latency figures look.
const latencyWindow = 5 * time.Minute

// unknown marks a figure a sample could not have (a rate before the second sample, a lag the scope does not show).
const unknown = -1

// sample is one point of the charts.
type sample struct {
	At time.Time
	// Appended, Staged, Published, Handled and Failed are per second over the sample's window (unknown when not
	// known).
	Appended, Staged, Published, Handled, Failed float64
	// Pending and OldestAge are the outbox backlog at the window's end.
	Pending   int64
	OldestAge time.Duration
	// ProjectionLag and WorkerLag are the largest lag (log positions) of any projection checkpoint or staging
	// worker (unknown when there is none, or in a tenant's scope).
	ProjectionLag, WorkerLag int64
}

// latencyRow is one step of the pipeline's latency, over the messages of the last latencyWindow.
type latencyRow struct {
	Step          string
	N             int
	P50, P99, Max time.Duration
}

// sampler takes samples and keeps the last ones.
type sampler struct {
	c *Console

	take sync.Mutex // one sample at a time

	mu        sync.Mutex // guards what follows
	ring      []sample
	next      int
	count     int
	lastTo    time.Time
	lastHead  int64
	report    *health.Report
	inbox     *outbox.InboxStats
	latencies []latencyRow
	err       string // the last sampling error, "" after a success
	errAt     time.Time
}

func newSampler(c *Console) *sampler {
	n := int(c.cfg.History / c.cfg.SampleInterval)
	return &sampler{c: c, ring: make([]sample, max(n, 1))}
}

// Run samples every SampleInterval until ctx ends, then returns nil: the overview's charts then cover the last
// History whether anyone looks or not, and the health checker samples progress for its stall detection. Without
// Run, a sample is taken when a page needs one that is older than SampleInterval. Run starts no goroutine.
func (c *Console) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.SampleInterval)
	defer t.Stop()
	for {
		c.samples.sample(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// fresh takes a sample unless the latest is younger than the sample interval.
func (s *sampler) fresh(ctx context.Context) {
	if s.age() < s.c.cfg.SampleInterval*9/10 {
		return
	}
	s.take.Lock()
	defer s.take.Unlock()
	if s.age() < s.c.cfg.SampleInterval*9/10 {
		return // taken while this one waited
	}
	s.sampleLocked(ctx)
}

// age is how long ago the latest sample (or the latest failed attempt) was taken; a long time when none was.
func (s *sampler) age() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	last := s.errAt
	if s.count > 0 {
		if at := s.ring[(s.next+len(s.ring)-1)%len(s.ring)].At; at.After(last) {
			last = at
		}
	}
	if last.IsZero() {
		return time.Duration(1<<63 - 1)
	}
	return s.c.cfg.Clock().Sub(last)
}

func (s *sampler) sample(ctx context.Context) {
	s.take.Lock()
	defer s.take.Unlock()
	s.sampleLocked(ctx)
}

func (s *sampler) sampleLocked(ctx context.Context) {
	c := s.c
	now := c.cfg.Clock()
	to := now.Add(-settle)
	s.mu.Lock()
	from, lastHead := s.lastTo, s.lastHead
	s.mu.Unlock()
	first := from.IsZero()
	if first || to.Sub(from) > c.cfg.History {
		from = to.Add(-c.cfg.SampleInterval)
	}
	if !to.After(from) {
		return
	}
	fail := func(err error) {
		if ctx.Err() != nil {
			return // the request (or Run) ended: not the database's failure
		}
		c.cfg.Logger.WarnContext(ctx, "console: sampling failed", "error", err)
		s.mu.Lock()
		s.err, s.errAt = err.Error(), now
		s.mu.Unlock()
	}
	act, err := c.admin.Activity(ctx, from, to)
	if err != nil {
		fail(err)
		return
	}
	head, err := c.store.HeadPosition(ctx)
	if err != nil {
		fail(err)
		return
	}
	secs := to.Sub(from).Seconds()
	smp := sample{At: now, Appended: unknown, Staged: float64(act.Staged) / secs,
		Published: float64(act.Published) / secs, Handled: float64(act.Handled) / secs,
		Failed:  float64(act.DeadLettered+act.InboxDeadLettered+act.InboxFailures) / secs,
		Pending: act.Pending, ProjectionLag: unknown, WorkerLag: unknown}
	if !act.OldestPendingAt.IsZero() {
		smp.OldestAge = max(now.Sub(act.OldestPendingAt), 0)
	}
	if !first && head >= lastHead {
		appended := head - lastHead
		if c.cfg.Tenant != nil {
			appended, err = c.store.CountLog(ctx, eventstore.LogQuery{After: lastHead, Tenants: c.tenants}, head)
			if err != nil {
				fail(err)
				return
			}
		}
		smp.Appended = float64(appended) / secs
	}
	if c.cfg.Tenant == nil {
		sts, err := projection.ListStatus(ctx, c.cfg.Pool, c.store, c.cfg.Schema)
		if err != nil {
			fail(err)
			return
		}
		for _, st := range sts {
			smp.ProjectionLag = max(smp.ProjectionLag, st.Lag)
		}
		ws, err := staging.ListWorkerStatus(ctx, c.cfg.Pool, c.store, c.cfg.Schema)
		if err != nil {
			fail(err)
			return
		}
		for _, w := range ws {
			smp.WorkerLag = max(smp.WorkerLag, w.Lag)
		}
	}
	lat, err := s.measureLatency(ctx, now)
	if err != nil {
		fail(err)
		return
	}
	in, err := c.admin.InboxStats(ctx)
	if err != nil {
		fail(err)
		return
	}
	rep := c.checker.Check(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ring[s.next] = smp
	s.next = (s.next + 1) % len(s.ring)
	s.count = min(s.count+1, len(s.ring))
	s.lastTo, s.lastHead = to, head
	s.report, s.inbox, s.latencies, s.err, s.errAt = &rep, &in, lat, "", time.Time{}
}

// measureLatency reads the deliveries of the last latencyWindow and returns each step's percentiles.
func (s *sampler) measureLatency(ctx context.Context, now time.Time) ([]latencyRow, error) {
	c := s.c
	since := now.Add(-latencyWindow)
	pubs, err := c.admin.RecentlyPublished(ctx, since, 500)
	if err != nil {
		return nil, err
	}
	handled, err := c.admin.RecentlyHandled(ctx, since, 500)
	if err != nil {
		return nil, err
	}
	var positions []int64
	for _, list := range [][]outbox.Passage{pubs, handled} {
		for _, p := range list {
			if p.SourcePosition > 0 {
				positions = append(positions, p.SourcePosition)
			}
		}
	}
	slices.Sort(positions)
	recorded, err := c.store.RecordedAt(ctx, slices.Compact(positions))
	if err != nil {
		return nil, err
	}
	steps := []struct {
		name     string
		list     []outbox.Passage
		from, to func(outbox.Passage) (time.Time, bool)
	}{
		{"append → staged", pubs, appendedAt(recorded), stagedAt},
		{"staged → published", pubs, stagedAt, publishedAt},
		{"published → handled", handled, publishedAt, handledAt},
		{"append → published", pubs, appendedAt(recorded), publishedAt},
		{"append → handled", handled, appendedAt(recorded), handledAt},
	}
	out := make([]latencyRow, 0, len(steps))
	for _, st := range steps {
		var ds []time.Duration
		for _, p := range st.list {
			a, ok1 := st.from(p)
			b, ok2 := st.to(p)
			if ok1 && ok2 {
				ds = append(ds, max(b.Sub(a), 0))
			}
		}
		row := latencyRow{Step: st.name, N: len(ds)}
		if len(ds) > 0 {
			slices.Sort(ds)
			row.P50, row.P99, row.Max = ds[(len(ds)-1)/2], ds[(len(ds)*99+99)/100-1], ds[len(ds)-1]
		}
		out = append(out, row)
	}
	return out, nil
}

func appendedAt(recorded map[int64]time.Time) func(outbox.Passage) (time.Time, bool) {
	return func(p outbox.Passage) (time.Time, bool) {
		t, ok := recorded[p.SourcePosition]
		return t, ok
	}
}

func stagedAt(p outbox.Passage) (time.Time, bool)    { return p.StagedAt, !p.StagedAt.IsZero() }
func publishedAt(p outbox.Passage) (time.Time, bool) { return p.PublishedAt, !p.PublishedAt.IsZero() }
func handledAt(p outbox.Passage) (time.Time, bool)   { return p.HandledAt, !p.HandledAt.IsZero() }

// snapshot is what the latest samples hold.
type snapshot struct {
	// samples are the chart points, oldest first.
	samples []sample
	// report, inbox and latencies are the latest sample's (nil before the first).
	report    *health.Report
	inbox     *outbox.InboxStats
	latencies []latencyRow
	// err is the last sampling error ("" when the last sample succeeded).
	err string
}

func (s *sampler) snapshot() snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]sample, 0, s.count)
	for i := range s.count {
		out = append(out, s.ring[(s.next-s.count+i+len(s.ring))%len(s.ring)])
	}
	return snapshot{samples: out, report: s.report, inbox: s.inbox, latencies: slices.Clone(s.latencies), err: s.err}
}
