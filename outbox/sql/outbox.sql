-- Statements on the outbox table: staging, the relay's claims, marks and promotions, and its statistics. The table
-- layout and the reasons for it are in the migrations (internal/migrate/sql: 010_outbox.sql and those after it).
-- Markers: {outbox}, {sent}, {dead}, {seq} (the outbox_seq sequence, inside a string literal) are the tables'
-- names; {fence,}, {with fence}, {fenced}, {takeover} and {partition} are the relay's modes (queries.relay);
-- {position one}, {position many}, {dedup one} and {dedup many} the staging variants (queries.stagingStatements).

-- The first pending sequence number of the key ({tenant}, {key}), NULL when it has no ordered message pending:
-- its head. Every probe of a key's messages asks for the key's first sequence number (ORDER BY seq LIMIT 1)
-- rather than whether one exists: only the key index gives that order, so no plan probes through another index
-- holding tenant_id (the message keys, migration 026) and filters the whole table per row, as a plan costed on a
-- queue table's stale statistics (an empty table) otherwise may.
-- fragment: key_head
(SELECT kh.seq FROM {outbox} kh
 WHERE kh.tenant_id = {tenant} AND kh.partition_key = {key} AND kh.seq IS NOT NULL
 ORDER BY kh.seq LIMIT 1)

