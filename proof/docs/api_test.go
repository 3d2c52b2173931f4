package docs_test

import (
	"bytes"
	"flag"
	"fmt"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var updateAPI = flag.Bool("update-api", false, "rewrite api/stagehand.txt from the current exported API")

// libraryPackages are the packages a user imports: every package of the library module outside internal/.
func libraryPackages(t testing.TB) []string {
	t.Helper()
	out := goCmd(t, "list", "-f", "{{if not .Module.Main}}{{else}}{{.ImportPath}}{{end}}",
		"github.com/stagehand-es/stagehand/...")
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(p, "github.com/stagehand-es/stagehand")
		switch {
		case strings.Contains(rel, "/internal"), strings.HasPrefix(rel, "/cmd/"), strings.HasPrefix(rel, "/examples"),
			strings.HasPrefix(rel, "/proof"):
			continue
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// apiLines lists the exported API of one package, one declaration a line, in the manner of Go's own api/ files.
func apiLines(pkg *types.Package) []string {
	qual := func(p *types.Package) string {
		if p == pkg {
			return ""
		}
		return p.Path()
	}
	prefix := "pkg " + pkg.Path() + ", "
	var out []string
	add := func(format string, args ...any) { out = append(out, prefix+fmt.Sprintf(format, args...)) }
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch o := obj.(type) {
		case *types.Const:
			add("const %s %s = %s", name, types.TypeString(o.Type(), qual), o.Val().ExactString())
		case *types.Var:
			add("var %s %s", name, types.TypeString(o.Type(), qual))
		case *types.Func:
			add("%s", types.ObjectString(o, qual))
		case *types.TypeName:
			head := "type " + name
			if named, ok := o.Type().(*types.Named); ok && named.TypeParams().Len() > 0 {
				var tps []string
				for i := range named.TypeParams().Len() {
					tp := named.TypeParams().At(i)
					tps = append(tps, tp.Obj().Name()+" "+types.TypeString(tp.Constraint(), qual))
				}
				head += "[" + strings.Join(tps, ", ") + "]"
			}
			if o.IsAlias() {
				add("%s = %s", head, types.TypeString(types.Unalias(o.Type()), qual))
				continue
			}
			switch u := o.Type().Underlying().(type) {
			case *types.Struct:
				add("%s struct", head)
				for i := range u.NumFields() {
					if f := u.Field(i); f.Exported() {
						add("%s struct, %s %s", head, f.Name(), types.TypeString(f.Type(), qual))
					}
				}
			case *types.Interface:
				add("%s interface", head)
				for i := range u.NumMethods() {
					m := u.Method(i)
					if m.Exported() {
						add("%s interface, %s%s", head, m.Name(),
							strings.TrimPrefix(types.TypeString(m.Type(), qual), "func"))
					} else {
						add("%s interface, unexported methods", head)
					}
				}
			default:
				add("%s %s", head, types.TypeString(u, qual))
			}
			for _, recv := range []types.Type{o.Type(), types.NewPointer(o.Type())} {
				ms := types.NewMethodSet(recv)
				for i := range ms.Len() {
					sel := ms.At(i)
					m := sel.Obj().(*types.Func)
					if !m.Exported() || len(sel.Index()) > 1 { // promoted methods are listed on their own type
						continue
					}
					if _, isPtr := recv.(*types.Pointer); isPtr && types.NewMethodSet(o.Type()).Lookup(pkg, m.Name()) != nil {
						continue // value-receiver methods are listed once
					}
					if _, isIface := o.Type().Underlying().(*types.Interface); isIface {
						continue
					}
					r := name
					if _, isPtr := recv.(*types.Pointer); isPtr {
						r = "*" + name
					}
					add("method (%s) %s%s", r, m.Name(), strings.TrimPrefix(types.TypeString(m.Type(), qual), "func"))
				}
			}
		}
	}
	out = slices.Compact(out)
	return out
}

// The exported API of every library package is recorded in api/stagehand.txt, so an incompatible change is a
// deliberate, reviewed edit. After an intended change (see docs/versioning.md for what is breaking), regenerate it:
//
//	go test ./proof/docs -run TestAPIRecorded -update-api
func TestAPIRecorded(t *testing.T) {
	fset := token.NewFileSet()
	pkgs := libraryPackages(t)
	if len(pkgs) < 5 {
		t.Fatalf("found only %d library packages: %v", len(pkgs), pkgs)
	}
	imp := newImporter(t, fset, pkgs...)
	var lines []string
	for _, path := range pkgs {
		pkg, err := imp.Import(path)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, apiLines(pkg)...)
	}
	slices.Sort(lines)
	got := []byte(strings.Join(lines, "\n") + "\n")
	file := filepath.Join(repoRoot(t), "api", "stagehand.txt")
	if *updateAPI {
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v: generate it with go test ./proof/docs -run TestAPIRecorded -update-api", err)
	}
	if bytes.Equal(got, want) {
		return
	}
	wantLines := strings.Split(strings.TrimSuffix(string(want), "\n"), "\n")
	var removed, added []string
	for _, l := range wantLines {
		if _, found := slices.BinarySearch(lines, l); !found {
			removed = append(removed, "- "+l)
		}
	}
	slices.Sort(wantLines)
	for _, l := range lines {
		if _, found := slices.BinarySearch(wantLines, l); !found {
			added = append(added, "+ "+l)
		}
	}
	t.Errorf("the exported API differs from api/stagehand.txt. Removed or changed lines break users (docs/versioning.md);"+
		" if the change is intended, add it to CHANGELOG.md and regenerate the file with\n"+
		"\tgo test ./proof/docs -run TestAPIRecorded -update-api\n%s\n%s",
		strings.Join(removed, "\n"), strings.Join(added, "\n"))
}
