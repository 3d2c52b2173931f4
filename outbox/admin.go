package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/jsonmeta"
)

// Admin runs the operations on the outbox tables (statistics, dead letters, cleanup) for one scope: every tenant
// (Outbox.AllTenants) or a single one (Outbox.Tenant). The estate-wide scope is reached by that method's name,
// never by a wildcard tenant value, so a tenant that flowed in from a request cannot widen an operation (the
// Excalibur outbox documentation, "Administrative operations reach every tenant").
//
// A message is identified by (tenant, message ID, topic), and an inbox entry by (tenant, message ID, handler): two
// tenants may use the same message ID. The operations that take a message ID act, in a tenant's scope, on that
// tenant's message alone, and estate-wide on every tenant's message with that ID.
type Admin struct {
	o      *Outbox
	tenant *string // nil: every tenant
	err    error   // the tenant is not accepted: every operation returns this
}

// AllTenants returns the estate-wide operations: their results cover every tenant. Treat them as operator reports;
// do not show them to a tenant as though they described that tenant alone.
func (o *Outbox) AllTenants() *Admin { return &Admin{o: o} }

// Tenant returns the operations confined to one tenant ("" means stagehand.NoTenant). A tenant that
// stagehand.ValidateTenant refuses makes every operation of the scope fail with that error (matching
// stagehand.ErrInvalidTenant) before anything reaches the database.
func (o *Outbox) Tenant(tenant string) *Admin {
	t := stagehand.NormalizeTenant(tenant)
	return &Admin{o: o, tenant: &t, err: stagehand.ValidateTenant(t)}
}

// valid returns the scope's tenant error, if any.
func (a *Admin) valid() error {
	if a.err != nil {
		return fmt.Errorf("outbox: %w", a.err)
	}
	return nil
}

// Stats describes the outbox at one instant.
type Stats struct {
	// Pending counts messages due or overdue that are not yet published: ready, being delivered, backing off
	// after a rejection, or parked behind an earlier message of their key (Parked).
	Pending int64
	// OldestPendingAge is how long the oldest pending message has been due (zero when none is pending). A value
	// that keeps growing while relays run means the outbox is stalled.
	OldestPendingAge time.Duration
	// Scheduled counts messages whose scheduled time is still ahead.
	Scheduled int64
	// BackingOff counts pending messages waiting for a retry after a rejection.
	BackingOff int64
	// Parked counts pending messages parked behind an earlier message of their partition key, for either reason:
	// Parked = WaitingBehindPending + HeldByDeadLetter.
	Parked int64
	// WaitingBehindPending counts parked messages whose key has an earlier message still pending (ready, in
	// flight or backing off): the normal state of a key with several messages, which go out in turn.
	WaitingBehindPending int64
	// HeldByDeadLetter counts parked messages whose key a dead-lettered message holds: they wait until it is
	// redriven or discarded, or the key released.
	HeldByDeadLetter int64
	// InFlight counts pending messages currently leased by a relay.
	InFlight int64
	// DeadLettered counts messages in the dead letters.
	DeadLettered int64
	// Sent counts entries of the sent ledger (published or discarded, not yet cleaned up).
	Sent int64
}

// Stats returns the outbox statistics of the scope.
func (a *Admin) Stats(ctx context.Context) (Stats, error) {
	return a.stats(ctx, a.o.q.stats)
}

// Backlog returns the statistics of the scope without Sent (left 0): what a health probe or a dashboard refreshing
// every few seconds needs, without counting the sent ledger, which may hold millions of entries. It reads the hot
// outbox table, the dead letters and, for each key a dead letter holds, that key's parked messages.
func (a *Admin) Backlog(ctx context.Context) (Stats, error) {
	return a.stats(ctx, a.o.q.backlog)
}

