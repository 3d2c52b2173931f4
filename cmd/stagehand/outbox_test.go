package main

import (
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/outbox"
)

// deadLetters stages the messages and dead-letters them all: a destination that rejects everything and no retry.
func deadLetters(t *testing.T, o *outbox.Outbox, msgs ...outbox.Message) {
	t.Helper()
	_, err := o.Stage(context.Background(), msgs...)
	require.NoError(t, err)
	res := drain(t, o, &broker{reject: true})
	require.Equal(t, len(msgs), res.DeadLettered)
}

type statsOut struct {
	Scope            string  `json:"scope"`
	Tenant           string  `json:"tenant"`
	Pending          int64   `json:"pending"`
	OldestPendingAge float64 `json:"oldest_pending_age_seconds"`
	DeadLettered     int64   `json:"dead_lettered"`
	Sent             int64   `json:"sent"`
}

type deadOut struct {
	ID              string            `json:"id"`
	Topic           string            `json:"topic"`
	Tenant          string            `json:"tenant"`
	Type            string            `json:"type"`
	Attempts        int               `json:"attempts"`
	LastError       string            `json:"last_error"`
	HoldsKey        bool              `json:"holds_key"`
	Metadata        map[string]string `json:"metadata"`
	PayloadEncoding string            `json:"payload_encoding"`
	Payload         json.RawMessage   `json:"payload"`
}

type deadListOut struct {
	Scope       string    `json:"scope"`
	Tenant      string    `json:"tenant"`
	DeadLetters []deadOut `json:"dead_letters"`
}

func ids(dls []deadOut) []string {
	out := make([]string, 0, len(dls))
	for _, d := range dls {
		out = append(out, d.ID)
	}
	return out
}

// outbox stats, dead list and dead show report what the library's relay left behind, estate-wide by default and
// confined to one tenant with --tenant.
func TestOutboxStatsListAndShow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	o := e.outbox(nil)
	deadLetters(t, o,
		outbox.Message{ID: "a1", Topic: "orders", Tenant: "acme", Type: "order.placed", PartitionKey: "order-1",
			Payload: []byte(`{"order": 1}`), Metadata: map[string]string{"source": "test"}},
		outbox.Message{ID: "a2", Topic: "orders", Tenant: "acme", Payload: []byte("plain text")},
		outbox.Message{ID: "b1", Topic: "invoices", Tenant: "globex", Payload: []byte{0xff, 0x00, 0x01}},
	)
	_, err := o.Stage(context.Background(), outbox.Message{ID: "p1", Topic: "orders", Tenant: "acme"},
		outbox.Message{ID: "p2", Topic: "orders", Tenant: "globex"})
	require.NoError(t, err)

	var st statsOut
	e.json(&st, "outbox", "stats")
	require.Equal(t, statsOut{Scope: "all-tenants", Pending: 2, DeadLettered: 3, OldestPendingAge: st.OldestPendingAge},
		st)
	e.json(&st, "outbox", "stats", "--tenant", "acme")
	require.Equal(t, "tenant", st.Scope)
	require.Equal(t, "acme", st.Tenant)
	require.Equal(t, int64(1), st.Pending)
	require.Equal(t, int64(2), st.DeadLettered)
	e.json(&st, "outbox", "stats", "--tenant", "")
	require.Equal(t, "__untenanted__", st.Tenant, `--tenant "" is the no-tenant value, never every tenant`)
	require.Zero(t, st.DeadLettered)

	human := e.ok("outbox", "stats")
	require.Contains(t, human, "all tenants (estate-wide)")
	require.Regexp(t, `pending\s+2\n`, human)
	require.Regexp(t, `dead-lettered\s+3\n`, human)

	var list deadListOut
	e.json(&list, "outbox", "dead", "list")
	require.Equal(t, "all-tenants", list.Scope)
	require.ElementsMatch(t, []string{"a1", "a2", "b1"}, ids(list.DeadLetters))
	for _, d := range list.DeadLetters {
		require.Equal(t, 1, d.Attempts)
		require.Contains(t, d.LastError, errRejected.Error())
		require.Empty(t, d.PayloadEncoding, "list leaves payloads to show")
	}
	e.json(&list, "outbox", "dead", "list", "--tenant", "globex")
	require.Equal(t, []string{"b1"}, ids(list.DeadLetters))
	e.json(&list, "outbox", "dead", "list", "--topic", "orders", "--limit", "1")
	require.Len(t, list.DeadLetters, 1)
	require.Equal(t, "orders", list.DeadLetters[0].Topic)

	human = e.ok("outbox", "dead", "list")
	for _, id := range []string{"a1", "a2", "b1", "order-1", "acme", "globex"} {
		require.Contains(t, human, id)
	}
	require.Contains(t, human, "3 dead letter(s), all tenants (estate-wide)")
	human = e.ok("outbox", "dead", "list", "--limit", "2")
	require.Contains(t, human, "The oldest 2 dead letters, all tenants (estate-wide) (--limit 0 shows all)")
	e.json(&list, "outbox", "dead", "list", "--limit", "0")
	require.Len(t, list.DeadLetters, 3)

	var show deadOut
	e.json(&show, "outbox", "dead", "show", "a1")
	require.Equal(t, "a1", show.ID)
	require.Equal(t, "acme", show.Tenant)
	require.Equal(t, "order.placed", show.Type)
	require.True(t, show.HoldsKey, "a dead letter holds its key by default")
	require.Equal(t, "test", show.Metadata["source"])
	require.Equal(t, "json", show.PayloadEncoding)
	require.JSONEq(t, `{"order": 1}`, string(show.Payload))
	e.json(&show, "outbox", "dead", "show", "a2")
	require.Equal(t, "text", show.PayloadEncoding)
	require.Equal(t, `"plain text"`, string(show.Payload))
	e.json(&show, "outbox", "dead", "show", "b1")
	require.Equal(t, "base64", show.PayloadEncoding)
	require.Equal(t, `"/wAB"`, string(show.Payload))

	human = e.ok("outbox", "dead", "show", "a1")
	require.Regexp(t, `payload\s+\{"order":1\}`, human)
	require.Regexp(t, `last error\s+.*`+errRejected.Error(), human)

	e.fails(exitFailure, `no dead letter with ID "nope"`, "outbox", "dead", "show", "nope")
	e.fails(exitFailure, `no dead letter with ID "b1" (tenant acme)`, "outbox", "dead", "show", "b1", "--tenant",
		"acme")
}

