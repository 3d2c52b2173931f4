package logfollow

import (
	"embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/internal/names"
	"github.com/stagehand-es/stagehand/internal/sqlfile"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

// sqlSet is the package's SQL files, read once: embedded data, checked by the package's tests.
var sqlSet = sqlfile.MustLoad(sqlFiles, "sql/*.sql")

// checkpoint holds the named parameters of the checkpoint statements (sql/checkpoints.sql): a statement takes the
// ones it names.
type checkpoint struct {
	Name        string     `sql:"name"`
	Kind        string     `sql:"kind"`
	ResetGroup  string     `sql:"reset_group"`
	Filter      string     `sql:"filter"`
	State       string     `sql:"state"`
	From        int64      `sql:"from"`
	Position    int64      `sql:"position"`
	LastEventAt *time.Time `sql:"last_event_at"`
	// Error is a failing attempt's error (note_error); LastError a stop's, nil to keep the last one (set_state).
	Error           string  `sql:"error"`
	LastError       *string `sql:"last_error"`
	FailingPosition int64   `sql:"failing_position"`
	Attempts        int     `sql:"attempts"`
	// The fence: the lease the write holds.
	FenceName  string `sql:"fence_name"`
	FenceOwner string `sql:"fence_owner"`
	FenceToken int64  `sql:"fence_token"`
}

// checkpointSQL are the checkpoint statements written out for one schema.
type checkpointSQL struct {
	advance, noteError, setState, start, load, position sqlfile.Named[checkpoint]
	lockResetGroup, resetGroup                          sqlfile.Named[checkpoint]
}

// checkpointStatements writes a follower's checkpoint statements out for schema.
func checkpointStatements(schema string) (checkpointSQL, error) {
	var q checkpointSQL
	var err error
	for _, st := range []struct {
		name  string
		field *sqlfile.Named[checkpoint]
	}{
		{"advance", &q.advance}, {"note_error", &q.noteError}, {"set_state", &q.setState}, {"start", &q.start},
		{"load", &q.load}, {"position", &q.position}, {"lock_reset_group", &q.lockResetGroup},
		{"reset_group", &q.resetGroup},
	} {
		if *st.field, err = checkpointStatement(schema, st.name); err != nil {
			return checkpointSQL{}, err
		}
	}
	return q, nil
}

// checkpointStatement writes the checkpoint statement name out for schema.
func checkpointStatement(schema, name string) (sqlfile.Named[checkpoint], error) {
	if reason := names.Identifier(schema); reason != "" {
		return sqlfile.Named[checkpoint]{}, &ConfigError{Field: "Schema", Reason: reason}
	}
	idents := map[string]string{"checkpoints": pgx.Identifier{schema, "checkpoints"}.Sanitize(),
		"leases": pgx.Identifier{schema, "leases"}.Sanitize()}
	text, err := sqlSet.Expand(name, nil, idents)
	if err != nil {
		return sqlfile.Named[checkpoint]{}, fmt.Errorf("stagehand: write the checkpoint statement %s: %w", name, err)
	}
	return sqlfile.Bind[checkpoint](text)
}