func (a *Admin) stats(ctx context.Context, query string) (Stats, error) {
	if err := a.valid(); err != nil {
		return Stats{}, err
	}
	now := a.o.now()
	var st Stats
	var oldest *time.Time
	if err := a.o.pool.QueryRow(ctx, query, a.tenant, now).Scan(&st.Pending, &st.Scheduled, &st.BackingOff,
		&st.WaitingBehindPending, &st.HeldByDeadLetter, &st.InFlight, &oldest, &st.DeadLettered,
		&st.Sent); err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	st.Parked = st.WaitingBehindPending + st.HeldByDeadLetter
	if oldest != nil && now.After(*oldest) {
		st.OldestPendingAge = now.Sub(*oldest)
	}
	return st, nil
}

// DeadLetter is a message whose retries were used up, with everything needed to redrive it.
type DeadLetter struct {
	Message
	// Attempts is the number of rejected attempts.
	Attempts int
	// LastError is the error of the last attempt.
	LastError string
	// Sequence is the message's position within its partition key (0 when unordered).
	Sequence int64
	// HoldsKey reports whether later messages of the key wait for this one to be redriven or discarded.
	HoldsKey bool
	// CreatedAt is when the message was staged; DeadAt when it was dead-lettered.
	CreatedAt, DeadAt time.Time
	// PayloadSize is the stored payload's size in bytes: len(Payload), unless ListOptions.PayloadLimit cut it.
	PayloadSize int
	// ErrorType and ErrorSignature classify the last error (see ErrorType and ErrorSignature; "unknown" for a dead
	// letter recorded without them): DeadLetterGroups groups by the signature.
	ErrorType, ErrorSignature string
}

// ListOptions selects and pages through dead letters, oldest first unless NewestFirst. Its filters also select
// what CountDeadLetters counts and RedriveMatching and DiscardMatching move; every filter left at its zero value
// selects everything.
type ListOptions struct {
	// Limit caps the page. Default 100.
	Limit int
	// Topic keeps only the dead letters of one topic. Default: all.
	Topic string
	// ID keeps only the dead letters with this message ID (one per topic it was staged for, and estate-wide per
	// tenant that staged it). Default: all.
	ID string
	// IDs keeps only the dead letters with one of these message IDs. Default nil: all; an empty slice that is not
	// nil selects none.
	IDs []string
	// Type keeps only the dead letters of one message type. Default: all.
	Type string
	// ErrorContains keeps only the dead letters whose last error contains this text, ignoring case (a plain
	// substring: no pattern characters). Default: all.
	ErrorContains string
	// Signature keeps only the dead letters whose last error has this signature (DeadLetter.ErrorSignature, a
	// DeadLetterGroup's Signature): a group of dead letters with one cause. Default: all.
	Signature string
	// DeadAfter keeps only the dead letters dead-lettered after this instant, and DeadBefore those dead-lettered at
	// or before it. Default zero: no bound.
	DeadAfter, DeadBefore time.Time
	// NewestFirst pages from the newest dead letter back. Default false: oldest first.
	NewestFirst bool
	// PayloadLimit, when positive, returns at most this many bytes of each payload (DeadLetter.PayloadSize tells
	// the whole size), so a listing never loads megabytes of payloads. Default 0: whole payloads.
	PayloadLimit int
	// TextLimit, when positive, returns at most this many characters of each last error and no metadata (nil), so
	// a list reads neither whole however large they are. Default 0: both whole.
	TextLimit int
	// After continues after the last item of the previous page (zero: from the start).
	After *DeadLetter
}

// filter returns the arguments of the dead_where fragment ($1 to $9) for the scope and the options.
func (a *Admin) filter(opts ListOptions) []any {
	return []any{a.tenant, nonEmpty(opts.Topic), nonEmpty(opts.ID), opts.IDs, nonEmpty(opts.Type),
		containsPattern(opts.ErrorContains), nonZero(opts.DeadAfter), nonZero(opts.DeadBefore),
		nonEmpty(opts.Signature)}
}

