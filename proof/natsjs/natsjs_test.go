package natsjs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

func TestUnavailableClassifiesReachability(t *testing.T) {
	for _, err := range []error{nats.ErrNoServers, nats.ErrConnectionClosed, nats.ErrNoResponders,
		context.DeadlineExceeded, &nats.APIError{Code: 503, Description: "jetstream unavailable"}} {
		require.True(t, Unavailable(fmt.Errorf("publish: %w", err)), "%v", err)
	}
	for _, err := range []error{errors.New("message too large"), &nats.APIError{Code: 400}, nats.ErrBadSubject} {
		require.False(t, Unavailable(fmt.Errorf("publish: %w", err)), "%v", err)
	}
}

func TestStartServesJetStream(t *testing.T) {
	srv, err := Start("natsjs-test", server.RANDOM_PORT, t.TempDir(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := nc.JetStream()
	require.NoError(t, err)
	_, err = js.AccountInfo()
	require.NoError(t, err, "JetStream is enabled")
}
