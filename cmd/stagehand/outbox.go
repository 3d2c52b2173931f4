package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/stagehand-es/stagehand/outbox"
)

func (a *app) outboxCommand() *cobra.Command {
	return group("outbox", "Outbox statistics, dead letters and cleanup",
		`Report on and repair the transactional outbox. Every subcommand acts on all tenants (estate-wide) unless
--tenant names one; the output says which.`,
		a.outboxStatsCommand(), a.outboxDeadCommand(), a.outboxCleanupCommand(), a.outboxMaintenanceCommand())
}

type outboxStatsJSON struct {
	Schema string `json:"schema"`
	scopeJSON
	Pending                 int64   `json:"pending"`
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	Scheduled               int64   `json:"scheduled"`
	BackingOff              int64   `json:"backing_off"`
	Parked                  int64   `json:"parked"`
	WaitingBehindPending    int64   `json:"waiting_behind_pending"`
	HeldByDeadLetter        int64   `json:"held_by_dead_letter"`
	InFlight                int64   `json:"in_flight"`
	DeadLettered            int64   `json:"dead_lettered"`
	Sent                    int64   `json:"sent"`
}

func (a *app) outboxStatsCommand() *cobra.Command {
	var scope tenantScope
	c := &cobra.Command{
		Use:   "stats",
		Short: "Show pending, scheduled, dead-lettered and sent counts",
		Long: `Show the outbox at one instant: messages pending (and how long the oldest has been due), scheduled,
backing off after a rejection, parked behind an earlier message of their key (apart: waiting behind a pending
message, which go out in turn, and held by a dead letter, which wait for it to be redriven or discarded), in
flight, dead-lettered, and the sent ledger not yet cleaned up. An oldest pending age that keeps growing while
relays run means a stall. In JSON, parked is waiting_behind_pending + held_by_dead_letter.`,
		Example: `  stagehand outbox stats
  stagehand outbox stats --tenant acme --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			scope.resolve(cmd)
			ctx := cmd.Context()
			o, err := a.outbox(ctx)
			if err != nil {
				return err
			}
			st, err := scope.admin(o).Stats(ctx)
			if err != nil {
				return a.dbError(err)
			}
			if a.json {
				return a.writeJSON(outboxStatsJSON{Schema: a.schema, scopeJSON: scope.json(), Pending: st.Pending,
					OldestPendingAgeSeconds: seconds(st.OldestPendingAge), Scheduled: st.Scheduled,
					BackingOff: st.BackingOff, Parked: st.Parked, WaitingBehindPending: st.WaitingBehindPending,
					HeldByDeadLetter: st.HeldByDeadLetter, InFlight: st.InFlight,
					DeadLettered: st.DeadLettered, Sent: st.Sent})
			}
			if err := a.printf("Outbox of schema %q, %s\n", a.schema, scope.label()); err != nil {
				return err
			}
			return a.keyValues([][2]string{
				{"pending", fmt.Sprint(st.Pending)},
				{"oldest pending age", human(st.OldestPendingAge)},
				{"scheduled", fmt.Sprint(st.Scheduled)},
				{"backing off", fmt.Sprint(st.BackingOff)},
				{"waiting behind a pending message of their key", fmt.Sprint(st.WaitingBehindPending)},
				{"held by a dead letter of their key", fmt.Sprint(st.HeldByDeadLetter)},
				{"in flight", fmt.Sprint(st.InFlight)},
				{"dead-lettered", fmt.Sprint(st.DeadLettered)},
				{"sent (ledger)", fmt.Sprint(st.Sent)},
			})
		},
	}
	addTenantScope(c, &scope, "count")
	return c
}

func (a *app) outboxDeadCommand() *cobra.Command {
	return group("dead", "List, show, redrive and discard dead letters",
		`Dead letters are messages whose retries were used up. A dead letter holds its partition key (later
messages of the key wait) until it is redriven or discarded, unless the relay releases keys.`,
		a.deadListCommand(), a.deadShowCommand(), a.deadRedriveCommand(), a.deadDiscardCommand())
}

// deadLetterJSON is a dead letter in JSON output; Payload and Metadata only in "show".
type deadLetterJSON struct {
	ID             string            `json:"id"`
	Topic          string            `json:"topic"`
	Tenant         string            `json:"tenant"`
	Type           string            `json:"type,omitempty"`
	PartitionKey   string            `json:"partition_key,omitempty"`
	Sequence       int64             `json:"sequence,omitempty"`
	HoldsKey       bool              `json:"holds_key"`
	Attempts       int               `json:"attempts"`
	LastError      string            `json:"last_error"`
	CreatedAt      time.Time         `json:"created_at"`
	DeadAt         time.Time         `json:"dead_at"`
	CorrelationID  string            `json:"correlation_id,omitempty"`
	CausationID    string            `json:"causation_id,omitempty"`
	SourcePosition int64             `json:"source_position,omitempty"`
	ScheduledAt    *time.Time        `json:"scheduled_at,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	*payloadJSON
}

func deadJSON(dl outbox.DeadLetter, full bool) deadLetterJSON {
	j := deadLetterJSON{ID: dl.ID, Topic: dl.Topic, Tenant: dl.Tenant, Type: dl.Type, PartitionKey: dl.PartitionKey,
		Sequence: dl.Sequence, HoldsKey: dl.HoldsKey, Attempts: dl.Attempts, LastError: dl.LastError,
		CreatedAt: dl.CreatedAt.UTC(), DeadAt: dl.DeadAt.UTC(), CorrelationID: dl.CorrelationID,
		CausationID: dl.CausationID, SourcePosition: dl.SourcePosition}
	if !dl.ScheduledAt.IsZero() {
		at := dl.ScheduledAt.UTC()
		j.ScheduledAt = &at
	}
	if full {
		j.Metadata = dl.Metadata
		p := encodePayload(dl.Payload)
		j.payloadJSON = &p
	}
	return j
}

// listDead pages through the dead letters of admin (limit 0: all of them).
func listDead(ctx context.Context, admin *outbox.Admin, topic string, limit int) ([]outbox.DeadLetter, error) {
	return pageAll(limit, func(page int, after *outbox.DeadLetter) ([]outbox.DeadLetter, error) {
		return admin.DeadLetters(ctx, outbox.ListOptions{Limit: page, Topic: topic, After: after})
	})
}

// pageAll reads a keyset-paginated list page by page (at most 500 rows a page), each page after the previous one's
// last row, until a short page or limit rows (limit 0: all of them).
func pageAll[T any](limit int, fetch func(page int, after *T) ([]T, error)) ([]T, error) {
	var out []T
	var after *T
	for {
		page := 500
		if limit > 0 {
			page = min(page, limit-len(out))
		}
		rows, err := fetch(page, after)
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
		if len(rows) < page || (limit > 0 && len(out) >= limit) {
			return out, nil
		}
		after = &out[len(out)-1]
	}
}

func (a *app) deadListCommand() *cobra.Command {
	var (
		scope tenantScope
		topic string
		limit int
	)
	c := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, oldest first",
		Example: `  stagehand outbox dead list
  stagehand outbox dead list --topic orders --limit 20 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			scope.resolve(cmd)
			if limit < 0 {
				return usageErrorf("--limit must not be negative")
			}
			ctx := cmd.Context()
			o, err := a.outbox(ctx)
			if err != nil {
				return err
			}
			dls, err := listDead(ctx, scope.admin(o), topic, limit)
			if err != nil {
				return a.dbError(err)
			}
			if a.json {
				out := make([]deadLetterJSON, 0, len(dls))
				for _, dl := range dls {
					out = append(out, deadJSON(dl, false))
				}
				return a.writeJSON(struct {
					Schema string `json:"schema"`
					scopeJSON
					DeadLetters []deadLetterJSON `json:"dead_letters"`
				}{a.schema, scope.json(), out})
			}
			if len(dls) == 0 {
				return a.printf("No dead letters (%s).\n", scope.label())
			}
			rows := make([][]string, 0, len(dls))
			for _, dl := range dls {
				holds := "no"
				if dl.HoldsKey {
					holds = "yes"
				}
				rows = append(rows, []string{dl.ID, dl.Topic, displayTenant(dl.Tenant), orDash(dl.PartitionKey),
					holds, strconv.Itoa(dl.Attempts), timestamp(dl.DeadAt), truncate(dl.LastError, 60)})
			}
			if err := a.table([]string{"ID", "TOPIC", "TENANT", "KEY", "HOLDS KEY", "ATTEMPTS", "DEAD AT",
				"LAST ERROR"}, rows); err != nil {
				return err
			}
			if limit > 0 && len(dls) == limit {
				return a.printf("\nThe oldest %d dead letters, %s (--limit 0 shows all).\n", len(dls), scope.label())
			}
			return a.printf("\n%d dead letter(s), %s.\n", len(dls), scope.label())
		},
	}
	addTenantScope(c, &scope, "list")
	c.Flags().StringVar(&topic, "topic", "", "only dead letters of this topic")
	c.Flags().IntVar(&limit, "limit", 100, "show at most this many (0: all)")
	return c
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (a *app) deadShowCommand() *cobra.Command {
	var (
		scope tenantScope
		topic string
	)
	c := &cobra.Command{
		Use:   "show ID",
		Short: "Show one dead letter with its payload, metadata and last error",
		Long: `Show the dead letter with message ID ID. A message staged for several topics can be dead-lettered once
per topic: the oldest is shown unless --topic picks one, and the others are named.`,
		Example: `  stagehand outbox dead show 0192f1c4-7d3e-7a10-9c55-2f1e9b7c1a20
  stagehand outbox dead show order-42 --topic orders --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			scope.resolve(cmd)
			ctx := cmd.Context()
			o, err := a.outbox(ctx)
			if err != nil {
				return err
			}
			dls, err := scope.admin(o).DeadLetters(ctx, outbox.ListOptions{ID: args[0], Topic: topic, Limit: 1000})
			if err != nil {
				return a.dbError(err)
			}
			if len(dls) == 0 {
				return fmt.Errorf("no dead letter with ID %q (%s): %w", args[0], scope.label(), outbox.ErrNotFound)
			}
			dl := dls[0]
			var others []string
			for _, d := range dls[1:] {
				others = append(others, d.Topic)
			}
			if a.json {
				return a.writeJSON(struct {
					deadLetterJSON
					OtherTopics []string `json:"other_topics,omitempty"`
				}{deadJSON(dl, true), others})
			}
			holds := "no"
			if dl.HoldsKey {
				holds = "yes: later messages of the key wait until it is redriven or discarded"
			}
			pairs := [][2]string{
				{"id", dl.ID}, {"topic", dl.Topic}, {"tenant", displayTenant(dl.Tenant)}, {"type", orDash(dl.Type)},
				{"partition key", orDash(dl.PartitionKey)}, {"sequence", fmt.Sprint(dl.Sequence)},
				{"holds key", holds}, {"attempts", fmt.Sprint(dl.Attempts)}, {"created at", timestamp(dl.CreatedAt)},
				{"dead at", timestamp(dl.DeadAt)}, {"correlation id", orDash(dl.CorrelationID)},
				{"causation id", orDash(dl.CausationID)},
			}
			if dl.SourcePosition != 0 {
				pairs = append(pairs, [2]string{"source position", fmt.Sprint(dl.SourcePosition)})
			}
			if !dl.ScheduledAt.IsZero() {
				pairs = append(pairs, [2]string{"scheduled at", timestamp(dl.ScheduledAt)})
			}
			keys := make([]string, 0, len(dl.Metadata))
			for k := range dl.Metadata {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				pairs = append(pairs, [2]string{"metadata " + k, dl.Metadata[k]})
			}
			pairs = append(pairs, [2]string{"last error", oneLineText(dl.LastError)},
				[2]string{"payload", payloadText(dl.Payload)})
			if len(others) > 0 {
				pairs = append(pairs, [2]string{"also dead-lettered for", strings.Join(others, ", ")})
			}
			return a.keyValues(pairs)
		},
	}
	addTenantScope(c, &scope, "look in")
	c.Flags().StringVar(&topic, "topic", "", "the topic, when the message was staged for several")
	return c
}

