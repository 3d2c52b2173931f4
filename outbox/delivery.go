package outbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/sony/gobreaker"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/pgnotify"
	"github.com/stagehand-es/stagehand/internal/telemetry"
)

// delivery is one attempt to deliver a row. It travels in the delivered message's context so whoever handles the
// message can record why it failed (Watermill's Nack carries no error).
type delivery struct {
	row *row
	// timer is the delivering worker's ack-deadline timer, stopped between deliveries (one per worker rather than
	// one per message); nil: viaChannel makes its own.
	timer *time.Timer

	mu  sync.Mutex
	err error
}

type deliveryKey struct{}

func (d *delivery) setErr(err error) {
	d.mu.Lock()
	d.err = err
	d.mu.Unlock()
}

func (d *delivery) recorded() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

func deliveryFrom(msg *message.Message) *delivery {
	if msg == nil {
		return nil
	}
	d, _ := msg.Context().Value(deliveryKey{}).(*delivery)
	return d
}

// RecordError attaches the reason a delivered message failed, before the message is nacked (or before a router
// handler returns the error, which makes the router nack it). The relay stores it as the row's last error and
// classifies it with RelayConfig.IsBrokerUnavailable: a broker that cannot be reached costs no attempt. It does
// nothing for messages that did not come from a Relay.
func RecordError(msg *message.Message, err error) {
	if d := deliveryFrom(msg); d != nil && err != nil {
		d.setErr(err)
	}
}

// DestinationTopic returns the topic a message delivered by a Relay was staged for.
func DestinationTopic(msg *message.Message) (string, bool) {
	if d := deliveryFrom(msg); d != nil {
		return d.row.topic, true
	}
	return "", false
}

// viaChannel hands the message to a subscriber's consumer and waits for its answer.
func (d *delivery) viaChannel(ctx context.Context, out chan<- *message.Message, deadline time.Duration) outcome {
	msg := d.row.watermillMessage()
	telemetry.Inject(ctx, msg.Metadata) // the publish span's context, for the consumer
	mctx, cancel := context.WithCancel(context.WithValue(ctx, deliveryKey{}, d))
	defer cancel() // the message's context ends with its delivery
	msg.SetContext(mctx)
	select {
	case out <- msg:
	case <-ctx.Done():
		return outcome{kind: Released}
	}
	timer := d.timer
	if timer == nil {
		timer = time.NewTimer(deadline)
	} else {
		timer.Reset(deadline)
	}
	defer stopTimer(timer)
	select {
	case <-msg.Acked():
		return outcome{kind: Published}
	case <-msg.Nacked():
		return d.failure(d.recorded())
	case <-timer.C:
		return outcome{kind: Rejected, err: ErrAckDeadline}
	case <-ctx.Done():
		select {
		case <-msg.Acked():
			return outcome{kind: Published}
		default:
			return outcome{kind: Released}
		}
	}
}

// stopTimer stops t and empties its channel, so a reused timer never hands its next delivery a deadline that
// fired during this one (with Go 1.23's timers Stop alone does that; with asynctimerchan=1 it does not).
func stopTimer(t *time.Timer) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
}

// viaPublisher publishes the message itself (Drain).
func (d *delivery) viaPublisher(ctx context.Context, pub message.Publisher) outcome {
	msg := d.row.watermillMessage()
	telemetry.Inject(ctx, msg.Metadata) // the publish span's context, for the consumer
	mctx, cancel := context.WithCancel(context.WithValue(ctx, deliveryKey{}, d))
	defer cancel()
	msg.SetContext(mctx)
	if err := pub.Publish(d.row.topic, msg); err != nil {
		return d.failure(err)
	}
	return outcome{kind: Published}
}

// failure is filled in by the subscription, which knows the classifier; see subscription.deliverUnit.
func (d *delivery) failure(err error) outcome {
	if err == nil {
		err = ErrNacked
	}
	return outcome{kind: Rejected, err: err}
}

// ErrBrokerUnavailable marks a publish error as "the broker could not be reached". Wrap it
// (fmt.Errorf("...: %w", outbox.ErrBrokerUnavailable)) in a publisher or middleware to make the relay back off
// without counting an attempt, whatever the classifier.
var ErrBrokerUnavailable = errors.New("outbox: broker unavailable")

// BrokerUnavailable is the default RelayConfig.IsBrokerUnavailable. It reports true for errors that mean the
// message did not reach a broker that could answer, without importing any broker client:
//   - ErrBrokerUnavailable, wrapped anywhere in the chain (the way to classify an error of your own);
//   - a refused, reset, aborted or unreachable connection, a broken pipe (syscall ECONNREFUSED, ECONNRESET,
//     ECONNABORTED, EHOSTUNREACH, ENETUNREACH, EPIPE), a closed network connection (net.ErrClosed);
//   - a failed or timed-out dial (*net.OpError with Op "dial"), a failed name lookup (*net.DNSError);
//   - a connection that broke before the broker answered (io.ErrUnexpectedEOF);
//   - a timeout: an error in the chain whose Timeout() reports true, context.DeadlineExceeded included (the
//     broker did not answer in time: a deadline on connect, or a publish confirmation that never came);
//   - an error in the chain whose Temporary() reports true (the client says "try again later");
//   - an open circuit breaker (gobreaker's ErrOpenState and ErrTooManyRequests, as returned by Watermill's
//     CircuitBreaker middleware).
//
// A broker's own errors for "cannot serve now" (NATS ErrNoServers or a JetStream 503, Kafka's leader elections,
// AMQP's connection-closed) are not known here: add them with a RelayConfig.IsBrokerUnavailable that calls
// BrokerUnavailable first, or wrap ErrBrokerUnavailable in a publisher middleware. A publish whose every attempt
// times out is never dead-lettered under this classifier; supply one that returns false for timeouts if such a
// message should use up its retries instead.
func BrokerUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrBrokerUnavailable) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	for _, errno := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EHOSTUNREACH,
		syscall.ENETUNREACH, syscall.ECONNABORTED, syscall.EPIPE} {
		if errors.Is(err, errno) {
			return true
		}
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return true
	}
	var timeout interface{ Timeout() bool }
	if errors.As(err, &timeout) && timeout.Timeout() {
		return true
	}
	var temporary interface{ Temporary() bool }
	if errors.As(err, &temporary) && temporary.Temporary() {
		return true
	}
	return errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests)
}

// checkListen refuses, once per relay, a relay that would listen for wake-up notifications on a pool that cannot
// deliver them (a pooler in transaction pooling mode). When the check cannot run (the database unreachable), the
// relay starts and listens as usual.
func (r *Relay) checkListen(ctx context.Context) error {
	if r.s.DisableNotify || r.listenChecked.Load() {
		return nil
	}
	reason, err := pgnotify.CheckDelivery(ctx, r.o.pool)
	if err != nil {
		r.s.Logger.DebugContext(ctx, "stagehand: could not check that the relay's pool delivers notifications",
			"error", err)
		return nil
	}
	if reason != "" {
		return fmt.Errorf("%w: outbox: the relay listens for wake-up notifications on the outbox's pool, and %s; "+
			"set RelayConfig.DisableNotify to poll only, or run the relay on an outbox whose pool connects to "+
			"PostgreSQL directly", stagehand.ErrPooledConnection, reason)
	}
	r.listenChecked.Store(true)
	return nil
}

// listenFor listens for the outbox's wake-up notifications.
func listenFor(ctx context.Context, o *Outbox, reconnect time.Duration, logger *slog.Logger) (<-chan struct{}, func()) {
	return pgnotify.Listen(ctx, o.pool, o.channel, reconnect, logger)
}
