package shred

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/names"
)

// DB is what PostgresKeyStore needs of a database: *pgxpool.Pool satisfies it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// PostgresConfig configures a PostgresKeyStore. A nil *PostgresConfig uses the defaults.
type PostgresConfig struct {
	// Schema holds the shred_subjects, shred_keys and shred_audit tables (created by stagehand.Migrate). Default
	// "stagehand". Quoted, never interpolated.
	Schema string
}

// PostgresKeyStore keeps keys in PostgreSQL, in tables of their own: shred_subjects (each subject's current
// version, and when it was forgotten), shred_keys (the material of each version) and shred_audit. Forget deletes
// the subject's rows from shred_keys in the transaction that writes its audit record.
//
// The deleted rows' bytes stay in the table's pages until VACUUM reuses them, and in the WAL, replicas' and
// backups' copies until those are recycled: the retention of backups and archived WAL bounds how long a forgotten
// key can be recovered from them.
type PostgresKeyStore struct {
	db                     DB
	subjects, keys, audits string
}

// NewPostgresKeyStore returns a key store on db. It creates no table: run stagehand.Migrate first.
func NewPostgresKeyStore(db DB, cfg *PostgresConfig) (*PostgresKeyStore, error) {
	schema := stagehand.DefaultSchema
	if cfg != nil && cfg.Schema != "" {
		schema = cfg.Schema
	}
	switch {
	case db == nil:
		return nil, &stagehand.ConfigError{Package: "shred", Field: "db", Reason: "must not be nil"}
	case strings.TrimSpace(schema) == "":
		return nil, &stagehand.ConfigError{Package: "shred", Field: "Schema", Reason: "must not be blank"}
	}
	if reason := names.Schema(schema); reason != "" {
		return nil, &stagehand.ConfigError{Package: "shred", Field: "Schema", Reason: reason}
	}
	return &PostgresKeyStore{db: db,
		subjects: pgx.Identifier{schema, "shred_subjects"}.Sanitize(),
		keys:     pgx.Identifier{schema, "shred_keys"}.Sanitize(),
		audits:   pgx.Identifier{schema, "shred_audit"}.Sanitize(),
	}, nil
}

// CurrentKey implements KeyStore: one query when the key exists, a short transaction when it must be made.
func (p *PostgresKeyStore) CurrentKey(ctx context.Context, subject string) (Key, error) {
	if err := CheckSubject(subject); err != nil {
		return Key{}, err
	}
	var k Key
	err := p.db.QueryRow(ctx, `SELECT k.version, k.material FROM `+p.subjects+` s JOIN `+p.keys+
		` k ON k.subject = s.subject AND k.version = s.current_version WHERE s.subject = $1`, subject).
		Scan(&k.Version, &k.Material)
	if err == nil {
		k.Subject = subject
		return k, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Key{}, fmt.Errorf("shred: read the current key of subject %q: %w", subject, err)
	}
	err = pgx.BeginFunc(ctx, p.db, func(tx pgx.Tx) error {
		cur, err := p.lock(ctx, tx, subject)
		if err != nil {
			return err
		}
		var mat []byte
		err = tx.QueryRow(ctx, `SELECT material FROM `+p.keys+` WHERE subject = $1 AND version = $2`, subject,
			cur).Scan(&mat)
		if err == nil { // made by another writer meanwhile
			k = Key{Subject: subject, Version: cur, Material: mat}
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		k, err = p.make(ctx, tx, subject, cur+1)
		return err
	})
	if err != nil {
		return Key{}, fmt.Errorf("shred: make a key for subject %q: %w", subject, err)
	}
	return k, nil
}

// lock makes sure subject has a row, locks it and returns its current version.
func (p *PostgresKeyStore) lock(ctx context.Context, tx pgx.Tx, subject string) (int, error) {
	if _, err := tx.Exec(ctx, `INSERT INTO `+p.subjects+` (subject) VALUES ($1) ON CONFLICT DO NOTHING`,
		subject); err != nil {
		return 0, err
	}
	var cur int
	err := tx.QueryRow(ctx, `SELECT current_version FROM `+p.subjects+` WHERE subject = $1 FOR UPDATE`, subject).
		Scan(&cur)
	return cur, err
}

// make stores new material at version and makes it subject's current key.
func (p *PostgresKeyStore) make(ctx context.Context, tx pgx.Tx, subject string, version int) (Key, error) {
	mat, err := newMaterial()
	if err != nil {
		return Key{}, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+p.keys+` (subject, version, material) VALUES ($1, $2, $3)`, subject,
		version, mat); err != nil {
		return Key{}, err
	}
	if _, err := tx.Exec(ctx, `UPDATE `+p.subjects+` SET current_version = $2, forgotten_at = NULL WHERE subject = $1`,
		subject, version); err != nil {
		return Key{}, err
	}
	return Key{Subject: subject, Version: version, Material: mat}, nil
}

// Key implements KeyStore.
func (p *PostgresKeyStore) Key(ctx context.Context, subject string, version int) (Key, error) {
	if err := CheckSubject(subject); err != nil {
		return Key{}, err
	}
	var cur int
	var mat []byte
	err := p.db.QueryRow(ctx, `SELECT s.current_version, k.material FROM `+p.subjects+` s LEFT JOIN `+p.keys+
		` k ON k.subject = s.subject AND k.version = $2 WHERE s.subject = $1`, subject, version).Scan(&cur, &mat)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Key{}, fmt.Errorf("%w: subject %q has no keys", ErrUnknownKey, subject)
	case err != nil:
		return Key{}, fmt.Errorf("shred: read key %d of subject %q: %w", version, subject, err)
	case version < 1 || version > cur:
		return Key{}, fmt.Errorf("%w: subject %q version %d (its latest is %d)", ErrUnknownKey, subject, version, cur)
	case mat == nil:
		return Key{}, fmt.Errorf("%w: subject %q version %d", ErrForgotten, subject, version)
	}
	return Key{Subject: subject, Version: version, Material: mat}, nil
}

