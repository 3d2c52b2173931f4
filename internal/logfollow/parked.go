package logfollow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/sqlfile"
)

// Parked is one table of parked events: the events a follower set aside (its OnExhausted) after handling them
// kept failing, in the transaction that moved its checkpoint past them, so each is handled, parked or still ahead,
// never skipped. Projections (projection_parked, owned by projection name, with the parking checkpoint) and the
// staging workers (staging_parked, owned by worker name) each have one; both are laid out alike but for their
// owner column.
type Parked struct {
	table      string // the sanitized table name
	owner      string // the owner column ("projection", "worker"), a plain identifier
	checkpoint bool   // the table records the checkpoint (partition) that parked each event
	notFound   error  // the owner package's sentinel for an unknown ID
	label      string // what error messages start with ("projection", "staging")
}

// NewParked returns the parked-event table table in schema, whose owner column is owner (and which has a
// checkpoint column when checkpoint is true). Errors for an unknown ID match notFound; error messages start with
// label.
func NewParked(schema, table, owner string, checkpoint bool, notFound error, label string) Parked {
	return Parked{table: pgx.Identifier{schema, table}.Sanitize(), owner: owner, checkpoint: checkpoint,
		notFound: notFound, label: label}
}

// ParkedEvent is one row of a parked-event table.
type ParkedEvent = stagehand.ParkedEvent

// Park records the event failure gave up on, for owner (parked by checkpoint), in tx: the follower's transaction
// that moves the checkpoint past it. An event parked again adds its attempts and replaces the last error.
func (p Parked) Park(ctx context.Context, tx pgx.Tx, owner, checkpoint string, failure *HandlerError) error {
	rec := failure.Record
	column, value := "", ""
	if p.checkpoint {
		column, value = "checkpoint, ", "@checkpoint::text, "
	}
	park, err := p.statement("park", "checkpoint column", column, "checkpoint value", value)
	if err == nil {
		_, err = tx.Exec(ctx, park.SQL, park.Args(&parkedRow{Owner: owner, Checkpoint: checkpoint,
			Position: rec.Position, Tenant: rec.Tenant, StreamID: rec.StreamID, StreamType: rec.StreamType,
			Version: rec.Version, EventID: rec.EventID, EventType: rec.Type, Attempts: failure.Attempts,
			LastError: failure.Err.Error()})...)
	}
	if err != nil {
		return fmt.Errorf("%s: %s: park event at position %d: %w", p.label, owner, rec.Position, err)
	}
	return nil
}

// List returns the parked events of owner ("" for every owner), by owner and then oldest position first.
func (p Parked) List(ctx context.Context, db DB, owner string) ([]ParkedEvent, error) {
	list, err := p.statement("parked_list")
	if err != nil {
		return nil, fmt.Errorf("%s: list parked events: %w", p.label, err)
	}
	rows, err := db.Query(ctx, list.SQL, list.Args(&parkedRow{Owner: owner})...)
	if err != nil {
		return nil, fmt.Errorf("%s: list parked events: %w", p.label, err)
	}
	out, err := pgx.CollectRows(rows, scanParked)
	if err != nil {
		return nil, fmt.Errorf("%s: list parked events: %w", p.label, err)
	}
	return out, nil
}

// Page returns the parked events q selects, in ID order (the earliest parked first), reading the table by its
// primary key, so a long list is read a page at a time. Tenants must have been validated by the caller; a blank one
// is NoTenant.
func (p Parked) Page(ctx context.Context, db DB, q stagehand.ParkedQuery) ([]ParkedEvent, error) {
	if q.Limit <= 0 {
		q.Limit = 100
	}
	var tenants []string
	if len(q.Tenants) > 0 {
		tenants = NormalizeTenants(q.Tenants)
	}
	page, err := p.statement("parked_page")
	if err != nil {
		return nil, fmt.Errorf("%s: list parked events: %w", p.label, err)
	}
	rows, err := db.Query(ctx, page.SQL, page.Args(&parkedRow{Owner: q.Owner, Tenants: tenants, IDs: q.IDs,
		AfterID: q.AfterID, Limit: q.Limit})...)
	if err != nil {
		return nil, fmt.Errorf("%s: list parked events: %w", p.label, err)
	}
	out, err := pgx.CollectRows(rows, scanParked)
	if err != nil {
		return nil, fmt.Errorf("%s: list parked events: %w", p.label, err)
	}
	return out, nil
}

