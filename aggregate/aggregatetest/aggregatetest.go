// Package aggregatetest tests an aggregate's decisions without a database, in a given/when/then form:
//
//	aggregatetest.Given(reg, bank.NewAccount("a-1"), bank.Opened{Owner: "ann"}, bank.Deposited{Amount: 100}).
//		When(func(a *bank.Account) error { return a.Withdraw(30) }).
//		Then(t, bank.Withdrawn{Amount: 30})
//
// Every given and raised event also makes the trip it makes in production: it is encoded with the registry and
// decoded back, and the result must equal the original (reflect.DeepEqual). So a test fails, naming the event type
// and what differs, when an event is not registered, is a pointer (Load hands Apply values), cannot be encoded (a
// map[any]..., a func), or does not survive its codec: an unexported field (encoding/json skips it), a time.Time
// with a monotonic clock reading or a location the codec does not keep, a number in an interface that comes back as
// a float64, an empty slice under omitempty that comes back nil. Such an event would be stored, and its aggregate
// would differ after a Load from what the command saw.
package aggregatetest

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
)

// TB is the part of testing.TB the helpers use.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Scenario is an aggregate with its history applied.
type Scenario[A aggregate.Aggregate] struct {
	reg      *aggregate.Registry
	agg      A
	problems []string
}

// Given applies history to a (as stored events, not as changes) and returns the scenario. reg is the registry the
// aggregate's events are registered in: every history event is round-tripped through it (see the package
// documentation), and a failure is reported by Then, ThenError or ThenNothing.
func Given[A aggregate.Aggregate](reg *aggregate.Registry, a A, history ...any) *Scenario[A] {
	s := &Scenario[A]{reg: reg, agg: a}
	if reg == nil {
		s.problems = append(s.problems, "Given needs the registry the aggregate's events are registered in, got nil")
	}
	for i, e := range history {
		if p := roundTrip(reg, e); p != "" {
			s.problems = append(s.problems, fmt.Sprintf("given event %d: %s", i, p))
		}
	}
	aggregate.Replay(a, history...)
	return s
}

// Result is the outcome of a command.
type Result[A aggregate.Aggregate] struct {
	agg      A
	err      error
	events   []any
	skip     int
	problems []string
}

// When runs a command on the aggregate and records the error it returned and the events it raised; every raised
// event is round-tripped through the registry.
func (s *Scenario[A]) When(command func(A) error) *Result[A] {
	before := len(any(s.agg).(interface{ Changes() []any }).Changes())
	err := command(s.agg)
	r := &Result[A]{agg: s.agg, err: err, events: any(s.agg).(interface{ Changes() []any }).Changes(), skip: before,
		problems: slices.Clone(s.problems)}
	for i, e := range r.raised() {
		if p := roundTrip(s.reg, e); p != "" {
			r.problems = append(r.problems, fmt.Sprintf("raised event %d: %s", i, p))
		}
	}
	return r
}

// Then requires that the given and raised events survive the registry's round trip, that the command succeeded,
// and that it raised exactly want, in order (compared with reflect.DeepEqual).
func (r *Result[A]) Then(t TB, want ...any) *Result[A] {
	t.Helper()
	if r.failed(t) {
		return r
	}
	if r.err != nil {
		t.Fatalf("aggregatetest: command failed: %v", r.err)
		return r
	}
	if msg := diff(r.raised(), want); msg != "" {
		t.Fatalf("aggregatetest: %s", msg)
	}
	return r
}

// ThenError requires that the given events survive the registry's round trip, and that the command failed with an
// error matching target (errors.Is) and raised nothing.
func (r *Result[A]) ThenError(t TB, target error) *Result[A] {
	t.Helper()
	if r.failed(t) {
		return r
	}
	switch {
	case r.err == nil:
		t.Fatalf("aggregatetest: expected error %v, the command succeeded and raised %s", target,
			describe(r.raised()))
	case !errors.Is(r.err, target):
		t.Fatalf("aggregatetest: expected error %v, got %v", target, r.err)
	case len(r.raised()) > 0:
		t.Fatalf("aggregatetest: a failed command must raise nothing, it raised %s", describe(r.raised()))
	}
	return r
}

