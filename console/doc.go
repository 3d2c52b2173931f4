// Package console is the operator console of a stagehand deployment: web pages where the people on call see the
// whole pipeline, from append to handled, and act on it.
//
//   - Overview: the health verdict of every component with its reasons; every process (relays with or without
//     leader election, inbox handlers, projections, staging workers) with its heartbeat and last activity; appended, staged, published, handled and
//     failed per second and the backlogs (outbox pending, oldest pending age, projection and worker lag) as charts
//     over the last minutes, refreshing by themselves; the latency of each step from append to handled.
//   - Outbox: pending messages by topic, tenant or partition key, a key's messages in order, scheduled messages,
//     keys held by a dead letter, the relays with their leases (leader, partitions, membership) and rows in flight,
//     routine maintenance.
//   - Dead letters of the outbox and of the inbox: filtered by topic, type, tenant, handler, error text and age; a
//     message's payload, headers and last error; redrive or discard one, a selection, or everything a filter
//     selects, with the count confirmed first.
//   - Projections and staging workers: state, position, lag, last error, parked events (inspect, replay, discard),
//     rebuild requests and their progress.
//   - Events: a stream's events (versions, payloads, metadata, the messages staged from each and the inbox handlers
//     that handled them), an event by position, and the tail of the global log.
//   - Audit: every action, who took it, when, on what, and what it affected.
//
// New returns a *Console, an http.Handler to mount in a service (at Config.Prefix); `stagehand console` serves one
// on its own. The console reads and acts only through the packages' own operations (outbox.Admin, projection and
// staging status and parked events, eventstore.PostgresStore reads, health.Checker); the only table it owns is its
// audit table, created by stagehand.Migrate.
//
// # Safe to expose
//
// A console is read-only unless Config.Actions is set. An action needs a user named by Config.Authorize (the host
// service's own authentication, or the built-in BasicAuth and TokenAuth), comes from the console's own pages (the
// browser's Sec-Fetch-Site or Origin), carries a CSRF token tied to that user, is confirmed with its count (a
// signed confirmation binding the action, its filter or selection, its bound and the count: anything else, or more
// than confirmed, is refused and the refusal recorded), and is recorded in the audit table before it runs and
// again when it ends. Inputs are validated and reach the database
// only as arguments of the packages' operations; lists page by keyset. Stored data (payloads, metadata, errors,
// IDs) is shown as escaped text: invalid UTF-8 and invisible control or formatting characters become visible
// escapes, long values are cut with a marker, and nothing stored is ever rendered as markup. Every response forbids
// framing, inline scripts and content sniffing. Config.Tenant scopes a console to one tenant: it then shows and
// touches nothing of any other tenant.
//
// # Why server-rendered pages
//
// The pages are html/template, one small stylesheet and one small script, embedded in the package: no build step,
// nothing to download, no JavaScript framework, and no dependency added to the library (the console compiles from
// the standard library and stagehand's own packages). html/template escapes every value for its context, which is
// the console's main defence against hostile payloads; a client-side bundle would have to rebuild that discipline
// in JavaScript. The charts are inline SVG computed on the server; the script only refreshes the live parts of a
// page (parsing the fetched page as an inert document) and helps with selections. Every page and action works
// without it.
//
// # Charts
//
// The rates and backlogs are sampled from counters the database already keeps (the log's head, the staging,
// publication and handling times of the outbox, the sent ledger and the inbox, the checkpoints), so they count
// every process's work; a sample counts only the rows of its window, through the tables' time indexes. A Console
// keeps the last Config.History of samples in memory for the overview, and writes the counts, in ten-second buckets
// by topic and by inbox handler, to its chart history (the console_samples table), which the charts page and the
// JSON API (/api/v1/charts) read: the history survives a restart. Call Run in a goroutine to sample every
// Config.SampleInterval while someone looks and every Config.IdleSampleInterval otherwise; without it, a page
// takes a sample when the latest is older than SampleInterval.
package console
