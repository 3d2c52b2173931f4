package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
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
// Messages with a partition key take the next sequence numbers of their key, and the key's counter stays locked
// until db's transaction ends: another transaction staging the same key waits, so sequence order is
// staging-commit order. Deduplication of an ID that a relay is moving to the sent ledger at that very moment relies
// on READ COMMITTED isolation (the PostgreSQL default).
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
	a, err := o.stageArgs(ctx, msgs)
	if err != nil {
		return 0, err
	}
	b := &pgx.Batch{}
	b.Queue(o.q.stageSettings)
	if len(a.keys) > 0 {
		b.Queue(o.q.stageKeys, a.keyTenants, a.keys, a.counts)
	}
	b.Queue(o.q.stage, a.args...)
	b.Queue(o.q.stageRecheck, a.ids, a.topics, a.tenants)
	b.Queue(o.q.stageRestore)
	res := db.SendBatch(ctx, b)
	_, err = res.Exec()
	if err == nil && len(a.keys) > 0 {
		_, err = res.Exec()
	}
	var inserted int
	if err == nil {
		inserted, err = countRows(res)
	}
	if err == nil {
		var removed int
		removed, err = countRows(res)
		inserted -= removed
	}
	if cerr := res.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: stage %d message(s): %w", len(msgs), err)
	}
	o.countStaged(ctx, inserted)
	return inserted, nil
}

func countRows(res pgx.BatchResults) (int, error) {
	rows, err := res.Query()
	if err != nil {
		return 0, err
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	return n, rows.Err()
}

type stageArgs struct {
	args                 []any
	ids, topics, tenants []string
	// The distinct ordered (tenant, key) pairs, sorted by tenant then key (the order their counters are locked
	// in), and how many messages each numbers.
	keyTenants, keys []string
	counts           []int64
}

// stageArgs validates msgs, fills defaults from ctx, drops repeated (tenant, ID, topic) triples (the first wins) and
// numbers the ordered messages within their key (a key is one tenant's: see keyRef).
func (o *Outbox) stageArgs(ctx context.Context, msgs []Message) (stageArgs, error) {
	n := len(msgs)
	var (
		ids, types, topics, metas, tenants, corrs, causes, keys = make([]string, 0, n), make([]string, 0, n),
			make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n),
			make([]string, 0, n), make([]string, 0, n)
		payloads  = make([][]byte, 0, n)
		positions = make([]*int64, 0, n)
		scheduled = make([]*time.Time, 0, n)
		keyIndex  = make([]*int64, 0, n)
		keyCount  = make([]*int64, 0, n)
		seen      = make(map[[3]string]struct{}, n)
		perKey    = map[tenantKey]int64{}
		traceCtx  = traceHeaders(ctx)
	)
	for i := range msgs {
		m := &msgs[i]
		if m.ID == "" {
			return stageArgs{}, invalidMessage("message %d: ID is empty", i)
		}
		if strings.TrimSpace(m.Topic) == "" {
			return stageArgs{}, invalidMessage("message %q: Topic is empty", m.ID)
		}
		tenant := m.Tenant
		if tenant == "" {
			tenant = stagehand.TenantFrom(ctx)
		}
		tenant = stagehand.NormalizeTenant(tenant)
		if _, dup := seen[[3]string{tenant, m.ID, m.Topic}]; dup {
			continue
		}
		seen[[3]string{tenant, m.ID, m.Topic}] = struct{}{}
		meta, err := encodeMetadata(withTraceContext(m.Metadata, traceCtx))
		if err != nil {
			return stageArgs{}, invalidMessage("message %q: metadata: %v", m.ID, err)
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		ids = append(ids, m.ID)
		types = append(types, m.Type)
		topics = append(topics, m.Topic)
		payloads = append(payloads, payload)
		metas = append(metas, meta)
		tenants = append(tenants, tenant)
		corrs = append(corrs, firstNonEmpty(m.CorrelationID, stagehand.CorrelationIDFrom(ctx)))
		causes = append(causes, firstNonEmpty(m.CausationID, stagehand.CausationIDFrom(ctx)))
		keys = append(keys, m.PartitionKey)
		var pos *int64
		if m.SourcePosition != 0 {
			p := m.SourcePosition
			pos = &p
		}
		positions = append(positions, pos)
		var sched *time.Time
		if !m.ScheduledAt.IsZero() {
			s := m.ScheduledAt.UTC()
			sched = &s
		}
		scheduled = append(scheduled, sched)
		var idx *int64
		if m.PartitionKey != "" && sched == nil {
			tk := tenantKey{tenant, m.PartitionKey}
			perKey[tk]++
			v := perKey[tk]
			idx = &v
		}
		keyIndex = append(keyIndex, idx)
	}
	for i, k := range keys {
		var c *int64
		if keyIndex[i] != nil {
			v := perKey[tenantKey{tenants[i], k}]
			c = &v
		}
		keyCount = append(keyCount, c)
	}
	a := stageArgs{
		args: []any{ids, types, topics, payloads, metas, tenants, corrs, causes, keys, positions, scheduled, keyIndex,
			keyCount, o.now()},
		ids: ids, topics: topics, tenants: tenants,
	}
	sorted := make([]tenantKey, 0, len(perKey))
	for k := range perKey {
		sorted = append(sorted, k)
	}
	slices.SortFunc(sorted, func(x, y tenantKey) int {
		if c := strings.Compare(x.tenant, y.tenant); c != 0 {
			return c
		}
		return strings.Compare(x.key, y.key)
	})
	for _, k := range sorted {
		a.keyTenants = append(a.keyTenants, k.tenant)
		a.keys = append(a.keys, k.key)
		a.counts = append(a.counts, perKey[k])
	}
	return a, nil
}

// tenantKey is one tenant's partition key: the unit of per-key order.
type tenantKey struct{ tenant, key string }

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
