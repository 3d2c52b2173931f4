package console

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/health"
	"github.com/stagehand-es/stagehand/outbox"
)

// The overview's rates and the charts' history come from what the database already records, so they count the work
// of every process: the log's head position (appended), and the staging, publication, dead-lettering and handling
// times the outbox, its sent ledger, the dead letters and the inbox record. A sample counts the rows recorded since
// the previous one (its window), through the tables' time indexes, so its cost follows the traffic of the window,
// never the size of the tables; the backlogs come from the health check the sample runs. The console keeps the last
// History of samples in memory for the overview, and writes the counts, per bucket of ten seconds, by topic and by
// inbox handler, to its chart history (console_samples), which the charts page reads: the history survives a
// restart, and a restarted console counts the buckets it missed (up to catchUp) from the tables' timestamps.

// settle is how far behind the clock a sample's window ends: times are stamped by the writing processes before
// their transactions commit, so the last second or two is not complete yet.
const settle = 2 * time.Second

// bucketWidth is the resolution of the chart history.
const bucketWidth = 10 * time.Second

// catchUp is how far back a console resumes counting the buckets nobody wrote (after a restart, or while no console
// ran).
const catchUp = time.Hour

// latencyWindow is how far back the latency figures look, latencyCap how many messages of each kind they read, and
// latencyEvery how often they are read.
const (
	latencyWindow = 5 * time.Minute
	latencyCap    = 500
	latencyEvery  = 15 * time.Second
)

// watching is how long after the last page or API request the console counts as looked at: Run samples every
// SampleInterval while it is, every IdleSampleInterval otherwise.
const watching = 2 * time.Minute

// expireEvery is how often the sampler deletes chart history older than Retention, expireBatch how many rows per
// statement, expireBatches how many statements at most per pass.
const (
	expireEvery   = time.Hour
	expireBatch   = 5000
	expireBatches = 20
)

// unknown marks a figure a sample could not have (a rate before the second sample, a lag the scope does not show).
const unknown = -1

// sample is one point of the overview's charts.
type sample struct {
	At time.Time
	// Appended, Staged, Published, Handled and Failed are per second over the sample's window (unknown when not
	// known).
	Appended, Staged, Published, Handled, Failed float64
	// Pending and OldestAge are the outbox backlog at the window's end (unknown when the health check has no
	// outbox).
	Pending   int64
	OldestAge time.Duration
	// ProjectionLag and WorkerLag are the largest lag (log positions) of any projection checkpoint or staging
	// worker (unknown when there is none, or in a tenant's scope).
	ProjectionLag, WorkerLag int64
}

// latencyRow is one step of the pipeline's latency.
type latencyRow struct {
	Step          string
	N             int
	P50, P99, Max time.Duration
}

// latencyCover says what the latency figures cover: the messages published (and handled) between From and To, how
// many, and whether the cap cut them (then they are the latest Cap of the window, not all of it).
type latencyCover struct {
	Published, Handled int
	From, To           time.Time
	Capped             bool
	Cap                int
	Window             time.Duration
}

// counts are what one bucket (or one window) recorded for a topic, a handler, or the whole scope.
type counts struct {
	Appended, Staged, Published, DeadLettered, Handled, InboxDeadLettered, InboxFailed int64
}

func (c *counts) add(o counts) {
	c.Appended += o.Appended
	c.Staged += o.Staged
	c.Published += o.Published
	c.DeadLettered += o.DeadLettered
	c.Handled += o.Handled
	c.InboxDeadLettered += o.InboxDeadLettered
	c.InboxFailed += o.InboxFailed
}

// seriesKey names one line of the chart history: kind "all", "topic" or "handler", and the topic's or handler's
// name.
type seriesKey struct{ Kind, Name string }

// bucket is a bucket of the chart history being counted.
type bucket struct {
	counts map[seriesKey]*counts
	// appendedKnown says whether the head moved was measured for it (not for buckets counted after the fact).
	appendedKnown bool
}

// gauges are the backlogs a sample saw.
type gauges struct {
	Pending, OldestPendingMS, DeadLetters, InboxDeadLetters, ProjectionLag, WorkerLag *int64
}

