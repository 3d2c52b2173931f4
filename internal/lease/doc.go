// Package lease is stagehand's one lease/leader mechanism, with fencing tokens. Projections, the Deferred stager,
// the EventuallyConsistent reconciler and the relay's leader election all use it (directly, or through package
// logfollow).
//
// # Contract
//
//   - A lease is a row of the leases table (name, owner, token, expires_at, acquired_at, renewed_at). Expiry is
//     judged on the database clock (now()), never on a process clock, so clock skew between processes does not
//     matter.
//   - TryAcquire takes a lease that is free, expired or released, and increments its fencing token. Tokens of a
//     name never decrease and are never reused. At most one owner holds an unexpired lease.
//   - Renew extends the lease by TTL; it fails with ErrLost once the lease has changed hands. Release ends it at
//     once (graceful stop); a process that dies simply stops renewing and its lease expires after TTL.
//   - CheckTx is the fenced-write check, run inside the caller's transaction: it locks the lease row FOR SHARE and
//     compares token and owner. While the lock is held no takeover can commit, and after a takeover the check
//     fails, so a zombie holder (paused, partitioned, or slow to notice the loss) can never commit a fenced write
//     after its successor started. This is what makes a checkpoint advance exactly-once. The statements of log
//     followers and relays carry the same check as a CTE joined into the fenced write itself (one round trip
//     instead of two).
//   - Manager.Run is the runner: it contends for the lease every AcquireInterval, runs the leader's work with a
//     context that is cancelled (context.Cause matching ErrLost) when the lease is lost or cannot be renewed for a
//     whole TTL, renews every RenewInterval in the background, and releases the lease when the work returns. It
//     starts no goroutine that outlives it.
//
// Losing a lease is normal (a database restart, a long GC pause); the runner contends again. Fencing, not timing,
// is what guarantees safety: timing only bounds how long a dead holder blocks its successor (about TTL).
package lease
