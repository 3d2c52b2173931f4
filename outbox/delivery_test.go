package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/sony/gobreaker"
	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/outbox"
)

type temporaryErr struct{ temporary bool }

func (e temporaryErr) Error() string   { return "broker busy" }
func (e temporaryErr) Temporary() bool { return e.temporary }

type timeoutErr struct{}

func (timeoutErr) Error() string { return "publish confirmation timed out" }
func (timeoutErr) Timeout() bool { return true }

// The default classifier knows "cannot reach" errors from the standard library and the usual client shapes, wrapped
// any number of times, and leaves rejections by the destination alone.
func TestBrokerUnavailableClassifiesReachability(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("publish to orders: %w", fmt.Errorf("client: %w", err)) }
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	read := &net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}
	for name, err := range map[string]error{
		"ErrBrokerUnavailable":   fmt.Errorf("nats: no servers: %w", outbox.ErrBrokerUnavailable),
		"dial refused":           dial,
		"connection reset":       read,
		"ECONNREFUSED":           syscall.ECONNREFUSED,
		"EPIPE":                  syscall.EPIPE,
		"net.ErrClosed":          net.ErrClosed,
		"dns":                    &net.DNSError{Err: "no such host", Name: "broker"},
		"unexpected EOF":         io.ErrUnexpectedEOF,
		"context deadline":       context.DeadlineExceeded,
		"Timeout()":              timeoutErr{},
		"Temporary()":            temporaryErr{temporary: true},
		"breaker open":           gobreaker.ErrOpenState,
		"breaker half-open full": gobreaker.ErrTooManyRequests,
	} {
		require.True(t, outbox.BrokerUnavailable(err), name)
		require.True(t, outbox.BrokerUnavailable(wrap(err)), "wrapped "+name)
	}
	for name, err := range map[string]error{
		"nil":            nil,
		"rejection":      errors.New("message too large"),
		"not temporary":  temporaryErr{temporary: false},
		"nacked":         outbox.ErrNacked,
		"ack deadline":   outbox.ErrAckDeadline,
		"canceled":       context.Canceled,
		"plain EOF":      io.EOF,
		"invalid config": outbox.ErrInvalidConfig,
	} {
		require.False(t, outbox.BrokerUnavailable(err), name)
	}
}
