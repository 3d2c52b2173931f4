package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/logfollow"
	"github.com/stagehand-es/stagehand/internal/names"
)

// Metadata keys the Subscriber sets on every message, besides stagehand's standard headers (event ID and type,
// aggregate ID and type, tenant, occurred-at) and the event's own metadata.
const (
	// HeaderPosition is the event's global log position.
	HeaderPosition = "position"
	// HeaderStreamVersion is the event's version in its stream.
	HeaderStreamVersion = "stream-version"
)

// Filter selects events of the global log. Empty fields match everything.
type Filter struct {
	EventTypes, StreamTypes, Tenants []string
}

// Topic renders f as a Subscriber topic: "*" for everything, else "events:A,B;streams:S;tenants:T" with only
// the non-empty parts. Each value is escaped, so any tenant or type name round-trips through ParseTopic as exactly
// that one value: '%', ',', ';' and whitespace are written as %XX (a tenant "evil,B" is "evil%2CB", never the two
// tenants "evil" and "B"). A blank tenant is stagehand.NoTenant, written as such.
func Topic(f Filter) string {
	var parts []string
	for _, p := range []struct {
		key  string
		vals []string
	}{{"events", f.EventTypes}, {"streams", f.StreamTypes}, {"tenants", logfollow.NormalizeTenants(f.Tenants)}} {
		if len(p.vals) > 0 {
			esc := make([]string, len(p.vals))
			for i, v := range p.vals {
				esc[i] = escapeTopicValue(v)
			}
			parts = append(parts, p.key+":"+strings.Join(esc, ","))
		}
	}
	if len(parts) == 0 {
		return "*"
	}
	return strings.Join(parts, ";")
}

// ParseTopic parses a Subscriber topic (see Topic). An empty topic or "*" selects every event. Values are
// unescaped (%XX); a malformed escape, or a tenant stagehand.ValidateTenant refuses, is an error matching
// ErrInvalidConfig.
func ParseTopic(topic string) (Filter, error) {
	var f Filter
	topic = strings.TrimSpace(topic)
	if topic == "" || topic == "*" {
		return f, nil
	}
	for part := range strings.SplitSeq(topic, ";") {
		key, vals, ok := strings.Cut(strings.TrimSpace(part), ":")
		var list []string
		for v := range strings.SplitSeq(vals, ",") {
			if v = strings.TrimSpace(v); v == "" {
				continue
			}
			u, err := unescapeTopicValue(v)
			if err != nil {
				return Filter{}, fmt.Errorf("%w: topic %q: value %q: %w", ErrInvalidConfig, topic, v, err)
			}
			list = append(list, u)
		}
		if !ok || len(list) == 0 {
			return Filter{}, fmt.Errorf("%w: topic %q: part %q is not key:value[,value]", ErrInvalidConfig, topic,
				part)
		}
		switch key {
		case "events":
			f.EventTypes = append(f.EventTypes, list...)
		case "streams":
			f.StreamTypes = append(f.StreamTypes, list...)
		case "tenants":
			for _, t := range list {
				if err := stagehand.ValidateTenant(t); err != nil {
					return Filter{}, fmt.Errorf("%w: topic %q: %w", ErrInvalidConfig, names.Cut(topic, 128), err)
				}
			}
			f.Tenants = append(f.Tenants, logfollow.NormalizeTenants(list)...)
		default:
			return Filter{}, fmt.Errorf("%w: topic %q: unknown key %q (want events, streams or tenants)",
				ErrInvalidConfig, topic, key)
		}
	}
	return f, nil
}

// escapeTopicValue writes '%', the separators ',' and ';', whitespace (which ParseTopic trims) and control
// characters as %XX, byte by byte.
func escapeTopicValue(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); {
		r, size := utf8.DecodeRuneInString(v[i:])
		if r == '%' || r == ',' || r == ';' || unicode.IsSpace(r) || unicode.IsControl(r) ||
			(r == utf8.RuneError && size == 1) {
			for _, c := range []byte(v[i : i+size]) {
				fmt.Fprintf(&b, "%%%02X", c)
			}
		} else {
			b.WriteString(v[i : i+size])
		}
		i += size
	}
	return b.String()
}

