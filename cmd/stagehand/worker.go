package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/stagehand-es/stagehand/staging"
)

func (a *app) workerCommand() *cobra.Command {
	return group("worker", "Staging worker status and parked events",
		`Show the status of every Deferred stager and reconciler (read from the database, whichever process runs
it), and list, replay or discard the events a worker in Park failure mode parked. A replay is performed by the
process running the worker; the CLI records the request.`,
		a.workerStatusCommand(), a.workerParkedCommand(), a.workerReplayCommand(), a.workerDiscardCommand())
}

type workerStatusJSON struct {
	Name            string     `json:"name"`
	Kind            string     `json:"kind"`
	State           string     `json:"state"`
	Position        int64      `json:"position"`
	Head            int64      `json:"head"`
	Lag             int64      `json:"lag"`
	TimeLagSeconds  float64    `json:"time_lag_seconds"`
	Parked          int        `json:"parked"`
	LastError       string     `json:"last_error,omitempty"`
	LastErrorAt     *time.Time `json:"last_error_at,omitempty"`
	FailingPosition int64      `json:"failing_position,omitempty"`
	Attempts        int        `json:"attempts,omitempty"`
	Owner           string     `json:"owner,omitempty"`
	UpdatedAt       time.Time  `json:"updated_at"`
}

func (a *app) workerStatusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show every staging worker's state, position, lag, parked events and errors",
		Example: `  stagehand worker status
  stagehand worker status --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			store, err := a.eventStore(ctx)
			if err != nil {
				return err
			}
			sts, err := staging.ListWorkerStatus(ctx, store.Pool(), store, a.schema)
			if err != nil {
				return a.dbError(err)
			}
			if a.json {
				out := make([]workerStatusJSON, 0, len(sts))
				for _, s := range sts {
					out = append(out, workerStatusJSON{Name: s.Name, Kind: s.Kind, State: string(s.State),
						Position: s.Position, Head: s.Head, Lag: s.Lag, TimeLagSeconds: seconds(s.TimeLag),
						Parked: s.Parked, LastError: s.LastError, LastErrorAt: optionalTime(s.LastErrorAt),
						FailingPosition: s.FailingPosition, Attempts: s.Attempts, Owner: s.Owner,
						UpdatedAt: s.UpdatedAt.UTC()})
				}
				return a.writeJSON(struct {
					Schema  string             `json:"schema"`
					Workers []workerStatusJSON `json:"workers"`
				}{a.schema, out})
			}
			if len(sts) == 0 {
				return a.printf("No staging worker has run in schema %q.\n", a.schema)
			}
			rows := make([][]string, 0, len(sts))
			for _, s := range sts {
				failing := "-"
				if s.FailingPosition > 0 {
					failing = fmt.Sprintf("%d (%d attempts)", s.FailingPosition, s.Attempts)
				}
				rows = append(rows, []string{s.Name, string(s.State), fmt.Sprint(s.Position), fmt.Sprint(s.Head),
					fmt.Sprint(s.Lag), s.TimeLag.Round(time.Millisecond).String(), fmt.Sprint(s.Parked), failing,
					truncate(s.LastError, 50)})
			}
			return a.table([]string{"WORKER", "STATE", "POSITION", "HEAD", "LAG", "TIME LAG", "PARKED", "FAILING",
				"LAST ERROR"}, rows)
		},
	}
}

func (a *app) workerParkedCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "parked [WORKER]",
		Short: "List parked events (of one worker, e.g. stager:default, or of all)",
		Example: `  stagehand worker parked
  stagehand worker parked stager:orders --json`,
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
			evs, err := staging.ListParked(ctx, pool, a.schema, name)
			if err != nil {
				return a.dbError(err)
			}
			if a.json {
				out := make([]parkedJSON, 0, len(evs))
				for _, e := range evs {
					out = append(out, parkedJSON{ID: e.ID, Projection: e.Owner, Checkpoint: e.Owner,
						Position: e.Position, Tenant: e.Tenant, StreamID: e.StreamID, StreamType: e.StreamType,
						Version: e.Version, EventID: e.EventID.String(), EventType: e.EventType,
						Attempts: e.Attempts, LastError: e.LastError, ParkedAt: e.ParkedAt.UTC(),
						ReplayRequested: e.ReplayRequested})
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
				rows = append(rows, []string{fmt.Sprint(e.ID), e.Owner, fmt.Sprint(e.Position),
					fmt.Sprintf("%s/%s@%d", e.StreamType, e.StreamID, e.Version), displayTenant(e.Tenant),
					e.EventType, fmt.Sprint(e.Attempts), timestamp(e.ParkedAt), truncate(e.LastError, 50)})
			}
			return a.table([]string{"ID", "WORKER", "POSITION", "STREAM", "TENANT", "EVENT TYPE", "ATTEMPTS",
				"PARKED AT", "LAST ERROR"}, rows)
		},
	}
}

func (a *app) workerReplayCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "replay WORKER [ID...]",
		Short: "Ask the running worker to stage parked events again (all of the worker's when no ID is given)",
		Example: `  stagehand worker replay stager:orders 12 13
  stagehand worker replay reconciler:default`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := parseParkedIDs(args[1:])
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			n, err := staging.RequestReplay(ctx, pool, a.schema, args[0], ids...)
			if err != nil {
				return a.dbError(err)
			}
			if a.json {
				return a.writeJSON(struct {
					Worker    string `json:"worker"`
					Requested int64  `json:"requested"`
				}{args[0], n})
			}
			return a.printf("Replay requested for %d parked event(s) of %s.\n", n, args[0])
		},
	}
}

func (a *app) workerDiscardCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "discard ID...",
		Short:   "Delete parked events without staging them",
		Example: `  stagehand worker discard 12`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := parseParkedIDs(args)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			for _, id := range ids {
				if err := staging.DiscardParked(ctx, pool, a.schema, id); err != nil {
					return a.dbError(err)
				}
			}
			return a.printf("Discarded %d parked event(s).\n", len(ids))
		},
	}
}
