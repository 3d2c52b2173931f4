package staging

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/stagehand-es/stagehand/outbox"
)

// ErrUnhandledMessageType matches the *UnhandledError of CheckHandled: a mapping produces a message type no
// handler handles, or a mapping does not declare what it produces.
var ErrUnhandledMessageType = errors.New("staging: mapped message type has no handler")

// MapOption configures a mapping registered with Map or MapRaw.
type MapOption func(*mapConfig)

type mapConfig struct {
	types    []string
	declared bool
}

// MessageTypes declares the message types a mapping produces: the Type of each Message it returns, or the event's
// type name for a Message that leaves Type empty. CheckHandled compares the declared types with a service's
// handlers at start. The declaration is enforced: a message of another type fails its staging with an error
// matching ErrInvalidMessage (the save, under Transactional), so a declaration cannot drift from what the mapping
// does. Without the option a mapping may produce any type, and CheckHandled reports it as undeclared.
func MessageTypes(types ...string) MapOption {
	return func(o *mapConfig) {
		o.types = append(o.types, types...)
		o.declared = true
	}
}

// declaredTypes applies opts of mapping name, returning its declared message types (sorted, without duplicates; nil
// when it declares none).
func declaredTypes(name string, opts []MapOption) ([]string, error) {
	var o mapConfig
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: mapping %q: nil MapOption", ErrInvalidConfig, name)
		}
		opt(&o)
	}
	if !o.declared {
		return nil, nil
	}
	if len(o.types) == 0 {
		return nil, fmt.Errorf("%w: mapping %q: MessageTypes needs at least one type", ErrInvalidConfig, name)
	}
	for _, t := range o.types {
		if strings.TrimSpace(t) == "" {
			return nil, fmt.Errorf("%w: mapping %q: MessageTypes has an empty type", ErrInvalidConfig, name)
		}
	}
	types := slices.Clone(o.types)
	slices.Sort(types)
	return slices.Compact(types), nil
}

// MessageTypes returns the message types the mapping's mappings declare with MessageTypes, sorted.
func (m *Mapping) MessageTypes() []string {
	types, _ := m.declared()
	return types
}

// declared returns the declared message types, sorted, and the names of the mappings that declare none, sorted.
func (m *Mapping) declared() (types, undeclared []string) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, routes := range m.byType {
		for _, r := range routes {
			if r.types == nil {
				undeclared = append(undeclared, r.name)
			}
			types = append(types, r.types...)
		}
	}
	slices.Sort(types)
	slices.Sort(undeclared)
	return slices.Compact(types), undeclared
}

// UnhandledError is the error of CheckHandled. It matches ErrUnhandledMessageType.
type UnhandledError struct {
	// Unhandled are the message types some mapping declares and no given Handlers handles, sorted. Each would be
	// dead-lettered with outbox.ErrUnknownMessageType (or dropped, by Handlers that ignore unknown types).
	Unhandled []string
	// Undeclared are the names of the mappings that do not declare their message types (MessageTypes), sorted: what
	// they produce cannot be checked.
	Undeclared []string
	// Unmapped are the message types some Handlers handles and no mapping declares, sorted. They are reported for
	// information (they may come from another service's mappings) and never make the check fail on their own.
	Unmapped []string
}

func (e *UnhandledError) Error() string {
	var parts []string
	if len(e.Unhandled) > 0 {
		parts = append(parts, fmt.Sprintf("message types mapped but not handled: %s", strings.Join(e.Unhandled, ", ")))
	}
	if len(e.Undeclared) > 0 {
		parts = append(parts, fmt.Sprintf("mappings that do not declare their message types (staging.MessageTypes): %s",
			strings.Join(e.Undeclared, ", ")))
	}
	if len(e.Unmapped) > 0 {
		parts = append(parts, fmt.Sprintf("handled but not mapped here: %s", strings.Join(e.Unmapped, ", ")))
	}
	return "staging: " + strings.Join(parts, "; ")
}

// Is matches ErrUnhandledMessageType.
func (e *UnhandledError) Is(target error) bool { return target == ErrUnhandledMessageType }

// CheckHandled compares the message types m's mappings declare (MessageTypes) with the types handlers handle
// (outbox.Handlers.Types), for a service that consumes its own messages to call at start: a mapped type nobody
// handles would otherwise surface only as ErrUnknownMessageType dead letters. It returns an *UnhandledError when a
// declared type has no handler in any of handlers, or when a mapping declares no types; nil otherwise. Types handled
// but never mapped are listed in the error (Unmapped) without causing it. Pass every Handlers that consumes m's
// messages; a type consumed by another service shows as unhandled, which the caller may filter out of the error's
// Unhandled field.
func CheckHandled(m *Mapping, handlers ...*outbox.Handlers) error {
	if m == nil {
		return fmt.Errorf("%w: CheckHandled needs a Mapping", ErrInvalidConfig)
	}
	mapped, undeclared := m.declared()
	var handled []string
	for i, hs := range handlers {
		if hs == nil {
			return fmt.Errorf("%w: CheckHandled: handlers[%d] is nil", ErrInvalidConfig, i)
		}
		handled = append(handled, hs.Types()...)
	}
	slices.Sort(handled)
	handled = slices.Compact(handled)
	e := &UnhandledError{Undeclared: undeclared}
	for _, t := range mapped {
		if _, ok := slices.BinarySearch(handled, t); !ok {
			e.Unhandled = append(e.Unhandled, t)
		}
	}
	for _, t := range handled {
		if _, ok := slices.BinarySearch(mapped, t); !ok {
			e.Unmapped = append(e.Unmapped, t)
		}
	}
	if len(e.Unhandled) == 0 && len(e.Undeclared) == 0 {
		return nil
	}
	return e
}
