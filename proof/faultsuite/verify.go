package faultsuite

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
)

// plan is what the committed events say must reach the broker: for each key, its message IDs in staging order.
// Under the Transactional strategy a stream's messages are staged in the transactions that append its events, so
// staging-commit order within a key is the events' version order.
type plan struct {
	events int64
	keys   map[string][]string // key -> message IDs in version order
	index  map[string]planned  // message ID -> its key and place in that order
}

type planned struct {
	key string
	pos int
}

// readPlan reads every committed event of the run from the global log (the event store's public API) and derives
// the message each one staged.
func readPlan(ctx context.Context, store eventstore.Store) (*plan, error) {
	p := &plan{keys: map[string][]string{}, index: map[string]planned{}}
	var after int64
	head, err := store.HeadPosition(ctx)
	if err != nil {
		return nil, fmt.Errorf("faultsuite: head position: %w", err)
	}
	for after < head {
		page, err := store.ReadLog(ctx, eventstore.LogQuery{After: after, Limit: 5000,
			StreamTypes: []string{CounterType}})
		if err != nil {
			return nil, fmt.Errorf("faultsuite: read the log after %d: %w", after, err)
		}
		for _, rec := range page.Records {
			ids := p.keys[rec.StreamID]
			if int64(len(ids)+1) != rec.Version {
				return nil, fmt.Errorf("faultsuite: stream %s: version %d follows %d in the log", rec.StreamID,
					rec.Version, len(ids))
			}
			id := expectedMessageID(rec.Tenant, rec.StreamID, rec.Version)
			p.index[id] = planned{key: rec.StreamID, pos: len(ids)}
			p.keys[rec.StreamID] = append(ids, id)
			p.events++
		}
		if page.Last <= after {
			return nil, fmt.Errorf("faultsuite: the log did not advance past %d (head %d)", after, head)
		}
		after = page.Last
	}
	return p, nil
}

// brokerFindings is what the JetStream stream holds, read in stream-sequence order.
type brokerFindings struct {
	stored          int64 // messages in the stream (every copy published)
	unique          int64 // distinct message IDs among them
	unexpected      int64 // IDs no committed event accounts for
	missing         int64 // planned IDs never published
	orderViolations int64 // first publications that came after a later-staged message of the same key
	keysChecked     int
	violations      []string // the first few, described
	versionMismatch int64    // messages whose version header disagrees with their place in the plan
}

