package outbox

import (
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/internal/lease"
)

// queries holds every statement of the package, qualified with the configured schema. The table layout and the
// reasons for it are in internal/migrate/sql/010_outbox.sql and 011_inbox.sql; 025_outbox_tenant_keys.sql makes
// per-key order per (tenant, partition key) and 026_tenant_message_identity.sql makes a message's identity
// (tenant, message ID, topic) in the outbox and (tenant, message ID, handler) in the inbox.
type queries struct {
	schema      string
	tableOutbox string // the outbox table, qualified
	// tables are the table markers of the templates and their qualified names, in strings.NewReplacer's form.
	tables []string

	stagePrelude, stageSave, stageRestore, lockKeyGeneric string
	// stageOne and stageMany are the templates of the staging inserts, dedupOne and dedupMany their expanded
	// deduplication conditions; staging holds them expanded for messages whose source positions are given.
	stageOne, stageMany, dedupOne, dedupMany         string
	staging                                          stagingStatements
	stageRecheckOne, stageRecheckMany                string
	relaySettings, vacuum                            string
	claim, nextDue                                   string
	mark, fail, release, unreachable, extend         string
	lockKeys, lockKeysWait, promote, sweep           string
	deadLetter                                       string
	redrive, discard                                 string
	listDead, getDead                                string
	stats                                            string
	cleanupSent                                      string
	registerWatermark, advanceWatermark, dropWM, wms string

	inboxClaim, inboxAttempt, inboxClearAttempts     string
	inboxDeadLetter, inboxMarkDead                   string
	inboxStats, inboxCleanup, inboxListDead, inboxRm string
}

