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
	// goTestCommand is a `go test` command on one line: the directory a "cd dir &&" before it changes to
	// (optional), and the rest of the command.
	goTestCommand = regexp.MustCompile(`(?:cd\s+([^\s&]+)\s*&&\s*)?go test\b([^` + "`" + `\n]*)`)
	// patternFlag is a -run or -bench flag of such a command, with its pattern quoted or not.
	patternFlag = regexp.MustCompile(`-(run|bench)[ =](?:'([^']*)'|"([^"]*)"|(\S+))`)
	fencedBlock = regexp.MustCompile("(?s)```.*?```")
	inlineCode  = regexp.MustCompile("`[^`]+`")
)

// Every `go test` command in the documentation (Markdown, and the doc comments of Go files) that selects tests or
// benchmarks names ones that exist: the first element of its -bench pattern matches a Benchmark function of the
// package it runs, and that of its -run pattern (other than '^$') a Test, Example or Fuzz function. A benchmark or a
// test renamed or removed while a document still quotes its command (and its figures) fails here.
func TestTestCommandsNameWhatExists(t *testing.T) {
	root := repoRoot(t)
	checked := 0
	check := func(file, text string) {
		for _, m := range goTestCommand.FindAllStringSubmatch(text, -1) {
			flags := patternFlag.FindAllStringSubmatch(m[2], -1)
			if len(flags) == 0 {
				continue
			}
			pkg := ""
			for _, f := range strings.Fields(patternFlag.ReplaceAllString(m[2], " ")) {
				if f == "." || strings.HasPrefix(f, "./") {
					pkg = f
					break
				}
			}
			if m[1] != "" {
				pkg = filepath.Join(m[1], pkg)
			}
			tree := strings.HasSuffix(pkg, "/...") // every package under the directory
			dir, ok := packageDir(root, filepath.Dir(file), strings.TrimSuffix(pkg, "/..."))
			if !ok {
				t.Errorf("%s: %q: no package directory %q", file, m[0], pkg)
				continue
			}
			funcs := testFuncs(t, filepath.Join(root, dir), tree)
			for _, f := range flags {
				pattern := f[2] + f[3] + f[4]
				if f[1] == "run" && pattern == "^$" {
					continue
				}
				re, err := regexp.Compile(strings.SplitN(pattern, "/", 2)[0])
				if err != nil {
					t.Errorf("%s: %q: the -%s pattern does not compile: %v", file, m[0], f[1], err)
					continue
				}
				kinds := map[string][]string{"bench": {"Benchmark"}, "run": {"Test", "Example", "Fuzz"}}[f[1]]
				var names []string
				found := false
				for _, kind := range kinds {
					for _, n := range funcs[kind] {
						names = append(names, n)
						found = found || re.MatchString(n)
					}
				}
				if !found {
					t.Errorf("%s: %q: -%s %s selects nothing in %s (it has %v)", file, m[0], f[1], pattern, dir, names)
				}
				checked++
			}
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
	t.Logf("%d test and benchmark selections checked", checked)
	if checked < 30 {
		t.Fatalf("only %d test and benchmark selections found: the check would prove little", checked)
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

// testFuncs returns the names of the Test, Benchmark, Example and Fuzz functions in the test files of dir (and with
// tree, of every directory under it), by kind.
func testFuncs(t *testing.T, dir string, tree bool) map[string][]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	if tree {
		files = nil
		err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(p, "_test.go") {
				files = append(files, p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	funcs := map[string][]string{}
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv != nil {
				continue
			}
			for _, kind := range []string{"Test", "Benchmark", "Example", "Fuzz"} {
				if strings.HasPrefix(fd.Name.Name, kind) {
					funcs[kind] = append(funcs[kind], fd.Name.Name)
				}
			}
		}
	}
	return funcs
}
