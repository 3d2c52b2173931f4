package faultsuite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/outbox"
)

// A relay process: the test binary re-executed with envChild=relay. It runs one outbox relay, through a Watermill
// router, to the run's broker behind a publisher that rejects a fraction of publishes, until SIGTERM (or SIGKILL,
// which is the point). It tells the parent what happens on standard output, one line per event, written at once
// (unbuffered), so a line written before a SIGKILL is never lost:
//
//	ready                      the router runs
//	published <n>              publishes acknowledged by the broker so far (every 100 ms, when it changed)
//	reject <message id>        a publish rejected on purpose (before it reached the broker)
//	unexpected <id> <error>    a delivery rejected for another reason (it counts an attempt)
//	unreachable <id> <error>   a delivery that found the broker unreachable (no attempt counted)
//	deadletter <id> <error>    a message moved to the dead letters
//
// Its logs go to standard error, which the parent forwards to its logger.

const (
	envChild    = "STAGEHAND_FAULTSUITE_CHILD"
	envDB       = "STAGEHAND_FAULTSUITE_DB"
	envSchema   = "STAGEHAND_FAULTSUITE_SCHEMA"
	envBroker   = "STAGEHAND_FAULTSUITE_BROKER"     // the broker's kind (Config.Broker)
	envURL      = "STAGEHAND_FAULTSUITE_BROKER_URL" // where the relay's publisher connects
	envSlot     = "STAGEHAND_FAULTSUITE_SLOT"
	envReject   = "STAGEHAND_FAULTSUITE_REJECT"
	envRetries  = "STAGEHAND_FAULTSUITE_RETRIES"
	envLogLevel = "STAGEHAND_FAULTSUITE_LOG"
)

// errInjected is the error of a publish rejected on purpose.
var errInjected = errors.New("faultsuite: publish rejected on purpose")

// RunChildIfRequested runs a relay process (or a NATS server process) and exits when this process was started as
// one (by Run, through Config.ChildCommand); otherwise it returns at once. Call it first in the test binary's
// TestMain.
func RunChildIfRequested() {
	run := map[string]func() error{"relay": runRelayChild, "nats": runNATSChild}[os.Getenv(envChild)]
	if run == nil {
		return
	}
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "level=ERROR msg=\"%s process failed\" error=%q\n", os.Getenv(envChild), err.Error())
		os.Exit(1)
	}
	os.Exit(0)
}

// relaySettings are the relays' processing settings, the same in every relay process.
func relaySettings(slot string, retries int, unavailable func(error) bool, logger *slog.Logger,
	hooks outbox.Hooks) *outbox.RelayConfig {
	return &outbox.RelayConfig{
		BatchSize:              100,
		PollingInterval:        100 * time.Millisecond,
		MaxRetryCount:          outbox.Retries(retries),
		RetryDelay:             20 * time.Millisecond, // a rejected message is retried soon: 20 ms, 40 ms, ...
		MaxRetryDelay:          500 * time.Millisecond,
		MaxDegreeOfParallelism: 8,
		ProcessorID:            "faults-" + slot,
		// A killed relay's rows wait this long for another relay; the survivors renew theirs every third of it.
		ClaimDuration:       2 * time.Second,
		AckDeadline:         15 * time.Second, // above the publishers' wait for the broker's acknowledgement
		IsBrokerUnavailable: unavailable,
		BrokerBackoff:       100 * time.Millisecond,
		MaxBrokerBackoff:    time.Second,
		Logger:              logger,
		Hooks:               hooks,
	}
}

func runRelayChild() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go exitWithParent(ctx, stop)

	slot := os.Getenv(envSlot)
	level := slog.LevelWarn
	if err := level.UnmarshalText([]byte(os.Getenv(envLogLevel))); err != nil {
		level = slog.LevelWarn
	}
	logger := slog.New(quietInjected(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
	rate, err := strconv.ParseFloat(os.Getenv(envReject), 64)
	if err != nil {
		return fmt.Errorf("%s: %w", envReject, err)
	}
	retries, err := strconv.Atoi(os.Getenv(envRetries))
	if err != nil {
		return fmt.Errorf("%s: %w", envRetries, err)
	}
	out := &lines{w: os.Stdout}

	pc, err := pgxpool.ParseConfig(os.Getenv(envDB))
	if err != nil {
		return fmt.Errorf("database URL: %w", err)
	}
	pc.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, pc) // connects lazily: a relay started while PostgreSQL restarts waits
	if err != nil {
		return fmt.Errorf("pool: %w", err)
	}
	defer pool.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: os.Getenv(envSchema), Logger: logger})
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	defer ob.Close()

	var published atomic.Int64
	hooks := outbox.Hooks{
		Delivered: func(_ context.Context, d outbox.Delivery, o outbox.Outcome, err error, _ time.Duration) {
			switch {
			case o == outbox.Published:
				published.Add(1)
			case o == outbox.Rejected && !errors.Is(err, errInjected):
				out.printf("unexpected %s %s", d.MessageID, oneLine(err))
			case o == outbox.Unreachable:
				out.printf("unreachable %s %s", d.MessageID, oneLine(err))
			}
		},
		DeadLettered: func(_ context.Context, d outbox.Delivery, err error) {
			out.printf("deadletter %s %s", d.MessageID, oneLine(err))
		},
	}
	pub, unavailable, err := newPublisherFor(os.Getenv(envBroker), os.Getenv(envURL), "faultsuite relay "+slot,
		logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	relay, err := ob.NewRelay(relaySettings(slot, retries, unavailable, logger, hooks))
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	defer relay.Close()
	wlog := watermill.NewSlogLogger(logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, wlog)
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}
	relay.AddToRouter(router, &rejectingPublisher{next: pub, rate: rate, out: out}, nil)

	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-router.Running():
			out.printf("ready")
		case <-ctx.Done():
			return
		}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		var last int64
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if n := published.Load(); n != last {
					out.printf("published %d", n)
					last = n
				}
			}
		}
	}()
	if err := router.Run(ctx); err != nil && ctx.Err() == nil {
		stop()
		return fmt.Errorf("router: %w", err)
	}
	stop()
	return nil
}

// exitWithParent ends the relay process when the process that started it is gone (a parent killed by a test
// timeout, say), so no relay outlives its run.
func exitWithParent(ctx context.Context, stop func()) {
	parent := os.Getppid()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if os.Getppid() != parent {
				stop()
				return
			}
		}
	}
}

// rejectingPublisher is the destination as a relay process sees it: it rejects a fraction of publishes at random
// (before they reach the broker) and passes the rest to the broker's publisher.
type rejectingPublisher struct {
	next message.Publisher
	rate float64
	out  *lines
}

func (p *rejectingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		if rand.Float64() < p.rate {
			p.out.printf("reject %s", msg.UUID) // written before the relay learns of it, so never lost to a kill
			return fmt.Errorf("message %s: %w", msg.UUID, errInjected)
		}
	}
	return p.next.Publish(topic, msgs...)
}

func (p *rejectingPublisher) Close() error { return nil } // the broker's publisher is closed by its owner

// lines writes whole lines to w, one write each.
type lines struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lines) printf(format string, args ...any) {
	s := fmt.Sprintf(format, args...) + "\n"
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = io.WriteString(l.w, s)
}

func oneLine(err error) string {
	if err == nil {
		return "<nil>"
	}
	return strings.ReplaceAll(err.Error(), "\n", " ")
}