func newQueries(schema string) queries {
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	tables := []string{
		"{outbox}", t("outbox"),
		"{seq}", strings.ReplaceAll(t("outbox_seq"), "'", "''"), // inside a string literal: nextval('{seq}')
		"{sent}", t("outbox_sent"),
		"{dead}", t("outbox_dead_letters"),
		"{watermarks}", t("outbox_watermarks"),
		"{inbox}", t("inbox"),
		"{inbox_attempts}", t("inbox_attempts"),
		"{inbox_dead}", t("inbox_dead_letters"),
	}
	q := queries{
		schema:      schema,
		tables:      tables,
		tableOutbox: t("outbox"),
		// Settings for the implicit transaction of each of the relay's own batches:
		//   - Generic plans (plan_cache_mode). The relay's statements take arrays and run many times a second on
		//     few connections: planned anew on each call (what PostgreSQL does when a custom plan looks cheaper
		//     than the generic one, as it does with arrays of known length) they spent more time planning than
		//     running. Every plan below is an index walk that does not depend on the arguments' values.
		//   - Index access only (enable_seqscan, enable_bitmapscan off). Every statement here is built around an
		//     index walk that stops early (oldest due rows, the first row of a key, a key's run), which only pays
		//     off with a plain index scan. The planner's estimates cannot be trusted on a queue table: a vacuum
		//     that finds it empty records zero rows, and until the next analyze a burst of thousands of rows is
		//     planned as an empty table (a bitmap scan and sort of every due row per claim, seq scans per key).
		//   - JIT off. Per-key runs give estimates that can push the statements past jit_above_cost: compiling
		//     then costs far more (about a second) than the statement (milliseconds).
		//   - synchronous_commit off. Leases, marks, backoffs, dead-letter moves and promotions need no WAL flush
		//     before the relay goes on: a crash that loses the last of them leaves the database as it was a moment
		//     earlier, where the affected messages are still pending, so they are published again (a duplicate,
		//     which at-least-once allows) and none is lost. Staging is never affected: it commits in the caller's
		//     transaction with the caller's settings.
		// The relay's vacuum of the outbox table: see claimLoop.vacuumer.
		vacuum: `VACUUM (SKIP_LOCKED, TRUNCATE false, PARALLEL 0) {outbox}`,

		relaySettings: `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
    set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
    set_config('jit', 'off', true), set_config('synchronous_commit', 'off', true)`,

		// Staging, first statement: the prelude. It takes, in ascending order (as every waiting locker does, so two
		// stagers never deadlock), the transaction-scoped advisory lock of every (tenant, partition key) the call
		// orders ($1: keyLock of each), so a later stager of the same key waits for this transaction to end and
		// draws higher sequence numbers: sequence order is staging-commit order. The statements after it take their
		// snapshots once the locks are held, so they see every earlier staging of these keys.
		//
		// It also sets, for the rest of the transaction, what the staging statements need whatever the table's
		// statistics say (a queue table's are usually wrong: a vacuum that finds it empty records zero rows):
		// generic plans (plan_cache_mode), since a re-plan of these statements costs more than running them and a
		// custom plan is what an array argument would otherwise get on every call; and index access only
		// (enable_seqscan, enable_bitmapscan off), since every probe here is an index walk that stops early. In a
		// caller's transaction the caller's values are saved first and put back by stageRestore.
		stagePrelude: `SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
    set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true),
    (SELECT count(*) FROM (SELECT pg_advisory_xact_lock(l) FROM unnest($1::int8[]) AS l OFFSET 0) locked)`,
		// The prelude of a single message staged at the end of its transaction (StageOptions.EndsTransaction): its
		// key's lock, and generic plans, so a connection never plans the statement per call, nor locks (as planning
		// does) every index of the tables it reads, more relations than the fast-path lock slots hold. Nothing needs
		// the setting put back, and the other settings of stagePrelude are not needed: the statement takes scalar
		// arguments, and every probe it makes has an index that fits it exactly.
		lockKeyGeneric: `SELECT pg_advisory_xact_lock($1), set_config('plan_cache_mode', 'force_generic_plan', true)`,
		stageSave: `SELECT set_config('stagehand.plan_cache_mode', current_setting('plan_cache_mode'), true),
    set_config('stagehand.enable_seqscan', current_setting('enable_seqscan'), true),
    set_config('stagehand.enable_bitmapscan', current_setting('enable_bitmapscan'), true)`,
		stageRestore: `SELECT set_config('plan_cache_mode', current_setting('stagehand.plan_cache_mode'), true),
    set_config('enable_seqscan', current_setting('stagehand.enable_seqscan'), true),
    set_config('enable_bitmapscan', current_setting('stagehand.enable_bitmapscan'), true)`,

		// Staging one message, with scalar arguments (the common case: one event, one message). An ordered message
		// ($10 true, its key's lock held) draws its sequence number from outbox_seq (migration 031): a later stager of
		// the key waits for the lock, so it draws a higher one. It is parked ('infinity') behind a pending message of
		// its key or a dead letter holding the key, until promoted. Each of those two probes asks for the key's first
		// sequence number (see the claim), as a scalar subquery run once. The new-ID form is a plain insert (no ON
		// CONFLICT: a speculative insertion costs an index probe and a WAL record more, and a conflict there would
		// be a broken promise, better reported): {dedup one} is empty when the message ID cannot have been staged
		// before (see StageOptions.NewIDs); otherwise it skips an ID its tenant already has in the sent ledger or
		// the dead letters for the topic.
		stageOne: `
INSERT INTO {outbox} (message_id, message_type, topic, payload, metadata, tenant_id, correlation_id, causation_id,
    partition_key, seq, source_position, scheduled_at, next_attempt_at, created_at)
SELECT $1::text, $2::text, $3::text, $4::bytea, $5::jsonb, $6::text, $7::text, $8::text, $9::text,
    CASE WHEN $10::bool THEN nextval('{seq}') END, {position one}, $12::timestamptz,
    CASE WHEN $10::bool AND (
            (SELECT p.seq FROM {outbox} p
             WHERE p.tenant_id = $6 AND p.partition_key = $9 AND p.seq IS NOT NULL
             ORDER BY p.seq LIMIT 1) IS NOT NULL
         OR (SELECT d.seq FROM {dead} d
             WHERE d.holds_key AND d.tenant_id = $6 AND d.partition_key = $9 AND d.seq IS NOT NULL
             ORDER BY d.seq LIMIT 1) IS NOT NULL)
         THEN 'infinity'::timestamptz ELSE coalesce($12, $13) END,
    $13::timestamptz
WHERE true{dedup one}`,

		// Staging several messages: the same, over arrays, in one scan of them. The caller numbers ordered messages
		// within their key ($12, 1..n per key, in the arrays' order): a key's first message is parked when its key
		// has a pending message or a holding dead letter (probed for it alone), the later ones behind it. Sequence
		// numbers are drawn as the rows are read, in the arrays' order, so a key's messages are numbered in the
		// caller's order. No join of the messages with their keys: a plan made for a few rows runs one as a nested
		// loop (a thousand times a thousand comparisons for a batch of a thousand keys).
		stageMany: `
INSERT INTO {outbox} (message_id, message_type, topic, payload, metadata, tenant_id, correlation_id, causation_id,
    partition_key, seq, source_position, scheduled_at, next_attempt_at, created_at)
SELECT n.message_id, n.message_type, n.topic, n.payload, n.metadata::jsonb, n.tenant_id, n.correlation_id,
    n.causation_id, n.partition_key, CASE WHEN n.key_index IS NOT NULL THEN nextval('{seq}') END, {position many},
    n.scheduled_at,
    CASE WHEN n.key_index > 1 OR n.key_index = 1 AND (
            (SELECT p.seq FROM {outbox} p
             WHERE p.tenant_id = n.tenant_id AND p.partition_key = n.partition_key AND p.seq IS NOT NULL
             ORDER BY p.seq LIMIT 1) IS NOT NULL
         OR (SELECT d.seq FROM {dead} d
             WHERE d.holds_key AND d.tenant_id = n.tenant_id AND d.partition_key = n.partition_key
               AND d.seq IS NOT NULL
             ORDER BY d.seq LIMIT 1) IS NOT NULL)
         THEN 'infinity'::timestamptz ELSE coalesce(n.scheduled_at, $13) END,
    $13
FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::text[], $7::text[], $8::text[],
        $9::text[], $10::bigint[], $11::timestamptz[], $12::bigint[])
    AS n(message_id, message_type, topic, payload, metadata, tenant_id, correlation_id, causation_id,
         partition_key, source_position, scheduled_at, key_index)
WHERE true{dedup many}`,

		// The recheck closes a race the statement above cannot see: its snapshot predates a relay's move of the
		// same ID into the ledger (or the dead letters), whose delete then lets the insert through. A new statement
		// sees the move and removes the duplicate before the staging transaction commits (READ COMMITTED). A
		// (tenant, ID, topic) is never both pending and sent or dead-lettered once committed, so any row this finds
		// is a duplicate of this transaction's making. Not needed (and not sent) for IDs that are new by
		// construction.
		stageRecheckOne: `
DELETE FROM {outbox} o WHERE o.message_id = $1 AND o.topic = $2 AND o.tenant_id = $3
  AND (EXISTS (SELECT 1 FROM {sent} s WHERE s.message_id = $1 AND s.topic = $2 AND s.tenant_id = $3)
       OR EXISTS (SELECT 1 FROM {dead} d WHERE d.message_id = $1 AND d.topic = $2 AND d.tenant_id = $3))`,
		// Each staged (tenant, ID, topic) probes the ledger and the dead letters (usually a miss, so nothing
		// more), and only a hit looks the row up; the LATERAL joins fix that order.
		stageRecheckMany: `
DELETE FROM {outbox} WHERE id = ANY (ARRAY(
    SELECT o.id FROM unnest($1::text[], $2::text[], $3::text[]) AS k(message_id, topic, tenant_id)
    CROSS JOIN LATERAL (
        SELECT 1 FROM {sent} s WHERE s.message_id = k.message_id AND s.topic = k.topic AND s.tenant_id = k.tenant_id
        UNION ALL
        SELECT 1 FROM {dead} d WHERE d.message_id = k.message_id AND d.topic = k.topic AND d.tenant_id = k.tenant_id
        LIMIT 1) hit
    CROSS JOIN LATERAL (
        SELECT o.id FROM {outbox} o
        WHERE o.message_id = k.message_id AND o.topic = k.topic AND o.tenant_id = k.tenant_id) o))`,

		// Claim: due, unleased rows that are the first pending message of their key (or unordered), oldest first,
		// skipping rows another relay is claiming. For the first $7 of those heads, also the (parked) messages that
		// follow it in its key, up to $6 per key, so a relay delivers a key's run in order without a claim (and a
		// promotion) per message. The batch is filled head by head, each with its run. The head check guards order
		// even if a row were wrongly unparked. Rows are updated by ctid (a TID scan, no join); a row moved by a
		// concurrent update is followed to its new version. Lease updates touch no indexed column (HOT).
		//
		// Every probe of a key's messages or dead letters (here, in staging, promotions and the sweep) asks for the
		// key's first sequence number (ORDER BY seq LIMIT 1) rather than whether an earlier one exists: only the
		// key indexes give that order, so no plan probes through another index holding tenant_id (the message
		// keys, migration 026) and filters the whole table per row, as a plan costed on a queue table's stale
		// statistics (an empty table) otherwise may.
		claim: `
WITH {fence,}heads AS (
    SELECT o.ctid, o.tenant_id, o.partition_key, o.seq, row_number() OVER (ORDER BY o.next_attempt_at) AS hn
    FROM (
        SELECT o.ctid, o.tenant_id, o.partition_key, o.seq, o.next_attempt_at
        FROM {outbox} o
        WHERE o.next_attempt_at <= $1 AND o.next_attempt_at < 'infinity'
          AND (o.lease_expires_at IS NULL OR o.lease_expires_at <= $1{takeover})
          AND ($5::text[] IS NULL OR o.topic = ANY($5)){partition}{fenced}
          AND (o.seq IS NULL OR (
              o.seq = (SELECT p.seq FROM {outbox} p
                       WHERE p.tenant_id = o.tenant_id AND p.partition_key = o.partition_key AND p.seq IS NOT NULL
                       ORDER BY p.seq LIMIT 1)
              AND coalesce((SELECT d.seq FROM {dead} d
                            WHERE d.holds_key AND d.seq IS NOT NULL AND d.tenant_id = o.tenant_id
                              AND d.partition_key = o.partition_key
                            ORDER BY d.seq LIMIT 1) >= o.seq, true)))
        ORDER BY o.next_attempt_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ) o
), tails AS (
    SELECT t.ctid, h.hn, t.rank FROM heads h
    CROSS JOIN LATERAL (
        SELECT p.ctid, row_number() OVER (ORDER BY p.seq) AS rank
        FROM {outbox} p
        WHERE p.tenant_id = h.tenant_id AND p.partition_key = h.partition_key AND p.seq > h.seq
        ORDER BY p.seq
        LIMIT $6
    ) t
    WHERE h.seq IS NOT NULL AND h.hn <= $7
), picked AS (
    SELECT ctid FROM (
        SELECT ctid, hn, 0::bigint AS rank FROM heads
        UNION ALL
        SELECT ctid, hn, rank FROM tails
    ) c
    ORDER BY hn, rank
    LIMIT $2
)
UPDATE {outbox} o SET lease_owner = $3, lease_expires_at = $4
WHERE o.ctid = ANY (ARRAY(SELECT ctid FROM picked))
RETURNING o.id, o.message_id, o.topic, o.message_type, o.payload, o.metadata, o.tenant_id, o.correlation_id,
    o.causation_id, o.partition_key, o.seq, o.attempts, o.created_at, o.scheduled_at`,

		nextDue: `
SELECT min(next_attempt_at) FROM {outbox}
WHERE next_attempt_at > $1 AND next_attempt_at < 'infinity' AND ($2::text[] IS NULL OR topic = ANY($2))`,

		// Mark: move published rows still leased by this relay into the ledger, in one statement.
		mark: `
WITH {fence,}done AS (
    DELETE FROM {outbox} WHERE id = ANY($1) AND lease_owner = $2{fenced}
    RETURNING message_id, tenant_id, topic, message_type, source_position, attempts, created_at
)
INSERT INTO {sent} (message_id, tenant_id, topic, message_type, source_position, attempts, created_at, sent_at)
SELECT message_id, tenant_id, topic, message_type, source_position, attempts + 1, created_at, $3 FROM done
ON CONFLICT (message_id, topic, tenant_id) DO NOTHING`,

		// Fail: count a rejected attempt and back the row off.
		fail: `
{with fence}UPDATE {outbox} SET attempts = attempts + 1, last_error = $3, next_attempt_at = $4,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = $1 AND lease_owner = $2{fenced}`,

		// Release: give rows back without counting an attempt (never delivered, relay closing). The rows in $3 are
		// the first this relay released of their key: they are made due (they may still be parked, since the relay
		// promotes a key's next message only when its run ends).
		release: `
{with fence}UPDATE {outbox} SET lease_owner = NULL, lease_expires_at = NULL,
    next_attempt_at = CASE WHEN id = ANY($3) AND next_attempt_at = 'infinity' THEN $4 ELSE next_attempt_at END
WHERE id = ANY($1) AND lease_owner = $2{fenced}`,

		// Unreachable: like release (of the first row of its key's run: made due), but remember why the row is still
		// pending.
		unreachable: `
{with fence}UPDATE {outbox} SET lease_owner = NULL, lease_expires_at = NULL, last_error = $3,
    next_attempt_at = CASE WHEN next_attempt_at = 'infinity' THEN $4 ELSE next_attempt_at END
WHERE id = $1 AND lease_owner = $2{fenced}`,

		extend: `
{with fence}UPDATE {outbox} SET lease_expires_at = $3 WHERE id = ANY($1) AND lease_owner = $2{fenced}`,

		// Dead letter: move the row, with its last error, in one statement.
		deadLetter: `
WITH {fence,}gone AS (
    DELETE FROM {outbox} WHERE id = $1 AND lease_owner = $2{fenced} RETURNING *
)
INSERT INTO {dead} (message_id, tenant_id, message_type, topic, payload, metadata, correlation_id, causation_id,
    partition_key, seq, source_position, scheduled_at, attempts, last_error, holds_key, created_at, dead_at)
SELECT message_id, tenant_id, message_type, topic, payload, metadata, correlation_id, causation_id,
    partition_key, seq, source_position, scheduled_at, attempts + 1, $3, seq IS NOT NULL AND $4, created_at, $5
FROM gone`,

		// Redrive: move dead letters back into the outbox, due now, with a fresh attempt count. A redriven message
		// keeps its sequence number, so it goes before the messages its key was holding.
		redrive: `
WITH gone AS (
    DELETE FROM {dead} WHERE message_id = ANY($1) AND ($2::text IS NULL OR tenant_id = $2) RETURNING *
), back AS (
    INSERT INTO {outbox} (message_id, message_type, topic, payload, metadata, tenant_id, correlation_id,
        causation_id, partition_key, seq, source_position, scheduled_at, attempts, last_error, next_attempt_at,
        created_at)
    SELECT message_id, message_type, topic, payload, metadata, tenant_id, correlation_id, causation_id,
        partition_key, seq, source_position, scheduled_at, 0, last_error, $3, created_at
    FROM gone
    RETURNING message_id
)
SELECT g.message_id, g.tenant_id, g.partition_key, g.holds_key FROM gone g`,

		// Discard: drop dead letters, keeping their IDs in the ledger so re-staging them publishes nothing.
		discard: `
WITH gone AS (
    DELETE FROM {dead} WHERE message_id = ANY($1) AND ($2::text IS NULL OR tenant_id = $2) RETURNING *
), kept AS (
    INSERT INTO {sent} (message_id, tenant_id, topic, message_type, source_position, attempts, created_at, sent_at,
        outcome)
    SELECT message_id, tenant_id, topic, message_type, source_position, attempts, created_at, $3, 'discarded'
    FROM gone
    ON CONFLICT (message_id, topic, tenant_id) DO NOTHING
)
SELECT g.message_id, g.tenant_id, g.partition_key, g.holds_key FROM gone g`,

		// Lock keys without waiting ($1: keyLock of each key): a key whose lock a staging transaction holds is
		// skipped (and promoted again later), because that transaction may be parking a message this promotion
		// cannot see yet. Returns the 1-based positions in $1 of the keys it locked. A try never waits, so the
		// order does not matter.
		lockKeys: `
SELECT r.i::int FROM unnest($1::int8[]) WITH ORDINALITY AS r(l, i) WHERE pg_try_advisory_xact_lock(r.l)`,
		// Lock keys, waiting ($1 sorted ascending, as staging locks them, so two waiters never deadlock).
		lockKeysWait: `
SELECT count(*) FROM (SELECT pg_advisory_xact_lock(l) FROM unnest($1::int8[]) AS l OFFSET 0) locked`,

		// Promote: make the first pending message of each key ($1 tenants, $2 keys) due, when it is parked and no
		// dead letter holds the key. The rows are found first, one index probe per key, then updated by key: every
		// statement that updates a set it computes is written this way, so that no plan (on a queue table the
		// planner's row estimates are often wrong by orders of magnitude) can drive the computation from the table
		// side.
		promote: `
UPDATE {outbox} SET next_attempt_at = $3
WHERE next_attempt_at = 'infinity' AND id = ANY (ARRAY(
    SELECT h.id FROM unnest($1::text[], $2::text[]) AS k(tenant_id, partition_key)
    CROSS JOIN LATERAL (
        SELECT p.id, p.seq, p.next_attempt_at FROM {outbox} p
        WHERE p.tenant_id = k.tenant_id AND p.partition_key = k.partition_key AND p.seq IS NOT NULL
        ORDER BY p.seq LIMIT 1
    ) h
    WHERE h.next_attempt_at = 'infinity'
      AND coalesce((SELECT d.seq FROM {dead} d
                    WHERE d.holds_key AND d.seq IS NOT NULL AND d.tenant_id = k.tenant_id
                      AND d.partition_key = k.partition_key
                    ORDER BY d.seq LIMIT 1) >= h.seq, true)))`,

		// Sweep: promote where a promotion was missed (a relay that died between a mark and a retried
		// promotion). Visits each (tenant, key) with parked messages once (a skip scan), not each parked message.
		sweep: `
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
      AND coalesce((SELECT d.seq FROM {dead} d
                    WHERE d.holds_key AND d.seq IS NOT NULL AND d.tenant_id = parked.tenant_id
                      AND d.partition_key = parked.partition_key
                    ORDER BY d.seq LIMIT 1) >= h.seq, true)
)
UPDATE {outbox} SET next_attempt_at = $1
WHERE next_attempt_at = 'infinity' AND id = ANY (ARRAY(SELECT id FROM heads))
RETURNING partition_key`,

		listDead: `
SELECT message_id, tenant_id, message_type, topic, payload, metadata, correlation_id, causation_id, partition_key,
    seq, source_position, scheduled_at, attempts, last_error, holds_key, created_at, dead_at
FROM {dead}
WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR topic = $2)
  AND ($3::text IS NULL OR message_id = $3)
  AND (dead_at, message_id, topic, tenant_id) > ($4, $5, $6, $8)
ORDER BY dead_at, message_id, topic, tenant_id
LIMIT $7`,

		getDead: `
SELECT message_id, tenant_id, message_type, topic, payload, metadata, correlation_id, causation_id, partition_key,
    seq, source_position, scheduled_at, attempts, last_error, holds_key, created_at, dead_at
FROM {dead} WHERE message_id = $1 AND ($2::text IS NULL OR tenant_id = $2)
ORDER BY dead_at, topic, tenant_id
LIMIT 1`,

		// Stats: the parked messages (next_attempt_at 'infinity') split by what they wait for: a dead letter holding
		// their key (one with an earlier sequence number), else an earlier pending message of their key. Only
		// parked rows probe the dead letters, through the key index.
		stats: `
SELECT
    count(*) FILTER (WHERE o.scheduled_at IS NULL OR o.scheduled_at <= $2),
    count(*) FILTER (WHERE o.scheduled_at > $2 AND o.next_attempt_at < 'infinity'),
    count(*) FILTER (WHERE o.attempts > 0 AND o.next_attempt_at > $2 AND o.next_attempt_at < 'infinity'),
    count(*) FILTER (WHERE o.next_attempt_at = 'infinity' AND coalesce(h.seq >= o.seq, true)),
    count(*) FILTER (WHERE o.next_attempt_at = 'infinity' AND h.seq < o.seq),
    count(*) FILTER (WHERE o.lease_owner IS NOT NULL AND o.lease_expires_at > $2),
    min(coalesce(o.scheduled_at, o.created_at)) FILTER (WHERE o.scheduled_at IS NULL OR o.scheduled_at <= $2),
    (SELECT count(*) FROM {dead} WHERE $1::text IS NULL OR tenant_id = $1),
    (SELECT count(*) FROM {sent} WHERE $1::text IS NULL OR tenant_id = $1)
FROM {outbox} o
LEFT JOIN LATERAL (
    SELECT d.seq FROM {dead} d
    WHERE o.next_attempt_at = 'infinity' AND d.holds_key AND d.tenant_id = o.tenant_id
      AND d.partition_key = o.partition_key
    ORDER BY d.seq LIMIT 1) h ON true
WHERE $1::text IS NULL OR o.tenant_id = $1`,

		// Cleanup: one batch of ledger entries older than the cutoff, never at or above the lowest watermark.
		cleanupSent: `
DELETE FROM {sent} WHERE ctid = ANY (ARRAY(
    SELECT s.ctid FROM {sent} s, (SELECT min(position) AS position FROM {watermarks}) low
    WHERE s.sent_at < $1 AND ($2::text IS NULL OR s.tenant_id = $2)
      AND (s.source_position IS NULL OR low.position IS NULL OR s.source_position < low.position)
    LIMIT $3))`,

		registerWatermark: `
INSERT INTO {watermarks} (name, position, updated_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING`,
		advanceWatermark: `
INSERT INTO {watermarks} AS w (name, position, updated_at) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET position = greatest(w.position, EXCLUDED.position), updated_at = EXCLUDED.updated_at
RETURNING position`,
		dropWM: `DELETE FROM {watermarks} WHERE name = $1`,
		wms:    `SELECT name, position, updated_at FROM {watermarks} ORDER BY name`,

		inboxClaim: `
INSERT INTO {inbox} (message_id, handler, tenant_id, message_type, processed_at) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (message_id, handler, tenant_id) DO NOTHING`,
		// A failure counts only for a message the handler has not handled: a duplicate delivery that failed before
		// reaching the inbox record (its transaction could not begin, the database restarted) must neither leave
		// an attempt behind nor dead-letter a message whose effects are committed.
		inboxAttempt: `
INSERT INTO {inbox_attempts} AS a (message_id, handler, tenant_id, attempts, last_error, first_failed_at,
    last_failed_at)
SELECT $1, $2, $3, 1, $4, $5, $5
WHERE NOT EXISTS (SELECT 1 FROM {inbox} WHERE message_id = $1 AND handler = $2 AND tenant_id = $3)
ON CONFLICT (message_id, handler, tenant_id) DO UPDATE
SET attempts = a.attempts + 1, last_error = EXCLUDED.last_error, last_failed_at = EXCLUDED.last_failed_at
RETURNING attempts`,
		inboxClearAttempts: `DELETE FROM {inbox_attempts} WHERE message_id = $1 AND handler = $2 AND tenant_id = $3`,
		inboxDeadLetter: `
INSERT INTO {inbox_dead} (message_id, handler, tenant_id, message_type, topic, payload, metadata, attempts,
    last_error, dead_at)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10)
ON CONFLICT (message_id, handler, tenant_id) DO NOTHING`,
		inboxMarkDead: `
INSERT INTO {inbox} (message_id, handler, tenant_id, message_type, outcome, processed_at)
VALUES ($1, $2, $3, $4, 'dead-lettered', $5)
ON CONFLICT (message_id, handler, tenant_id) DO NOTHING`,
		inboxStats: `
SELECT count(*) FILTER (WHERE outcome = 'handled'), min(processed_at),
    (SELECT count(*) FROM {inbox_attempts} WHERE $1::text IS NULL OR tenant_id = $1),
    (SELECT count(*) FROM {inbox_dead} WHERE $1::text IS NULL OR tenant_id = $1)
FROM {inbox} WHERE $1::text IS NULL OR tenant_id = $1`,
		inboxCleanup: `
DELETE FROM {inbox} WHERE ctid = ANY (ARRAY(
    SELECT i.ctid FROM {inbox} i WHERE i.processed_at < $1 AND ($2::text IS NULL OR i.tenant_id = $2)
      AND NOT EXISTS (SELECT 1 FROM {inbox_dead} d
                      WHERE d.message_id = i.message_id AND d.handler = i.handler AND d.tenant_id = i.tenant_id)
    LIMIT $3))`,
		inboxListDead: `
SELECT message_id, handler, tenant_id, message_type, topic, payload, metadata, attempts, last_error, dead_at
FROM {inbox_dead}
WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR handler = $2)
  AND (dead_at, message_id, handler, tenant_id) > ($3, $4, $5, $7)
ORDER BY dead_at, message_id, handler, tenant_id
LIMIT $6`,
		inboxRm: `
DELETE FROM {inbox_dead} WHERE message_id = $1 AND handler = $2 AND ($3::text IS NULL OR tenant_id = $3)`,
	}
	// Each statement is expanded in one pass, so the quoted schema name is never scanned for markers again. The
	// relay's statements stay templates until relay expands them with their mode (one pass as well).
	dedupOne := `
  AND NOT EXISTS (SELECT 1 FROM {sent} s WHERE s.message_id = $1 AND s.topic = $3 AND s.tenant_id = $6)
  AND NOT EXISTS (SELECT 1 FROM {dead} d WHERE d.message_id = $1 AND d.topic = $3 AND d.tenant_id = $6)
ON CONFLICT (message_id, topic, tenant_id) DO NOTHING`
	dedupMany := `
  AND NOT EXISTS (SELECT 1 FROM {sent} s
                  WHERE s.message_id = n.message_id AND s.topic = n.topic AND s.tenant_id = n.tenant_id)
  AND NOT EXISTS (SELECT 1 FROM {dead} d
                  WHERE d.message_id = n.message_id AND d.topic = n.topic AND d.tenant_id = n.tenant_id)
ON CONFLICT (message_id, topic, tenant_id) DO NOTHING`
	q.dedupOne, q.dedupMany = q.expand(dedupOne), q.expand(dedupMany)
	q.staging = q.stagingStatements("")
	for _, p := range []*string{
		&q.vacuum, &q.stagePrelude, &q.lockKeyGeneric, &q.stageSave, &q.stageRestore, &q.stageRecheckOne, &q.stageRecheckMany, &q.nextDue,
		&q.lockKeys, &q.lockKeysWait, &q.promote, &q.sweep, &q.redrive, &q.discard, &q.listDead, &q.getDead,
		&q.stats, &q.cleanupSent, &q.registerWatermark, &q.advanceWatermark, &q.dropWM, &q.wms,
		&q.inboxClaim, &q.inboxAttempt, &q.inboxClearAttempts, &q.inboxDeadLetter, &q.inboxMarkDead,
		&q.inboxStats, &q.inboxCleanup, &q.inboxListDead, &q.inboxRm,
	} {
		*p = q.expand(*p)
	}
	return q
}

