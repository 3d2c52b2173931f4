package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/health"
	"github.com/stagehand-es/stagehand/internal/migrate"
	"github.com/stagehand-es/stagehand/internal/sqlfile"
	"github.com/stagehand-es/stagehand/outbox"
	"github.com/stagehand-es/stagehand/projection"
	"github.com/stagehand-es/stagehand/staging"
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

//go:embed sql/*.sql
var sqlFiles embed.FS

// statements are the console's SQL (sql/audit.sql, sql/samples.sql), read once: embedded data, checked by the package's tests.
var statements = sqlfile.MustLoad(sqlFiles, "sql/*.sql")

// Console is the operator console: an http.Handler serving its pages, and (optionally) the sampler of its charts.
// Create it with New, mount it where Config.Prefix says, call Run in a goroutine of your own for charts that cover
// the time nobody looked, and Close it when done. It is safe for concurrent use.
type Console struct {
	cfg     Config
	outbox  *outbox.Outbox
	store   *eventstore.PostgresStore
	checker *health.Checker
	// admin is the console's scope: every tenant, or Config.Tenant alone.
	admin *outbox.Admin
	// tenants is the log filter of the scope (nil: every tenant).
	tenants []string
	// owned are what New opened and Close closes.
	owned []func()

	q       auditSQL
	pages   map[string]*template.Template
	static  http.Handler
	mux     *http.ServeMux
	origins *http.CrossOriginProtection
	samples *sampler
}

// auditSQL holds the console's statements, written out for its schema.
type auditSQL struct {
	begin, finish, list, get, latest                                  string
	sampleWindow, sampleInsert, sampleLast, sampleRange, sampleExpire string
}

// New returns a Console, or a *ConfigError naming the field of cfg that is not valid. It opens the outbox and the
// event store when cfg gives none (Close closes them). It checks that Schema holds every migration this build
// knows (the console reads the tables of every package), and otherwise returns an error matching
// ErrSchemaNotMigrated that names the schema, the missing migrations and how to apply them.
func New(cfg *Config) (*Console, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := checkSchema(c.Pool, c.Schema); err != nil {
		return nil, err
	}
	con := &Console{cfg: c, outbox: c.Outbox, store: c.Store, checker: c.Health, origins: http.NewCrossOriginProtection()}
	ok := false
	defer func() {
		if !ok {
			_ = con.Close()
		}
	}()
	if con.outbox == nil {
		con.outbox, err = outbox.New(c.Pool, &outbox.Config{Schema: c.Schema, Logger: c.Logger, Clock: c.Clock,
			DisableNotify: true})
		if err != nil {
			return nil, &ConfigError{Package: "console", Field: "Outbox", Reason: err.Error()}
		}
		o := con.outbox
		con.owned = append(con.owned, func() { _ = o.Close() })
	}
	if con.store == nil {
		con.store, err = eventstore.NewPostgres(c.Pool, &eventstore.PostgresConfig{Schema: c.Schema,
			DisableNotify: true, Logger: c.Logger})
		if err != nil {
			return nil, &ConfigError{Package: "console", Field: "Store", Reason: err.Error()}
		}
		con.owned = append(con.owned, con.store.Close)
	}
	if c.Tenant != nil {
		con.admin, con.tenants = con.outbox.Tenant(*c.Tenant), []string{*c.Tenant}
	} else {
		con.admin = con.outbox.AllTenants()
	}
	if con.checker == nil {
		hc := &health.Config{Outbox: con.admin, Inbox: con.admin, Clock: c.Clock, Logger: c.Logger}
		if c.Tenant == nil {
			hc.Projections = func(ctx context.Context) ([]projection.Status, error) {
				return projection.ListStatus(ctx, c.Pool, con.store, c.Schema)
			}
			hc.WorkerStatus = func(ctx context.Context) ([]staging.WorkerStatus, error) {
				return staging.ListWorkerStatus(ctx, c.Pool, con.store, c.Schema)
			}
		}
		if con.checker, err = health.New(hc); err != nil {
			return nil, &ConfigError{Package: "console", Field: "Health", Reason: err.Error()}
		}
	}
	idents := map[string]string{"audit": "console_audit", "samples": "console_samples", "outbox": "outbox",
		"sent": "outbox_sent", "dead": "outbox_dead_letters", "inbox": "inbox", "inbox_dead": "inbox_dead_letters",
		"inbox_attempts": "inbox_attempts"}
	for k, table := range idents {
		idents[k] = pgx.Identifier{c.Schema, table}.Sanitize()
	}
	for field, name := range map[*string]string{&con.q.begin: "audit_begin", &con.q.finish: "audit_finish",
		&con.q.list: "audit_list", &con.q.get: "audit_get", &con.q.latest: "audit_latest",
		&con.q.sampleWindow: "sample_window", &con.q.sampleInsert: "sample_insert",
		&con.q.sampleLast: "sample_last", &con.q.sampleRange: "sample_range", &con.q.sampleExpire: "sample_expire"} {
		if *field, err = statements.Expand(name, nil, idents); err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
	}
	if con.pages, err = parsePages(); err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	sub, err := fs.Sub(staticFiles, "static")
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	files := http.StripPrefix(c.Prefix+"/static/", http.FileServerFS(sub))
	con.static = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") { // a directory: its assets are not listed
			http.NotFound(w, r)
			return
		}
		files.ServeHTTP(w, r)
	})
	con.samples = newSampler(con)
	con.routes()
	ok = true
	return con, nil
}

