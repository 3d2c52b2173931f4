package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/stagehand-es/stagehand/projection"
)

func (a *app) projectionCommand() *cobra.Command {
	return group("projection", "Projection status, rebuilds and parked events",
		`Show the status of every projection (read from the database, whichever process runs it), request rebuilds
and replays of parked events. A rebuild or replay is performed by the process running the projection; the CLI
records the request and can wait for it.`,
		a.projectionStatusCommand(), a.projectionRebuildCommand(), a.projectionParkedCommand())
}

type projectionStatusJSON struct {
	Projection      string     `json:"projection"`
	Checkpoint      string     `json:"checkpoint"`
	Partition       int        `json:"partition"`
	Partitions      int        `json:"partitions"`
	State           string     `json:"state"`
	Position        int64      `json:"position"`
	Head            int64      `json:"head"`
	Lag             int64      `json:"lag"`
	TimeLagSeconds  float64    `json:"time_lag_seconds"`
	Parked          int        `json:"parked"`
	Rebuilding      bool       `json:"rebuilding"`
	LastError       string     `json:"last_error,omitempty"`
	LastErrorAt     *time.Time `json:"last_error_at,omitempty"`
	FailingPosition int64      `json:"failing_position,omitempty"`
	Attempts        int        `json:"attempts,omitempty"`
	Filter          string     `json:"filter,omitempty"`
	Owner           string     `json:"owner,omitempty"`
	LastEventAt     *time.Time `json:"last_event_at,omitempty"`
	UpdatedAt       time.Time  `json:"updated_at"`
}

func optionalTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func statusJSON(s projection.Status) projectionStatusJSON {
	return projectionStatusJSON{Projection: s.Projection, Checkpoint: s.Checkpoint, Partition: s.Partition,
		Partitions: s.Partitions, State: string(s.State), Position: s.Position, Head: s.Head, Lag: s.Lag,
		TimeLagSeconds: seconds(s.TimeLag), Parked: s.Parked, Rebuilding: s.Rebuilding, LastError: s.LastError,
		LastErrorAt: optionalTime(s.LastErrorAt), FailingPosition: s.FailingPosition, Attempts: s.Attempts,
		Filter: s.Filter, Owner: s.Owner, LastEventAt: optionalTime(s.LastEventAt), UpdatedAt: s.UpdatedAt.UTC()}
}

// projectionStatus returns the status of every checkpoint of the projection name ("" for all).
func (a *app) projectionStatus(ctx context.Context, name string) ([]projection.Status, error) {
	store, err := a.eventStore(ctx)
	if err != nil {
		return nil, err
	}
	all, err := projection.ListStatus(ctx, store.Pool(), store, a.schema)
	if err != nil {
		return nil, a.dbError(err)
	}
	if name == "" {
		return all, nil
	}
	var out []projection.Status
	for _, s := range all {
		if s.Projection == name {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no projection named %q in schema %q (a projection appears once it has run)", name,
			a.schema)
	}
	return out, nil
}

func (a *app) projectionStatusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status [NAME]",
		Short: "Show every projection's state, position, lag and errors",
		Long: `Show every projection checkpoint (one per partition): state (running, stopped, failed, or not-started for a
partition no process has run yet), position, the head of the log and the lag behind it (in positions and in time),
parked events, a pending rebuild, the last error.`,
		Example: `  stagehand projection status
  stagehand projection status balances --json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			sts, err := a.projectionStatus(cmd.Context(), name)
			if err != nil {
				return err
			}
			if a.json {
				out := make([]projectionStatusJSON, 0, len(sts))
				for _, s := range sts {
					out = append(out, statusJSON(s))
				}
				return a.writeJSON(struct {
					Schema      string                 `json:"schema"`
					Projections []projectionStatusJSON `json:"projections"`
				}{a.schema, out})
			}
			if len(sts) == 0 {
				return a.printf("No projection has run in schema %q.\n", a.schema)
			}
			rows := make([][]string, 0, len(sts))
			for _, s := range sts {
				rebuilding := "-"
				if s.Rebuilding {
					rebuilding = "requested"
				}
				lastErr := "-"
				if s.LastError != "" {
					lastErr = truncate(s.LastError, 50)
					if s.FailingPosition != 0 {
						lastErr = fmt.Sprintf("at %d, attempt %d: %s", s.FailingPosition, s.Attempts, lastErr)
					}
				}
				rows = append(rows, []string{s.Checkpoint, string(s.State), fmt.Sprint(s.Position),
					fmt.Sprint(s.Head), fmt.Sprint(s.Lag), human(s.TimeLag), fmt.Sprint(s.Parked), rebuilding,
					orDash(s.Owner), lastErr})
			}
			return a.table([]string{"PROJECTION", "STATE", "POSITION", "HEAD", "LAG", "TIME LAG", "PARKED",
				"REBUILD", "OWNER", "LAST ERROR"}, rows)
		},
	}
}

type rebuildJSON struct {
	Schema     string                 `json:"schema"`
	Projection string                 `json:"projection"`
	Requested  bool                   `json:"requested"`
	Waited     bool                   `json:"waited"`
	Completed  bool                   `json:"completed"`
	Target     int64                  `json:"target,omitempty"`
	Elapsed    float64                `json:"elapsed_seconds,omitempty"`
	Status     []projectionStatusJSON `json:"status"`
}

func (a *app) projectionRebuildCommand() *cobra.Command {
	var (
		wait    bool
		timeout time.Duration
		poll    time.Duration
		after   int64
	)
	c := &cobra.Command{
		Use:   "rebuild NAME",
		Short: "Request a rebuild of a projection, and optionally wait for it",
		Long: `Record a rebuild request for the projection NAME. The process running it performs it within about a
