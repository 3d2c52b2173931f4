package health

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stagehand-es/stagehand/outbox"
)

// rateBuckets is how many slices the failure window is cut into: the window slides by a thirtieth of itself.
const rateBuckets = 30

// rateWindow counts relay deliveries and failures over a sliding window, fed by the relay hooks. The hooks run on
// the relay's goroutines, so recording is a short critical section and never blocks on I/O.
type rateWindow struct {
	width     time.Duration
	hooked    atomic.Bool
	published atomic.Int64 // publications ever seen, the relay's progress between checks

	mu           sync.Mutex
	buckets      [rateBuckets]bucket
	lastDelivery time.Time
	lastError    string
	claimError   string
}

type bucket struct {
	slot            int64 // the time slice it counts (time / width); stale when older than the window
	total, failures int64
}

func newRateWindow(window time.Duration) *rateWindow {
	return &rateWindow{width: max(window/rateBuckets, time.Nanosecond)}
}

func (w *rateWindow) slot(now time.Time) int64 { return now.UnixNano() / int64(w.width) }

func (w *rateWindow) delivered(now time.Time, o outbox.Outcome, err error) {
	if o == outbox.Released { // given back unanswered at shutdown: no verdict on the broker
		return
	}
	failed := o == outbox.Rejected || o == outbox.Unreachable
	if o == outbox.Published {
		w.published.Add(1)
	}
	s := w.slot(now)
	w.mu.Lock()
	defer w.mu.Unlock()
	b := &w.buckets[s%rateBuckets]
	if b.slot != s {
		*b = bucket{slot: s}
	}
	b.total++
	if failed {
		b.failures++
		if err != nil {
			w.lastError = err.Error()
		} else {
			w.lastError = o.String()
		}
	}
	if now.After(w.lastDelivery) {
		w.lastDelivery = now
	}
}

func (w *rateWindow) claimed(err error) {
	if errors.Is(err, context.Canceled) { // the relay is closing: no verdict on the database
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.claimError = err.Error()
	} else {
		w.claimError = ""
	}
}

type rateSnapshot struct {
	total, failures       int64
	lastDelivery          time.Time
	lastError, claimError string
}

// snapshot sums the buckets still inside the window ending at now.
func (w *rateWindow) snapshot(now time.Time) rateSnapshot {
	cur := w.slot(now)
	w.mu.Lock()
	defer w.mu.Unlock()
	s := rateSnapshot{lastDelivery: w.lastDelivery, lastError: w.lastError, claimError: w.claimError}
	for _, b := range w.buckets {
		if b.slot > cur-rateBuckets && b.slot <= cur {
			s.total += b.total
			s.failures += b.failures
		}
	}
	return s
}
