// Package logfollow is stagehand's one log follower: the loop shared by projections, the Deferred stager, the
// EventuallyConsistent reconciler and the global log's Watermill subscriber.
//
// # Contract
//
// A Follower named N:
//
//   - holds the lease "logfollow:N" (package lease) while it works, so at most one process follows N at a time; a
//     standby instance takes over when the holder stops (at once: the lease is released) or dies (after
//     LeaseTTL);
//   - reads its checkpoint (table checkpoints, row N) and pages through the global log after it with
//     eventstore.Store.ReadLog (any store, including the in-memory one), which is gap-safe: it never returns a
//     position past one an in-flight transaction may still commit;
//   - for each page: begins a transaction on the checkpoint's pool, calls the Handler with that transaction and
//     the page's records (after the EventTypes/StreamTypes/Tenants filter and Select), then in one statement
//     runs the fenced-write check (the fence of sql/checkpoints.sql: the lease row locked FOR SHARE, owner and fencing token
//     compared) and advances the checkpoint to the page's Last (only if it is still where this follower left
//     it), and commits. Writes the handler makes through the transaction are therefore applied exactly once: a crash before the commit loses both the writes and the advance, and a zombie
//     holder's commit after a takeover is refused. Effects outside the transaction are at-least-once;
//   - while catching up (pages come back full) reads the next page while the current transaction commits, and
//     applies up to PagesPerTx pages in one transaction, so one commit serves them all;
//   - after catching up, waits for a wake-up: LISTEN/NOTIFY on the store's channel when the store offers one
//     (eventstore.PostgresStore: the NOTIFY is sent after the append commits, never inside its transaction), Wake,
//     or PollInterval, whichever comes first. The listen connection reconnects by itself and every reconnection
//     triggers a read, so a dropped connection or a database restart costs at most a reconnect delay;
//   - retries infrastructure errors (a dropped connection, a restart) forever with a short growing delay,
//     without counting them against any event;
//   - on a handler error, rolls back and retries: a failed batch is replayed one record per transaction up to its
//     end, so the failing record is found and only its attempts are counted; each retry waits RetryDelay, doubled
//     per attempt up to MaxRetryDelay. After MaxAttempts (or at once for an error wrapped by Permanent) it calls
//     OnExhausted in a transaction that moves the checkpoint past the record (park it there), or, without
//     OnExhausted, records state "failed" and stops Run with a *HandlerError. A record is never skipped silently;
//   - performs a reset requested with RequestReset (all followers of a ResetGroup): in one transaction that
//     locks the group's checkpoint rows it calls OnReset and sets their positions to 0.
//
// Status (List, Lag, LagAt) is read from the database, so another process (a CLI, a health check) sees every
// follower: position, state (running while the lease is held, failed, stopped), last error, the event being
// retried, lease owner and fencing token; lag is measured against the store's head.
//
// # Using it (the Deferred stager, the reconciler)
//
//	f, err := logfollow.New(pool, store, func(ctx context.Context, tx pgx.Tx, recs []eventstore.Record) error {
//		return stageMessages(ctx, tx, recs) // outbox rows inserted in tx: exactly once with the checkpoint
//	}, &logfollow.Config{Name: "deferred-stager", Kind: "stager"})
//	err = f.Run(ctx)
package logfollow
