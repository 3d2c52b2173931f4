package docs_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

var mdLink = regexp.MustCompile(`\]\(([^)#\s]*)(#[^)\s]*)?\)`)

// Every relative link in a Markdown file points to a file or directory of the repository, and a link to a
// section of a Markdown file (its own, or another's) names a heading that file has.
func TestMarkdownLinksResolve(t *testing.T) {
	root := repoRoot(t)
	links := 0
	for _, md := range markdownFiles(t, root) {
		data, err := os.ReadFile(filepath.Join(root, md))
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range strings.Split(string(data), "\n") {
			for _, m := range mdLink.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				p := filepath.Join(root, filepath.Dir(md), filepath.FromSlash(target))
				if target == "" {
					p = filepath.Join(root, md)
				}
				if _, err := os.Stat(p); err != nil {
					t.Errorf("%s:%d: the link to %s points to nothing in the repository", md, i+1, target)
					continue
				}
				if anchor := strings.TrimPrefix(m[2], "#"); anchor != "" && strings.HasSuffix(p, ".md") &&
					!headingAnchors(t, p)[anchor] {
					t.Errorf("%s:%d: the link to %s#%s names no heading of that file", md, i+1, target, anchor)
				}
			}
		}
	}
	if links == 0 {
		t.Fatal("no relative links found: the check would prove nothing")
	}
}

// headingAnchors returns the anchors of a Markdown file's headings, as its renderer makes them: lower case, spaces
// as hyphens, punctuation other than hyphens and underscores dropped, a repeated anchor numbered (-1, -2, ...).
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	inFence := false
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "```") {
			inFence = !inFence
		}
		h, ok := strings.CutPrefix(strings.TrimLeft(l, "#"), " ")
		if inFence || !ok || !strings.HasPrefix(l, "#") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(h)) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		for n := 1; out[a]; n++ {
			a = fmt.Sprintf("%s-%d", b.String(), n)
		}
		out[a] = true
	}
	return out
}

// The anchors of headings follow the renderer's rule, including a repeated heading and punctuation.
func TestHeadingAnchors(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.md")
	text := "# Title\n## `outbox.Config` and *more*: yes\n```sh\n# not a heading\n```\n## Title\n### A-b_c d\n"
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	got := headingAnchors(t, p)
	for _, want := range []string{"title", "outboxconfig-and-more-yes", "title-1", "a-b_c-d"} {
		if !got[want] {
			t.Errorf("no anchor %q in %v", want, got)
		}
	}
	if got["not-a-heading"] || len(got) != 4 {
		t.Errorf("anchors %v: want exactly four, none from the fenced block", got)
	}
}

// unreadable are references to material outside the repository that users cannot read.
var unreadable = regexp.MustCompile(`\bDESIGN\.md\b|(?i:\bseeds?[ /]0\d\d\b)|\.\./shared\b|/work/shared\b`)

// No document, comment or migration cites material users cannot read: the repository stands alone, and its own
// design document is docs/design.md.
func TestNoReferencesOutsideTheRepository(t *testing.T) {
	root := repoRoot(t)
	files := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		switch filepath.Ext(p) {
		case ".md", ".go", ".sql":
		default:
			return nil
		}
		if strings.HasSuffix(p, "links_test.go") {
			return nil // this file names the patterns
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files++
		rel, _ := filepath.Rel(root, p)
		for i, l := range strings.Split(string(data), "\n") {
			if m := unreadable.FindString(l); m != "" {
				t.Errorf("%s:%d: cites %q, which users cannot read: point to docs/design.md or say it here", rel,
					i+1, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatal("no files checked")
	}
}
