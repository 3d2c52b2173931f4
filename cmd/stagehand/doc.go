// Command stagehand is the operator CLI of the stagehand event-sourcing framework: it migrates the schema,
// reports on and repairs the outbox and the inbox (statistics, dead letters, redrive, cleanup), shows projection
// status and requests rebuilds and replays of parked events, reads the event log (tail, follow, one stream),
// drops aggregate snapshots, and serves the operator console (package console) on its own.
//
// Install it with
//
//	go install github.com/stagehand-es/stagehand/cmd/stagehand@latest
//
// or run it from a checkout with go run ./cmd/stagehand.
//
// Every command reads the database URL from --database-url, else from the DATABASE_URL environment variable, and
// works on the schema given by --schema (default "stagehand"). Output is a human table by default and one JSON
// document with --json (JSON lines for events tail --follow). Progress bars are drawn only when standard output is
// a terminal, and never with --json.
//
// The CLI goes through the packages' own operator APIs (stagehand.Migrate, outbox.Admin, projection.ListStatus,
// eventstore.PostgresStore); it never reads or writes their tables itself.
//
// Outbox and inbox commands act on every tenant unless --tenant names one, and say so in their output: the estate-wide
// scope is an operator report, never a tenant's view (the Excalibur outbox documentation, "Administrative operations
// reach every tenant"). An explicitly empty --tenant "" means the reserved "no tenant" value, never every tenant.
//
// Exit codes: 0 success, 1 a runtime failure (database unreachable, unknown dead letter, ...), 2 a usage error
// (unknown command or flag, bad argument such as a schema or name the library refuses, no database URL), 130
// interrupted (Ctrl-C) before the work was done.
// Every failure prints one line on standard error.
//
// See README.md beside this file for every command with an example.
package main