// redrive puts dead letters back into the outbox (a relay then delivers them); discard deletes them; unknown IDs
// (another tenant's with --tenant) are listed and fail the command while the known ones are acted on.
func TestOutboxRedriveAndDiscard(t *testing.T) {
	t.Parallel()
	e := setup(t)
	o := e.outbox(nil)
	deadLetters(t, o,
		outbox.Message{ID: "a1", Topic: "orders", Tenant: "acme"},
		outbox.Message{ID: "a2", Topic: "orders", Tenant: "acme"},
		outbox.Message{ID: "a3", Topic: "orders", Tenant: "acme"},
		outbox.Message{ID: "b1", Topic: "orders", Tenant: "globex"},
	)
	deadIDs := func() []string {
		dls, err := o.AllTenants().DeadLetters(context.Background(), outbox.ListOptions{})
		require.NoError(t, err)
		out := []string{}
		for _, d := range dls {
			out = append(out, d.ID)
		}
		return out
	}

	r := e.fails(exitFailure, "no dead letter with ID b1, nope (tenant acme); the others were redriven", "outbox",
		"dead", "redrive", "b1", "nope", "--tenant", "acme")
	require.Contains(t, r.stdout, "Redrove 0 dead letter(s) into the outbox (tenant acme).")
	e.fails(exitFailure, "no dead letter with ID nope", "outbox", "dead", "discard", "nope")
	require.ElementsMatch(t, []string{"a1", "a2", "a3", "b1"}, deadIDs(), "no known ID: nothing changed")

	var moved struct {
		Scope   string   `json:"scope"`
		IDs     []string `json:"ids"`
		Count   int      `json:"count"`
		Unknown []string `json:"unknown"`
	}
	r = e.fails(exitFailure, "no dead letter with ID nope, zzz (all tenants (estate-wide))", "outbox", "dead", "redrive", "a1",
		"zzz", "nope", "--json")
	decodeOne(t, r.stdout, &moved)
	require.Equal(t, 1, moved.Count, "the known ID is redriven")
	require.Equal(t, []string{"a1", "nope", "zzz"}, moved.IDs)
	require.Equal(t, []string{"nope", "zzz"}, moved.Unknown)
	require.ElementsMatch(t, []string{"a2", "a3", "b1"}, deadIDs())
	var st statsOut
	e.json(&st, "outbox", "stats")
	require.Equal(t, int64(1), st.Pending, "the redriven message is back in the outbox")
	b := &broker{}
	drain(t, o, b)
	require.Equal(t, []string{"a1"}, b.published(), "a relay delivers the redriven message")

	e.json(&moved, "outbox", "dead", "discard", "a2")
	require.Equal(t, 1, moved.Count)
	require.Equal(t, []string{}, moved.Unknown)
	_, err := o.AllTenants().DeadLetter(context.Background(), "a2")
	require.ErrorIs(t, err, outbox.ErrNotFound, "discarded is gone from the dead letters")
	require.Contains(t, e.ok("outbox", "dead", "discard", "a3"), "Discarded 1 dead letter(s)")

	e.json(&moved, "outbox", "dead", "redrive", "--all", "--tenant", "globex")
	require.Equal(t, "tenant", moved.Scope)
	require.Equal(t, []string{"b1"}, moved.IDs)
	require.Empty(t, deadIDs())
	require.Contains(t, e.ok("outbox", "dead", "redrive", "--all"), "Redrove 0 dead letter(s)")
	drain(t, o, b)
	require.Equal(t, []string{"a1", "b1"}, b.published())
	e.json(&st, "outbox", "stats")
	require.Equal(t, statsOut{Scope: "all-tenants", Sent: 4}, st,
		"a1 and b1 published, a2 and a3 discarded: all four in the sent ledger, none pending or dead")
}

