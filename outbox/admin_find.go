package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The operator's lookups: dead letters grouped by cause, and one message found wherever it is, with its failed
// attempts and what each inbox handler made of it.

// DeadLetterGroup is a group of dead letters whose last errors have one signature (see ErrorSignature): one cause.
type DeadLetterGroup struct {
	// Signature is the group's error signature: pass it as ListOptions.Signature (or InboxListOptions.Signature)
	// to list, count, redrive or discard the group. "unknown: recorded without a signature" groups the dead letters
	// recorded before signatures were.
	Signature string
	// ErrorType is the errors' type (ErrorType).
	ErrorType string
	// Count is how many dead letters the group holds.
	Count int64
	// FirstDeadAt and LastDeadAt are when its oldest and newest dead letter died.
	FirstDeadAt, LastDeadAt time.Time
	// SampleError is the last error of its newest dead letter, cut to 300 bytes.
	SampleError string
}

// DeadLetterGroups groups the dead letters of the scope that opts selects by error signature, the largest groups
// first, at most opts.Limit groups (default 100; its After, order and PayloadLimit do not matter). Redrive or
// discard a group with RedriveMatching or DiscardMatching and ListOptions.Signature. The grouping reads the index
// on signatures (it holds the tenant, the time of death and the type); a filter on other fields reads the rows.
func (a *Admin) DeadLetterGroups(ctx context.Context, opts ListOptions) ([]DeadLetterGroup, error) {
	if err := a.valid(); err != nil {
		return nil, err
	}
	return a.groups(ctx, "dead letter groups", a.o.q.deadGroups, a.filter(opts), opts.Limit)
}

// InboxDeadLetterGroups groups the inbox dead letters of the scope that opts selects by error signature, as
// DeadLetterGroups does the outbox's. Redrive or discard a group with RedriveInboxMatching or DiscardInboxMatching
// and InboxListOptions.Signature.
func (a *Admin) InboxDeadLetterGroups(ctx context.Context, opts InboxListOptions) ([]DeadLetterGroup, error) {
	if err := a.valid(); err != nil {
		return nil, err
	}
	return a.groups(ctx, "inbox dead letter groups", a.o.q.inboxDeadGroups, a.inboxFilter(opts), opts.Limit)
}

