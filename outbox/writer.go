package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/jsonmeta"
)

// Stage stages msgs in one transaction of its own, sends a wake-up notification after the commit, and returns how
// many rows it inserted (a message whose ID its tenant already staged for its topic inserts nothing; the same ID
// from another tenant is another message).
func (o *Outbox) Stage(ctx context.Context, msgs ...Message) (int, error) {
	n, err := o.StageTx(ctx, o.pool, msgs...)
	if err != nil {
		return 0, err
	}
	if n > 0 {
		o.Notify()
	}
	return n, nil
}

// StageTx stages msgs on db, typically the caller's business transaction (a pgx.Tx), and returns how many rows it
// inserted. The rows become visible when that transaction commits, and vanish if it rolls back. StageTx cannot see
// the commit: call Notify after committing for low latency, or let relays find the rows at their next poll.
//
// Given a pool or a connection instead, StageTx runs its statements in one implicit transaction of their own.
//
// Messages with a partition key take the next sequence numbers of their key, and the key stays locked (a
// transaction-scoped advisory lock) until db's transaction ends: another transaction staging the same key waits, so
// sequence order is staging-commit order. Deduplication of an ID that a relay is moving to the sent ledger at that
// very moment relies on READ COMMITTED isolation (the PostgreSQL default).
//
// A message without a trace context in its metadata takes the one of the span in ctx (traceparent, tracestate), so
// the relay and the consumer continue the caller's trace. The rows inserted are counted
// (stagehand.messages.staged) when StageTx returns, even if db's transaction rolls back later.
func (o *Outbox) StageTx(ctx context.Context, db DB, msgs ...Message) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	if db == nil {
		return 0, invalidMessage("nil database handle")
	}
	b := &pgx.Batch{}
	staged, err := o.QueueStage(ctx, b, nil, msgs...)
	if err != nil {
		return 0, err
	}
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return 0, fmt.Errorf("outbox: stage %d message(s): %w", len(msgs), err)
	}
	return staged.Count(), nil
}

// StageOptions adjust QueueStage. The zero value (or nil) stages like StageTx.
type StageOptions struct {
	// NewIDs declares that no message ID of the call can have been staged before, by anyone: for example, IDs
	// derived from an event appended in the same transaction, whose (stream, version) the event store's unique
	// index gives to this transaction alone. Staging then skips its checks against the sent ledger, the dead
	// letters and the pending messages: an ID that is pending after all fails the staging with a unique
	// violation. Default false. Wrong, it lets a message re-staged after it was sent be published again.
	NewIDs bool
	// EndsTransaction declares that only the end of the transaction follows the queued statements (the caller
	// queues its COMMIT right after them), so the transaction-local settings staging uses for its own statements
	// need not be put back. Default false: they are restored for the caller's next statements.
	EndsTransaction bool
	// Source, when set, gives the positions of an append made earlier in the same transaction by a PostgreSQL
	// event store (eventstore.Queued.Positions): each message's CausationID is the ID of its event, and its
	// SourcePosition is read in SQL, written by the event store, so the staging can be queued before the append's
	// positions are known (in the append's round trip). Default nil: messages are staged as given.
	Source *eventstore.AppendedPositions
	// Watermark, when set, names a watermark (RegisterWatermarkTx) whose owner stages the same messages from the
	// event log: a message whose SourcePosition is at or below it is left out (the owner has staged it already,
	// and cleanup may have forgotten its publication since, so staging it again could publish it twice), and the
	// watermark's row is locked (FOR SHARE) until the transaction ends, before any key lock, so the owner cannot
	// move past the messages staged here before they commit. The owner must take the row before its key locks
	// too (AdvanceWatermarkTx, then StageTx), or the two can deadlock. A watermark not registered yet leaves
	// nothing out. Not with NewIDs or Source. Default "".
	Watermark string
	// AsyncCommit makes the transaction commit without waiting for its WAL to reach disk (synchronous_commit off,
	// for that transaction alone): a crash of the database server in the next fraction of a second (the WAL
	// writer's delay) can lose the staging after the caller saw it commit. A crash of the caller's process loses
	// nothing. Only for staging that something else repeats when it is lost, such as the save path of
	// staging.EventuallyConsistent, whose reconciler stages, from the log, every event past its durable
	// watermark (see Watermark): any later durable commit on the server, the watermark's advance included,
	// makes an earlier asynchronous one durable too. Default false.
	AsyncCommit bool
}

