package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Work is the leader's work, run while a lease is held. ctx is cancelled, with context.Cause matching ErrLost,
// as soon as the lease is lost or cannot be renewed in time; Work must then return promptly. Writes that must not
// happen after a takeover are guarded with CheckTx inside their transaction.
type Work func(ctx context.Context, l Lease) error

// Run keeps trying to acquire the lease name (every AcquireInterval), runs work while it is held, renews it in the
// background every RenewInterval, and releases it when work returns. When the lease is lost, work's context is
// cancelled and Run goes back to contending. Run returns nil when ctx ends, or work's error when work returns one
// for another reason than a lost lease or the end of ctx (the lease is released first). A nil return from work
// while ctx is still live also ends Run with nil.
func (m *Manager) Run(ctx context.Context, name string, work Work) error {
	for {
		l, ok, err := m.contend(ctx, name)
		if err != nil {
			return err
		}
		if ok {
			m.cfg.Logger.DebugContext(ctx, "stagehand: lease acquired", "lease", name, "owner", l.Owner,
				"token", l.Token)
			err := m.hold(ctx, l, work)
			switch {
			case ctx.Err() != nil:
				return nil
			case errors.Is(err, ErrLost):
				m.cfg.Logger.WarnContext(ctx, "stagehand: lease lost; contending again", "lease", name,
					"token", l.Token, "error", err)
				continue // try again at once: if nobody took it, we get it back with a new token
			default:
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(m.cfg.AcquireInterval):
		}
	}
}

// Once tries to acquire the lease name once and, when it is acquired, runs work under it as Run does: kept by
// Keep while work runs, released afterwards unless it was lost. It reports whether the lease was acquired, and the
// error of the acquisition or of work.
func (m *Manager) Once(ctx context.Context, name string, work Work) (acquired bool, err error) {
	l, ok, err := m.TryAcquire(ctx, name)
	if err != nil || !ok {
		return false, err
	}
	return true, m.hold(ctx, l, work)
}

// hold runs work under l, kept by Keep, and releases l afterwards. It returns an error matching ErrLost when the
// lease was lost while work ran.
func (m *Manager) hold(ctx context.Context, l Lease, work Work) error {
	wctx, stop := m.Keep(ctx, l)
	err := work(wctx, l)
	l = stop()
	if cause := context.Cause(wctx); errors.Is(cause, ErrLost) {
		if err == nil || errors.Is(err, context.Canceled) {
			return cause
		}
		return fmt.Errorf("%w (work ended with: %w)", cause, err)
	}
	if errors.Is(err, ErrLost) {
		return err
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer rcancel()
	if rerr := m.Release(rctx, l); rerr != nil {
		m.cfg.Logger.WarnContext(ctx, "stagehand: lease release failed; it expires by itself", "lease", l.Name,
			"error", rerr)
	}
	return err
}

// Keep renews l in the background every RenewInterval, for as long as work is done under it: the one renewal
// loop of every lease holder. The returned context is derived from ctx and is cancelled, with a cause matching
// ErrLost, when l changes hands or no renewal succeeded for a whole TTL (the database may have given the lease
// away meanwhile). stop ends the renewal, waits for it, and returns the lease as last renewed; call it once.
func (m *Manager) Keep(ctx context.Context, l Lease) (kept context.Context, stop func() Lease) {
	kctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	renewed := make(chan Lease, 1)
	go func() {
		renewed <- m.renew(kctx, l, done, cancel)
	}()
	return kctx, func() Lease {
		close(done)
		last := <-renewed
		cancel(nil)
		return last
	}
}

// renew renews l every RenewInterval until done closes or ctx ends, and returns the lease as last renewed. It
// cancels ctx with ErrLost when the lease changed hands, or when no renewal succeeded for a whole TTL.
func (m *Manager) renew(ctx context.Context, l Lease, done <-chan struct{}, cancel context.CancelCauseFunc) Lease {
	lastOK := time.Now() // monotonic: when the last successful renewal (or the acquisition) was sent
	t := time.NewTicker(m.cfg.RenewInterval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return l
		case <-ctx.Done():
			return l
		case <-t.C:
		}
		sent := time.Now()
		rctx, rcancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
		nl, err := m.Renew(rctx, l)
		rcancel()
		switch {
		case err == nil:
			l, lastOK = nl, sent
		case errors.Is(err, ErrLost):
			cancel(err)
			return l
		case ctx.Err() != nil:
			return l
		default:
			m.cfg.Logger.WarnContext(ctx, "stagehand: lease renewal failed", "lease", l.Name, "error", err)
			if time.Since(lastOK) >= m.cfg.TTL {
				cancel(fmt.Errorf("%w: %q could not be renewed for %s: %w", ErrLost, l.Name, m.cfg.TTL, err))
				return l
			}
		}
	}
}

// contend tries to acquire the lease name once. A failed attempt is logged and reported as not acquired, to be
// retried; only a configuration error (which no retry mends) is returned.
func (m *Manager) contend(ctx context.Context, name string) (Lease, bool, error) {
	l, ok, err := m.TryAcquire(ctx, name)
	if err == nil || ctx.Err() != nil {
		return l, ok, nil
	}
	if ce := (*ConfigError)(nil); errors.As(err, &ce) {
		return Lease{}, false, err
	}
	m.cfg.Logger.WarnContext(ctx, "stagehand: lease acquisition failed; retrying", "lease", name, "error", err)
	return Lease{}, false, nil
}
