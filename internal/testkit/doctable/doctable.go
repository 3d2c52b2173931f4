// Package doctable checks the configuration tables of the repository's Markdown files against the code: every
// exported field of a configuration struct has a row, every row names a field that exists, and the default a row
// states is the value the code applies to a zero configuration. Each package's tests call it for its own tables,
// since only the package can apply its defaults.
package doctable

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Table is one Markdown table: its rows, each naming one or more fields in its first cell.
type Table struct {
	File   string // as given to Find
	Marker string // the text the table follows
	Line   int    // of its header row
	Rows   []Row
	// DefaultColumn is the index of the column headed "default" (case-insensitive), -1 when there is none.
	DefaultColumn int
}

// Row is one row of a Table.
type Row struct {
	Line    int
	Names   []string // the backticked names of its first cell
	Default string   // its default cell, "" when the table has no default column
}

var backticked = regexp.MustCompile("`([^`]+)`")

// Find returns the first table that follows the first line containing marker in file. It fails the test when there
// is no such line or table.
func Find(t testing.TB, file, marker string) Table {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("doctable: %v", err)
	}
	lines := strings.Split(string(data), "\n")
	start := -1
	for i, l := range lines {
		if strings.Contains(l, marker) {
			start = i
			break
		}
	}
	if start < 0 {
		t.Fatalf("doctable: %s has no line containing %q: the configuration table the test checks was moved or "+
			"retitled; update the marker in the test", file, marker)
	}
	tbl := Table{File: file, Marker: marker, DefaultColumn: -1}
	for i := start; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, "|") {
			if tbl.Line != 0 {
				break
			}
			continue
		}
		cells := splitRow(l)
		switch {
		case tbl.Line == 0:
			tbl.Line = i + 1
			for c, h := range cells {
				if strings.EqualFold(strings.TrimSpace(h), "default") {
					tbl.DefaultColumn = c
				}
			}
		case strings.Trim(l, "|- :") == "":
			// the separator row
		default:
			r := Row{Line: i + 1}
			for _, m := range backticked.FindAllStringSubmatch(cells[0], -1) {
				r.Names = append(r.Names, m[1])
			}
			if tbl.DefaultColumn >= 0 && tbl.DefaultColumn < len(cells) {
				r.Default = strings.TrimSpace(cells[tbl.DefaultColumn])
			}
			tbl.Rows = append(tbl.Rows, r)
		}
	}
	if tbl.Line == 0 {
		t.Fatalf("doctable: %s: no table after the line containing %q", file, marker)
	}
	return tbl
}

func splitRow(l string) []string {
	l = strings.TrimSuffix(strings.TrimPrefix(l, "|"), "|")
	return strings.Split(l, "|")
}

// Check compares tbl with the exported fields of the struct typ. Rows whose names start with prefix (such as
// "Config.") are the ones for typ; the prefix is "" when the table holds one struct. applied maps field names to the
// value the code applies to a zero configuration; a field absent from it (a function, a logger, a default computed
// from other fields) is only required to have a row.
func Check(t testing.TB, tbl Table, typ reflect.Type, prefix string, applied map[string]any) {
	t.Helper()
	where := func(line int) string { return fmt.Sprintf("%s:%d (the table after %q)", tbl.File, line, tbl.Marker) }
	rows := map[string]Row{}
	for _, r := range tbl.Rows {
		for _, n := range r.Names {
			if prefix != "" {
				if !strings.HasPrefix(n, prefix) {
					continue
				}
				n = strings.TrimPrefix(n, prefix)
			}
			rows[n] = r
		}
	}
	fields := map[string]reflect.StructField{}
	for i := range typ.NumField() {
		if f := typ.Field(i); f.IsExported() {
			fields[f.Name] = f
			if _, ok := rows[f.Name]; !ok {
				t.Errorf("%s: %s.%s has no row: add a row for %s%s with its default", where(tbl.Line), typ.Name(),
					f.Name, prefix, f.Name)
			}
		}
	}
	for n, r := range rows {
		if _, ok := fields[n]; !ok {
			t.Errorf("%s: the row names %s%s, which %s does not have (renamed or removed?)", where(r.Line), prefix,
				n, typ.Name())
		}
	}
	for n, v := range applied {
		if _, ok := fields[n]; !ok {
			t.Errorf("doctable: the test gives a default for %s.%s, which does not exist", typ.Name(), n)
			continue
		}
		r, ok := rows[n]
		if !ok || tbl.DefaultColumn < 0 {
			continue
		}
		want := Format(v)
		part := r.Default
		if parts := strings.Split(part, ","); len(r.Names) > 1 && len(parts) == len(r.Names) {
			for i, name := range r.Names {
				if strings.TrimPrefix(name, prefix) == n {
					part = parts[i]
				}
			}
		}
		if !mentions(part, want, reflect.ValueOf(v)) {
			t.Errorf("%s: %s.%s: the table's default is %q, but the code applies %s: update the row or the code",
				where(r.Line), typ.Name(), n, r.Default, want)
		}
	}
}

var token = regexp.MustCompile(`[A-Za-z0-9_.\-]+`)

// mentions tells whether the default cell states value: as one of its tokens, or, for a zero value, in a word
// that means "nothing".
func mentions(cell, want string, v reflect.Value) bool {
	for _, tok := range token.FindAllString(cell, -1) {
		if strings.EqualFold(tok, want) || strings.EqualFold(strings.TrimSuffix(tok, "."), want) {
			return true
		}
	}
	if v.IsValid() && v.IsZero() {
		c := strings.ToLower(cell)
		for _, w := range []string{"none", "off", `""`, "false", "empty", "no "} {
			if strings.Contains(c, w) {
				return true
			}
		}
	}
	return false
}

// Format writes a default as the tables do: durations short (1m, not 1m0s), pointers followed.
func Format(v any) string {
	rv := reflect.ValueOf(v)
	for rv.IsValid() && rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return "nil"
		}
		rv = rv.Elem()
	}
	if !rv.IsValid() {
		return "nil"
	}
	if d, ok := rv.Interface().(time.Duration); ok {
		s := d.String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		return s
	}
	switch rv.Kind() {
	case reflect.Float32, reflect.Float64:
		return strconv.FormatFloat(rv.Float(), 'g', -1, 64)
	case reflect.String:
		return rv.String()
	}
	if s, ok := rv.Interface().(fmt.Stringer); ok {
		return s.String()
	}
	return fmt.Sprint(rv.Interface())
}
