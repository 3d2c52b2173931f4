// Package health checks the pipeline that moves events to the outside world: the outbox and its relays, the
// inbox's handlers, projections, and staging workers (Deferred stagers, reconcilers). A Checker reports Healthy, Degraded or
// Unhealthy with a reason for every verdict, as a function (Check) and as an http.Handler (200 for Healthy and
// Degraded, 503 for Unhealthy, the report as JSON).
//
// What it judges, with the Excalibur outbox documentation's thresholds as defaults (every one configurable):
//
//   - Stalls. A component that has work but makes no progress is Degraded after 2 minutes and Unhealthy after 5,
//     even when nothing reports an error. The stall is timed from the database's own records (the newest
//     publication in the sent ledger, a checkpoint's last change, an inbox handler's first failure), so a checker
//     that has just started sees a stall older than itself, and by sampling on every check: the outbox's latest
//     publication (read from the sent ledger, so relays in every process count, plus the hooks of local relays)
//     against its ready messages, and each projection's or worker's position against its lag. A relay that was
//     stopped with messages pending, a projection handler that hangs, a worker that lost its lease and never got
//     it back: all show up as work that stopped moving. So does a partition of a partitioned projection that no
//     process has run (Status lists it as projection.NotStarted, at position 0).
//   - Failure rate. Relays built with Checker.RelayHooks feed a sliding window of delivery outcomes: 5 % of
//     deliveries rejected (or refused by an unreachable broker) make the relay Degraded, 20 % Unhealthy.
//   - Errors and operator work. A projection that stopped failed, or a component that cannot be read, is
//     Unhealthy; an event being retried, outbox dead letters and parked projection events are Degraded. An inbox
//     handler's dead letters and the messages it keeps failing on are Degraded; a handler failing on too many, or
//     stuck on one past the inactivity thresholds, is Unhealthy.
//
// The clock is injected (Config.Clock), so tests move time by minutes without waiting. A Checker starts no
// goroutine; Run samples on a ticker until its context ends, for processes no probe calls.
package health