func oneLineText(s string) string { return strings.Join(strings.Fields(s), " ") }

// checkDeadIDs returns an error naming the IDs that have no dead letter in the scope.
// unknownIDs returns the IDs an *outbox.UnknownIDsError names, or err itself when it is another error.
func unknownIDs(err error) ([]string, error) {
	var u *outbox.UnknownIDsError
	if errors.As(err, &u) {
		return u.IDs, nil
	}
	return nil, err
}

// unknownError is the failure of a redrive or discard that acted on the known IDs and found no dead letter for
// the others.
func unknownError(ids []string, scope *tenantScope, verb string) error {
	return fmt.Errorf("no dead letter with ID %s (%s); the others were %s: %w", strings.Join(ids, ", "),
		scope.label(), verb, outbox.ErrNotFound)
}

type moveJSON struct {
	Schema string `json:"schema"`
	scopeJSON
	IDs   []string `json:"ids"`
	Count int      `json:"count"`
	// Unknown are the requested IDs without a dead letter in the scope (the command then exits non-zero).
	Unknown []string `json:"unknown"`
}

func (a *app) deadRedriveCommand() *cobra.Command {
	var (
		scope tenantScope
		all   bool
		topic string
	)
	c := &cobra.Command{
		Use:   "redrive ID... | --all",
		Short: "Move dead letters back into the outbox for delivery",
		Long: `Move the dead letters with the given message IDs (for every topic they were staged for) back into the
outbox, due now with a fresh attempt count; the messages their keys were holding follow them in order. IDs
without a dead letter in the scope are listed and make the command fail; the others are redriven. --all redrives
every dead letter of the scope (of --topic when given; a message ID dead-lettered on several topics is redriven on
all of them).`,
		Example: `  stagehand outbox dead redrive order-41 order-42
  stagehand outbox dead redrive --all --topic orders --tenant acme`,
		RunE: func(cmd *cobra.Command, args []string) error {
			scope.resolve(cmd)
			switch {
			case all && len(args) > 0:
				return usageErrorf("give message IDs or --all, not both")
			case !all && len(args) == 0:
				return usageErrorf("give at least one message ID, or --all")
			case !all && topic != "":
				return usageErrorf("--topic only applies with --all")
			}
			ctx := cmd.Context()
			o, err := a.outbox(ctx)
			if err != nil {
				return err
			}
			admin := scope.admin(o)
			ids := slices.Compact(slices.Sorted(slices.Values(args)))
			if all {
				dls, err := listDead(ctx, admin, topic, 0)
				if err != nil {
					return a.dbError(err)
				}
				ids = ids[:0]
				for _, dl := range dls {
					ids = append(ids, dl.ID)
				}
				ids = slices.Compact(slices.Sorted(slices.Values(ids)))
			}
			n, unknown := 0, []string{}
			for chunk := range slices.Chunk(ids, 500) {
				m, err := admin.Redrive(ctx, chunk...)
				n += m
				u, err := unknownIDs(err)
				if err != nil {
					return fmt.Errorf("redrive (after %d moved): %w", n, a.dbError(err))
				}
				if !all { // with --all, an ID gone since the listing was redriven or discarded meanwhile
					unknown = append(unknown, u...)
				}
			}
			if ids == nil {
				ids = []string{}
			}
			if a.json {
				err = a.writeJSON(moveJSON{a.schema, scope.json(), ids, n, unknown})
			} else {
				err = a.printf("Redrove %d dead letter(s) into the outbox (%s).\n", n, scope.label())
			}
			if err == nil && len(unknown) > 0 {
				err = unknownError(unknown, &scope, "redriven")
			}
			return err
		},
	}
	addTenantScope(c, &scope, "redrive")
	c.Flags().BoolVar(&all, "all", false, "redrive every dead letter of the scope")
	c.Flags().StringVar(&topic, "topic", "", "with --all: only dead letters of this topic")
	return c
}

