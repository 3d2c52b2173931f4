// Package natsjs is the embedded NATS JetStream server and the error classification that stagehand's fault suite
// and end-to-end benchmarks share: one place that starts a server for them, routes its log to a *slog.Logger, and
// tells the relay which NATS client errors mean "broker unreachable". (examples/orders keeps its own copy on
// purpose: an example is read on its own.)
package natsjs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/stagehand-es/stagehand/outbox"
)

// Start starts a NATS server with JetStream on 127.0.0.1:port (server.RANDOM_PORT for any free port), its store in
// dir, its log lines sent to logger, and waits until it accepts connections. Starting it again on the same port
// and dir is a broker restart: streams and durable consumers survive.
func Start(name string, port int, dir string, logger *slog.Logger) (*server.Server, error) {
	srv, err := server.NewServer(&server.Options{
		ServerName: name,
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		NoSigs:     true,
	})
	if err != nil {
		return nil, fmt.Errorf("natsjs: %w", err)
	}
	srv.SetLoggerV2(serverLogger{logger}, false, false, false)
	srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, errors.New("natsjs: the nats server was not ready within 30s")
	}
	return srv, nil
}

// Unavailable is an outbox.RelayConfig.IsBrokerUnavailable for NATS: besides what outbox.BrokerUnavailable knows,
// the NATS client's errors for a server it cannot reach, and JetStream answering "unavailable" (503) while it
// recovers its streams after a restart. The relay then pauses without counting an attempt against the message.
func Unavailable(err error) bool {
	if outbox.BrokerUnavailable(err) {
		return true
	}
	for _, target := range []error{nats.ErrNoServers, nats.ErrConnectionClosed, nats.ErrConnectionReconnecting,
		nats.ErrDisconnected, nats.ErrNoResponders, nats.ErrNoStreamResponse, nats.ErrTimeout,
		nats.ErrReconnectBufExceeded, nats.ErrJetStreamNotEnabled, context.DeadlineExceeded} {
		if errors.Is(err, target) {
			return true
		}
	}
	var api *nats.APIError
	return errors.As(err, &api) && api.Code == 503
}

// serverLogger sends the embedded server's log lines to a *slog.Logger.
type serverLogger struct{ l *slog.Logger }

func (n serverLogger) Noticef(format string, v ...any) {
	n.l.Debug("nats: " + fmt.Sprintf(format, v...))
}
func (n serverLogger) Warnf(format string, v ...any)  { n.l.Warn("nats: " + fmt.Sprintf(format, v...)) }
func (n serverLogger) Errorf(format string, v ...any) { n.l.Warn("nats: " + fmt.Sprintf(format, v...)) }
func (n serverLogger) Fatalf(format string, v ...any) {
	n.l.Error("nats: " + fmt.Sprintf(format, v...))
}
func (n serverLogger) Debugf(format string, v ...any) {
	n.l.Debug("nats: " + fmt.Sprintf(format, v...))
}
func (n serverLogger) Tracef(format string, v ...any) {
	n.l.Debug("nats: " + fmt.Sprintf(format, v...))
}
