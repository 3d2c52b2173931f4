package aggregate

import "maps"

// Aggregate is implemented by user types that embed Root and define Apply:
//
//	type Account struct {
//		aggregate.Root
//		balance int64
//	}
//
//	func (a *Account) Apply(event any) {
//		switch e := event.(type) {
//		case Deposited:
//			a.balance += e.Amount
//		}
//	}
//
// Apply mutates state from an event and must not fail: decisions (and their errors) belong in the command methods
// that call Raise. The same Apply replays history on Load.
type Aggregate interface {
	// Apply changes the aggregate's state to reflect event.
	Apply(event any)
	// base is provided by embedding Root; it keeps the interface satisfiable only by aggregates.
	base() *Root
}

// Root is embedded (by value) in every aggregate. It holds the aggregate's ID, its version, and the events raised
// since it was loaded or last saved.
type Root struct {
	id        string
	tenant    string // set when loaded, so a save under another tenant is refused
	version   int64  // version including raised, unsaved events
	persisted int64  // version of the last stored event
	pending   []raised
}

type raised struct {
	event    any
	metadata map[string]string
}

// NewRoot returns a Root for a new aggregate with the given ID. Constructors registered with RegisterAggregate
// use it:
//
//	func NewAccount(id string) *Account { return &Account{Root: aggregate.NewRoot(id)} }
func NewRoot(id string) Root { return Root{id: id} }

// ID returns the aggregate's ID (its stream ID).
func (r *Root) ID() string { return r.id }

// Version returns the aggregate's version, counting raised events that are not saved yet.
func (r *Root) Version() int64 { return r.version }

// StoredVersion returns the version of the last stored event (0 for a new aggregate). Save uses it as the
// expected version.
func (r *Root) StoredVersion() int64 { return r.persisted }

// Changes returns the events raised since the aggregate was loaded or last saved, in order.
func (r *Root) Changes() []any {
	out := make([]any, len(r.pending))
	for i, p := range r.pending {
		out[i] = p.event
	}
	return out
}

func (r *Root) base() *Root { return r }

// RaiseOption sets per-event options on Raise.
type RaiseOption func(*raised)

// WithEventMetadata adds a user key/value to the raised event's stored metadata (in addition to what the context
// carries at Save).
func WithEventMetadata(key, value string) RaiseOption {
	return func(r *raised) {
		if r.metadata == nil {
			r.metadata = map[string]string{}
		}
		r.metadata[key] = value
	}
}

// Raise records event as a change of a and applies it through a.Apply. Events are values of types registered with
// RegisterEvent, never pointers: Load decodes stored events into values and hands those to Apply, so an Apply
// that handles E misses a raised *E (and one that handles *E misses every loaded E). A pointer event is applied as
// given but refused when the aggregate is saved: Save, SaveTx, Create, Update, Upsert and their twins return an
// error matching ErrPointerEvent, naming the type, before anything is written.
func Raise(a Aggregate, event any, opts ...RaiseOption) {
	r := raised{event: event}
	for _, o := range opts {
		o(&r)
	}
	b := a.base()
	b.pending = append(b.pending, r)
	b.version++
	a.Apply(event)
}

// Replay applies past events to a as history (not as changes), advancing its stored version. Load uses it; tests
// and custom loaders may too.
func Replay(a Aggregate, events ...any) {
	b := a.base()
	for _, e := range events {
		a.Apply(e)
		b.version++
		b.persisted++
	}
}

func (r *Root) markSaved(version int64) {
	r.persisted = version
	r.version = version
	r.pending = nil
}

func (r *Root) pendingMetadata(i int) map[string]string { return maps.Clone(r.pending[i].metadata) }
