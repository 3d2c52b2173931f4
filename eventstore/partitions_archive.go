package eventstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/internal/names"
)

// ArchiveDisposition says what Archive does with a detached partition.
type ArchiveDisposition string

// Dispositions of an archived partition.
const (
	// ArchiveMove moves the table to the archive schema (default).
	ArchiveMove ArchiveDisposition = "move"
	// ArchiveDrop drops it.
	ArchiveDrop ArchiveDisposition = "drop"
	// ArchiveDetach leaves it in the store's schema as a plain table (pg_dump it, then drop it).
	ArchiveDetach ArchiveDisposition = "detach"
)

// ArchiveRequest says which partition to archive and how.
type ArchiveRequest struct {
	// Partition names the partition. Empty means the oldest attached one, the only one that may be archived:
	// archived positions are always a prefix of the log.
	Partition string
	// Disposition says what happens to the detached table. Default ArchiveMove.
	Disposition ArchiveDisposition
	// ArchiveSchema is where ArchiveMove moves it. Default the store's schema with "_archive" appended.
	ArchiveSchema string
	// AllowUncovered archives even when streams with events in the partition have no snapshot taken after them.
	// Loads of those streams then fail with an *ArchivedError naming the stream and the archived range (never a
	// state rebuilt from part of its history). Default false: Archive refuses, naming a few.
	AllowUncovered bool
}

// ArchiveResult describes an archive.
type ArchiveResult struct {
	// Partition is the archived partition, as it now is.
	Partition Partition
	// Uncovered is the number of streams whose loads now fail with an *ArchivedError (AllowUncovered).
	Uncovered int64
	// Check is the time taken by the checks, Detach by DETACH PARTITION CONCURRENTLY, Duration by the whole.
	Check    time.Duration
	Detach   time.Duration
	Duration time.Duration
}

