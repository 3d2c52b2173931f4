package doctable_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stagehand-es/stagehand/internal/testkit/doctable"
)

type cfg struct {
	Size    int
	Wait    time.Duration
	Name    string
	A, B    time.Duration
	Enabled bool
	hidden  int // unexported: needs no row
}

var _ = cfg{}.hidden

const doc = "# T\n\n### `cfg`\n\n| field | default | rule |\n| --- | --- | --- |\n" +
	"| `Size` | 100 (1 to 1000) | |\n| `Wait` | `2m` | |\n| `Name` | `\"x\"` | |\n| `A`, `B` | 1s, 5s | |\n" +
	"| `Enabled` | false | |\n"

// recorder is a testing.TB that records the errors Check reports.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, format)
	_ = args
}
func (r *recorder) Helper() {}

func write(t *testing.T, body string) string {
	p := filepath.Join(t.TempDir(), "README.md")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func defaults() map[string]any {
	return map[string]any{"Size": 100, "Wait": 2 * time.Minute, "Name": "x", "A": time.Second, "B": 5 * time.Second,
		"Enabled": false}
}

func TestMatchingTablePasses(t *testing.T) {
	tbl := doctable.Find(t, write(t, doc), "### `cfg`")
	r := &recorder{TB: t}
	doctable.Check(r, tbl, reflect.TypeFor[cfg](), "", defaults())
	if len(r.errs) != 0 {
		t.Fatalf("errors: %v", r.errs)
	}
}

func TestMissingRenamedAndRedefaultedFieldsFail(t *testing.T) {
	for name, c := range map[string]struct {
		doc     string
		applied map[string]any
	}{
		"field without a row": {strings.Replace(doc, "| `Enabled` | false | |\n", "", 1), defaults()},
		"row without a field": {strings.Replace(doc, "`Size`", "`Sizes`", 1), defaults()},
		"re-defaulted":        {doc, func() map[string]any { d := defaults(); d["Size"] = 200; return d }()},
		"second of a pair":    {doc, func() map[string]any { d := defaults(); d["B"] = time.Second; return d }()},
		"duration":            {doc, func() map[string]any { d := defaults(); d["Wait"] = time.Minute; return d }()},
	} {
		t.Run(name, func(t *testing.T) {
			tbl := doctable.Find(t, write(t, c.doc), "### `cfg`")
			r := &recorder{TB: t}
			doctable.Check(r, tbl, reflect.TypeFor[cfg](), "", c.applied)
			if len(r.errs) == 0 {
				t.Fatal("Check reported nothing")
			}
		})
	}
}

func TestFormat(t *testing.T) {
	for v, want := range map[any]string{time.Hour: "1h", 90 * time.Second: "1m30s", 100 * time.Millisecond: "100ms",
		0.2: "0.2", 5: "5", "s": "s"} {
		if got := doctable.Format(v); got != want {
			t.Errorf("Format(%v) = %q, want %q", v, got, want)
		}
	}
}
