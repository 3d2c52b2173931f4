// Command observability plugs stagehand's OpenTelemetry instruments into a real pipeline: metrics exported to
// Prometheus (served on /metrics), traces printed to standard output. It saves orders through a repository that
// stages their messages, relays them through a Watermill router to an in-process broker, and handles them behind
// the inbox, so one trace runs from repo.Save through the relay's publish to the consumer's handler, and every
// metric of docs/metrics.md that these components create has a value. Then it scrapes its own /metrics and prints
// the stagehand series.
//
//	go run ./examples/observability                          # throwaway PostgreSQL, traces on stdout
//	go run ./examples/observability -traces=false -hold 5m   # keep /metrics up to scrape it yourself
//	go run ./examples/observability -database-url "$URL"     # your database (schema "observability_example")
//
// stagehand takes a TracerProvider and a MeterProvider in each component's configuration and never installs an
// exporter: which SDK, exporter and backend to use is the application's choice, made once, here in main.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/stagehandtest"
	"github.com/stagehand-es/stagehand/staging"
)

type config struct {
	databaseURL string
	schema      string
	listen      string
	orders      int
	traces      bool
	hold        time.Duration
}

func main() {
	var cfg config
	flag.StringVar(&cfg.databaseURL, "database-url", os.Getenv("DATABASE_URL"),
		"PostgreSQL URL (default: $DATABASE_URL, else a throwaway cluster)")
	flag.StringVar(&cfg.schema, "schema", "observability_example", "schema for the example's tables")
	flag.StringVar(&cfg.listen, "listen", "127.0.0.1:0", "address of the Prometheus /metrics endpoint")
	flag.IntVar(&cfg.orders, "orders", 20, "orders to save")
	flag.BoolVar(&cfg.traces, "traces", true, "print every span to standard output")
	flag.DurationVar(&cfg.hold, "hold", 0, "keep serving /metrics this long before exiting")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "observability:", err)
		os.Exit(1)
	}
}

// Order is the example's aggregate: placing it raises OrderPlaced.
type Order struct {
	aggregate.Root
	Amount int64
}

// OrderPlaced is the domain event, and (mapped as it is) the integration message's payload.
type OrderPlaced struct {
	Amount int64 `json:"amount"`
}

// Apply changes state; it also replays history on load.
func (o *Order) Apply(e any) {
	if p, ok := e.(OrderPlaced); ok {
		o.Amount = p.Amount
	}
}

