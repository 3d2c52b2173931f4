package docs_test

import (
	"go/ast"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// instrument is one metric the library creates, as read from its source.
type instrument struct {
	name, kind, unit, where string
}

// telemetryConsts maps the names of internal/telemetry's string constants (metric names, attribute keys) to their
// values.
func telemetryConsts(t *testing.T, root string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	out := map[string]string{}
	for _, f := range parseDir(t, fset, filepath.Join(root, "internal", "telemetry")) {
		ast.Inspect(f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, name := range vs.Names {
				if i >= len(vs.Values) {
					continue
				}
				v := vs.Values[i]
				if call, ok := v.(*ast.CallExpr); ok && len(call.Args) == 1 { // attribute.Key("...")
					v = call.Args[0]
				}
				if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					out[name.Name], _ = strconv.Unquote(lit.Value)
				}
			}
			return true
		})
	}
	return out
}

var kinds = map[string]string{
	"Int64Counter": "counter", "Float64Counter": "counter", "Int64UpDownCounter": "updowncounter",
	"Float64Histogram": "histogram", "Int64Histogram": "histogram", "Int64ObservableGauge": "gauge",
	"Float64ObservableGauge": "gauge", "Int64Gauge": "gauge", "Float64Gauge": "gauge",
	"Int64ObservableCounter": "counter", "Float64ObservableCounter": "counter",
}

// libraryInstruments finds every instrument creation in the library's non-test code: a call of a meter's
// instrument method (or of telemetry.Int64Counter) whose name argument is a telemetry.Metric constant.
func libraryInstruments(t *testing.T, root string, consts map[string]string) []instrument {
	t.Helper()
	fset := token.NewFileSet()
	var out []instrument
	for _, pkg := range libraryPackages(t) {
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, "github.com/stagehand-es/stagehand"), "/")
		for _, f := range parseDir(t, fset, filepath.Join(root, filepath.FromSlash(rel))) {
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				kind, ok := kinds[sel.Sel.Name]
				if !ok {
					return true
				}
				args := call.Args
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "telemetry" && len(args) == 4 {
					args = args[1:] // telemetry.Int64Counter(meter, name, description, unit)
				}
				if len(args) == 0 {
					return true
				}
				nameSel, ok := args[0].(*ast.SelectorExpr)
				if !ok || !strings.HasPrefix(nameSel.Sel.Name, "Metric") {
					return true
				}
				in := instrument{name: consts[nameSel.Sel.Name], kind: kind, where: fset.Position(call.Pos()).String()}
				for _, a := range args[1:] {
					if lit, ok := a.(*ast.BasicLit); ok && len(args) == 3 {
						in.unit, _ = strconv.Unquote(lit.Value) // the helper's unit argument
					}
					if c, ok := a.(*ast.CallExpr); ok {
						if s, ok := c.Fun.(*ast.SelectorExpr); ok && s.Sel.Name == "WithUnit" && len(c.Args) == 1 {
							if lit, ok := c.Args[0].(*ast.BasicLit); ok {
								in.unit, _ = strconv.Unquote(lit.Value)
							}
						}
					}
				}
				out = append(out, in)
				return true
			})
		}
	}
	return out
}

// docs/metrics.md lists every metric the library creates, with its instrument and unit, and no other; the
// attributes it names are attribute keys the library defines.
func TestMetricsList(t *testing.T) {
	root := repoRoot(t)
	consts := telemetryConsts(t, root)
	created := libraryInstruments(t, root, consts)
	if len(created) < 5 {
		t.Fatalf("found only %d instruments in the library's code: the scan is broken", len(created))
	}
	attrKeys := map[string]bool{}
	for name, v := range consts {
		if strings.HasPrefix(name, "Attr") {
			attrKeys[v] = true
		}
	}
	data, err := os.ReadFile(filepath.Join(root, "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		kind, unit string
		attrs      []string
		line       int
	}
	rows := map[string]row{}
	tick := regexp.MustCompile("`([^`]+)`")
	for i, l := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(l, "| `stagehand.") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		if len(cells) < 5 {
			t.Errorf("docs/metrics.md:%d: a row needs metric, instrument, unit, attributes and meaning", i+1)
			continue
		}
		r := row{kind: strings.TrimSpace(cells[1]), unit: strings.Trim(strings.TrimSpace(cells[2]), "`"), line: i + 1}
		for _, m := range tick.FindAllStringSubmatch(cells[3], -1) {
			r.attrs = append(r.attrs, m[1])
		}
		rows[strings.Trim(strings.TrimSpace(cells[0]), "`")] = r
	}
	seen := map[string]bool{}
	for _, in := range created {
		seen[in.name] = true
		r, ok := rows[in.name]
		switch {
		case !ok:
			t.Errorf("%s creates %s (%s, unit %q), which docs/metrics.md does not list: add a row", in.where,
				in.name, in.kind, in.unit)
		case r.kind != in.kind || r.unit != in.unit:
			t.Errorf("docs/metrics.md:%d: %s is listed as a %s in %q, but %s creates a %s in %q", r.line, in.name,
				r.kind, r.unit, in.where, in.kind, in.unit)
		}
	}
	var names []string
	for name, r := range rows {
		names = append(names, name)
		if !seen[name] {
			t.Errorf("docs/metrics.md:%d: %s is listed, but the library creates no such metric", r.line, name)
		}
		for _, a := range r.attrs {
			if !attrKeys[a] {
				t.Errorf("docs/metrics.md:%d: %s's attribute %s is not an attribute key of internal/telemetry",
					r.line, name, a)
			}
		}
	}
	slices.Sort(names)
	t.Logf("%d metrics listed: %s", len(names), strings.Join(names, ", "))
}
