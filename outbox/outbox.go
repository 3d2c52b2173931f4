package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/names"
	"github.com/stagehand-es/stagehand/internal/pgnotify"
	"github.com/stagehand-es/stagehand/internal/telemetry"
)

// DB is the smallest database handle the outbox needs to stage messages and run its statements.
// *pgxpool.Pool, *pgx.Conn and pgx.Tx all satisfy it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Config configures an Outbox. A nil *Config uses the defaults.
type Config struct {
	// Schema holds the outbox tables (created by stagehand.Migrate). Default stagehand.DefaultSchema.
	Schema string
	// Logger receives the outbox's logs. Default: discard.
	Logger *slog.Logger
	// Clock is the time source for every timestamp the outbox writes or compares (staging, leases, backoff,
	// schedules, cleanup). Default time.Now. Relays sharing an outbox should run on synchronised clocks.
	Clock func() time.Time
	// PartitionKey chooses the partition key of a message staged through a Watermill Publisher. Default: the
	// "partition-key" metadata value, else "aggregate-id", else none (the message is unordered).
	PartitionKey func(topic string, msg *message.Message) string
	// DisableNotify stops the writer from sending wake-up notifications after it commits; relays then rely on
	// polling alone. Default false.
	DisableNotify bool
	// TracerProvider is the default tracer provider of the inboxes created from the Outbox (InboxConfig can
	// override it). Default nil: the global provider (otel.GetTracerProvider).
	TracerProvider trace.TracerProvider
	// MeterProvider creates the stagehand.messages.staged counter, and is the default meter provider of the
	// inboxes created from the Outbox. Default nil: the global provider (otel.GetMeterProvider).
	MeterProvider metric.MeterProvider
}

// Outbox stages messages and gives access to relays, the inbox and the operations on the outbox tables.
// It is safe for concurrent use. Create it with New and Close it when done; it never closes the pool it was given.
type Outbox struct {
	pool         *pgxpool.Pool
	schema       string
	logger       *slog.Logger
	clock        func() time.Time
	partitionKey func(topic string, msg *message.Message) string
	notifier     *pgnotify.Notifier
	channel      string
	q            queries
	tp           trace.TracerProvider
	mp           metric.MeterProvider
	staged       metric.Int64Counter
	// sourced caches the staging statements per event-store schema (StageOptions.Source).
	sourced sync.Map
	// inboxBeats are the heartbeats of its inbox handlers (heartbeat.go).
	inboxBeats inboxBeats

	closeOnce sync.Once
}

// New returns an Outbox working on the tables in cfg.Schema. It creates no tables: run stagehand.Migrate first.
func New(pool *pgxpool.Pool, cfg *Config) (*Outbox, error) {
	if pool == nil {
		return nil, &ConfigError{Package: "outbox", Field: "pool", Reason: "pool must not be nil."}
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Schema == "" {
		c.Schema = stagehand.DefaultSchema
	}
	if strings.TrimSpace(c.Schema) == "" {
		return nil, &ConfigError{Package: "outbox", Field: "Schema", Reason: "Schema cannot be whitespace."}
	}
	if reason := names.Identifier(c.Schema); reason != "" {
		return nil, &ConfigError{Package: "outbox", Field: "Schema", Reason: "Schema " + reason + "."}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.PartitionKey == nil {
		c.PartitionKey = DefaultPartitionKey
	}
	q, err := newQueries(c.Schema)
	if err != nil {
		return nil, err
	}
	o := &Outbox{
		pool:         pool,
		schema:       c.Schema,
		logger:       c.Logger,
		clock:        c.Clock,
		partitionKey: c.PartitionKey,
		channel:      pgnotify.Channel(c.Schema, "outbox"),
		q:            q,
		tp:           c.TracerProvider,
		mp:           c.MeterProvider,
		staged: telemetry.Int64Counter(telemetry.Meter(c.MeterProvider), telemetry.MetricMessagesStaged,
			"Messages inserted into the outbox (a message whose ID is already known counts once).", "{message}"),
	}
	if !c.DisableNotify {
		o.notifier = pgnotify.NewNotifier(pool, o.channel, c.Logger)
	}
	return o, nil
}

// Pool returns the pool the outbox was created with (it is never closed by the outbox).
func (o *Outbox) Pool() *pgxpool.Pool { return o.pool }

// Schema is the schema holding the outbox tables.
func (o *Outbox) Schema() string { return o.schema }

// Notify wakes the relays listening on this outbox. Stage calls it after its own commit; call it after committing a
// transaction you staged into with StageTx or a transaction-bound Publisher. It never blocks and coalesces bursts.
// Without it relays still find the messages at their next poll.
func (o *Outbox) Notify() {
	if o.notifier != nil {
		o.notifier.Notify()
	}
}

// Close stops the wake-up notifier, waiting for a notification in flight. Relays and inboxes created from the
// Outbox have their own Close. It is safe to call more than once.
func (o *Outbox) Close() error {
	o.closeOnce.Do(func() {
		if o.notifier != nil {
			o.notifier.Close()
		}
	})
	return nil
}

func (o *Outbox) now() time.Time { return o.clock().UTC() }

// ErrInvalidConfig is matched (errors.Is) by every *ConfigError.
var ErrInvalidConfig = stagehand.ErrInvalidConfig

// ConfigError is stagehand.ConfigError, the configuration error every stagehand package returns (Package "outbox"
// here). It matches ErrInvalidConfig.
type ConfigError = stagehand.ConfigError

// ErrInvalidMessage is matched (errors.Is) by the errors returned for a message that cannot be staged.
var ErrInvalidMessage = errors.New("outbox: invalid message")

func invalidMessage(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidMessage, fmt.Sprintf(format, args...))
}

// ErrNotFound is returned when a dead letter or inbox entry does not exist (or belongs to another tenant).
var ErrNotFound = errors.New("outbox: not found")

// ErrClosed is returned by a Relay or Inbox used after Close.
var ErrClosed = errors.New("outbox: closed")
