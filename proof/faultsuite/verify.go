package faultsuite

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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

// brokerFindings is what the broker stored, read in its order.
type brokerFindings struct {
	stored          int64 // copies stored (every copy published)
	unique          int64 // distinct message IDs among them
	unexpected      int64 // IDs no committed event accounts for
	missing         int64 // planned IDs never published
	orderViolations int64 // first publications that came after a later-staged message of the same key
	keysChecked     int
	violations      []string // the first few, described
	versionMismatch int64    // messages whose version header disagrees with their place in the plan
	// violatingKeys are the keys with an order violation, in the order found; copies, the broker position of every
	// copy of each message, for describing them (keyTimelines).
	violatingKeys []string
	copies        map[string][]uint64
}

// readBroker reads every copy the broker stored, in its order, and checks, per key, that the first publication of
// each message came in staging order: a message's first copy must not follow the first copy of a message staged
// after it. Later copies (republished after a relay was killed, or after its lease lapsed) are duplicates, not
// reorderings, and are only counted.
func readBroker(ctx context.Context, brk broker, p *plan) (*brokerFindings, error) {
	f := &brokerFindings{copies: map[string][]uint64{}}
	seen := map[string]bool{}
	next := map[string]int{} // key -> the highest plan position whose first copy has been seen, plus one
	err := brk.readStored(ctx, func(c storedCopy) error {
		f.stored++
		f.copies[c.id] = append(f.copies[c.id], c.position)
		if seen[c.id] {
			return nil
		}
		seen[c.id] = true
		f.unique++
		pl, ok := p.index[c.id]
		if !ok {
			f.unexpected++
			return nil
		}
		if v, err := strconv.ParseInt(c.version, 10, 64); err != nil || v != int64(pl.pos+1) {
			f.versionMismatch++
		}
		if pl.pos < next[pl.key] {
			f.orderViolations++
			if !slices.Contains(f.violatingKeys, pl.key) {
				f.violatingKeys = append(f.violatingKeys, pl.key)
			}
			if len(f.violations) < 5 {
				f.violations = append(f.violations, fmt.Sprintf("key %s: message %d of the key first published "+
					"at position %d, after message %d", pl.key, pl.pos+1, c.position, next[pl.key]))
			}
			return nil
		}
		next[pl.key] = pl.pos + 1
		return nil
	})
	if err != nil {
		return nil, err
	}
	for id := range p.index {
		if !seen[id] {
			f.missing++
		}
	}
	f.keysChecked = len(next)
	return f, nil
}

// effectFindings is what the consumers' effects table holds.
type effectFindings struct {
	rows       int64 // effect rows
	unique     int64 // distinct messages with an effect
	duplicates int64 // rows beyond the first of their message: effects applied twice
	missing    int64 // planned messages with no effect
	unexpected int64 // effects of messages no committed event accounts for
	examples   []string
	// orderViolations counts first effects applied after the first effect of a message staged later for the
	// same key (the order at the handler, read from the effects' sequence numbers).
	orderViolations int64
	orderExamples   []string
}

func readEffects(ctx context.Context, pool *pgxpool.Pool, effects string, p *plan) (*effectFindings, error) {
	rows, err := pool.Query(ctx, `SELECT message_id, count(*), min(seq) FROM `+effects+` GROUP BY message_id`)
	if err != nil {
		return nil, fmt.Errorf("faultsuite: read effects: %w", err)
	}
	defer rows.Close()
	f := &effectFindings{}
	have := map[string]bool{}
	type first struct {
		seq int64
		pos int
	}
	firsts := map[string][]first{} // key -> its messages' first effects
	for rows.Next() {
		var id string
		var n, seq int64
		if err := rows.Scan(&id, &n, &seq); err != nil {
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
		pl, ok := p.index[id]
		if !ok {
			f.unexpected++
			continue
		}
		firsts[pl.key] = append(firsts[pl.key], first{seq: seq, pos: pl.pos})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("faultsuite: read effects: %w", err)
	}
	for key, fs := range firsts {
		slices.SortFunc(fs, func(a, b first) int { return cmp.Compare(a.seq, b.seq) })
		highest := -1
		for _, e := range fs {
			if e.pos < highest {
				f.orderViolations++
				if len(f.orderExamples) < 5 {
					f.orderExamples = append(f.orderExamples, fmt.Sprintf("key %s: message %d of the key applied "+
						"(effect %d) after message %d", key, e.pos+1, e.seq, highest+1))
				}
				continue
			}
			highest = e.pos
		}
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

// keyTimelines describes, for each of the first few keys with an order violation, what the outbox and the broker
// recorded of each of its messages: the broker positions of its copies and the sent ledger's entry (the event's
// global position, when it was staged and marked sent, the attempts it took). It tells a message published ahead of
// its turn (an earlier position, a later staging) from one staged out of turn (a later event staged earlier), so a
// violation found in a run can be explained from its report alone.
func keyTimelines(ctx context.Context, pool *pgxpool.Pool, sent string, p *plan, bf *brokerFindings) ([]string,
	error) {
	var out []string
	for _, key := range bf.violatingKeys[:min(3, len(bf.violatingKeys))] {
		ids := p.keys[key]
		type entry struct {
			position        *int64
			created, sentAt time.Time
			attempts        int
		}
		ledger := map[string]entry{}
		rows, err := pool.Query(ctx, `SELECT message_id, source_position, created_at, sent_at, attempts FROM `+sent+
			` WHERE message_id = ANY($1)`, ids)
		if err != nil {
			return nil, fmt.Errorf("faultsuite: read the sent ledger of key %s: %w", key, err)
		}
		for rows.Next() {
			var id string
			var e entry
			if err := rows.Scan(&id, &e.position, &e.created, &e.sentAt, &e.attempts); err != nil {
				rows.Close()
				return nil, fmt.Errorf("faultsuite: read the sent ledger of key %s: %w", key, err)
			}
			ledger[id] = e
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("faultsuite: read the sent ledger of key %s: %w", key, err)
		}
		out = append(out, fmt.Sprintf("key %s (message: broker positions of its copies; event position, staged, "+
			"sent, attempts):", key))
		for i, id := range ids {
			line := fmt.Sprintf("  %d: %v", i+1, bf.copies[id])
			if e, ok := ledger[id]; ok {
				pos := "-"
				if e.position != nil {
					pos = strconv.FormatInt(*e.position, 10)
				}
				line += fmt.Sprintf("; %s, %s, %s, %d", pos, e.created.UTC().Format("15:04:05.000000"),
					e.sentAt.UTC().Format("15:04:05.000000"), e.attempts)
			} else {
				line += "; not in the sent ledger"
			}
			out = append(out, line)
		}
	}
	return out, nil
}
