// Package aggregatetest tests an aggregate's decisions without a database, in a given/when/then form:
//
//	aggregatetest.Given(bank.NewAccount("a-1"), bank.Opened{Owner: "ann"}, bank.Deposited{Amount: 100}).
//		When(func(a *bank.Account) error { return a.Withdraw(30) }).
//		Then(t, bank.Withdrawn{Amount: 30})
package aggregatetest

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/stagehand-es/stagehand/aggregate"
)

// TB is the part of testing.TB the helpers use.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Scenario is an aggregate with its history applied.
type Scenario[A aggregate.Aggregate] struct {
	agg A
}

// Given applies history to a (as stored events, not as changes) and returns the scenario.
func Given[A aggregate.Aggregate](a A, history ...any) *Scenario[A] {
	aggregate.Replay(a, history...)
	return &Scenario[A]{agg: a}
}

// Result is the outcome of a command.
type Result[A aggregate.Aggregate] struct {
	agg    A
	err    error
	events []any
	skip   int
}

// When runs a command on the aggregate and records the error it returned and the events it raised.
func (s *Scenario[A]) When(command func(A) error) *Result[A] {
	before := len(any(s.agg).(interface{ Changes() []any }).Changes())
	err := command(s.agg)
	return &Result[A]{agg: s.agg, err: err, events: any(s.agg).(interface{ Changes() []any }).Changes(), skip: before}
}

// Then requires that the command succeeded and raised exactly want, in order (compared with reflect.DeepEqual).
func (r *Result[A]) Then(t TB, want ...any) *Result[A] {
	t.Helper()
	if r.err != nil {
		t.Fatalf("aggregatetest: command failed: %v", r.err)
		return r
	}
	if msg := diff(r.raised(), want); msg != "" {
		t.Fatalf("aggregatetest: %s", msg)
	}
	return r
}

// ThenError requires that the command failed with an error matching target (errors.Is) and raised nothing.
func (r *Result[A]) ThenError(t TB, target error) *Result[A] {
	t.Helper()
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