func scanParked(r pgx.CollectableRow) (ParkedEvent, error) {
	var e ParkedEvent
	err := r.Scan(&e.ID, &e.Owner, &e.Checkpoint, &e.Position, &e.Tenant, &e.StreamID, &e.StreamType, &e.Version,
		&e.EventID, &e.EventType, &e.Attempts, &e.LastError, &e.ParkedAt, &e.ReplayRequested)
	e.ParkedAt = e.ParkedAt.UTC()
	return e, err
}

// Counts returns how many events are parked per owner, or per checkpoint when byCheckpoint (a table with a
// checkpoint column).
func (p Parked) Counts(ctx context.Context, db DB, byCheckpoint bool) (map[string]int, error) {
	col := p.owner
	if byCheckpoint && p.checkpoint {
		col = "checkpoint"
	}
	counts, err := p.statement("parked_counts", "group", col)
	if err != nil {
		return nil, fmt.Errorf("%s: count parked events: %w", p.label, err)
	}
	rows, err := db.Query(ctx, counts.SQL, counts.Args(&parkedRow{})...)
	if err != nil {
		return nil, fmt.Errorf("%s: count parked events: %w", p.label, err)
	}
	out := map[string]int{}
	var name string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error { out[name] = n; return nil }); err != nil {
		return nil, fmt.Errorf("%s: count parked events: %w", p.label, err)
	}
	return out, nil
}

// Discard deletes the parked event id without handling it (an operator's decision). An unknown id is an error
// matching the table's not-found sentinel.
func (p Parked) Discard(ctx context.Context, db DB, id int64) error {
	discard, err := p.statement("parked_discard")
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = db.Exec(ctx, discard.SQL, discard.Args(&parkedRow{ID: id})...)
	}
	if err != nil {
		return fmt.Errorf("%s: discard parked event %d: %w", p.label, id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %d", p.notFound, id)
	}
	return nil
}

// RequestReplay marks owner's parked events ids (all of them when ids is empty) for the process running owner to
// replay (ReplayRequested), and returns how many it marked.
func (p Parked) RequestReplay(ctx context.Context, db DB, owner string, ids ...int64) (int64, error) {
	request, err := p.statement("parked_request_replay")
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = db.Exec(ctx, request.SQL, request.Args(&parkedRow{Owner: owner, IDs: ids})...)
	}
	if err != nil {
		return 0, fmt.Errorf("%s: request replay of parked events of %q: %w", p.label, owner, err)
	}
	return tag.RowsAffected(), nil
}

// Beginner starts transactions: *pgxpool.Pool and *pgx.Conn satisfy it.
type Beginner interface {
	DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Replay handles owner's parked event id again: it reads the event from store and calls handle with it in a
// transaction that deletes the parked row. On success the event is handled once and no longer parked; on failure
// nothing of handle's is kept, the parked row records one more attempt and the new error (and its replay request
// is cleared), and the error is returned. An id that is unknown or owned by another owner is an error matching
// the table's not-found sentinel.
func (p Parked) Replay(ctx context.Context, db Beginner, store eventstore.Store, owner string, id int64,
	handle func(ctx context.Context, tx pgx.Tx, rec eventstore.Record) error) error {
	var pos int64
	var holder string
	locate, err := p.statement("parked_locate")
	if err != nil {
		return fmt.Errorf("%s: %s: read parked event %d: %w", p.label, owner, id, err)
	}
	err = db.QueryRow(ctx, locate.SQL, locate.Args(&parkedRow{ID: id})...).Scan(&pos, &holder)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && holder != owner) {
		return fmt.Errorf("%w: %d (%s %s)", p.notFound, id, p.owner, owner)
	}
	if err != nil {
		return fmt.Errorf("%s: %s: read parked event %d: %w", p.label, owner, id, err)
	}
	// The event is read before the transaction begins: a store's reads take a connection of their own, which
	// must not wait for one while the transaction holds another.
	page, err := store.ReadLog(ctx, eventstore.LogQuery{After: pos - 1, Limit: 1})
	switch {
	case err != nil:
		err = fmt.Errorf("read event at position %d: %w", pos, err)
	case len(page.Records) != 1 || page.Records[0].Position != pos:
		err = fmt.Errorf("the event at position %d is no longer in the log", pos)
	}
	if err == nil {
		err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			return p.replayOn(ctx, tx, id, page.Records[0], handle)
		})
	}
	if err == nil || errors.Is(err, p.notFound) {
		return err
	}
	failed, uerr := p.statement("parked_replay_failed")
	if uerr == nil {
		_, uerr = db.Exec(context.WithoutCancel(ctx), failed.SQL, failed.Args(&parkedRow{ID: id,
			LastError: err.Error()})...)
	}
	if uerr != nil {
		return fmt.Errorf("%s: %s: replay parked event %d: %w (and its failure could not be recorded: %w)",
			p.label, owner, id, err, uerr)
	}
	return fmt.Errorf("%s: %s: replay parked event %d: %w", p.label, owner, id, err)
}