// Staged reports what queued staging statements did, once the batch holding them has been sent and its results
// read (BatchResults.Close).
type Staged struct{ n int }

// Count is how many rows the staging inserted (a message already pending, sent or dead-lettered inserts none, nor
// does one that StageOptions.Watermark leaves out).
func (s *Staged) Count() int { return s.n }

// QueueStage queues, onto b, the statements that stage msgs, so they share a round trip with the caller's own
// statements of the same transaction (a pgx.Batch is sent in one round trip). It validates msgs and fills their
// defaults from ctx (as StageTx does) before queuing anything: an invalid message returns an error and queues
// nothing. The statements register result callbacks on b, which run when the batch's results are closed; the
// returned Staged holds the count from then on, and stagehand.messages.staged is counted there.
//
// Everything StageTx says about locks, order and deduplication holds for the transaction that runs b.
func (o *Outbox) QueueStage(ctx context.Context, b *pgx.Batch, opts *StageOptions, msgs ...Message) (*Staged,
	error) {
	var opt StageOptions
	if opts != nil {
		opt = *opts
	}
	staged := &Staged{}
	if opt.Watermark != "" && (opt.NewIDs || opt.Source != nil) {
		return nil, &ConfigError{Package: "outbox", Component: "StageOptions", Field: "Watermark",
			Reason: "cannot be combined with NewIDs or Source"}
	}
	if len(msgs) == 0 {
		return staged, nil
	}
	a, err := o.stageArgs(ctx, msgs)
	if err != nil {
		return nil, err
	}
	settings := o.queueStagePrelude(b, &opt, &a)
	st := o.q.staging
	if opt.Source != nil {
		if st, err = o.sourcedStatements(opt.Source); err != nil {
			return nil, err
		}
	}
	stmt, args := stagingStatement(st, &opt, &a)
	b.Queue(stmt, args...).Exec(func(ct pgconn.CommandTag) error {
		staged.n += int(ct.RowsAffected())
		return nil
	})
	if !opt.NewIDs {
		// The recheck (see stageRecheckOne) follows unless the IDs are new by construction.
		recheck, recheckArgs := o.q.stageRecheckMany, []any{a.ids, a.topics, a.tenants}
		if len(a.ids) == 1 {
			recheck, recheckArgs = o.q.stageRecheckOne, []any{a.ids[0], a.topics[0], a.tenants[0]}
		}
		b.Queue(recheck, recheckArgs...).Exec(func(ct pgconn.CommandTag) error {
			staged.n -= int(ct.RowsAffected())
			return nil
		})
	}
	o.queueStageEnd(ctx, b, staged, settings && !opt.EndsTransaction)
	return staged, nil
}

// queueStagePrelude queues what goes before the staging statement: the asynchronous commit, the watermark's row
// lock, and the transaction-local settings the staging statements run under (generic plans, index access only: see
// stagePrelude) with the key locks, saving the caller's settings first unless the transaction ends with the staging.
// A single message staged at the end of its transaction needs only generic plans (lockKeyGeneric): its statements
// take scalar arguments and every probe has an index that fits it exactly. It reports whether the settings were
// changed.
func (o *Outbox) queueStagePrelude(b *pgx.Batch, opt *StageOptions, a *stageArgs) bool {
	if opt.AsyncCommit {
		b.Queue(o.q.asyncCommit)
	}
	if opt.Watermark != "" {
		b.Queue(o.q.watermarkForShare, opt.Watermark) // before the key locks (see Watermark)
	}
	settings := len(a.ids) > 1 || !opt.EndsTransaction && len(a.locks) > 0
	switch {
	case settings:
		if !opt.EndsTransaction {
			b.Queue(o.q.stageSave)
		}
		b.Queue(o.q.stagePrelude, a.locks)
	case len(a.locks) == 1:
		b.Queue(o.q.lockKeyGeneric, a.locks[0])
	}
	return settings
}