// stagingStatements are the staging inserts for one source of positions: for one message and for several, each
// with the deduplication checks (dedup) and without them (new, for IDs that cannot have been staged before).
type stagingStatements struct {
	one, oneNew, many, manyNew string
}

// stagingStatements expands the staging inserts. With events empty, a message's source position is the one it
// carries; otherwise events is the schema of an event store that appended the messages' events earlier in the
// transaction (StageOptions.Source), and a message takes the position of the event named by its causation ID: the
// position sequence's current value for the append's last event (its ID takes the place of the source position
// among a single message's arguments, and comes last among several messages'), a lookup by event ID for the
// others.
func (q *queries) stagingStatements(events string) stagingStatements {
	one := []string{"{position one}", "$11::bigint"}
	many := []string{"{position many}", "n.source_position"}
	if events != "" {
		table := pgx.Identifier{events, "events"}.Sanitize()
		seq := pgx.Identifier{events, "events_position_seq"}.Sanitize()
		position := func(causation, last string) string {
			return "CASE WHEN " + causation + " = " + last + " THEN currval('" + strings.ReplaceAll(seq, "'", "''") +
				"') ELSE (SELECT e.position FROM " + table + " e WHERE e.event_id = " + causation + "::uuid) END"
		}
		one = []string{"{position one}", position("$8::text", "$11::text")} // $11: the last event's ID
		many = []string{"{position many}", position("n.causation_id", "$14::text")}
	}
	return stagingStatements{
		one:     q.expand(q.stageOne, append(one, "{dedup one}", q.dedupOne)...),
		oneNew:  q.expand(q.stageOne, append(one, "{dedup one}", "")...),
		many:    q.expand(q.stageMany, append(many, "{dedup many}", q.dedupMany)...),
		manyNew: q.expand(q.stageMany, append(many, "{dedup many}", "")...),
	}
}

