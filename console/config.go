package console

import (
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/health"
	"github.com/stagehand-es/stagehand/internal/names"
	"github.com/stagehand-es/stagehand/outbox"
)

// Defaults of Config.
const (
	DefaultSampleInterval     = 5 * time.Second
	DefaultIdleSampleInterval = time.Minute
	DefaultHistory            = 15 * time.Minute
	DefaultRetention          = 7 * 24 * time.Hour
	DefaultPageSize           = 50
	DefaultMaxPayload         = 64 << 10
	DefaultTitle              = "stagehand"
)

// Config configures a Console. Pool is required; every other field has a default, stated on it. A Console is
// read-only unless Actions is set.
type Config struct {
	// Pool is the database of the stagehand tables. Required.
	Pool *pgxpool.Pool
	// Schema holds the stagehand tables (created by stagehand.Migrate, the console's own audit table included).
	// Default stagehand.DefaultSchema.
	Schema string
	// Outbox is the outbox the console reads and acts on. Default: one the console opens on Pool and Schema (and
	// closes with Close).
	Outbox *outbox.Outbox
	// Store is the event store whose streams and log the console shows. Default: one the console opens on Pool
	// and Schema (and closes with Close).
	Store *eventstore.PostgresStore
	// Health is the checker whose verdicts the overview shows; give the one your service already runs (with its
	// relays' hooks) to see the relays' failure rates. Not with Tenant. Default: a checker the console builds over
	// the outbox, the projections and the staging workers of the schema (the tenant's outbox alone when scoped to
	// a tenant).
	Health *health.Checker

	// Tenant scopes the console to one tenant ("" is stagehand.NoTenant, checked with stagehand.ValidateTenant):
	// it then shows and touches that tenant's outbox, inbox, parked events and events only, through the
	// tenant-scoped operations, and none of the estate-wide components (relays, projections' and workers'
	// checkpoints, other scopes' audit entries). Default nil: every tenant (the estate-wide operator console).
	Tenant *string

	// Actions enables the operator actions: redrive and discard dead letters, replay and discard parked events,
	// request projection rebuilds. Each needs a user Authorize names, a valid CSRF token, and a confirmation, and
	// is recorded in the audit table. Default false: read-only (no action is offered or accepted).
	Actions bool
	// Authorize names the user of a request, with ok false when the request is not authenticated: the hook to the
	// host service's own authentication (BasicAuth and TokenAuth are built in). Actions need it. Default: none (no
	// request is authenticated).
	Authorize func(r *http.Request) (user string, ok bool)
	// AuthenticateReads makes every page, not only the actions, need a user Authorize names. Default false: pages
	// are readable by whoever reaches the handler (mount it behind the host's own authentication).
	AuthenticateReads bool
	// Challenge is the WWW-Authenticate header sent with a 401 answer, so that a browser asks for credentials
	// (BasicChallenge for BasicAuth and TokenAuth). Default "": none (the host's login is elsewhere).
	Challenge string
	// CSRFKey signs the forms' CSRF tokens and the actions' confirmations (at least 32 bytes). Consoles behind one
	// load balancer, and a console across restarts, must share it to accept each other's forms.
	// Default: 32 random bytes drawn by New.
	CSRFKey []byte

	// Prefix is the path the console is mounted at ("/ops/console", without a trailing slash): its links start
	// with it, and requests outside it are not found. Default "": the root.
	Prefix string
	// Title names the deployment in every page's header and title ("orders production"). Default "stagehand".
	Title string
	// PageSize is how many rows a list shows per page. Default 50; 1 to 500.
	PageSize int
	// MaxPayload is how many bytes of a payload or metadata value a page shows before cutting it (with a marker
	// saying how much was left out). Default 64 KiB; 1 KiB to 16 MiB.
	MaxPayload int

	// SampleInterval is how often the rates and backlogs of the overview's charts are sampled: by Run, or on
	// request when Run is not running. Default 5s; 1s to 1h.
	SampleInterval time.Duration
	// IdleSampleInterval is how often Run samples while nobody looks at the console (no page or API request in
	// the last two minutes): the chart history and the health checker's stall detection go on, at a lower cost.
	// Default 1m; at least SampleInterval, at most 1h.
	IdleSampleInterval time.Duration
	// History is how far back the overview's charts go; the console keeps History / SampleInterval samples in
	// memory. Default 15m; at least SampleInterval, at most 10,000 samples.
	History time.Duration
	// Retention is how long the chart history (the console_samples table, ten-second buckets by topic and by
	// inbox handler) is kept: the sampler deletes older buckets once an hour. Default 7 days; 1h to 400 days.
	Retention time.Duration

	// Clock is the console's time source. Default time.Now.
	Clock func() time.Time
	// Logger receives the console's diagnostics and one line per operator action. Default: silent.
	Logger *slog.Logger
}

// ErrInvalidConfig is matched (errors.Is) by every configuration error.
var ErrInvalidConfig = stagehand.ErrInvalidConfig

// ConfigError is stagehand.ConfigError, the configuration error every stagehand package returns (Package
// "console" here). It matches ErrInvalidConfig.
type ConfigError = stagehand.ConfigError

