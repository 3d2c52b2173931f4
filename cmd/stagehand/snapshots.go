package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
)

func (a *app) snapshotsCommand() *cobra.Command {
	return group("snapshots", "Drop aggregate snapshots",
		`Manage the snapshots repositories take every SnapshotEvery events. A snapshot only shortens a load: dropping
one makes the next load replay the stream from its first event, and the next save that crosses a snapshot
boundary takes a fresh one.`,
		a.snapshotsDropCommand())
}

type dropSnapshotsJSON struct {
	Schema    string   `json:"schema"`
	Tenant    string   `json:"tenant"`
	StreamIDs []string `json:"stream_ids"`
	Count     int      `json:"count"`
	// Unknown are the requested streams without a snapshot (the command then exits non-zero).
	Unknown []string `json:"unknown"`
}

func (a *app) snapshotsDropCommand() *cobra.Command {
	var tenant string
	c := &cobra.Command{
		Use:   "drop ID...",
		Short: "Delete the snapshots of the given streams (aggregate IDs)",
		Long: `Delete the snapshots of the streams (aggregate IDs) given, of one tenant: use it for a snapshot you do
not trust, or after fixing a snapshot encoding. The events are untouched. IDs without a snapshot are listed and make
the command fail; the others are dropped.`,
		Example: `  stagehand snapshots drop acc-42
  stagehand snapshots drop acc-42 acc-43 --tenant acme --json`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			tenant = stagehand.NormalizeTenant(tenant)
			store, err := a.eventStore(ctx)
			if err != nil {
				return err
			}
			ids := slices.Compact(slices.Sorted(slices.Values(args)))
			n, unknown := 0, []string{}
			for _, id := range ids {
				err := store.DeleteSnapshot(ctx, tenant, id)
				switch {
				case errors.Is(err, eventstore.ErrSnapshotNotFound):
					unknown = append(unknown, id)
				case err != nil:
					return fmt.Errorf("drop snapshots (after %d dropped): %w", n, a.dbError(err))
				default:
					n++
				}
			}
			if a.json {
				err = a.writeJSON(dropSnapshotsJSON{a.schema, tenant, ids, n, unknown})
			} else {
				err = a.printf("Dropped %d snapshot(s) (tenant %s).\n", n, displayTenant(tenant))
			}
			if err == nil && len(unknown) > 0 {
				err = fmt.Errorf("no snapshot of stream %s (tenant %s); the others were dropped: %w",
					strings.Join(unknown, ", "), displayTenant(tenant), eventstore.ErrSnapshotNotFound)
			}
			return err
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "the streams' tenant (default: the no-tenant value)")
	return c
}
