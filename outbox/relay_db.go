package outbox

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/internal/lease"
	"github.com/stagehand-es/stagehand/internal/sqlfile"
)

// relayDB is a claim loop's side of the database: every statement it runs goes through exec, with the relay's
// settings, and every write it makes carries the term's fence (fenced) and is checked against it when it matched
// nothing (checkFence).
type relayDB struct {
	o      *Outbox
	st     *relayStatements
	owner  string       // the row lease owner of the term
	fence  *lease.Lease // the leader lease of the term; nil when unfenced
	demote atomic.Pointer[fenceLoss]
	logger *slog.Logger
	part   int
	end    context.CancelFunc // ends the term (when it is fenced out)
}

// exec sends b in one round trip and one implicit transaction, with the relay's settings (see
// queries.relaySettings), lets read read the results of b's statements in order (nil: none), and returns the
// first error.
func (db *relayDB) exec(ctx context.Context, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	all := &pgx.Batch{QueuedQueries: append([]*pgx.QueuedQuery{{SQL: db.o.q.relaySettings}}, b.QueuedQueries...)}
	res := db.o.pool.SendBatch(ctx, all)
	_, err := res.Exec()
	if err == nil && read != nil {
		err = read(res)
	}
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	return err
}

// args returns st's arguments from r, with the relay's owner and, when the term is fenced, its lease.
func (db *relayDB) args(st sqlfile.Named[relayRow], r *relayRow) []any {
	r.Owner = db.owner
	if db.fence != nil {
		r.FenceName, r.FenceOwner, r.FenceToken = db.fence.Name, db.fence.Owner, db.fence.Token
	}
	return st.Args(r)
}

// checkFence tells a fenced-out write from another reason for writing nothing: called when a fenced write matched
// no row. When the term is over it logs once, ends the term (the relay stops claiming and gives back what it
// holds; Run contends for the lease again) and returns a *FencedError.
func (db *relayDB) checkFence(ctx context.Context, op string) error {
	if db.fence == nil {
		return nil
	}
	if loss := db.demote.Load(); loss != nil {
		e := *loss.err
		e.Op = op
		return &e
	}
	err := lease.CheckTx(ctx, db.o.pool, db.o.schema, *db.fence)
	var fe *lease.FencedError
	if !errors.As(err, &fe) {
		return nil // still the leader (or the check itself failed): the rows were taken for another reason
	}
	loss := &fenceLoss{leaseErr: err, err: &FencedError{Op: op, Lease: fe.Name, Token: fe.Token,
		CurrentToken: fe.Current, Owner: fe.Owner, CurrentOwner: fe.CurrentOwner}}
	if db.demote.CompareAndSwap(nil, loss) {
		db.logger.Warn("stagehand: outbox relay was demoted; its late write was rejected and the rows are left "+
			"to the new leader", "error", loss.err, "partition", db.part)
		db.end()
	}
	return db.checkFence(ctx, op)
}

// written runs b, whose first statement is a fenced write of op, and reports how many rows it wrote; a write that
// matched nothing is checked against the fence (ErrFenced when the term is over). read, when given, reads the
// results of the statements after the first.
func (db *relayDB) written(ctx context.Context, op string, b *pgx.Batch, read func(pgx.BatchResults) error) (int64,
	error) {
	var n int64
	err := db.exec(ctx, b, func(res pgx.BatchResults) error {
		tag, err := res.Exec()
		if err != nil {
			return err
		}
		n = tag.RowsAffected()
		if read != nil {
			return read(res)
		}
		return nil
	})
	if err == nil && n == 0 {
		err = db.checkFence(ctx, op)
	}
	return n, err
}