poll interval: it resets the read model and every partition's checkpoint in one transaction, then replays the whole
log (a projection that is not running does it when it next starts). --after N replays only the events after
position N: once the start of a partitioned log is archived, a rebuild that would read archived events is refused
(exit 1, naming the archived range), and --after the range's last position rebuilds from what remains.

With --wait the command waits until the rebuild has caught up with the head of the log as it was when the request
was made, showing a progress bar with the elapsed time and an ETA when standard output is a terminal. Ctrl-C stops
waiting; the rebuild goes on.`,
		Example: `  stagehand projection rebuild balances
  stagehand projection rebuild balances --wait --timeout 30m
  stagehand projection rebuild balances --after 1000000   # the log up to 1000000 is archived`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if after < 0 {
				return usageErrorf("--after must not be negative")
			}
			if timeout < 0 {
				return usageErrorf("--timeout must not be negative")
			}
			if poll < 10*time.Millisecond {
				return usageErrorf("--poll-interval must be at least 10ms")
			}
			ctx, name := cmd.Context(), args[0]
			before, err := a.projectionStatus(ctx, name)
			if err != nil {
				return err
			}
			store, err := a.eventStore(ctx)
			if err != nil {
				return err
			}
			target, err := store.HeadPosition(ctx)
			if err != nil {
				return a.dbError(err)
			}
			if err := projection.RequestRebuildFrom(ctx, store.Pool(), a.schema, name, after); err != nil {
				return a.dbError(err)
			}
			if !wait {
				if a.json {
					return a.writeJSON(rebuildJSON{Schema: a.schema, Projection: name, Requested: true,
						Status: statusesJSON(before)})
				}
				return a.printf("Rebuild of projection %q requested (state: %s); the process running it "+
					"performs it. Follow it with 'stagehand projection status %s'.\n", name, states(before), name)
			}
			start := time.Now()
			final, err := a.waitRebuild(ctx, name, target, timeout, poll)
			if err != nil {
				return err
			}
			elapsed := time.Since(start)
			if a.json {
				return a.writeJSON(rebuildJSON{Schema: a.schema, Projection: name, Requested: true, Waited: true,
					Completed: true, Target: target, Elapsed: seconds(elapsed), Status: statusesJSON(final)})
			}
			return a.printf("Rebuild of projection %q done: caught up with position %d in %s.\n", name, target,
				human(elapsed))
		},
	}
	c.Flags().BoolVar(&wait, "wait", false, "wait until the rebuild has caught up, with progress")
	c.Flags().Int64Var(&after, "after", 0, "replay only the events after this position (default: the whole log)")
	c.Flags().DurationVar(&timeout, "timeout", 0, "with --wait: give up waiting after this long (0: never)")
	c.Flags().DurationVar(&poll, "poll-interval", 500*time.Millisecond, "with --wait: how often to read the status")
	return c
}

func statusesJSON(sts []projection.Status) []projectionStatusJSON {
	out := make([]projectionStatusJSON, 0, len(sts))
	for _, s := range sts {
		out = append(out, statusJSON(s))
	}
	return out
}