func unescapeTopicValue(v string) (string, error) {
	if !strings.Contains(v, "%") {
		return v, nil
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] != '%' {
			b.WriteByte(v[i])
			continue
		}
		if i+2 >= len(v) || !isHex(v[i+1]) || !isHex(v[i+2]) {
			return "", errors.New("'%' must start an escape %XX (two hex digits)")
		}
		b.WriteByte(unhex(v[i+1])<<4 | unhex(v[i+2]))
		i += 2
	}
	return b.String(), nil
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// SubscriberConfig configures a Subscriber. ConsumerGroup is required.
type SubscriberConfig struct {
	// ConsumerGroup names the subscriber's checkpoint (and lease): a consumer group resumes where it left off,
	// and only one process delivers a group's messages at a time. Required. A Subscriber delivers one topic per
	// consumer group.
	ConsumerGroup string
	// Schema holding stagehand's tables. Default "stagehand".
	Schema string
	// BatchSize is the most messages delivered before the checkpoint is committed (one transaction per batch).
	// After a crash the messages acked since the last commit are delivered again. Default 100; 1 to 10000.
	BatchSize int
	// PollInterval is how often the log is polled when no notification arrives. Default 1s.
	PollInterval time.Duration
	// NackResendDelay is the wait before a nacked message is delivered again. Default 100ms.
	NackResendDelay time.Duration
	// DisableListen turns off LISTEN/NOTIFY wake-ups (polling only). Required when the store's pool goes through a
	// pooler in transaction pooling mode, where it otherwise fails with stagehand.ErrPooledConnection.
	DisableListen bool
	// Owner, LeaseTTL, LeaseRenewInterval and LeaseAcquireInterval configure the consumer group's lease as in
	// Config.
	Owner                                              string
	LeaseTTL, LeaseRenewInterval, LeaseAcquireInterval time.Duration
	// Logger receives diagnostics. Default: silent.
	Logger *slog.Logger
}