// withDefaults returns a validated copy of c with every default applied. The outbox, store and checker defaults
// are left to New, which owns what it opens.
func (c *Config) withDefaults() (Config, error) {
	var s Config
	if c != nil {
		s = *c
	}
	bad := func(field, format string, args ...any) (Config, error) {
		return Config{}, &ConfigError{Package: "console", Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if s.Pool == nil {
		return bad("Pool", "Pool is required.")
	}
	if s.Schema == "" {
		s.Schema = stagehand.DefaultSchema
	}
	if reason := names.Identifier(s.Schema); reason != "" || strings.TrimSpace(s.Schema) == "" {
		if reason == "" {
			reason = "cannot be whitespace"
		}
		return bad("Schema", "Schema %s.", reason)
	}
	if s.Outbox != nil && s.Outbox.Schema() != s.Schema {
		return bad("Outbox", "Outbox works on schema %q, the console on %q.", s.Outbox.Schema(), s.Schema)
	}
	if s.Store != nil && s.Store.Schema() != s.Schema {
		return bad("Store", "Store works on schema %q, the console on %q.", s.Store.Schema(), s.Schema)
	}
	if s.Tenant != nil {
		t := stagehand.NormalizeTenant(*s.Tenant)
		if err := stagehand.ValidateTenant(t); err != nil {
			return Config{}, &ConfigError{Package: "console", Field: "Tenant",
				Reason: fmt.Sprintf("Tenant is not accepted: %v.", err), Err: err}
		}
		s.Tenant = &t
	}
	if s.Tenant != nil && s.Health != nil {
		return bad("Health", "Health cannot be given to a console scoped to a tenant: a checker reports on what "+
			"its own configuration watches, which a tenant's console must not show.")
	}
	if s.Actions && s.Authorize == nil {
		return bad("Authorize", "Authorize is required when Actions is set: every action needs an authenticated "+
			"user (BasicAuth, TokenAuth or the host's own).")
	}
	if s.AuthenticateReads && s.Authorize == nil {
		return bad("Authorize", "Authorize is required when AuthenticateReads is set.")
	}
	if strings.ContainsAny(s.Challenge, "\r\n") {
		return bad("Challenge", "Challenge cannot hold a line break.")
	}
	switch {
	case s.CSRFKey == nil:
		s.CSRFKey = make([]byte, 32)
		if _, err := rand.Read(s.CSRFKey); err != nil {
			return bad("CSRFKey", "no random key could be drawn: %v.", err)
		}
	case len(s.CSRFKey) < 32:
		return bad("CSRFKey", "CSRFKey must be at least 32 bytes (%d given).", len(s.CSRFKey))
	default:
		s.CSRFKey = append([]byte(nil), s.CSRFKey...)
	}
	if s.Prefix != "" {
		if !strings.HasPrefix(s.Prefix, "/") || strings.HasSuffix(s.Prefix, "/") || strings.ContainsAny(s.Prefix,
			"?#{}* \t\r\n\\") || strings.Contains(s.Prefix, "//") {
			return bad("Prefix", "Prefix %q must start with '/', not end with one, and hold no '//', spaces, "+
				"'?', '#', '{', '}', '*' or '\\'.", s.Prefix)
		}
	}
	if s.Title == "" {
		s.Title = DefaultTitle
	}
	if len(s.Title) > 200 || names.Text(s.Title) != "" {
		return bad("Title", "Title must be at most 200 bytes of text without control characters.")
	}
	switch {
	case s.PageSize == 0:
		s.PageSize = DefaultPageSize
	case s.PageSize < 1 || s.PageSize > 500:
		return bad("PageSize", "PageSize must be between 1 and 500 (%d given).", s.PageSize)
	}
	switch {
	case s.MaxPayload == 0:
		s.MaxPayload = DefaultMaxPayload
	case s.MaxPayload < 1<<10 || s.MaxPayload > 16<<20:
		return bad("MaxPayload", "MaxPayload must be between 1 KiB and 16 MiB (%d given).", s.MaxPayload)
	}
	switch {
	case s.SampleInterval == 0:
		s.SampleInterval = DefaultSampleInterval
	case s.SampleInterval < time.Second || s.SampleInterval > time.Hour:
		return bad("SampleInterval", "SampleInterval must be between 1s and 1h (%s given).", s.SampleInterval)
	}
	switch {
	case s.History == 0:
		s.History = max(DefaultHistory, s.SampleInterval)
	case s.History < s.SampleInterval:
		return bad("History", "History (%s) cannot be shorter than SampleInterval (%s).", s.History,
			s.SampleInterval)
	case s.History/s.SampleInterval > 10_000:
		return bad("History", "History (%s) holds more than 10,000 samples of %s.", s.History, s.SampleInterval)
	}
	switch {
	case s.IdleSampleInterval == 0:
		s.IdleSampleInterval = max(DefaultIdleSampleInterval, s.SampleInterval)
	case s.IdleSampleInterval < s.SampleInterval || s.IdleSampleInterval > time.Hour:
		return bad("IdleSampleInterval", "IdleSampleInterval must be between SampleInterval (%s) and 1h (%s given).",
			s.SampleInterval, s.IdleSampleInterval)
	}
	switch {
	case s.Retention == 0:
		s.Retention = DefaultRetention
	case s.Retention < time.Hour || s.Retention > 400*24*time.Hour:
		return bad("Retention", "Retention must be between 1h and 400 days (%s given).", s.Retention)
	}
	if s.Clock == nil {
		s.Clock = time.Now
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	return s, nil
}