// states summarises the states of a projection's checkpoints ("running", or "running, stopped").
func states(sts []projection.Status) string {
	var out []string
	for _, s := range sts {
		if !slices.Contains(out, string(s.State)) {
			out = append(out, string(s.State))
		}
	}
	return strings.Join(out, ", ")
}

// waitRebuild waits until every checkpoint of the projection has been reset and has caught up with target.
func (a *app) waitRebuild(ctx context.Context, name string, target int64, timeout,
	poll time.Duration) ([]projection.Status, error) {
	wctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	b := a.newBar(target, fmt.Sprintf("%s: waiting for the reset", name))
	if b == nil && !a.json {
		if err := a.printf("Rebuild of projection %q requested; waiting for it to catch up with position %d...\n",
			name, target); err != nil {
			return nil, err
		}
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	warned := false
	where := "the reset has not happened yet"
	for {
		sts, err := a.projectionStatus(wctx, name)
		if err != nil && wctx.Err() == nil {
			b.abort()
			return nil, err
		}
		if err == nil {
			done, caughtUp, rebuilding, running := int64(0), true, false, false
			for _, s := range sts {
				rebuilding = rebuilding || s.Rebuilding
				running = running || s.State == projection.Running
				done += min(s.Position, target)
				caughtUp = caughtUp && s.Position >= target
				if !s.Rebuilding && s.State == projection.Failed {
					b.abort()
					return nil, fmt.Errorf("projection %q failed during the rebuild at position %d: %s", name,
						s.FailingPosition, s.LastError)
				}
			}
			total := target * int64(len(sts))
			switch {
			case rebuilding:
				where = "the reset has not happened yet"
				if !running && !warned {
					warned = true
					if b != nil {
						b.describe(fmt.Sprintf("%s: waiting for a process to run it", name))
					} else {
						a.warnf("no process is running projection %q (%s): the rebuild happens when it starts",
							name, states(sts))
					}
				}
			case caughtUp:
				b.finish()
				return sts, nil
			default:
				where = fmt.Sprintf("%d of %d positions replayed", done, total)
				b.describe(fmt.Sprintf("rebuilding %s", name))
				b.set(done, total)
			}
		}
		select {
		case <-wctx.Done():
			b.abort()
			if ctx.Err() == nil && errors.Is(wctx.Err(), context.DeadlineExceeded) {
				return nil, fmt.Errorf("gave up waiting for the rebuild of %q after %s (%s); the request stands",
					name, timeout, where)
			}
			return nil, fmt.Errorf("stopped waiting for the rebuild of %q (%s); the request stands: %w", name,
				where, ctx.Err())
		case <-t.C:
		}
	}
}

func (a *app) projectionParkedCommand() *cobra.Command {
	return group("parked", "List, replay and discard parked events",
		`Parked events are events a projection (in Park failure mode) gave up on after its attempts and moved past.
They stay parked until replayed (applied again by the process running the projection) or discarded.`,
		a.parkedListCommand(), a.parkedReplayCommand(), a.parkedDiscardCommand())
}

type parkedJSON struct {
	ID              int64     `json:"id"`
	Projection      string    `json:"projection"`
	Checkpoint      string    `json:"checkpoint"`
	Position        int64     `json:"position"`
	Tenant          string    `json:"tenant"`
	StreamID        string    `json:"stream_id"`
	StreamType      string    `json:"stream_type"`
	Version         int64     `json:"version"`
	EventID         string    `json:"event_id"`
	EventType       string    `json:"event_type"`
	Attempts        int       `json:"attempts"`
	LastError       string    `json:"last_error"`
	ParkedAt        time.Time `json:"parked_at"`
	ReplayRequested bool      `json:"replay_requested"`
}

func toParkedJSON(e projection.ParkedEvent) parkedJSON {
	return parkedJSON{ID: e.ID, Projection: e.Owner, Checkpoint: e.Checkpoint, Position: e.Position,
		Tenant: e.Tenant, StreamID: e.StreamID, StreamType: e.StreamType, Version: e.Version,
		EventID: e.EventID.String(), EventType: e.EventType, Attempts: e.Attempts, LastError: e.LastError,
		ParkedAt: e.ParkedAt.UTC(), ReplayRequested: e.ReplayRequested}
}

func (a *app) parkedListCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "list [NAME]",
		Short: "List parked events (of one projection, or of all)",
		Example: `  stagehand projection parked list
  stagehand projection parked list balances --json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			evs, err := projection.ListParked(ctx, pool, a.schema, name)
			if err != nil {
				return a.dbError(err)
			}
			if a.json {
				out := make([]parkedJSON, 0, len(evs))
				for _, e := range evs {
					out = append(out, toParkedJSON(e))
				}
				return a.writeJSON(struct {
					Schema string       `json:"schema"`
					Parked []parkedJSON `json:"parked"`
				}{a.schema, out})
			}
			if len(evs) == 0 {
				return a.printf("No parked events.\n")
			}
			rows := make([][]string, 0, len(evs))
			for _, e := range evs {
				replay := "-"
				if e.ReplayRequested {
					replay = "requested"
				}
				rows = append(rows, []string{fmt.Sprint(e.ID), e.Owner, fmt.Sprint(e.Position),
					fmt.Sprintf("%s/%s@%d", e.StreamType, e.StreamID, e.Version), displayTenant(e.Tenant),
					e.EventType, fmt.Sprint(e.Attempts), timestamp(e.ParkedAt), replay, truncate(e.LastError, 50)})
			}
			if err := a.table([]string{"ID", "PROJECTION", "POSITION", "STREAM", "TENANT", "EVENT TYPE",
				"ATTEMPTS", "PARKED AT", "REPLAY", "LAST ERROR"}, rows); err != nil {
				return err
			}
			return a.printf("\n%d parked event(s).\n", len(evs))
		},
	}
}

func parseParkedIDs(args []string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	for _, s := range args {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil || id <= 0 {
			return nil, usageErrorf("%q is not a parked event ID (a positive number, see 'projection parked list')",
				s)
		}
		ids = append(ids, id)
	}
	return slices.Compact(slices.Sorted(slices.Values(ids))), nil
}

// findParked returns the parked events with the given IDs, or an error naming the IDs that are not parked.
func (a *app) findParked(ctx context.Context, ids []int64, verb string) ([]projection.ParkedEvent, error) {
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	all, err := projection.ListParked(ctx, pool, a.schema, "")
	if err != nil {
		return nil, a.dbError(err)
	}
	byID := map[int64]projection.ParkedEvent{}
	for _, e := range all {
		byID[e.ID] = e
	}
	var found []projection.ParkedEvent
	var missing []string
	for _, id := range ids {
		e, ok := byID[id]
		if !ok {
			missing = append(missing, fmt.Sprint(id))
			continue
		}
		found = append(found, e)
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("no parked event with ID %s; nothing %s: %w", strings.Join(missing, ", "), verb,
			projection.ErrParkedNotFound)
	}
	return found, nil
}

type replayResultJSON struct {
	ID         int64  `json:"id"`
	Projection string `json:"projection"`
	// Outcome is "requested" (not waited for), "replayed", "failed" (still parked, with the new error) or
	// "pending" (not done when the wait ended).
	Outcome   string `json:"outcome"`
	LastError string `json:"last_error,omitempty"`
}

func (a *app) parkedReplayCommand() *cobra.Command {
	var (
		name    string
		wait    bool
		timeout time.Duration
		poll    time.Duration
	)
	c := &cobra.Command{
		Use:   "replay ID... | --projection NAME",
		Short: "Ask the running projection to apply parked events again",
		Long: `Mark parked events for replay; the process running their projection applies each again within its poll
interval: on success it is applied exactly once and leaves the parked list, on failure it stays parked with the
new error. Give IDs (see 'projection parked list'), or --projection NAME for all of that projection's parked events.
Every ID must be parked, or nothing is requested. With --wait the command waits for the outcome of each and exits
with status 1 when any failed again.`,
		Example: `  stagehand projection parked replay 12 13
  stagehand projection parked replay --projection balances --wait --json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case name != "" && len(args) > 0:
				return usageErrorf("give parked event IDs or --projection, not both")
			case name == "" && len(args) == 0:
				return usageErrorf("give at least one parked event ID, or --projection NAME")
			case poll < 10*time.Millisecond:
				return usageErrorf("--poll-interval must be at least 10ms")
			case timeout < 0:
				return usageErrorf("--timeout must not be negative")
			}
			ids, err := parseParkedIDs(args)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			var evs []projection.ParkedEvent
			if name != "" {
				if evs, err = projection.ListParked(ctx, pool, a.schema, name); err != nil {
					return a.dbError(err)
				}
			} else if evs, err = a.findParked(ctx, ids, "requested"); err != nil {
				return err
			}
			byProjection := map[string][]int64{}
			for _, e := range evs {
				byProjection[e.Owner] = append(byProjection[e.Owner], e.ID)
			}
			var requested int64
			for _, p := range slices.Sorted(maps.Keys(byProjection)) {
				n, err := projection.RequestReplay(ctx, pool, a.schema, p, byProjection[p]...)
				requested += n
				if err != nil {
					return a.dbError(err)
				}
			}
			results := make([]replayResultJSON, 0, len(evs))
			for _, e := range evs {
				results = append(results, replayResultJSON{ID: e.ID, Projection: e.Owner, Outcome: "requested"})
			}
			var waitErr error
			if wait && len(results) > 0 {
				waitErr = a.waitReplay(ctx, results, timeout, poll)
			}
			failed := 0
			for _, r := range results {
				if r.Outcome == "failed" {
					failed++
				}
			}
			if a.json {
				if err := a.writeJSON(struct {
					Schema    string             `json:"schema"`
					Requested int64              `json:"requested"`
					Results   []replayResultJSON `json:"results"`
				}{a.schema, requested, results}); err != nil {
					return err
				}
			} else if err := a.printReplay(requested, results, wait); err != nil {
				return err
			}
			if waitErr != nil {
				return waitErr
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d replayed event(s) failed again and stay parked", failed, len(results))
			}
			return nil
		},
	}
	c.Flags().StringVar(&name, "projection", "", "replay every parked event of this projection")
	c.Flags().BoolVar(&wait, "wait", false, "wait for the outcome of each replay")
	c.Flags().DurationVar(&timeout, "timeout", 0, "with --wait: give up waiting after this long (0: never)")
	c.Flags().DurationVar(&poll, "poll-interval", 200*time.Millisecond, "with --wait: how often to look")
	return c
}