// Subscriber is the global log as a Watermill message.Subscriber: Subscribe(ctx, topic) delivers the events that
// match the topic (a Filter, see Topic) in log order, one message at a time: the next message is sent only after
// the previous one is acked. Ack advances the consumer group's checkpoint; Nack delivers the same message again
// after NackResendDelay. Delivery is at-least-once: the checkpoint is committed every BatchSize acked messages
// and when the log is caught up, so a crash delivers the messages acked since the last commit again. The message
// UUID is the event ID, the payload the event's payload, and the metadata carries the event's metadata and
// headers (see HeaderPosition).
type Subscriber struct {
	pool  *pgxpool.Pool
	store eventstore.Store
	cfg   SubscriberConfig

	mu     sync.Mutex
	closed bool
	topic  string
	cancel context.CancelFunc
	ctx    context.Context
	wg     sync.WaitGroup
}

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber returns a Subscriber on store whose checkpoint and lease live on pool.
func NewSubscriber(pool *pgxpool.Pool, store eventstore.Store, cfg *SubscriberConfig) (*Subscriber, error) {
	if cfg == nil || strings.TrimSpace(cfg.ConsumerGroup) == "" {
		return nil, &ConfigError{Package: "projection", Field: "ConsumerGroup", Reason: "is required"}
	}
	if reason := names.Identifier(cfg.ConsumerGroup) + names.Text(cfg.ConsumerGroup); reason != "" {
		return nil, &ConfigError{Package: "projection", Field: "ConsumerGroup", Reason: reason}
	}
	c := *cfg
	if c.Schema == "" {
		c.Schema = stagehand.DefaultSchema
	}
	if c.BatchSize == 0 {
		c.BatchSize = 100
	}
	switch {
	case c.NackResendDelay == 0:
		c.NackResendDelay = 100 * time.Millisecond
	case c.NackResendDelay < 0:
		return nil, &ConfigError{Package: "projection", Field: "NackResendDelay", Reason: "must not be negative"}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	// Validate the follower settings now rather than at Subscribe.
	if _, err := logfollow.New(pool, store, func(context.Context, pgx.Tx, []eventstore.Record) error { return nil },
		c.followerConfig(Filter{})); err != nil {
		var fe *logfollow.ConfigError
		if errors.As(err, &fe) {
			return nil, &ConfigError{Package: "projection", Field: fe.Field, Reason: fe.Reason}
		}
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Subscriber{pool: pool, store: store, cfg: c, ctx: ctx, cancel: cancel}, nil
}

func (c *SubscriberConfig) followerConfig(f Filter) *logfollow.Config {
	return &logfollow.Config{Name: c.ConsumerGroup, Kind: "subscriber", Schema: c.Schema,
		EventTypes: f.EventTypes, StreamTypes: f.StreamTypes, Tenants: f.Tenants, BatchSize: c.BatchSize,
		PagesPerTx:   1, // BatchSize acked messages per checkpoint commit, as documented
		PollInterval: c.PollInterval, DisableListen: c.DisableListen, Owner: c.Owner, LeaseTTL: c.LeaseTTL,
		LeaseRenewInterval: c.LeaseRenewInterval, LeaseAcquireInterval: c.LeaseAcquireInterval,
		// Nack redelivers forever (Watermill's contract; use its PoisonQueue middleware to give up), so the
		// follower only ever sees context and connection errors.
		Logger: c.Logger.With("consumer_group", c.ConsumerGroup)}
}

// Subscribe implements message.Subscriber. The channel is closed when ctx ends or the Subscriber is closed.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	f, err := ParseTopic(topic)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("projection: subscriber is closed")
	}
	if s.topic != "" && s.topic != topic {
		return nil, fmt.Errorf("%w: consumer group %q already follows topic %q; use another group for %q",
			ErrInvalidConfig, s.cfg.ConsumerGroup, s.topic, topic)
	}
	s.topic = topic
	out := make(chan *message.Message)
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	follower, err := logfollow.New(s.pool, s.store, s.deliver(out), s.cfg.followerConfig(f))
	if err != nil {
		stop()
		cancel()
		return nil, err
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer stop()
		defer cancel()
		if err := follower.Run(ctx); err != nil {
			s.cfg.Logger.ErrorContext(ctx, "stagehand: log subscriber stopped", "error", err)
		}
	}()
	return out, nil
}

// deliver sends each record as a message and waits for its ack (resending after a nack).
func (s *Subscriber) deliver(out chan<- *message.Message) logfollow.Handler {
	return func(ctx context.Context, _ pgx.Tx, recs []eventstore.Record) error {
		for _, r := range recs {
			for {
				msg := toMessage(r)
				msg.SetContext(ctx)
				select {
				case out <- msg:
				case <-ctx.Done():
					return ctx.Err()
				}
				select {
				case <-msg.Acked():
				case <-msg.Nacked():
					select {
					case <-time.After(s.cfg.NackResendDelay):
					case <-ctx.Done():
						return ctx.Err()
					}
					continue
				case <-ctx.Done():
					return ctx.Err()
				}
				break
			}
		}
		return nil
	}
}

func toMessage(r eventstore.Record) *message.Message {
	msg := message.NewMessage(r.EventID.String(), r.Payload)
	for k, v := range r.Metadata {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set(stagehand.HeaderEventID, r.EventID.String())
	msg.Metadata.Set(stagehand.HeaderEventType, r.Type)
	msg.Metadata.Set(stagehand.HeaderAggregateID, r.StreamID)
	msg.Metadata.Set(stagehand.HeaderAggregateType, r.StreamType)
	msg.Metadata.Set(stagehand.HeaderTenantID, r.Tenant)
	msg.Metadata.Set(stagehand.HeaderOccurredAt, r.OccurredAt.UTC().Format(time.RFC3339Nano))
	msg.Metadata.Set(HeaderPosition, strconv.FormatInt(r.Position, 10))
	msg.Metadata.Set(HeaderStreamVersion, strconv.FormatInt(r.Version, 10))
	return msg
}

// Close implements message.Subscriber: it stops every subscription, waits for them and closes their channels.
// Safe to call more than once.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}