func (a *Admin) groups(ctx context.Context, what, query string, filter []any, limit int) ([]DeadLetterGroup, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := a.o.pool.Query(ctx, query, append(filter, limit)...)
	if err != nil {
		return nil, fmt.Errorf("outbox: %s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetterGroup, error) {
		var g DeadLetterGroup
		err := r.Scan(&g.Signature, &g.ErrorType, &g.Count, &g.FirstDeadAt, &g.LastDeadAt, &g.SampleError)
		g.FirstDeadAt, g.LastDeadAt = g.FirstDeadAt.UTC(), g.LastDeadAt.UTC()
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: %s: %w", what, err)
	}
	return out, nil
}

// Failure is one failed attempt in a message's failure history: a relay's rejected delivery, or an inbox
// handler's failure. The history keeps the last 10 failures of each message per topic (outbox) or handler
// (inbox), across redrives, each error cut to 1,000 bytes, for as long as MaintenanceConfig.DeadLetterRetention.
type Failure struct {
	// N numbers the message's recorded failures (at its topic or handler) from 1, across redrives.
	N int
	// Attempt is the attempt's number in its round: a redrive starts a new round at 1.
	Attempt int
	// ErrorType, Signature and Error are the error's type, signature and text.
	ErrorType, Signature, Error string
	// At is when the attempt failed (by the clock of the process that made it).
	At time.Time
}

// Where a FoundMessage is.
const (
	// StateScheduled is a message whose scheduled time is still ahead.
	StateScheduled = "scheduled"
	// StateInFlight is a message a relay holds now.
	StateInFlight = "in-flight"
	// StateBackingOff is a message waiting for a retry after a rejection.
	StateBackingOff = "backing-off"
	// StateParked is a message waiting behind an earlier message of its key.
	StateParked = "parked"
	// StateReceived is a message known only to the inbox of this database (published by another database's
	// outbox, or from the ledger since cleaned up).
	StateReceived = "received"
)

// Outcomes of a HandlerRecord.
const (
	// OutcomeHandled: the handler handled the message.
	OutcomeHandled = "handled"
	// OutcomeDeadLettered: the handler dead-lettered the message; it waits in the inbox dead letters.
	OutcomeDeadLettered = "dead-lettered"
	// OutcomeFailing: the handler failed on the message and will try again on its redelivery.
	OutcomeFailing = "failing"
)

// FoundMessage is a message Find found: where it is, its attempts and errors, and what the inbox handlers of this
// database made of it.
type FoundMessage struct {
	// ID, Tenant, Topic and Type identify it (a message staged for several topics is found once per topic).
	ID, Tenant, Topic, Type string
	// State is where it is: StatePending (due), StateScheduled, StateInFlight, StateBackingOff, StateParked,
	// StateDeadLettered, StateSent, StateDiscarded, or StateReceived.
	State string
	// PartitionKey, CorrelationID and StreamID (its aggregate-id header) as recorded; the sent ledger records
	// none of them, so a sent message has them empty.
	PartitionKey, CorrelationID, StreamID string
	// Attempts counts rejected attempts (for a sent message: every attempt); LastError is the last rejection's
	// error (pending and dead-lettered messages), cut to 1,000 bytes; ErrorSignature its signature (dead letters).
	Attempts                  int
	LastError, ErrorSignature string
	// StagedAt is when it was staged; DoneAt when it was dead-lettered, published or discarded (zero while in the
	// outbox); NextAttemptAt when a relay may claim it next (zero when parked or done).
	StagedAt, DoneAt, NextAttemptAt time.Time
	// HoldsKey reports a dead letter holding its key.
	HoldsKey bool
	// SourcePosition is the log position of the event it was staged from (0 when none).
	SourcePosition int64
	// Failures is its relay's failure history at its topic, newest first.
	Failures []Failure
	// Handlers is what each inbox handler of this database made of it, by handler name.
	Handlers []HandlerRecord
}

// HandlerRecord is what one inbox handler made of a message.
type HandlerRecord struct {
	Handler string
	// Outcome is OutcomeHandled, OutcomeDeadLettered or OutcomeFailing.
	Outcome string
	// At is when it was handled or dead-lettered, or last failed.
	At time.Time
	// Attempts counts its failed attempts (dead-lettered or failing); LastError is the last one's error, cut to
	// 1,000 bytes, and ErrorSignature its signature (dead-lettered).
	Attempts                  int
	LastError, ErrorSignature string
	// Failures is the handler's failure history for the message, newest first.
	Failures []Failure
}

// FindBy is what Find looks a message up by.
type FindBy int

const (
	// FindAny looks the text up as each of the others.
	FindAny FindBy = iota
	// FindByID looks up a message ID.
	FindByID
	// FindByCorrelation looks up a correlation ID.
	FindByCorrelation
	// FindByStream looks up a stream ID (the stagehand.HeaderAggregateID header of messages staged from events).
	FindByStream
	// FindByKey looks up a partition key.
	FindByKey
)

// String returns "any", "id", "correlation", "stream" or "key".
func (b FindBy) String() string {
	switch b {
	case FindAny:
		return "any"
	case FindByID:
		return "id"
	case FindByCorrelation:
		return "correlation"
	case FindByStream:
		return "stream"
	case FindByKey:
		return "key"
	}
	return fmt.Sprintf("FindBy(%d)", int(b))
}

// FindScanLimit is how many rows of the outbox table Find reads, at most, to look up a correlation ID, a stream or
// a key: the table has no index on the first two (every staging would pay for one), so a lookup reads its rows
// up to this bound (FindResult.ScanBounded reports a table that holds more).
const FindScanLimit = 100_000

// FindQuery is what Find looks for.
type FindQuery struct {
	// Text is the message ID, correlation ID, stream ID or key. Required; at most 1,024 bytes.
	Text string
	// By is what Text is. Default FindAny.
	By FindBy
	// Positions are the log positions of events whose staged messages are found too, wherever they are (the sent
	// ledger included, through its index on positions): the events of the stream Text names, for a caller that
	// reads the event log (the console does). Default nil.
	Positions []int64
	// Limit caps how many messages (tenant, message ID) are found. Default 50; at most 500.
	Limit int
}

// FindResult is what Find found.
type FindResult struct {
	// Messages are the messages found, oldest staged first.
	Messages []FoundMessage
	// Truncated reports that more messages matched than FindQuery.Limit.
	Truncated bool
	// ScanBounded reports that the outbox table holds more than FindScanLimit rows, so a lookup by correlation ID,
	// stream or key may have missed pending messages beyond them (a message ID is always found).
	ScanBounded bool
}

// ErrInvalidQuery is matched by the error of a FindQuery Find refuses.
var ErrInvalidQuery = errors.New("outbox: invalid query")

// Find looks a message up by its ID, its correlation ID, its stream or its partition key (q.By; FindAny tries
// each), in the scope, and returns where each message found is (the outbox, its dead letters, the sent ledger, or
// only the inbox), its attempts, its last error and failure history, and what each inbox handler of this database
// made of it. Messages are looked up through indexes: by ID everywhere; by correlation ID, stream or key in the
// dead letters (outbox and inbox) and, among its first FindScanLimit rows, the outbox table. The sent ledger keeps
// no correlation ID, stream or key: a sent message is found by its ID, or by q.Positions.
func (a *Admin) Find(ctx context.Context, q FindQuery) (FindResult, error) {
	if err := a.valid(); err != nil {
		return FindResult{}, err
	}
	text := strings.TrimSpace(q.Text)
	switch {
	case text == "":
		return FindResult{}, fmt.Errorf("%w: the text to find is empty", ErrInvalidQuery)
	case len(text) > 1024:
		return FindResult{}, fmt.Errorf("%w: the text to find is longer than 1,024 bytes", ErrInvalidQuery)
	case q.By < FindAny || q.By > FindByKey:
		return FindResult{}, fmt.Errorf("%w: unknown lookup %v", ErrInvalidQuery, q.By)
	case q.Limit > 500:
		return FindResult{}, fmt.Errorf("%w: a limit of %d is above 500", ErrInvalidQuery, q.Limit)
	}
	limit := q.Limit
	if limit <= 0 {
		limit = 50
	}
	var res FindResult
	// byID: message IDs looked up directly (every tenant's, in the scope); pairs: (tenant, ID) found otherwise.
	byID := map[string]bool{}
	pairs := map[[2]string]bool{}
	if q.By == FindAny || q.By == FindByID {
		byID[text] = true
	}
	for i, by := range []FindBy{FindByCorrelation, FindByStream, FindByKey} {
		if q.By != FindAny && q.By != by {
			continue
		}
		rows, err := a.o.pool.Query(ctx, a.o.q.findIDs[i], text, a.tenant, FindScanLimit, limit+1)
		if err != nil {
			return FindResult{}, fmt.Errorf("outbox: find by %v: %w", by, err)
		}
		found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
			var p [2]string
			err := r.Scan(&p[0], &p[1])
			return p, err
		})
		if err != nil {
			return FindResult{}, fmt.Errorf("outbox: find by %v: %w", by, err)
		}
		for _, p := range found {
			pairs[p] = true
		}
	}
	if q.By != FindByID {
		if err := a.o.pool.QueryRow(ctx, a.o.q.outboxBeyond, FindScanLimit).Scan(&res.ScanBounded); err != nil {
			return FindResult{}, fmt.Errorf("outbox: find: %w", err)
		}
	}
	if len(q.Positions) > 0 {
		staged, err := a.StagedFrom(ctx, q.Positions)
		if err != nil {
			return FindResult{}, err
		}
		for _, m := range staged {
			pairs[[2]string{m.Tenant, m.ID}] = true
		}
	}
	ids := make([]string, 0, len(byID)+len(pairs))
	for id := range byID {
		ids = append(ids, id)
	}
	for p := range pairs {
		ids = append(ids, p[1])
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	keep := func(tenant, id string) bool { return byID[id] || pairs[[2]string{tenant, id}] }

	msgs, err := a.findMessages(ctx, ids, keep)
	if err != nil {
		return FindResult{}, err
	}
	inbox, err := a.findInbox(ctx, ids, keep)
	if err != nil {
		return FindResult{}, err
	}
	failures, err := a.failures(ctx, ids, keep)
	if err != nil {
		return FindResult{}, err
	}
	known := map[foundKey]bool{}
	for i := range msgs {
		m := &msgs[i]
		known[foundKey{m.Tenant, m.ID}] = true
		m.Failures = failures[failureKey{"outbox", m.Tenant, m.ID, m.Topic}]
	}
	// What only the inbox knows: a message of another database's outbox, or one the ledger no longer holds.
	for k, hs := range inbox {
		if known[k] {
			continue
		}
		m := FoundMessage{ID: k.id, Tenant: k.tenant, State: StateReceived}
		for _, h := range hs {
			if h.topic != "" {
				m.Topic, m.Type, m.CorrelationID = h.topic, h.msgType, h.correlation
			}
		}
		msgs = append(msgs, m)
	}
	for i := range msgs {
		m := &msgs[i]
		for _, h := range inbox[foundKey{m.Tenant, m.ID}] {
			h.Failures = failures[failureKey{"inbox", m.Tenant, m.ID, h.Handler}]
			m.Handlers = append(m.Handlers, h.HandlerRecord)
		}
	}
	slices.SortFunc(msgs, func(x, y FoundMessage) int {
		return cmp.Or(x.StagedAt.Compare(y.StagedAt), strings.Compare(x.Tenant, y.Tenant),
			strings.Compare(x.ID, y.ID), strings.Compare(x.Topic, y.Topic), strings.Compare(x.State, y.State))
	})
	// The limit counts messages (tenant, ID): a message staged for several topics is one.
	seen := map[foundKey]bool{}
	for i, m := range msgs {
		k := foundKey{m.Tenant, m.ID}
		if !seen[k] && len(seen) == limit {
			msgs, res.Truncated = msgs[:i], true
			break
		}
		seen[k] = true
	}
	if len(pairs) > limit {
		res.Truncated = true
	}
	res.Messages = msgs
	return res, nil
}