-- Settings for the implicit transaction of each of the relay's own batches:
-- - Generic plans (plan_cache_mode). The relay's statements take arrays and run many times a second on
-- few connections: planned anew on each call (what PostgreSQL does when a custom plan looks cheaper
-- than the generic one, as it does with arrays of known length) they spent more time planning than
-- running. Every plan below is an index walk that does not depend on the arguments' values.
-- - Index access only (enable_seqscan, enable_bitmapscan off). Every statement here is built around an
-- index walk that stops early (oldest due rows, the first row of a key, a key's run), which only pays
-- off with a plain index scan. The planner's estimates cannot be trusted on a queue table: a vacuum
-- that finds it empty records zero rows, and until the next analyze a burst of thousands of rows is
-- planned as an empty table (a bitmap scan and sort of every due row per claim, seq scans per key).
-- - JIT off. Per-key runs give estimates that can push the statements past jit_above_cost: compiling
-- then costs far more (about a second) than the statement (milliseconds).
-- - synchronous_commit off. Leases, marks, backoffs, dead-letter moves and promotions need no WAL flush
-- before the relay goes on: a crash that loses the last of them leaves the database as it was a moment
-- earlier, where the affected messages are still pending, so they are published again (a duplicate,
-- which at-least-once allows) and none is lost. Staging is never affected: it commits in the caller's
-- transaction with the caller's settings.
-- name: relay_settings
SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
    set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
    set_config('jit', 'off', true), set_config('synchronous_commit', 'off', true)

-- The relay's vacuum of the outbox table: see claimLoop.vacuumer.
-- name: vacuum
VACUUM (SKIP_LOCKED, TRUNCATE false, PARALLEL 0) {outbox}

-- Staging, first statement: the prelude. It takes, in ascending order (as every waiting locker does, so two
-- stagers never deadlock), the transaction-scoped advisory lock of every (tenant, partition key) the call
-- orders ($1: keyLock of each), so a later stager of the same key waits for this transaction to end and
-- draws higher sequence numbers: sequence order is staging-commit order. The statements after it take their
-- snapshots once the locks are held, so they see every earlier staging of these keys.
--
-- It also sets, for the rest of the transaction, what the staging statements need whatever the table's
-- statistics say (a queue table's are usually wrong: a vacuum that finds it empty records zero rows):
-- generic plans (plan_cache_mode), since a re-plan of these statements costs more than running them and a
-- custom plan is what an array argument would otherwise get on every call; and index access only
-- (enable_seqscan, enable_bitmapscan off), since every probe here is an index walk that stops early. In a
-- caller's transaction the caller's values are saved first and put back by stageRestore.
-- name: stage_prelude
SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
    set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
    (SELECT count(*) FROM (SELECT pg_advisory_xact_lock(l) FROM unnest($1::int8[]) AS l OFFSET 0) locked)

-- The prelude of a single message staged at the end of its transaction (StageOptions.EndsTransaction): its
-- key's lock, and generic plans, so a connection never plans the statement per call, nor locks (as planning
-- does) every index of the tables it reads, more relations than the fast-path lock slots hold. Nothing needs
-- the setting put back, and the other settings of stagePrelude are not needed: the statement takes scalar
-- arguments, and every probe it makes has an index that fits it exactly.
-- name: lock_key_generic
SELECT pg_advisory_xact_lock($1), set_config('plan_cache_mode', 'force_generic_plan', true)

-- The commit of a staging transaction that something else repeats when a crash loses it
-- (StageOptions.AsyncCommit): it does not wait for its WAL to reach disk. Set for that transaction only.
-- name: async_commit
SELECT set_config('synchronous_commit', 'off', true)

-- name: stage_save
SELECT set_config('stagehand.plan_cache_mode', current_setting('plan_cache_mode'), true),
    set_config('stagehand.enable_seqscan', current_setting('enable_seqscan'), true),
    set_config('stagehand.enable_bitmapscan', current_setting('enable_bitmapscan'), true)

-- name: stage_restore
SELECT set_config('plan_cache_mode', current_setting('stagehand.plan_cache_mode'), true),
    set_config('enable_seqscan', current_setting('stagehand.enable_seqscan'), true),
    set_config('enable_bitmapscan', current_setting('stagehand.enable_bitmapscan'), true)

-- Staging one message, with scalar arguments (the common case: one event, one message). An ordered message
-- (@ordered true, its key's lock held) draws its sequence number from outbox_seq (migration 031): a later stager of
-- the key waits for the lock, so it draws a higher one. It is parked ('infinity') behind a pending message of
-- its key or a dead letter holding the key, until promoted. Each of those two probes asks for the key's first
-- sequence number (see the claim), as a scalar subquery run once. The new-ID form is a plain insert (no ON
-- CONFLICT: a speculative insertion costs an index probe and a WAL record more, and a conflict there would
-- be a broken promise, better reported) when the message ID cannot have been staged before (see
-- StageOptions.NewIDs); otherwise {dedup one} skips an ID its tenant already has in the sent ledger or the dead
-- letters for the topic. The row is a VALUES list when nothing conditions it ({row one} "VALUES (", {dedup one}
-- ")"), and a SELECT with a WHERE clause otherwise: a SELECT without FROM under an INSERT stays a subquery
-- scan in the plan, one more node to start on every call.
-- name: stage_one
INSERT INTO {outbox} (message_id, message_type, topic, payload, metadata, tenant_id, correlation_id, causation_id,
    partition_key, seq, source_position, scheduled_at, next_attempt_at, created_at)
{row one} @message_id::text, @message_type::text, @topic::text, @payload::bytea, @metadata::jsonb,
    @tenant_id::text, @correlation_id::text, @causation_id::text, @partition_key::text,
    CASE WHEN @ordered::bool THEN nextval('{seq}') END, {position one}, @scheduled_at::timestamptz,
    CASE WHEN @ordered::bool AND ({key_head tenant=@tenant_id key=@partition_key} IS NOT NULL
                               OR {key_hold tenant=@tenant_id key=@partition_key} IS NOT NULL)
         THEN 'infinity'::timestamptz ELSE coalesce(@scheduled_at, @now) END,
    @now::timestamptz
{dedup one}

-- Staging several messages: the same, over arrays, in one scan of them. The caller numbers ordered messages
-- within their key (@key_index, 1..n per key, in the arrays' order): a key's first message is parked when its key
-- has a pending message or a holding dead letter (probed for it alone), the later ones behind it. Sequence
-- numbers are drawn as the rows are read, in the arrays' order, so a key's messages are numbered in the
-- caller's order. No join of the messages with their keys: a plan made for a few rows runs one as a nested
-- loop (a thousand times a thousand comparisons for a batch of a thousand keys).
-- name: stage_many
INSERT INTO {outbox} (message_id, message_type, topic, payload, metadata, tenant_id, correlation_id, causation_id,
    partition_key, seq, source_position, scheduled_at, next_attempt_at, created_at)
SELECT n.message_id, n.message_type, n.topic, n.payload, n.metadata::jsonb, n.tenant_id, n.correlation_id,
    n.causation_id, n.partition_key, CASE WHEN n.key_index IS NOT NULL THEN nextval('{seq}') END, {position many},
    n.scheduled_at,
    CASE WHEN n.key_index > 1 OR n.key_index = 1 AND (
            {key_head tenant=n.tenant_id key=n.partition_key} IS NOT NULL
         OR {key_hold tenant=n.tenant_id key=n.partition_key} IS NOT NULL)
         THEN 'infinity'::timestamptz ELSE coalesce(n.scheduled_at, @now) END,
    @now::timestamptz
FROM unnest(@message_ids::text[], @message_types::text[], @topics::text[], @payloads::bytea[], @metadata::text[],
        @tenant_ids::text[], @correlation_ids::text[], @causation_ids::text[], @partition_keys::text[],
        @source_positions::bigint[], @scheduled_at::timestamptz[], @key_index::bigint[])
    AS n(message_id, message_type, topic, payload, metadata, tenant_id, correlation_id, causation_id,
         partition_key, source_position, scheduled_at, key_index)
WHERE true {dedup many}

-- The recheck closes a race the statement above cannot see: its snapshot predates a relay's move of the
-- same ID into the ledger (or the dead letters), whose delete then lets the insert through. A new statement
-- sees the move and removes the duplicate before the staging transaction commits (READ COMMITTED). A
-- (tenant, ID, topic) is never both pending and sent or dead-lettered once committed, so any row this finds
-- is a duplicate of this transaction's making. Not needed (and not sent) for IDs that are new by
-- construction.
-- name: stage_recheck_one
DELETE FROM {outbox} o WHERE o.message_id = $1 AND o.topic = $2 AND o.tenant_id = $3
  AND (EXISTS (SELECT 1 FROM {sent} s WHERE s.message_id = $1 AND s.topic = $2 AND s.tenant_id = $3)
       OR EXISTS (SELECT 1 FROM {dead} d WHERE d.message_id = $1 AND d.topic = $2 AND d.tenant_id = $3))

-- Each staged (tenant, ID, topic) probes the ledger and the dead letters (usually a miss, so nothing
-- more), and only a hit looks the row up; the LATERAL joins fix that order. Each has a LIMIT (the row lookup
-- finds at most one row anyway), which keeps the planner from pulling it up into a plain join: on statistics
-- of a drained outbox that join was driven by a full scan of the outbox, comparing every row with every ID.
-- name: stage_recheck_many
DELETE FROM {outbox} WHERE id = ANY (ARRAY(
    SELECT o.id FROM unnest($1::text[], $2::text[], $3::text[]) AS k(message_id, topic, tenant_id)
    CROSS JOIN LATERAL (
        SELECT 1 FROM {sent} s WHERE s.message_id = k.message_id AND s.topic = k.topic AND s.tenant_id = k.tenant_id
        UNION ALL
        SELECT 1 FROM {dead} d WHERE d.message_id = k.message_id AND d.topic = k.topic AND d.tenant_id = k.tenant_id
        LIMIT 1) hit
    CROSS JOIN LATERAL (
        SELECT o.id FROM {outbox} o
        WHERE o.message_id = k.message_id AND o.topic = k.topic AND o.tenant_id = k.tenant_id
        LIMIT 1) o))

-- The fence of a leader-elected relay's writes: one row, the lease row locked FOR SHARE until the transaction
-- ends, only while the relay's term still holds the lease (see lease.CheckTx).
-- fragment: relay_fence
fence AS (SELECT 1 FROM {leases} WHERE name = @fence_name::text AND owner = @fence_owner::text
          AND token = @fence_token::bigint FOR SHARE)

-- Claim: due, unleased rows that are the first pending message of their key (or unordered), oldest first,
-- skipping rows another relay is claiming. For the first @run_heads of those heads, also the (parked) messages
-- that follow it in its key, up to @run_length per key, so a relay delivers a key's run in order without a claim (and a
-- promotion) per message. The batch is filled head by head, each with its run. The head check guards order
-- even if a row were wrongly unparked. Rows are updated by ctid (a TID scan, no join); a row moved by a
-- concurrent update is followed to its new version. Lease updates touch no indexed column (HOT).
--
-- Every probe of a key's messages or dead letters (here, in staging, promotions and the sweep) asks for the
-- key's first sequence number (ORDER BY seq LIMIT 1) rather than whether an earlier one exists: only the
-- key indexes give that order, so no plan probes through another index holding tenant_id (the message
-- keys, migration 026) and filters the whole table per row, as a plan costed on a queue table's stale
-- statistics (an empty table) otherwise may.
-- name: claim
WITH {fence,}heads AS (
    SELECT o.ctid, o.tenant_id, o.partition_key, o.seq, row_number() OVER (ORDER BY o.next_attempt_at) AS hn
    FROM (
        SELECT o.ctid, o.tenant_id, o.partition_key, o.seq, o.next_attempt_at
        FROM {outbox} o
        WHERE o.next_attempt_at <= @now::timestamptz AND o.next_attempt_at < 'infinity'
          AND (o.lease_expires_at IS NULL OR o.lease_expires_at <= @now::timestamptz{takeover})
          AND (@topics::text[] IS NULL OR o.topic = ANY(@topics)){partition}{fenced}
          AND (o.seq IS NULL OR (
              o.seq = {key_head tenant=o.tenant_id key=o.partition_key}
              AND coalesce({key_hold tenant=o.tenant_id key=o.partition_key} >= o.seq, true)))
        ORDER BY o.next_attempt_at
        LIMIT @limit::int
        FOR UPDATE SKIP LOCKED
    ) o
), tails AS (
    SELECT t.ctid, h.hn, t.rank FROM heads h
    CROSS JOIN LATERAL (
        SELECT p.ctid, row_number() OVER (ORDER BY p.seq) AS rank
        FROM {outbox} p
        WHERE p.tenant_id = h.tenant_id AND p.partition_key = h.partition_key AND p.seq > h.seq
        ORDER BY p.seq
        LIMIT @run_length::int
    ) t
    WHERE h.seq IS NOT NULL AND h.hn <= @run_heads::int
), picked AS (
    SELECT ctid FROM (
        SELECT ctid, hn, 0::bigint AS rank FROM heads
        UNION ALL
        SELECT ctid, hn, rank FROM tails
    ) c
    ORDER BY hn, rank
    LIMIT @limit::int
)
UPDATE {outbox} o SET lease_owner = @owner::text, lease_expires_at = @claim_until::timestamptz
WHERE o.ctid = ANY (ARRAY(SELECT ctid FROM picked))
RETURNING o.id, o.message_id, o.topic, o.message_type, o.payload, o.metadata, o.tenant_id, o.correlation_id,
    o.causation_id, o.partition_key, o.seq, o.attempts, o.created_at, o.scheduled_at

-- When the earliest row not yet due at $1 (the claim's instant) falls due: sent after the claim, in its round trip,
-- when the relay is not draining (claimLoop.claim).
-- name: next_due
SELECT min(next_attempt_at) FROM {outbox}
WHERE next_attempt_at > $1 AND next_attempt_at < 'infinity' AND ($2::text[] IS NULL OR topic = ANY($2))

-- Mark: move published rows still leased by this relay into the ledger, in one statement. {on conflict} is empty in
-- the mark the relay runs first, and "ON CONFLICT ... DO NOTHING" in the one it runs again when that mark fails on
-- the ledger's key (claimLoop.mark): a message already in the ledger is rare (a re-staging that raced its first
-- mark), and a speculative insertion per row cost the mark a quarter of its time (12 against 15-19 µs a row).
-- name: mark
WITH {fence,}done AS (
    DELETE FROM {outbox} WHERE id = ANY(@ids::bigint[]) AND lease_owner = @owner::text{fenced}
    RETURNING message_id, tenant_id, topic, message_type, source_position, attempts, created_at
)
INSERT INTO {sent} (message_id, tenant_id, topic, message_type, source_position, attempts, created_at, sent_at)
SELECT message_id, tenant_id, topic, message_type, source_position, attempts + 1, created_at, @now::timestamptz FROM done{on conflict}

-- Fail: count a rejected attempt and back the row off.
-- name: fail
{with fence}UPDATE {outbox} SET attempts = attempts + 1, last_error = @error::text, next_attempt_at = @next_attempt_at::timestamptz,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = @id::bigint AND lease_owner = @owner::text{fenced}

-- Release: give rows back without counting an attempt (never delivered, relay closing). The rows in @first_ids are
-- the first this relay released of their key: they are made due (they may still be parked, since the relay
-- promotes a key's next message only when its run ends).
-- name: release
{with fence}UPDATE {outbox} SET lease_owner = NULL, lease_expires_at = NULL,
    next_attempt_at = CASE WHEN id = ANY(@first_ids::bigint[]) AND next_attempt_at = 'infinity' THEN @now::timestamptz ELSE next_attempt_at END
WHERE id = ANY(@ids::bigint[]) AND lease_owner = @owner::text{fenced}

-- Unreachable: like release (of the first row of its key's run: made due), but remember why the row is still
-- pending.
-- name: unreachable
{with fence}UPDATE {outbox} SET lease_owner = NULL, lease_expires_at = NULL, last_error = @error::text,
    next_attempt_at = CASE WHEN next_attempt_at = 'infinity' THEN @now::timestamptz ELSE next_attempt_at END
WHERE id = @id::bigint AND lease_owner = @owner::text{fenced}

-- name: extend
{with fence}UPDATE {outbox} SET lease_expires_at = @until::timestamptz WHERE id = ANY(@ids::bigint[]) AND lease_owner = @owner::text{fenced}

-- Dead letter: move the row, with its last error and that error's type and signature, in one statement.
-- name: dead_letter
WITH {fence,}gone AS (
    DELETE FROM {outbox} WHERE id = @id::bigint AND lease_owner = @owner::text{fenced} RETURNING *
)
INSERT INTO {dead} (message_id, tenant_id, message_type, topic, payload, metadata, correlation_id, causation_id,
    partition_key, seq, source_position, scheduled_at, attempts, last_error, holds_key, created_at, dead_at,
    error_type, error_signature)
SELECT message_id, tenant_id, message_type, topic, payload, metadata, correlation_id, causation_id,
    partition_key, seq, source_position, scheduled_at, attempts + 1, @error::text, seq IS NOT NULL AND @holds_key::bool, created_at, @now::timestamptz,
    @error_type::text, @error_signature::text
FROM gone

-- Lock keys without waiting ($1: keyLock of each key): a key whose lock a staging transaction holds is
-- skipped (and promoted again later), because that transaction may be parking a message this promotion
-- cannot see yet. Returns the 1-based positions in $1 of the keys it locked. A try never waits, so the
-- order does not matter.
-- name: lock_keys
SELECT r.i::int FROM unnest($1::int8[]) WITH ORDINALITY AS r(l, i) WHERE pg_try_advisory_xact_lock(r.l)

-- Lock keys, waiting ($1 sorted ascending, as staging locks them, so two waiters never deadlock).
-- name: lock_keys_wait
SELECT count(*) FROM (SELECT pg_advisory_xact_lock(l) FROM unnest($1::int8[]) AS l OFFSET 0) locked

-- Promote: make the first pending message of each key ($1 tenants, $2 keys) due, when it is parked and no
-- dead letter holds the key. The rows are found first, one index probe per key, then updated by key: every
-- statement that updates a set it computes is written this way, so that no plan (on a queue table the
-- planner's row estimates are often wrong by orders of magnitude) can drive the computation from the table
-- side. The update's recheck that the row is still parked is written ">= 'infinity'" (nothing is later), not
-- "= 'infinity'": the latter matches the parked index's predicate, and a plan on stale statistics (the table
-- analysed while nearly empty) then scanned the whole parked index and compared every entry with the ids,
-- which with a backlog of tens of thousands of parked messages made one sweep run for minutes.
-- name: promote
UPDATE {outbox} SET next_attempt_at = $3
WHERE next_attempt_at >= 'infinity' AND id = ANY (ARRAY(
    SELECT h.id FROM unnest($1::text[], $2::text[]) AS k(tenant_id, partition_key)
    CROSS JOIN LATERAL (
        SELECT p.id, p.seq, p.next_attempt_at FROM {outbox} p
        WHERE p.tenant_id = k.tenant_id AND p.partition_key = k.partition_key AND p.seq IS NOT NULL
        ORDER BY p.seq LIMIT 1
    ) h
    WHERE h.next_attempt_at = 'infinity'
      AND coalesce({key_hold tenant=k.tenant_id key=k.partition_key} >= h.seq, true)))

-- Sweep: promote where a promotion was missed (a relay that died between a mark and a retried
-- promotion). Visits each (tenant, key) with parked messages once (a skip scan), not each parked message.
-- name: sweep
WITH RECURSIVE parked(tenant_id, partition_key) AS (
    (SELECT tenant_id, partition_key FROM {outbox} WHERE next_attempt_at = 'infinity'
     ORDER BY tenant_id, partition_key LIMIT 1)
    UNION ALL
    SELECT n.tenant_id, n.partition_key FROM parked
    CROSS JOIN LATERAL (
        SELECT o.tenant_id, o.partition_key FROM {outbox} o
        WHERE o.next_attempt_at = 'infinity'
          AND (o.tenant_id, o.partition_key) > (parked.tenant_id, parked.partition_key)
        ORDER BY o.tenant_id, o.partition_key LIMIT 1
    ) n
), heads AS (
    SELECT h.id FROM parked
    CROSS JOIN LATERAL (
        SELECT p.id, p.seq, p.next_attempt_at FROM {outbox} p
        WHERE p.tenant_id = parked.tenant_id AND p.partition_key = parked.partition_key AND p.seq IS NOT NULL
        ORDER BY p.seq LIMIT 1
    ) h
    WHERE h.next_attempt_at = 'infinity'
      AND coalesce({key_hold tenant=parked.tenant_id key=parked.partition_key} >= h.seq, true)
)
UPDATE {outbox} SET next_attempt_at = $1
WHERE next_attempt_at >= 'infinity' AND id = ANY (ARRAY(SELECT id FROM heads)) -- ">=": see promote
RETURNING partition_key

-- Stats: the parked messages (next_attempt_at 'infinity') split by what they wait for: a dead letter holding their
-- key (one with an earlier sequence number), else an earlier pending message of their key. The hot table is scanned
-- once for the counts; the held ones are counted from the other side, per (tenant, key) a dead letter holds: its
-- parked messages after the first holding sequence number, through the key index. Dead letters holding their key
-- are few, so this costs a probe each, where probing the dead letters for each parked row cost one per row.
-- name: stats
WITH held AS (
    SELECT coalesce(sum((SELECT count(*) FROM {outbox} p
                         WHERE p.tenant_id = k.tenant_id AND p.partition_key = k.partition_key AND p.seq > k.seq
                           AND p.next_attempt_at = 'infinity')), 0) AS n
    FROM (SELECT d.tenant_id, d.partition_key, min(d.seq) AS seq FROM {dead} d
          WHERE d.holds_key AND d.seq IS NOT NULL AND ($1::text IS NULL OR d.tenant_id = $1)
          GROUP BY d.tenant_id, d.partition_key) k
)
SELECT
    count(*) FILTER (WHERE o.scheduled_at IS NULL OR o.scheduled_at <= $2),
    count(*) FILTER (WHERE o.scheduled_at > $2 AND o.next_attempt_at < 'infinity'),
    count(*) FILTER (WHERE o.attempts > 0 AND o.next_attempt_at > $2 AND o.next_attempt_at < 'infinity'),
    count(*) FILTER (WHERE o.next_attempt_at = 'infinity') - (SELECT n FROM held),
    (SELECT n FROM held),
    count(*) FILTER (WHERE o.lease_owner IS NOT NULL AND o.lease_expires_at > $2),
    min(coalesce(o.scheduled_at, o.created_at)) FILTER (WHERE o.scheduled_at IS NULL OR o.scheduled_at <= $2),
    (SELECT count(*) FROM {dead} WHERE $1::text IS NULL OR tenant_id = $1),
    {sent count}
FROM {outbox} o
WHERE $1::text IS NULL OR o.tenant_id = $1

-- The entries of the sent ledger ({sent count} of stats; Admin.Backlog leaves it out): the one figure of stats
-- that reads a whole table that may hold millions of rows.
-- fragment: sent_count
(SELECT count(*) FROM {sent} WHERE $1::text IS NULL OR tenant_id = $1)

-- The relay's gauges (relayTelemetry.gauges): ready messages ($1 now) and the oldest one's time, the parked ones
-- split as in stats. A scan of the hot outbox table, which holds only messages still to publish; only parked rows
-- probe the dead letters, through the key index.
-- name: gauges
SELECT count(*) FILTER (WHERE o.scheduled_at IS NULL OR o.scheduled_at <= $1),
    min(coalesce(o.scheduled_at, o.created_at)) FILTER (WHERE o.scheduled_at IS NULL OR o.scheduled_at <= $1),
    count(*) FILTER (WHERE o.next_attempt_at = 'infinity' AND coalesce(h.seq >= o.seq, true)),
    count(*) FILTER (WHERE o.next_attempt_at = 'infinity' AND h.seq < o.seq)
FROM {outbox} o
LEFT JOIN LATERAL (
    SELECT {key_hold tenant=o.tenant_id key=o.partition_key} AS seq WHERE o.next_attempt_at = 'infinity') h ON true

-- A staged message whose ID may have been staged before (StageOptions.NewIDs false) is skipped when its tenant
-- already has the ID in the sent ledger or the dead letters for the topic, or pending ({dedup one} and {dedup many}
-- of stage_one and stage_many).
-- Staging after a watermark (StageOptions.Watermark, @watermark): a message whose source position is at or below it is
-- left out. The watermark's owner has passed its event and staged it itself, and cleanup may have forgotten its
-- publication since, so staging it again could publish it twice. The transaction has locked the watermark's row
-- (FOR SHARE, watermark_for_share) before its key locks, so the watermark stays where this reads it until the
-- staging commits. A watermark not registered yet leaves nothing out. The subquery is uncorrelated: it runs once
-- per statement.
-- fragment: after_watermark_one
  AND (@source_position::bigint IS NULL
       OR @source_position::bigint > coalesce((SELECT w.position FROM {watermarks} w WHERE w.name = @watermark::text),
                                              -1))

-- fragment: after_watermark_many
  AND (n.source_position IS NULL
       OR n.source_position > coalesce((SELECT w.position FROM {watermarks} w WHERE w.name = @watermark::text), -1))

-- fragment: dedup_one
  AND NOT EXISTS (SELECT 1 FROM {sent} s
                  WHERE s.message_id = @message_id AND s.topic = @topic AND s.tenant_id = @tenant_id)
  AND NOT EXISTS (SELECT 1 FROM {dead} d
                  WHERE d.message_id = @message_id AND d.topic = @topic AND d.tenant_id = @tenant_id)
ON CONFLICT (message_id, topic, tenant_id) DO NOTHING

-- fragment: dedup_many
  AND NOT EXISTS (SELECT 1 FROM {sent} s
                  WHERE s.message_id = n.message_id AND s.topic = n.topic AND s.tenant_id = n.tenant_id)
  AND NOT EXISTS (SELECT 1 FROM {dead} d
                  WHERE d.message_id = n.message_id AND d.topic = n.topic AND d.tenant_id = n.tenant_id)
ON CONFLICT (message_id, topic, tenant_id) DO NOTHING

-- Pending messages grouped by {group cols} ({group by}: the topic, the tenant, or the (tenant, partition key)), the
-- largest groups first, at most $3; of tenant $1 when not NULL, $2 the time now. A scan of the hot table, which
-- holds only messages still to publish.
-- name: pending_groups
SELECT {group cols}, count(*),
    count(*) FILTER (WHERE o.scheduled_at > $2 AND o.next_attempt_at < 'infinity'),
    count(*) FILTER (WHERE o.attempts > 0 AND o.next_attempt_at > $2 AND o.next_attempt_at < 'infinity'),
    count(*) FILTER (WHERE o.next_attempt_at = 'infinity'),
    count(*) FILTER (WHERE o.lease_owner IS NOT NULL AND o.lease_expires_at > $2),
    min(coalesce(o.scheduled_at, o.created_at)) FILTER (WHERE o.scheduled_at IS NULL OR o.scheduled_at <= $2),
    max(o.attempts)
FROM {outbox} o
WHERE $1::text IS NULL OR o.tenant_id = $1
GROUP BY {group by}
ORDER BY count(*) DESC, {group by}
LIMIT $3

-- The columns of a pending message as the operator views list it (no payload: its size).
-- fragment: pending_columns
o.id, o.message_id, o.tenant_id, o.topic, o.message_type, o.partition_key, o.seq, o.attempts,
    coalesce(o.last_error, ''), o.scheduled_at, o.next_attempt_at, o.created_at, coalesce(o.lease_owner, ''),
    o.lease_expires_at, octet_length(o.payload), o.source_position

-- Scheduled messages (of tenant $1 when not NULL) whose time ($2 now) is still ahead, soonest first, after the
-- row ($3, $4) in (next_attempt_at, id) order, at most $5. Through the claim index (a scheduled message is never
-- parked: it is due at its time).
-- name: list_scheduled
SELECT {pending_columns}
FROM {outbox} o
WHERE o.next_attempt_at > $2 AND o.next_attempt_at < 'infinity' AND o.scheduled_at > $2
  AND ($1::text IS NULL OR o.tenant_id = $1)
  AND (o.next_attempt_at, o.id) > ($3::timestamptz, $4::bigint)
ORDER BY o.next_attempt_at, o.id
LIMIT $5

-- The pending messages of the key ($1, $2) in their order (sequence numbers after $3), at most $4: the key's head
-- first. Through the key index (migration 025).
-- name: key_messages
SELECT {pending_columns}
FROM {outbox} o
WHERE o.tenant_id = $1 AND o.partition_key = $2 AND o.seq IS NOT NULL AND o.seq > $3
ORDER BY o.seq
LIMIT $4

-- The rows each relay (lease owner) holds now ($1), of tenant $2 when not NULL.
-- name: in_flight_by_owner
SELECT o.lease_owner, count(*), min(o.lease_expires_at), max(o.lease_expires_at)
FROM {outbox} o
WHERE o.lease_owner IS NOT NULL AND o.lease_expires_at > $1 AND ($2::text IS NULL OR o.tenant_id = $2)
GROUP BY o.lease_owner
ORDER BY o.lease_owner

-- What the outbox, the ledger and the inbox recorded in the window ($1, $2] (of tenant $3 when not NULL), and the
-- backlog at $2: messages staged (by their staging time, wherever they are now: pending, sent or dead-lettered),
-- published, dead-lettered, handled, inbox dead-lettered and inbox handler failures (each failing pair once, at its
-- last failure); pending messages due and the oldest one's time. The ledger and the inbox are read through their
-- BRIN indexes on time (a message staged in the window was sent after its start), the dead letters through their
-- index on time (migration 040); the hot outbox table is scanned.
-- name: activity
SELECT
    (SELECT count(*) FROM {sent} s WHERE s.sent_at > $1 AND s.created_at > $1 AND s.created_at <= $2
        AND ($3::text IS NULL OR s.tenant_id = $3)),
    o.staged,
    (SELECT count(*) FROM {dead} d WHERE d.dead_at > $1 AND d.created_at > $1 AND d.created_at <= $2
        AND ($3::text IS NULL OR d.tenant_id = $3)),
    (SELECT count(*) FROM {sent} s WHERE s.sent_at > $1 AND s.sent_at <= $2 AND s.outcome = 'sent'
        AND ($3::text IS NULL OR s.tenant_id = $3)),
    (SELECT count(*) FROM {dead} d WHERE d.dead_at > $1 AND d.dead_at <= $2
        AND ($3::text IS NULL OR d.tenant_id = $3)),
    (SELECT count(*) FROM {inbox} i WHERE i.processed_at > $1 AND i.processed_at <= $2 AND i.outcome = 'handled'
        AND ($3::text IS NULL OR i.tenant_id = $3)),
    (SELECT count(*) FROM {inbox_dead} d WHERE d.dead_at > $1 AND d.dead_at <= $2
        AND ($3::text IS NULL OR d.tenant_id = $3)),
    (SELECT count(*) FROM {inbox_attempts} a WHERE a.last_failed_at > $1 AND a.last_failed_at <= $2
        AND ($3::text IS NULL OR a.tenant_id = $3)),
    o.pending, o.oldest
FROM (
    SELECT count(*) FILTER (WHERE created_at > $1 AND created_at <= $2) AS staged,
        count(*) FILTER (WHERE scheduled_at IS NULL OR scheduled_at <= $2) AS pending,
        min(coalesce(scheduled_at, created_at)) FILTER (WHERE scheduled_at IS NULL OR scheduled_at <= $2) AS oldest
    FROM {outbox} WHERE $3::text IS NULL OR tenant_id = $3
) o

-- What became of the messages staged from the log positions $1 (between $2 and $3, which lets the ledger's BRIN
-- index on source positions (migration 040) skip the rest), of tenant $4 when not NULL: pending, dead-lettered,
-- sent or discarded. The hot outbox table and the dead letters are scanned; the ledger is read through its index.
-- name: staged_from
SELECT 'pending', o.source_position, o.message_id, o.tenant_id, o.topic, o.message_type, o.created_at,
    NULL::timestamptz, o.attempts, coalesce(o.last_error, '')
FROM {outbox} o WHERE o.source_position = ANY ($1::bigint[]) AND ($4::text IS NULL OR o.tenant_id = $4)
UNION ALL
SELECT 'dead-lettered', d.source_position, d.message_id, d.tenant_id, d.topic, d.message_type, d.created_at,
    d.dead_at, d.attempts, d.last_error
FROM {dead} d WHERE d.source_position = ANY ($1::bigint[]) AND ($4::text IS NULL OR d.tenant_id = $4)
UNION ALL
SELECT s.outcome, s.source_position, s.message_id, s.tenant_id, s.topic, s.message_type, s.created_at, s.sent_at,
    s.attempts, ''
FROM {sent} s WHERE s.source_position BETWEEN $2 AND $3 AND s.source_position = ANY ($1::bigint[])
    AND ($4::text IS NULL OR s.tenant_id = $4)
