package aggregate

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/names"
)

// Codec encodes and decodes event payloads. The PostgreSQL store keeps payloads in a jsonb column, so a codec used
// with it must produce JSON.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSONCodec is the default Codec (encoding/json).
type JSONCodec struct{}

// Marshal implements Codec.
func (JSONCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal implements Codec.
func (JSONCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// Registry maps stable names to Go types for events and aggregates. It is a value you construct and pass around,
// never a package global. Stored history refers to names only, so renaming a Go type never makes it unreadable.
//
// Registration errors are returned and also remembered: constructors that take a Registry (repositories,
// projections) refuse to start while Err is not nil.
type Registry struct {
	codec Codec

	mu         sync.RWMutex
	events     map[string]*eventType       // by stable name
	eventTypes map[reflect.Type]*eventType // by Go type
	aggregates map[reflect.Type]*aggregateType
	aggNames   map[string]reflect.Type
	upcasters  map[upcastKey]*upcaster
	upByInput  map[reflect.Type]*upcaster
	errs       []error
}

type eventType struct {
	name    string
	version int
	typ     reflect.Type
}

type aggregateType struct {
	name string
	new  func(id string) any
}

type upcastKey struct {
	name    string
	version int
}

type upcaster struct {
	key upcastKey
	in  reflect.Type
	out reflect.Type // To as registered (an interface when the upcaster decides at run time)
	fn  func(any) (any, error)
}

// RegistryConfig configures a Registry. A nil *RegistryConfig uses the defaults.
type RegistryConfig struct {
	// Codec encodes event payloads. Default JSONCodec.
	Codec Codec
}

// NewRegistry returns an empty registry.
func NewRegistry(cfg *RegistryConfig) *Registry {
	r := &Registry{
		codec:      JSONCodec{},
		events:     map[string]*eventType{},
		eventTypes: map[reflect.Type]*eventType{},
		aggregates: map[reflect.Type]*aggregateType{},
		aggNames:   map[string]reflect.Type{},
		upcasters:  map[upcastKey]*upcaster{},
		upByInput:  map[reflect.Type]*upcaster{},
	}
	if cfg != nil && cfg.Codec != nil {
		r.codec = cfg.Codec
	}
	return r
}

// Codec returns the registry's codec.
func (r *Registry) Codec() Codec { return r.codec }

// Err returns every registration error so far, joined, or nil. Validate also checks the upcaster chains, which
// only a complete registry can answer for.
func (r *Registry) Err() error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return errors.Join(r.errs...)
}

func (r *Registry) fail(err error) error {
	r.errs = append(r.errs, err)
	return err
}

// EventOption configures RegisterEvent.
type EventOption func(*eventType)

// Version sets the current schema version of an event type (default 1). Stored events with a lower version are
// converted by upcasters registered with RegisterUpcaster.
func Version(v int) EventOption { return func(e *eventType) { e.version = v } }

// typeName returns why name cannot be an event or stream type (the event store refuses it on every append: more
// than eventstore.MaxTypeLen bytes, invalid UTF-8, a control character), or "".
func typeName(name string) string {
	if len(name) > eventstore.MaxTypeLen {
		return fmt.Sprintf("is %d bytes, longer than %d", len(name), eventstore.MaxTypeLen)
	}
	return names.Text(name)
}

// RegisterEvent registers the event type E under a stable name. Raise values of E (not pointers).
func RegisterEvent[E any](r *Registry, name string, opts ...EventOption) error {
	typ := reflect.TypeFor[E]()
	et := &eventType{name: name, version: 1, typ: typ}
	for _, o := range opts {
		o(et)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case strings.TrimSpace(name) == "":
		return r.fail(fmt.Errorf("%w: event type %s needs a non-empty name", ErrRegistration, typ))
	case typeName(name) != "":
		return r.fail(fmt.Errorf("%w: event type %s: name %q %s", ErrRegistration, typ, names.Cut(name, 64),
			typeName(name)))
	case typ.Kind() == reflect.Pointer:
		return r.fail(fmt.Errorf("%w: event %q is registered as the pointer type %s: register the value type "+
			"(RegisterEvent[%s]) and raise %s values; stored events load as values", ErrRegistration, name, typ,
			typ.Elem(), typ.Elem()))
	case typ.Kind() == reflect.Interface:
		return r.fail(fmt.Errorf("%w: register event %q with a concrete value type, not the interface %s",
			ErrRegistration, name, typ))
	case et.version < 1:
		return r.fail(fmt.Errorf("%w: event %q: Version must be at least 1, got %d", ErrRegistration, name,
			et.version))
	}
	if prev, ok := r.events[name]; ok {
		return r.fail(fmt.Errorf("%w: event name %q is registered for both %s and %s", ErrRegistration, name,
			prev.typ, typ))
	}
	if prev, ok := r.eventTypes[typ]; ok {
		return r.fail(fmt.Errorf("%w: %s is registered as both %q and %q", ErrRegistration, typ, prev.name, name))
	}
	r.events[name] = et
	r.eventTypes[typ] = et
	return nil
}

// RegisterAggregate registers the aggregate type A under a stable name (its streams' type) with its constructor.
func RegisterAggregate[A Aggregate](r *Registry, name string, newFn func(id string) A) error {
	typ := reflect.TypeFor[A]()
	r.mu.Lock()
	defer r.mu.Unlock()
	if strings.TrimSpace(name) == "" {
		return r.fail(fmt.Errorf("%w: aggregate type %s needs a non-empty name", ErrRegistration, typ))
	}
	if reason := typeName(name); reason != "" {
		return r.fail(fmt.Errorf("%w: aggregate type %s: name %q %s", ErrRegistration, typ, names.Cut(name, 64),
			reason))
	}
	if newFn == nil {
		return r.fail(fmt.Errorf("%w: aggregate %q needs a constructor", ErrRegistration, name))
	}
	if prev, ok := r.aggNames[name]; ok {
		return r.fail(fmt.Errorf("%w: aggregate name %q is registered for both %s and %s", ErrRegistration, name,
			prev, typ))
	}
	if prev, ok := r.aggregates[typ]; ok {
		return r.fail(fmt.Errorf("%w: %s is registered as both %q and %q", ErrRegistration, typ, prev.name, name))
	}
	r.aggregates[typ] = &aggregateType{name: name, new: func(id string) any { return newFn(id) }}
	r.aggNames[name] = typ
	return nil
}

// RegisterUpcaster registers a conversion for stored events named name at schema version version: their payload
// is decoded as From and converted by fn. To is either the current registered event type, or the From of another
// upcaster, so chains (v1 -> v2 -> v3) work. The stored name may differ from the current one (a renamed event).
func RegisterUpcaster[From, To any](r *Registry, name string, version int, fn func(From) (To, error)) error {
	in := reflect.TypeFor[From]()
	r.mu.Lock()
	defer r.mu.Unlock()
	key := upcastKey{name, version}
	switch {
	case fn == nil:
		return r.fail(fmt.Errorf("%w: upcaster for %q v%d is nil", ErrRegistration, name, version))
	case strings.TrimSpace(name) == "" || version < 1:
		return r.fail(fmt.Errorf("%w: upcaster needs a name and a version >= 1, got %q v%d", ErrRegistration, name,
			version))
	}
	if _, ok := r.upcasters[key]; ok {
		return r.fail(fmt.Errorf("%w: two upcasters for %q v%d", ErrRegistration, name, version))
	}
	if _, ok := r.upByInput[in]; ok {
		return r.fail(fmt.Errorf("%w: %s is the input of two upcasters", ErrRegistration, in))
	}
	u := &upcaster{key: key, in: in, out: reflect.TypeFor[To](),
		fn: func(v any) (any, error) { return fn(v.(From)) }}
	r.upcasters[key] = u
	r.upByInput[in] = u
	return nil
}

// EventName returns the stable name and current version of an event value's type.
func (r *Registry) EventName(event any) (string, int, error) {
	et, err := r.lookupEvent(event)
	if err != nil {
		return "", 0, err
	}
	return et.name, et.version, nil
}

func (r *Registry) lookupEvent(event any) (*eventType, error) {
	typ := reflect.TypeOf(event)
	if typ == nil {
		return nil, fmt.Errorf("%w: nil event", ErrUnregisteredEvent)
	}
	if typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	r.mu.RLock()
	et := r.eventTypes[typ]
	r.mu.RUnlock()
	if et == nil {
		return nil, fmt.Errorf("%w: %s (register it with aggregate.RegisterEvent)", ErrUnregisteredEvent, typ)
	}
	return et, nil
}

// Encode returns the stable name, current version and encoded payload of an event value. A non-nil pointer to a
// registered type is encoded as the value it points to (a repository refuses to save pointer events; see Raise).
func (r *Registry) Encode(event any) (name string, version int, payload []byte, err error) {
	et, err := r.lookupEvent(event)
	if err != nil {
		return "", 0, nil, err
	}
	if v := reflect.ValueOf(event); v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return "", 0, nil, fmt.Errorf("aggregate: encode event %q: nil %T", et.name, event)
		}
		event = v.Elem().Interface()
	}
	payload, err = r.codec.Marshal(event)
	if err != nil {
		return "", 0, nil, fmt.Errorf("aggregate: encode event %q: %w", et.name, err)
	}
	return et.name, et.version, payload, nil
}

