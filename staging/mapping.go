package staging

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/telemetry"
	"github.com/stagehand-es/stagehand/outbox"
)

// Message is an integration message a mapping derives from a domain event.
type Message struct {
	// Topic is the destination topic at the broker. Required.
	Topic string
	// Type is the stable message type name consumers route on. Default: the event's type name.
	Type string
	// Payload is the message body: []byte and json.RawMessage are used as they are, anything else is encoded
	// with the mapping's registry codec (JSON; a shred.Codec encrypts its personal fields).
	Payload any
	// PartitionKey orders the message among those of the same key. Default: the aggregate ID (the stream ID).
	// Set Unordered to opt out of ordering.
	PartitionKey string
	// Unordered stages the message without a partition key: it is published as soon as it is due, in no
	// particular order.
	Unordered bool
	// Headers are added to the message's metadata, besides the standard headers. The event's trace context
	// (traceparent, tracestate) is added too, unless Headers sets a traceparent of its own.
	Headers map[string]string
	// ScheduledAt delays delivery until then (zero: deliver now).
	ScheduledAt time.Time
}

// MapFunc derives messages from a recorded event of type E. Under the Transactional strategy src has no Position
// and no RecordedAt yet (see the package documentation, "What a mapping sees").
type MapFunc[E any] func(src eventstore.Record, event E) ([]Message, error)

// RawMapFunc derives messages from a recorded event without decoding it. src is as for MapFunc.
type RawMapFunc func(src eventstore.Record) ([]Message, error)

// Mapping maps recorded domain events to integration messages. It is a value you construct; register mappings
// before using it. Events no mapping applies to stage nothing.
type Mapping struct {
	reg *aggregate.Registry

	mu     sync.RWMutex
	byType map[string][]*route // by event type name
	names  map[string]struct{}
	errs   []error
}

type route struct {
	name   string
	typed  func(src eventstore.Record, event any) ([]Message, error) // nil for raw routes
	raw    RawMapFunc
	goType reflect.Type
	types  []string // the declared message types (MessageTypes), sorted; nil when undeclared
}

// NewMapping returns an empty mapping. reg decodes recorded events for typed mappings (it is also how the
// Deferred stager and the reconciler read events from the log).
func NewMapping(reg *aggregate.Registry) *Mapping {
	return &Mapping{reg: reg, byType: map[string][]*route{}, names: map[string]struct{}{}}
}

// Map registers fn under a stable mapping name for events of Go type E (registered in the mapping's registry).
// The mapping name is part of every derived message ID: never rename a mapping that has staged messages. Option
// MessageTypes declares the message types fn produces, so CheckHandled can compare them with a service's handlers.
func Map[E any](m *Mapping, name string, fn MapFunc[E], opts ...MapOption) error {
	goType := reflect.TypeFor[E]()
	if m.reg == nil {
		return m.fail(fmt.Errorf("%w: mapping %q: the Mapping has no registry to name %s", ErrInvalidConfig, name,
			goType))
	}
	var zero E
	eventType, _, err := m.reg.EventName(zero)
	if err != nil {
		return m.fail(fmt.Errorf("%w: mapping %q: %w", ErrInvalidConfig, name, err))
	}
	if fn == nil {
		return m.fail(fmt.Errorf("%w: mapping %q has no function", ErrInvalidConfig, name))
	}
	types, err := declaredTypes(name, opts)
	if err != nil {
		return m.fail(err)
	}
	return m.add(eventType, &route{name: name, goType: goType, types: types, typed: func(src eventstore.Record,
		e any) ([]Message, error) {
		v, ok := e.(E)
		if !ok {
			return nil, fmt.Errorf("mapping %q expects %s, got %T", name, goType, e)
		}
		return fn(src, v)
	}})
}

// MapRaw registers fn under a stable mapping name for events of the stable type name eventType, without decoding
// them (for example to forward the payload as it is). Options are those of Map.
func (m *Mapping) MapRaw(name, eventType string, fn RawMapFunc, opts ...MapOption) error {
	if strings.TrimSpace(eventType) == "" {
		return m.fail(fmt.Errorf("%w: mapping %q needs an event type", ErrInvalidConfig, name))
	}
	if fn == nil {
		return m.fail(fmt.Errorf("%w: mapping %q has no function", ErrInvalidConfig, name))
	}
	types, err := declaredTypes(name, opts)
	if err != nil {
		return m.fail(err)
	}
	return m.add(eventType, &route{name: name, raw: fn, types: types})
}

func (m *Mapping) add(eventType string, r *route) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if strings.TrimSpace(r.name) == "" {
		return m.failLocked(fmt.Errorf("%w: a mapping for %q needs a name", ErrInvalidConfig, eventType))
	}
	if _, dup := m.names[r.name]; dup {
		return m.failLocked(fmt.Errorf("%w: mapping name %q is used twice", ErrInvalidConfig, r.name))
	}
	m.names[r.name] = struct{}{}
	m.byType[eventType] = append(m.byType[eventType], r)
	return nil
}

func (m *Mapping) fail(err error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.failLocked(err)
}

func (m *Mapping) failLocked(err error) error {
	m.errs = append(m.errs, err)
	return err
}

// Err returns the registration errors so far, or nil. Constructors refuse a mapping with errors.
func (m *Mapping) Err() error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if len(m.errs) == 0 {
		return nil
	}
	return fmt.Errorf("staging: mapping: %w", errors.Join(m.errs...))
}

// EventTypes returns the event type names some mapping applies to (what the log followers read).
func (m *Mapping) EventTypes() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]string, 0, len(m.byType))
	for t := range m.byType {
		out = append(out, t)
	}
	return out
}

