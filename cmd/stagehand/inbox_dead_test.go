package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

// keeper is a Watermill publisher that keeps the messages it accepts.
type keeper struct {
	mu   sync.Mutex
	msgs []*message.Message
}

func (k *keeper) Publish(_ string, msgs ...*message.Message) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.msgs = append(k.msgs, msgs...)
	return nil
}

func (k *keeper) Close() error { return nil }

type inboxDeadOut struct {
	Handler   string            `json:"handler"`
	ID        string            `json:"id"`
	Tenant    string            `json:"tenant"`
	Type      string            `json:"type"`
	Topic     string            `json:"topic"`
	Attempts  int               `json:"attempts"`
	LastError string            `json:"last_error"`
	Metadata  map[string]string `json:"metadata"`
	Payload   any               `json:"payload"`
}

type inboxMoveOut struct {
	Scope   string   `json:"scope"`
	Tenant  string   `json:"tenant"`
	Handler string   `json:"handler"`
	IDs     []string `json:"ids"`
	Count   int      `json:"count"`
	Unknown []string `json:"unknown"`
}

// inbox dead list|show|redrive|discard: a dead letter redriven through the CLI is published again by the relay
// and handled once by its handler; a second redrive of the handled message finds nothing and exits 1; discard
// deletes; usage errors exit 2.
func TestInboxDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t)
	o := e.outbox(nil)
	table := pgtest.Q(e.schema, "credits")
	pgtest.Exec(t, e.pool, "CREATE TABLE "+table+" (message_id text PRIMARY KEY)")
	in, err := o.NewInbox(&outbox.InboxConfig{MaxAttempts: 1})
	require.NoError(t, err)
	var failing atomic.Bool
	failing.Store(true)
	ledger := in.Handler("ledger", func(ctx context.Context, tx pgx.Tx, _ *outbox.Publisher,
		msg *message.Message) error {
		if failing.Load() {
			return errors.New("ledger down")
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES ($1)", msg.UUID)
		return err
	})
	msg := func(tenant, id string) *message.Message {
		m := message.NewMessage(id, []byte(`{"amount": 5}`))
		m.Metadata.Set(stagehand.HeaderTenantID, tenant)
		m.Metadata.Set(stagehand.HeaderMessageType, "bank.Credit")
		return m
	}
	for _, m := range []*message.Message{msg("acme", "c-1"), msg("acme", "c-2"), msg("globex", "c-3")} {
		require.NoError(t, ledger(m))
	}

	var list struct {
		Scope       string         `json:"scope"`
		DeadLetters []inboxDeadOut `json:"dead_letters"`
	}
	e.json(&list, "inbox", "dead", "list")
	require.Equal(t, "all-tenants", list.Scope)
	require.Len(t, list.DeadLetters, 3)
	e.json(&list, "inbox", "dead", "list", "--tenant", "acme", "--handler", "ledger")
	require.Len(t, list.DeadLetters, 2)
	require.Equal(t, "ledger down", list.DeadLetters[0].LastError)
	human := e.ok("inbox", "dead", "list")
	require.Contains(t, human, "HANDLER")
	require.Contains(t, human, "3 inbox dead letter(s), all tenants (estate-wide).")
	require.Contains(t, e.ok("inbox", "dead", "list", "--tenant", "initech"), "No inbox dead letters (tenant initech).")

	var shown inboxDeadOut
	e.json(&shown, "inbox", "dead", "show", "ledger", "c-1")
	require.Equal(t, "acme", shown.Tenant)
	require.Equal(t, "bank.Credit", shown.Type)
	require.Equal(t, map[string]any{"amount": float64(5)}, shown.Payload)
	require.Contains(t, e.ok("inbox", "dead", "show", "ledger", "c-1"), "ledger down")
	e.fails(exitFailure, `no inbox dead letter of handler "ledger" with ID "c-9"`, "inbox", "dead", "show", "ledger",
		"c-9")

	failing.Store(false)
	require.Equal(t, "Redrove 1 inbox dead letter(s) into the outbox (tenant acme).\n",
		e.ok("inbox", "dead", "redrive", "ledger", "c-1", "--tenant", "acme", "--topic", "credits"))
	k := &keeper{}
	drain(t, o, k)
	require.Len(t, k.msgs, 1)
	redriven := k.msgs[0]
	redriven.SetContext(ctx) // the relay's context ended with the drain
	require.NoError(t, ledger(redriven))
	require.NoError(t, ledger(redriven))
	require.Equal(t, int64(1), pgtest.Count(t, e.pool, "SELECT count(*) FROM "+table+" WHERE message_id = 'c-1'"),
		"handled once, under the original ID")
	r := e.fails(exitFailure, `no inbox dead letter of handler "ledger" with ID c-1`, "inbox", "dead", "redrive",
		"ledger", "c-1", "--topic", "credits")
	require.Contains(t, r.stdout, "Redrove 0 inbox dead letter(s)", "a second redrive of a handled message does nothing")

	var moved inboxMoveOut
	e.json(&moved, "inbox", "dead", "redrive", "--all", "--handler", "ledger", "--tenant", "globex", "--topic",
		"credits")
	require.Equal(t, 1, moved.Count)
	require.Equal(t, "globex", moved.Tenant)
	moved = inboxMoveOut{}
	e.json(&moved, "inbox", "dead", "discard", "ledger", "c-2")
	require.Equal(t, inboxMoveOut{Scope: "all-tenants", Handler: "ledger", IDs: []string{"c-2"}, Count: 1,
		Unknown: []string{}}, moved)
	e.fails(exitFailure, `no inbox dead letter of handler "ledger" with ID c-2`, "inbox", "dead", "discard",
		"ledger", "c-2")
	e.json(&list, "inbox", "dead", "list")
	require.Empty(t, list.DeadLetters)
	st, err := o.AllTenants().InboxStats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.DeadLettered)

	e.fails(exitUsage, "give a handler and at least one message ID, or --all", "inbox", "dead", "redrive", "ledger")
	e.fails(exitUsage, "not both", "inbox", "dead", "redrive", "ledger", "c-1", "--all")
	e.fails(exitUsage, "--handler only applies with --all", "inbox", "dead", "redrive", "ledger", "c-1",
		"--handler", "x")
	e.fails(exitUsage, "requires at least 2 arg", "inbox", "dead", "discard", "ledger")
}