// ThenNothing requires that the command succeeded and raised no event.
func (r *Result[A]) ThenNothing(t TB) *Result[A] {
	t.Helper()
	return r.Then(t)
}

// State returns the aggregate after the command, for assertions on its state.
func (r *Result[A]) State() A { return r.agg }

// Err returns the command's error.
func (r *Result[A]) Err() error { return r.err }

func (r *Result[A]) raised() []any { return r.events[r.skip:] }

// failed reports the round-trip problems, if any, as one failure.
func (r *Result[A]) failed(t TB) bool {
	t.Helper()
	if len(r.problems) == 0 {
		return false
	}
	t.Fatalf("aggregatetest: %s", strings.Join(r.problems, "\naggregatetest: "))
	return true
}

// roundTrip encodes event with reg and decodes it back, as a save and a load do, and says how the result differs
// from event ("" when it is equal).
func roundTrip(reg *aggregate.Registry, event any) string {
	if reg == nil {
		return ""
	}
	typ := reflect.TypeOf(event)
	if typ == nil {
		return "a nil event"
	}
	if typ.Kind() == reflect.Pointer {
		return fmt.Sprintf("%s is a pointer: raise and give %s values (Load hands Apply values, so an Apply "+
			"written for one form misses the other, and a repository refuses to save it)", typ, typ.Elem())
	}
	name, version, payload, err := reg.Encode(event)
	if err != nil {
		return fmt.Sprintf("%s cannot be stored: %v", typ, err)
	}
	got, err := reg.Decode(eventstore.Record{StreamID: "aggregatetest", Type: name, TypeVersion: version,
		Payload: payload})
	if err != nil {
		return fmt.Sprintf("%s does not load from its own encoding %s: %v", typ, payload, err)
	}
	if reflect.DeepEqual(got, event) {
		return ""
	}
	what := firstDiff(typ.String(), reflect.ValueOf(event), reflect.ValueOf(got))
	if what == "" {
		what = fmt.Sprintf("%#v loads as %#v", event, got)
	}
	return fmt.Sprintf("%s does not survive the registry's codec (encoded as %s): %s", typ, payload, what)
}

var timeType = reflect.TypeFor[time.Time]()

// firstDiff describes the first place where want (the event as raised) and got (as loaded) differ, or "". It reads
// unexported fields too, through reflection's read-only accessors.
func firstDiff(path string, want, got reflect.Value) string {
	if !want.IsValid() || !got.IsValid() {
		if want.IsValid() != got.IsValid() {
			return fmt.Sprintf("%s is %s, loads as %s", path, show(want), show(got))
		}
		return ""
	}
	if want.Type() != got.Type() {
		hint := ""
		if got.Kind() == reflect.Float64 && (want.CanInt() || want.CanUint()) {
			hint = " (a number in an interface loads as a float64, which holds integers exactly only up to 2^53)"
		}
		return fmt.Sprintf("%s is %s %s, loads as %s %s%s", path, want.Type(), show(want), got.Type(), show(got),
			hint)
	}
	switch want.Kind() {
	case reflect.Struct:
		if want.Type() == timeType {
			return timeDiff(path, want, got)
		}
		for i := range want.NumField() {
			f := want.Type().Field(i)
			if !f.IsExported() && !want.Field(i).IsZero() && got.Field(i).IsZero() {
				return fmt.Sprintf("%s.%s is %s, loads as the zero value: the field is unexported, so the codec "+
					"does not store it", path, f.Name, show(want.Field(i)))
			}
			if d := firstDiff(path+"."+f.Name, want.Field(i), got.Field(i)); d != "" {
				return d
			}
		}
	case reflect.Pointer, reflect.Interface:
		if want.IsNil() || got.IsNil() {
			if want.IsNil() != got.IsNil() {
				return fmt.Sprintf("%s is %s, loads as %s", path, show(want), show(got))
			}
			return ""
		}
		return firstDiff(path, want.Elem(), got.Elem())
	case reflect.Slice, reflect.Map:
		if want.IsNil() != got.IsNil() {
			return fmt.Sprintf("%s is %s, loads as %s (omitempty drops an empty one; null loads as nil)", path,
				nilOrEmpty(want), nilOrEmpty(got))
		}
		if want.Kind() == reflect.Map {
			return mapDiff(path, want, got)
		}
		fallthrough
	case reflect.Array:
		if want.Len() != got.Len() {
			return fmt.Sprintf("%s has %d elements, loads with %d", path, want.Len(), got.Len())
		}
		for i := range want.Len() {
			if d := firstDiff(fmt.Sprintf("%s[%d]", path, i), want.Index(i), got.Index(i)); d != "" {
				return d
			}
		}
	default:
		if !sameScalar(want, got) {
			return fmt.Sprintf("%s is %s, loads as %s", path, show(want), show(got))
		}
	}
	return ""
}

