package faultsuite

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"github.com/stagehand-es/stagehand/aggregate"
)

// producers save the run's events through the repository (Transactional staging: the events and their messages
// commit together). Each producer owns Keys/Producers aggregates and saves 1-5 events at a time to one of them,
// picked at random, paced so that production takes Config.ProduceFor.
//
// A save that fails (PostgreSQL restarting) is retried after reloading the aggregate: if the failed save had in
// fact committed (its acknowledgement lost with the connection), the reload shows it and nothing is saved twice;
// otherwise the same events are raised again (event n of a stream is always Ticked{N: n}), so whatever had to be
// retried, the committed history is the one planned.
type producers struct {
	cfg     Config
	repo    *aggregate.Repository[*Counter]
	logger  *slog.Logger
	limiter *rate.Limiter

	saves   atomic.Int64
	retries atomic.Int64
	events  atomic.Int64 // events committed (as far as the producers know)
}

const maxEventsPerSave = 5

func newProducers(cfg Config, repo *aggregate.Repository[*Counter], logger *slog.Logger) *producers {
	perSecond := float64(cfg.Messages) / cfg.ProduceFor.Seconds()
	return &producers{cfg: cfg, repo: repo, logger: logger,
		limiter: rate.NewLimiter(rate.Limit(perSecond), maxEventsPerSave)}
}

// keyName is the ID of aggregate (and partition key) i.
func keyName(i int) string { return fmt.Sprintf("counter-%04d", i) }

// run saves every planned event and returns when all are committed, or on the first error that retrying within
// retryFor could not overcome.
func (p *producers) run(ctx context.Context, retryFor time.Duration) error {
	g, ctx := errgroup.WithContext(ctx)
	perKey := int64(p.cfg.Messages / p.cfg.Keys)
	for w := range p.cfg.Producers {
		rng := rand.New(rand.NewPCG(p.cfg.Seed, uint64(w)+100))
		g.Go(func() error {
			type owned struct {
				id      string
				counter *Counter
			}
			var keys []*owned
			for i := w; i < p.cfg.Keys; i += p.cfg.Producers {
				keys = append(keys, &owned{id: keyName(i)})
			}
			for len(keys) > 0 {
				i := rng.IntN(len(keys))
				k := keys[i]
				current := int64(0)
				if k.counter != nil {
					current = k.counter.Ticks
				}
				n := min(int64(1+rng.IntN(maxEventsPerSave)), perKey-current)
				if err := p.limiter.WaitN(ctx, int(n)); err != nil {
					return fmt.Errorf("faultsuite: producer %d: %w", w, err)
				}
				c, err := p.save(ctx, k.id, k.counter, current+n, retryFor)
				if err != nil {
					return err
				}
				k.counter = c
				if c.Ticks >= perKey {
					keys[i] = keys[len(keys)-1]
					keys = keys[:len(keys)-1]
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// save brings counter id (c, nil when not loaded yet) to target ticks, retrying failed saves for up to retryFor.
func (p *producers) save(ctx context.Context, id string, c *Counter, target int64, retryFor time.Duration) (
	*Counter, error) {
	if c == nil {
		c = p.repo.New(id)
	}
	giveUp := time.Now().Add(retryFor)
	for attempt := 0; ; attempt++ {
		before := c.Ticks
		c.TickTo(target)
		err := p.repo.Save(ctx, c)
		if err == nil {
			p.saves.Add(1)
			p.events.Add(target - before)
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("faultsuite: save %s: %w", id, context.Cause(ctx))
		}
		if time.Now().After(giveUp) {
			return nil, fmt.Errorf("faultsuite: save %s to %d ticks failed for %s: %w", id, target, retryFor, err)
		}
		p.retries.Add(1)
		p.logger.Debug("faultsuite: save failed; reloading and retrying", "counter", id, "attempt", attempt+1,
			"error", err)
		// Reload: the failed save may have committed. Retry the load itself while PostgreSQL is away.
		for {
			if err := sleep(ctx, time.Duration(50+rand.IntN(100))*time.Millisecond); err != nil {
				return nil, fmt.Errorf("faultsuite: save %s: %w", id, err)
			}
			loaded, err := p.repo.Load(ctx, id)
			if errors.Is(err, aggregate.ErrNotFound) {
				c = p.repo.New(id)
				break
			}
			if err == nil {
				c = loaded
				break
			}
			if time.Now().After(giveUp) {
				return nil, fmt.Errorf("faultsuite: reload %s failed for %s: %w", id, retryFor, err)
			}
		}
		if c.Ticks >= target { // the "failed" save had committed
			p.saves.Add(1)
			p.events.Add(target - before)
			return c, nil
		}
	}
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