func (a *app) printReplay(requested int64, results []replayResultJSON, waited bool) error {
	if !waited {
		return a.printf("Requested replay of %d parked event(s); the process running each projection replays "+
			"them within its poll interval.\n", requested)
	}
	rows := make([][]string, 0, len(results))
	for _, r := range results {
		rows = append(rows, []string{fmt.Sprint(r.ID), r.Projection, r.Outcome, orDash(truncate(r.LastError, 60))})
	}
	return a.table([]string{"ID", "PROJECTION", "OUTCOME", "LAST ERROR"}, rows)
}

// waitReplay waits until no event of results is still marked for replay and records each outcome.
func (a *app) waitReplay(ctx context.Context, results []replayResultJSON, timeout, poll time.Duration) error {
	wctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	pool, err := a.connect(ctx)
	if err != nil {
		return err
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		all, err := projection.ListParked(wctx, pool, a.schema, "")
		if err != nil && wctx.Err() == nil {
			return a.dbError(err)
		}
		if err == nil {
			byID := map[int64]projection.ParkedEvent{}
			for _, e := range all {
				byID[e.ID] = e
			}
			pending := 0
			for i := range results {
				e, parked := byID[results[i].ID]
				switch {
				case !parked:
					results[i].Outcome, results[i].LastError = "replayed", ""
				case e.ReplayRequested:
					results[i].Outcome = "pending"
					pending++
				default:
					results[i].Outcome, results[i].LastError = "failed", e.LastError
				}
			}
			if pending == 0 {
				return nil
			}
		}
		select {
		case <-wctx.Done():
			if ctx.Err() == nil {
				return fmt.Errorf("gave up waiting for the replays after %s; the requests stand", timeout)
			}
			return fmt.Errorf("stopped waiting for the replays; the requests stand: %w", ctx.Err())
		case <-t.C:
		}
	}
}

func (a *app) parkedDiscardCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "discard ID...",
		Short: "Delete parked events without applying them",
		Long: `Delete parked events for good: the projection never applies them. This is an operator's decision, and
the only way a projection skips an event. Every ID must be parked, or nothing is discarded.`,
		Example: `  stagehand projection parked discard 12`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := parseParkedIDs(args)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			evs, err := a.findParked(ctx, ids, "discarded")
			if err != nil {
				return err
			}
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			n := 0
			for _, e := range evs {
				if err := projection.DiscardParked(ctx, pool, a.schema, e.ID); err != nil {
					return fmt.Errorf("discarded %d of %d: %w", n, len(evs), a.dbError(err))
				}
				n++
			}
			if a.json {
				return a.writeJSON(struct {
					Schema    string  `json:"schema"`
					Discarded int     `json:"discarded"`
					IDs       []int64 `json:"ids"`
				}{a.schema, n, ids})
			}
			return a.printf("Discarded %d parked event(s).\n", n)
		},
	}
}
