// Package sqlfile reads the named SQL statements a package keeps in its embedded .sql files, and writes them out
// for one schema.
//
// A file is a list of statements and fragments, each introduced by a line of its own and running to the next one
// (comment lines just above an introducing line document what follows it):
//
//	-- name: claim
//	-- fragment: key_head
//
// Text is a template. {fragment} or {fragment arg=value ...} is replaced by the fragment's text, in which each
// {arg} is replaced by its value; fragments may use other fragments. Any other {marker} is filled by Expand from
// what the caller gives: raw template text first (a statement's variants: the relay's fence, say), identifiers
// last. Identifiers (a schema-qualified table name) go in in one final pass and are never read again, so a schema
// named like a marker cannot change a statement.
package sqlfile

import (
	"bufio"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"
)

// Set is the statements and fragments of a package's files.
type Set struct {
	statements map[string]string
	fragments  map[string]string
}

// Load reads every file of fsys matching pattern (fs.Glob).
func Load(fsys fs.FS, pattern string) (*Set, error) {
	names, err := fs.Glob(fsys, pattern)
	if err != nil {
		return nil, fmt.Errorf("sqlfile: %w", err)
	}
	s := &Set{statements: map[string]string{}, fragments: map[string]string{}}
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("sqlfile: %w", err)
		}
		if err := s.parse(name, string(b)); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// MustLoad is Load for embedded files, which a test of the package reads: it panics when they are broken.
func MustLoad(fsys fs.FS, pattern string) *Set {
	s, err := Load(fsys, pattern)
	if err != nil {
		panic(err)
	}
	return s
}

var intro = regexp.MustCompile(`^-- (name|fragment): ([a-z][a-z0-9_]*)\s*$`)

func (s *Set) parse(file, text string) error {
	var (
		kind, name string
		body       []string
	)
	flush := func() error {
		if name == "" {
			return nil
		}
		// Trailing comment lines document the next entry, not this one.
		for len(body) > 0 && (strings.TrimSpace(body[len(body)-1]) == "" ||
			strings.HasPrefix(strings.TrimSpace(body[len(body)-1]), "--")) {
			body = body[:len(body)-1]
		}
		text := strings.TrimSpace(strings.Join(body, "\n"))
		into := s.statements
		if kind == "fragment" {
			into = s.fragments
		}
		if _, dup := into[name]; dup {
			return fmt.Errorf("sqlfile: %s: %s %q defined twice", file, kind, name)
		}
		if text == "" {
			return fmt.Errorf("sqlfile: %s: %s %q is empty", file, kind, name)
		}
		into[name] = text
		return nil
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if m := intro.FindStringSubmatch(line); m != nil {
			if err := flush(); err != nil {
				return err
			}
			kind, name, body = m[1], m[2], nil
			continue
		}
		if name != "" {
			body = append(body, line)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("sqlfile: %s: %w", file, err)
	}
	return flush()
}

// Names lists the statements, sorted.
func (s *Set) Names() []string {
	out := make([]string, 0, len(s.statements))
	for n := range s.statements {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

var marker = regexp.MustCompile(`\{([a-z][a-z0-9_ ,]*?)((?: [a-z_]+=[^ {}]+)*)\}`)

// Expand writes statement name out: its fragments, then the raw template text of raw (marker → text), expanded
// until no fragment or raw marker is left, then the identifiers of idents (marker → text) in one pass. It fails on
// an unknown statement, and on a marker left unfilled.
func (s *Set) Expand(name string, raw, idents map[string]string) (string, error) {
	text, ok := s.statements[name]
	if !ok {
		return "", fmt.Errorf("sqlfile: no statement %q", name)
	}
	for range 16 {
		changed := false
		text = marker.ReplaceAllStringFunc(text, func(m string) string {
			sub := marker.FindStringSubmatch(m)
			key, args := sub[1], strings.Fields(sub[2])
			if body, ok := s.fragments[key]; ok {
				changed = true
				for _, a := range args {
					k, v, _ := strings.Cut(a, "=")
					body = strings.ReplaceAll(body, "{"+k+"}", v)
				}
				return body
			}
			if body, ok := raw[key]; ok && len(args) == 0 {
				changed = true
				return body
			}
			return m
		})
		if !changed {
			break
		}
	}
	pairs := make([]string, 0, 2*len(idents))
	for k, v := range idents {
		pairs = append(pairs, "{"+k+"}", v)
	}
	out := strings.NewReplacer(pairs...).Replace(text)
	// What is left of a marker is in the template text, before the identifiers went in.
	for _, m := range marker.FindAllString(text, -1) {
		if _, ok := idents[marker.FindStringSubmatch(m)[1]]; !ok {
			return "", fmt.Errorf("sqlfile: statement %q: %s is not filled", name, m)
		}
	}
	return out, nil
}
