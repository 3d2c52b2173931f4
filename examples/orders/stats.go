package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/outbox"
)

// stats counts what this process sees of the messages of its own run, at the broker (published) and in the
// consumers (handled, suppressed as duplicates, failed), and the append → handled latency of each message type.
// Messages of other runs (left in a shared database or broker by an interrupted run) are handled but only counted
// apart.
type stats struct {
	run string

	mu             sync.Mutex
	publishedIDs   map[string]struct{}
	publishedTotal int64
	duplicatesSent int64
	handled        map[string]int64 // by handler name
	suppressed     int64
	failed         int64
	deadLettered   int64
	otherRuns      int64
	latency        map[string][]time.Duration // by message type
}

func newStats(run string) *stats {
	s := &stats{}
	s.restart(run)
	return s
}

// restart counts from zero for run: what the counters held (a warm-up's) is forgotten, and the earlier run's
// messages count as other runs' from now on.
func (s *stats) restart(run string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.run, s.publishedIDs, s.handled, s.latency = run, map[string]struct{}{}, map[string]int64{},
		map[string][]time.Duration{}
	s.publishedTotal, s.duplicatesSent, s.suppressed, s.failed, s.deadLettered, s.otherRuns = 0, 0, 0, 0, 0, 0
}

// ours reports whether msg is about an order of this run (see orderID). The caller holds s.mu.
func (s *stats) ours(msg *message.Message) bool {
	return strings.HasPrefix(msg.Metadata.Get(HeaderOrderID), "order-"+s.run+"-")
}

// published records a message the broker stored; again marks a deliberate second copy.
func (s *stats) published(msg *message.Message, again bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ours(msg) {
		return
	}
	s.publishedTotal++
	s.publishedIDs[msg.UUID] = struct{}{}
	if again {
		s.duplicatesSent++
	}
}

// delivery is what one delivery of a message did inside the inbox: whether the handler ran, and succeeded.
type delivery struct{ ran, ok bool }

type deliveryKey struct{}

// consumer wraps handler h behind the inbox for a Watermill router, and counts each delivery's outcome:
//
//   - the handler ran and the inbox committed: handled (its effects and the messages it staged are in the
//     database, once);
//   - the inbox found the (message ID, handler) pair already recorded and skipped the handler: a duplicate
//     suppressed;
//   - the handler failed and the inbox nacked the message after its retry delay: it comes again;
//   - the handler failed for good (outbox.Permanent, or its attempts used up): the inbox dead-lettered it.
//
// after, when set, runs after each message handled.
func (s *stats) consumer(inbox *outbox.Inbox, name string, h outbox.HandlerFunc,
	after func()) message.NoPublishHandlerFunc {
	handle := inbox.Handler(name, func(ctx context.Context, tx pgx.Tx, out *outbox.Publisher,
		msg *message.Message) error {
		d, _ := ctx.Value(deliveryKey{}).(*delivery)
		err := h(ctx, tx, out, msg)
		if d != nil {
			d.ran, d.ok = true, err == nil
		}
		return err
	})
	return func(msg *message.Message) error {
		d := &delivery{}
		msg.SetContext(context.WithValue(msg.Context(), deliveryKey{}, d))
		err := handle(msg)
		handledAt := time.Now()
		s.mu.Lock()
		defer s.mu.Unlock()
		switch {
		case !s.ours(msg):
			s.otherRuns++
		case err != nil || nacked(msg):
			s.failed++
		case !d.ran:
			s.suppressed++
		case !d.ok:
			s.deadLettered++
		default:
			s.handled[name]++
			if at, perr := time.Parse(time.RFC3339Nano, msg.Metadata.Get(stagehand.HeaderOccurredAt)); perr == nil {
				typ := msg.Metadata.Get(stagehand.HeaderMessageType)
				s.latency[typ] = append(s.latency[typ], handledAt.Sub(at))
			}
		}
		if err == nil && !nacked(msg) && d.ran && d.ok && after != nil {
			after()
		}
		return err
	}
}

// snapshot is a consistent copy of the counters.
type snapshot struct {
	publishedTotal, publishedUnique, duplicatesSent int64
	handled                                         map[string]int64
	handledTotal                                    int64
	suppressed, failed, deadLettered, otherRuns     int64
	latency                                         map[string][]time.Duration
}

func (s *stats) snapshot() snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := snapshot{
		publishedTotal: s.publishedTotal, publishedUnique: int64(len(s.publishedIDs)),
		duplicatesSent: s.duplicatesSent, handled: map[string]int64{}, suppressed: s.suppressed,
		failed: s.failed, deadLettered: s.deadLettered, otherRuns: s.otherRuns,
		latency: map[string][]time.Duration{},
	}
	for k, v := range s.handled {
		snap.handled[k] = v
		snap.handledTotal += v
	}
	for k, v := range s.latency {
		snap.latency[k] = slices.Clone(v)
	}
	return snap
}

// progress is the counters the wait loop watches (a cheaper snapshot, without the latencies).
func (s *stats) progress() (handled, suppressed, deadLettered, published int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.handled {
		handled += n
	}
	return handled, s.suppressed, s.deadLettered, s.publishedTotal
}

// percentiles returns the 50th and 99th percentiles of ds (sorted in place).
func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	slices.Sort(ds)
	at := func(p int) time.Duration { return ds[min(len(ds)-1, len(ds)*p/100)] }
	return at(50), at(99)
}

// ms renders a duration in milliseconds with one decimal.
func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

// bar is a progress bar drawn only when out is a terminal; every method is a no-op on a nil bar.
type bar struct {
	pb  *progressbar.ProgressBar
	out io.Writer
}

// newBar returns a bar of total steps, or nil when out is not a terminal. With a unit ("orders"), it shows the
// rate and the time left.
func newBar(out io.Writer, total int, description, unit string) *bar {
	f, ok := out.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(out),
		progressbar.OptionSetDescription(description),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowCount(),
		progressbar.OptionThrottle(100 * time.Millisecond),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionSetPredictTime(unit != ""),
	}
	if unit != "" {
		opts = append(opts, progressbar.OptionShowIts(), progressbar.OptionSetItsString(unit))
	}
	return &bar{out: out, pb: progressbar.NewOptions(max(total, 1), opts...)}
}

// set moves the bar to done.
func (b *bar) set(done int64) {
	if b != nil {
		_ = b.pb.Set64(min(done, b.pb.GetMax64()))
	}
}

// finish ends the bar's line (filled or not).
func (b *bar) finish() {
	if b != nil {
		_ = b.pb.Exit()
		fmt.Fprintln(b.out)
	}
}

// nacked reports whether the inbox nacked msg for a redelivery (it does so itself after a failed attempt, and
// returns nil).
func nacked(msg *message.Message) bool {
	select {
	case <-msg.Nacked():
		return true
	default:
		return false
	}
}