// Archive detaches the oldest partition without blocking appends or reads (DETACH PARTITION CONCURRENTLY), then
// moves it to the archive schema, drops it, or leaves it (req.Disposition), removes its event IDs from event_ids
// and records it in event_archives.
//
// It refuses (an *ArchiveRefusedError naming every reason, nothing changed) while the partition is still needed:
// the log has not drawn its last position; a log follower (a projection, the Deferred stager, the reconciler, a
// log subscriber: every row of the checkpoints table) has not passed it or has a rebuild pending; an outbox
// watermark has not passed it; a projection or a staging worker has parked events in it (replay or discard them
// first); or, unless req.AllowUncovered, a stream with events in it has no snapshot at a later version. Log
// followers that never ran in the schema are unknown to it.
//
// An archive interrupted after the detach began is finished by running Archive again (for the same partition).
func (p *Partitions) Archive(ctx context.Context, req ArchiveRequest) (ArchiveResult, error) {
	start := time.Now()
	var res ArchiveResult
	switch req.Disposition {
	case "":
		req.Disposition = ArchiveMove
	case ArchiveMove, ArchiveDrop, ArchiveDetach:
	default:
		return res, fmt.Errorf("eventstore: archive: unknown disposition %q (move, drop or detach)", req.Disposition)
	}
	if req.ArchiveSchema == "" {
		req.ArchiveSchema = p.cfg.Schema + "_archive"
	}
	if reason := names.Identifier(req.ArchiveSchema); reason != "" {
		return res, fmt.Errorf("eventstore: archive: ArchiveSchema %q %s", names.Cut(req.ArchiveSchema, 80), reason)
	}
	s, err := p.lock(ctx)
	if err != nil {
		return res, err
	}
	defer s.release()
	st, err := p.status(ctx, s.conn)
	if err != nil {
		return res, err
	}
	if !st.Partitioned {
		return res, fmt.Errorf("%w: %s (convert it first)", ErrNotPartitioned, p.t.events)
	}
	if len(st.Attached) == 0 {
		return res, fmt.Errorf("eventstore: archive: %s has no partition", p.t.events)
	}
	// An archive that stopped after its detach began is finished first, whatever was asked.
	part, resume := st.Attached[0], st.Attached[0].State == PartitionDetaching
	for _, a := range st.Archived {
		if a.State == PartitionDetaching {
			part, resume = a, true
		}
	}
	if !resume && req.Partition != "" && req.Partition != part.Name {
		return res, fmt.Errorf("eventstore: archive: %q is not the oldest attached partition (%s): partitions are "+
			"archived oldest first", req.Partition, part.Name)
	}
	if !resume {
		t0 := time.Now()
		if res.Uncovered, err = s.check(ctx, st, part, req.AllowUncovered); err != nil {
			return res, err
		}
		res.Check = time.Since(t0)
		rec := p.q.recordDetaching
		if _, err := s.conn.Exec(ctx, rec.SQL, rec.Args(&partParam{Partition: part.Name, FromPosition: part.From,
			ToPosition: part.To, Events: part.Events})...); err != nil {
			return res, fmt.Errorf("eventstore: archive: record %s: %w", part.Name, err)
		}
	}
	idents := p.partitionIdents(part.Name)
	idents["archive_schema"] = pgx.Identifier{req.ArchiveSchema}.Sanitize()
	t0 := time.Now()
	switch {
	case part.State == PartitionDetaching && attached(st, part.Name):
		// A DETACH CONCURRENTLY that was interrupted after its first transaction.
		err = s.execNamed(ctx, "detach_finalize", nil, idents, true)
	case part.State == PartitionAttached:
		err = s.execNamed(ctx, "detach", nil, idents, true)
	}
	if err != nil {
		return res, fmt.Errorf("eventstore: archive: detach %s (run the archive again to finish it): %w", part.Name, err)
	}
	res.Detach = time.Since(t0)
	p.cfg.Logger.InfoContext(ctx, "stagehand: events partition detached", "schema", p.cfg.Schema,
		"partition", part.Name, "took", res.Detach)

	var events int64
	count, err := ddl("count_partition", nil, idents)
	if err == nil {
		err = s.conn.QueryRow(ctx, count).Scan(&events)
	}
	if err != nil {
		return res, fmt.Errorf("eventstore: archive: count %s: %w", part.Name, err)
	}
	if err := s.execNamed(ctx, "remove_partition_ids", nil, idents, false); err != nil {
		return res, fmt.Errorf("eventstore: archive: remove the event IDs of %s: %w", part.Name, err)
	}
	state, schema := PartitionDetached, ""
	switch req.Disposition {
	case ArchiveMove:
		if err := s.execNamed(ctx, "create_archive_schema", nil, idents, false); err != nil {
			return res, fmt.Errorf("eventstore: archive: create schema %q: %w", req.ArchiveSchema, err)
		}
		if err := s.execNamed(ctx, "move_partition", nil, idents, true); err != nil {
			return res, fmt.Errorf("eventstore: archive: move %s to %q: %w", part.Name, req.ArchiveSchema, err)
		}
		state, schema = PartitionMoved, req.ArchiveSchema
	case ArchiveDrop:
		if err := s.execNamed(ctx, "drop_partition", nil, idents, true); err != nil {
			return res, fmt.Errorf("eventstore: archive: drop %s: %w", part.Name, err)
		}
		state = PartitionDropped
	}
	rec := p.q.recordArchived
	if _, err := s.conn.Exec(ctx, rec.SQL, rec.Args(&partParam{Partition: part.Name, State: string(state),
		Events: events, ArchiveSchema: nilIfBlank(schema)})...); err != nil {
		return res, fmt.Errorf("eventstore: archive: record %s: %w", part.Name, err)
	}
	part.State, part.Events, part.ArchiveSchema, part.ArchivedAt = state, events, schema, time.Now().UTC()
	if state == PartitionDropped {
		part.Bytes = 0
	}
	res.Partition, res.Duration = part, time.Since(start)
	return res, nil
}