// findMessages reads the outbox, the dead letters and the sent ledger for the IDs.
func (a *Admin) findMessages(ctx context.Context, ids []string, keep func(tenant, id string) bool) (
	[]FoundMessage, error) {
	rows, err := a.o.pool.Query(ctx, a.o.q.findMessages, ids, a.tenant, a.o.now())
	if err != nil {
		return nil, fmt.Errorf("outbox: find: %w", err)
	}
	var out []FoundMessage
	for rows.Next() {
		var (
			m          FoundMessage
			done, next *time.Time
		)
		if err := rows.Scan(&m.State, &m.ID, &m.Tenant, &m.Topic, &m.Type, &m.PartitionKey, &m.CorrelationID,
			&m.StreamID, &m.Attempts, &m.LastError, &m.StagedAt, &done, &next, &m.HoldsKey, &m.SourcePosition,
			&m.ErrorSignature); err != nil {
			rows.Close()
			return nil, fmt.Errorf("outbox: find: %w", err)
		}
		if !keep(m.Tenant, m.ID) {
			continue
		}
		m.StagedAt = m.StagedAt.UTC()
		if done != nil {
			m.DoneAt = done.UTC()
		}
		if next != nil {
			m.NextAttemptAt = next.UTC()
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: find: %w", err)
	}
	return out, nil
}

type foundKey struct{ tenant, id string }

// handlerFound is a HandlerRecord with what the inbox dead letters tell of the message itself.
type handlerFound struct {
	HandlerRecord
	topic, msgType, correlation string
}

// findInbox reads what the inbox knows of the IDs, per (tenant, ID), by handler.
func (a *Admin) findInbox(ctx context.Context, ids []string, keep func(tenant, id string) bool) (
	map[foundKey][]handlerFound, error) {
	rows, err := a.o.pool.Query(ctx, a.o.q.findInbox, ids, a.tenant)
	if err != nil {
		return nil, fmt.Errorf("outbox: find in the inbox: %w", err)
	}
	type hk struct {
		foundKey
		handler string
	}
	by := map[hk]*handlerFound{}
	for rows.Next() {
		var (
			k                                       hk
			kind                                    string
			at                                      time.Time
			attempts                                int
			lastErr, sig, topic, msgType, correlate string
		)
		if err := rows.Scan(&k.id, &k.tenant, &k.handler, &kind, &at, &attempts, &lastErr, &sig, &topic, &msgType,
			&correlate); err != nil {
			rows.Close()
			return nil, fmt.Errorf("outbox: find in the inbox: %w", err)
		}
		if !keep(k.tenant, k.id) {
			continue
		}
		h := by[k]
		if h == nil {
			h = &handlerFound{HandlerRecord: HandlerRecord{Handler: k.handler}}
			by[k] = h
		}
		at = at.UTC()
		switch kind {
		case OutcomeHandled:
			h.Outcome, h.At = OutcomeHandled, at
		case OutcomeDeadLettered: // the inbox entry; the dead letter's row says more
			if h.Outcome == "" {
				h.Outcome, h.At = OutcomeDeadLettered, at
			}
		case OutcomeFailing:
			if h.Outcome == "" {
				h.Outcome, h.At = OutcomeFailing, at
			}
			h.Attempts, h.LastError = attempts, lastErr
		case "dead-letter":
			h.Outcome, h.At, h.Attempts, h.LastError, h.ErrorSignature = OutcomeDeadLettered, at, attempts, lastErr,
				sig
			h.topic, h.msgType, h.correlation = topic, msgType, correlate
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: find in the inbox: %w", err)
	}
	out := map[foundKey][]handlerFound{}
	for k, h := range by {
		out[k.foundKey] = append(out[k.foundKey], *h)
	}
	for _, hs := range out {
		slices.SortFunc(hs, func(x, y handlerFound) int { return strings.Compare(x.Handler, y.Handler) })
	}
	return out, nil
}

type failureKey struct{ source, tenant, id, target string }

// failures reads the failure history of the IDs.
func (a *Admin) failures(ctx context.Context, ids []string, keep func(tenant, id string) bool) (
	map[failureKey][]Failure, error) {
	rows, err := a.o.pool.Query(ctx, a.o.q.failuresOf, ids, a.tenant)
	if err != nil {
		return nil, fmt.Errorf("outbox: failure history: %w", err)
	}
	out := map[failureKey][]Failure{}
	for rows.Next() {
		var (
			k failureKey
			f Failure
		)
		if err := rows.Scan(&k.source, &k.id, &k.tenant, &k.target, &f.N, &f.Attempt, &f.ErrorType, &f.Signature,
			&f.Error, &f.At); err != nil {
			rows.Close()
			return nil, fmt.Errorf("outbox: failure history: %w", err)
		}
		if !keep(k.tenant, k.id) {
			continue
		}
		f.At = f.At.UTC()
		out[k] = append(out[k], f)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: failure history: %w", err)
	}
	return out, nil
}