// stagingStatement picks the staging statement of st for the call, and its arguments: one message goes with scalar
// arguments, several with arrays; the variant follows the options (new IDs, the append's last event as the cause,
// a watermark).
func stagingStatement(st stagingStatements, opt *StageOptions, a *stageArgs) (string, []any) {
	if len(a.ids) != 1 {
		many := st.many
		switch {
		case opt.NewIDs:
			many = st.manyNew
		case opt.Watermark != "":
			many = st.manyAfter
		}
		if opt.Source != nil {
			a.many.LastEventID = opt.Source.LastEventID
		}
		a.many.Watermark = opt.Watermark
		return many.SQL, many.Args(&a.many)
	}
	one := st.one
	switch {
	case opt.NewIDs && opt.Source != nil && a.one.Causation == opt.Source.LastEventID:
		// Caused by the append's last event (the usual case): no lookup by event ID in the statement.
		one = st.oneLastNew
	case opt.Source != nil && a.one.Causation == opt.Source.LastEventID:
		one = st.oneLast
	case opt.NewIDs:
		one = st.oneNew
	case opt.Watermark != "":
		one = st.oneAfter
	}
	if opt.Source != nil {
		a.one.LastEventID = opt.Source.LastEventID
	}
	a.one.Watermark = opt.Watermark
	return one.SQL, one.Args(&a.one)
}

// queueStageEnd puts the caller's settings back when restore is set, and counts the staged messages once every
// statement of the staging has run (the last one's callback runs last).
func (o *Outbox) queueStageEnd(ctx context.Context, b *pgx.Batch, staged *Staged, restore bool) {
	last := b.QueuedQueries[len(b.QueuedQueries)-1]
	if restore {
		last = b.Queue(o.q.stageRestore)
	}
	prev := last.Fn
	last.Fn = func(br pgx.BatchResults) error {
		var err error
		if prev != nil {
			err = prev(br)
		} else {
			_, err = br.Exec()
		}
		if err == nil {
			o.countStaged(ctx, staged.n)
		}
		return err
	}
}

// sourcedStatements returns the staging statements that take source positions from an event store's append
// (StageOptions.Source), written once per set of positions (src.Key).
func (o *Outbox) sourcedStatements(src *eventstore.AppendedPositions) (stagingStatements, error) {
	if st, ok := o.sourced.Load(src.Key); ok {
		return st.(stagingStatements), nil
	}
	st, err := o.q.stagingStatements(src)
	if err != nil {
		return stagingStatements{}, err
	}
	cached, _ := o.sourced.LoadOrStore(src.Key, st)
	return cached.(stagingStatements), nil
}

type stageArgs struct {
	// one: the parameters of a single message's staging; many: those of several messages'.
	one                  stageOne
	many                 stageMany
	ids, topics, tenants []string
	// locks are the advisory locks of the distinct ordered (tenant, key) pairs, ascending (the order they are
	// taken in).
	locks []int64
}

// stagedRow is one message's column values, validated and with its defaults filled.
type stagedRow struct {
	id, typ, topic, meta, tenant, corr, cause, key string
	payload                                        []byte
	pos                                            *int64
	sched                                          *time.Time
}