// ErrSchemaNotMigrated is matched (errors.Is) by New's error when the schema lacks migrations this build needs.
var ErrSchemaNotMigrated = errors.New("console: the schema is not migrated")

// schemaCheckTimeout bounds New's look at the migration history.
const schemaCheckTimeout = 15 * time.Second

// checkSchema returns an error matching ErrSchemaNotMigrated when schema lacks a migration this build knows.
func checkSchema(pool migrate.Beginner, schema string) error {
	ctx, cancel := context.WithTimeout(context.Background(), schemaCheckTimeout)
	defer cancel()
	sts, err := migrate.List(ctx, pool, schema)
	if err != nil {
		return fmt.Errorf("console: read the migrations of schema %q: %w", schema, err)
	}
	var missing []string
	for _, st := range sts {
		if !st.Applied() {
			missing = append(missing, fmt.Sprintf("%03d_%s", st.Version, st.Name))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	what := fmt.Sprintf("%d of %d migrations are missing (%s)", len(missing), len(sts), strings.Join(missing, ", "))
	if len(missing) == len(sts) {
		what = "it holds no stagehand tables (is it the right schema?)"
	} else if len(missing) > 5 {
		what = fmt.Sprintf("%d of %d migrations are missing (%s, …)", len(missing), len(sts),
			strings.Join(missing[:5], ", "))
	}
	return fmt.Errorf("%w: schema %q is not migrated to this build: %s; apply them with `stagehand migrate up "+
		"--schema %s` or stagehand.Migrate before starting the console", ErrSchemaNotMigrated, schema, what, schema)
}

// Close closes the outbox and the event store New opened (never the pool, nor what Config gave). It returns nil.
func (c *Console) Close() error {
	for i := len(c.owned) - 1; i >= 0; i-- {
		c.owned[i]()
	}
	c.owned = nil
	return nil
}

// routes registers every page and action under the prefix.
func (c *Console) routes() {
	p := c.cfg.Prefix
	m := http.NewServeMux()
	get := func(path string, h func(http.ResponseWriter, *http.Request) error) {
		m.HandleFunc("GET "+p+path, c.page(h))
	}
	get("/{$}", c.overview)
	get("/outbox", c.outboxPage)
	get("/outbox/key", c.keyPage)
	get("/dead", c.deadPage)
	get("/dead/message", c.deadMessagePage)
	get("/dead/groups", c.groupsPage)
	get("/find", c.findPage)
	get("/projections", c.followersPage)
	get("/projection", c.projectionPage)
	get("/events", c.eventsPage)
	get("/audit", c.auditPage)
	get("/charts", c.chartsPage)
	c.apiRoutes(m)
	get("/done", c.donePage)
	get("/login", c.login)
	m.HandleFunc("POST "+p+"/confirm", c.page(c.confirm))
	m.HandleFunc("POST "+p+"/act", c.page(c.act))
	m.Handle("GET "+p+"/static/", c.static)
	if p != "" {
		m.Handle("GET "+p, http.RedirectHandler(p+"/", http.StatusMovedPermanently))
	}
	c.mux = m
}

// ServeHTTP serves the console's pages, its actions (POST) and its assets. Every response forbids framing, inline
// script and sniffing, and is not cached.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	if c.cfg.AuthenticateReads {
		if _, ok := c.cfg.Authorize(r); !ok {
			if c.isAPI(r) {
				c.apiError(w, r, &statusError{code: http.StatusUnauthorized, msg: "this console needs an authenticated user"})
				return
			}
			c.unauthorized(w, r, "this console needs an authenticated user")
			return
		}
	}
	c.mux.ServeHTTP(w, r)
}

