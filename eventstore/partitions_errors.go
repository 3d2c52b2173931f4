package eventstore

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Errors of a partitioned events table (see Partitions). Compare with errors.Is.
var (
	// ErrArchived matches an *ArchivedError: a read needs events that were archived.
	ErrArchived = errors.New("eventstore: events archived")
	// ErrNoPartition matches a *NoPartitionError: an append drew a position that no partition holds.
	ErrNoPartition = errors.New("eventstore: no partition for the position")
	// ErrNotPartitioned: a partition operation on an events table that was never converted (Partitions.Convert).
	ErrNotPartitioned = errors.New("eventstore: the events table is not partitioned")
	// ErrArchiveRefused matches an *ArchiveRefusedError: archiving the partition would lose something still needed.
	ErrArchiveRefused = errors.New("eventstore: archive refused")
)

// ArchivedError is the error of a read that needs archived events, instead of a history with a hole in it.
//
// A stream read (ReadStream, ReadStreamTx, Stream, and so aggregate loads) returns it when versions it asked for
// were in a partition that was archived: Tenant and StreamID name the stream, FromVersion..ToVersion the versions
// that are no longer stored. A load that starts from a snapshot taken after them does not need them (Archive
// refuses, unless told otherwise, to archive events of a stream that no snapshot covers).
//
// A read of the global log (ReadLog, so projections, staging workers and log subscribers) returns it when it asks
// for positions in the archived range: StreamID is empty and After is the position it read after. Continue after
// ArchivedTo-1, knowingly (a projection rebuilt from there misses the archived events), or restore the archive.
type ArchivedError struct {
	Tenant   string
	StreamID string
	// FromVersion and ToVersion bound the versions asked for that are archived (stream reads).
	FromVersion, ToVersion int64
	// After is the position a log read asked to read after (log reads).
	After int64
	// ArchivedFrom and ArchivedTo bound the archived positions: ArchivedFrom inclusive, ArchivedTo exclusive.
	ArchivedFrom, ArchivedTo int64
}

func (e *ArchivedError) Error() string {
	if e.StreamID == "" {
		return fmt.Sprintf("eventstore: the global log after position %d is archived (positions %d to %d); read "+
			"after position %d, or restore the archive", e.After, e.ArchivedFrom, e.ArchivedTo-1, e.ArchivedTo-1)
	}
	return fmt.Sprintf("eventstore: stream %q (tenant %q): versions %d to %d are archived (positions %d to %d) and "+
		"no snapshot covers them; restore the archive, or load from a snapshot taken after them", e.StreamID,
		e.Tenant, e.FromVersion, e.ToVersion, e.ArchivedFrom, e.ArchivedTo-1)
}

// Is makes errors.Is(err, ErrArchived) true.
func (e *ArchivedError) Is(target error) bool { return target == ErrArchived }

// NoPartitionError is the error of an append that drew a position beyond the last partition of a partitioned
// events table: nothing was appended. Partitions are created ahead by Partitions.Ensure (run it periodically, or
// `stagehand events partitions create`); an append never lands in a partition nobody planned.
type NoPartitionError struct {
	// Position is the position the append drew (0 when PostgreSQL did not report it).
	Position int64
	// Err is the database's error.
	Err error
}

func (e *NoPartitionError) Error() string {
	return fmt.Sprintf("eventstore: no partition of the events table holds position %d, so nothing was appended: "+
		"create partitions ahead (Partitions.Ensure, or `stagehand events partitions create`)", e.Position)
}

// Is makes errors.Is(err, ErrNoPartition) true.
func (e *NoPartitionError) Is(target error) bool { return target == ErrNoPartition }

// Unwrap returns the database's error.
func (e *NoPartitionError) Unwrap() error { return e.Err }

// ArchiveRefusedError is the error of Partitions.Archive when archiving the partition would lose something still
// needed; nothing was detached. Reasons says what, one line each: a log follower or an outbox watermark that has
// not passed the partition, parked events in it, streams no snapshot covers, a log that has not reached its end.
type ArchiveRefusedError struct {
	Partition string
	Reasons   []string
}

func (e *ArchiveRefusedError) Error() string {
	return fmt.Sprintf("eventstore: archive of partition %s refused: %s", e.Partition, strings.Join(e.Reasons, "; "))
}

// Is makes errors.Is(err, ErrArchiveRefused) true.
func (e *ArchiveRefusedError) Is(target error) bool { return target == ErrArchiveRefused }

var noPartitionKey = regexp.MustCompile(`\("?position"?\) = \((\d+)\)`)

// noPartition returns a *NoPartitionError when err is PostgreSQL's "no partition of relation found for row".
func noPartition(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" || !strings.HasPrefix(pgErr.Message, "no partition of relation") {
		return nil
	}
	np := &NoPartitionError{Err: err}
	if m := noPartitionKey.FindStringSubmatch(pgErr.Detail); m != nil {
		np.Position, _ = strconv.ParseInt(m[1], 10, 64)
	}
	return np
}

// partitionPrefix starts the name of every partition of the events table: events_p and the first position it holds,
// in 19 digits (so names sort as positions do).
const partitionPrefix = "events_p"

func partitionName(from int64) string { return fmt.Sprintf("%s%019d", partitionPrefix, from) }

// isPartitionName reports whether name is a partition's name (partitionName).
func isPartitionName(name string) bool {
	rest, ok := strings.CutPrefix(name, partitionPrefix)
	if !ok || len(rest) != 19 {
		return false
	}
	for _, c := range rest {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
