package outbox

import (
	"context"
	"sync"
	"sync/atomic"
)

// A claim loop is the relay's machinery for one partition (the only one when the relay is not partitioned), for
// one leadership term when the relay is fenced. Its parts each keep their own state, in their own file:
//
//   - the claimer (relay_claim.go) claims due rows while there is room for them, and otherwise waits for a wake-up,
//     a poll or the next row falling due (then for ClaimInterval since its last claim); it also sweeps for missed
//     promotions;
//   - the rows in flight (relay_inflight.go) are every row leased here, grouped into units (an unordered row, or a
//     key's claimed run), queued for the workers;
//   - the workers (relay_deliver.go) deliver units row by row, in order within a unit;
//   - failures (relay_failure.go) record a rejected delivery (backoff or dead letter) or an unreachable broker
//     (release, and a pause);
//   - the marker (relay_mark.go) marks acknowledged rows sent, coalescing the acknowledgements of a burst into one
//     statement that also promotes the next message of the keys whose run ended;
//   - the promoter (relay_promote.go) keeps the keys whose promotion found their lock taken, for a retry;
//   - the pause (relay_pause.go) holds claims and deliveries back while the broker is unreachable;
//   - upkeep (relay_upkeep.go) renews the leases of the rows in flight, vacuums the outbox, and gives every row
//     back when the loop ends;
//   - the database side (relay_db.go) runs every statement, with the relay's settings and the term's fence.
type claimLoop struct {
	relay   *Relay
	cfg     *settings
	db      *relayDB
	topics  []string
	drain   bool            // a Drain: end when nothing is left
	listen  <-chan struct{} // wake-up notifications (nil: poll only)
	part    int             // partition number
	lo, hi  int32           // the partition's hash range (partitioned relays)
	deliver func(context.Context, *delivery) outcome
	sweeps  *sweepClock // shared by the loops of one group

	ctx    context.Context
	cancel context.CancelFunc

	flight  *inflight
	marks   *marker
	promos  *promoter
	pause   *brokerPause
	tally   tally
	moved   atomic.Int64  // rows marked since the last vacuum
	done    chan struct{} // closed when run has finished
	stopped chan struct{} // closed when the workers have finished: the marker marks what is left, then ends
}

// tally is what a claim loop did, for a drain's result.
type tally struct {
	mu       sync.Mutex
	result   DrainResult
	drainErr error
}

func (t *tally) add(f func(r *DrainResult)) {
	t.mu.Lock()
	f(&t.result)
	t.mu.Unlock()
}

// fail records the first error that ends a drain.
func (t *tally) fail(err error) {
	t.mu.Lock()
	if t.drainErr == nil {
		t.drainErr = err
	}
	t.mu.Unlock()
}

func (t *tally) get() (DrainResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.result, t.drainErr
}

// run runs the parts until the claimer ends (ctx ended, a drain is done, or the term was fenced out), then stops
// the workers, lets the marker mark what was acknowledged, and gives back what is still held.
func (loop *claimLoop) run() {
	defer close(loop.done)
	var workers, background sync.WaitGroup
	for range loop.cfg.MaxDegreeOfParallelism {
		workers.Go(loop.worker)
	}
	background.Go(loop.keepLeases)
	background.Go(loop.vacuumer)
	markerDone := make(chan struct{})
	go func() {
		defer close(markerDone)
		loop.markAcknowledged()
	}()
	loop.claimer()
	loop.cancel()
	workers.Wait()
	background.Wait()
	close(loop.stopped)
	<-markerDone
	loop.releaseAll()
}

// idle reports whether a drain has nothing left to do: no row held, none waiting for its mark, no key waiting
// for its promotion to be retried or being promoted.
func (loop *claimLoop) idle() bool {
	return loop.flight.empty() && loop.marks.idle() && !loop.promos.pending()
}
