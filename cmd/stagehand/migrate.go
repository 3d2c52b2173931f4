package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/stagehand-es/stagehand"
)

func (a *app) migrateCommand() *cobra.Command {
	return group("migrate", "Apply and inspect the database schema",
		`Apply stagehand's migrations (every package's tables: event store, outbox, inbox, projections, leases) to
the schema, or list which are applied. The same migrations as stagehand.Migrate.`,
		a.migrateUpCommand(), a.migrateStatusCommand())
}

type migrationJSON struct {
	Version   int        `json:"version"`
	Name      string     `json:"name"`
	Applied   bool       `json:"applied"`
	AppliedAt *time.Time `json:"applied_at,omitempty"`
}

func (a *app) migrateUpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "up",
		Short: "Apply every pending migration (idempotent)",
		Long: `Apply every pending migration to the schema, creating it when needed, in one transaction under an
advisory lock: safe to run again (a no-op when up to date) and from several processes at once.`,
		Example: `  stagehand migrate up --database-url postgres://app@db/app
  stagehand migrate up --schema billing --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			applied, err := stagehand.Migrate(ctx, pool, &stagehand.MigrateConfig{Schema: a.schema})
			if err != nil {
				return fmt.Errorf("migrate schema %q: %w", a.schema, err)
			}
			all, err := stagehand.Migrations(ctx, pool, a.schema)
			if err != nil {
				return fmt.Errorf("list migrations of schema %q: %w", a.schema, err)
			}
			names := map[int]string{}
			for _, m := range all {
				names[m.Version] = m.Name
			}
			done := make([]migrationJSON, 0, len(applied))
			for _, v := range applied {
				done = append(done, migrationJSON{Version: v, Name: names[v], Applied: true})
			}
			if a.json {
				return a.writeJSON(struct {
					Schema   string          `json:"schema"`
					Applied  []migrationJSON `json:"applied"`
					UpToDate bool            `json:"up_to_date"`
					Total    int             `json:"total"`
				}{a.schema, done, len(done) == 0, len(all)})
			}
			if len(done) == 0 {
				return a.printf("Schema %q is up to date (%d migrations applied).\n", a.schema, len(all))
			}
			if err := a.printf("Applied %d migration(s) to schema %q:\n", len(done), a.schema); err != nil {
				return err
			}
			for _, m := range done {
				if err := a.printf("  %03d  %s\n", m.Version, m.Name); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

func (a *app) migrateStatusCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "status",
		Short:   "List every migration and whether it is applied",
		Example: `  stagehand migrate status`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			all, err := stagehand.Migrations(ctx, pool, a.schema)
			if err != nil {
				return fmt.Errorf("list migrations of schema %q: %w", a.schema, err)
			}
			out := make([]migrationJSON, 0, len(all))
			pending := 0
			for _, m := range all {
				j := migrationJSON{Version: m.Version, Name: m.Name, Applied: m.Applied()}
				if m.Applied() {
					at := m.AppliedAt.UTC()
					j.AppliedAt = &at
				} else {
					pending++
				}
				out = append(out, j)
			}
			if a.json {
				return a.writeJSON(struct {
					Schema     string          `json:"schema"`
					Migrations []migrationJSON `json:"migrations"`
					Pending    int             `json:"pending"`
				}{a.schema, out, pending})
			}
			rows := make([][]string, 0, len(out))
			for _, m := range out {
				state, at := "pending", "-"
				if m.Applied {
					state, at = "applied", timestamp(*m.AppliedAt)
				}
				rows = append(rows, []string{fmt.Sprintf("%03d", m.Version), m.Name, state, at})
			}
			if err := a.table([]string{"VERSION", "NAME", "STATUS", "APPLIED AT"}, rows); err != nil {
				return err
			}
			return a.printf("\nSchema %q: %d applied, %d pending.\n", a.schema, len(out)-pending, pending)
		},
	}
}
