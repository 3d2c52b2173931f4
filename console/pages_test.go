package console_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/outbox"
)

// seed fills the world with a little of everything: two streams of two tenants, the messages staged from their
// events (published, pending, dead-lettered), a key held by its dead letter, a scheduled message, inbox dead
// letters.
func (w *world) seed() {
	w.t.Helper()
	acme := w.appendEvents("acme", "order-1", 3, nil)
	globex := w.appendEvents("globex", "order-9", 2, nil)
	var msgs []outbox.Message
	for _, r := range acme {
		msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("acme-%d", r.Version), Topic: "orders", Type: "OrderPlaced",
			Tenant: "acme", PartitionKey: "order-1", SourcePosition: r.Position, Payload: []byte(`{"order":"order-1"}`)})
	}
	for _, r := range globex {
		msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("globex-%d", r.Version), Topic: "billing",
			Type: "Invoice", Tenant: "globex", SourcePosition: r.Position, Payload: []byte(`{"invoice":9}`)})
	}
	w.deadLetter(msgs, func(id string) error {
		if id == "acme-1" || id == "globex-2" {
			return errors.New("payment gateway timeout for " + id)
		}
		return nil
	})
	_, err := w.ob.Stage(context.Background(), outbox.Message{ID: "later", Topic: "reminders", Tenant: "acme", Payload: []byte("{}"),
		ScheduledAt: time.Now().Add(time.Hour)})
	require.NoError(w.t, err)
	w.inboxDeadLetter("billing", "acme", "inv-1", `{"total":12}`, map[string]string{"kind": "invoice"},
		"ledger is down")
}

// Every page renders with data in it, and says what it shows.
func TestPagesRender(t *testing.T) {
	t.Parallel()
	w := newWorld(t, nil)
	start := time.Now()
	w.seed()
	t.Logf("seed: %s", time.Since(start))
	for path, want := range map[string][]string{
		"/":                                   {"outbox dead letters", "appended", "Latency", "outbox:"},
		"/outbox":                             {"Keys held by a dead letter", "order-1", "later", "Relays"},
		"/outbox?by=tenant":                   {"acme", "by tenant"},
		"/outbox?by=key":                      {"order-1"},
		"/outbox/key?tenant=acme&key=order-1": {"acme-2", "acme-3"},
		"/dead":                               {"acme-1", "globex-2", "payment gateway timeout", "2</strong> outbox dead letters"},
		"/dead?source=inbox":                  {"inv-1", "ledger is down", "billing"},
		"/dead?error=GLOBEX":                  {"globex-2", "1</strong> outbox dead letters"},
		"/dead/message?source=outbox&tenant=acme&id=acme-1&topic=orders": {"payment gateway timeout for acme-1",
			"&#34;order&#34;: &#34;order-1&#34;", "holds its key"},
		"/dead/message?source=inbox&tenant=acme&handler=billing&id=inv-1": {"ledger is down", "invoice"},
		"/projections":                         {"Projections", "No parked event"},
		"/events":                              {"order.placed", "order-9"},
		"/events?stream=order-1&tenant=acme":   {"acme-1", "dead-lettered", "acme-2", "pending"},
		"/events?stream=order-9&tenant=globex": {"globex-1", "sent"},
		"/events?position=1":                   {"order.placed", "acme-1"},
		"/audit":                               {"no action recorded"},
	} {
		start := time.Now()
		page := w.page(path)
		t.Logf("%s: %s", path, time.Since(start))
		for _, s := range want {
			require.Contains(t, page, s, "GET %s", path)
		}
		require.Contains(t, page, "read-only", "GET %s: the mode is shown", path)
	}
	code, page := w.get("/nope")
	require.Equal(t, 404, code, page)
	code, page = w.get("/dead/message?source=outbox&tenant=acme&id=nope")
	require.Equal(t, 404, code)
	require.Contains(t, page, "no outbox dead letter")
	code, _ = w.get("/dead?source=kafka")
	require.Equal(t, 400, code)
	code, _ = w.get("/events?stream=nope&tenant=acme")
	require.Equal(t, 404, code)
}
