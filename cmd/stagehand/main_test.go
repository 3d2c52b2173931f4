package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// result is what one invocation of the CLI produced.
type result struct {
	code           int
	stdout, stderr string
}

// syncBuffer is a bytes.Buffer safe to read while the CLI writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// invoke runs the CLI in-process with no environment and no terminal unless opts says otherwise.
func invoke(ctx context.Context, opts options, args ...string) result {
	var stdout, stderr syncBuffer
	code := runWith(ctx, args, &stdout, &stderr, opts)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// env is a migrated schema on the test server, and the CLI pointed at it.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	url    string
}

func setup(t *testing.T) *env {
	t.Helper()
	pool, schema := pgtest.Migrated(t)
	return &env{t: t, pool: pool, schema: schema, url: pgtest.URL(t)}
}

// args prefixes the connection flags.
func (e *env) args(args ...string) []string {
	return append([]string{"--database-url", e.url, "--schema", e.schema}, args...)
}

// run runs the CLI against the env's schema.
func (e *env) run(args ...string) result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return invoke(ctx, options{}, e.args(args...)...)
}

// ok runs the CLI, requires exit code 0 and returns stdout.
func (e *env) ok(args ...string) string {
	e.t.Helper()
	r := e.run(args...)
	require.Equal(e.t, exitOK, r.code, "stagehand %s\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.stdout,
		r.stderr)
	return r.stdout
}

// json runs the CLI with --json, requires exit code 0 and decodes the one JSON document it printed into v.
func (e *env) json(v any, args ...string) {
	e.t.Helper()
	out := e.ok(append(args, "--json")...)
	decodeOne(e.t, out, v)
}

// decodeOne decodes exactly one JSON document from out.
func decodeOne(t *testing.T, out string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	require.NoError(t, dec.Decode(v), "output: %s", out)
	var extra json.RawMessage
	require.ErrorIs(t, dec.Decode(&extra), io.EOF, "more than one JSON document: %s", out)
}

// fails runs the CLI and requires the exit code and a one-line message on stderr containing want.
func (e *env) fails(code int, want string, args ...string) result {
	e.t.Helper()
	r := e.run(args...)
	requireFailure(e.t, r, code, want)
	return r
}

func requireFailure(t *testing.T, r result, code int, want string) {
	t.Helper()
	require.Equal(t, code, r.code, "stdout: %s\nstderr: %s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, want)
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line on stderr: %q", r.stderr)
	require.True(t, strings.HasPrefix(r.stderr, "stagehand: "), r.stderr)
}

// outbox opens an outbox on the env's schema; clock nil means time.Now.
func (e *env) outbox(clock func() time.Time) *outbox.Outbox {
	e.t.Helper()
	o, err := outbox.New(e.pool, &outbox.Config{Schema: e.schema, Clock: clock})
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = o.Close() })
	return o
}

// store opens the event store on the env's schema.
func (e *env) store(cfg *eventstore.PostgresConfig) *eventstore.PostgresStore {
	e.t.Helper()
	var c eventstore.PostgresConfig
	if cfg != nil {
		c = *cfg
	}
	c.Schema = e.schema
	s, err := eventstore.NewPostgres(e.pool, &c)
	require.NoError(e.t, err)
	e.t.Cleanup(s.Close)
	return s
}

// drain publishes every due message of o through pub; retries 0 dead-letters every rejection at once.
func drain(t *testing.T, o *outbox.Outbox, pub message.Publisher) outbox.DrainResult {
	t.Helper()
	r, err := o.NewRelay(&outbox.RelayConfig{MaxRetryCount: outbox.Retries(0), PollingInterval: 50 * time.Millisecond,
		RetryDelay: 50 * time.Millisecond, ClaimDuration: 5 * time.Second, DisableNotify: true})
	require.NoError(t, err)
	defer func() { _ = r.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := r.Drain(ctx, pub)
	require.NoError(t, err)
	return res
}

// broker is a Watermill publisher that records what it accepts, or rejects everything.
type broker struct {
	mu     sync.Mutex
	reject bool
	got    []string
}

var errRejected = errors.New("destination rejected the message")

func (b *broker) Publish(_ string, msgs ...*message.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reject {
		return errRejected
	}
	for _, m := range msgs {
		b.got = append(b.got, m.UUID)
	}
	return nil
}

func (b *broker) Close() error { return nil }

func (b *broker) published() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.got...)
}