func run(ctx context.Context, out io.Writer, cfg config) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out = &lockedWriter{w: out} // spans are printed from the goroutines that end them

	// 1. The application's telemetry pipeline: an SDK meter provider whose reader is the Prometheus exporter (on
	//    a registry of its own), and an SDK tracer provider printing spans.
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return fmt.Errorf("prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	traceOut := io.Discard
	if cfg.traces {
		traceOut = out
	}
	spans, err := stdouttrace.New(stdouttrace.WithWriter(traceOut))
	if err != nil {
		return fmt.Errorf("stdout trace exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(registry, promhttp.HandlerOpts{}),
		ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()
	metricsURL := "http://" + ln.Addr().String() + "/metrics"
	fmt.Fprintln(out, "Prometheus metrics on", metricsURL)

	// 2. PostgreSQL and stagehand's tables.
	url := cfg.databaseURL
	if url == "" {
		fmt.Fprintln(out, "starting a throwaway PostgreSQL (set DATABASE_URL or -database-url to use yours)...")
		pg, err := stagehandtest.Start(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = pg.Stop() }()
		url = pg.URL()
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	if _, err := stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: cfg.schema}); err != nil {
		return err
	}

	// 3. The components, each handed the two providers (relays and inboxes inherit the outbox's).
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: cfg.schema})
	if err != nil {
		return err
	}
	defer store.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: cfg.schema, TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		return err
	}
	defer func() { _ = ob.Close() }()
	reg := aggregate.NewRegistry(nil)
	if err := errors.Join(
		aggregate.RegisterAggregate(reg, "shop.order", func(id string) *Order { return &Order{Root: aggregate.NewRoot(id)} }),
		aggregate.RegisterEvent[OrderPlaced](reg, "shop.order.placed"),
	); err != nil {
		return err
	}
	mapping := staging.NewMapping(reg)
	if err := staging.Map(mapping, "orders", func(_ eventstore.Record, e OrderPlaced) ([]staging.Message, error) {
		return []staging.Message{{Topic: "orders", Type: "shop.v1.OrderPlaced", Payload: e}}, nil
	}); err != nil {
		return err
	}
	stager, err := staging.New(store, &staging.Config{Outbox: ob, Mapping: mapping, TracerProvider: tp})
	if err != nil {
		return err
	}
	repo, err := aggregate.NewRepository[*Order](store, reg, &aggregate.RepositoryConfig{Stager: stager,
		TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		return err
	}

	// 4. One router: the relay publishes to an in-process broker, and an inbox-wrapped handler consumes.
	wlog := watermill.NewSlogLogger(slog.New(slog.DiscardHandler))
	broker := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, wlog)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, wlog)
	if err != nil {
		return err
	}
	relay, err := ob.NewRelay(&outbox.RelayConfig{PollingInterval: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	defer func() { _ = relay.Close() }()
	relay.AddToRouter(router, broker, nil)
	inbox, err := ob.NewInbox(nil)
	if err != nil {
		return err
	}
	var handled atomic.Int64
	handlers := outbox.NewHandlers(nil, false)
	outbox.Handle(handlers, "shop.v1.OrderPlaced",
		func(context.Context, pgx.Tx, *outbox.Publisher, *message.Message, OrderPlaced) error {
			handled.Add(1)
			return nil
		})
	router.AddConsumerHandler("billing", "orders", broker, inbox.Handler("billing", handlers.Func()))
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	defer func() { cancel(); _ = router.Close(); <-done }()
	select {
	case <-router.Running():
	case err := <-done:
		return fmt.Errorf("router: %w", err)
	}

	// 5. Work: each save is one trace, from stagehand.save to the consumer's stagehand.inbox.handle.
	for i := range cfg.orders {
		id := fmt.Sprintf("order-%d", i)
		if _, err := repo.Create(ctx, id, func(o *Order) error {
			aggregate.Raise(o, OrderPlaced{Amount: int64(100 + i)})
			return nil
		}); err != nil && !errors.Is(err, aggregate.ErrAlreadyExists) { // a rerun finds them created
			return err
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for handled.Load() < int64(cfg.orders) {
		if time.Now().After(deadline) {
			return fmt.Errorf("handled %d of %d orders in 30s", handled.Load(), cfg.orders)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Fprintf(out, "saved, relayed and handled %d orders\n", cfg.orders)

	// 6. What a Prometheus server would scrape. The handler counted each order inside the inbox's transaction;
	//    the inbox counts it once that commits, so wait for the last count to land.
	var series []string
	for want := fmt.Sprintf(" %d", cfg.orders); ; {
		if series, err = scrape(ctx, metricsURL); err != nil {
			return err
		}
		if slices.ContainsFunc(series, func(l string) bool {
			return strings.HasPrefix(l, "stagehand_inbox_messages_total{") &&
				strings.Contains(l, `stagehand_outcome="handled"`) && strings.HasSuffix(l, want)
		}) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Fprintln(out, "stagehand series on", metricsURL+":")
	for _, s := range series {
		fmt.Fprintln(out, " ", s)
	}
	if cfg.hold > 0 {
		fmt.Fprintf(out, "serving %s for %s\n", metricsURL, cfg.hold)
		select {
		case <-time.After(cfg.hold):
		case <-ctx.Done():
		}
	}
	return nil
}

// scrape fetches the Prometheus text exposition and returns its stagehand samples.
func scrape(ctx context.Context, url string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "stagehand_") && !strings.Contains(l, "_bucket{") {
			out = append(out, l)
		}
	}
	return out, sc.Err()
}

// lockedWriter serialises writes to w, which the exporter and the program share.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