// row validates msg (the i-th of a call) and fills its defaults from ctx (traceCtx: ctx's trace headers).
func (o *Outbox) row(ctx context.Context, i int, m *Message, traceCtx map[string]string) (stagedRow, error) {
	if m.ID == "" {
		return stagedRow{}, invalidMessage("message %d: ID is empty", i)
	}
	if strings.TrimSpace(m.Topic) == "" {
		return stagedRow{}, invalidMessage("message %q: Topic is empty", m.ID)
	}
	tenant := m.Tenant
	if tenant == "" {
		tenant = stagehand.TenantFrom(ctx)
	}
	tenant = stagehand.NormalizeTenant(tenant)
	if err := checkMessage(i, m, tenant); err != nil {
		return stagedRow{}, err
	}
	r := stagedRow{id: m.ID, typ: m.Type, topic: m.Topic, tenant: tenant, key: m.PartitionKey,
		meta:    jsonmeta.Encode(withTraceContext(m.Metadata, traceCtx)),
		corr:    firstNonEmpty(m.CorrelationID, stagehand.CorrelationIDFrom(ctx)),
		cause:   firstNonEmpty(m.CausationID, stagehand.CausationIDFrom(ctx)),
		payload: m.Payload}
	if r.payload == nil {
		r.payload = []byte{}
	}
	if m.SourcePosition != 0 {
		p := m.SourcePosition
		r.pos = &p
	}
	if !m.ScheduledAt.IsZero() {
		s := m.ScheduledAt.UTC()
		r.sched = &s
	}
	return r, nil
}

// params are the row's staging parameters, alone in its staging.
func (r *stagedRow) params(ordered bool, now time.Time) stageOne {
	return stageOne{ID: r.id, Type: r.typ, Topic: r.topic, Payload: r.payload, Metadata: r.meta, Tenant: r.tenant,
		Correlation: r.corr, Causation: r.cause, Key: r.key, Ordered: ordered, Position: r.pos, ScheduledAt: r.sched,
		Now: now}
}

// ordered reports whether the row takes part in its key's order.
func (r *stagedRow) ordered() bool { return r.key != "" && r.sched == nil }

// stageArgs validates msgs, fills defaults from ctx, drops repeated (tenant, ID, topic) triples (the first wins) and
// numbers the ordered messages within their key (a key is one tenant's).
func (o *Outbox) stageArgs(ctx context.Context, msgs []Message) (stageArgs, error) {
	traceCtx := traceHeaders(ctx)
	if len(msgs) == 1 { // the common case, with scalar arguments and nothing to number
		r, err := o.row(ctx, 0, &msgs[0], traceCtx)
		if err != nil {
			return stageArgs{}, err
		}
		a := stageArgs{ids: []string{r.id}, topics: []string{r.topic}, tenants: []string{r.tenant},
			locks: []int64{}}
		if r.ordered() {
			a.locks = []int64{o.keyLock(r.tenant, r.key)}
		}
		a.one = r.params(r.ordered(), o.now())
		return a, nil
	}
	n := len(msgs)
	var (
		ids, types, topics, metas, tenants, corrs, causes, keys = make([]string, 0, n), make([]string, 0, n),
			make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n),
			make([]string, 0, n), make([]string, 0, n)
		payloads  = make([][]byte, 0, n)
		positions = make([]*int64, 0, n)
		scheduled = make([]*time.Time, 0, n)
		keyIndex  = make([]*int64, 0, n)
		seen      = make(map[[3]string]struct{}, n)
		perKey    = map[tenantKey]int64{}
		locks     []int64
	)
	for i := range msgs {
		r, err := o.row(ctx, i, &msgs[i], traceCtx)
		if err != nil {
			return stageArgs{}, err
		}
		if _, dup := seen[[3]string{r.tenant, r.id, r.topic}]; dup {
			continue
		}
		seen[[3]string{r.tenant, r.id, r.topic}] = struct{}{}
		ids = append(ids, r.id)
		types = append(types, r.typ)
		topics = append(topics, r.topic)
		payloads = append(payloads, r.payload)
		metas = append(metas, r.meta)
		tenants = append(tenants, r.tenant)
		corrs = append(corrs, r.corr)
		causes = append(causes, r.cause)
		keys = append(keys, r.key)
		positions = append(positions, r.pos)
		scheduled = append(scheduled, r.sched)
		var idx *int64
		if r.ordered() {
			tk := tenantKey{r.tenant, r.key}
			if perKey[tk] == 0 {
				locks = append(locks, o.keyLock(r.tenant, r.key))
			}
			perKey[tk]++
			v := perKey[tk]
			idx = &v
		}
		keyIndex = append(keyIndex, idx)
	}
	now := o.now()
	a := stageArgs{ids: ids, topics: topics, tenants: tenants, locks: sortedLocks(locks)}
	if a.locks == nil {
		a.locks = []int64{}
	}
	if len(ids) == 1 {
		a.one = stageOne{ID: ids[0], Type: types[0], Topic: topics[0], Payload: payloads[0], Metadata: metas[0],
			Tenant: tenants[0], Correlation: corrs[0], Causation: causes[0], Key: keys[0], Ordered: keyIndex[0] != nil,
			Position: positions[0], ScheduledAt: scheduled[0], Now: now}
	} else {
		a.many = stageMany{IDs: ids, Types: types, Topics: topics, Payloads: payloads, Metadata: metas,
			Tenants: tenants, Correlations: corrs, Causations: causes, Keys: keys, Positions: positions,
			ScheduledAt: scheduled, KeyIndex: keyIndex, Now: now}
	}
	return a, nil
}

