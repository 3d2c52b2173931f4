package docs_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// snippetContext is what a README's snippets take as given: the variables and types the prose around them
// introduces. The snippets of one README are checked in order, each statement block nested inside the previous
// one, so a later block sees what an earlier one declared (and may shadow it).
type snippetContext struct {
	// pkgDir, when set, is a package (relative to the root) whose non-test files the snippets are checked with, so
	// they may use its unexported names. Otherwise the snippets form a package of their own.
	pkgDir string
	// prelude declares, at package level, what the snippets use without declaring.
	prelude string
	// excerptsOf, when set, is a package (relative to the root) the snippets are taken from: each must appear in
	// one of its Go files as it stands (line for line, indentation aside), so the document shows code that
	// compiles and runs in that package's tests, and cannot drift from it.
	excerptsOf string
}

var snippetContexts = map[string]snippetContext{
	"docs/getting-started.md": {excerptsOf: "examples/loans"},
	"README.md": {prelude: `
var (
	ctx            context.Context
	pool           *pgxpool.Pool
	logger         watermill.LoggerAdapter
	natsPublisher  message.Publisher
	natsSubscriber message.Subscriber
	t              *testing.T
)

var ErrInsufficientFunds = errors.New("insufficient funds")
`},
	"outbox/README.md": {prelude: `
var (
	ctx             context.Context
	pool            *pgxpool.Pool
	tx              pgx.Tx
	payload         []byte
	logger          watermill.LoggerAdapter
	kafkaPublisher  message.Publisher
	kafkaSubscriber message.Subscriber
	cfg             *outbox.RelayConfig
	id              string
	ids             []string
	position        int64
)

type OrderPlaced struct{ OrderID string }
`},
	"projection/README.md": {prelude: `
var (
	ctx     context.Context
	pool    *pgxpool.Pool
	tp      trace.TracerProvider
	mp      metric.MeterProvider
	handler   projection.Handler
	router    *message.Router
	sendEmail message.NoPublishHandlerFunc
)

type Opened struct{ Owner string }
type Deposited struct{ Amount int64 }
`},
	"health/README.md": {prelude: `
var (
	ob             *outbox.Outbox
	pool           *pgxpool.Pool
	store          *eventstore.PostgresStore
	schema         string
	deferredStager *staging.Worker
	logger         *slog.Logger
	myHooks        outbox.Hooks
)
`},
	"console/README.md": {prelude: `
var (
	ctx         context.Context
	pool        *pgxpool.Pool
	mux         *http.ServeMux
	csrfKey     []byte
	sessionUser func(*http.Request) (string, bool)
)
`},
	"examples/orders/README.md": {pkgDir: "examples/orders", prelude: `
var (
	ctx           context.Context
	pool          *pgxpool.Pool
	ob            *outbox.Outbox
	store         *eventstore.PostgresStore
	reg           *aggregate.Registry
	tbl           tables
	schema        string
	maps          mappings
	logger        *slog.Logger
	natsPublisher message.Publisher
)
`},
}

// snippetImports are the packages a snippet may use by their usual names; each is imported when referenced.
var snippetImports = map[string]string{
	"stagehand":     "github.com/stagehand-es/stagehand",
	"aggregate":     "github.com/stagehand-es/stagehand/aggregate",
	"aggregatetest": "github.com/stagehand-es/stagehand/aggregate/aggregatetest",
	"eventstore":    "github.com/stagehand-es/stagehand/eventstore",
	"staging":       "github.com/stagehand-es/stagehand/staging",
	"outbox":        "github.com/stagehand-es/stagehand/outbox",
	"projection":    "github.com/stagehand-es/stagehand/projection",
	"health":        "github.com/stagehand-es/stagehand/health",
	"console":       "github.com/stagehand-es/stagehand/console",
	"shred":         "github.com/stagehand-es/stagehand/shred",
	"watermill":     "github.com/ThreeDotsLabs/watermill",
	"message":       "github.com/ThreeDotsLabs/watermill/message",
	"pgx":           "github.com/jackc/pgx/v5",
	"pgxpool":       "github.com/jackc/pgx/v5/pgxpool",
	"nats":          "github.com/nats-io/nats.go",
	"jetstream":     "github.com/nats-io/nats.go/jetstream",
	"amqp":          "github.com/rabbitmq/amqp091-go",
	"trace":         "go.opentelemetry.io/otel/trace",
	"metric":        "go.opentelemetry.io/otel/metric",
	"context":       "context",
	"errors":        "errors",
	"fmt":           "fmt",
	"http":          "net/http",
	"log":           "log",
	"os":            "os",
	"slog":          "log/slog",
	"testing":       "testing",
	"time":          "time",
}

