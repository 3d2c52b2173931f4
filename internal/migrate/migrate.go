// Package migrate applies stagehand's numbered, embedded SQL migrations to one schema and records them in a single
// history table.
//
// Every package contributes its numbered files to sql/ (NNN_component_name.sql; numbers are unique across the
// project, never reused or edited once released). Files use unqualified names: Up runs them with search_path set
// to the target schema, so the same files serve goose or tern users through FS.
package migrate

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/internal/names"
)

//go:embed sql/*.sql
var files embed.FS

// HistoryTable is the name of the table, in the target schema, that records applied migrations.
const HistoryTable = "schema_migrations"

// Migration is one numbered SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Status is a migration and when it was applied (zero when pending).
type Status struct {
	Migration
	AppliedAt time.Time
}

// Applied reports whether the migration has been applied.
func (s Status) Applied() bool { return !s.AppliedAt.IsZero() }

// ErrInvalidSchema is matched by the error of a schema name that cannot be used (see CheckSchema).
var ErrInvalidSchema = errors.New("stagehand: invalid migration Schema")

// CheckSchema returns an error matching ErrInvalidSchema when schema is blank, longer than PostgreSQL keeps (63
// bytes: a longer name would be cut, so two long names could name one schema), not UTF-8, or holds a NUL byte.
func CheckSchema(schema string) error {
	if reason := names.Schema(schema); reason != "" {
		return fmt.Errorf("%w: %q %s", ErrInvalidSchema, names.Cut(schema, 80), reason)
	}
	return nil
}

// FS returns the migration files (NNN_name.sql), for use with external migration tools.
func FS() fs.FS {
	sub, err := fs.Sub(files, "sql")
	if err != nil { // cannot happen: the directory is embedded
		return files
	}
	return sub
}

var fileName = regexp.MustCompile(`^(\d+)_([a-z0-9_]+)\.sql$`)

// All returns every migration in version order.
func All() ([]Migration, error) {
	entries, err := fs.ReadDir(FS(), ".")
	if err != nil {
		return nil, fmt.Errorf("stagehand: read the embedded migrations: %w", err)
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("stagehand: migration file %q is not named NNN_name.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("stagehand: migration version %d used by both %s and %s", v, prev, e.Name())
		}
		seen[v] = e.Name()
		body, err := fs.ReadFile(FS(), e.Name())
		if err != nil {
			return nil, fmt.Errorf("stagehand: read migration %s: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: m[2], SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Beginner is satisfied by *pgxpool.Pool, *pgx.Conn and pgx.Tx.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Up applies every pending migration to schema, creating the schema if needed, and returns those it applied.
//
// It runs in one transaction under a transaction-scoped advisory lock keyed on the schema, so it is idempotent and
// safe to call concurrently from several processes: a second caller waits, then finds nothing to do.
func Up(ctx context.Context, db Beginner, schema string, logger *slog.Logger) ([]Migration, error) {
	if err := CheckSchema(schema); err != nil {
		return nil, err
	}
	all, err := All()
	if err != nil {
		return nil, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("stagehand: migrations: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	if err := prepare(ctx, tx, schema); err != nil {
		return nil, err
	}
	applied, err := appliedVersions(ctx, tx, schema)
	if err != nil {
		return nil, err
	}
	var done []Migration
	for _, m := range all {
		if _, ok := applied[m.Version]; ok {
			continue
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return nil, fmt.Errorf("stagehand: apply migration %03d_%s to schema %q: %w", m.Version, m.Name, schema, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, HistoryTable}.Sanitize()+
			" (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
			return nil, fmt.Errorf("stagehand: record migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if logger != nil {
			logger.InfoContext(ctx, "stagehand: migration applied", "schema", schema, "version", m.Version,
				"name", m.Name)
		}
		done = append(done, m)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("stagehand: migrations: commit: %w", err)
	}
	return done, nil
}

// List returns every known migration with the time it was applied to schema (zero when pending). A schema that
// was never migrated lists everything as pending.
func List(ctx context.Context, db Beginner, schema string) ([]Status, error) {
	if err := CheckSchema(schema); err != nil {
		return nil, err
	}
	all, err := All()
	if err != nil {
		return nil, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("stagehand: migrations: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL",
		pgx.Identifier{schema, HistoryTable}.Sanitize()).Scan(&exists); err != nil {
		return nil, fmt.Errorf("stagehand: look up the migration history table: %w", err)
	}
	applied := map[int]time.Time{}
	if exists {
		if applied, err = appliedVersions(ctx, tx, schema); err != nil {
			return nil, err
		}
	}
	out := make([]Status, 0, len(all))
	for _, m := range all {
		out = append(out, Status{Migration: m, AppliedAt: applied[m.Version]})
	}
	return out, nil
}

func prepare(ctx context.Context, tx pgx.Tx, schema string) error {
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended('stagehand.migrate:' || $1, 0))",
		schema); err != nil {
		return fmt.Errorf("stagehand: migrations: advisory lock: %w", err)
	}
	q := pgx.Identifier{schema}.Sanitize()
	if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+q); err != nil {
		return fmt.Errorf("stagehand: create schema %q: %w", schema, err)
	}
	if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+q); err != nil {
		return fmt.Errorf("stagehand: migrations: search_path: %w", err)
	}
	if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+pgx.Identifier{schema, HistoryTable}.Sanitize()+` (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return fmt.Errorf("stagehand: create the migration history table: %w", err)
	}
	return nil
}

func appliedVersions(ctx context.Context, tx pgx.Tx, schema string) (map[int]time.Time, error) {
	rows, err := tx.Query(ctx, "SELECT version, applied_at FROM "+pgx.Identifier{schema, HistoryTable}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("stagehand: read the migration history: %w", err)
	}
	out := map[int]time.Time{}
	for rows.Next() {
		var v int
		var at time.Time
		if err := rows.Scan(&v, &at); err != nil {
			return nil, fmt.Errorf("stagehand: read the migration history: %w", err)
		}
		out[v] = at
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("stagehand: read the migration history: %w", err)
	}
	return out, nil
}