// Applies reports whether any mapping applies to events of the stable type name eventType.
func (m *Mapping) Applies(eventType string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.byType[eventType]) > 0
}

// messages derives the outbox messages of one recorded event. event is its decoded value, or nil to decode it
// with the registry when a typed mapping needs it.
func (m *Mapping) messages(rec eventstore.Record, event any) ([]outbox.Message, error) {
	m.mu.RLock()
	routes := m.byType[rec.Type]
	m.mu.RUnlock()
	var out []outbox.Message
	for _, r := range routes {
		var msgs []Message
		var err error
		if r.raw != nil {
			msgs, err = callRaw(r, rec)
		} else {
			if event == nil {
				if event, err = m.reg.Decode(rec); err != nil {
					return nil, err
				}
			}
			msgs, err = callTyped(r, rec, event)
		}
		if err != nil {
			return nil, fmt.Errorf("staging: mapping %q of event %q at version %d of stream %q: %w", r.name,
				rec.Type, rec.Version, rec.StreamID, err)
		}
		for i, msg := range msgs {
			om, err := toOutbox(rec, r.name, i, msg, m.payloadCodec())
			if err == nil && r.types != nil {
				if _, ok := slices.BinarySearch(r.types, om.Type); !ok {
					err = fmt.Errorf("%w: message type %q is not among the types the mapping declares with "+
						"MessageTypes %q", ErrInvalidMessage, om.Type, r.types)
				}
			}
			if err != nil {
				return nil, fmt.Errorf("staging: mapping %q of event %q at version %d of stream %q, message %d: %w",
					r.name, rec.Type, rec.Version, rec.StreamID, i, err)
			}
			out = append(out, om)
		}
	}
	return out, nil
}

// callRaw and callTyped run user mapping code; a panic there becomes an error rather than a crashed save.
func callRaw(r *route, rec eventstore.Record) (msgs []Message, err error) {
	defer recoverInto(&err)
	return r.raw(rec)
}

func callTyped(r *route, rec eventstore.Record, event any) (msgs []Message, err error) {
	defer recoverInto(&err)
	return r.typed(rec, event)
}

func recoverInto(err *error) {
	if p := recover(); p != nil {
		*err = fmt.Errorf("mapping panicked: %v", p)
	}
}

// idNamespace is the UUIDv5 namespace of derived message IDs.
var idNamespace = uuid.MustParse("6f1c3e0a-2b7d-5e8f-9a41-7c2d9e0b4f13")

// MessageID returns the deterministic ID of the index-th message that mapping derives from the event at version
// of the stream (tenant, streamID): a UUIDv5 of those values. Whoever stages the event (the save, the
// reconciler, the Deferred stager), and however often, it is the same ID, so the outbox stores it once.
func MessageID(tenant, streamID string, version int64, mapping string, index int) string {
	var b strings.Builder
	for _, part := range []string{stagehand.NormalizeTenant(tenant), streamID, strconv.FormatInt(version, 10),
		mapping, strconv.Itoa(index)} {
		b.WriteString(strconv.Itoa(len(part))) // length-prefixed: no two tuples share an encoding
		b.WriteByte(':')
		b.WriteString(part)
	}
	return uuid.NewSHA1(idNamespace, []byte(b.String())).String()
}

// payloadCodec encodes typed message payloads: the registry's codec (so a codec that encrypts personal fields,
// such as shred's, protects messages as it protects events), encoding/json without a registry.
func (m *Mapping) payloadCodec() aggregate.Codec {
	if m.reg == nil {
		return aggregate.JSONCodec{}
	}
	return m.reg.Codec()
}

func toOutbox(rec eventstore.Record, mapping string, index int, msg Message, codec aggregate.Codec) (
	outbox.Message, error) {
	if strings.TrimSpace(msg.Topic) == "" {
		return outbox.Message{}, fmt.Errorf("%w: message has no Topic", ErrInvalidMessage)
	}
	var payload []byte
	switch p := msg.Payload.(type) {
	case []byte:
		payload = p
	case json.RawMessage:
		payload = p
	case nil:
		payload = []byte("null")
	default:
		b, err := codec.Marshal(p)
		if err != nil {
			return outbox.Message{}, fmt.Errorf("%w: encode payload: %w", ErrInvalidMessage, err)
		}
		payload = b
	}
	typ := msg.Type
	if typ == "" {
		typ = rec.Type
	}
	key := msg.PartitionKey
	if key == "" && !msg.Unordered {
		key = rec.StreamID
	}
	if msg.Unordered {
		key = ""
	}
	eventID := rec.EventID.String()
	correlation := rec.Metadata[stagehand.HeaderCorrelationID]
	if correlation == "" {
		correlation = eventID // the event starts the conversation
	}
	meta := make(map[string]string, len(msg.Headers)+7)
	maps.Copy(meta, msg.Headers)
	telemetry.CopyTraceContext(meta, rec.Metadata) // the save's trace goes on with the message
	meta[stagehand.HeaderAggregateID] = rec.StreamID
	meta[stagehand.HeaderAggregateType] = rec.StreamType
	meta[stagehand.HeaderEventID] = eventID
	meta[stagehand.HeaderEventType] = rec.Type
	meta[stagehand.HeaderOccurredAt] = rec.OccurredAt.UTC().Format(time.RFC3339Nano)
	return outbox.Message{
		ID:             MessageID(rec.Tenant, rec.StreamID, rec.Version, mapping, index),
		Topic:          msg.Topic,
		Type:           typ,
		Payload:        payload,
		Metadata:       meta,
		Tenant:         rec.Tenant,
		CorrelationID:  correlation,
		CausationID:    eventID,
		PartitionKey:   key,
		SourcePosition: rec.Position,
		ScheduledAt:    msg.ScheduledAt,
	}, nil
}
