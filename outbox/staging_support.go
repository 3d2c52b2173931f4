package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool returns the pool the outbox was created with (it is never closed by the outbox).
func (o *Outbox) Pool() *pgxpool.Pool { return o.pool }

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
