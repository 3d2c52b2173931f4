package eventstore

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// Queued is what a QueueFunc is given: the append as it will be stored, the batch that holds its insert, and SQL
// for where its events will be in the global log.
type Queued struct {
	// Planned describes the events as they will be stored, except what only the insert assigns: Position is 0 and
	// RecordedAt is zero.
	Planned AppendResult
	// Batch holds the append's insert; queue the statements that follow it here.
	Batch *pgx.Batch
	// Positions are SQL expressions for the positions the insert gives the events, for the queued statements.
	Positions AppendedPositions
}

// AppendedPositions are SQL expressions, written by the event store, for the global positions of the events an
// append inserted earlier in the same transaction: a statement queued after the append (QueueFunc) reads the
// positions through them without naming the store's tables or its position sequence, which stay the event store's
// own.
type AppendedPositions struct {
	// Key identifies the expressions; it changes when the store's layout does (a table converted to partitions).
	// Callers that cache statements written with them key the cache on it.
	Key string
	// LastEventID is the ID of the append's last event: Last gives its position.
	LastEventID string
	// Last is a bigint expression: the position of the append's last event, the last one to draw a position from
	// the store's sequence in this session (no lookup).
	Last string
	// byID holds {event_id} where the event ID expression goes.
	byID string
}

// ByID returns a bigint expression: the position of the appended event whose ID is the text expression eventID
// (found by its ID: use Last for the append's last event).
func (p AppendedPositions) ByID(eventID string) string {
	return strings.ReplaceAll(p.byID, "{event_id}", eventID)
}

// appendedPositions writes the expressions for the store's layout. An event is looked up by ID in the events table,
// or in event_ids when the table is partitioned (one index instead of one per partition, every one of which the
// statement would lock).
func (s *PostgresStore) appendedPositions(partitioned bool, lastEventID string) AppendedPositions {
	q := func(name string) string { return pgx.Identifier{s.cfg.Schema, name}.Sanitize() }
	seq := strings.ReplaceAll(q("events_position_seq"), "'", "''")
	lookup, key := q("events"), s.cfg.Schema+"/events"
	if partitioned {
		lookup, key = q("event_ids"), s.cfg.Schema+"/event_ids"
	}
	return AppendedPositions{Key: key, LastEventID: lastEventID, Last: "currval('" + seq + "')",
		byID: "(SELECT e.position FROM " + lookup + " e WHERE e.event_id = ({event_id})::uuid)"}
}