type snippet struct {
	line int // of the first line of code in the README
	code string
}

var fence = regexp.MustCompile("^```(\\w*)\\s*$")

// readmeSnippets returns the Go code blocks of a Markdown file.
func readmeSnippets(t *testing.T, path string) []snippet {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []snippet
	var cur *snippet
	for i, l := range strings.Split(string(data), "\n") {
		m := fence.FindStringSubmatch(l)
		switch {
		case cur == nil && m != nil && m[1] == "go":
			cur = &snippet{line: i + 2}
		case cur == nil && m != nil && m[1] != "":
			cur = &snippet{line: -1} // another language: skipped
		case cur == nil && m != nil:
			cur = &snippet{line: -1}
		case cur != nil && m != nil && m[1] == "":
			if cur.line > 0 {
				out = append(out, *cur)
			}
			cur = nil
		case cur != nil:
			cur.code += l + "\n"
		}
	}
	return out
}

// isDecl tells a block of top-level declarations (types, functions) from a block of statements.
func isDecl(code string) bool {
	for _, l := range strings.Split(code, "\n") {
		if l == "" || strings.HasPrefix(l, "//") || strings.HasPrefix(l, "\t") || strings.HasPrefix(l, " ") ||
			strings.HasPrefix(l, ")") || strings.HasPrefix(l, "}") {
			continue
		}
		for _, kw := range []string{"type ", "func ", "var ", "const ", "import "} {
			if strings.HasPrefix(l, kw) {
				return true
			}
		}
		return false
	}
	return false
}

// markdownFiles lists the repository's Markdown files (relative, slash-separated), skipping hidden directories.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// Every Go snippet in every Markdown file compiles against the current API: the snippets of one file are put
// together (declarations at package level, statement blocks nested in order in one function) over the variables
// their prose takes as given, and type-checked. Unused variables and imports are the only errors forgiven, since a
// snippet shows a call without always using its result.
func TestMarkdownSnippetsCompile(t *testing.T) {
	root := repoRoot(t)
	checked := 0
	for _, md := range markdownFiles(t, root) {
		snips := readmeSnippets(t, filepath.Join(root, md))
		if len(snips) == 0 {
			continue
		}
		sc, ok := snippetContexts[md]
		if !ok {
			t.Errorf("%s has Go snippets but no entry in snippetContexts (proof/docs/snippets_test.go): add one "+
				"declaring what they take as given", md)
			continue
		}
		t.Run(md, func(t *testing.T) {
			if sc.excerptsOf != "" {
				checkExcerpts(t, root, md, sc.excerptsOf, snips)
				return
			}
			checkSnippets(t, root, md, sc, snips)
		})
		checked += len(snips)
	}
	if checked == 0 {
		t.Fatal("no Go snippets found: the check would prove nothing")
	}
}

