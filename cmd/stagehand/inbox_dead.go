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

func (a *app) inboxDeadCommand() *cobra.Command {
	return group("dead", "List, show, redrive and discard inbox dead letters",
		`Inbox dead letters are messages a handler could not decode or kept failing on. An inbox dead letter is
named by its handler and message ID. Redriving one stages a copy of the message in the outbox of this schema
(published by its relay) that only that handler handles, under the original message ID: its effects still apply
once. Discarding one deletes it; redeliveries of the message stay skipped.`,
		a.inboxDeadListCommand(), a.inboxDeadShowCommand(), a.inboxDeadRedriveCommand(),
		a.inboxDeadDiscardCommand())
}

// inboxDeadJSON is an inbox dead letter in JSON output; Payload and Metadata only in "show".
type inboxDeadJSON struct {
	Handler   string            `json:"handler"`
	ID        string            `json:"id"`
	Tenant    string            `json:"tenant"`
	Type      string            `json:"type,omitempty"`
	Topic     string            `json:"topic"`
	Attempts  int               `json:"attempts"`
	LastError string            `json:"last_error"`
	DeadAt    time.Time         `json:"dead_at"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	*payloadJSON
}

func inboxDeadToJSON(d outbox.InboxDeadLetter, full bool) inboxDeadJSON {
	j := inboxDeadJSON{Handler: d.Handler, ID: d.MessageID, Tenant: d.Tenant, Type: d.MessageType, Topic: d.Topic,
		Attempts: d.Attempts, LastError: d.LastError, DeadAt: d.DeadAt.UTC()}
	if full {
		j.Metadata = d.Metadata
		p := encodePayload(d.Payload)
		j.payloadJSON = &p
	}
	return j
}

// listInboxDead pages through the inbox dead letters of admin (limit 0: all of them).
func listInboxDead(ctx context.Context, admin *outbox.Admin, handler string, limit int) (
	[]outbox.InboxDeadLetter, error) {
	return pageAll(limit, func(page int, after *outbox.InboxDeadLetter) ([]outbox.InboxDeadLetter, error) {
		return admin.InboxDeadLetters(ctx, outbox.InboxListOptions{Limit: page, Handler: handler, After: after})
	})
}

func (a *app) inboxDeadListCommand() *cobra.Command {
	var (
		scope   tenantScope
		handler string
		limit   int
	)
	c := &cobra.Command{
		Use:   "list",
		Short: "List inbox dead letters, oldest first",
		Example: `  stagehand inbox dead list
  stagehand inbox dead list --handler ledger --limit 20 --json`,
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
			dls, err := listInboxDead(ctx, scope.admin(o), handler, limit)
			if err != nil {
				return a.dbError(err)
			}
			if a.json {
				out := make([]inboxDeadJSON, 0, len(dls))
				for _, d := range dls {
					out = append(out, inboxDeadToJSON(d, false))
				}
				return a.writeJSON(struct {
					Schema string `json:"schema"`
					scopeJSON
					DeadLetters []inboxDeadJSON `json:"dead_letters"`
				}{a.schema, scope.json(), out})
			}
			if len(dls) == 0 {
				return a.printf("No inbox dead letters (%s).\n", scope.label())
			}
			rows := make([][]string, 0, len(dls))
			for _, d := range dls {
				rows = append(rows, []string{d.Handler, d.MessageID, displayTenant(d.Tenant), orDash(d.MessageType),
					orDash(d.Topic), strconv.Itoa(d.Attempts), timestamp(d.DeadAt), truncate(d.LastError, 60)})
			}
			if err := a.table([]string{"HANDLER", "ID", "TENANT", "TYPE", "TOPIC", "ATTEMPTS", "DEAD AT",
				"LAST ERROR"}, rows); err != nil {
				return err
			}
			if limit > 0 && len(dls) == limit {
				return a.printf("\nThe oldest %d inbox dead letters, %s (--limit 0 shows all).\n", len(dls),
					scope.label())
			}
			return a.printf("\n%d inbox dead letter(s), %s.\n", len(dls), scope.label())
		},
	}
	addTenantScope(c, &scope, "list")
	c.Flags().StringVar(&handler, "handler", "", "only dead letters of this handler")
	c.Flags().IntVar(&limit, "limit", 100, "show at most this many (0: all)")
	return c
}

func (a *app) inboxDeadShowCommand() *cobra.Command {
	var scope tenantScope
	c := &cobra.Command{
		Use:   "show HANDLER ID",
		Short: "Show one inbox dead letter with its payload, metadata and last error",
		Example: `  stagehand inbox dead show ledger 0192f1c4-7d3e-7a10-9c55-2f1e9b7c1a20
  stagehand inbox dead show ledger credit-42 --tenant acme --json`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			scope.resolve(cmd)
			ctx := cmd.Context()
			o, err := a.outbox(ctx)
			if err != nil {
				return err
			}
			d, err := scope.admin(o).InboxDeadLetter(ctx, args[0], args[1])
			if errors.Is(err, outbox.ErrNotFound) {
				return fmt.Errorf("no inbox dead letter of handler %q with ID %q (%s): %w", args[0], args[1],
					scope.label(), outbox.ErrNotFound)
			}
			if err != nil {
				return a.dbError(err)
			}
			if a.json {
				return a.writeJSON(inboxDeadToJSON(d, true))
			}
			pairs := [][2]string{
				{"handler", d.Handler}, {"id", d.MessageID}, {"tenant", displayTenant(d.Tenant)},
				{"type", orDash(d.MessageType)}, {"topic", orDash(d.Topic)}, {"attempts", fmt.Sprint(d.Attempts)},
				{"dead at", timestamp(d.DeadAt)},
			}
			keys := make([]string, 0, len(d.Metadata))
			for k := range d.Metadata {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				pairs = append(pairs, [2]string{"metadata " + k, d.Metadata[k]})
			}
			pairs = append(pairs, [2]string{"last error", oneLineText(d.LastError)},
				[2]string{"payload", payloadText(d.Payload)})
			return a.keyValues(pairs)
		},
	}
	addTenantScope(c, &scope, "look in")
	return c
}

type inboxMoveJSON struct {
	Schema string `json:"schema"`
	scopeJSON
	Handler string   `json:"handler,omitempty"`
	IDs     []string `json:"ids"`
	Count   int      `json:"count"`
	// Unknown are the requested IDs without an inbox dead letter in the scope (the command then exits non-zero).
	Unknown []string `json:"unknown"`
}

func inboxUnknownError(handler string, ids []string, scope *tenantScope, verb string) error {
	return fmt.Errorf("no inbox dead letter of handler %q with ID %s (%s); the others were %s: %w", handler,
		strings.Join(ids, ", "), scope.label(), verb, outbox.ErrNotFound)
}

func (a *app) inboxDeadRedriveCommand() *cobra.Command {
	var (
		scope   tenantScope
		all     bool
		handler string
		topic   string
	)
	c := &cobra.Command{
		Use:   "redrive HANDLER ID... | --all [--handler HANDLER]",
		Short: "Give inbox dead letters another run of their handler",
		Long: `Redrive the inbox dead letters of HANDLER with the given message IDs: each is deleted, the inbox forgets it
dead-lettered the message, and a copy is staged in this schema's outbox for the topic it was consumed from (a
relay of this outbox publishes it). Only HANDLER handles the copy, under the original message ID, so its effects
apply once; other handlers of the topic acknowledge it. IDs without a dead letter in the scope (a message redriven
and handled since has none) are listed and make the command fail; the others are redriven. --all redrives every
inbox dead letter of the scope (of --handler when given). --topic is the topic for dead letters recorded without
one (handled outside a Watermill router).`,
		Example: `  stagehand inbox dead redrive ledger credit-41 credit-42
  stagehand inbox dead redrive --all --handler ledger --tenant acme`,
		RunE: func(cmd *cobra.Command, args []string) error {
			scope.resolve(cmd)
			switch {
			case all && len(args) > 0:
				return usageErrorf("give a handler and message IDs, or --all, not both")
			case !all && len(args) < 2:
				return usageErrorf("give a handler and at least one message ID, or --all")
			case !all && handler != "":
				return usageErrorf("--handler only applies with --all (the handler is the first argument)")
			}
			ctx := cmd.Context()
			o, err := a.outbox(ctx)
			if err != nil {
				return err
			}
			admin := scope.admin(o)
			n, ids, unknown := 0, []string{}, []string{}
			if all {
				n, err = admin.RedriveInboxMatching(ctx, outbox.InboxListOptions{Handler: handler, RedriveTopic: topic})
				if err != nil {
					return fmt.Errorf("redrive (after %d redriven): %w", n, a.dbError(err))
				}
			} else {
				handler = args[0]
				ids = slices.Compact(slices.Sorted(slices.Values(args[1:])))
				for _, id := range ids {
					moved, err := admin.RedriveInboxMatching(ctx, outbox.InboxListOptions{Handler: handler, ID: id,
						RedriveTopic: topic})
					switch {
					case err != nil:
						return fmt.Errorf("redrive (after %d redriven): %w", n, a.dbError(err))
					case moved == 0:
						unknown = append(unknown, id)
					default:
						n += moved
					}
				}
			}
			if a.json {
				err = a.writeJSON(inboxMoveJSON{a.schema, scope.json(), handler, ids, n, unknown})
			} else {
				err = a.printf("Redrove %d inbox dead letter(s) into the outbox (%s).\n", n, scope.label())
			}
			if err == nil && len(unknown) > 0 {
				err = inboxUnknownError(handler, unknown, &scope, "redriven")
			}
			return err
		},
	}
	addTenantScope(c, &scope, "redrive")
	c.Flags().BoolVar(&all, "all", false, "redrive every inbox dead letter of the scope")
	c.Flags().StringVar(&handler, "handler", "", "with --all: only dead letters of this handler")
	c.Flags().StringVar(&topic, "topic", "", "the topic for dead letters recorded without one")
	return c
}

func (a *app) inboxDeadDiscardCommand() *cobra.Command {
	var scope tenantScope
	c := &cobra.Command{
		Use:   "discard HANDLER ID...",
		Short: "Delete inbox dead letters for good",
		Long: `Delete the inbox dead letters of HANDLER with the given message IDs without running the handler. The
