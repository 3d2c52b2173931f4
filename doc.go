// Package stagehand is an event-sourcing framework for Go with a built-in transactional outbox, on PostgreSQL
// (pgx v5) and Watermill.
//
// This root package holds what every other package shares: the request-scoped metadata carried in a
// context.Context (tenant, correlation and causation IDs, user key/values), the standard header names, and
// Migrate, which applies the schema of every package in one explicit call.
//
// The architecture is in the packages:
//
//   - aggregate: aggregates, the type registry and the repository (Load, Save, SaveTx, Update).
//   - eventstore: the Store interface, the PostgreSQL and in-memory stores and their conformance suite.
//   - outbox: the transactional outbox, the Watermill relay and the inbox for idempotent handlers.
//   - staging: the strategies that turn saved domain events into outbox messages.
//   - projection: checkpointed runners that build read models from the global log.
package stagehand
