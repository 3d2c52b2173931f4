package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// InboxHandlerFailures are the failures of one inbox handler at one instant (Admin.InboxFailures).
type InboxHandlerFailures struct {
	// Handler is the handler's name.
	Handler string
	// Failing counts the messages the handler failed on and will retry (neither handled nor dead-lettered);
	// MaxAttempts is the most attempts one of them has had.
	Failing     int64
	MaxAttempts int
	// DeadLettered counts the handler's dead letters.
	DeadLettered int64
	// FailingSince is the first failure of the oldest failing message (zero when none fails), by the database's
	// records: how long the handler has been stuck on it, whichever process runs it and whenever it was looked at.
	FailingSince time.Time
	// LastFailureAt and LastError are the latest failure (a failed attempt or a dead letter).
	LastFailureAt time.Time
	LastError     string
}

// InboxFailures returns, by handler, the inbox failures of the scope: messages being retried and dead letters.
// Handlers without failures are not listed. It reads the attempts and dead-letter tables only (never the entries
// of handled messages), so a health probe can call it every few seconds.
func (a *Admin) InboxFailures(ctx context.Context) ([]InboxHandlerFailures, error) {
	if err := a.valid(); err != nil {
		return nil, err
	}
	q, err := statements.Expand("inbox_failures", nil, a.o.q.idents)
	if err != nil {
		return nil, fmt.Errorf("outbox: inbox failures: %w", err)
	}
	rows, err := a.o.pool.Query(ctx, q, a.tenant)
	if err != nil {
		return nil, fmt.Errorf("outbox: inbox failures: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (InboxHandlerFailures, error) {
		var f InboxHandlerFailures
		var since, last *time.Time
		if err := r.Scan(&f.Handler, &f.Failing, &f.DeadLettered, &f.MaxAttempts, &since, &last,
			&f.LastError); err != nil {
			return f, err
		}
		if since != nil {
			f.FailingSince = since.UTC()
		}
		if last != nil {
			f.LastFailureAt = last.UTC()
		}
		return f, nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: inbox failures: %w", err)
	}
	return out, nil
}
