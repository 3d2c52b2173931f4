package projection

import (
	"context"
	"fmt"
	"reflect"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/aggregate"
)

// Mux is a Handler that dispatches each event to the function registered for its Go type with On. Events of
// types with no function are ignored (the projection does not read them); filter the projection's EventTypes or
// StreamTypes so it does not even fetch them. A projection whose handler is a Mux decodes with the Mux's registry
// unless Config.Registry says otherwise.
type Mux struct {
	reg *aggregate.Registry

	mu       sync.RWMutex
	handlers map[reflect.Type]func(ctx context.Context, tx pgx.Tx, e Event) error
	reset    func(ctx context.Context, tx pgx.Tx) error
	deleted  func(ctx context.Context, tx pgx.Tx, e Event) error
}

// NewMux returns an empty Mux whose events are decoded with reg.
func NewMux(reg *aggregate.Registry) *Mux {
	return &Mux{reg: reg, handlers: map[reflect.Type]func(context.Context, pgx.Tx, Event) error{}}
}

// On registers fn for events of type E, which must be registered in the Mux's registry.
func On[E any](m *Mux, fn func(ctx context.Context, tx pgx.Tx, e Event, data E) error) error {
	var zero E
	if _, _, err := m.reg.EventName(zero); err != nil {
		return fmt.Errorf("projection: On: %w", err)
	}
	typ := reflect.TypeFor[E]()
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.handlers[typ]; dup {
		return fmt.Errorf("projection: On: a handler for %s is already registered", typ)
	}
	m.handlers[typ] = func(ctx context.Context, tx pgx.Tx, e Event) error { return fn(ctx, tx, e, e.Data.(E)) }
	return nil
}

// OnReset sets the function that clears the read model when the projection is rebuilt.
func (m *Mux) OnReset(fn func(ctx context.Context, tx pgx.Tx) error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reset = fn
}

// Handle implements Handler.
func (m *Mux) Handle(ctx context.Context, tx pgx.Tx, e Event) error {
	if e.Data == nil {
		d, err := m.reg.Decode(e.Record)
		if err != nil {
			return err
		}
		e.Data = d
	}
	m.mu.RLock()
	fn := m.handlers[reflect.TypeOf(e.Data)]
	m.mu.RUnlock()
	if fn == nil {
		return nil
	}
	return fn(ctx, tx, e)
}

// Reset implements Resetter with the function set by OnReset (nothing when none is set).
func (m *Mux) Reset(ctx context.Context, tx pgx.Tx) error {
	m.mu.RLock()
	fn := m.reset
	m.mu.RUnlock()
	if fn == nil {
		return nil
	}
	return fn(ctx, tx)
}

// OnStreamDeleted sets the function called when a stream the projection follows is deleted (see StreamDeleter).
// Set it before the projection is created: a projection asks the log for deletions only when its Mux has one.
func (m *Mux) OnStreamDeleted(fn func(ctx context.Context, tx pgx.Tx, e Event) error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.deleted = fn
}

func (m *Mux) deletes() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.deleted != nil
}

// StreamDeleted implements StreamDeleter with the function set by OnStreamDeleted (nothing when none is set).
func (m *Mux) StreamDeleted(ctx context.Context, tx pgx.Tx, e Event) error {
	m.mu.RLock()
	fn := m.deleted
	m.mu.RUnlock()
	if fn == nil {
		return nil
	}
	return fn(ctx, tx, e)
}