// statusError is an error with the HTTP status it answers with: a bad request (400), a refusal (401, 403), a
// missing item (404). Other errors answer 500.
type statusError struct {
	code int
	msg  string
}

func (e *statusError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &statusError{code: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &statusError{code: http.StatusNotFound, msg: fmt.Sprintf(format, args...)}
}

func forbidden(format string, args ...any) error {
	return &statusError{code: http.StatusForbidden, msg: fmt.Sprintf(format, args...)}
}

// pageTimeout bounds the database work of one request.
const pageTimeout = 15 * time.Second

// page adapts a handler that returns an error: the error is shown on an error page with its status, and logged
// when it is the console's (500).
func (c *Console) page(h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
		defer cancel()
		err := h(w, r.WithContext(ctx))
		if err == nil {
			return
		}
		code, msg := http.StatusInternalServerError, err.Error()
		var se *statusError
		if errors.As(err, &se) {
			code = se.code
		} else {
			c.cfg.Logger.ErrorContext(ctx, "console: a page failed", "path", clipForError(r.URL.Path), "error", err)
		}
		if code == http.StatusUnauthorized {
			c.unauthorized(w, r, msg)
			return
		}
		c.render(w, r, code, "error", "Error", errorPage{Code: code, Status: http.StatusText(code),
			Message: clip(msg, 4096)})
	}
}

// unauthorized answers 401 with the configured challenge.
func (c *Console) unauthorized(w http.ResponseWriter, r *http.Request, msg string) {
	if c.cfg.Challenge != "" {
		w.Header().Set("WWW-Authenticate", c.cfg.Challenge)
	}
	c.render(w, r, http.StatusUnauthorized, "error", "Sign in", errorPage{Code: http.StatusUnauthorized,
		Status: http.StatusText(http.StatusUnauthorized), Message: clip(msg, 4096)})
}

// login asks the browser for credentials (a 401 with the configured challenge) until Authorize names a user, then
// returns to the page it came from.
func (c *Console) login(w http.ResponseWriter, r *http.Request) error {
	if _, ok := c.user(r); !ok {
		if c.cfg.Authorize == nil {
			return forbidden("this console has no sign-in: it is read-only")
		}
		return &statusError{code: http.StatusUnauthorized, msg: "sign in to act: this console asks for credentials"}
	}
	http.Redirect(w, r, c.back(r.URL.Query().Get("back"), c.cfg.Prefix+"/"), http.StatusSeeOther)
	return nil
}

type errorPage struct {
	Code    int
	Status  string
	Message clipped
}

// scopeName says whose data the console shows.
func (c *Console) scopeName() string {
	if c.cfg.Tenant == nil {
		return "all tenants (estate-wide)"
	}
	if *c.cfg.Tenant == stagehand.NoTenant {
		return "tenant " + stagehand.NoTenant + " (no tenant)"
	}
	return "tenant " + clipForError(*c.cfg.Tenant)
}

// estate reports whether the console sees every tenant.
func (c *Console) estate() bool { return c.cfg.Tenant == nil }

// user returns the request's user, when it is authenticated.
func (c *Console) user(r *http.Request) (string, bool) {
	if c.cfg.Authorize == nil {
		return "", false
	}
	u, ok := c.cfg.Authorize(r)
	if !ok {
		return "", false
	}
	if strings.TrimSpace(u) == "" {
		u = "(unnamed)"
	}
	return u, true
}
