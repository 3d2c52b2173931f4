package docs_test

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// repoRoot is the repository's root directory (this file is in proof/docs).
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// goCmd runs the go command in the repository's workspace (go.work joins every module), whatever GOWORK the test
// runs under, and returns its standard output.
func goCmd(t testing.TB, args ...string) []byte {
	t.Helper()
	root := repoRoot(t)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(root, "go.work"), "GOFLAGS=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// exports maps import paths to compiled export data, for type-checking code that imports them.
type exports struct {
	mu    sync.Mutex
	files map[string]string
}

var allExports exports

// importer returns a types.Importer for the packages and the dependencies of pkgs, compiled once by the go
// command (export data from the build cache).
func newImporter(t testing.TB, fset *token.FileSet, pkgs ...string) types.Importer {
	t.Helper()
	allExports.mu.Lock()
	defer allExports.mu.Unlock()
	if allExports.files == nil {
		allExports.files = map[string]string{}
	}
	var missing []string
	for _, p := range pkgs {
		if _, ok := allExports.files[p]; !ok {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		out := goCmd(t, append([]string{"list", "-e", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}"},
			missing...)...)
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			path, file, ok := strings.Cut(sc.Text(), "\t")
			if ok && file != "" {
				allExports.files[path] = file
			}
		}
	}
	files := allExports.files
	return importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := files[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %q (add it to the packages the check loads)", path)
		}
		return os.Open(f)
	})
}

// parseDir parses the non-test Go files of one package directory.
func parseDir(t testing.TB, fset *token.FileSet, dir string) []*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}
