// Package pgnotify is stagehand's one LISTEN/NOTIFY mechanism: wake-up signals sent after commit, coalesced, and a
// listener that reconnects by itself.
//
// NOTIFY is never sent inside a writer's transaction: PostgreSQL serialises the commits of every transaction that
// notified (a database-wide lock held until after commit), which would undo group commit. Writers call
// Notifier.Notify after their commit instead; a burst of calls becomes one NOTIFY. Wake-ups are hints: every
// consumer also polls, so a lost notification only costs latency.
package pgnotify

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgxlisten"
)

// Execer sends statements; *pgxpool.Pool satisfies it.
type Execer interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Notifier sends pg_notify(channel) after commits. The first call of a quiet period notifies at once; calls made
// while a NOTIFY is in flight, or within MinInterval after one, cause exactly one more at the end of that interval.
// So an isolated commit wakes followers immediately, and a sustained stream of commits costs at most one NOTIFY
// per MinInterval (each costs the server a transaction and a write to its notification queue, about a quarter of a
// millisecond measured here, as much as a small insert).
type Notifier struct {
	db      Execer
	channel string
	logger  *slog.Logger

	mu      sync.Mutex
	running bool
	pending bool
	closed  bool
	wg      sync.WaitGroup
}

// NewNotifier returns a Notifier for channel. logger may be nil.
func NewNotifier(db Execer, channel string, logger *slog.Logger) *Notifier {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Notifier{db: db, channel: channel, logger: logger}
}

// Notify schedules a wake-up. It never blocks on the database.
func (n *Notifier) Notify() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	if n.running {
		n.pending = true
		return
	}
	n.running = true
	n.wg.Add(1)
	go n.loop()
}

// MinInterval is the least time between two notifications of one Notifier under sustained load.
const MinInterval = 5 * time.Millisecond

func (n *Notifier) loop() {
	defer n.wg.Done()
	for {
		sent := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := n.send(ctx); err != nil {
			n.logger.Debug("stagehand: wake-up notify failed; consumers fall back to polling",
				"channel", n.channel, "error", err)
		}
		cancel()
		// Calls arriving during the interval are folded into one NOTIFY at its end.
		time.Sleep(time.Until(sent.Add(MinInterval)))
		n.mu.Lock()
		if !n.pending || n.closed {
			n.running = false
			n.mu.Unlock()
			return
		}
		n.pending = false
		n.mu.Unlock()
	}
}

// send issues the NOTIFY in one statement whose implicit transaction commits with synchronous_commit off. NOTIFY
// assigns a transaction ID, so a durable commit would cost every writer a second WAL flush; a wake-up needs no
// durability (it is delivered at commit either way, and followers poll besides).
func (n *Notifier) send(ctx context.Context) error {
	b := &pgx.Batch{}
	b.Queue("SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, '')", n.channel)
	return n.db.SendBatch(ctx, b).Close()
}

// Close stops accepting notifications and waits for the one in flight. It is safe to call more than once.
func (n *Notifier) Close() {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	n.wg.Wait()
}

// Listen starts listening on channel over a dedicated connection built from pool's configuration and returns a
// channel that receives a (coalesced) signal for every notification and after every (re)connection, so a consumer
// also catches up on what happened while it was disconnected. The listener reconnects after reconnectDelay
// (default 1s) when its connection is killed or the database restarts. stop cancels it and waits for it to end.
func Listen(ctx context.Context, pool *pgxpool.Pool, channel string, reconnectDelay time.Duration,
	logger *slog.Logger) (wake <-chan struct{}, stop func()) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reconnectDelay <= 0 {
		reconnectDelay = time.Second
	}
	ch := make(chan struct{}, 1)
	signal := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	l := &pgxlisten.Listener{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			return pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
		},
		LogError: func(ctx context.Context, err error) {
			if ctx.Err() == nil {
				logger.Debug("stagehand: listener error; reconnecting", "channel", channel, "error", err)
			}
		},
		ReconnectDelay: reconnectDelay,
	}
	l.Handle(channel, wakeHandler(signal))
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.Listen(ctx)
	}()
	return ch, func() {
		cancel()
		<-done
	}
}

// ProbeTimeout bounds CheckDelivery's wait for its probe notification.
const ProbeTimeout = 5 * time.Second

// CheckDelivery reports whether a connection opened with pool's configuration, as Listen opens one, receives the
// notifications sent to a channel it listens on. It returns "" when it does, and otherwise why not.
//
// A direct connection passes at once: the process ID the server reported when it started (its BackendKeyData) is
// the process serving it (pg_backend_pid). A connection pooler hands out keys of its own, so a pooled connection
// is probed: it LISTENs on a fresh channel, another connection notifies it, and the notification must arrive
// within ProbeTimeout. A pooler in session pooling mode delivers it (the client keeps its server session); one in
// transaction pooling mode (PgBouncer's pool_mode=transaction, the most common) does not: LISTEN succeeds on
// whichever server connection ran it, which then serves other clients, and the notifications never reach the
// listener. An error means the check could not run (the database unreachable).
func CheckDelivery(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	cfg := pool.Config().ConnConfig
	conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var pid int32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return "", err
	}
	if uint32(pid) == conn.PgConn().PID() {
		return "", nil
	}
	var tag [8]byte
	_, _ = rand.Read(tag[:])
	channel := "stagehand.probe." + hex.EncodeToString(tag[:])
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return "", err
	}
	other, err := pgx.ConnectConfig(ctx, cfg.Copy())
	if err != nil {
		return "", err
	}
	_, err = other.Exec(ctx, "SELECT pg_notify($1, '')", channel)
	_ = other.Close(context.WithoutCancel(ctx))
	if err != nil {
		return "", err
	}
	wctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	if _, err := conn.WaitForNotification(wctx); err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if !errors.Is(err, context.DeadlineExceeded) && !pgconn.Timeout(err) {
			return "", err
		}
		return fmt.Sprintf("its connections go through a connection pooler (the server process serving one, %d, "+
			"is not the one it was started with) that delivered no notification to a listening connection within "+
			"%s: a pooler in transaction pooling mode (PgBouncer's pool_mode=transaction) loses every LISTEN",
			pid, ProbeTimeout), nil
	}
	return "", nil
}

type wakeHandler func()

func (h wakeHandler) HandleNotification(context.Context, *pgconn.Notification, *pgx.Conn) error {
	h()
	return nil
}

// HandleBacklog signals once after every (re)connection.
func (h wakeHandler) HandleBacklog(context.Context, string, *pgx.Conn) error {
	h()
	return nil
}

// Channel returns the notification channel name for a stagehand component in a schema: "stagehand.<schema>.
// <component>" when that fits in PostgreSQL's 63 bytes, else "stagehand.<hash of the schema>.<component>", so
// the name is always a whole, valid identifier (never cut inside a UTF-8 character) and two long schemas never
// share a channel.
func Channel(schema, component string) string {
	name := "stagehand." + schema + "." + component
	if len(name) <= maxChannel {
		return name
	}
	sum := sha256.Sum256([]byte(schema))
	name = "stagehand." + hex.EncodeToString(sum[:8]) + "." + component
	if len(name) > maxChannel {
		sum := sha256.Sum256([]byte(schema + "." + component))
		name = "stagehand." + hex.EncodeToString(sum[:16])
	}
	return name
}

// maxChannel is the longest channel name PostgreSQL keeps, in bytes.
const maxChannel = 63