func (a *app) deadDiscardCommand() *cobra.Command {
	var scope tenantScope
	c := &cobra.Command{
		Use:   "discard ID...",
		Short: "Delete dead letters for good and release the keys they held",
		Long: `Delete the dead letters with the given message IDs (for every topic) without publishing them, and
release the keys they held. Their IDs stay in the sent ledger (outcome "discarded") until cleanup, so staging them
again publishes nothing. IDs without a dead letter in the scope are listed and make the command fail; the others
are discarded.`,
		Example: `  stagehand outbox dead discard order-41
  stagehand outbox dead discard order-41 order-42 --tenant acme --json`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			scope.resolve(cmd)
			ctx := cmd.Context()
			o, err := a.outbox(ctx)
			if err != nil {
				return err
			}
			admin := scope.admin(o)
			ids := slices.Compact(slices.Sorted(slices.Values(args)))
			n, err := admin.Discard(ctx, ids...)
			unknown, err := unknownIDs(err)
			if err != nil {
				return a.dbError(err)
			}
			if unknown == nil {
				unknown = []string{}
			}
			if a.json {
				err = a.writeJSON(moveJSON{a.schema, scope.json(), ids, n, unknown})
			} else {
				err = a.printf("Discarded %d dead letter(s) (%s).\n", n, scope.label())
			}
			if err == nil && len(unknown) > 0 {
				err = unknownError(unknown, &scope, "discarded")
			}
			return err
		},
	}
	addTenantScope(c, &scope, "discard")
	return c
}