func checkSnippets(t *testing.T, root, md string, sc snippetContext, snips []snippet) {
	fset := token.NewFileSet()
	var all strings.Builder
	all.WriteString(sc.prelude)
	for _, s := range snips {
		all.WriteString(s.code)
	}
	var src strings.Builder
	pkgName, pkgPath := "snippets", "example.com/snippets"
	var pkgFiles []*ast.File
	var imports []string
	if sc.pkgDir != "" {
		pkgFiles = parseDir(t, fset, filepath.Join(root, sc.pkgDir))
		pkgName = pkgFiles[0].Name.Name
		pkgPath = "github.com/stagehand-es/stagehand/" + sc.pkgDir
		for _, f := range pkgFiles {
			for _, im := range f.Imports {
				imports = append(imports, strings.Trim(im.Path.Value, `"`))
			}
		}
	}
	fmt.Fprintf(&src, "package %s\n\nimport (\n", pkgName)
	for name, path := range snippetImports {
		if regexp.MustCompile(`\b` + name + `\.`).MatchString(all.String()) {
			fmt.Fprintf(&src, "\t%s %q\n", name, path)
			imports = append(imports, path)
		}
	}
	src.WriteString(")\n")
	src.WriteString(sc.prelude)
	var body strings.Builder
	depth := 0
	for _, s := range snips {
		if isDecl(s.code) {
			fmt.Fprintf(&src, "\n//line %s:%d\n%s", md, s.line, s.code)
			continue
		}
		fmt.Fprintf(&body, "{\n//line %s:%d\n%s", md, s.line, s.code)
		depth++
	}
	if depth > 0 {
		fmt.Fprintf(&src, "\nfunc _() {\n%s%s}\n", body.String(), strings.Repeat("}\n", depth))
	}
	f, err := parser.ParseFile(fset, "snippets.go", src.String(), 0)
	if err != nil {
		t.Fatalf("%s: a snippet does not parse: %v", md, err)
	}
	var errs []string
	conf := types.Config{
		Importer: newImporter(t, fset, imports...),
		Error: func(err error) {
			msg := err.Error()
			if strings.Contains(msg, "declared and not used") || strings.Contains(msg, "imported and not used") {
				return
			}
			errs = append(errs, msg)
		},
	}
	_, _ = conf.Check(pkgPath, fset, append(pkgFiles, f), nil)
	for _, e := range errs {
		t.Errorf("snippet does not compile: %s", e)
	}
}

// checkExcerpts fails for each snippet that is not an excerpt of dir's Go files (see excerptProblems).
func checkExcerpts(t *testing.T, root, md, dir string, snips []snippet) {
	t.Helper()
	problems, err := excerptProblems(root, md, dir, snips)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// excerptProblems names each snippet that is not a run of whole lines of one of dir's Go files (each line compared
// without its leading and trailing white space, blank lines included).
func excerptProblems(root, md, dir string, snips []snippet) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("%s: no Go files in %s to take excerpts from (%v)", md, dir, err)
	}
	norm := func(text string) string {
		var b strings.Builder
		for _, l := range strings.Split(strings.Trim(text, "\n"), "\n") {
			b.WriteString("\n" + strings.TrimSpace(l))
		}
		return b.String() + "\n"
	}
	var sources []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		sources = append(sources, norm(string(data)))
	}
	var problems []string
	for _, s := range snips {
		want := norm(s.code)
		if !slices.ContainsFunc(sources, func(src string) bool { return strings.Contains(src, want) }) {
			problems = append(problems, fmt.Sprintf("%s:%d: this snippet is not an excerpt of %s (copy it from "+
				"there as it stands):\n%s", md, s.line, dir, s.code))
		}
	}
	return problems, nil
}

// The excerpt check passes a snippet copied from the package and fails one changed by a single token, or made of
// two pieces that are not adjacent in the source.
func TestExcerptCheckCatchesDrift(t *testing.T) {
	root := repoRoot(t)
	src, err := os.ReadFile(filepath.Join(root, "examples/loans/domain.go"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(src), "\n")
	var start int
	for i, l := range lines {
		if strings.HasPrefix(l, "func (l *Loan) Return() error {") {
			start = i
		}
	}
	if start == 0 {
		t.Fatal("examples/loans/domain.go has no Loan.Return to take an excerpt of")
	}
	good := strings.Join(lines[start:start+6], "\n") + "\n"
	changed := strings.Replace(good, "LoanReturned", "LoanClosed", 1)
	spliced := strings.Join(append([]string{lines[start]}, lines[start+2:start+6]...), "\n") + "\n"
	problems, err := excerptProblems(root, "test.md", "examples/loans",
		[]snippet{{line: 1, code: good}, {line: 2, code: changed}, {line: 3, code: spliced}})
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != 2 || !strings.HasPrefix(problems[0], "test.md:2:") || !strings.HasPrefix(problems[1], "test.md:3:") {
		t.Fatalf("want the changed and the spliced snippets reported, got %q", problems)
	}
}
