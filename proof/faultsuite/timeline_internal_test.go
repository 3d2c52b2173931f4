package faultsuite

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// storedCopies is a broker whose stream is given: readStored is all the verifier asks of it.
type storedCopies struct {
	broker
	copies []storedCopy
}

func (s storedCopies) readStored(_ context.Context, fn func(storedCopy) error) error {
	for _, c := range s.copies {
		if err := fn(c); err != nil {
			return err
		}
	}
	return nil
}

// An order violation at the broker comes with the timeline of its key: every copy's broker position and the sent
// ledger's entry of each message, so a violation found in CI can be explained from the report alone.
func TestOrderViolationsComeWithTheKeysTimeline(t *testing.T) {
	ctx := context.Background()
	pool, schema := pgtest.Migrated(t)
	const key = "counter-0007"
	p := &plan{keys: map[string][]string{}, index: map[string]planned{}}
	for v := int64(1); v <= 4; v++ {
		id := expectedMessageID(tenant, key, v)
		p.index[id] = planned{key: key, pos: len(p.keys[key])}
		p.keys[key] = append(p.keys[key], id)
	}
	id := func(v int) string { return p.keys[key][v-1] }
	// Message 3 first, then 1 and 2 (two violations), then 3 again (a duplicate) and 4.
	brk := storedCopies{copies: []storedCopy{{id: id(3), version: "3", position: 10}, {id: id(1), version: "1",
		position: 11}, {id: id(2), version: "2", position: 12}, {id: id(3), version: "3", position: 13},
		{id: id(4), version: "4", position: 14}}}
	bf, err := readBroker(ctx, brk, p)
	if err != nil {
		t.Fatal(err)
	}
	if bf.orderViolations != 2 || len(bf.violatingKeys) != 1 || bf.violatingKeys[0] != key {
		t.Fatalf("violations %d on keys %v, want 2 on [%s]", bf.orderViolations, bf.violatingKeys, key)
	}
	staged := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	for v := 1; v <= 3; v++ { // message 4 is not in the ledger
		if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "outbox_sent"}.Sanitize()+
			` (message_id, tenant_id, topic, message_type, source_position, attempts, created_at, sent_at)
			VALUES ($1, $2, 't', 'm', $3, $4, $5, $6)`, id(v), tenant, 100+v, v,
			staged.Add(time.Duration(v)*time.Second), staged.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	lines, err := keyTimelines(ctx, pool, pgx.Identifier{schema, "outbox_sent"}.Sanitize(), p, bf)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(lines, "\n")
	for _, want := range []string{
		"key counter-0007 (message: broker positions of its copies; event position, staged, sent, attempts):",
		"  1: [11]; 101, 10:00:01.000000, 10:01:00.000000, 1",
		"  3: [10 13]; 103, 10:00:03.000000, 10:01:00.000000, 3",
		"  4: [14]; not in the sent ledger",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("timeline lacks %q:\n%s", want, got)
		}
	}
	rep := &Report{OrderViolations: bf.orderViolations, OrderExamples: bf.violations, OrderTimelines: lines}
	s := rep.String()
	if !strings.Contains(s, "    key counter-0007 (message:") || !strings.Contains(s, "      3: [10 13]") {
		t.Errorf("the report does not show the timeline:\n%s", s)
	}
}

// settledState is a broker whose delivery state is given: settled is all the stall report asks of it.
type settledState struct {
	broker
	state string
}

func (s settledState) settled(context.Context) (bool, string, error) { return false, s.state, nil }

// A stalled drain says where the messages without an effect are: the broker's state, the rows still in the outbox
// with their leases and last errors, and the messages the ledger holds as sent that no handler applied.
func TestAStalledDrainSaysWhereTheMessagesAre(t *testing.T) {
	ctx := context.Background()
	pool, schema := pgtest.Migrated(t)
	q := func(table string) string { return pgx.Identifier{schema, table}.Sanitize() }
	effects := q("fault_effects")
	pgtest.Exec(t, pool, `CREATE TABLE `+effects+` (message_id text NOT NULL)`)
	pgtest.Exec(t, pool, `INSERT INTO `+q("outbox")+` (message_id, topic, payload, partition_key, seq,
		next_attempt_at, lease_owner, lease_expires_at, attempts, last_error, created_at)
		VALUES ('stuck-1', 't', '', 'counter-0003', 7, now(), 'relay-r1', now() + interval '1 minute', 2,
		'broker unavailable', now())`)
	for _, id := range []string{"sent-1", "handled-1"} {
		pgtest.Exec(t, pool, `INSERT INTO `+q("outbox_sent")+` (message_id, tenant_id, topic, message_type,
			attempts, created_at, sent_at) VALUES ($1, $2, 't', 'm', 1, now(), now())`, id, tenant)
	}
	pgtest.Exec(t, pool, `INSERT INTO `+effects+` VALUES ('handled-1')`)
	got := stallDetail(ctx, pool, schema, effects, settledState{state: "queue p03: 1 unacknowledged"},
		&consumers{})
	for _, want := range []string{"queue p03: 1 unacknowledged, 0 handlers running", "stuck-1 counter-0003 7",
		"relay-r1", "broker unavailable", "sent-1 t 1"} {
		if !strings.Contains(got, want) {
			t.Errorf("the stall report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "handled-1") {
		t.Errorf("the stall report lists a message that has its effect:\n%s", got)
	}
}
