package main

import (
	"bufio"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

type eventOut struct {
	Position        int64             `json:"position"`
	Tenant          string            `json:"tenant"`
	StreamType      string            `json:"stream_type"`
	StreamID        string            `json:"stream_id"`
	Version         int64             `json:"version"`
	Type            string            `json:"type"`
	PayloadEncoding string            `json:"payload_encoding"`
	Payload         json.RawMessage   `json:"payload"`
	Metadata        map[string]string `json:"metadata"`
}

type tailOut struct {
	Events       []eventOut `json:"events"`
	LastPosition int64      `json:"last_position"`
}

func positions(evs []eventOut) []int64 {
	out := []int64{}
	for _, e := range evs {
		out = append(out, e.Position)
	}
	return out
}

func (e *env) tail(args ...string) tailOut {
	e.t.Helper()
	var out tailOut
	e.json(&out, append([]string{"events", "tail"}, args...)...)
	return out
}

// seedEvents appends six events: positions 1-3 on acme's account acc-1, 4-5 on an untenanted order, 6 on acc-1.
func seedEvents(t *testing.T, store *eventstore.PostgresStore) {
	appendEvents(t, store, "acme", "bank.account", "acc-1", "account.opened", "account.deposited",
		"account.deposited")
	appendEvents(t, store, "", "shop.order", "ord-1", "order.placed", "order.shipped")
	appendEvents(t, store, "acme", "bank.account", "acc-1", "account.closed")
}

// events tail prints the log in order with --from, --limit and the filters; events stream prints one stream.
func TestEventsTailAndStream(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seedEvents(t, e.store(nil))

	all := e.tail()
	require.Equal(t, []int64{1, 2, 3, 4, 5, 6}, positions(all.Events))
	require.Equal(t, int64(6), all.LastPosition)
	first := all.Events[0]
	require.Equal(t, eventOut{Position: 1, Tenant: "acme", StreamType: "bank.account", StreamID: "acc-1",
		Version: 1, Type: "account.opened", PayloadEncoding: "json", Payload: first.Payload}, first)
	require.JSONEq(t, `{"n": 1}`, string(first.Payload))

	require.Equal(t, []int64{5, 6}, positions(e.tail("--from", "-2").Events))
	require.Equal(t, []int64{3, 4}, positions(e.tail("--from", "3", "--limit", "2").Events))
	require.Empty(t, e.tail("--from", "head").Events)
	require.Equal(t, []int64{4, 5}, positions(e.tail("--stream-type", "shop.order").Events))
	require.Equal(t, []int64{2, 3, 5}, positions(e.tail("--type", "account.deposited", "--type",
		"order.shipped").Events))
	require.Equal(t, []int64{4, 5}, positions(e.tail("--tenant", "").Events), "the no-tenant value")
	require.Equal(t, []int64{1, 2, 3, 6}, positions(e.tail("--tenant", "acme", "--batch-size", "1").Events))

	human := e.ok("events", "tail", "--from", "4")
	lines := strings.Split(strings.TrimSpace(human), "\n")
	require.Len(t, lines, 3)
	require.Regexp(t, `^#4 \S+ shop.order/ord-1@1 order.placed \{"n":1\}$`, lines[0])
	require.Regexp(t, `^#6 \S+ bank.account/acc-1@4 account.closed tenant=acme \{"n":1\}$`, lines[2])
	e.fails(exitUsage, `--from "x"`, "events", "tail", "--from", "x")

	var stream struct {
		Tenant     string     `json:"tenant"`
		StreamID   string     `json:"stream_id"`
		StreamType string     `json:"stream_type"`
		Version    int64      `json:"version"`
		Events     []eventOut `json:"events"`
	}
	e.json(&stream, "events", "stream", "acc-1", "--tenant", "acme")
	require.Equal(t, "bank.account", stream.StreamType)
	require.Equal(t, int64(4), stream.Version)
	require.Equal(t, []int64{1, 2, 3, 6}, positions(stream.Events))
	e.json(&stream, "events", "stream", "acc-1", "--tenant", "acme", "--from-version", "3")
	require.Equal(t, []int64{3, 6}, positions(stream.Events))
	human = e.ok("events", "stream", "ord-1")
	require.Contains(t, human, "Stream shop.order/ord-1, tenant -: version 2")
	require.Regexp(t, `2\s+5\s+order.shipped\s+\S+\s+\{"n":2\}`, human)

	e.fails(exitFailure, `no stream "acc-1" for tenant -`, "events", "stream", "acc-1")
	e.fails(exitFailure, `no stream "acc-1" for tenant globex`, "events", "stream", "acc-1", "--tenant", "globex")
}

// follow runs events tail --follow in the background and returns its output, a channel that receives a signal
// when it has read everything and waits, and a stop that cancels it and returns its result.
func (e *env) follow(args ...string) (*syncBuffer, <-chan struct{}, func() result) {
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	idle := make(chan struct{}, 1)
	opts := options{followIdle: func() {
		select {
		case idle <- struct{}{}:
		default:
		}
	}}
	done := make(chan int, 1)
	go func() {
		done <- runWith(ctx, e.args(append([]string{"events", "tail", "--follow"}, args...)...), &stdout, &stderr,
			opts)
	}()
	var res *result
	stop := func() result {
		if res == nil {
			cancel()
			code := <-done
			res = &result{code: code, stdout: stdout.String(), stderr: stderr.String()}
		}
		return *res
	}
	e.t.Cleanup(func() { stop() })
	return &stdout, idle, stop
}

// waitIdle waits until the follower has read everything and waits for a wake-up.
func waitIdle(t *testing.T, idle <-chan struct{}) {
	t.Helper()
	select {
	case <-idle:
	case <-time.After(10 * time.Second):
		t.Fatal("events tail --follow never caught up")
	}
}

func jsonLines(t *testing.T, out string) []eventOut {
	var evs []eventOut
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var ev eventOut
		require.NoError(t, json.Unmarshal(sc.Bytes(), &ev), "line %q", sc.Text())
		evs = append(evs, ev)
	}
	return evs
}