// sampler takes samples and keeps the last ones.
type sampler struct {
	c *Console

	take sync.Mutex // one sample at a time
	// lastView is when a page or an API request last came (unix nanoseconds).
	lastView atomic.Int64

	// Owned by the sample being taken (under take).
	buckets   map[time.Time]*bucket
	expiredAt time.Time
	latencyAt time.Time

	mu        sync.Mutex // guards what follows
	ring      []sample
	next      int
	count     int
	lastTo    time.Time
	lastHead  int64
	report    *health.Report
	latencies []latencyRow
	cover     latencyCover
	err       string // the last sampling error, "" after a success
	errAt     time.Time
}

func newSampler(c *Console) *sampler {
	n := int(c.cfg.History / c.cfg.SampleInterval)
	return &sampler{c: c, ring: make([]sample, max(n, 1)), buckets: map[time.Time]*bucket{}}
}

// viewed records that someone looks at the console.
func (s *sampler) viewed() { s.lastView.Store(s.c.cfg.Clock().UnixNano()) }

// watched reports whether someone looked at the console in the last two minutes.
func (s *sampler) watched() bool {
	v := s.lastView.Load()
	return v != 0 && s.c.cfg.Clock().Sub(time.Unix(0, v)) < watching
}

// Run samples until ctx ends, then returns nil: every SampleInterval while someone looks at the console (a page or
// an API request in the last two minutes), every IdleSampleInterval otherwise. The overview's charts then cover the
// time nobody looked, the chart history is written as it happens, and the health checker samples progress for its
// stall detection. Without Run, a sample is taken when a page needs one that is older than SampleInterval, and the
// chart history's missed buckets (up to an hour) are counted then. Run starts no goroutine.
func (c *Console) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.SampleInterval)
	defer t.Stop()
	for {
		if c.samples.watched() || c.samples.age() >= c.cfg.IdleSampleInterval*9/10 {
			c.samples.sample(ctx)
		}
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

// scopeKey is the chart history's scope column: "" for every tenant (a tenant's ID is never empty), else the
// tenant.
func (c *Console) scopeKey() string {
	if c.cfg.Tenant == nil {
		return ""
	}
	return *c.cfg.Tenant
}

// tenantArg is the tenant argument of the sampler's statements (nil: every tenant).
func (c *Console) tenantArg() any {
	if c.cfg.Tenant == nil {
		return nil
	}
	return *c.cfg.Tenant
}

func (s *sampler) sampleLocked(ctx context.Context) {
	c := s.c
	now := c.cfg.Clock()
	to := now.Add(-settle)
	s.mu.Lock()
	from, lastHead := s.lastTo, s.lastHead
	s.mu.Unlock()
	first := from.IsZero()
	fail := func(err error) {
		if ctx.Err() != nil {
			return // the request (or Run) ended: not the database's failure
		}
		c.cfg.Logger.WarnContext(ctx, "console: sampling failed", "error", err)
		s.mu.Lock()
		s.err, s.errAt = err.Error(), now
		s.mu.Unlock()
	}
	if first || to.Sub(from) > catchUp {
		// Resume where the chart history ends (the buckets nobody counted since), up to catchUp back; without any,
		// from the start of the current bucket.
		from = to.Add(-c.cfg.SampleInterval).Truncate(bucketWidth)
		var last *time.Time
		if err := c.cfg.Pool.QueryRow(ctx, c.q.sampleLast, c.scopeKey(), to.Add(-catchUp)).Scan(&last); err != nil {
			fail(fmt.Errorf("console: read the chart history: %w", err))
			return
		}
		if last != nil && last.Before(from) {
			from = last.UTC()
		}
		clear(s.buckets)
	}
	if !to.After(from) {
		return
	}
	win, err := s.countWindow(ctx, from, to)
	if err != nil {
		fail(err)
		return
	}
	head, err := c.store.HeadPosition(ctx)
	if err != nil {
		fail(err)
		return
	}
	rep := c.checker.Check(ctx)
	secs := to.Sub(from).Seconds()
	tot := win[seriesKey{Kind: "all"}]
	smp := sample{At: now, Appended: unknown, Staged: float64(tot.Staged) / secs,
		Published: float64(tot.Published) / secs, Handled: float64(tot.Handled) / secs,
		Failed:  float64(tot.DeadLettered+tot.InboxDeadLettered+tot.InboxFailed) / secs,
		Pending: unknown, ProjectionLag: unknown, WorkerLag: unknown}
	g := gaugesOf(&rep)
	if g.Pending != nil {
		smp.Pending, smp.OldestAge = *g.Pending, time.Duration(*g.OldestPendingMS)*time.Millisecond
	}
	if g.ProjectionLag != nil {
		smp.ProjectionLag = *g.ProjectionLag
	}
	if g.WorkerLag != nil {
		smp.WorkerLag = *g.WorkerLag
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
		b := s.bucket(to.Add(-time.Nanosecond).Truncate(bucketWidth))
		b.appendedKnown = true
		b.total().Appended += appended
	}
	if err := s.persist(ctx, to, g); err != nil {
		fail(err) // the buckets stay, to be written by the next sample
		return
	}
	s.expire(ctx, now)
	var lat []latencyRow
	var cover latencyCover
	measured := now.Sub(s.latencyAt) >= latencyEvery
	if measured {
		if lat, cover, err = s.measureLatency(ctx, now); err != nil {
			fail(err)
			return
		}
		s.latencyAt = now
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ring[s.next] = smp
	s.next = (s.next + 1) % len(s.ring)
	s.count = min(s.count+1, len(s.ring))
	s.lastTo, s.lastHead = to, head
	s.report, s.err, s.errAt = &rep, "", time.Time{}
	if measured {
		s.latencies, s.cover = lat, cover
	}
}

func (b *bucket) total() *counts {
	k := seriesKey{Kind: "all"}
	if b.counts[k] == nil {
		b.counts[k] = &counts{}
	}
	return b.counts[k]
}

func (s *sampler) bucket(at time.Time) *bucket {
	b := s.buckets[at]
	if b == nil {
		b = &bucket{counts: map[seriesKey]*counts{}}
		s.buckets[at] = b
	}
	return b
}

// countWindow counts what was recorded in [from, to), adds it to the buckets being counted, and returns the
// window's counts by series (the whole scope under kind "all").
func (s *sampler) countWindow(ctx context.Context, from, to time.Time) (map[seriesKey]counts, error) {
	c := s.c
	// Planned with the window's own bounds (no cached generic plan), so the time indexes' selectivity is known.
	rows, err := c.cfg.Pool.Query(ctx, c.q.sampleWindow, pgx.QueryExecModeExec, from, to,
		fmt.Sprintf("%d seconds", int(bucketWidth/time.Second)), c.tenantArg())
	if err != nil {
		return nil, fmt.Errorf("console: count the sample window: %w", err)
	}
	out := map[seriesKey]counts{}
	var kind, name string
	var at time.Time
	var n counts
	_, err = pgx.ForEachRow(rows, []any{&kind, &at, &name, &n.Staged, &n.Published, &n.DeadLettered, &n.Handled,
		&n.InboxDeadLettered, &n.InboxFailed}, func() error {
		b := s.bucket(at.UTC())
		k := seriesKey{Kind: kind, Name: name}
		if b.counts[k] == nil {
			b.counts[k] = &counts{}
		}
		b.counts[k].add(n)
		b.total().add(n)
		w := out[k]
		w.add(n)
		out[k] = w
		all := out[seriesKey{Kind: "all"}]
		all.add(n)
		out[seriesKey{Kind: "all"}] = all
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("console: count the sample window: %w", err)
	}
	// Every bucket of the window is counted, even an empty one: it is written as a zero.
	for b := from.Truncate(bucketWidth); b.Before(to); b = b.Add(bucketWidth) {
		s.bucket(b).total()
	}
	return out, nil
}

// gaugesOf reads the backlogs out of a health report.
func gaugesOf(rep *health.Report) gauges {
	var g gauges
	for _, comp := range rep.Components {
		switch {
		case comp.Outbox != nil:
			p, o, d := comp.Outbox.Pending, time.Duration(comp.Outbox.OldestPendingAge).Milliseconds(),
				comp.Outbox.DeadLettered
			g.Pending, g.OldestPendingMS, g.DeadLetters = &p, &o, &d
		case comp.Inbox != nil:
			d := comp.Inbox.DeadLettered
			g.InboxDeadLetters = &d
		case comp.Follower != nil:
			lag := comp.Follower.Lag
			target := &g.WorkerLag
			if strings.HasPrefix(comp.Name, "projection:") {
				target = &g.ProjectionLag
			}
			if *target == nil || **target < lag {
				*target = &lag
			}
		}
	}
	return g
}

// persist writes the buckets that ended at or before to, the latest with the backlogs g, in one batch.
func (s *sampler) persist(ctx context.Context, to time.Time, g gauges) error {
	c := s.c
	var done []time.Time
	for at := range s.buckets {
		if !at.Add(bucketWidth).After(to) {
			done = append(done, at)
		}
	}
	if len(done) == 0 {
		return nil
	}
	slices.SortFunc(done, func(a, b time.Time) int { return a.Compare(b) })
	latest := done[len(done)-1]
	live := to.Sub(latest.Add(bucketWidth)) < max(c.cfg.SampleInterval, bucketWidth) // its end was just seen
	batch := &pgx.Batch{}
	scope := c.scopeKey()
	secs := int(bucketWidth / time.Second)
	for _, at := range done {
		b := s.buckets[at]
		for k, n := range b.counts {
			var appended any
			if k.Kind == "all" && b.appendedKnown {
				appended = n.Appended
			}
			args := []any{scope, k.Kind, k.Name, at, secs, appended, n.Staged, n.Published, n.DeadLettered,
				n.Handled, n.InboxDeadLettered, n.InboxFailed, nil, nil, nil, nil, nil, nil}
			if k.Kind == "handler" {
				args[6], args[7], args[8] = nil, nil, nil
			} else if k.Kind == "topic" {
				args[9], args[10], args[11] = nil, nil, nil
			}
			if k.Kind == "all" && at.Equal(latest) && live {
				args[12], args[13], args[14], args[15], args[16], args[17] = g.Pending, g.OldestPendingMS,
					g.DeadLetters, g.InboxDeadLetters, g.ProjectionLag, g.WorkerLag
			}
			batch.Queue(c.q.sampleInsert, args...)
		}
	}
	if err := c.cfg.Pool.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("console: write the chart history: %w", err)
	}
	for _, at := range done {
		delete(s.buckets, at)
	}
	return nil
}

// expire deletes chart history older than Retention, at most once an hour, in a few bounded batches.
func (s *sampler) expire(ctx context.Context, now time.Time) {
	if now.Sub(s.expiredAt) < expireEvery {
		return
	}
	s.expiredAt = now
	cutoff := now.Add(-s.c.cfg.Retention)
	for range expireBatches {
		tag, err := s.c.cfg.Pool.Exec(ctx, s.c.q.sampleExpire, cutoff, expireBatch)
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				s.c.cfg.Logger.WarnContext(ctx, "console: expiring the chart history failed", "error", err)
			}
			return
		}
		if tag.RowsAffected() < expireBatch {
			return
		}
	}
}

