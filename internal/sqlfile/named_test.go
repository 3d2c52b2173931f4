package sqlfile_test

import (
	"testing"

	"github.com/stagehand-es/stagehand/internal/sqlfile"
)

type params struct {
	ID     string `sql:"id"`
	Topic  string `sql:"topic"`
	Tenant string `sql:"tenant_id"`
	Skip   int
}

// Parameters are numbered in their order of first use, a repeated one keeps its number, operators and quoted text
// are left alone, and the arguments follow the numbering.
func TestBindNumbersNamedParameters(t *testing.T) {
	t.Parallel()
	n, err := sqlfile.Bind[params](`SELECT 1 WHERE topic = @topic::text AND meta @> '{"@id":1}' AND id = @id
		AND t = @topic AND x @@ y AND tenant = @tenant_id`)
	if err != nil {
		t.Fatal(err)
	}
	want := `SELECT 1 WHERE topic = $1::text AND meta @> '{"@id":1}' AND id = $2
		AND t = $1 AND x @@ y AND tenant = $3`
	if n.SQL != want {
		t.Fatalf("SQL:\n%s\nwant:\n%s", n.SQL, want)
	}
	args := n.Args(&params{ID: "i", Topic: "t", Tenant: "n", Skip: 7})
	if len(args) != 3 || args[0] != "t" || args[1] != "i" || args[2] != "n" {
		t.Fatalf("args %v", args)
	}
	sub, err := sqlfile.Bind[params](`DELETE FROM x WHERE id = @id`)
	if err != nil {
		t.Fatal(err)
	}
	if got := sub.Args(&params{ID: "i", Topic: "t"}); len(got) != 1 || got[0] != "i" {
		t.Fatalf("a variant using one parameter gets one argument: %v", got)
	}
}

// A parameter no field carries is refused where the statement is written out.
func TestBindRefusesAnUnknownParameter(t *testing.T) {
	t.Parallel()
	if _, err := sqlfile.Bind[params](`SELECT @id, @topik`); err == nil {
		t.Fatal("@topik bound")
	}
	if _, err := sqlfile.Bind[int](`SELECT @id`); err == nil {
		t.Fatal("a non-struct bound")
	}
}
