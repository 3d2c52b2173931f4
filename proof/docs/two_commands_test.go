package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README opens with the two commands a newcomer runs: the demo, and the tests. The test command must be what CI
// runs (so a fresh machine passes it as CI does), and it must set up what the tests need itself: the make target
// runs scripts/test-deps before the tests of every module.
func TestReadmeOpensWithTheCommandsCIRuns(t *testing.T) {
	root := repoRoot(t)
	readme := read(t, root, "README.md")
	block := regexp.MustCompile("(?s)```sh\n(.*?)```").FindStringSubmatch(readme)
	if block == nil || strings.Index(readme, block[0]) > strings.Index(readme, "\n## ") {
		t.Fatal("README.md: no sh block before its first section: it must open with the two commands")
	}
	var cmds []string
	for _, l := range strings.Split(block[1], "\n") {
		if c := strings.TrimSpace(strings.SplitN(l, "#", 2)[0]); c != "" {
			cmds = append(cmds, c)
		}
	}
	if len(cmds) != 2 || !strings.HasPrefix(cmds[0], "go run ./examples/") {
		t.Fatalf("README.md opens with %q: want the demo (go run ./examples/<name>) and the test command", cmds)
	}
	testCmd := cmds[1]
	if testCmd != "make test" {
		t.Fatalf("README.md's test command is %q; this check knows make test (update it with the command)", testCmd)
	}
	ci := read(t, root, ".ci/run")
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(testCmd) + `$`).MatchString(ci) {
		t.Errorf(".ci/run does not run the README's test command %q on a line of its own", testCmd)
	}
	mk := read(t, root, "Makefile")
	target := regexp.MustCompile(`(?ms)^test:([^\n]*)\n((?:\t[^\n]*\n)+)`).FindStringSubmatch(mk)
	if target == nil {
		t.Fatal("Makefile: no test target")
	}
	if !strings.Contains(target[1], "test-deps") || !strings.Contains(mk, "bash scripts/test-deps") {
		t.Errorf("Makefile: the test target does not install what the tests need first (test-deps): %q", target[0])
	}
	if !strings.Contains(target[2], "go test -race work") {
		t.Errorf("Makefile: the test target does not run the tests of every module (go test -race work): %q", target[0])
	}
	if demo := regexp.MustCompile(`(?m)^demo:\n\t(.*)$`).FindStringSubmatch(mk); demo == nil || demo[1] != cmds[0] {
		t.Errorf("Makefile: the demo target is not the README's demo command %q", cmds[0])
	}
}

func read(t *testing.T, root, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
