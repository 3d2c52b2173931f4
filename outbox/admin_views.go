package outbox

import (
	"cmp"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/lease"
	"github.com/stagehand-es/stagehand/internal/logfollow"
)

// The operator views: where the backlog is, what waits and why, which relay holds what, and what the pipeline did
// over a window of time. Every view reads through an index or the hot outbox table (which holds only messages
// still to publish), so it stays fast on an outbox with a sent ledger of millions of entries.

// GroupBy is how PendingGroups groups the pending messages.
type GroupBy int

const (
	// ByTopic groups pending messages by destination topic.
	ByTopic GroupBy = iota
	// ByTenant groups pending messages by tenant.
	ByTenant
	// ByKey groups pending messages by (tenant, partition key); unordered messages share the empty key.
	ByKey
)

// String returns "topic", "tenant" or "key".
func (g GroupBy) String() string {
	switch g {
	case ByTopic:
		return "topic"
	case ByTenant:
		return "tenant"
	case ByKey:
		return "key"
	}
	return "GroupBy(" + strconv.Itoa(int(g)) + ")"
}

// PendingGroup is a group of pending messages (see PendingGroups).
type PendingGroup struct {
	// Tenant, Topic and Key name the group: those its GroupBy names are set, the others empty (Key is empty
	// for the group of unordered messages too).
	Tenant, Topic, Key string
	// Pending counts the group's messages still to publish, scheduled ones included.
	Pending int64
	// Scheduled counts those whose scheduled time is still ahead; BackingOff those waiting for a retry after a
	// rejection; Parked those waiting behind an earlier message of their key (pending or dead-lettered); InFlight
	// those a relay holds now.
	Scheduled, BackingOff, Parked, InFlight int64
	// OldestDueAt is when the group's oldest due message became due (zero when none is due).
	OldestDueAt time.Time
	// MaxAttempts is the most rejected attempts of any of its messages.
	MaxAttempts int
}

// PendingGroups returns the scope's pending messages grouped by topic, tenant or (tenant, key), the largest groups
// first, at most limit (default 100): where a backlog sits. It scans the outbox table, which holds only messages
// still to publish.
func (a *Admin) PendingGroups(ctx context.Context, by GroupBy, limit int) ([]PendingGroup, error) {
	if err := a.valid(); err != nil {
		return nil, err
	}
	if by < ByTopic || by > ByKey {
		return nil, fmt.Errorf("outbox: pending groups: unknown grouping %v", by)
	}
	if limit <= 0 {
		limit = 100
	}
	rows, err := a.o.pool.Query(ctx, a.o.q.pendingGroups[by], a.tenant, a.o.now(), limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: pending groups: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PendingGroup, error) {
		var g PendingGroup
		var oldest *time.Time
		err := r.Scan(&g.Tenant, &g.Topic, &g.Key, &g.Pending, &g.Scheduled, &g.BackingOff, &g.Parked, &g.InFlight,
			&oldest, &g.MaxAttempts)
		if oldest != nil {
			g.OldestDueAt = oldest.UTC()
		}
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: pending groups: %w", err)
	}
	return out, nil
}

// PendingMessage is a message still to publish, as the operator views list it (without its payload).
type PendingMessage struct {
	// Row is the outbox row's identity (a page continues after it).
	Row                                   int64
	ID, Tenant, Topic, Type, PartitionKey string
	// Sequence is the message's place in its key (0 when unordered).
	Sequence int64
	// Attempts counts rejected attempts; LastError is the last one's error.
	Attempts  int
	LastError string
	// ScheduledAt is the scheduled time (zero when none); NextAttemptAt when a relay may claim it next (the year
	// 9999 while it waits behind an earlier message of its key); CreatedAt when it was staged.
	ScheduledAt, NextAttemptAt, CreatedAt time.Time
	// Parked is true while it waits behind an earlier message of its key.
	Parked bool
	// LeaseOwner is the relay holding it, until LeaseExpiresAt (empty and zero when none holds it).
	LeaseOwner     string
	LeaseExpiresAt time.Time
	// PayloadSize is the payload's size in bytes.
	PayloadSize int
	// SourcePosition is the log position of the event it was staged from (0 when none).
	SourcePosition int64
}

