package histories_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
	"github.com/stagehand-es/stagehand/proof/histories"
)

func TestMain(m *testing.M) {
	// A worker process of a pipeline run (TestCrashesUnderNetworkFaults and the worker-kills runs through
	// PgBouncer and RabbitMQ).
	histories.RunWorkerIfRequested(rabbitWorkerBroker)
	pgtest.Main(m)
}

// proxied starts a proxy in front of the test server and returns it with a direct pool and a table (id int
// primary key) in a fresh schema.
func proxied(t *testing.T) (*histories.Proxy, *pgxpool.Pool, string) {
	t.Helper()
	pool, schema := pgtest.Schema(t)
	table := pgtest.Q(schema, "t")
	pgtest.Exec(t, pool, "CREATE TABLE "+table+" (id int PRIMARY KEY)")
	addr, err := histories.ServerAddr(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := histories.NewProxy(addr, histories.ProxyOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p, pool, table
}

// connect opens one connection through the proxy (with the test server's SSL mode: the proxy refuses SSL).
func connect(t *testing.T, p *histories.Proxy) *pgx.Conn {
	t.Helper()
	return connectAs(t, p, "proxy-test")
}

// connectAs is connect with application_name app.
func connectAs(t *testing.T, p *histories.Proxy, app string) *pgx.Conn {
	t.Helper()
	u, err := histories.Through(pgtest.URL(t), p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(u, "?") {
		u += "&application_name=" + app
	} else {
		u += "?application_name=" + app
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatalf("connect through the proxy: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// backendGone waits until server process pid has ended.
func backendGone(t *testing.T, pool *pgxpool.Pool, pid uint32) {
	t.Helper()
	pgtest.Eventually(t, 10*time.Second, func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int32(pid)) == 0
	}, "server process %d still running", pid)
}

func TestProxyForwardsAndRefusesSSL(t *testing.T) {
	pgtest.CheckLeaks(t)
	p, _, _ := proxied(t)
	// A raw SSL request is answered 'N' by the proxy itself.
	raw, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	var req [8]byte
	binary.BigEndian.PutUint32(req[0:], 8)
	binary.BigEndian.PutUint32(req[4:], 80877103)
	if _, err := raw.Write(req[:]); err != nil {
		t.Fatal(err)
	}
	var reply [1]byte
	_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(raw, reply[:]); err != nil || reply[0] != 'N' {
		t.Fatalf("SSL request answered %q, %v; want 'N'", reply[0], err)
	}
	_ = raw.Close()

	c := connect(t, p)
	var n int
	if err := c.QueryRow(ctxT(t, 5*time.Second), "SELECT $1::int + 1", 41).Scan(&n); err != nil || n != 42 {
		t.Fatalf("query through the proxy: %d, %v", n, err)
	}
	if s := p.Stats(); s.Accepted < 2 || s.SSLRefused < 1 {
		t.Fatalf("stats %+v: want at least 2 accepted and 1 SSL request refused", s)
	}
}

func TestProxyDropCommitReply(t *testing.T) {
	pgtest.CheckLeaks(t)
	p, pool, table := proxied(t)
	t.Run("explicit transaction", func(t *testing.T) {
		c := connect(t, p)
		ctx := ctxT(t, 10*time.Second)
		pid := c.PgConn().PID()
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		p.DropCommitReply()
		if err := tx.Commit(ctx); err == nil {
			t.Fatal("commit succeeded; want a lost connection")
		}
		backendGone(t, pool, pid)
		if n := pgtest.Count(t, pool, "SELECT count(*) FROM "+table+" WHERE id = 1"); n != 1 {
			t.Fatalf("the server did not commit (%d rows); the reply was to be dropped after the commit", n)
		}
	})
	t.Run("implicit transaction", func(t *testing.T) {
		c := connect(t, p)
		p.DropCommitReply()
		if _, err := c.Exec(ctxT(t, 10*time.Second), "INSERT INTO "+table+" VALUES ($1)", 2); err == nil {
			t.Fatal("insert succeeded; want a lost connection")
		}
		if n := pgtest.Count(t, pool, "SELECT count(*) FROM "+table+" WHERE id = 2"); n != 1 {
			t.Fatalf("the server did not commit (%d rows)", n)
		}
	})
	t.Run("rolled back pipeline passes", func(t *testing.T) {
		// An insert and a failing statement in one implicit transaction: it rolls back, so its reply is not a
		// commit's and passes.
		c := connect(t, p)
		p.DropCommitReply()
		defer p.Disarm()
		b := &pgx.Batch{}
		b.Queue("INSERT INTO " + table + " VALUES (3)")
		b.Queue("SELECT 1/0")
		err := c.SendBatch(ctxT(t, 5*time.Second), b).Close()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22012" {
			t.Fatalf("batch error %v, want the division by zero", err)
		}
		if c.IsClosed() {
			t.Fatal("the proxy cut the connection of a transaction that rolled back")
		}
	})
	t.Run("reads pass", func(t *testing.T) {
		c := connect(t, p)
		p.DropCommitReply()
		defer p.Disarm()
		var n int
		if err := c.QueryRow(ctxT(t, 5*time.Second), "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 2 {
			t.Fatalf("a read while a commit drop is armed: %d, %v", n, err)
		}
	})
	if s := p.Stats(); s.CommitReplies != 2 {
		t.Fatalf("%d commit replies dropped, want 2", s.CommitReplies)
	}
	if f := p.FaultsOn("proxy-test"); f.CommitReplies != 2 || f.CommitRequests != 0 {
		t.Fatalf("faults on the test's application %+v, want 2 commit replies dropped", f)
	}
}

// TestProxyDropCommitReplyTo drops the reply of a commit on a connection of the application named, and lets the
// commits of another application's connection through while it is armed.
func TestProxyDropCommitReplyTo(t *testing.T) {
	pgtest.CheckLeaks(t)
	p, pool, table := proxied(t)
	other, target := connectAs(t, p, "proxy-other"), connectAs(t, p, "proxy-target-1")
	ctx := ctxT(t, 10*time.Second)
	p.DropCommitReplyTo("proxy-target")
	if _, err := other.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
		t.Fatalf("another application's commit: %v", err)
	}
	if _, err := target.Exec(ctx, "INSERT INTO "+table+" VALUES (2)"); err == nil {
		t.Fatal("the target's insert succeeded; want a lost connection")
	}
	if n := pgtest.Count(t, pool, "SELECT count(*) FROM "+table); n != 2 {
		t.Fatalf("%d rows, want both inserts committed", n)
	}
	if f := p.FaultsOn("proxy-target-1"); f.CommitReplies != 1 {
		t.Fatalf("faults on the target %+v, want 1 commit reply dropped", f)
	}
	if f := p.FaultsOn("proxy-other"); f.CommitReplies != 0 {
		t.Fatalf("faults on the other application %+v, want none", f)
	}
}

func TestProxyDropCommitRequest(t *testing.T) {
	pgtest.CheckLeaks(t)
	p, pool, table := proxied(t)
	t.Run("explicit transaction", func(t *testing.T) {
		c := connect(t, p)
		ctx := ctxT(t, 10*time.Second)
		pid := c.PgConn().PID()
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		p.DropCommitRequest()
		if err := tx.Commit(ctx); err == nil {
			t.Fatal("commit succeeded; want a lost connection")
		}
		backendGone(t, pool, pid)
		if n := pgtest.Count(t, pool, "SELECT count(*) FROM "+table); n != 0 {
			t.Fatalf("the server committed (%d rows); the commit was to be withheld", n)
		}
	})
	t.Run("implicit transaction", func(t *testing.T) {
		c := connect(t, p)
		pid := c.PgConn().PID()
		p.DropCommitRequest()
		if _, err := c.Exec(ctxT(t, 10*time.Second), "INSERT INTO "+table+" VALUES ($1)", 2); err == nil {
			t.Fatal("insert succeeded; want a lost connection")
		}
		backendGone(t, pool, pid)
		if n := pgtest.Count(t, pool, "SELECT count(*) FROM "+table); n != 0 {
			t.Fatalf("the server committed (%d rows)", n)
		}
	})
	if s := p.Stats(); s.CommitRequests != 2 {
		t.Fatalf("%d commit requests dropped, want 2", s.CommitRequests)
	}
}

func TestProxyBlackHole(t *testing.T) {
	pgtest.CheckLeaks(t)
	p, _, _ := proxied(t)
	c := connect(t, p)
	p.BlackHole(histories.Both)
	start := time.Now()
	err := c.Ping(ctxT(t, 300*time.Millisecond))
	if err == nil {
		t.Fatal("ping through a black hole succeeded")
	}
	if el := time.Since(start); el < 250*time.Millisecond {
		t.Fatalf("the ping failed after %s, before its deadline: the black hole closed something (%v)", el, err)
	}
	if n := p.ConnectionsOf("proxy-test"); n != 1 {
		t.Fatalf("%d of the test's proxied connections open during the black hole (%d in all), want 1: nothing closed by the proxy", n, p.Connections())
	}
	p.Heal()
	c2 := connect(t, p)
	if err := c2.Ping(ctxT(t, 5*time.Second)); err != nil {
		t.Fatalf("ping after healing: %v", err)
	}
}

func TestProxyBlackHoleOneWay(t *testing.T) {
	pgtest.CheckLeaks(t)
	p, pool, table := proxied(t)
	c := connect(t, p)
	p.BlackHole(histories.ServerToClient) // the request arrives; the reply does not
	_, err := c.Exec(ctxT(t, 500*time.Millisecond), "INSERT INTO "+table+" VALUES (7)")
	if err == nil {
		t.Fatal("insert with its reply black-holed succeeded")
	}
	pgtest.Eventually(t, 5*time.Second, func() bool {
		return pgtest.Count(t, pool, "SELECT count(*) FROM "+table+" WHERE id = 7") == 1
	}, "the insert never reached the server")
	p.Heal()
}

func TestProxyDelay(t *testing.T) {
	pgtest.CheckLeaks(t)
	p, _, _ := proxied(t)
	c := connect(t, p)
	p.SetDelay(60*time.Millisecond, 20*time.Millisecond)
	start := time.Now()
	if err := c.Ping(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 120*time.Millisecond {
		t.Fatalf("a round trip with a 60ms delay each way took %s", el)
	}
	p.SetDelay(0, 0)
	if s := p.Stats(); s.MessagesDelayed < 2 {
		t.Fatalf("%d messages delayed, want at least 2", s.MessagesDelayed)
	}
}

func TestProxyCutMidStream(t *testing.T) {
	pgtest.CheckLeaks(t)
	p, _, _ := proxied(t)
	c := connect(t, p)
	p.CutMidStream()
	var s string
	err := c.QueryRow(ctxT(t, 5*time.Second), "SELECT repeat('x', 4000)").Scan(&s)
	if err == nil {
		t.Fatal("query whose reply was cut succeeded")
	}
	if !c.IsClosed() {
		t.Fatalf("connection still open after a cut (%v)", err)
	}
	if st := p.Stats(); st.CutMidStream != 1 {
		t.Fatalf("%d messages cut, want 1", st.CutMidStream)
	}
}

func TestProxyCutAll(t *testing.T) {
	pgtest.CheckLeaks(t)
	p, pool, _ := proxied(t)
	c := connect(t, p)
	pid := c.PgConn().PID()
	if n := p.CutAll(); n < 1 { // a stray dial to a recycled port may be another
		t.Fatalf("cut %d connections, want the test's", n)
	}
	if err := c.Ping(ctxT(t, 5*time.Second)); err == nil {
		t.Fatal("ping on a cut connection succeeded")
	}
	backendGone(t, pool, pid)
}

func TestProxyHalfOpen(t *testing.T) {
	pgtest.CheckLeaks(t)
	p, pool, _ := proxied(t)
	c := connect(t, p)
	pid := c.PgConn().PID()
	if n := p.HalfOpen(); n < 1 { // a stray dial to a recycled port may be another
		t.Fatalf("half-opened %d connections, want the test's", n)
	}
	err := c.Ping(ctxT(t, 5*time.Second))
	if err == nil {
		t.Fatal("ping on a half-open connection succeeded")
	}
	if errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("the client waited for its deadline (%v); it should read end of stream", err)
	}
	// The client closes on the error; the proxy passes the close on, and the server process ends.
	backendGone(t, pool, pid)
}

// TestProxyArmedDropPassesNotifications: while a commit reply drop is armed, a listening connection between
// exchanges still receives its notifications (they are not a reply to hold back).
func TestProxyArmedDropPassesNotifications(t *testing.T) {
	pgtest.CheckLeaks(t)
	p, pool, _ := proxied(t)
	c := connect(t, p)
	ctx := ctxT(t, 10*time.Second)
	if _, err := c.Exec(ctx, "LISTEN proxy_test"); err != nil {
		t.Fatal(err)
	}
	p.DropCommitReply()
	defer p.Disarm()
	pgtest.Exec(t, pool, "SELECT pg_notify('proxy_test', 'x')")
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if n, err := c.WaitForNotification(wctx); err != nil || n.Payload != "x" {
		t.Fatalf("notification through the proxy with a drop armed: %v, %v", n, err)
	}
}