// measureLatency reads the latest deliveries of the last latencyWindow (at most latencyCap publications and
// latencyCap handlings) and returns each step's percentiles and what they cover.
func (s *sampler) measureLatency(ctx context.Context, now time.Time) ([]latencyRow, latencyCover, error) {
	c := s.c
	since := now.Add(-latencyWindow)
	cover := latencyCover{Cap: latencyCap, Window: latencyWindow}
	pubs, err := c.admin.RecentlyPublished(ctx, since, latencyCap)
	if err != nil {
		return nil, cover, err
	}
	handled, err := c.admin.RecentlyHandled(ctx, since, latencyCap)
	if err != nil {
		return nil, cover, err
	}
	cover.Published, cover.Handled = len(pubs), len(handled)
	cover.Capped = len(pubs) == latencyCap || len(handled) == latencyCap
	var positions []int64
	for _, list := range [][]outbox.Passage{pubs, handled} {
		for _, p := range list {
			if p.SourcePosition > 0 {
				positions = append(positions, p.SourcePosition)
			}
			t := p.PublishedAt
			if !p.HandledAt.IsZero() {
				t = p.HandledAt
			}
			if cover.From.IsZero() || t.Before(cover.From) {
				cover.From = t
			}
			if t.After(cover.To) {
				cover.To = t
			}
		}
	}
	slices.Sort(positions)
	recorded, err := c.store.RecordedAt(ctx, slices.Compact(positions))
	if err != nil {
		return nil, cover, err
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
	return out, cover, nil
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
	// report and latencies are the latest sample's (nil before the first); cover says what latencies cover.
	report    *health.Report
	latencies []latencyRow
	cover     latencyCover
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
	return snapshot{samples: out, report: s.report, latencies: slices.Clone(s.latencies), cover: s.cover,
		err: s.err}
}
