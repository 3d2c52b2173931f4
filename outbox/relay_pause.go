package outbox

import (
	"context"
	"sync"
	"time"
)

// brokerPause holds a claim loop's claims and deliveries back while the broker is unreachable: each unreachable
// delivery pauses the loop for the current backoff, which then doubles (up to its cap) until a delivery gets through.
type brokerPause struct {
	mu      sync.Mutex
	until   time.Time
	backoff time.Duration // the next pause
	base    time.Duration
	grow    func(time.Duration) time.Duration
}

func newBrokerPause(base time.Duration, grow func(time.Duration) time.Duration) *brokerPause {
	return &brokerPause{backoff: base, base: base, grow: grow}
}

// wait waits out the pause, if any; false when ctx ended first.
func (p *brokerPause) wait(ctx context.Context) bool {
	for {
		p.mu.Lock()
		until := p.until
		p.mu.Unlock()
		d := time.Until(until)
		if d <= 0 {
			return true
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
}

// unreachable pauses for the current backoff, grows it, and returns the pause.
func (p *brokerPause) unreachable() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	pause := p.backoff
	p.backoff = p.grow(p.backoff)
	if until := time.Now().Add(pause); until.After(p.until) {
		p.until = until
	}
	return pause
}

// reachable resets the backoff: a delivery got through.
func (p *brokerPause) reachable() {
	p.mu.Lock()
	p.backoff = p.base
	p.mu.Unlock()
}
