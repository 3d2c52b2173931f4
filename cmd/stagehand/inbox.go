package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/stagehand-es/stagehand/outbox"
)

func (a *app) inboxCommand() *cobra.Command {
	return group("inbox", "Inbox statistics, dead letters and cleanup",
		`Report on and clean up the inbox that makes Watermill handlers idempotent. Every subcommand acts on all
tenants (estate-wide) unless --tenant names one; the output says which.`,
		a.inboxStatsCommand(), a.inboxDeadCommand(), a.inboxCleanupCommand())
}

type inboxStatsJSON struct {
	Schema string `json:"schema"`
	scopeJSON
	Handled               int64   `json:"handled"`
	OldestEntryAgeSeconds float64 `json:"oldest_entry_age_seconds"`
	Failing               int64   `json:"failing"`
	DeadLettered          int64   `json:"dead_lettered"`
}

func (a *app) inboxStatsCommand() *cobra.Command {
	var scope tenantScope
	c := &cobra.Command{
		Use:   "stats",
		Short: "Show handled, failing and dead-lettered counts",
		Long: `Show the inbox at one instant: remembered (message, handler) pairs and the age of the oldest (far beyond
your cleanup retention means cleanup is not running), pairs that are failing, and inbox dead letters.`,
		Example: `  stagehand inbox stats
  stagehand inbox stats --tenant acme --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			scope.resolve(cmd)
			ctx := cmd.Context()
			o, err := a.outbox(ctx)
			if err != nil {
				return err
			}
			st, err := scope.admin(o).InboxStats(ctx)
			if err != nil {
				return a.dbError(err)
			}
			if a.json {
				return a.writeJSON(inboxStatsJSON{a.schema, scope.json(), st.Handled, seconds(st.OldestEntryAge),
					st.Failing, st.DeadLettered})
			}
			if err := a.printf("Inbox of schema %q, %s\n", a.schema, scope.label()); err != nil {
				return err
			}
			return a.keyValues([][2]string{
				{"handled", fmt.Sprint(st.Handled)},
				{"oldest entry age", human(st.OldestEntryAge)},
				{"failing", fmt.Sprint(st.Failing)},
				{"dead-lettered", fmt.Sprint(st.DeadLettered)},
			})
		},
	}
	addTenantScope(c, &scope, "count")
	return c
}

func (a *app) inboxCleanupCommand() *cobra.Command {
	var (
		scope     tenantScope
		olderThan string
		batchSize int
	)
	c := &cobra.Command{
		Use:   "cleanup --older-than AGE",
		Short: "Delete inbox entries older than AGE, in batches",
		Long: `Delete inbox entries recorded more than AGE ago, in batches of --batch-size until none is left. Keep AGE
longer than anything may redeliver a message (relay retries, broker redelivery, a redrive days later): a duplicate
that arrives after its entry is gone is handled again. The library's default retention is 7 days.`,
		Example: `  stagehand inbox cleanup --older-than 7d
  stagehand inbox cleanup --older-than 14d --tenant acme --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			scope.resolve(cmd)
			age, err := requiredAge(cmd, "older-than", olderThan)
			if err != nil {
				return err
			}
			if age == 0 {
				return usageErrorf("--older-than must be positive: an inbox entry younger than any redelivery " +
					"must stay")
			}
			if batchSize < 1 || batchSize > 100000 {
				return usageErrorf("--batch-size must be between 1 and 100000")
			}
			if age < outbox.DefaultInboxRetention {
				a.warnf("--older-than %s is shorter than the default inbox retention (%s): a message redelivered "+
					"after its entry is deleted is handled again", olderThan, human(outbox.DefaultInboxRetention))
			}
			ctx := cmd.Context()
			o, err := a.outbox(ctx)
			if err != nil {
				return err
			}
			cutoff := time.Now().UTC().Add(-age)
			sp := a.newSpinner(fmt.Sprintf("deleting inbox entries older than %s, %s", olderThan, scope.label()))
			n, err := scope.admin(o).CleanupInbox(ctx, age, batchSize)
			sp.stop()
			if err != nil {
				return fmt.Errorf("inbox cleanup stopped after deleting %d entries: %w", n, a.dbError(err))
			}
			if a.json {
				return a.writeJSON(cleanupJSON{a.schema, scope.json(), seconds(age), cutoff, n})
			}
			return a.printf("Deleted %d inbox entries older than %s (before %s), %s.\n", n, olderThan,
				timestamp(cutoff), scope.label())
		},
	}
	addTenantScope(c, &scope, "clean up")
	c.Flags().StringVar(&olderThan, "older-than", "", "delete entries older than this age: 7d, 36h (required)")
	c.Flags().IntVar(&batchSize, "batch-size", 1000, "rows deleted per statement")
	return c
}