// outbox cleanup deletes the sent ledger entries older than the age, only the scope's with --tenant, and shows a
// spinner only on a terminal.
func TestOutboxCleanup(t *testing.T) {
	t.Parallel()
	e := setup(t)
	old := e.outbox(func() time.Time { return time.Now().Add(-48 * time.Hour) })
	var msgs []outbox.Message
	for i, tenant := range []string{"acme", "acme", "acme", "globex", "globex"} {
		msgs = append(msgs, outbox.Message{ID: "old-" + string(rune('a'+i)), Topic: "t", Tenant: tenant})
	}
	_, err := old.Stage(context.Background(), msgs...)
	require.NoError(t, err)
	require.Equal(t, 5, drain(t, old, &broker{}).Published)
	fresh := e.outbox(nil)
	_, err = fresh.Stage(context.Background(), outbox.Message{ID: "new", Topic: "t", Tenant: "acme"})
	require.NoError(t, err)
	require.Equal(t, 1, drain(t, fresh, &broker{}).Published)

	var out struct {
		Scope            string    `json:"scope"`
		Tenant           string    `json:"tenant"`
		Deleted          int64     `json:"deleted"`
		OlderThanSeconds float64   `json:"older_than_seconds"`
		Cutoff           time.Time `json:"cutoff"`
	}
	e.json(&out, "outbox", "cleanup", "--older-than", "1d", "--tenant", "acme", "--batch-size", "2")
	require.Equal(t, int64(3), out.Deleted, "acme's three old entries, in batches of 2")
	require.Equal(t, "acme", out.Tenant)
	require.Equal(t, float64(24*3600), out.OlderThanSeconds)
	require.WithinDuration(t, time.Now().Add(-24*time.Hour), out.Cutoff, time.Minute)

	var st statsOut
	e.json(&st, "outbox", "stats")
	require.Equal(t, int64(3), st.Sent, "globex's two old entries and the new one")

	// On a terminal a spinner runs while the batches are deleted, then the result line.
	tty := options{isTerminal: func(io.Writer) bool { return true }}
	r := invoke(context.Background(), tty, e.args("outbox", "cleanup", "--older-than", "36h")...)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "deleting sent entries older than 36h, all tenants (estate-wide)")
	require.Contains(t, r.stdout, "Deleted 2 sent-ledger entries older than 36h")
	require.Contains(t, r.stdout, "all tenants (estate-wide)")
	e.json(&st, "outbox", "stats")
	require.Equal(t, int64(1), st.Sent, "the new entry stays")

	// Never with --json, even on a terminal; and without a terminal, only the result.
	r = invoke(context.Background(), tty, e.args("outbox", "cleanup", "--older-than", "0s", "--json")...)
	require.Equal(t, exitOK, r.code, r.stderr)
	decodeOne(t, r.stdout, &out)
	require.Equal(t, int64(1), out.Deleted)
	require.NotContains(t, e.ok("outbox", "cleanup", "--older-than", "0s"), "deleting sent entries")
}

var _ message.Publisher = (*broker)(nil)

// outbox stats tells the messages waiting behind a pending message of their key (they go out in turn) from those
// held by a dead letter of their key (they wait for an operator), in text and JSON.
func TestOutboxStatsTellParkedApart(t *testing.T) {
	t.Parallel()
	e := setup(t)
	o := e.outbox(nil)
	deadLetters(t, o, outbox.Message{ID: "d1", Topic: "orders", PartitionKey: "poisoned"})
	_, err := o.Stage(context.Background(),
		outbox.Message{ID: "h1", Topic: "orders", PartitionKey: "poisoned"},
		outbox.Message{ID: "h2", Topic: "orders", PartitionKey: "poisoned"},
		outbox.Message{ID: "w1", Topic: "orders", PartitionKey: "busy"},
		outbox.Message{ID: "w2", Topic: "orders", PartitionKey: "busy"},
		outbox.Message{ID: "w3", Topic: "orders", PartitionKey: "busy"},
		outbox.Message{ID: "w4", Topic: "orders", PartitionKey: "busy"})
	require.NoError(t, err)

	var st struct {
		Pending              int64 `json:"pending"`
		Parked               int64 `json:"parked"`
		WaitingBehindPending int64 `json:"waiting_behind_pending"`
		HeldByDeadLetter     int64 `json:"held_by_dead_letter"`
	}
	e.json(&st, "outbox", "stats")
	require.EqualValues(t, 6, st.Pending)
	require.EqualValues(t, 3, st.WaitingBehindPending, "w2..w4 wait behind w1")
	require.EqualValues(t, 2, st.HeldByDeadLetter, "h1 and h2 are held by d1")
	require.EqualValues(t, 5, st.Parked)

	human := e.ok("outbox", "stats")
	require.Regexp(t, `waiting behind a pending message of their key\s+3\n`, human)
	require.Regexp(t, `held by a dead letter of their key\s+2\n`, human)
	require.NotContains(t, human, "parked behind a dead letter")
}