// nonEmpty is nil for "" (a filter argument that does not filter).
func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// nonZero is nil for the zero time (a bound that does not bound).
func nonZero(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// containsPattern is the ILIKE pattern matching text anywhere, its pattern characters escaped; nil for "".
func containsPattern(text string) *string {
	if text == "" {
		return nil
	}
	p := "%" + strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`).Replace(text) + "%"
	return &p
}

// keysetStart is where a page in (time, ...) order starts when it continues no earlier page: before every row in
// ascending order, after every row in descending order.
func keysetStart(newestFirst bool) pgtype.Timestamptz {
	if newestFirst {
		return pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
	}
	return pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
}

// direction is the index of a statement variant: 0 oldest first, 1 newest first.
func direction(newestFirst bool) int {
	if newestFirst {
		return 1
	}
	return 0
}

// DeadLetters lists the dead letters of the scope that opts selects, oldest first (newest first with
// opts.NewestFirst).
func (a *Admin) DeadLetters(ctx context.Context, opts ListOptions) ([]DeadLetter, error) {
	if err := a.valid(); err != nil {
		return nil, err
	}
	if opts.Limit <= 0 {
		opts.Limit = 100
	}
	var afterAt any = keysetStart(opts.NewestFirst)
	afterID, afterTopic, afterTenant := "", "", ""
	if opts.After != nil {
		afterAt, afterID, afterTopic, afterTenant = opts.After.DeadAt, opts.After.ID, opts.After.Topic,
			opts.After.Tenant
	}
	args := append(a.filter(opts), afterAt, afterID, afterTopic, afterTenant, opts.Limit, max(opts.PayloadLimit, 0),
		max(opts.TextLimit, 0))
	rows, err := a.o.pool.Query(ctx, a.o.q.listDead[direction(opts.NewestFirst)], args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters: %w", err)
	}
	if opts.TextLimit > 0 {
		for i := range out {
			out[i].Metadata = nil // not read
		}
	}
	return out, nil
}

// CountDeadLetters counts the dead letters of the scope that opts selects (its Limit, After, order and
// PayloadLimit do not matter): what RedriveMatching or DiscardMatching with the same options would move now.
func (a *Admin) CountDeadLetters(ctx context.Context, opts ListOptions) (int64, error) {
	if err := a.valid(); err != nil {
		return 0, err
	}
	var n int64
	if err := a.o.pool.QueryRow(ctx, a.o.q.countDead, a.filter(opts)...).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: count dead letters: %w", err)
	}
	return n, nil
}

// DeadLetter returns the dead letter of the scope with message ID id, or an error matching ErrNotFound. When the
// same ID was staged for several topics (or, estate-wide, by several tenants) it returns the oldest;
// ListOptions.ID lists them all.
func (a *Admin) DeadLetter(ctx context.Context, id string) (DeadLetter, error) {
	if err := a.valid(); err != nil {
		return DeadLetter{}, err
	}
	rows, err := a.o.pool.Query(ctx, a.o.q.getDead, id, a.tenant)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("outbox: dead letter %q: %w", id, err)
	}
	dl, err := pgx.CollectExactlyOneRow(rows, scanDeadLetter)
	if errors.Is(err, pgx.ErrNoRows) {
		return DeadLetter{}, fmt.Errorf("outbox: dead letter %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("outbox: dead letter %q: %w", id, err)
	}
	return dl, nil
}

func scanDeadLetter(r pgx.CollectableRow) (DeadLetter, error) {
	var (
		dl        DeadLetter
		seq, pos  *int64
		scheduled *time.Time
	)
	err := r.Scan(&dl.ID, &dl.Tenant, &dl.Type, &dl.Topic, &dl.Payload, (*jsonmeta.Map)(&dl.Metadata), &dl.CorrelationID,
		&dl.CausationID, &dl.PartitionKey, &seq, &pos, &scheduled, &dl.Attempts, &dl.LastError, &dl.HoldsKey,
		&dl.CreatedAt, &dl.DeadAt, &dl.PayloadSize, &dl.ErrorType, &dl.ErrorSignature)
	if seq != nil {
		dl.Sequence = *seq
	}
	if pos != nil {
		dl.SourcePosition = *pos
	}
	if scheduled != nil {
		dl.ScheduledAt = *scheduled
	}
	return dl, err
}

// UnknownIDsError reports the requested message IDs an operation found no dead letter for in its scope: never
// dead-lettered, already redriven or discarded, or another tenant's. The operation still acted on every other ID.
// It matches ErrNotFound with errors.Is; use errors.As to read the IDs.
type UnknownIDsError struct {
	// Op is the operation: "redrive", "discard", "inbox redrive" or "inbox discard".
	Op string
	// IDs are the unknown message IDs, sorted, each once.
	IDs []string
	// Requested is how many distinct IDs were asked for.
	Requested int
}

func (e *UnknownIDsError) Error() string {
	return fmt.Sprintf("outbox: %s: %d of %d message IDs have no dead letter in this scope: %s", e.Op, len(e.IDs),
		e.Requested, strings.Join(e.IDs, ", "))
}

// Is makes errors.Is(err, ErrNotFound) true.
func (e *UnknownIDsError) Is(target error) bool { return target == ErrNotFound }

// Redrive moves the dead letters of the scope with the given message IDs (for every topic) back into the outbox,
// due now with a fresh attempt count, and releases the messages their keys were holding (they follow the redriven
// message, in order). It returns how many dead letters it moved (one per topic a message was dead-lettered on and,
// estate-wide, per tenant whose message has the ID).
//
// IDs without a dead letter in the scope do not stop the others: the known ones are moved all the same, and the
// error is an *UnknownIDsError (errors.Is(err, ErrNotFound)) naming the unknown ones. Any other error means nothing
// moved.
func (a *Admin) Redrive(ctx context.Context, ids ...string) (int, error) {
	if err := a.valid(); err != nil {
		return 0, err
	}
	return a.move(ctx, "redrive", a.o.q.redrive, ids, false)
}

// Discard deletes dead letters of the scope for good and releases the keys they held. Their IDs stay in the sent
// ledger (outcome "discarded") until cleanup, so re-staging them publishes nothing. It returns how many it
// deleted. Unknown IDs are reported as by Redrive: the known ones are discarded and the error is an
// *UnknownIDsError naming the others.
func (a *Admin) Discard(ctx context.Context, ids ...string) (int, error) {
	if err := a.valid(); err != nil {
		return 0, err
	}
	return a.move(ctx, "discard", a.o.q.discard, ids, true)
}

// move runs a redrive or discard by IDs and reports the requested IDs that matched no dead letter of the scope.
func (a *Admin) move(ctx context.Context, op, query string, ids []string, release bool) (int, error) {
	return a.byIDs(op, ids, func(ids []string) (int, map[string]struct{}, error) {
		n, moved, err := a.moveDead(ctx, query, release, func(now time.Time) []any { return []any{ids, a.tenant, now} })
		if err != nil {
			return 0, nil, fmt.Errorf("outbox: %s: %w", op, err)
		}
		if n > 0 {
			a.o.Notify()
		}
		return n, moved, nil
	})
}

// matchBatch is how many dead letters one transaction of RedriveMatching or DiscardMatching moves.
const matchBatch = 500

// RedriveMatching redrives, as Redrive does, every dead letter of the scope that opts selects (see
// CountDeadLetters; Limit, After and order do not matter) and that was dead-lettered at or before the call: a
// message that fails again while the redrive runs is not redriven twice. It moves them oldest first, in
// transactions of a few hundred, and returns how many it moved; after an error, the count is what earlier
// transactions moved. Dead letters another operation is moving at the same moment are left to it.
func (a *Admin) RedriveMatching(ctx context.Context, opts ListOptions) (int, error) {
	if err := a.valid(); err != nil {
		return 0, err
	}
	return a.moveMatching(ctx, "redrive", a.o.q.redriveWhere, opts, false)
}

// DiscardMatching discards, as Discard does, every dead letter of the scope that opts selects and that was
// dead-lettered at or before the call, releasing the keys they held; see RedriveMatching.
func (a *Admin) DiscardMatching(ctx context.Context, opts ListOptions) (int, error) {
	if err := a.valid(); err != nil {
		return 0, err
	}
	return a.moveMatching(ctx, "discard", a.o.q.discardWhere, opts, true)
}

func (a *Admin) moveMatching(ctx context.Context, op, query string, opts ListOptions, release bool) (int, error) {
	if now := a.o.now(); opts.DeadBefore.IsZero() || opts.DeadBefore.After(now) {
		opts.DeadBefore = now
	}
	filter := a.filter(opts)
	total := 0
	for {
		n, _, err := a.moveDead(ctx, query, release, func(now time.Time) []any {
			return append(slices.Clip(filter), matchBatch, now)
		})
		if err != nil {
			return total, fmt.Errorf("outbox: %s (after %d moved): %w", op, total, err)
		}
		total += n
		if n > 0 {
			a.o.Notify()
		}
		if n < matchBatch {
			return total, nil
		}
	}
}

// moveDead runs a redrive or discard statement with the arguments args gives for the time now, and returns how
// many dead letters it moved and their message IDs. A discarded dead letter that held its key (its tenant's key:
// another tenant's messages of the same key never wait for it) releases it: the key's first waiting message is
// promoted, under the key's lock so a message being parked by a concurrent staging transaction is not missed. A
// redriven one keeps its place at the head of its key and needs none.
func (a *Admin) moveDead(ctx context.Context, query string, release bool, args func(now time.Time) []any) (int,
	map[string]struct{}, error) {
	now := a.o.now()
	var (
		n     int
		moved map[string]struct{}
	)
	err := pgx.BeginFunc(ctx, a.o.pool, func(tx pgx.Tx) error {
		n, moved = 0, map[string]struct{}{}
		rows, err := tx.Query(ctx, query, args(now)...)
		if err != nil {
			return err
		}
		var keys []tenantKey
		for rows.Next() {
			var (
				id, tenant, key string
				holds           bool
			)
			if err := rows.Scan(&id, &tenant, &key, &holds); err != nil {
				rows.Close()
				return err
			}
			n++
			moved[id] = struct{}{}
			if holds {
				keys = append(keys, tenantKey{tenant, key})
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if !release || len(keys) == 0 {
			return nil
		}
		locks, tenants, names := a.o.keyArgs(sortedKeys(keys))
		if _, err := tx.Exec(ctx, a.o.q.lockKeysWait, sortedLocks(locks)); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, a.o.q.promote, tenants, names, now)
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	return n, moved, nil
}

// CleanupSent deletes sent-ledger entries of the scope recorded before olderThan ago, in batches of batchSize
// (default 1000) until none is left, and returns how many it deleted. Entries whose source position is at or above
// the lowest registered watermark are kept, whatever their age, so a component that re-stages from the event log
// (a reconciler, a Deferred stager) cannot publish them twice; with no watermark registered only age counts.
// Pending and dead-lettered messages are never touched.
func (a *Admin) CleanupSent(ctx context.Context, olderThan time.Duration, batchSize int) (int64, error) {
	if err := a.valid(); err != nil {
		return 0, err
	}
	if batchSize <= 0 {
		batchSize = 1000
	}
	cutoff := a.o.now().Add(-olderThan)
	var total int64
	for {
		tag, err := a.o.pool.Exec(ctx, a.o.q.cleanupSent, cutoff, a.tenant, batchSize)
		if err != nil {
			return total, fmt.Errorf("outbox: cleanup sent: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) {
			break
		}
	}
	return total, nil
}

// LastPublished returns when the latest message of the scope published after the instant after was published, as
// the sent ledger records it (by the clock of the relay that published it), or the zero time when none was.
// Discarded dead letters do not count. A progress probe passes its previous answer, so only the newest ledger
// entries are read (the ledger's sent_at index is a BRIN). The zero time looks back in widening windows (a minute,
// an hour, a day, a week; then the whole ledger), so a busy ledger is not read whole to find its newest entry.
func (a *Admin) LastPublished(ctx context.Context, after time.Time) (time.Time, error) {
	if err := a.valid(); err != nil {
		return time.Time{}, err
	}
	windows := []time.Duration{0}
	if after.IsZero() {
		windows = []time.Duration{time.Minute, time.Hour, 24 * time.Hour, 7 * 24 * time.Hour, 0}
	}
	now := a.o.now()
	for _, w := range windows {
		from := after
		if w > 0 {
			from = now.Add(-w)
		}
		var last *time.Time
		if err := a.o.pool.QueryRow(ctx, a.o.q.lastPublished, from, a.tenant).Scan(&last); err != nil {
			return time.Time{}, fmt.Errorf("outbox: last published: %w", err)
		}
		if last != nil {
			return last.UTC(), nil
		}
	}
	return time.Time{}, nil
}

// InboxStats describes the inbox at one instant.
type InboxStats struct {
	// Handled counts remembered (message, handler) pairs handled successfully.
	Handled int64
	// OldestEntryAge is the age of the oldest remembered entry: well beyond the retention you clean up with means
	// cleanup is not running.
	OldestEntryAge time.Duration
	// Failing counts (message, handler) pairs that failed at least once and are neither handled nor dead-lettered.
	Failing int64
	// DeadLettered counts inbox dead letters.
	DeadLettered int64
}

// InboxStats returns the inbox statistics of the scope.
func (a *Admin) InboxStats(ctx context.Context) (InboxStats, error) {
	if err := a.valid(); err != nil {
		return InboxStats{}, err
	}
	var st InboxStats
	var oldest *time.Time
	if err := a.o.pool.QueryRow(ctx, a.o.q.inboxStats, a.tenant).Scan(&st.Handled, &oldest, &st.Failing,
		&st.DeadLettered); err != nil {
		return InboxStats{}, fmt.Errorf("outbox: inbox stats: %w", err)
	}
	if oldest != nil {
		st.OldestEntryAge = max(a.o.now().Sub(*oldest), 0)
	}
	return st, nil
}

// CleanupInbox deletes inbox entries of the scope recorded before olderThan ago (0 means
// DefaultInboxRetention), in batches of batchSize (default 1000), and returns how many it deleted. Keep olderThan
// longer than anything may redeliver a message (see DefaultInboxRetention): a duplicate arriving after its entry is
// gone is handled again.
func (a *Admin) CleanupInbox(ctx context.Context, olderThan time.Duration, batchSize int) (int64, error) {
	if err := a.valid(); err != nil {
		return 0, err
	}
	if olderThan <= 0 {
		olderThan = DefaultInboxRetention
	}
	if batchSize <= 0 {
		batchSize = 1000
	}
	cutoff := a.o.now().Add(-olderThan)
	var total int64
	for {
		tag, err := a.o.pool.Exec(ctx, a.o.q.inboxCleanup, cutoff, a.tenant, batchSize)
		if err != nil {
			return total, fmt.Errorf("outbox: inbox cleanup: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) {
			return total, nil
		}
	}
}

// InboxDeadLetter is a message an inbox handler could not decode or kept failing on.
type InboxDeadLetter struct {
	MessageID   string
	Handler     string
	Tenant      string
	MessageType string
	// Topic is the topic the message was consumed from.
	Topic     string
	Payload   []byte
	Metadata  map[string]string
	Attempts  int
	LastError string
	DeadAt    time.Time
	// PayloadSize is the stored payload's size in bytes: len(Payload), unless InboxListOptions.PayloadLimit cut it.
	PayloadSize int
	// ErrorType and ErrorSignature classify the last error (see ErrorType and ErrorSignature; "unknown" for a dead
	// letter recorded without them): InboxDeadLetterGroups groups by the signature.
	ErrorType, ErrorSignature string
}

// InboxListOptions selects and pages through inbox dead letters, oldest first unless NewestFirst, as ListOptions
// does the outbox's. Its filters also select what CountInboxDeadLetters counts, InboxDeadLetterGroups groups and
// RedriveInboxMatching and DiscardInboxMatching move; every filter left at its zero value selects everything.
type InboxListOptions struct {
	// Limit caps the page. Default 100.
	Limit int
	// Handler keeps only one handler's dead letters. Default: all.
	Handler string
	// ID keeps only the dead letters with this message ID (one per handler that dead-lettered it, and
	// estate-wide per tenant). Default: all.
	ID string
	// IDs keeps only the dead letters with one of these message IDs. Default nil: all; an empty slice that is not
	// nil selects none.
	IDs []string
	// Topic keeps only the dead letters of messages consumed from this topic. Default: all.
	Topic string
	// Type keeps only the dead letters of one message type. Default: all.
	Type string
	// ErrorContains keeps only the dead letters whose last error contains this text, ignoring case (a plain
	// substring). Default: all.
	ErrorContains string
	// Signature keeps only the dead letters whose last error has this signature (InboxDeadLetter.ErrorSignature,
	// a DeadLetterGroup's Signature). Default: all.
	Signature string
	// DeadAfter keeps only the dead letters dead-lettered after this instant, and DeadBefore those dead-lettered at
	// or before it. Default zero: no bound.
	DeadAfter, DeadBefore time.Time
	// NewestFirst pages from the newest dead letter back. Default false: oldest first.
	NewestFirst bool
	// PayloadLimit, when positive, returns at most this many bytes of each payload (InboxDeadLetter.PayloadSize
	// tells the whole size). Default 0: whole payloads.
	PayloadLimit int
	// TextLimit, when positive, returns at most this many characters of each last error and no metadata (nil), so
	// a list reads neither whole however large they are. Default 0: both whole.
	TextLimit int
	// After continues after the last item of the previous page.
	After *InboxDeadLetter
	// RedriveTopic is the topic a redrive stages copies for when a dead letter has none recorded (a handler run
	// outside a Watermill router); only RedriveInboxMatching reads it. Default "": a dead letter with no topic
	// fails the redrive.
	RedriveTopic string
}

// inboxFilter returns the arguments of the inbox_dead_where fragment ($1 to $9) for the scope and the options.
func (a *Admin) inboxFilter(opts InboxListOptions) []any {
	ids := opts.IDs
	if opts.ID != "" {
		if ids == nil || slices.Contains(ids, opts.ID) {
			ids = []string{opts.ID}
		} else {
			ids = []string{}
		}
	}
	return []any{a.tenant, nonEmpty(opts.Handler), ids, nonEmpty(opts.Topic), nonEmpty(opts.Type),
		containsPattern(opts.ErrorContains), nonZero(opts.DeadAfter), nonZero(opts.DeadBefore),
		nonEmpty(opts.Signature)}
}

// InboxDeadLetters lists the inbox dead letters of the scope that opts selects, oldest first (newest first with
// opts.NewestFirst).
func (a *Admin) InboxDeadLetters(ctx context.Context, opts InboxListOptions) ([]InboxDeadLetter, error) {
	if err := a.valid(); err != nil {
		return nil, err
	}
	if opts.Limit <= 0 {
		opts.Limit = 100
	}
	var afterAt any = keysetStart(opts.NewestFirst)
	var afterID, afterHandler, afterTenant string
	if opts.After != nil {
		afterAt, afterID, afterHandler, afterTenant = opts.After.DeadAt, opts.After.MessageID, opts.After.Handler,
			opts.After.Tenant
	}
	args := append(a.inboxFilter(opts), afterAt, afterID, afterHandler, afterTenant, opts.Limit,
		max(opts.PayloadLimit, 0), max(opts.TextLimit, 0))
	rows, err := a.o.pool.Query(ctx, a.o.q.inboxListDead[direction(opts.NewestFirst)], args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: inbox dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanInboxDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("outbox: inbox dead letters: %w", err)
	}
	if opts.TextLimit > 0 {
		for i := range out {
			out[i].Metadata = nil // not read
		}
	}
	return out, nil
}

// CountInboxDeadLetters counts the inbox dead letters of the scope that opts selects (its Limit, After, order and
// PayloadLimit do not matter).
func (a *Admin) CountInboxDeadLetters(ctx context.Context, opts InboxListOptions) (int64, error) {
	if err := a.valid(); err != nil {
		return 0, err
	}
	var n int64
	if err := a.o.pool.QueryRow(ctx, a.o.q.inboxCountDead, a.inboxFilter(opts)...).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: count inbox dead letters: %w", err)
	}
	return n, nil
}

// DiscardInbox deletes the inbox dead letters of the scope with the given message IDs (of every handler that
// dead-lettered them) for good, and returns how many it deleted. The inbox entries stay, so redeliveries of the
// messages are still skipped until cleanup. Unknown IDs are reported as by Redrive: the known ones are discarded
// and the error is an *UnknownIDsError naming the others.
func (a *Admin) DiscardInbox(ctx context.Context, ids ...string) (int, error) {
	if err := a.valid(); err != nil {
		return 0, err
	}
	return a.byIDs("inbox discard", ids, func(ids []string) (int, map[string]struct{}, error) {
		return a.discardInbox(ctx, InboxListOptions{IDs: ids})
	})
}

// DiscardInboxMatching deletes, as DiscardInbox does, every inbox dead letter of the scope that opts selects and
// that was dead-lettered at or before the call (Limit, After and order do not matter), in transactions of a few
// hundred, and returns how many it deleted; after an error, the count is what earlier transactions deleted.
func (a *Admin) DiscardInboxMatching(ctx context.Context, opts InboxListOptions) (int, error) {
	if err := a.valid(); err != nil {
		return 0, err
	}
	n, _, err := a.discardInbox(ctx, opts)
	return n, err
}

func (a *Admin) discardInbox(ctx context.Context, opts InboxListOptions) (int, map[string]struct{}, error) {
	if now := a.o.now(); opts.DeadBefore.IsZero() || opts.DeadBefore.After(now) {
		opts.DeadBefore = now
	}
	args := append(a.inboxFilter(opts), matchBatch)
	total, moved := 0, map[string]struct{}{}
	for {
		rows, err := a.o.pool.Query(ctx, a.o.q.inboxDiscardWhere, args...)
		var ids []string
		if err == nil {
			ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			return total, moved, fmt.Errorf("outbox: discard inbox dead letters (after %d discarded): %w", total, err)
		}
		total += len(ids)
		for _, id := range ids {
			moved[id] = struct{}{}
		}
		if len(ids) < matchBatch {
			return total, moved, nil
		}
	}
}

// byIDs runs an operation on the dead letters with the given IDs (sorted, each once) and reports the IDs it found
// no dead letter for as an *UnknownIDsError.
func (a *Admin) byIDs(op string, ids []string, run func(ids []string) (int, map[string]struct{}, error)) (int,
	error) {
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	if len(ids) == 0 {
		return 0, nil
	}
	n, moved, err := run(ids)
	if err != nil {
		return n, err
	}
	var unknown []string
	for _, id := range ids {
		if _, ok := moved[id]; !ok {
			unknown = append(unknown, id)
		}
	}
	if len(unknown) > 0 {
		return n, &UnknownIDsError{Op: op, IDs: unknown, Requested: len(ids)}
	}
	return n, nil
}