// relayStatements are the relay's statements that claim or write rows, in one mode: fenced by a leader lease or
// not, and claiming every due row or one partition's.
type relayStatements struct {
	claim, mark, fail, release, unreachable, extend, deadLetter string
	fenced, partitioned                                         bool
}

// Partition hash expressions. They must match outbox_due_idx (migration 024) exactly, or partitioned
// claims lose the index condition.
const (
	keyHash    = `hashtext(CASE WHEN o.partition_key <> '' THEN o.partition_key ELSE o.message_id END)`
	tenantHash = `hashtext(o.tenant_id)`
)

// relay returns the relay statements for a mode.
//
// Fenced, every statement carries lease.FenceCTE (its three arguments follow the statement's own) and writes
// nothing unless the lease row still has the leader's owner and token, locking it FOR SHARE until the statement's
// transaction ends, so no takeover commits in between. A fenced claim also takes over rows leased by an earlier
// leadership term (lease owner other than this term's): a demoted leader can no longer mark them, so there is no
// reason to wait for their row leases to lapse.
//
// Partitioned, the claim takes two more arguments, $8 and $9: the inclusive bounds of its partition's hash range.
func (q *queries) relay(fenced bool, partitioned bool, by PartitionBy) relayStatements {
	st := relayStatements{fenced: fenced, partitioned: partitioned}
	build := func(tmpl string, ownArgs int, claim bool) string {
		repl := []string{"{fence,}", "", "{with fence}", "", "{fenced}", "", "{takeover}", "", "{partition}", ""}
		if claim && partitioned {
			hash := keyHash
			if by == PartitionByTenant {
				hash = tenantHash
			}
			repl[9] = fmt.Sprintf("\n          AND %s BETWEEN $8::int4 AND $9::int4", hash)
			ownArgs += 2
		}
		if fenced {
			cte, _ := lease.FenceCTE(q.schema, lease.Lease{}, ownArgs+1)
			repl[1], repl[3], repl[5] = cte+", ", "WITH "+cte+"\n", " AND EXISTS (SELECT 1 FROM fence)"
			if claim {
				repl[7] = " OR o.lease_owner <> $3"
			}
		}
		return q.expand(tmpl, repl...)
	}
	st.claim = build(q.claim, 7, true)
	st.mark = build(q.mark, 3, false)
	st.fail = build(q.fail, 4, false)
	st.release = build(q.release, 4, false)
	st.unreachable = build(q.unreachable, 4, false)
	st.extend = build(q.extend, 3, false)
	st.deadLetter = build(q.deadLetter, 5, false)
	return st
}

// expand replaces the table markers of tmpl, and the extra marker/text pairs, in one pass: no replacement text
// (a quoted identifier, an expanded fragment) is scanned for markers again.
func (q *queries) expand(tmpl string, extra ...string) string {
	return strings.NewReplacer(append(slices.Clone(q.tables), extra...)...).Replace(tmpl)
}