// Rotate implements KeyStore.
func (p *PostgresKeyStore) Rotate(ctx context.Context, subject string, audit Audit) (Key, error) {
	if err := CheckSubject(subject); err != nil {
		return Key{}, err
	}
	var k Key
	err := pgx.BeginFunc(ctx, p.db, func(tx pgx.Tx) error {
		cur, err := p.lock(ctx, tx, subject)
		if err != nil {
			return err
		}
		if k, err = p.make(ctx, tx, subject, cur+1); err != nil {
			return err
		}
		return p.record(ctx, tx, "rotate", subject, []int{k.Version}, audit)
	})
	if err != nil {
		return Key{}, fmt.Errorf("shred: rotate the key of subject %q: %w", subject, err)
	}
	return k, nil
}

// Forget implements KeyStore.
func (p *PostgresKeyStore) Forget(ctx context.Context, subject string, audit Audit) ([]int, error) {
	if err := CheckSubject(subject); err != nil {
		return nil, err
	}
	versions := []int{}
	err := pgx.BeginFunc(ctx, p.db, func(tx pgx.Tx) error {
		if _, err := p.lock(ctx, tx, subject); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `DELETE FROM `+p.keys+` WHERE subject = $1 RETURNING version`, subject)
		if err != nil {
			return err
		}
		if versions, err = pgx.AppendRows(versions, rows, pgx.RowTo[int]); err != nil {
			return err
		}
		slices.Sort(versions)
		if _, err := tx.Exec(ctx, `UPDATE `+p.subjects+` SET forgotten_at = now() WHERE subject = $1`,
			subject); err != nil {
			return err
		}
		return p.record(ctx, tx, "forget", subject, versions, audit)
	})
	if err != nil {
		return nil, fmt.Errorf("shred: forget subject %q: %w", subject, err)
	}
	return versions, nil
}

func (p *PostgresKeyStore) record(ctx context.Context, tx pgx.Tx, action, subject string, versions []int,
	audit Audit) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+p.audits+` (action, subject, versions, actor, reason) VALUES ($1, $2, $3, $4, $5)`,
		action, subject, versions, storable(audit.Actor, 512), storable(audit.Reason, 4096))
	return err
}

// History implements KeyStore.
func (p *PostgresKeyStore) History(ctx context.Context, subject string) ([]AuditEntry, error) {
	rows, err := p.db.Query(ctx, `SELECT at, action, subject, versions, actor, reason FROM `+p.audits+
		` WHERE subject = $1 ORDER BY id`, subject)
	if err != nil {
		return nil, fmt.Errorf("shred: read the audit of subject %q: %w", subject, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		err := r.Scan(&e.At, &e.Action, &e.Subject, &e.Versions, &e.Actor, &e.Reason)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("shred: read the audit of subject %q: %w", subject, err)
	}
	return out, nil
}

// storable makes s storable in a text column (valid UTF-8, no NUL) and at most about n bytes.
func storable(s string, n int) string {
	return names.Cut(strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", ""), n)
}
