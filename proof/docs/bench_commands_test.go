package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// benchCommand is a `go test` command with a -bench pattern, on one line: the directory a "cd dir &&" before it
	// changes to, its package path (both optional) and the pattern, quoted or not.
	benchCommand = regexp.MustCompile(`(?:cd\s+([^\s&]+)\s*&&\s*)?go test((?:\s+-[a-z]+)*\s+\.(?:/[^\s` + "`" +
		`'"]*)?)?[^` + "`" + `\n]*?-bench[ =]` +
		`(?:'([^']*)'|"([^"]*)"|([^\s` + "`" + `]+))`)
	fencedBlock = regexp.MustCompile("(?s)```.*?```")
	inlineCode  = regexp.MustCompile("`[^`]+`")
)

// Every benchmark command in the documentation (Markdown, and the doc comments of Go files) names benchmarks that
// exist: the first element of its -bench pattern matches a Benchmark function of the package it runs. A benchmark
// renamed or removed while a document still quotes its figures and its command fails here.
func TestBenchmarkCommandsNameBenchmarks(t *testing.T) {
	root := repoRoot(t)
	checked := 0
	check := func(file, text string) {
		for _, m := range benchCommand.FindAllStringSubmatch(text, -1) {
			pkg := strings.TrimSpace(m[2])
			if i := strings.LastIndex(pkg, " "); i >= 0 {
				pkg = pkg[i+1:] // after flags such as -race
			}
			if m[1] != "" {
				pkg = filepath.Join(m[1], pkg)
			}
			pattern := m[3] + m[4] + m[5]
			dir, ok := packageDir(root, filepath.Dir(file), pkg)
			if !ok {
				t.Errorf("%s: %q: no package directory %q", file, m[0], pkg)
				continue
			}
			first := strings.SplitN(pattern, "/", 2)[0]
			re, err := regexp.Compile(first)
			if err != nil {
				t.Errorf("%s: %q: the -bench pattern does not compile: %v", file, m[0], err)
				continue
			}
			names := benchmarks(t, filepath.Join(root, dir))
			found := false
			for _, n := range names {
				found = found || re.MatchString(n)
			}
			if !found {
				t.Errorf("%s: %q names no benchmark of %s (it has %v)", file, m[0], dir, names)
			}
			checked++
		}
	}
	for _, md := range markdownFiles(t, root) {
		data, err := os.ReadFile(filepath.Join(root, md))
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		// Fenced blocks line by line; inline code spans with the prose's line breaks undone (a command may wrap).
		for _, block := range fencedBlock.FindAllString(text, -1) {
			check(md, block)
		}
		for _, span := range inlineCode.FindAllString(fencedBlock.ReplaceAllString(text, ""), -1) {
			check(md, strings.Join(strings.Fields(span), " "))
		}
	}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var comments []string
		for _, l := range strings.Split(string(data), "\n") {
			if c, ok := strings.CutPrefix(strings.TrimSpace(l), "//"); ok {
				comments = append(comments, c)
			}
		}
		check(filepath.ToSlash(rel), strings.Join(comments, "\n"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d benchmark commands checked", checked)
	if checked < 20 {
		t.Fatalf("only %d benchmark commands found: the check would prove little", checked)
	}
}

// packageDir resolves a command's package path (empty: the document's own directory) to a directory relative to
// root: from the repository's root, or from the document's directory or one above it (a module's README runs its
// commands from the module's directory).
func packageDir(root, docDir, pkg string) (string, bool) {
	if pkg == "" {
		pkg = "."
	}
	for dir := docDir; ; dir = filepath.Dir(dir) {
		cand := filepath.Join(dir, filepath.FromSlash(pkg))
		if st, err := os.Stat(filepath.Join(root, cand)); err == nil && st.IsDir() {
			return cand, true
		}
		if dir == "." || dir == "/" {
			return "", false
		}
	}
}

// benchmarks returns the names of the Benchmark functions in the test files of dir.
func benchmarks(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "Benchmark") {
				names = append(names, fd.Name.Name)
			}
		}
	}
	return names
}
