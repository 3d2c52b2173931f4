package stagehandtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/names"
)

// DB is what WaitIdle reads through: *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// IdleConfig configures WaitIdle and Idle. A nil *IdleConfig uses the defaults.
type IdleConfig struct {
	// Handlers names, by topic, the inbox handlers (the names given to outbox.Inbox.Handler) that must have handled
	// every message sent to that topic. Default none: a message is done once the relay has sent it, whether or
	// not a consumer has handled it yet.
	Handlers map[string][]string
	// Followers names the projections, staging workers and subscriber groups to wait for, by their checkpoint
	// names (a partitioned projection by its name: every partition is waited for; a staging worker as
	// "stager:NAME" or "reconciler:NAME"). A named follower that has no checkpoint yet (it has not started) is
	// waited for. Default: every follower with a checkpoint in the schema.
	Followers []string
	// Timeout bounds the wait. Default 10s.
	Timeout time.Duration
	// Interval is the time between two looks at the database. Default 10ms.
	Interval time.Duration
}

// NotIdleError is Idle's error: the schema did not become idle in time, or something failed for good (a dead
// letter, a parked event, a failed follower), so it never will. Outstanding says what, one line each.
type NotIdleError struct {
	// Schema is the schema waited on; Head the log head when the wait began.
	Schema string
	Head   int64
	// Waited is how long the wait lasted.
	Waited time.Duration
	// Failed is true when the wait ended at a failure rather than at its timeout.
	Failed bool
	// Outstanding lists what is still outstanding or failed: lagging followers (name, position and head),
	// pending messages (IDs, types, attempts and last errors), messages a named handler has not handled, dead
	// letters and parked events.
	Outstanding []string
}

func (e *NotIdleError) Error() string {
	var b strings.Builder
	if e.Failed {
		fmt.Fprintf(&b, "stagehandtest: schema %q will not become idle (log head %d at the call), after %s:", e.Schema,
			e.Head, e.Waited.Round(time.Millisecond))
	} else {
		fmt.Fprintf(&b, "stagehandtest: schema %q not idle after %s (log head %d at the call):", e.Schema,
			e.Waited.Round(time.Millisecond), e.Head)
	}
	for _, line := range e.Outstanding {
		b.WriteString("\n\t")
		b.WriteString(line)
	}
	return b.String()
}

// WaitIdle waits until everything staged so far in schema is handled and every follower has caught up (see Idle),
// and fails the test (tb.Fatalf) with what is still outstanding when that does not happen within
// IdleConfig.Timeout, or at once when something failed for good.
func WaitIdle(tb testing.TB, db DB, schema string, cfg *IdleConfig) {
	tb.Helper()
	if err := Idle(tb.Context(), db, schema, cfg); err != nil {
		tb.Fatalf("%v", err)
	}
}