// parkedUntil is what the operator views show as the next attempt of a parked message ('infinity' in the table).
var parkedUntil = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

func scanPending(r pgx.CollectableRow) (PendingMessage, error) {
	var (
		m                    PendingMessage
		seq, pos             *int64
		scheduled, leaseEnds *time.Time
		next                 pgtype.Timestamptz
	)
	err := r.Scan(&m.Row, &m.ID, &m.Tenant, &m.Topic, &m.Type, &m.PartitionKey, &seq, &m.Attempts, &m.LastError,
		&scheduled, &next, &m.CreatedAt, &m.LeaseOwner, &leaseEnds, &m.PayloadSize, &pos)
	if seq != nil {
		m.Sequence = *seq
	}
	if pos != nil {
		m.SourcePosition = *pos
	}
	if scheduled != nil {
		m.ScheduledAt = scheduled.UTC()
	}
	if leaseEnds != nil {
		m.LeaseExpiresAt = leaseEnds.UTC()
	}
	if next.InfinityModifier == pgtype.Infinity {
		m.NextAttemptAt, m.Parked = parkedUntil, true
	} else {
		m.NextAttemptAt = next.Time.UTC()
	}
	m.CreatedAt = m.CreatedAt.UTC()
	return m, err
}

// ScheduledMessages lists the scope's scheduled messages whose time is still ahead, soonest first, at most limit
// (default 100), continuing after the last message of the previous page (nil: from the start). It reads through
// the claim index.
func (a *Admin) ScheduledMessages(ctx context.Context, limit int, after *PendingMessage) ([]PendingMessage, error) {
	if err := a.valid(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	var afterAt any = keysetStart(false)
	var afterRow int64
	if after != nil {
		afterAt, afterRow = after.NextAttemptAt, after.Row
	}
	rows, err := a.o.pool.Query(ctx, a.o.q.listScheduled, a.tenant, a.o.now(), afterAt, afterRow, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: scheduled messages: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanPending)
	if err != nil {
		return nil, fmt.Errorf("outbox: scheduled messages: %w", err)
	}
	return out, nil
}

// KeyMessages lists the pending messages of the partition key of tenant ("" is stagehand.NoTenant) in their
// order, the key's head first, at most limit (default 100), continuing after the sequence number afterSeq (0: from
// the head). A tenant's scope lists only its own keys; another tenant's key is empty. Unordered messages have no
// key order and are not listed.
func (a *Admin) KeyMessages(ctx context.Context, tenant, key string, limit int, afterSeq int64) ([]PendingMessage,
	error) {
	if err := a.valid(); err != nil {
		return nil, err
	}
	tenant = stagehand.NormalizeTenant(tenant)
	if err := stagehand.ValidateTenant(tenant); err != nil {
		return nil, fmt.Errorf("outbox: messages of key %q: %w", key, err)
	}
	if a.tenant != nil && *a.tenant != tenant {
		return nil, nil
	}
	if limit <= 0 {
		limit = 100
	}
	rows, err := a.o.pool.Query(ctx, a.o.q.keyMessages, tenant, key, afterSeq, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: messages of key %q: %w", key, err)
	}
	out, err := pgx.CollectRows(rows, scanPending)
	if err != nil {
		return nil, fmt.Errorf("outbox: messages of key %q: %w", key, err)
	}
	return out, nil
}

// HeldKey is a partition key a dead letter holds: its later messages wait until the dead letter is redriven or
// discarded.
type HeldKey struct {
	Tenant, Key string
	// MessageID, Topic, Type, Sequence, Attempts, LastError and DeadAt describe the dead letter holding the key.
	MessageID, Topic, Type string
	Sequence               int64
	Attempts               int
	LastError              string
	DeadAt                 time.Time
	// Waiting counts the key's pending messages behind it.
	Waiting int64
}

// HeldKeys lists the scope's dead letters that hold their key, oldest first, each with how many messages wait
// behind it, at most limit (default 100), continuing after the last item of the previous page (nil: from the
// start).
func (a *Admin) HeldKeys(ctx context.Context, limit int, after *HeldKey) ([]HeldKey, error) {
	if err := a.valid(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	var afterAt any = keysetStart(false)
	var afterTenant, afterKey, afterID, afterTopic string
	if after != nil {
		afterAt, afterTenant, afterKey, afterID, afterTopic = after.DeadAt, after.Tenant, after.Key, after.MessageID,
			after.Topic
	}
	rows, err := a.o.pool.Query(ctx, a.o.q.heldKeys, a.tenant, afterAt, afterTenant, afterKey, afterID, afterTopic,
		limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: held keys: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (HeldKey, error) {
		var h HeldKey
		err := r.Scan(&h.Tenant, &h.Key, &h.MessageID, &h.Topic, &h.Type, &h.Sequence, &h.Attempts, &h.LastError,
			&h.DeadAt, &h.Waiting)
		h.DeadAt = h.DeadAt.UTC()
		return h, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: held keys: %w", err)
	}
	return out, nil
}

// RelayClaims is what one relay (a lease owner) holds of the outbox now.
type RelayClaims struct {
	// Owner is the relay's lease owner: its ProcessorID and a random suffix.
	Owner string
	// Rows counts the messages it holds; their leases lapse between FirstExpiry and LastExpiry.
	Rows                    int64
	FirstExpiry, LastExpiry time.Time
}

// InFlight lists the relays holding messages of the scope now, with how many each holds.
func (a *Admin) InFlight(ctx context.Context) ([]RelayClaims, error) {
	if err := a.valid(); err != nil {
		return nil, err
	}
	rows, err := a.o.pool.Query(ctx, a.o.q.inFlight, a.o.now(), a.tenant)
	if err != nil {
		return nil, fmt.Errorf("outbox: messages in flight: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RelayClaims, error) {
		var c RelayClaims
		err := r.Scan(&c.Owner, &c.Rows, &c.FirstExpiry, &c.LastExpiry)
		c.FirstExpiry, c.LastExpiry = c.FirstExpiry.UTC(), c.LastExpiry.UTC()
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: messages in flight: %w", err)
	}
	return out, nil
}

// RelayLease is a lease of leader-elected relays (RelayConfig.LeaderElection): the leadership of the outbox, of
// one of its partitions, or a membership slot that partitioned relays count each other by.
type RelayLease struct {
	// Name is the lease's name; Election the LeaderElection it belongs to.
	Name, Election string
	// Partition is the partition the lease leads (-1 for the leadership of an unpartitioned relay and for a
	// membership slot).
	Partition int
	// Member is true for a membership slot (Election + "/members/" + a number).
	Member bool
	// Owner is the relay holding it (or that held it last); Token its fencing token; Held whether it is held now.
	Owner string
	Token int64
	Held  bool
	// ExpiresAt is when it lapses unless renewed; AcquiredAt when Owner took it; RenewedAt its last renewal.
	ExpiresAt, AcquiredAt, RenewedAt time.Time
}

var (
	memberLease    = regexp.MustCompile(`^(.+)/members/(\d+)$`)
	partitionLease = regexp.MustCompile(`^(.+)/(\d+)$`)
)

// RelayLeases lists the leases of leader-elected relays in the schema (estate-wide: leases belong to no tenant),
// by name: every lease of the schema's lease table that is neither a log follower's (projections, staging
// workers) nor the maintainer's. A name ending in "/members/N" is read as a membership slot, one ending in "/N"
// as partition N's leadership, so a LeaderElection name that itself ends in "/N" reads as a partition.
func (o *Outbox) RelayLeases(ctx context.Context) ([]RelayLease, error) {
	infos, err := lease.List(ctx, o.pool, o.schema, "")
	if err != nil {
		return nil, fmt.Errorf("outbox: relay leases: %w", err)
	}
	var out []RelayLease
	for _, in := range infos {
		if strings.HasPrefix(in.Name, logfollow.LeasePrefix) || in.Name == MaintenanceLease {
			continue
		}
		l := RelayLease{Name: in.Name, Election: in.Name, Partition: -1, Owner: in.Owner, Token: in.Token,
			Held: in.Held, ExpiresAt: in.ExpiresAt, AcquiredAt: in.AcquiredAt, RenewedAt: in.RenewedAt}
		if m := memberLease.FindStringSubmatch(in.Name); m != nil {
			l.Election, l.Member = m[1], true
		} else if m := partitionLease.FindStringSubmatch(in.Name); m != nil {
			if p, err := strconv.Atoi(m[2]); err == nil {
				l.Election, l.Partition = m[1], p
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// Activity is what the outbox, the sent ledger and the inbox of a scope recorded in a window of time, and the
// backlog at its end: the counters a console turns into rates. Every figure is read from the tables, so it
// counts the work of every process.
type Activity struct {
	// From and To bound the window (From excluded).
	From, To time.Time
	// Staged counts messages staged in the window (by their staging time), whether pending, published or
	// dead-lettered since.
	Staged int64
	// Published counts publications (the relays' acknowledgements recorded in the ledger); DeadLettered the
	// messages the relays dead-lettered.
	Published, DeadLettered int64
	// Handled counts messages inbox handlers handled; InboxDeadLettered those they dead-lettered; InboxFailures
	// the (message, handler) pairs whose latest failed attempt falls in the window.
	Handled, InboxDeadLettered, InboxFailures int64
	// Pending counts the messages due and not yet published at To; OldestPendingAt is when the oldest of them
	// became due (zero when none).
	Pending         int64
	OldestPendingAt time.Time
}

// Activity returns what the scope recorded in the window (from, to]. Times are those the writing processes
// recorded by their clocks (staging, publication, handling), so a window that ends in the last second or two may
// still miss work that commits late.
func (a *Admin) Activity(ctx context.Context, from, to time.Time) (Activity, error) {
	if err := a.valid(); err != nil {
		return Activity{}, err
	}
	act := Activity{From: from, To: to}
	var sentStaged, pendingStaged, deadStaged int64
	var oldest *time.Time
	if err := a.o.pool.QueryRow(ctx, a.o.q.activity, from, to, a.tenant).Scan(&sentStaged, &pendingStaged,
		&deadStaged, &act.Published, &act.DeadLettered, &act.Handled, &act.InboxDeadLettered, &act.InboxFailures,
		&act.Pending, &oldest); err != nil {
		return Activity{}, fmt.Errorf("outbox: activity: %w", err)
	}
	act.Staged = sentStaged + pendingStaged + deadStaged
	if oldest != nil {
		act.OldestPendingAt = oldest.UTC()
	}
	return act, nil
}

// Passage is one message's way through the pipeline, as the ledger and the inbox record it: when it was staged,
// published and (for RecentlyHandled) handled, by the clocks of the processes that did each.
type Passage struct {
	MessageID, Tenant, Topic string
	// Handler is the inbox handler that handled it (empty for RecentlyPublished).
	Handler string
	// SourcePosition is the log position of the event it was staged from (0 when none).
	SourcePosition int64
	// StagedAt, PublishedAt and HandledAt (zero for RecentlyPublished) are the times of each step.
	StagedAt, PublishedAt, HandledAt time.Time
}

// RecentlyPublished returns the scope's latest publications after since, newest first, at most limit (default
// 100): each message's staging and publication times, for latency figures.
func (a *Admin) RecentlyPublished(ctx context.Context, since time.Time, limit int) ([]Passage, error) {
	if err := a.valid(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	rows, err := a.o.pool.Query(ctx, a.o.q.recentlyPublished, since, a.tenant, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: recent publications: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Passage, error) {
		var d Passage
		err := r.Scan(&d.MessageID, &d.Tenant, &d.Topic, &d.SourcePosition, &d.StagedAt, &d.PublishedAt)
		d.StagedAt, d.PublishedAt = d.StagedAt.UTC(), d.PublishedAt.UTC()
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: recent publications: %w", err)
	}
	return out, nil
}

// RecentlyHandled returns the scope's latest inbox handlings after since, newest first, each with when its message
// was staged and published as this outbox's ledger records them: of the latest limit handlings (default 100), those
// whose message has a ledger entry here (a message the inbox received from another database's outbox has none, and
// is left out).
func (a *Admin) RecentlyHandled(ctx context.Context, since time.Time, limit int) ([]Passage, error) {
	if err := a.valid(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	rows, err := a.o.pool.Query(ctx, a.o.q.recentlyHandled, since, a.tenant, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: recent handlings: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Passage, error) {
		var d Passage
		err := r.Scan(&d.MessageID, &d.Tenant, &d.Topic, &d.Handler, &d.SourcePosition, &d.StagedAt,
			&d.PublishedAt, &d.HandledAt)
		d.StagedAt, d.PublishedAt, d.HandledAt = d.StagedAt.UTC(), d.PublishedAt.UTC(), d.HandledAt.UTC()
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: recent handlings: %w", err)
	}
	return out, nil
}

// Message states of a StagedMessage.
const (
	StatePending      = "pending"
	StateDeadLettered = "dead-lettered"
	StateSent         = "sent"
	StateDiscarded    = "discarded"
)

// StagedMessage is a message staged from an event of the log, and what became of it.
type StagedMessage struct {
	// SourcePosition is the log position of the event it was staged from.
	SourcePosition          int64
	ID, Tenant, Topic, Type string
	// State is StatePending, StateDeadLettered, StateSent or StateDiscarded (sent and discarded messages are
	// known until the ledger's retention removes them).
	State string
	// StagedAt is when it was staged; DoneAt when it was published, discarded or dead-lettered (zero while
	// pending).
	StagedAt, DoneAt time.Time
	// Attempts counts rejected attempts (for a sent message: every attempt); LastError is the last rejection's
	// error (pending and dead-lettered messages).
	Attempts  int
	LastError string
	// Handled lists the inbox entries of this database for the message: which handlers handled or
	// dead-lettered it, and when.
	Handled []InboxEntry
}

// InboxEntry is an inbox handler's record of a message.
type InboxEntry struct {
	Handler string
	// Outcome is "handled" or "dead-lettered".
	Outcome string
	At      time.Time
}

// StagedFrom returns the messages of the scope staged from the events at the given log positions (from the outbox,
// its dead letters and the sent ledger), by position, with the inbox entries of this database for each: what
// became of an event's messages. It reads the ledger through its index on source positions; keep the positions
// close together (one stream's page of events), since the index skips by range.
func (a *Admin) StagedFrom(ctx context.Context, positions []int64) ([]StagedMessage, error) {
	if err := a.valid(); err != nil {
		return nil, err
	}
	if len(positions) == 0 {
		return nil, nil
	}
	lo, hi := positions[0], positions[0]
	for _, p := range positions {
		lo, hi = min(lo, p), max(hi, p)
	}
	rows, err := a.o.pool.Query(ctx, a.o.q.stagedFrom, positions, lo, hi, a.tenant)
	if err != nil {
		return nil, fmt.Errorf("outbox: messages staged from events: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StagedMessage, error) {
		var m StagedMessage
		var done *time.Time
		err := r.Scan(&m.State, &m.SourcePosition, &m.ID, &m.Tenant, &m.Topic, &m.Type, &m.StagedAt, &done,
			&m.Attempts, &m.LastError)
		m.StagedAt = m.StagedAt.UTC()
		if done != nil {
			m.DoneAt = done.UTC()
		}
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: messages staged from events: %w", err)
	}
	if len(out) == 0 {
		return out, nil
	}
	ids := make([]string, 0, len(out))
	for _, m := range out {
		ids = append(ids, m.ID)
	}
	rows, err = a.o.pool.Query(ctx, a.o.q.inboxEntries, ids, a.tenant)
	if err != nil {
		return nil, fmt.Errorf("outbox: inbox entries: %w", err)
	}
	type idKey struct{ tenant, id string }
	entries := map[idKey][]InboxEntry{}
	for rows.Next() {
		var id, tenant string
		var e InboxEntry
		if err := rows.Scan(&id, &tenant, &e.Handler, &e.Outcome, &e.At); err != nil {
			rows.Close()
			return nil, fmt.Errorf("outbox: inbox entries: %w", err)
		}
		e.At = e.At.UTC()
		entries[idKey{tenant, id}] = append(entries[idKey{tenant, id}], e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: inbox entries: %w", err)
	}
	for i := range out {
		out[i].Handled = entries[idKey{out[i].Tenant, out[i].ID}]
	}
	slices.SortStableFunc(out, func(a, b StagedMessage) int {
		return cmp.Or(cmp.Compare(a.SourcePosition, b.SourcePosition), strings.Compare(a.Topic, b.Topic),
			strings.Compare(a.ID, b.ID))
	})
	return out, nil
}
