package sqlfile_test

import (
	"testing"
	"time"

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

type thirteen struct {
	A string    `sql:"a"`
	B string    `sql:"b"`
	C string    `sql:"c"`
	D []byte    `sql:"d"`
	E string    `sql:"e"`
	F string    `sql:"f"`
	G string    `sql:"g"`
	H string    `sql:"h"`
	I string    `sql:"i"`
	J bool      `sql:"j"`
	K *int64    `sql:"k"`
	L *int64    `sql:"l"`
	M time.Time `sql:"m"`
}

// BenchmarkArgs prices Args for a statement of thirteen parameters, the size of a staged message's: what named
// parameters add to a save over a hand-written []any (which the compiler keeps on the stack here, so it costs next
// to nothing; in a save it escapes to the batch). Measured on the project's 2-core machine: about 450ns and 12
// allocations per call.
//
//	go test ./internal/sqlfile -run '^$' -bench Args
func BenchmarkArgs(b *testing.B) {
	n, err := sqlfile.Bind[thirteen](`SELECT @a, @b, @c, @d, @e, @f, @g, @h, @i, @j, @k, @l, @m`)
	if err != nil {
		b.Fatal(err)
	}
	p := thirteen{A: "a", B: "b", C: "c", D: []byte("d"), E: "e", F: "f", G: "g", H: "h", I: "i", J: true,
		M: time.Now()}
	hand := func(p *thirteen) []any {
		return []any{p.A, p.B, p.C, p.D, p.E, p.F, p.G, p.H, p.I, p.J, p.K, p.L, p.M}
	}
	b.Run("hand-written", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = hand(&p)
		}
	})
	b.Run("named", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = n.Args(&p)
		}
	})
}
