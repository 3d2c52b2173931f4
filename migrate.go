package stagehand

import (
	"context"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/internal/migrate"
	"github.com/stagehand-es/stagehand/internal/names"
)

// DefaultSchema is the PostgreSQL schema every stagehand table lives in unless configured otherwise.
const DefaultSchema = "stagehand"

// Beginner is satisfied by *pgxpool.Pool, *pgx.Conn and pgx.Tx.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// MigrateConfig configures Migrate. A nil *MigrateConfig uses the defaults.
type MigrateConfig struct {
	// Schema is the schema to migrate. Default DefaultSchema ("stagehand"). It is quoted, never interpolated.
	Schema string
	// Logger receives one line per applied migration. Default: silent.
	Logger *slog.Logger
}

// MigrationStatus is one migration and whether it is applied.
type MigrationStatus = migrate.Status

// Migrate applies every pending migration of every stagehand package (event store, outbox, inbox, projections,
// staging, leases) to the schema and returns the versions it applied.
//
// A schema that is blank, longer than 63 bytes, not UTF-8 or holds a NUL byte is refused with a *ConfigError
// (Field "Schema") matching ErrInvalidConfig, as every constructor refuses it.
//
// It is explicit (no constructor creates tables), idempotent, and safe to run concurrently from several processes:
// it holds a transaction-scoped advisory lock keyed on the schema and applies everything in one transaction.
func Migrate(ctx context.Context, db Beginner, cfg *MigrateConfig) ([]int, error) {
	schema, logger := DefaultSchema, (*slog.Logger)(nil)
	if cfg != nil {
		logger = cfg.Logger
		if cfg.Schema != "" {
			schema = cfg.Schema
		}
	}
	if reason := names.Schema(schema); reason != "" {
		return nil, &ConfigError{Field: "Schema", Reason: reason}
	}
	done, err := migrate.Up(ctx, db, schema, logger)
	if err != nil {
		return nil, err
	}
	versions := make([]int, len(done))
	for i, m := range done {
		versions[i] = m.Version
	}
	return versions, nil
}

// Migrations lists every known migration and when it was applied to the schema (zero time when pending). A schema
// Migrate would refuse is refused alike (a *ConfigError, Field "schema").
func Migrations(ctx context.Context, db Beginner, schema string) ([]MigrationStatus, error) {
	if reason := names.Schema(schema); reason != "" {
		return nil, &ConfigError{Field: "schema", Reason: reason}
	}
	return migrate.List(ctx, db, schema)
}

// MigrationsFS exposes the migration files (NNN_name.sql) for external tools such as goose or tern. The files use
// unqualified table names: run them with search_path set to your schema.
func MigrationsFS() fs.FS { return migrate.FS() }
