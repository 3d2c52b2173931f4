package natsjs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/stagehand-es/stagehand/outbox"
)

// Start starts a NATS server with JetStream on 127.0.0.1:port (server.RANDOM_PORT for any free port), its store in
// dir, its log lines sent to logger, and waits until it accepts connections. Starting it again on the same port
// and dir is a broker restart: streams and durable consumers survive.
func Start(name string, port int, dir string, logger *slog.Logger) (*server.Server, error) {
	return StartNode(Node{Name: name, Port: port, Dir: dir}, logger)
}

// Node is one server of a NATS JetStream cluster (or a single server, when Cluster is empty).
type Node struct {
	// Name is the server's name, unique in the cluster.
	Name string
	// Port is the client port on 127.0.0.1 (server.RANDOM_PORT for any free port).
	Port int
	// Dir is the JetStream store directory.
	Dir string
	// Cluster is the cluster's name; empty for a single server.
	Cluster string
	// ClusterPort is this server's route port on 127.0.0.1, Routes the route ports of every server of the
	// cluster (this one's included: a server ignores a route to itself).
	ClusterPort int
	Routes      []int
}

// StartNode starts the server n describes, its log lines sent to logger, and waits until it accepts client
// connections (a cluster's JetStream becomes available once a quorum of its servers runs and has elected a meta
// leader). Starting it again on the same ports and directory is a restart of that node.
func StartNode(n Node, logger *slog.Logger) (*server.Server, error) {
	opts := &server.Options{
		ServerName: n.Name,
		Host:       "127.0.0.1",
		Port:       n.Port,
		JetStream:  true,
		StoreDir:   n.Dir,
		NoSigs:     true,
	}
	if n.Cluster != "" {
		opts.Cluster = server.ClusterOpts{Name: n.Cluster, Host: "127.0.0.1", Port: n.ClusterPort}
		for _, p := range n.Routes {
			opts.Routes = append(opts.Routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
		}
	}
	srv, err := server.NewServer(opts)
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
// the NATS client's errors for a server it cannot reach, a stream that answers no publish (a cluster whose stream
// has no leader: it lost its leader and has not elected another, or lost its quorum; JetStream then has no one
// subscribed to the stream's subjects and the client reports "no response from stream"), and JetStream answering
// "unavailable" (503) while it recovers its streams after a restart; for the legacy JetStream API (nats.go's
// JetStreamContext, which watermill-nats uses) and the jetstream package alike. The relay then pauses without
// counting an attempt against the message.
func Unavailable(err error) bool {
	if outbox.BrokerUnavailable(err) {
		return true
	}
	for _, target := range []error{nats.ErrNoServers, nats.ErrConnectionClosed, nats.ErrConnectionReconnecting,
		nats.ErrDisconnected, nats.ErrNoResponders, nats.ErrNoStreamResponse, nats.ErrTimeout,
		nats.ErrReconnectBufExceeded, nats.ErrJetStreamNotEnabled, jetstream.ErrNoStreamResponse,
		jetstream.ErrJetStreamNotEnabled, context.DeadlineExceeded} {
		if errors.Is(err, target) {
			return true
		}
	}
	var api *nats.APIError
	if errors.As(err, &api) && api.Code == 503 {
		return true
	}
	var jsAPI *jetstream.APIError
	return errors.As(err, &jsAPI) && jsAPI.Code == 503
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
