package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/names"
	"github.com/stagehand-es/stagehand/outbox"
)

// Exit codes.
const (
	exitOK          = 0
	exitFailure     = 1   // the command ran and failed
	exitUsage       = 2   // the command line is wrong: nothing was done
	exitInterrupted = 130 // stopped by Ctrl-C (or SIGTERM) before the work was done
)

// envDatabaseURL is read when --database-url is not given.
const envDatabaseURL = "DATABASE_URL"

// options are the process-level inputs run takes from the environment; tests replace them.
type options struct {
	// getenv reads an environment variable.
	getenv func(string) string
	// isTerminal reports whether a writer is a terminal (progress bars are drawn only then).
	isTerminal func(io.Writer) bool
	// stdin is where confirmations are read (os.Stdin), when isInputTerminal says it is a terminal.
	stdin           io.Reader
	isInputTerminal func(io.Reader) bool
	// followIdle, when set, is called each time events tail --follow has read everything and starts waiting
	// (tests use it to append only once the command waits).
	followIdle func()
}

// run executes the command line args and returns the process exit code. Output goes to stdout, failures (one
// line each) to stderr. Cancelling ctx stops the command.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runWith(ctx, args, stdout, stderr, options{getenv: os.Getenv, isTerminal: isTerminal, stdin: os.Stdin,
		isInputTerminal: isInputTerminal})
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}

// app holds one invocation's flags and the resources it opened; nothing outlives it.
type app struct {
	opts           options
	stdout, stderr io.Writer

	// Global flags.
	databaseURL string
	schema      string
	json        bool

	// Opened on first use, closed by close.
	pool    *pgxpool.Pool
	closers []func()
}

func runWith(ctx context.Context, args []string, stdout, stderr io.Writer, opts options) int {
	if opts.getenv == nil {
		opts.getenv = func(string) string { return "" }
	}
	if opts.isTerminal == nil {
		opts.isTerminal = func(io.Writer) bool { return false }
	}
	if opts.isInputTerminal == nil {
		opts.isInputTerminal = func(io.Reader) bool { return false }
	}
	a := &app{opts: opts, stdout: stdout, stderr: stderr}
	defer a.close()
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	return a.report(ctx, cmd, err)
}

