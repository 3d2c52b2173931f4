package histories_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/proof/histories"
)

// storeThrough returns a store whose pool reaches the server through p, and the store on a direct pool.
func storeThrough(t *testing.T, p *histories.Proxy, schema string) *eventstore.PostgresStore {
	t.Helper()
	u, err := histories.Through(pgtest.URL(t), p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

type appendPath struct {
	name string
	run  func(context.Context, *eventstore.PostgresStore, eventstore.AppendRequest) (eventstore.AppendResult, error)
}

var appendPaths = []appendPath{
	{"Append", func(ctx context.Context, s *eventstore.PostgresStore, r eventstore.AppendRequest) (
		eventstore.AppendResult, error) {
		return s.Append(ctx, r)
	}},
	{"AppendWith", func(ctx context.Context, s *eventstore.PostgresStore, r eventstore.AppendRequest) (
		eventstore.AppendResult, error) {
		return s.AppendWith(ctx, r, nil)
	}},
	{"AppendQueued", func(ctx context.Context, s *eventstore.PostgresStore, r eventstore.AppendRequest) (
		eventstore.AppendResult, error) {
		return s.AppendQueued(ctx, r, nil)
	}},
}

func oneEvent(stream string) eventstore.AppendRequest {
	return eventstore.AppendRequest{StreamID: stream, StreamType: "t", Expected: eventstore.NoStream,
		Events: []eventstore.EventData{{EventID: uuid.New(), Type: "e", Payload: []byte(`{}`)}}}
}

// An append whose COMMIT reached the server and committed, and whose reply was lost with the connection, is never
// reported as a definite failure: the store resolves it as committed (or, failing that, ErrCommitUnknown). With
// AppendWith this once came back as a plain error: pgx reported the broken read of the COMMIT's reply as "conn
// closed", an error it marks safe to retry, and the store took it for one that proves nothing was sent.
func TestLostCommitReplyIsNeverAFailure(t *testing.T) {
	pgtest.CheckLeaks(t)
	_, schema := pgtest.Migrated(t)
	addr, err := histories.ServerAddr(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := histories.NewProxy(addr, histories.ProxyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Close() }()
	s := storeThrough(t, p, schema)
	for _, path := range appendPaths {
		t.Run(path.name, func(t *testing.T) {
			before := p.Stats().CommitReplies
			p.DropCommitReply()
			req := oneEvent("reply-" + path.name)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res, err := path.run(ctx, s, req)
			if p.Stats().CommitReplies != before+1 {
				p.Disarm()
				t.Fatalf("the proxy dropped no commit reply (append: %v)", err)
			}
			if err != nil && !errors.Is(err, eventstore.ErrCommitUnknown) {
				t.Fatalf("a committed append whose reply was lost is reported as a definite failure: %v", err)
			}
			recs, rerr := s.ReadStream(ctx, "", req.StreamID, 1)
			if rerr != nil || len(recs) != 1 || recs[0].EventID != req.Events[0].EventID {
				t.Fatalf("the append did not commit: %v %v", recs, rerr)
			}
			if err == nil && res.Version != 1 {
				t.Fatalf("resolved version %d, want 1", res.Version)
			}
			t.Logf("%s: reply lost, classified as %v", path.name, errOrOK(err))
		})
	}
}

// An append whose COMMIT never reached the server is never reported as a success.
func TestLostCommitRequestIsNeverASuccess(t *testing.T) {
	pgtest.CheckLeaks(t)
	_, schema := pgtest.Migrated(t)
	addr, err := histories.ServerAddr(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := histories.NewProxy(addr, histories.ProxyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Close() }()
	s := storeThrough(t, p, schema)
	for _, path := range appendPaths {
		t.Run(path.name, func(t *testing.T) {
			before := p.Stats().CommitRequests
			p.DropCommitRequest()
			req := oneEvent("request-" + path.name)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err := path.run(ctx, s, req)
			if p.Stats().CommitRequests != before+1 {
				p.Disarm()
				t.Fatalf("the proxy dropped no commit request (append: %v)", err)
			}
			if err == nil {
				t.Fatal("an append whose commit never reached the server is reported as a success")
			}
			recs, rerr := s.ReadStream(ctx, "", req.StreamID, 1)
			if !errors.Is(rerr, eventstore.ErrStreamNotFound) {
				t.Fatalf("the stream exists (%v, %v): the append committed", recs, rerr)
			}
			t.Logf("%s: request lost, classified as %v", path.name, errOrOK(err))
		})
	}
}

func errOrOK(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, eventstore.ErrCommitUnknown):
		return "unknown (ErrCommitUnknown)"
	}
	return "failed: " + err.Error()
}
