package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/stagehand-es/stagehand/console"
)

// Environment variables the console command reads its credentials from when the flags are not given, so that they
// need not appear in a process listing.
const (
	envConsoleToken     = "STAGEHAND_CONSOLE_TOKEN"
	envConsoleBasicAuth = "STAGEHAND_CONSOLE_BASIC_AUTH"
	envConsoleCSRFKey   = "STAGEHAND_CONSOLE_CSRF_KEY"
)

func (a *app) consoleCommand() *cobra.Command {
	var (
		listen, token, basicAuth, csrfKey, title, prefix string
		actions                                          bool
		sampleEvery, idleEvery, retention                time.Duration
		scope                                            tenantScope
	)
	c := &cobra.Command{
		Use:   "console",
		Short: "Serve the operator console: the pipeline's health, backlogs, dead letters, projections and events",
		Long: `Serve the operator console on its own: web pages showing the health of every component, the rates and
backlogs of the pipeline, the outbox, the dead letters of the outbox and the inbox, projections and staging
workers, streams and the global log, and the audit of every action taken through a console.

The console is read-only unless --actions is given. Actions (redrive and discard dead letters, replay and discard
parked events, request projection rebuilds) need credentials: --token (or ` + envConsoleToken + `), a token a
browser sends as the password of its sign-in prompt and a script as "Authorization: Bearer TOKEN", or
--basic-auth USER:PASSWORD (or ` + envConsoleBasicAuth + `). With credentials, every page needs them. Without,
the console listens on a loopback address only.

Forms and confirmations are signed with a key drawn at start, so a restart invalidates open pages and replicas
reject each other's forms. Give --csrf-key (or ` + envConsoleCSRFKey + `), at least 32 characters, for instance
from "openssl rand -hex 32", to share it between restarts and replicas.

It serves until interrupted (Ctrl-C ends it normally, exit 0).`,
		Args: cobra.NoArgs,
		Example: `  stagehand console                                        # read-only, http://127.0.0.1:8080/
  stagehand console --listen :8080 --token "$(openssl rand -hex 16)" --actions
  STAGEHAND_CONSOLE_BASIC_AUTH=ops:s3cret stagehand console --listen :8080 --actions --tenant acme`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			scope.resolve(cmd)
			if token == "" {
				token = a.opts.getenv(envConsoleToken)
			}
			if basicAuth == "" {
				basicAuth = a.opts.getenv(envConsoleBasicAuth)
			}
			if csrfKey == "" {
				csrfKey = a.opts.getenv(envConsoleCSRFKey)
			}
			cfg := &console.Config{Actions: actions, Title: title, Prefix: strings.TrimSuffix(prefix, "/"),
				SampleInterval: sampleEvery, IdleSampleInterval: idleEvery, Retention: retention,
				Logger: slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))}
			if csrfKey != "" {
				if len(csrfKey) < 32 {
					return usageErrorf("--csrf-key must be at least 32 characters (%d given)", len(csrfKey))
				}
				cfg.CSRFKey = []byte(csrfKey)
			}
			who := ""
			switch {
			case token != "" && basicAuth != "":
				return usageErrorf("give --token or --basic-auth, not both")
			case token != "":
				cfg.Authorize, who = console.TokenAuth(token), "token"
			case basicAuth != "":
				user, pass, ok := strings.Cut(basicAuth, ":")
				if !ok || user == "" || pass == "" {
					return usageErrorf("--basic-auth must be USER:PASSWORD, both non-empty")
				}
				cfg.Authorize, who = console.BasicAuth(user, pass), "basic auth as "+user
			}
			if cfg.Authorize != nil {
				cfg.AuthenticateReads, cfg.Challenge = true, console.BasicChallenge
			}
			if actions && cfg.Authorize == nil {
				return usageErrorf("--actions needs credentials: give --token or --basic-auth")
			}
			host, _, err := net.SplitHostPort(listen)
			if err != nil {
				return usageErrorf("--listen %q is not HOST:PORT: %w", listen, err)
			}
			if cfg.Authorize == nil && !loopback(host) {
				return usageErrorf("--listen %s serves beyond this machine: give --token or --basic-auth (or "+
					"listen on 127.0.0.1)", listen)
			}
			if scope.set {
				t := scope.tenant
				cfg.Tenant = &t
			}
			ctx := cmd.Context()
			pool, err := a.connect(ctx)
			if err != nil {
				return err
			}
			cfg.Pool, cfg.Schema = pool, a.schema
			con, err := console.New(cfg)
			if err != nil {
				var ce *console.ConfigError
				if errors.As(err, &ce) {
					return usageErrorf("%v", err)
				}
				return err
			}
			defer func() { _ = con.Close() }()
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", listen, err)
			}
			mode := "read-only"
			if actions {
				mode = "actions enabled"
			}
			if who != "" {
				mode += ", sign in with " + who
			}
			if err := a.printf("console: serving http://%s%s/ (%s; %s)\n", ln.Addr(), cfg.Prefix, mode,
				scope.label()); err != nil {
				_ = ln.Close()
				return err
			}
			return serve(ctx, ln, con)
		},
	}
	f := c.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:8080", "address to serve on, HOST:PORT (port 0: any free port)")
	f.StringVar(&token, "token", "", "token that signs in (default: the "+envConsoleToken+" environment variable)")
	f.StringVar(&basicAuth, "basic-auth", "", "USER:PASSWORD that signs in (default: the "+envConsoleBasicAuth+
		" environment variable)")
	f.StringVar(&csrfKey, "csrf-key", "", "key (32 characters or more) signing forms and confirmations, shared by "+
		"restarts and replicas (default: the "+envConsoleCSRFKey+" environment variable, else a random key)")
	f.BoolVar(&actions, "actions", false, "enable the actions (redrive, discard, replay, rebuild); needs credentials")
	f.StringVar(&title, "title", "", "the deployment's name in the pages' header (default \"stagehand\")")
	f.StringVar(&prefix, "prefix", "", "path to serve the console under, for a reverse proxy (default: the root)")
	f.DurationVar(&sampleEvery, "sample-interval", 0, "how often the charts are sampled while someone looks "+
		"(default 5s)")
	f.DurationVar(&idleEvery, "idle-sample-interval", 0, "how often they are sampled while nobody looks (default 1m)")
	f.DurationVar(&retention, "retention", 0, "how long the chart history is kept in the database (default 168h)")
	addTenantScope(c, &scope, "show and act on")
	return c
}

// loopback reports whether a listen host reaches this machine only.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// serve serves the console on ln, and samples its charts, until ctx ends; then it stops accepting requests and
// lets those in flight finish (for up to five seconds).
func serve(ctx context.Context, ln net.Listener, con *console.Console) error {
	srv := &http.Server{Handler: con, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute,
		WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	runCtx, stopRun := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		_ = con.Run(runCtx)
	}()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	var err error
	select {
	case <-ctx.Done():
		shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		err = srv.Shutdown(shut)
		cancel()
		<-served
	case err = <-served:
	}
	stopRun()
	<-sampled
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("serve the console: %w", err)
	}
	return nil
}
