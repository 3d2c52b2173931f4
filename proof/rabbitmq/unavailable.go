package rabbitmq

import (
	"errors"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/stagehand-es/stagehand/outbox"
)

// Unavailable is an outbox.RelayConfig.IsBrokerUnavailable for RabbitMQ: besides what outbox.BrokerUnavailable
// knows (refused connections, timeouts, outbox.ErrBrokerUnavailable, which Publisher wraps around every failure
// while its connection is down), the AMQP errors that mean the broker cannot take messages now: a connection or
// channel that is not open (504), a connection the broker closed because it is shutting down (320
// CONNECTION_FORCED), a frame error (501) or unexpected frame (505) on a broken connection, a broker out of
// resources (506) and its internal errors (541). Channel-level refusals about the message or the topology (404
// NOT_FOUND for a missing exchange, 403 ACCESS_REFUSED, 406 PRECONDITION_FAILED, an unroutable message) are
// rejections: they count an attempt and end in the dead letters.
func Unavailable(err error) bool {
	if outbox.BrokerUnavailable(err) || errors.Is(err, amqp.ErrClosed) {
		return true
	}
	var e *amqp.Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code {
	case amqp.ConnectionForced, amqp.ChannelError, amqp.FrameError, amqp.UnexpectedFrame, amqp.ResourceError,
		amqp.InternalError:
		return true
	}
	return false
}