func mapDiff(path string, want, got reflect.Value) string {
	if want.Len() != got.Len() {
		return fmt.Sprintf("%s has %d entries, loads with %d", path, want.Len(), got.Len())
	}
	for _, k := range want.MapKeys() {
		g := got.MapIndex(k)
		if !g.IsValid() {
			return fmt.Sprintf("%s has the key %s, which does not load", path, show(k))
		}
		if d := firstDiff(fmt.Sprintf("%s[%s]", path, show(k)), want.MapIndex(k), g); d != "" {
			return d
		}
	}
	return ""
}

func timeDiff(path string, want, got reflect.Value) string {
	if !want.CanInterface() || !got.CanInterface() {
		return fmt.Sprintf("%s is %s, loads as %s", path, show(want), show(got))
	}
	w, g := want.Interface().(time.Time), got.Interface().(time.Time)
	if !w.Equal(g) {
		return fmt.Sprintf("%s is %s, loads as %s (the codec loses precision)", path, w, g)
	}
	if w.Round(0) != w {
		return fmt.Sprintf("%s is %s, loads as %s: the same instant, but its monotonic clock reading does not "+
			"survive the codec; strip it where the command takes the time (t.Round(0), or t.UTC())", path, w, g)
	}
	return fmt.Sprintf("%s is %s, loads as %s: the same instant in another location; raise times in the "+
		"location the codec loads (t.UTC())", path, w, g)
}

// sameScalar compares two values of the same basic kind without Interface, so unexported fields compare too.
func sameScalar(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.Bool:
		return a.Bool() == b.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return a.Int() == b.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return a.Uint() == b.Uint()
	case reflect.Float32, reflect.Float64:
		return a.Float() == b.Float()
	case reflect.Complex64, reflect.Complex128:
		return a.Complex() == b.Complex()
	case reflect.String:
		return a.String() == b.String()
	}
	return false // funcs, channels, unsafe pointers: the codec refuses them before this
}

func show(v reflect.Value) string {
	if !v.IsValid() {
		return "nil"
	}
	if v.Kind() == reflect.String {
		return fmt.Sprintf("%q", v.String())
	}
	return fmt.Sprintf("%v", v)
}

func nilOrEmpty(v reflect.Value) string {
	if v.IsNil() {
		return "nil"
	}
	return fmt.Sprintf("empty (%s)", v.Type())
}

func diff(got, want []any) string {
	if len(got) != len(want) {
		return fmt.Sprintf("raised %d events %s, want %d %s", len(got), describe(got), len(want), describe(want))
	}
	for i := range got {
		if !reflect.DeepEqual(got[i], want[i]) {
			return fmt.Sprintf("event %d: got %T%+v, want %T%+v", i, got[i], got[i], want[i], want[i])
		}
	}
	return ""
}

func describe(events []any) string {
	s := "["
	for i, e := range events {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%T%+v", e, e)
	}
	return s + "]"
}
