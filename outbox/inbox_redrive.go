package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/jsonmeta"
)

// Metadata of a redriven inbox dead letter (see Admin.RedriveInboxDeadLetters).
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
		(*jsonmeta.Map)(&d.Metadata), &d.Attempts, &d.LastError, &d.DeadAt, &d.PayloadSize)
	d.DeadAt = d.DeadAt.UTC()
	return d, err
}

// InboxRedriveFilter selects the inbox dead letters of a redrive. The zero value selects every dead letter of the
// scope.
type InboxRedriveFilter struct {
	// Handler keeps only one handler's dead letters. Default: every handler.
	Handler string
	// MessageIDs keeps only these message IDs. Default: every message.
	MessageIDs []string
	// Topic is the topic the copies are staged for when a dead letter has none recorded (a handler run outside
	// a Watermill router). Default: each dead letter's own topic; a dead letter with none fails the redrive.
	Topic string
	// Match selects further, as it selects a listing (InboxListOptions: topic consumed from, message type, error
	// text, time of death; its Handler and MessageIDs add to this filter's, and its Limit, After, order and
	// PayloadLimit do not matter). A redrive by Match moves only the dead letters dead-lettered at or before the
	// call. Default nil: no further selection.
	Match *InboxListOptions
}

// RedriveInboxDeadLetter redrives the inbox dead letter of the scope for (handler, messageID); see
// RedriveInboxDeadLetters (topic is InboxRedriveFilter.Topic: "" for the dead letter's own). It returns an error
// matching ErrNotFound when there is no such dead letter (a message redriven before and handled since has none:
// redriving it again does nothing).
func (a *Admin) RedriveInboxDeadLetter(ctx context.Context, handler, messageID, topic string) error {
	if err := a.valid(); err != nil {
		return err
	}
	n, err := a.RedriveInboxDeadLetters(ctx, InboxRedriveFilter{Handler: handler, MessageIDs: []string{messageID},
		Topic: topic})
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("outbox: inbox dead letter %q/%q: %w", handler, messageID, ErrNotFound)
	}
	return nil
}

// RedriveInboxDeadLetters gives the inbox dead letters of the scope selected by f another run of their handler,
// and returns how many it redrove. For each, in one transaction, it deletes the dead letter, forgets that the inbox
// dead-lettered the message (and its failed attempts), and stages a copy of the message in this outbox for the
// topic it was consumed from, with a new message ID and the metadata HeaderInboxRedriveOf (the original ID) and
// HeaderInboxRedriveHandler (the handler). A relay of this outbox publishes the copy; the named handler's inbox
// then handles it under the original message ID (once, like any message: a delivery of the original that won
// the race makes the copy a duplicate), and every other handler on the topic acknowledges it without running. So
// a relay must run on the outbox of the inbox's database for a redrive to be delivered.
func (a *Admin) RedriveInboxDeadLetters(ctx context.Context, f InboxRedriveFilter) (int, error) {
	if err := a.valid(); err != nil {
		return 0, err
	}
	var match InboxListOptions
	if f.Match != nil {
		match = *f.Match
		if now := a.o.now(); match.DeadBefore.IsZero() || match.DeadBefore.After(now) {
			match.DeadBefore = now
		}
	}
	if f.Handler != "" {
		if match.Handler != "" && match.Handler != f.Handler {
			return 0, nil // two handlers: nothing is both
		}
		match.Handler = f.Handler
	}
	if f.MessageIDs != nil {
		if match.MessageIDs != nil {
			match.MessageIDs = slices.DeleteFunc(slices.Clone(f.MessageIDs), func(id string) bool {
				return !slices.Contains(match.MessageIDs, id)
			})
		} else {
			match.MessageIDs = f.MessageIDs
		}
	}
	if match.MessageIDs != nil && len(match.MessageIDs) == 0 {
		return 0, nil
	}
	args := append(a.inboxFilter(match), redriveBatch)
	total := 0
	for {
		n := 0
		err := pgx.BeginFunc(ctx, a.o.pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, a.o.q.inboxDeadTake, args...)
			if err != nil {
				return err
			}
			dls, err := pgx.CollectRows(rows, scanInboxDeadLetter)
			if err != nil {
				return err
			}
			msgs := make([]Message, 0, len(dls))
			b := &pgx.Batch{}
			for _, d := range dls {
				b.Queue(a.o.q.inboxUnmark, d.MessageID, d.Handler, d.Tenant)
				if d.Topic == "" {
					d.Topic = f.Topic
				}
				if d.Topic == "" {
					return fmt.Errorf("inbox dead letter %q/%q has no topic recorded: give the topic to "+
						"redrive it to", d.Handler, d.MessageID)
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
			n = len(dls)
			return nil
		})
		if err != nil {
			return total, fmt.Errorf("outbox: redrive inbox dead letters (after %d redriven): %w", total, err)
		}
		total += n
		if n > 0 {
			a.o.Notify()
		}
		if n < redriveBatch {
			return total, nil
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