func nilIfBlank(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// check returns the reasons not to archive part, as an *ArchiveRefusedError, and the number of streams no
// snapshot covers.
func (s *session) check(ctx context.Context, st PartitionStatus, part Partition, allowUncovered bool) (int64, error) {
	p := s.p
	last := part.To - 1
	var reasons []string
	if st.Drawn < last {
		reasons = append(reasons, fmt.Sprintf("the log has not reached the partition's end: position %d drawn, "+
			"the partition ends at %d", st.Drawn, last))
	}
	if len(st.Attached) < 2 {
		reasons = append(reasons, "it is the only attached partition")
	}
	behind := &partParam{Last: last, FromPosition: part.From, ToPosition: part.To}
	rows, err := s.conn.Query(ctx, p.q.followersBehind.SQL, p.q.followersBehind.Args(behind)...)
	if err != nil {
		return 0, fmt.Errorf("eventstore: archive: read the log followers' checkpoints: %w", err)
	}
	for rows.Next() {
		var name, kind string
		var pos int64
		var reset bool
		if err := rows.Scan(&name, &kind, &pos, &reset); err != nil {
			rows.Close()
			return 0, fmt.Errorf("eventstore: archive: read the log followers' checkpoints: %w", err)
		}
		if reset {
			reasons = append(reasons, fmt.Sprintf("log follower %q (%s) has a rebuild pending, which reads the "+
				"log from the start", name, kind))
		} else {
			reasons = append(reasons, fmt.Sprintf("log follower %q (%s) is at position %d, before %d", name, kind,
				pos, last))
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("eventstore: archive: read the log followers' checkpoints: %w", err)
	}
	rows, err = s.conn.Query(ctx, p.q.watermarksBehind.SQL, p.q.watermarksBehind.Args(behind)...)
	if err != nil {
		return 0, fmt.Errorf("eventstore: archive: read the outbox watermarks: %w", err)
	}
	for rows.Next() {
		var name string
		var pos int64
		if err := rows.Scan(&name, &pos); err != nil {
			rows.Close()
			return 0, fmt.Errorf("eventstore: archive: read the outbox watermarks: %w", err)
		}
		reasons = append(reasons, fmt.Sprintf("outbox watermark %q is at position %d, before %d", name, pos, last))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("eventstore: archive: read the outbox watermarks: %w", err)
	}
	var projParked, stagingParked int64
	if err := s.conn.QueryRow(ctx, p.q.parkedIn.SQL, p.q.parkedIn.Args(behind)...).
		Scan(&projParked, &stagingParked); err != nil {
		return 0, fmt.Errorf("eventstore: archive: count parked events: %w", err)
	}
	if projParked > 0 {
		reasons = append(reasons, fmt.Sprintf("%d events parked by projections are in it (replay or discard them)",
			projParked))
	}
	if stagingParked > 0 {
		reasons = append(reasons, fmt.Sprintf("%d events parked by staging workers are in it (replay or discard "+
			"them)", stagingParked))
	}
	idents := p.partitionIdents(part.Name)
	var uncovered int64
	count, err := ddl("count_uncovered", nil, idents)
	if err == nil {
		err = s.conn.QueryRow(ctx, count).Scan(&uncovered)
	}
	if err != nil {
		return 0, fmt.Errorf("eventstore: archive: find the streams no snapshot covers: %w", err)
	}
	if uncovered > 0 && !allowUncovered {
		var examples []string
		list, err := ddl("uncovered_examples", nil, idents)
		if err == nil {
			err = s.conn.QueryRow(ctx, list).Scan(&examples)
		}
		if err != nil {
			return 0, fmt.Errorf("eventstore: archive: find the streams no snapshot covers: %w", err)
		}
		reasons = append(reasons, fmt.Sprintf("%d streams with events in it have no snapshot taken after them, "+
			"so loading them would need it (for example %s); snapshot them, or allow uncovered streams (their "+
			"loads then fail with ErrArchived)", uncovered, strings.Join(examples, ", ")))
	}
	if len(reasons) > 0 {
		return 0, &ArchiveRefusedError{Partition: part.Name, Reasons: reasons}
	}
	return uncovered, nil
}

// archivedRange returns the archived positions [from, to), or (0, 0) when nothing is archived.
func (s *PostgresStore) archivedRange(ctx context.Context, db dbtx) (int64, int64, error) {
	return archivedRange(ctx, db, s.q.archivedRange.SQL)
}

// archivedRange runs the statement archived_range (sql/partitions.sql), written out as stmt.
func archivedRange(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, stmt string) (int64, int64, error) {
	var from, to int64
	err := db.QueryRow(ctx, stmt).Scan(&from, &to)
	if err != nil {
		return 0, 0, fmt.Errorf("eventstore: read the archived ranges: %w", err)
	}
	return from, to, nil
}

// CheckLogFrom returns an *ArchivedError when a read of schema's global log after position after would need
// archived events (see Partitions.Archive), and nil when it would not (nothing is archived, or after is at or past
// the end of the archived range). It is for code that is about to send a reader there from afar, such as a
// projection rebuild requested by an operator: the reader itself gets the same error from ReadLog.
func CheckLogFrom(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, schema string, after int64) error {
	if reason := names.Schema(schema); reason != "" {
		return &ConfigError{Package: "eventstore", Field: "schema", Reason: reason}
	}
	stmt, err := ddl("archived_range", nil, map[string]string{
		"archives": pgx.Identifier{schema, "event_archives"}.Sanitize()})
	if err != nil {
		return err
	}
	from, to, err := archivedRange(ctx, db, stmt)
	if err != nil {
		return err
	}
	if to > 0 && after < to-1 {
		return &ArchivedError{After: after, ArchivedFrom: from, ArchivedTo: to}
	}
	return nil
}
