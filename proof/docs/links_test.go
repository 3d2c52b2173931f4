package docs_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var mdLink = regexp.MustCompile(`\]\(([^)#\s]+)(#[^)\s]*)?\)`)

// Every relative link in a Markdown file points to a file or directory of the repository.
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
				if _, err := os.Stat(p); err != nil {
					t.Errorf("%s:%d: the link to %s points to nothing in the repository", md, i+1, target)
				}
			}
		}
	}
	if links == 0 {
		t.Fatal("no relative links found: the check would prove nothing")
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