inbox keeps its entry, so redeliveries of the message are still skipped until inbox cleanup. IDs without a dead
letter in the scope are listed and make the command fail; the others are discarded.`,
		Example: `  stagehand inbox dead discard ledger credit-41
  stagehand inbox dead discard ledger credit-41 credit-42 --tenant acme --json`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			scope.resolve(cmd)
			ctx := cmd.Context()
			o, err := a.outbox(ctx)
			if err != nil {
				return err
			}
			admin := scope.admin(o)
			handler := args[0]
			ids := slices.Compact(slices.Sorted(slices.Values(args[1:])))
			n, unknown := 0, []string{}
			for _, id := range ids {
				moved, err := admin.DiscardInboxMatching(ctx, outbox.InboxListOptions{Handler: handler, ID: id})
				switch {
				case err != nil:
					return fmt.Errorf("discard (after %d discarded): %w", n, a.dbError(err))
				case moved == 0:
					unknown = append(unknown, id)
				default:
					n += moved
				}
			}
			if a.json {
				err = a.writeJSON(inboxMoveJSON{a.schema, scope.json(), handler, ids, n, unknown})
			} else {
				err = a.printf("Discarded %d inbox dead letter(s) (%s).\n", n, scope.label())
			}
			if err == nil && len(unknown) > 0 {
				err = inboxUnknownError(handler, unknown, &scope, "discarded")
			}
			return err
		},
	}
	addTenantScope(c, &scope, "discard")
	return c
}
