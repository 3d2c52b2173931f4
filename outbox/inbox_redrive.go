package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/jsonmeta"
)

// Metadata of a redriven inbox dead letter (see Admin.RedriveInboxMatching).
const (
	// HeaderInboxRedriveOf carries the ID of the dead-lettered message a redriven copy stands for: the inbox
	// handles the copy under that ID, so its effects still apply once per (tenant, message ID, handler).
	HeaderInboxRedriveOf = "inbox-redrive-of"
	// HeaderInboxRedriveHandler names the one inbox handler a redriven copy is for; every other handler
	// acknowledges it without running.
	HeaderInboxRedriveHandler = "inbox-redrive-handler"
)

// redriveBatch is how many inbox dead letters one redrive transaction moves.
const redriveBatch = 500

// InboxDeadLetter returns the inbox dead letter of the scope for (handler, messageID), or an error matching
// ErrNotFound. Estate-wide, when several tenants have a dead letter with that ID and handler, the first tenant's
// (by name) is returned.
func (a *Admin) InboxDeadLetter(ctx context.Context, handler, messageID string) (InboxDeadLetter, error) {
	if err := a.valid(); err != nil {
		return InboxDeadLetter{}, err
	}
	rows, err := a.o.pool.Query(ctx, a.o.q.inboxDeadGet, messageID, handler, a.tenant)
	if err != nil {
		return InboxDeadLetter{}, fmt.Errorf("outbox: inbox dead letter: %w", err)
	}
	d, err := pgx.CollectOneRow(rows, scanInboxDeadLetter)
	if errors.Is(err, pgx.ErrNoRows) {
		return InboxDeadLetter{}, fmt.Errorf("outbox: inbox dead letter %q/%q: %w", handler, messageID, ErrNotFound)
	}
	if err != nil {
		return InboxDeadLetter{}, fmt.Errorf("outbox: inbox dead letter: %w", err)
	}
	return d, nil
}

func scanInboxDeadLetter(r pgx.CollectableRow) (InboxDeadLetter, error) {
	var d InboxDeadLetter
	err := r.Scan(&d.MessageID, &d.Handler, &d.Tenant, &d.MessageType, &d.Topic, &d.Payload,
		(*jsonmeta.Map)(&d.Metadata), &d.Attempts, &d.LastError, &d.DeadAt, &d.PayloadSize, &d.ErrorType,
		&d.ErrorSignature)
	d.DeadAt = d.DeadAt.UTC()
	return d, err
}

// RedriveInbox gives the inbox dead letters of the scope with the given message IDs (of every handler that
// dead-lettered them) another run of their handler, as RedriveInboxMatching does, and returns how many it redrove.
// IDs without an inbox dead letter in the scope do not stop the others: the known ones are redriven all the same,
// and the error is an *UnknownIDsError (errors.Is(err, ErrNotFound)) naming the unknown ones (a message redriven
// before and handled since has none: redriving it again does nothing).
func (a *Admin) RedriveInbox(ctx context.Context, ids ...string) (int, error) {
	if err := a.valid(); err != nil {
		return 0, err
	}
	return a.byIDs("inbox redrive", ids, func(ids []string) (int, map[string]struct{}, error) {
		return a.redriveInbox(ctx, InboxListOptions{IDs: ids})
	})
}

// RedriveInboxMatching gives every inbox dead letter of the scope that opts selects and that was dead-lettered at
// or before the call (Limit, After and order do not matter) another run of its handler, and returns how many it
// redrove; after an error, the count is what earlier transactions redrove. For each, in one transaction, it
// deletes the dead letter, forgets that the inbox dead-lettered the message (and its failed attempts), and stages
// a copy of the message in this outbox for the topic it was consumed from (opts.RedriveTopic when none is
// recorded), with a new message ID and the metadata HeaderInboxRedriveOf (the original ID) and
// HeaderInboxRedriveHandler (the handler). A relay of this outbox publishes the copy; the named handler's inbox
// then handles it under the original message ID (once, like any message: a delivery of the original that won the
// race makes the copy a duplicate), and every other handler on the topic acknowledges it without running. So a
// relay must run on the outbox of the inbox's database for a redrive to be delivered.
func (a *Admin) RedriveInboxMatching(ctx context.Context, opts InboxListOptions) (int, error) {
	if err := a.valid(); err != nil {
		return 0, err
	}
	n, _, err := a.redriveInbox(ctx, opts)
	return n, err
}

func (a *Admin) redriveInbox(ctx context.Context, opts InboxListOptions) (int, map[string]struct{}, error) {
	if now := a.o.now(); opts.DeadBefore.IsZero() || opts.DeadBefore.After(now) {
		opts.DeadBefore = now
	}
	args := append(a.inboxFilter(opts), redriveBatch)
	total, moved := 0, map[string]struct{}{}
	for {
		var dls []InboxDeadLetter
		err := pgx.BeginFunc(ctx, a.o.pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, a.o.q.inboxDeadTake, args...)
			if err != nil {
				return err
			}
			dls, err = pgx.CollectRows(rows, scanInboxDeadLetter)
			if err != nil {
				return err
			}
			msgs := make([]Message, 0, len(dls))
			b := &pgx.Batch{}
			for _, d := range dls {
				b.Queue(a.o.q.inboxUnmark, d.MessageID, d.Handler, d.Tenant)
				if d.Topic == "" {
					d.Topic = opts.RedriveTopic
				}
				if d.Topic == "" {
					return fmt.Errorf("inbox dead letter %q/%q has no topic recorded: give the topic to "+
						"redrive it to (InboxListOptions.RedriveTopic)", d.Handler, d.MessageID)
				}
				m, err := redriveCopy(d)
				if err != nil {
					return err
				}
				msgs = append(msgs, m)
			}
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			if len(msgs) > 0 {
				if _, err := a.o.StageTx(ctx, tx, msgs...); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return total, moved, fmt.Errorf("outbox: redrive inbox dead letters (after %d redriven): %w", total, err)
		}
		total += len(dls)
		for _, d := range dls {
			moved[d.MessageID] = struct{}{}
		}
		if len(dls) > 0 {
			a.o.Notify()
		}
		if len(dls) < redriveBatch {
			return total, moved, nil
		}
	}
}

// redriveCopy is the message staged for a redriven inbox dead letter.
func redriveCopy(d InboxDeadLetter) (Message, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return Message{}, fmt.Errorf("redrive message id: %w", err)
	}
	meta := make(map[string]string, len(d.Metadata)+2)
	for k, v := range d.Metadata {
		meta[k] = v
	}
	meta[HeaderInboxRedriveOf] = d.MessageID
	meta[HeaderInboxRedriveHandler] = d.Handler
	return Message{ID: id.String(), Topic: d.Topic, Type: d.MessageType, Payload: d.Payload, Metadata: meta,
		Tenant: d.Tenant, CorrelationID: d.Metadata[stagehand.HeaderCorrelationID],
		CausationID: d.Metadata[stagehand.HeaderCausationID]}, nil
}

// redriveTarget returns the message handler name must handle: msg itself, or for a redriven copy, the copy under
// its original message ID. skip reports a redriven copy meant for another handler.
func redriveTarget(name string, msg *message.Message) (target *message.Message, skip bool) {
	for_ := msg.Metadata.Get(HeaderInboxRedriveHandler)
	orig := msg.Metadata.Get(HeaderInboxRedriveOf)
	if for_ == "" || orig == "" {
		return msg, false
	}
	if for_ != name {
		return nil, true
	}
	c := msg.Copy()
	c.UUID = orig
	c.SetContext(msg.Context())
	return c, false
}
