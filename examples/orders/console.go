package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand/console"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
)

// serveConsole serves the operator console (read-only) on cfg.console, sampling its charts every second, until stop
// is called: the demo's pipeline as an operator sees it, live.
func serveConsole(ctx context.Context, out io.Writer, pool *pgxpool.Pool, store *eventstore.PostgresStore,
	ob *outbox.Outbox, cfg config) (stop func(), err error) {
	con, err := console.New(&console.Config{Pool: pool, Schema: cfg.schema, Outbox: ob, Store: store,
		Title: "examples/orders", SampleInterval: time.Second, History: 5 * time.Minute})
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.console)
	if err != nil {
		_ = con.Close()
		return nil, fmt.Errorf("console: %w", err)
	}
	srv := &http.Server{Handler: con, ReadHeaderTimeout: 10 * time.Second}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	sampled, served := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		_ = con.Run(runCtx)
	}()
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(out, "console:", err)
		}
	}()
	fmt.Fprintf(out, "console: http://%s/ (read-only; open it to watch the pipeline)\n", ln.Addr())
	return func() {
		shut, done := context.WithTimeout(context.Background(), 5*time.Second)
		_ = srv.Shutdown(shut)
		done()
		<-served
		cancel()
		<-sampled
		_ = con.Close()
	}, nil
}