// replayOn deletes parked event id and handles rec, its event, on tx.
func (p Parked) replayOn(ctx context.Context, tx pgx.Tx, id int64, rec eventstore.Record,
	handle func(ctx context.Context, tx pgx.Tx, rec eventstore.Record) error) error {
	discard, err := p.statement("parked_discard")
	if err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, discard.SQL, discard.Args(&parkedRow{ID: id})...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %d (replayed or discarded meanwhile)", p.notFound, id)
	}
	return handle(ctx, tx, rec)
}

// ReplayRequested replays, oldest first, owner's parked events an operator asked for (RequestReplay), each through
// replay (the owner's Replay). Failures are logged; a replayed event that failed again stays parked with its
// request cleared.
func (p Parked) ReplayRequested(ctx context.Context, db DB, owner string, logger *slog.Logger,
	replay func(ctx context.Context, id int64) error) {
	requested, err := p.statement("parked_requested")
	var rows pgx.Rows
	if err == nil {
		rows, err = db.Query(ctx, requested.SQL, requested.Args(&parkedRow{Owner: owner})...)
	}
	if err != nil {
		if ctx.Err() == nil {
			logger.WarnContext(ctx, "stagehand: could not read replay requests", p.owner, owner, "error", err)
		}
		return
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return
	}
	for _, id := range ids {
		if err := replay(ctx, id); err != nil && !errors.Is(err, p.notFound) && ctx.Err() == nil {
			logger.WarnContext(ctx, "stagehand: requested replay of a parked event failed", p.owner, owner,
				"id", id, "error", err)
		}
	}
}

// Every runs fn every interval until ctx ends, in a goroutine of its own, and returns a function that stops it
// and waits for it to return: the replay loop that a follower's owner runs beside the follower.
func Every(ctx context.Context, interval time.Duration, fn func(ctx context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				fn(ctx)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// parkedRow holds the named parameters of the parked-event statements (sql/parked.sql): a statement takes the ones
// it names.
type parkedRow struct {
	ID         int64     `sql:"id"`
	Owner      string    `sql:"owner"`
	Checkpoint string    `sql:"checkpoint"`
	Position   int64     `sql:"position"`
	Tenant     string    `sql:"tenant_id"`
	StreamID   string    `sql:"stream_id"`
	StreamType string    `sql:"stream_type"`
	Version    int64     `sql:"version"`
	EventID    uuid.UUID `sql:"event_id"`
	EventType  string    `sql:"event_type"`
	Attempts   int       `sql:"attempts"`
	LastError  string    `sql:"last_error"`
	Tenants    []string  `sql:"tenants"`
	IDs        []int64   `sql:"ids"`
	AfterID    int64     `sql:"after_id"`
	Limit      int       `sql:"limit"`
}

// statement writes the parked-event statement name out for p's table, with the extra raw markers of extra (pairs
// of marker and text).
func (p Parked) statement(name string, extra ...string) (sqlfile.Named[parkedRow], error) {
	checkpoint := "''"
	if p.checkpoint {
		checkpoint = "checkpoint"
	}
	raw := map[string]string{"owner": p.owner, "checkpoint": checkpoint}
	for i := 0; i+1 < len(extra); i += 2 {
		raw[extra[i]] = extra[i+1]
	}
	text, err := sqlSet.Expand(name, raw, map[string]string{"parked": p.table})
	if err != nil {
		return sqlfile.Named[parkedRow]{}, fmt.Errorf("write statement %s: %w", name, err)
	}
	return sqlfile.Bind[parkedRow](text)
}