// Idle waits until schema is idle as of the call, reading only its tables (so it sees projections, workers,
// relays and consumers run by any process):
//
//   - every follower (projection, staging worker, subscriber group: IdleConfig.Followers) has its checkpoint at or
//     past the log head as it was when Idle was called; a projection's read model commits with its checkpoint, so
//     it is then up to date to that head;
//   - then, every outbox row staged up to the moment the followers got there (so including what a Deferred
//     stager staged from those events) has left the outbox, sent, except messages scheduled for later than the
//     call (staging.Message.ScheduledAt): they are not due, and a test waits for them by calling Idle once they
//     are;
//   - every message sent to a topic named in IdleConfig.Handlers (whenever it was sent) is recorded in the inbox
//     as handled by each handler named for its topic.
//
// Events appended and outbox rows staged after that are not waited for (messages handlers stage, events they
// append): call Idle again to wait for them.
//
// Something that failed for good ends the wait at once with Failed set: an outbox dead letter, an inbox dead
// letter, an event parked by a projection or staging worker, a follower stopped on a failed event. Idle looks at
// the whole schema for these, so a test that expects one resolves it (redrive, discard, replay) before waiting.
//
// It returns nil when idle, a *NotIdleError saying what is outstanding when IdleConfig.Timeout passes or
// something failed, a *stagehand.ConfigError for a schema no stagehand entry point accepts, and ctx's error (or a
// database error) otherwise.
func Idle(ctx context.Context, db DB, schema string, cfg *IdleConfig) error {
	var c IdleConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Interval <= 0 {
		c.Interval = 10 * time.Millisecond
	}
	if reason := names.Schema(schema); reason != "" {
		return &stagehand.ConfigError{Package: "stagehandtest", Field: "schema", Reason: reason}
	}
	w := idleWait{db: db, schema: schema, cfg: c, snapshot: -1, called: time.Now()}
	for topic, hs := range c.Handlers {
		for _, h := range hs {
			w.topics, w.handlers = append(w.topics, topic), append(w.handlers, h)
		}
	}
	began := time.Now()
	deadline := began.Add(c.Timeout)
	head, err := w.head(ctx)
	if err != nil {
		return err
	}
	for {
		st, err := w.look(ctx, head)
		if err != nil {
			return err
		}
		if len(st.failed) > 0 {
			return &NotIdleError{Schema: schema, Head: head, Waited: time.Since(began), Failed: true,
				Outstanding: append(st.failed, st.outstanding...)}
		}
		if st.idle {
			return nil
		}
		if !time.Now().Before(deadline) {
			return &NotIdleError{Schema: schema, Head: head, Waited: time.Since(began), Outstanding: st.outstanding}
		}
		t := time.NewTimer(min(c.Interval, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("stagehandtest: idle: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// idleWait is one Idle call's state.
type idleWait struct {
	db               DB
	schema           string
	cfg              IdleConfig
	topics, handlers []string  // the Handlers pairs, flattened for unnest
	snapshot         int64     // the last outbox row waited for; -1 until the followers reach the head
	called           time.Time // when Idle was called: messages scheduled after it are not waited for
}

// idleState is one look at the schema.
type idleState struct {
	idle        bool
	outstanding []string
	failed      []string
}

// listed is how many items of one kind a message names before "and N more".
const listed = 10

func (w *idleWait) t(table string) string { return pgx.Identifier{w.schema, table}.Sanitize() }

func (w *idleWait) head(ctx context.Context) (int64, error) {
	var head int64
	if err := w.db.QueryRow(ctx, `SELECT coalesce(max(position), 0) FROM `+w.t("events")).Scan(&head); err != nil {
		return 0, fmt.Errorf("stagehandtest: idle: log head of schema %q: %w", w.schema, err)
	}
	return head, nil
}

func (w *idleWait) look(ctx context.Context, head int64) (idleState, error) {
	var st idleState
	caughtUp, err := w.followers(ctx, head, &st)
	if err != nil {
		return st, err
	}
	if err := w.failures(ctx, &st); err != nil {
		return st, err
	}
	if caughtUp && w.snapshot < 0 {
		if err := w.db.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM `+w.t("outbox")).Scan(&w.snapshot); err != nil {
			return st, fmt.Errorf("stagehandtest: idle: outbox: %w", err)
		}
	}
	pending := 0
	if w.snapshot >= 0 {
		if pending, err = w.pending(ctx, &st); err != nil {
			return st, err
		}
	}
	unhandled, err := w.unhandled(ctx, &st)
	if err != nil {
		return st, err
	}
	st.idle = caughtUp && pending == 0 && unhandled == 0
	return st, nil
}

// followers notes the followers behind head (and those failed) and reports whether all have reached it.
func (w *idleWait) followers(ctx context.Context, head int64, st *idleState) (bool, error) {
	rows, err := w.db.Query(ctx, `SELECT name, kind, position, state, coalesce(last_error, ''),
			coalesce(failing_position, 0)
		FROM `+w.t("checkpoints")+` ORDER BY name`)
	if err != nil {
		return false, fmt.Errorf("stagehandtest: idle: checkpoints: %w", err)
	}
	defer rows.Close()
	seen := map[string]bool{}
	all := true
	for rows.Next() {
		var name, kind, state, lastErr string
		var pos, failing int64
		if err := rows.Scan(&name, &kind, &pos, &state, &lastErr, &failing); err != nil {
			return false, fmt.Errorf("stagehandtest: idle: checkpoints: %w", err)
		}
		wanted := len(w.cfg.Followers) == 0
		for _, f := range w.cfg.Followers {
			if name == f || strings.HasPrefix(name, f+"#") {
				wanted, seen[f] = true, true
			}
		}
		switch {
		case !wanted:
		case state == "failed":
			all = false
			st.failed = append(st.failed, fmt.Sprintf("%s %q failed at position %d: %s", kind, name, failing,
				names.Cut(lastErr, 500)))
		case pos < head:
			all = false
			line := fmt.Sprintf("%s %q at position %d of head %d (%s)", kind, name, pos, head, state)
			if lastErr != "" && failing > 0 {
				line += fmt.Sprintf(", retrying position %d: %s", failing, names.Cut(lastErr, 500))
			}
			st.outstanding = append(st.outstanding, line)
		}
	}
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("stagehandtest: idle: checkpoints: %w", err)
	}
	for _, f := range w.cfg.Followers {
		if !seen[f] {
			all = false
			st.outstanding = append(st.outstanding, fmt.Sprintf("follower %q has no checkpoint yet (not started?)", f))
		}
	}
	return all, nil
}

// pending notes the outbox rows up to the snapshot that are still in the outbox.
func (w *idleWait) pending(ctx context.Context, st *idleState) (int, error) {
	rows, err := w.db.Query(ctx, `SELECT message_id, topic, message_type, attempts, coalesce(last_error, ''),
			next_attempt_at = 'infinity', scheduled_at, count(*) OVER ()
		FROM `+w.t("outbox")+` WHERE id <= $1 AND (scheduled_at IS NULL OR scheduled_at <= $3)
		ORDER BY id LIMIT $2`, w.snapshot, listed, w.called)
	if err != nil {
		return 0, fmt.Errorf("stagehandtest: idle: outbox: %w", err)
	}
	defer rows.Close()
	n, i := 0, 0
	for rows.Next() {
		var id, topic, typ, lastErr string
		var attempts int
		var parked bool
		var scheduled *time.Time
		if err := rows.Scan(&id, &topic, &typ, &attempts, &lastErr, &parked, &scheduled, &n); err != nil {
			return 0, fmt.Errorf("stagehandtest: idle: outbox: %w", err)
		}
		if i == 0 {
			st.outstanding = append(st.outstanding, fmt.Sprintf("%d message(s) pending in the outbox:", n))
		}
		i++
		line := fmt.Sprintf("  message %q (topic %q, type %q, %d attempt(s)", id, topic, typ, attempts)
		switch {
		case parked:
			line += ", waiting behind an earlier message of its partition key"
		case scheduled != nil && scheduled.After(time.Now()):
			line += ", scheduled for " + scheduled.UTC().Format(time.RFC3339)
		}
		if lastErr != "" {
			line += ", last error: " + names.Cut(lastErr, 300)
		}
		st.outstanding = append(st.outstanding, line+")")
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("stagehandtest: idle: outbox: %w", err)
	}
	if n > i {
		st.outstanding = append(st.outstanding, fmt.Sprintf("  and %d more", n-i))
	}
	return n, nil
}

// unhandled notes the sent messages a named inbox handler has not handled.
func (w *idleWait) unhandled(ctx context.Context, st *idleState) (int, error) {
	if len(w.topics) == 0 {
		return 0, nil
	}
	rows, err := w.db.Query(ctx, `SELECT s.message_id, s.topic, s.message_type, h.handler, count(*) OVER ()
		FROM `+w.t("outbox_sent")+` s JOIN unnest($1::text[], $2::text[]) AS h(topic, handler) ON h.topic = s.topic
		WHERE s.outcome = 'sent' AND NOT EXISTS (SELECT 1 FROM `+w.t("inbox")+` i
			WHERE i.message_id = s.message_id AND i.handler = h.handler AND i.tenant_id = s.tenant_id)
		ORDER BY s.sent_at, s.message_id, h.handler LIMIT $3`, w.topics, w.handlers, listed)
	if err != nil {
		return 0, fmt.Errorf("stagehandtest: idle: inbox: %w", err)
	}
	defer rows.Close()
	n, i := 0, 0
	for rows.Next() {
		var id, topic, typ, handler string
		if err := rows.Scan(&id, &topic, &typ, &handler, &n); err != nil {
			return 0, fmt.Errorf("stagehandtest: idle: inbox: %w", err)
		}
		if i == 0 {
			st.outstanding = append(st.outstanding, fmt.Sprintf("%d sent message(s) not handled yet:", n))
		}
		i++
		st.outstanding = append(st.outstanding, fmt.Sprintf("  message %q (topic %q, type %q) by handler %q", id,
			topic, typ, handler))
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("stagehandtest: idle: inbox: %w", err)
	}
	if n > i {
		st.outstanding = append(st.outstanding, fmt.Sprintf("  and %d more", n-i))
	}
	return n, nil
}

// failures notes what failed for good: dead letters and parked events.
func (w *idleWait) failures(ctx context.Context, st *idleState) error {
	for _, q := range []struct {
		what, sql string
		line      func(a, b, c, d string, n int64, lastErr string) string
	}{
		{"outbox dead letters", `SELECT message_id, topic, message_type, '', attempts, last_error
			FROM ` + w.t("outbox_dead_letters") + ` ORDER BY dead_at LIMIT $1`,
			func(id, topic, typ, _ string, n int64, lastErr string) string {
				return fmt.Sprintf("message %q (topic %q, type %q) dead-lettered after %d attempt(s): %s", id, topic,
					typ, n, lastErr)
			}},
		{"inbox dead letters", `SELECT message_id, topic, message_type, handler, attempts, last_error
			FROM ` + w.t("inbox_dead_letters") + ` ORDER BY dead_at LIMIT $1`,
			func(id, topic, typ, handler string, n int64, lastErr string) string {
				return fmt.Sprintf("message %q (topic %q, type %q) dead-lettered by inbox handler %q after %d "+
					"attempt(s): %s", id, topic, typ, handler, n, lastErr)
			}},
		{"parked events", `SELECT projection, event_type, stream_id, '', position, last_error
			FROM ` + w.t("projection_parked") + ` ORDER BY id LIMIT $1`,
			func(name, typ, stream, _ string, pos int64, lastErr string) string {
				return fmt.Sprintf("projection %q parked the event at position %d (type %q, stream %q): %s", name,
					pos, typ, stream, lastErr)
			}},
		{"parked events", `SELECT worker, event_type, stream_id, '', position, last_error
			FROM ` + w.t("staging_parked") + ` ORDER BY id LIMIT $1`,
			func(name, typ, stream, _ string, pos int64, lastErr string) string {
				return fmt.Sprintf("staging worker %q parked the event at position %d (type %q, stream %q): %s",
					name, pos, typ, stream, lastErr)
			}},
	} {
		rows, err := w.db.Query(ctx, q.sql, listed)
		if err != nil {
			return fmt.Errorf("stagehandtest: idle: %s: %w", q.what, err)
		}
		for rows.Next() {
			var a, b, c, d, lastErr string
			var n int64
			if err := rows.Scan(&a, &b, &c, &d, &n, &lastErr); err != nil {
				rows.Close()
				return fmt.Errorf("stagehandtest: idle: %s: %w", q.what, err)
			}
			st.failed = append(st.failed, q.line(a, b, c, d, n, names.Cut(lastErr, 500)))
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("stagehandtest: idle: %s: %w", q.what, err)
		}
	}
	return nil
}