// readBroker reads the whole stream with an ordered consumer and checks, per key, that the first publication of
// each message came in staging order: a message's first copy must not follow the first copy of a message staged
// after it. Later copies (republished after a relay was killed, or after its lease lapsed) are duplicates, not
// reorderings, and are only counted.
func readBroker(ctx context.Context, url string, p *plan) (*brokerFindings, error) {
	nc, err := nats.Connect(url, nats.Name("faultsuite check"))
	if err != nil {
		return nil, fmt.Errorf("faultsuite: nats: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("faultsuite: nats: %w", err)
	}
	stream, err := js.Stream(ctx, streamName)
	if err != nil {
		return nil, fmt.Errorf("faultsuite: nats: stream: %w", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("faultsuite: nats: stream info: %w", err)
	}
	if info.State.FirstSeq > 1 && info.State.Msgs > 0 {
		return nil, fmt.Errorf("faultsuite: the stream starts at sequence %d: messages were removed from it",
			info.State.FirstSeq)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return nil, fmt.Errorf("faultsuite: nats: ordered consumer: %w", err)
	}
	f := &brokerFindings{}
	seen := map[string]bool{}
	next := map[string]int{} // key -> the highest plan position whose first copy has been seen, plus one
	var lastSeq uint64
	deadline := time.Now().Add(5 * time.Minute)
	for f.stored < int64(info.State.Msgs) {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("faultsuite: read %d of %d stream messages in 5 minutes", f.stored, info.State.Msgs)
		}
		batch, err := cons.Fetch(int(min(1000, int64(info.State.Msgs)-f.stored)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("faultsuite: nats: fetch: %w", err)
		}
		for msg := range batch.Messages() {
			meta, err := msg.Metadata()
			if err != nil {
				return nil, fmt.Errorf("faultsuite: nats: metadata: %w", err)
			}
			if meta.Sequence.Stream <= lastSeq {
				return nil, fmt.Errorf("faultsuite: stream sequence %d after %d", meta.Sequence.Stream, lastSeq)
			}
			lastSeq = meta.Sequence.Stream
			f.stored++
			id := msg.Headers().Get(wmnats.WatermillUUIDHdr)
			if seen[id] {
				continue
			}
			seen[id] = true
			f.unique++
			pl, ok := p.index[id]
			if !ok {
				f.unexpected++
				continue
			}
			if v, err := strconv.ParseInt(msg.Headers().Get(HeaderVersion), 10, 64); err != nil || v != int64(pl.pos+1) {
				f.versionMismatch++
			}
			if pl.pos < next[pl.key] {
				f.orderViolations++
				if len(f.violations) < 5 {
					f.violations = append(f.violations, fmt.Sprintf("key %s: message %d of the key first published "+
						"at stream sequence %d, after message %d", pl.key, pl.pos+1, meta.Sequence.Stream,
						next[pl.key]))
				}
				continue
			}
			next[pl.key] = pl.pos + 1
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("faultsuite: nats: fetch: %w", err)
		}
	}
	for id := range p.index {
		if !seen[id] {
			f.missing++
		}
	}
	f.keysChecked = len(next)
	return f, nil
}

// consumerSettled reports whether the durable consumer has delivered everything in the stream and every delivery
// was acknowledged: nothing is left that the broker could still deliver (again).
func consumerSettled(ctx context.Context, url string) (bool, string, error) {
	nc, err := nats.Connect(url, nats.Name("faultsuite check"))
	if err != nil {
		return false, "", fmt.Errorf("faultsuite: nats: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return false, "", fmt.Errorf("faultsuite: nats: %w", err)
	}
	cons, err := js.PushConsumer(ctx, streamName, consumerGroup)
	if err != nil {
		return false, "", fmt.Errorf("faultsuite: nats: consumer: %w", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return false, "", fmt.Errorf("faultsuite: nats: consumer info: %w", err)
	}
	state := fmt.Sprintf("pending %d, awaiting ack %d, redelivered %d", info.NumPending, info.NumAckPending,
		info.NumRedelivered)
	return info.NumPending == 0 && info.NumAckPending == 0, state, nil
}

// effectFindings is what the consumers' effects table holds.
type effectFindings struct {
	rows       int64 // effect rows
	unique     int64 // distinct messages with an effect
	duplicates int64 // rows beyond the first of their message: effects applied twice
	missing    int64 // planned messages with no effect
	unexpected int64 // effects of messages no committed event accounts for
	examples   []string
}

func readEffects(ctx context.Context, pool *pgxpool.Pool, effects string, p *plan) (*effectFindings, error) {
	rows, err := pool.Query(ctx, `SELECT message_id, count(*) FROM `+effects+` GROUP BY message_id`)
	if err != nil {
		return nil, fmt.Errorf("faultsuite: read effects: %w", err)
	}
	defer rows.Close()
	f := &effectFindings{}
	have := map[string]bool{}
	for rows.Next() {
		var id string
		var n int64
		if err := rows.Scan(&id, &n); err != nil {
			return nil, fmt.Errorf("faultsuite: read effects: %w", err)
		}
		have[id] = true
		f.rows += n
		f.unique++
		if n > 1 {
			f.duplicates += n - 1
			if len(f.examples) < 5 {
				f.examples = append(f.examples, fmt.Sprintf("%s applied %d times", id, n))
			}
		}
		if _, ok := p.index[id]; !ok {
			f.unexpected++
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("faultsuite: read effects: %w", err)
	}
	for id := range p.index {
		if !have[id] {
			f.missing++
		}
	}
	return f, nil
}

// outboxFindings is the outbox and inbox state at the end, through the outbox's public statistics.
type outboxFindings struct {
	staged           int64 // every row the outbox holds or has published: pending + scheduled + dead + sent
	pending          int64
	deadLetters      int64
	inboxHandled     int64
	inboxDeadLetters int64
	inboxFailing     int64
}

func readOutbox(ctx context.Context, ob *outbox.Outbox) (*outboxFindings, error) {
	st, err := ob.AllTenants().Stats(ctx)
	if err != nil {
		return nil, fmt.Errorf("faultsuite: outbox stats: %w", err)
	}
	ist, err := ob.AllTenants().InboxStats(ctx)
	if err != nil {
		return nil, fmt.Errorf("faultsuite: inbox stats: %w", err)
	}
	return &outboxFindings{staged: st.Pending + st.Scheduled + st.DeadLettered + st.Sent, pending: st.Pending,
		deadLetters: st.DeadLettered, inboxHandled: ist.Handled, inboxDeadLetters: ist.DeadLettered,
		inboxFailing: ist.Failing}, nil
}
