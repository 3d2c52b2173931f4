package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Watermarks are the log positions that components re-staging messages from the event log (a reconciler, a
// Deferred stager) have passed. Cleanup keeps every sent-ledger entry at or above the lowest of them, so an ID such
// a component could stage again is never forgotten. Their statements are in sql/watermarks.sql.

// Watermark is how far a component that re-stages messages from the event log has progressed.
type Watermark struct {
	Name      string
	Position  int64
	UpdatedAt time.Time
}

// RegisterWatermarkTx registers the watermark name at position on db (typically the transaction that stores the
// component's checkpoint) unless it is already registered. From then on cleanup keeps every sent-ledger entry at
// or above its position.
func (o *Outbox) RegisterWatermarkTx(ctx context.Context, db DB, name string, position int64) error {
	if name == "" {
		return invalidMessage("watermark name is empty")
	}
	if _, err := db.Exec(ctx, o.q.registerWatermark, name, position, o.now()); err != nil {
		return fmt.Errorf("outbox: register watermark %q: %w", name, err)
	}
	return nil
}

// AdvanceWatermarkTx moves the watermark name forward to position (never backward), registering it if needed,
// and returns its position afterwards. Call it in the transaction that advances the component's checkpoint.
func (o *Outbox) AdvanceWatermarkTx(ctx context.Context, db DB, name string, position int64) (int64, error) {
	if name == "" {
		return 0, invalidMessage("watermark name is empty")
	}
	var p int64
	if err := db.QueryRow(ctx, o.q.advanceWatermark, name, position, o.now()).Scan(&p); err != nil {
		return 0, fmt.Errorf("outbox: advance watermark %q: %w", name, err)
	}
	return p, nil
}

// AdvanceWatermark is AdvanceWatermarkTx in a transaction of its own.
func (o *Outbox) AdvanceWatermark(ctx context.Context, name string, position int64) (int64, error) {
	return o.AdvanceWatermarkTx(ctx, o.pool, name, position)
}

// RemoveWatermark unregisters a watermark, for a component that is retired for good.
func (o *Outbox) RemoveWatermark(ctx context.Context, name string) error {
	if _, err := o.pool.Exec(ctx, o.q.dropWatermark, name); err != nil {
		return fmt.Errorf("outbox: remove watermark %q: %w", name, err)
	}
	return nil
}

// Watermarks lists the registered watermarks.
func (o *Outbox) Watermarks(ctx context.Context) ([]Watermark, error) {
	rows, err := o.pool.Query(ctx, o.q.listWatermarks)
	if err != nil {
		return nil, fmt.Errorf("outbox: watermarks: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Watermark, error) {
		var w Watermark
		err := r.Scan(&w.Name, &w.Position, &w.UpdatedAt)
		return w, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: watermarks: %w", err)
	}
	return out, nil
}

// WatermarkTx returns the position of the watermark name and locks it (FOR SHARE) until db's transaction ends,
// so the component owning it cannot advance past a message being staged in that transaction, and cleanup keeps
// the message's ID. ok is false when no such watermark is registered.
func (o *Outbox) WatermarkTx(ctx context.Context, db DB, name string) (position int64, ok bool, err error) {
	err = db.QueryRow(ctx, o.q.watermarkForShare, name).Scan(&position)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("outbox: read watermark %q: %w", name, err)
	}
	return position, true, nil
}
