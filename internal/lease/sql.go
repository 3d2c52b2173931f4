package lease

import (
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/internal/names"
	"github.com/stagehand-es/stagehand/internal/sqlfile"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

// sqlSet is the package's SQL file, read once: embedded data, checked by the package's tests.
var sqlSet = sqlfile.MustLoad(sqlFiles, "sql/*.sql")

// row holds the named parameters of the lease statements (sql/leases.sql): a statement takes the ones it names.
type row struct {
	Name      string `sql:"name"`
	Owner     string `sql:"owner"`
	Token     int64  `sql:"token"`
	TTLMicros int64  `sql:"ttl_us"`
	Prefix    string `sql:"prefix"`
	Table     string `sql:"table"`
}

// statements are the lease statements a Manager runs, written out for its schema.
type statements struct {
	acquire, renew, release, check sqlfile.Named[row]
}

// statementsFor writes a Manager's statements out for schema.
func statementsFor(schema string) (statements, error) {
	var q statements
	var err error
	for _, st := range []struct {
		name  string
		field *sqlfile.Named[row]
	}{{"acquire", &q.acquire}, {"renew", &q.renew}, {"release", &q.release}, {"check", &q.check}} {
		if *st.field, err = statement(schema, st.name); err != nil {
			return statements{}, err
		}
	}
	return q, nil
}

// statement writes the statement name out for schema.
func statement(schema, name string) (sqlfile.Named[row], error) {
	if reason := names.Identifier(schema); reason != "" {
		return sqlfile.Named[row]{}, &ConfigError{Field: "Schema", Reason: reason}
	}
	text, err := sqlSet.Expand(name, nil, map[string]string{"leases": leasesTable(schema)})
	if err != nil {
		return sqlfile.Named[row]{}, fmt.Errorf("stagehand: write the lease statement %s: %w", name, err)
	}
	return sqlfile.Bind[row](text)
}

// leasesTable is the leases table of schema, schema-qualified and quoted.
func leasesTable(schema string) string { return pgx.Identifier{schema, "leases"}.Sanitize() }