// Decode turns a stored record into its current event value, upcasting older versions. An unknown type or an
// undecodable payload returns a typed error naming the type, the stream and the version; it never panics.
func (r *Registry) Decode(rec eventstore.Record) (any, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	version := rec.TypeVersion
	if version == 0 {
		version = 1
	}
	if et := r.events[rec.Type]; et != nil && et.version == version {
		return r.decodeInto(rec, et.typ)
	}
	u := r.upcasters[upcastKey{rec.Type, version}]
	if u == nil {
		if et := r.events[rec.Type]; et != nil {
			return nil, &DecodeError{Record: rec, Err: fmt.Errorf("stored version %d, current version %d, and no "+
				"upcaster is registered for version %d", version, et.version, version)}
		}
		return nil, &UnknownEventError{Record: rec}
	}
	v, err := r.decodeInto(rec, u.in)
	if err != nil {
		return nil, err
	}
	for range 100 { // a chain longer than this is a registration loop
		out, err := r.callUpcaster(u, v)
		if err != nil {
			return nil, &DecodeError{Record: rec, Err: fmt.Errorf("upcast from %s: %w", u.in, err)}
		}
		t := reflect.TypeOf(out)
		if _, ok := r.eventTypes[t]; ok {
			return out, nil
		}
		next := r.upByInput[t]
		if next == nil {
			return nil, &DecodeError{Record: rec, Err: fmt.Errorf("upcaster produced %s, which is neither a "+
				"registered event type nor the input of another upcaster", t)}
		}
		u, v = next, out
	}
	return nil, &DecodeError{Record: rec, Err: errors.New("upcaster chain does not end")}
}

func (r *Registry) callUpcaster(u *upcaster, v any) (out any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("upcaster panicked: %v", p)
		}
	}()
	return u.fn(v)
}

func (r *Registry) decodeInto(rec eventstore.Record, typ reflect.Type) (v any, err error) {
	ptr := reflect.New(typ)
	defer func() {
		if p := recover(); p != nil { // a codec must not take a process down over one bad payload
			v, err = nil, &DecodeError{Record: rec, Err: fmt.Errorf("codec panicked: %v", p)}
		}
	}()
	if err := r.codec.Unmarshal(rec.Payload, ptr.Interface()); err != nil {
		return nil, &DecodeError{Record: rec, Err: err}
	}
	return ptr.Elem().Interface(), nil
}

// aggregateName returns the stable name of aggregate type typ.
func (r *Registry) aggregate(typ reflect.Type) (*aggregateType, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	at := r.aggregates[typ]
	if at == nil {
		return nil, fmt.Errorf("%w: aggregate type %s is not registered (use aggregate.RegisterAggregate)",
			ErrRegistration, typ)
	}
	return at, nil
}
