package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/stagehand-es/stagehand/outbox"
)

type maintenanceJSON struct {
	Schema                  string     `json:"schema"`
	Ran                     bool       `json:"ran"`
	Owner                   string     `json:"owner,omitempty"`
	IntervalSeconds         float64    `json:"interval_seconds,omitempty"`
	StartedAt               *time.Time `json:"started_at,omitempty"`
	FinishedAt              *time.Time `json:"finished_at,omitempty"`
	Overdue                 bool       `json:"overdue"`
	LastError               string     `json:"last_error,omitempty"`
	SentRemoved             int64      `json:"sent_removed"`
	InboxRemoved            int64      `json:"inbox_removed"`
	InboxAttemptsRemoved    int64      `json:"inbox_attempts_removed"`
	DeadLettersExpired      int64      `json:"dead_letters_expired"`
	InboxDeadLettersExpired int64      `json:"inbox_dead_letters_expired"`
	Passes                  int64      `json:"passes"`
}

func (a *app) outboxMaintenanceCommand() *cobra.Command {
	var run bool
	c := &cobra.Command{
		Use:   "maintenance [--run]",
		Short: "Show the latest routine maintenance pass, or run one now",
		Long: `Routine maintenance applies retention to the sent ledger, the inbox, stale inbox failure counts and old
dead letters (never a dead letter holding its key, never a ledger entry a watermark still needs). Every relay runs
it by default, one active instance across processes. This shows the latest pass of any process: who ran it, when,
what it removed and its error; "overdue" means no pass started within three of its intervals. --run runs one pass
now with the library's default retentions (7 days for the ledger and the inbox, 30 days for dead letters) and
prints what it removed. Maintenance is estate-wide: it serves every tenant.`,
		Example: `  stagehand outbox maintenance
  stagehand outbox maintenance --run --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			o, err := a.outbox(ctx)
			if err != nil {
				return err
			}
			if run {
				m, err := o.NewMaintainer(nil)
				if err != nil {
					return err
				}
				sp := a.newSpinner("running a maintenance pass")
				_, err = m.RunOnce(ctx)
				sp.stop()
				if err != nil {
					return a.dbError(err)
				}
			}
			st, ran, err := o.AllTenants().Maintenance(ctx)
			if err != nil {
				return a.dbError(err)
			}
			now := time.Now().UTC()
			if a.json {
				j := maintenanceJSON{Schema: a.schema, Ran: ran}
				if ran {
					j.Owner, j.IntervalSeconds, j.Overdue, j.LastError = st.Owner, seconds(st.Interval),
						st.Overdue(now), st.LastError
					j.StartedAt = &st.StartedAt
					if !st.FinishedAt.IsZero() {
						j.FinishedAt = &st.FinishedAt
					}
					r := st.Removed
					j.SentRemoved, j.InboxRemoved, j.InboxAttemptsRemoved = r.SentRemoved, r.InboxRemoved,
						r.InboxAttemptsRemoved
					j.DeadLettersExpired, j.InboxDeadLettersExpired, j.Passes = r.DeadLettersExpired,
						r.InboxDeadLettersExpired, st.Passes
				}
				return a.writeJSON(j)
			}
			if !ran {
				return a.printf("Outbox of schema %q: no maintenance pass has run yet (relays run one when they "+
					"start, unless maintenance is disabled).\n", a.schema)
			}
			if err := a.printf("Latest maintenance pass of schema %q\n", a.schema); err != nil {
				return err
			}
			return a.keyValues(maintenanceRows(st, now))
		},
	}
	c.Flags().BoolVar(&run, "run", false, "run one pass now with the default retentions, then show it")
	return c
}

func maintenanceRows(st outbox.MaintenanceStatus, now time.Time) [][2]string {
	finished := "not finished (running, or its process died)"
	if !st.FinishedAt.IsZero() {
		finished = timestamp(st.FinishedAt)
	}
	state := "ok"
	switch {
	case st.Overdue(now):
		state = fmt.Sprintf("OVERDUE: no pass for %s (expected every %s)", human(now.Sub(st.StartedAt)),
			human(st.Interval))
	case st.LastError != "":
		state = "FAILED: " + st.LastError
	}
	r := st.Removed
	return [][2]string{
		{"state", state},
		{"run by", st.Owner},
		{"started", timestamp(st.StartedAt)},
		{"finished", finished},
		{"interval", human(st.Interval)},
		{"sent-ledger entries removed", fmt.Sprint(r.SentRemoved)},
		{"inbox entries removed", fmt.Sprint(r.InboxRemoved)},
		{"inbox failure counts removed", fmt.Sprint(r.InboxAttemptsRemoved)},
		{"outbox dead letters expired", fmt.Sprint(r.DeadLettersExpired)},
		{"inbox dead letters expired", fmt.Sprint(r.InboxDeadLettersExpired)},
		{"passes so far", fmt.Sprint(st.Passes)},
	}
}