// report prints the one-line message for err and returns the exit code.
func (a *app) report(ctx context.Context, cmd *cobra.Command, err error) int {
	var re *runtimeError
	if errors.As(err, &re) {
		if ctx.Err() != nil {
			fmt.Fprintf(a.stderr, "stagehand: interrupted: %s\n", oneLine(re.err))
			return exitInterrupted
		}
		fmt.Fprintf(a.stderr, "stagehand: %s\n", oneLine(re.err))
		return exitFailure
	}
	path := "stagehand"
	if cmd != nil {
		path = cmd.CommandPath()
	}
	fmt.Fprintf(a.stderr, "stagehand: %s (see '%s --help')\n", oneLine(err), path)
	return exitUsage
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// usageError is a wrong command line: an unknown command or flag, a bad argument, a missing input.
// Every error that is not a runtimeError counts as one (cobra's own parsing errors included).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

// runtimeError is a failure of a command that was understood: the database, a missing dead letter, ...
type runtimeError struct{ err error }

func (e *runtimeError) Error() string { return e.err.Error() }
func (e *runtimeError) Unwrap() error { return e.err }

// markRuntimeErrors wraps the RunE of c and of every command below it, so that what a command returns counts as a
// runtime failure unless it is a usageError, or a value the library refuses as configuration
// (stagehand.ErrInvalidConfig: a schema or a name from the command line it could never use).
func markRuntimeErrors(c *cobra.Command) {
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			err := run(cmd, args)
			var ue *usageError
			if err == nil || errors.As(err, &ue) || errors.Is(err, stagehand.ErrInvalidConfig) {
				return err
			}
			return &runtimeError{err: err}
		}
	}
	for _, sub := range c.Commands() {
		markRuntimeErrors(sub)
	}
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "stagehand",
		Short: "Operate stagehand: migrations, outbox, inbox, projections and the event log",
		Long: `stagehand operates a stagehand deployment on PostgreSQL: it migrates the schema, reports on and repairs
the outbox and the inbox, shows projection status and requests rebuilds, and reads the event log.

The database comes from --database-url, else from the DATABASE_URL environment variable.
Output is a human table by default; --json prints one JSON document (JSON lines for 'events tail --follow').

Exit codes: 0 success, 1 runtime failure, 2 usage error, 130 interrupted.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.ArbitraryArgs,
		RunE:          groupRunE,
		CompletionOptions: cobra.CompletionOptions{
			DisableDefaultCmd: true,
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err: err} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.databaseURL, "database-url", "",
		"PostgreSQL connection URL (default: the "+envDatabaseURL+" environment variable)")
	pf.StringVar(&a.schema, "schema", stagehand.DefaultSchema, "schema holding the stagehand tables")
	pf.BoolVar(&a.json, "json", false, "print machine-readable JSON instead of tables")
	root.AddCommand(a.migrateCommand(), a.outboxCommand(), a.inboxCommand(), a.projectionCommand(),
		a.workerCommand(), a.eventsCommand(), a.snapshotsCommand(), a.forgetCommand(), a.streamsCommand(),
		a.consoleCommand())
	markRuntimeErrors(root)
	return root
}

// group returns a command that only holds subcommands: run alone or with an unknown subcommand it is a usage
// error (cobra would print the help and exit 0).
func group(use, short, long string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{Use: use, Short: short, Long: long, Args: cobra.ArbitraryArgs, RunE: groupRunE}
	c.AddCommand(subs...)
	return c
}

func groupRunE(cmd *cobra.Command, args []string) error {
	var names []string
	for _, sub := range cmd.Commands() {
		if sub.IsAvailableCommand() {
			names = append(names, sub.Name())
		}
	}
	if len(args) == 0 {
		return usageErrorf("missing command: one of %s", strings.Join(names, ", "))
	}
	return usageErrorf("unknown command %q for %q (one of %s)", args[0], cmd.CommandPath(), strings.Join(names, ", "))
}

// close releases what the invocation opened, last opened first.
func (a *app) close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
	a.closers = nil
	if a.pool != nil {
		a.pool.Close()
		a.pool = nil
	}
}

// connect opens the connection pool on first use and checks that the database answers.
func (a *app) connect(ctx context.Context) (*pgxpool.Pool, error) {
	if a.pool != nil {
		return a.pool, nil
	}
	if strings.TrimSpace(a.schema) == "" {
		return nil, usageErrorf("--schema must not be empty")
	}
	if reason := names.Schema(a.schema); reason != "" { // refused by every constructor: a usage error, not a runtime one
		return nil, usageErrorf("--schema %s", reason)
	}
	url := a.databaseURL
	if url == "" {
		url = a.opts.getenv(envDatabaseURL)
	}
	if url == "" {
		return nil, usageErrorf("no database: pass --database-url or set %s", envDatabaseURL)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, usageErrorf("invalid database URL: %w", err)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "stagehand-cli"
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to the database: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot connect to the database: %w", err)
	}
	a.pool = pool
	return pool, nil
}

// outbox opens the outbox of the schema.
func (a *app) outbox(ctx context.Context) (*outbox.Outbox, error) {
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	o, err := outbox.New(pool, &outbox.Config{Schema: a.schema})
	if err != nil {
		return nil, fmt.Errorf("open the outbox: %w", err)
	}
	a.closers = append(a.closers, func() { _ = o.Close() })
	return o, nil
}

// eventStore opens the event store of the schema (read-only use: it sends no notifications).
func (a *app) eventStore(ctx context.Context) (*eventstore.PostgresStore, error) {
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	store, err := eventstore.NewPostgres(pool, &eventstore.PostgresConfig{Schema: a.schema, DisableNotify: true})
	if err != nil {
		return nil, fmt.Errorf("open the event store: %w", err)
	}
	a.closers = append(a.closers, store.Close)
	return store, nil
}

// dbError adds a hint to errors that mean the schema was never migrated.
func (a *app) dbError(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000") {
		return fmt.Errorf("%w (is schema %q migrated? run 'stagehand migrate up --schema %s')", err, a.schema,
			a.schema)
	}
	return err
}

// writeJSON prints v as one indented JSON document.
func (a *app) writeJSON(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}

// printf writes human output.
func (a *app) printf(format string, args ...any) error {
	if _, err := fmt.Fprintf(a.stdout, format, args...); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}

// warnf writes a warning line on stderr (also in --json mode: stdout stays one document).
func (a *app) warnf(format string, args ...any) {
	fmt.Fprintf(a.stderr, "stagehand: warning: "+format+"\n", args...)
}

// table prints rows under header, aligned.
func (a *app) table(header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}

// keyValues prints aligned "key  value" lines.
func (a *app) keyValues(pairs [][2]string) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	for _, p := range pairs {
		fmt.Fprintf(tw, "%s\t%s\n", p[0], p[1])
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}

// tenantScope is the --tenant flag of the outbox and inbox commands: every tenant unless the flag is given.
type tenantScope struct {
	tenant string
	set    bool
}

func addTenantScope(c *cobra.Command, s *tenantScope, verb string) {
	c.Flags().StringVar(&s.tenant, "tenant", "", verb+" only this tenant's rows (default: every tenant, "+
		"estate-wide; an empty value means the reserved no-tenant value)")
}

// resolve reads whether --tenant was given; call it at the start of RunE.
func (s *tenantScope) resolve(cmd *cobra.Command) {
	s.set = cmd.Flags().Changed("tenant")
	if s.set {
		s.tenant = stagehand.NormalizeTenant(s.tenant)
	}
}

// admin returns the outbox operations of the scope: Outbox.Tenant, or Outbox.AllTenants (reached by name).
func (s *tenantScope) admin(o *outbox.Outbox) *outbox.Admin {
	if s.set {
		return o.Tenant(s.tenant)
	}
	return o.AllTenants()
}

func (s *tenantScope) label() string {
	if s.set {
		return "tenant " + displayTenant(s.tenant)
	}
	return "all tenants (estate-wide)"
}

// scopeJSON says in JSON output which rows a result covers.
type scopeJSON struct {
	Scope  string `json:"scope"` // "all-tenants" or "tenant"
	Tenant string `json:"tenant,omitempty"`
}

func (s *tenantScope) json() scopeJSON {
	if s.set {
		return scopeJSON{Scope: "tenant", Tenant: s.tenant}
	}
	return scopeJSON{Scope: "all-tenants"}
}

// displayTenant shows the reserved no-tenant value as "-" in tables.
func displayTenant(t string) string {
	if t == stagehand.NoTenant || t == "" {
		return "-"
	}
	return t
}

// seconds is a duration in JSON output.
func seconds(d time.Duration) float64 { return d.Seconds() }

// human formats a duration for tables: whole seconds, or milliseconds below a second.
func human(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func timestamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// truncate shortens s to n runes for a table cell, on one line.
func truncate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// parseAge parses an age such as 36h, 90m or 7d (days, optionally followed by a Go duration: 1d12h).
func parseAge(flag, s string) (time.Duration, error) {
	orig := s
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.Atoi(s[:i])
		if err != nil {
			return 0, usageErrorf("--%s %q: not a duration (for example 7d, 36h, 90m)", flag, orig)
		}
		days, s = time.Duration(n)*24*time.Hour, s[i+1:]
	}
	var rest time.Duration
	if s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, usageErrorf("--%s %q: not a duration (for example 7d, 36h, 90m)", flag, orig)
		}
		rest = d
	}
	d := days + rest
	if d < 0 {
		return 0, usageErrorf("--%s %q: must not be negative", flag, orig)
	}
	return d, nil
}

// payloadJSON renders a payload for JSON output: as JSON when it is JSON, else as text or base64.
type payloadJSON struct {
	Encoding string `json:"payload_encoding"` // "json", "text" or "base64"
	Payload  any    `json:"payload"`
}

func encodePayload(b []byte) payloadJSON {
	switch {
	case len(b) == 0:
		return payloadJSON{Encoding: "text", Payload: ""}
	case json.Valid(b):
		return payloadJSON{Encoding: "json", Payload: json.RawMessage(b)}
	case isText(b):
		return payloadJSON{Encoding: "text", Payload: string(b)}
	}
	return payloadJSON{Encoding: "base64", Payload: b} // []byte marshals as base64
}

// payloadText renders a payload for human output: compact JSON, text, or a byte count.
func payloadText(b []byte) string {
	if json.Valid(b) {
		var buf bytes.Buffer
		if err := json.Compact(&buf, b); err == nil {
			return buf.String()
		}
	}
	if isText(b) {
		return string(b)
	}
	return fmt.Sprintf("<%d bytes of binary data>", len(b))
}

// isText reports whether b is UTF-8 text without control characters other than white space.
func isText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if r < 0x20 && r != '\n' && r != '\r' && r != '\t' || r == 0x7f {
			return false
		}
	}
	return true
}