// events tail --follow prints an event appended after it started (woken by the store's notification: the poll
// interval is far longer than the wait), then stops cleanly on cancel, leaving no goroutine behind.
func TestEventsTailFollowWithNotify(t *testing.T) {
	pgtest.CheckLeaks(t) // not parallel: the leak check sees every goroutine
	e := setup(t)
	store := e.store(nil)
	appendEvents(t, store, "", "bank.account", "acc-1", "account.opened")

	out, idle, stop := e.follow("--from", "start", "--json", "--poll-interval", "1m", "--type",
		"account.deposited", "--type", "account.opened")
	waitIdle(t, idle)
	require.Len(t, jsonLines(t, out.String()), 1, "the existing event is printed")
	appendEvents(t, store, "", "bank.account", "acc-1", "account.deposited")
	appendEvents(t, store, "", "shop.order", "ord-1", "order.placed")
	appendEvents(t, store, "", "bank.account", "acc-2", "account.opened")
	pgtest.Eventually(t, 10*time.Second, func() bool { return len(jsonLines(t, out.String())) == 3 },
		"events appended after the start are printed within the wait, long before the next poll")
	r := stop()
	require.Equal(t, exitOK, r.code, "Ctrl-C is the normal end of --follow: %s", r.stderr)
	require.Empty(t, r.stderr)
	evs := jsonLines(t, r.stdout)
	require.Equal(t, []int64{1, 2, 4}, positions(evs), "filtered, in log order")
	require.Equal(t, "account.opened", evs[2].Type)
}

// Without notifications (a writer that sends none) --follow still sees new events by polling; in human form,
// from the head (only new events) by default, and stopping after --limit.
func TestEventsTailFollowPolls(t *testing.T) {
	t.Parallel()
	e := setup(t)
	store := e.store(&eventstore.PostgresConfig{DisableNotify: true})
	appendEvents(t, store, "", "bank.account", "acc-1", "account.opened")

	out, idle, stop := e.follow("--poll-interval", "50ms")
	waitIdle(t, idle)
	appendEvents(t, store, "", "bank.account", "acc-1", "account.deposited")
	pgtest.Eventually(t, 10*time.Second, func() bool { return strings.Contains(out.String(), "#2 ") },
		"the new event is found by polling")
	r := stop()
	require.Equal(t, exitOK, r.code, r.stderr)
	require.NotContains(t, r.stdout, "#1 ", "--follow starts at the head: only new events")
	require.Regexp(t, `^#2 \S+ bank.account/acc-1@2 account.deposited \{"n":1\}\n$`, r.stdout)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r = invoke(ctx, options{}, e.args("events", "tail", "--follow", "--from", "start", "--limit", "2", "--json")...)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Equal(t, []int64{1, 2}, positions(jsonLines(t, r.stdout)), "--limit ends --follow")
}