// Publisher returns a Watermill message.Publisher that stages every published message into db. Bound to a pgx.Tx,
// Publish(topic, msgs...) inside a business transaction stages rows that commit or roll back with it; call Notify
// after the commit (or let relays poll). Bound to a pool or connection, each Publish is its own transaction and
// notifies relays after it.
//
// Tenant, correlation, causation and the trace context come from the message's metadata, else from the message's
// context, else from ctx. The partition key comes from Config.PartitionKey (by default the "partition-key"
// metadata value, else "aggregate-id"); HeaderScheduledAt delays delivery. Close does nothing to db.
func (o *Outbox) Publisher(ctx context.Context, db DB) *Publisher {
	if ctx == nil {
		ctx = context.Background()
	}
	_, inTx := db.(pgx.Tx)
	return &Publisher{o: o, ctx: ctx, db: db, notify: !inTx}
}

// Publisher stages Watermill messages into the outbox. See Outbox.Publisher.
type Publisher struct {
	o      *Outbox
	ctx    context.Context
	db     DB
	notify bool
	closed atomic.Bool
	count  atomic.Int64
}

var _ message.Publisher = (*Publisher)(nil)

// ErrPublisherClosed is returned by Publish after Close.
var ErrPublisherClosed = errors.New("outbox: publisher closed")

// Publish stages msgs for topic, atomically, and returns when they are staged (the relay publishes them later).
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if p.closed.Load() {
		return ErrPublisherClosed
	}
	staged := make([]Message, 0, len(msgs))
	for _, msg := range msgs {
		m, err := p.o.fromWatermill(p.ctx, topic, msg)
		if err != nil {
			return err
		}
		m.Metadata = withTraceContext(m.Metadata, traceHeaders(msg.Context())) // else StageTx takes p.ctx's
		staged = append(staged, m)
	}
	n, err := p.o.StageTx(p.ctx, p.db, staged...)
	if err != nil {
		return err
	}
	p.count.Add(int64(n))
	if n > 0 && p.notify {
		p.o.Notify()
	}
	return nil
}

// staged is how many rows this publisher inserted.
func (p *Publisher) staged() int { return int(p.count.Load()) }

// Close makes further Publish calls fail. It is safe to call more than once.
func (p *Publisher) Close() error {
	p.closed.Store(true)
	return nil
}
