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
	"github.com/stagehand-es/stagehand/internal/conf"
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

// Bounds of Config's fields.
const (
	minPayload, maxPayload = 1 << 10, 16 << 20    // MaxPayload: 1 KiB to 16 MiB
	maxRetention           = 400 * 24 * time.Hour // Retention: 400 days
	minCSRFKey             = 32                   // CSRFKey, in bytes
	maxSamples             = 10_000               // the samples History keeps in memory
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
	check := conf.Check{Package: "console"}
	if s.Pool == nil {
		check.Fail("Pool", "is required")
	}
	check.Text("Schema", &s.Schema, stagehand.DefaultSchema, names.Identifier)
	if s.Outbox != nil && s.Outbox.Schema() != s.Schema {
		check.Fail("Outbox", fmt.Sprintf("works on schema %q, the console on %q", s.Outbox.Schema(), s.Schema))
	}
	if s.Store != nil && s.Store.Schema() != s.Schema {
		check.Fail("Store", fmt.Sprintf("works on schema %q, the console on %q", s.Store.Schema(), s.Schema))
	}
	s.checkAccess(&check)
	check.Text("Title", &s.Title, DefaultTitle, func(t string) string {
		if len(t) > 200 || names.Text(t) != "" {
			return "must be at most 200 bytes of text without control characters"
		}
		return ""
	})
	check.Int("PageSize", &s.PageSize, DefaultPageSize, 1, 500)
	check.Int("MaxPayload", &s.MaxPayload, DefaultMaxPayload, minPayload, maxPayload)
	check.Duration("SampleInterval", &s.SampleInterval, DefaultSampleInterval, time.Second)
	check.AtMost("SampleInterval", s.SampleInterval, time.Hour)
	check.Duration("History", &s.History, max(DefaultHistory, s.SampleInterval), 0)
	check.AtLeast("History", s.History, "SampleInterval", s.SampleInterval)
	if s.SampleInterval > 0 && s.History/s.SampleInterval > maxSamples {
		check.Fail("History", fmt.Sprintf("holds more than %d samples of SampleInterval", maxSamples))
	}
	check.Duration("IdleSampleInterval", &s.IdleSampleInterval, max(DefaultIdleSampleInterval, s.SampleInterval), 0)
	check.AtLeast("IdleSampleInterval", s.IdleSampleInterval, "SampleInterval", s.SampleInterval)
	check.AtMost("IdleSampleInterval", s.IdleSampleInterval, time.Hour)
	check.Duration("Retention", &s.Retention, DefaultRetention, time.Hour)
	check.AtMost("Retention", s.Retention, maxRetention)
	if s.Clock == nil {
		s.Clock = time.Now
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	if err := check.Err(); err != nil {
		return Config{}, err
	}
	return s, nil
}

// checkAccess checks the tenant scope, the authentication and the forms' settings, and draws a CSRF key when none
// is given.
func (s *Config) checkAccess(check *conf.Check) {
	if s.Tenant != nil {
		t := stagehand.NormalizeTenant(*s.Tenant)
		if err := stagehand.ValidateTenant(t); err != nil {
			check.FailErr("Tenant", err)
		}
		s.Tenant = &t
	}
	if s.Tenant != nil && s.Health != nil {
		check.Fail("Health", "cannot be given to a console scoped to a tenant: a checker reports on what its own "+
			"configuration watches, which a tenant's console must not show")
	}
	if s.Actions && s.Authorize == nil {
		check.Fail("Authorize", "is required when Actions is set: every action needs an authenticated user "+
			"(BasicAuth, TokenAuth or the host's own)")
	}
	if s.AuthenticateReads && s.Authorize == nil {
		check.Fail("Authorize", "is required when AuthenticateReads is set")
	}
	if strings.ContainsAny(s.Challenge, "\r\n") {
		check.Fail("Challenge", "must not hold a line break")
	}
	switch {
	case s.CSRFKey == nil:
		s.CSRFKey = make([]byte, minCSRFKey)
		if _, err := rand.Read(s.CSRFKey); err != nil {
			check.FailErr("CSRFKey", fmt.Errorf("no random key could be drawn: %w", err))
		}
	case len(s.CSRFKey) < minCSRFKey:
		check.Fail("CSRFKey", fmt.Sprintf("must be at least %d bytes (%d given)", minCSRFKey, len(s.CSRFKey)))
	default:
		s.CSRFKey = append([]byte(nil), s.CSRFKey...)
	}
	if s.Prefix != "" && (!strings.HasPrefix(s.Prefix, "/") || strings.HasSuffix(s.Prefix, "/") ||
		strings.ContainsAny(s.Prefix, "?#{}* \t\r\n\\") || strings.Contains(s.Prefix, "//")) {
		check.Fail("Prefix", "must start with '/', not end with one, and hold no '//', spaces, '?', '#', '{', '}', "+
			"'*' or '\\'")
	}
}
