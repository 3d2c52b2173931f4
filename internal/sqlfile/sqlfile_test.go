package sqlfile_test

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stagehand-es/stagehand/internal/sqlfile"
)

const file = `-- A file's header says what it holds.

-- The head of a key.
-- fragment: head
(SELECT seq FROM {table} WHERE key = {key} LIMIT 1)

-- name: probe
SELECT {head key=$1} IS NOT NULL{mode}

-- name: twice
SELECT {head key=$1}, {head key=$2}
`

func set(t *testing.T, files map[string]string) *sqlfile.Set {
	t.Helper()
	fs := fstest.MapFS{}
	for name, text := range files {
		fs[name] = &fstest.MapFile{Data: []byte(text)}
	}
	s, err := sqlfile.Load(fs, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestExpandsFragmentsThenVariantsThenIdentifiersOnce(t *testing.T) {
	s := set(t, map[string]string{"a.sql": file})
	if got := strings.Join(s.Names(), ","); got != "probe,twice" {
		t.Fatalf("statements %q", got)
	}
	// The schema is named like a marker: identifiers go in last and are never read again.
	idents := map[string]string{"table": `"{mode}"."t"`}
	got, err := s.Expand("probe", map[string]string{"mode": " AND {head key=$2} > 0"}, idents)
	if err != nil {
		t.Fatal(err)
	}
	want := `SELECT (SELECT seq FROM "{mode}"."t" WHERE key = $1 LIMIT 1) IS NOT NULL AND ` +
		`(SELECT seq FROM "{mode}"."t" WHERE key = $2 LIMIT 1) > 0`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	got, err = s.Expand("twice", nil, idents)
	if err != nil || !strings.Contains(got, "key = $1") || !strings.Contains(got, "key = $2") {
		t.Fatalf("a fragment used twice with other arguments: %s (%v)", got, err)
	}
}

func TestRefusesWhatCannotBeWrittenOut(t *testing.T) {
	s := set(t, map[string]string{"a.sql": file})
	if _, err := s.Expand("probe", nil, map[string]string{"table": "t"}); err == nil ||
		!strings.Contains(err.Error(), "{mode}") {
		t.Fatalf("an unfilled marker must be named: %v", err)
	}
	if _, err := s.Expand("missing", nil, nil); err == nil {
		t.Fatal("an unknown statement must fail")
	}
	for name, text := range map[string]string{
		"twice": "-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n",
		"empty": "-- name: a\n-- a comment only\n",
		"frag":  "-- fragment: f\nx\n-- fragment: f\ny\n",
	} {
		fs := fstest.MapFS{"x.sql": &fstest.MapFile{Data: []byte(text)}}
		if _, err := sqlfile.Load(fs, "*.sql"); err == nil {
			t.Errorf("%s: loaded a broken file", name)
		}
	}
}
