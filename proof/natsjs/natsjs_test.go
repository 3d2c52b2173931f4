package natsjs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

func TestUnavailableClassifiesReachability(t *testing.T) {
	for _, err := range []error{nats.ErrNoServers, nats.ErrConnectionClosed, nats.ErrNoResponders,
		context.DeadlineExceeded, &nats.APIError{Code: 503, Description: "jetstream unavailable"},
		nats.ErrNoStreamResponse, jetstream.ErrNoStreamResponse, &jetstream.APIError{Code: 503}} {
		require.True(t, Unavailable(fmt.Errorf("publish: %w", err)), "%v", err)
	}
	for _, err := range []error{errors.New("message too large"), &nats.APIError{Code: 400}, nats.ErrBadSubject,
		&jetstream.APIError{Code: 400}, jetstream.ErrStreamNotFound} {
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

// TestUnavailableKnowsAStreamWithoutALeader publishes to a replicated stream (R3) of a 3-node cluster after two of
// its nodes are gone, so the stream has no quorum and cannot store anything, and checks that what both JetStream
// APIs return then is classified "unavailable" (the relay pauses instead of counting attempts). What they return
// depends on which node survived (measured): a follower has no subscription on the stream's subjects, so the
// publish finds no responder ("no response from stream"); the old leader still takes it but cannot replicate it,
// so no acknowledgement comes (a timeout) until it notices it lost its quorum.
func TestUnavailableKnowsAStreamWithoutALeader(t *testing.T) {
	for _, survivor := range []string{"follower", "leader"} {
		t.Run("the "+survivor+" survives", func(t *testing.T) { testWithoutALeader(t, survivor == "leader") })
	}
}

func testWithoutALeader(t *testing.T, leaderSurvives bool) {
	var (
		nodes   []Node
		running map[string]*server.Server
	)
	// The ports are free when drawn, but another process may bind one before the node does (the CI runs other
	// packages' servers and connections beside this test), and the node then never becomes ready: start the
	// cluster again on other ports.
	for attempt := 1; ; attempt++ {
		nodes, running = startCluster(t)
		if len(running) == len(nodes) || attempt == 3 {
			break
		}
		t.Logf("attempt %d: %d of %d nodes started; starting the cluster again on other ports", attempt,
			len(running), len(nodes))
		stopAll(running)
	}
	defer stopAll(running)
	require.Len(t, running, 3)
	urls := ""
	for _, n := range nodes {
		urls += fmt.Sprintf("nats://127.0.0.1:%d,", n.Port)
	}
	ctx := context.Background()
	var info *jetstream.StreamInfo
	func() {
		nc, err := nats.Connect(urls)
		require.NoError(t, err)
		defer nc.Close()
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			s, err := js.CreateOrUpdateStream(rctx, jetstream.StreamConfig{Name: "s", Subjects: []string{"s.*"},
				Replicas: 3, Storage: jetstream.FileStorage})
			if err == nil {
				info, err = s.Info(rctx)
			}
			return err == nil && info.Cluster != nil && info.Cluster.Leader != ""
		}, time.Minute, 200*time.Millisecond, "the cluster elects a meta leader and a stream leader")
	}()
	var survivor *server.Server
	for name, s := range running {
		if (name == info.Cluster.Leader) == leaderSurvives && survivor == nil {
			survivor = s
		}
	}
	for name, s := range running {
		if s != survivor {
			s.Shutdown()
			s.WaitForShutdown()
			delete(running, name)
		}
	}

	nc, err := nats.Connect(survivor.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, errNew := js.Publish(rctx, "s.a", []byte("x"))
	require.Error(t, errNew)
	require.True(t, Unavailable(errNew), "jetstream package: %v", errNew)
	if errors.Is(errNew, jetstream.ErrNoStreamResponse) {
		// The jetstream package replaces the client's ErrNoResponders with an error of its own that the NATS
		// client's errors do not match: without it in Unavailable's list this was a rejection.
		require.NotErrorIs(t, errNew, nats.ErrNoStreamResponse)
		require.NotErrorIs(t, errNew, nats.ErrNoResponders)
	}
	legacy, err := nc.JetStream()
	require.NoError(t, err)
	_, errLegacy := legacy.Publish("s.a", []byte("x"), nats.AckWait(2*time.Second))
	require.Error(t, errLegacy)
	require.True(t, Unavailable(errLegacy), "legacy JetStream API: %v", errLegacy)
	t.Logf("no leader, %s survived: jetstream package %q, legacy API %q", survivor.Name(), errNew, errLegacy)
}

// startCluster starts a 3-node cluster on ports free when drawn, and returns its nodes and the servers that
// became ready, by name.
func startCluster(t *testing.T) ([]Node, map[string]*server.Server) {
	logger := slog.New(slog.DiscardHandler)
	var routes []int
	nodes := make([]Node, 3)
	for i := range nodes {
		nodes[i] = Node{Name: fmt.Sprintf("n%d", i+1), Port: freePort(t), Dir: t.TempDir(), Cluster: "natsjs-test",
			ClusterPort: freePort(t)}
		routes = append(routes, nodes[i].ClusterPort)
	}
	servers := make(chan *server.Server, len(nodes))
	for i := range nodes {
		nodes[i].Routes = routes
		go func(n Node) {
			srv, err := StartNode(n, logger)
			if err != nil {
				t.Logf("node %s: %v", n.Name, err)
			}
			servers <- srv
		}(nodes[i])
	}
	running := map[string]*server.Server{}
	for range nodes {
		if srv := <-servers; srv != nil {
			running[srv.Name()] = srv
		}
	}
	return nodes, running
}

// stopAll shuts the servers down and waits for them.
func stopAll(servers map[string]*server.Server) {
	for _, s := range servers {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