type cleanupJSON struct {
	Schema string `json:"schema"`
	scopeJSON
	OlderThanSeconds float64   `json:"older_than_seconds"`
	Cutoff           time.Time `json:"cutoff"`
	Deleted          int64     `json:"deleted"`
}

func (a *app) outboxCleanupCommand() *cobra.Command {
	var (
		scope     tenantScope
		olderThan string
		batchSize int
	)
	c := &cobra.Command{
		Use:   "cleanup --older-than AGE",
		Short: "Delete sent-ledger entries older than AGE, in batches",
		Long: `Delete entries of the sent ledger (published or discarded messages) recorded more than AGE ago, in
batches of --batch-size until none is left. Entries at or above the lowest registered watermark are kept whatever
their age, so a component that re-stages from the event log cannot publish them twice. Pending and dead-lettered
messages are never touched. Relays run routine maintenance with a 7-day retention by default (see "stagehand
outbox maintenance"); this command cleans up at once, or with another age.`,
		Example: `  stagehand outbox cleanup --older-than 7d
  stagehand outbox cleanup --older-than 36h --batch-size 5000 --tenant acme --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			scope.resolve(cmd)
			age, err := requiredAge(cmd, "older-than", olderThan)
			if err != nil {
				return err
			}
			if batchSize < 1 || batchSize > 100000 {
				return usageErrorf("--batch-size must be between 1 and 100000")
			}
			ctx := cmd.Context()
			o, err := a.outbox(ctx)
			if err != nil {
				return err
			}
			cutoff := time.Now().UTC().Add(-age)
			sp := a.newSpinner(fmt.Sprintf("deleting sent entries older than %s, %s", olderThan, scope.label()))
			n, err := scope.admin(o).CleanupSent(ctx, age, batchSize)
			sp.stop()
			if err != nil {
				return fmt.Errorf("outbox cleanup stopped after deleting %d entries: %w", n, a.dbError(err))
			}
			if a.json {
				return a.writeJSON(cleanupJSON{a.schema, scope.json(), seconds(age), cutoff, n})
			}
			return a.printf("Deleted %d sent-ledger entries older than %s (before %s), %s.\n", n, olderThan,
				timestamp(cutoff), scope.label())
		},
	}
	addTenantScope(c, &scope, "clean up")
	c.Flags().StringVar(&olderThan, "older-than", "", "delete entries older than this age: 7d, 36h, 90m (required)")
	c.Flags().IntVar(&batchSize, "batch-size", 1000, "rows deleted per statement")
	return c
}

// requiredAge parses a required age flag.
func requiredAge(cmd *cobra.Command, flag, value string) (time.Duration, error) {
	if !cmd.Flags().Changed(flag) {
		return 0, usageErrorf("--%s is required (for example --%s 7d)", flag, flag)
	}
	return parseAge(flag, value)
}
