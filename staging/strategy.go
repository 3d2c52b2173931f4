package staging

import (
	"fmt"
	"strings"
)

// Strategy decides how a repository's saves stage the integration messages derived from their events.
type Strategy int

const (
	// Auto resolves once, at construction: Transactional when the event store can share a transaction with the
	// outbox (a TransactionalStore on the outbox's database), else EventuallyConsistent when an outbox is
	// configured, else Deferred (with a warning: nothing is staged unless a Deferred stager runs). "The outbox's
	// database" is decided by the databases themselves, not by connection strings: pools whose configurations
	// differ are each asked for their server's identity and their database's name (within 5 seconds, since New
	// takes no context), so one database reached as 127.0.0.1 and as localhost is one, two databases on one
	// server are two, and a database that cannot answer is not taken to be the event store's.
	Auto Strategy = iota
	// Transactional appends the events and stages their messages in one PostgreSQL transaction.
	Transactional
	// EventuallyConsistent commits the append, then stages the messages in a second call; a Reconciler following
	// the log stages whatever a crash between the two left out.
	EventuallyConsistent
	// Deferred stages nothing on save; a DeferredStager following the log stages, in the transaction that
	// advances its checkpoint.
	Deferred
)

var strategyNames = [...]string{"auto", "transactional", "eventually-consistent", "deferred"}

// String returns the strategy's configuration name: auto, transactional, eventually-consistent or deferred.
func (s Strategy) String() string {
	if s < 0 || int(s) >= len(strategyNames) {
		return fmt.Sprintf("strategy(%d)", int(s))
	}
	return strategyNames[s]
}

// ParseStrategy parses a strategy name, ignoring case, spaces, dashes and underscores: "auto", "Transactional",
// "eventually-consistent", "EventuallyConsistent", "eventually_consistent", "deferred".
func ParseStrategy(text string) (Strategy, error) {
	norm := strings.NewReplacer("-", "", "_", "", " ", "").Replace(strings.ToLower(strings.TrimSpace(text)))
	for i, name := range strategyNames {
		if norm == strings.ReplaceAll(name, "-", "") {
			return Strategy(i), nil
		}
	}
	return Auto, fmt.Errorf("%w: %q is not a staging strategy (auto, transactional, eventually-consistent, "+
		"deferred)", ErrInvalidConfig, text)
}

// MarshalText implements encoding.TextMarshaler.
func (s Strategy) MarshalText() ([]byte, error) {
	if s < 0 || int(s) >= len(strategyNames) {
		return nil, fmt.Errorf("%w: unknown strategy %d", ErrInvalidConfig, int(s))
	}
	return []byte(s.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler, so a Strategy can be read from JSON, YAML, flags or env.
func (s *Strategy) UnmarshalText(text []byte) error {
	v, err := ParseStrategy(string(text))
	if err != nil {
		return err
	}
	*s = v
	return nil
}
