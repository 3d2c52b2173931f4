package outbox

import (
	"embed"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/sqlfile"
)

// The package's SQL lives in sql/, a file per table it owns (outbox.sql: the outbox itself, with staging, the
// relay's claims, marks and promotions; dead_letters.sql, sent.sql, watermarks.sql, inbox.sql, maintenance.sql),
// each statement named there and documented beside it. The table layout and the reasons for it are in the
// migrations (internal/migrate/sql). Statements are written out once per schema: fragments and variants first, as
// template text, the schema-qualified table names last, in one pass (package sqlfile).
//
//go:embed sql/*.sql
var sqlFiles embed.FS

// statements are the package's SQL files, read once: embedded data, checked by the package's tests.
var statements = sqlfile.MustLoad(sqlFiles, "sql/*.sql")

// queries holds every statement of the package, written out for one schema.
type queries struct {
	schema string
	// idents are the table markers and their schema-qualified names.
	idents map[string]string

	relaySettings, vacuum                                 string
	stagePrelude, stageSave, stageRestore, lockKeyGeneric string
	asyncCommit                                           string
	staging                                               stagingStatements // messages whose positions are given
	stageRecheckOne, stageRecheckMany                     string
	nextDue, lockKeys, lockKeysWait, promote, sweep       string
	stats, backlog, gauges                                string
	redrive, discard, getDead, countDead                  string
	redriveWhere, discardWhere, heldKeys                  string
	listDead                                              [2]string // oldest first, newest first
	pendingGroups                                         [3]string // by GroupBy
	listScheduled, keyMessages, inFlight, activity        string
	stagedFrom, recentlyPublished                         string
	cleanupSent, lastPublished                            string
	registerWatermark, advanceWatermark, dropWatermark    string
	listWatermarks, watermarkForShare                     string

	inboxClaim, inboxAttempt, inboxClearAttempts, inboxDeadLetter, inboxMarkDead string
	inboxStats, inboxCleanup, inboxCountDead, inboxDiscardWhere                  string
	inboxDeadGet, inboxDeadTake, inboxUnmark, recentlyHandled, inboxEntries      string
	inboxListDead                                                                [2]string // oldest, newest first

	recordFailure, failuresOf                 string
	deadGroups, inboxDeadGroups, outboxBeyond string
	findMessages, findInbox                   string
	findIDs                                   [3]string // by FindByCorrelation, FindByStream, FindByKey

	maintenance maintenanceSQL
}

// maintenanceSQL holds the maintainer's statements (sql/maintenance.sql).
type maintenanceSQL struct {
	lastStart, begin, finish, status                        string
	expireDead, expireInboxDead, sent, inbox, inboxAttempts string
	failures                                                string
}

func newQueries(schema string) (queries, error) {
	t := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	q := queries{schema: schema, idents: map[string]string{
		"outbox": t("outbox"), "sent": t("outbox_sent"), "dead": t("outbox_dead_letters"),
		"watermarks": t("outbox_watermarks"), "maint": t("outbox_maintenance"), "leases": t("leases"),
		"inbox": t("inbox"), "inbox_attempts": t("inbox_attempts"), "inbox_dead": t("inbox_dead_letters"),
		"failures": t("message_failures"),
		// inside a string literal: nextval('{seq}')
		"seq": strings.ReplaceAll(t("outbox_seq"), "'", "''"),
	}}
	var err error
	each := func(field *string, name string) {
		if err == nil {
			*field, err = statements.Expand(name, nil, q.idents)
		}
	}
	m := &q.maintenance
	for field, name := range map[*string]string{
		&q.relaySettings: "relay_settings", &q.vacuum: "vacuum",
		&q.stagePrelude: "stage_prelude", &q.stageSave: "stage_save", &q.stageRestore: "stage_restore",
		&q.lockKeyGeneric: "lock_key_generic", &q.asyncCommit: "async_commit", &q.stageRecheckOne: "stage_recheck_one",
		&q.stageRecheckMany: "stage_recheck_many", &q.nextDue: "next_due", &q.lockKeys: "lock_keys",
		&q.lockKeysWait: "lock_keys_wait", &q.promote: "promote", &q.sweep: "sweep",
		&q.gauges: "gauges", &q.redrive: "redrive", &q.discard: "discard", &q.getDead: "get_dead",
		&q.countDead: "count_dead", &q.redriveWhere: "redrive_where", &q.discardWhere: "discard_where",
		&q.heldKeys: "held_keys", &q.listScheduled: "list_scheduled", &q.keyMessages: "key_messages",
		&q.inFlight: "in_flight_by_owner", &q.activity: "activity", &q.stagedFrom: "staged_from",
		&q.recentlyPublished: "recently_published", &q.recentlyHandled: "recently_handled",
		&q.inboxEntries: "inbox_entries", &q.inboxCountDead: "inbox_count_dead",
		&q.inboxDiscardWhere: "inbox_discard_where", &q.cleanupSent: "cleanup_sent", &q.lastPublished: "last_published",
		&q.registerWatermark: "register_watermark", &q.advanceWatermark: "advance_watermark",
		&q.dropWatermark: "drop_watermark", &q.listWatermarks: "list_watermarks",
		&q.watermarkForShare: "watermark_for_share",
		&q.inboxClaim:        "inbox_claim", &q.inboxAttempt: "inbox_attempt", &q.inboxClearAttempts: "inbox_clear_attempts",
		&q.inboxDeadLetter: "inbox_dead_letter", &q.inboxMarkDead: "inbox_mark_dead", &q.inboxStats: "inbox_stats",
		&q.inboxCleanup:  "inbox_cleanup",
		&q.inboxDeadGet:  "inbox_dead_get",
		&q.inboxDeadTake: "inbox_dead_take", &q.inboxUnmark: "inbox_unmark",
		&m.lastStart: "maintenance_last_start", &m.begin: "maintenance_begin", &m.finish: "maintenance_finish",
		&m.status: "maintenance_status", &m.expireDead: "expire_dead", &m.expireInboxDead: "expire_inbox_dead",
		&m.sent: "expire_sent", &m.inbox: "expire_inbox", &m.inboxAttempts: "expire_inbox_attempts",
		&m.failures: "expire_failures", &q.recordFailure: "record_failure", &q.failuresOf: "failures_of",
		&q.deadGroups: "dead_groups", &q.inboxDeadGroups: "inbox_dead_groups", &q.outboxBeyond: "outbox_beyond",
		&q.findMessages: "find_messages", &q.findInbox: "find_inbox",
	} {
		each(field, name)
	}
	if err == nil {
		q.stats, err = statements.Expand("stats", map[string]string{"sent count": "{sent_count}"}, q.idents)
	}
	if err == nil {
		q.backlog, err = statements.Expand("stats", map[string]string{"sent count": "0::bigint"}, q.idents)
	}
	for i, match := range []map[string]string{
		{"dead match": "correlation_id = $1 AND correlation_id <> ''",
			"inbox match":  "metadata ->> 'correlation-id' = $1 AND metadata ? 'correlation-id'",
			"outbox match": "correlation_id = $1", "outbox key": ""},
		{"dead match": "metadata ->> 'aggregate-id' = $1 AND metadata ? 'aggregate-id'",
			"inbox match":  "metadata ->> 'aggregate-id' = $1 AND metadata ? 'aggregate-id'",
			"outbox match": "stream = $1", "outbox key": ""},
		{"dead match": "partition_key = $1 AND partition_key <> ''", "inbox match": "false",
			"outbox match": "partition_key = $1",
			"outbox key": "\n    UNION\n    SELECT tenant_id, message_id FROM {outbox}\n    WHERE partition_key = $1 " +
				"AND seq IS NOT NULL AND ($2::text IS NULL OR tenant_id = $2)"},
	} {
		if err == nil {
			q.findIDs[i], err = statements.Expand("find_ids", match, q.idents)
		}
	}
	for i, dir := range []map[string]string{{"after": ">", "order": "ASC"}, {"after": "<", "order": "DESC"}} {
		if err == nil {
			q.listDead[i], err = statements.Expand("list_dead", dir, q.idents)
		}
		if err == nil {
			q.inboxListDead[i], err = statements.Expand("inbox_list_dead", dir, q.idents)
		}
	}
	for by, cols := range map[GroupBy][2]string{
		ByTopic:  {"''::text, o.topic, ''::text", "o.topic"},
		ByTenant: {"o.tenant_id, ''::text, ''::text", "o.tenant_id"},
		ByKey:    {"o.tenant_id, ''::text, o.partition_key", "o.tenant_id, o.partition_key"},
	} {
		if err == nil {
			q.pendingGroups[by], err = statements.Expand("pending_groups",
				map[string]string{"group cols": cols[0], "group by": cols[1]}, q.idents)
		}
	}
	if err != nil {
		return queries{}, err
	}
	q.staging, err = q.stagingStatements(nil)
	return q, err
}

// stageOne holds the parameters of the staging of one message (stage_one), by name.
type stageOne struct {
	ID          string     `sql:"message_id"`
	Type        string     `sql:"message_type"`
	Topic       string     `sql:"topic"`
	Payload     []byte     `sql:"payload"`
	Metadata    string     `sql:"metadata"`
	Tenant      string     `sql:"tenant_id"`
	Correlation string     `sql:"correlation_id"`
	Causation   string     `sql:"causation_id"`
	Key         string     `sql:"partition_key"`
	Ordered     bool       `sql:"ordered"`
	Position    *int64     `sql:"source_position"`
	ScheduledAt *time.Time `sql:"scheduled_at"`
	Now         time.Time  `sql:"now"`
	// Watermark is StageOptions.Watermark (the after variants); LastEventID the ID of the event whose position
	// is the source's Last (the sourced variants).
	Watermark   string `sql:"watermark"`
	LastEventID string `sql:"last_event_id"`
}

// stageMany holds the parameters of the staging of several messages (stage_many), by name: one array element
// per message.
type stageMany struct {
	IDs          []string     `sql:"message_ids"`
	Types        []string     `sql:"message_types"`
	Topics       []string     `sql:"topics"`
	Payloads     [][]byte     `sql:"payloads"`
	Metadata     []string     `sql:"metadata"`
	Tenants      []string     `sql:"tenant_ids"`
	Correlations []string     `sql:"correlation_ids"`
	Causations   []string     `sql:"causation_ids"`
	Keys         []string     `sql:"partition_keys"`
	Positions    []*int64     `sql:"source_positions"`
	ScheduledAt  []*time.Time `sql:"scheduled_at"`
	// KeyIndex numbers each ordered message within its key (1..n, in the arrays' order); nil for the others.
	KeyIndex    []*int64  `sql:"key_index"`
	Now         time.Time `sql:"now"`
	Watermark   string    `sql:"watermark"`
	LastEventID string    `sql:"last_event_id"`
}

// stagingStatements are the staging inserts for one source of positions: for one message and for several, each
// with the deduplication checks (dedup) and without them (new, for IDs that cannot have been staged before); for
// positions given, also with the checks and a watermark's (after: StageOptions.Watermark).
type stagingStatements struct {
	one, oneNew   sqlfile.Named[stageOne]
	many, manyNew sqlfile.Named[stageMany]
	oneAfter      sqlfile.Named[stageOne]
	manyAfter     sqlfile.Named[stageMany]
	// oneLast and oneLastNew stage one message caused by the append's last event (StageOptions.Source): its
	// position is the source's Last, with no lookup to plan or start.
	oneLast, oneLastNew sqlfile.Named[stageOne]
}

// stagingStatements writes the staging inserts out. With src nil, a message's source position is the one it
// carries; otherwise src gives the positions of the events an append inserted earlier in the transaction
// (StageOptions.Source), and a message takes the position of the event named by its causation ID: src.Last for the
// append's last event (@last_event_id), src.ByID for the others. The event store writes both: the outbox never
// names its tables.
func (q *queries) stagingStatements(src *eventstore.AppendedPositions) (stagingStatements, error) {
	one, many, last := "@source_position::bigint", "n.source_position", ""
	if src != nil {
		position := func(causation string) string {
			return "CASE WHEN " + causation + " = @last_event_id::text THEN " + src.Last + " ELSE " +
				src.ByID(causation) + " END"
		}
		one, many, last = position("@causation_id::text"), position("n.causation_id"), src.Last
	}
	var st stagingStatements
	var err error
	write := func(name, row, dedup, pos string) string {
		var text string
		if err == nil {
			text, err = statements.Expand(name, map[string]string{"row one": row, "dedup one": dedup,
				"dedup many": dedup, "position one": pos, "position many": pos}, q.idents)
		}
		return text
	}
	bindOne := func(field *sqlfile.Named[stageOne], row, dedup, pos string) {
		if text := write("stage_one", row, dedup, pos); err == nil {
			*field, err = sqlfile.Bind[stageOne](text)
		}
	}
	bindMany := func(field *sqlfile.Named[stageMany], dedup, pos string) {
		if text := write("stage_many", "", dedup, pos); err == nil {
			*field, err = sqlfile.Bind[stageMany](text)
		}
	}
	// A single message's row is a VALUES list when nothing conditions it (see stage_one).
	const selectOne, valuesOne = "SELECT", "VALUES ("
	bindOne(&st.one, selectOne, "WHERE true\n{dedup_one}", one)
	bindOne(&st.oneNew, valuesOne, ")", one)
	bindMany(&st.many, "{dedup_many}", many)
	bindMany(&st.manyNew, "", many)
	if src == nil {
		bindOne(&st.oneAfter, selectOne, "WHERE true\n{after_watermark_one}\n{dedup_one}", one)
		bindMany(&st.manyAfter, "{after_watermark_many}{dedup_many}", many)
	} else {
		bindOne(&st.oneLast, selectOne, "WHERE true\n{dedup_one}", last)
		bindOne(&st.oneLastNew, valuesOne, ")", last)
	}
	return st, err
}

// relayRow holds the named parameters of the relay's statements (claim, mark, fail, release, unreachable, extend,
// dead_letter): a statement takes the ones it names.
type relayRow struct {
	Now   time.Time `sql:"now"`
	Owner string    `sql:"owner"`
	// The claim's: how many rows, until when they are the relay's, which topics (nil: all), how long a key's run
	// and for how many heads, and the partition's hash range.
	Limit      int       `sql:"limit"`
	ClaimUntil time.Time `sql:"claim_until"`
	Topics     []string  `sql:"topics"`
	RunLength  int       `sql:"run_length"`
	RunHeads   int       `sql:"run_heads"`
	PartLo     int32     `sql:"part_lo"`
	PartHi     int32     `sql:"part_hi"`
	// The rows written: one (ID) or several (IDs), the first of their keys among those released (FirstIDs).
	ID       int64   `sql:"id"`
	IDs      []int64 `sql:"ids"`
	FirstIDs []int64 `sql:"first_ids"`
	// A failure's: its error, when the row is due again, whether its dead letter holds its key, the error's type
	// and signature; an extension's new expiry.
	Error          string    `sql:"error"`
	NextAttemptAt  time.Time `sql:"next_attempt_at"`
	HoldsKey       bool      `sql:"holds_key"`
	ErrorType      string    `sql:"error_type"`
	ErrorSignature string    `sql:"error_signature"`
	Until          time.Time `sql:"until"`
	// The fence: the leader lease the term holds (fenced statements only).
	FenceName  string `sql:"fence_name"`
	FenceOwner string `sql:"fence_owner"`
	FenceToken int64  `sql:"fence_token"`
}

// relayStatements are the relay's statements that claim or write rows, in one mode: fenced by a leader lease or
// not, and claiming every due row or one partition's.
type relayStatements struct {
	claim, mark, fail, release, unreachable, extend, deadLetter sqlfile.Named[relayRow]
	// markDedup is mark for rows some of which may be in the ledger already (see the mark statement).
	markDedup           sqlfile.Named[relayRow]
	fenced, partitioned bool
}

// Partition hash expressions. They must match outbox_due_idx (migration 024) exactly, or partitioned
// claims lose the index condition.
const (
	keyHash    = `hashtext(CASE WHEN o.partition_key <> '' THEN o.partition_key ELSE o.message_id END)`
	tenantHash = `hashtext(o.tenant_id)`
)

// relay writes out the relay statements for a mode.
//
// Fenced, every statement carries the relay_fence fragment and writes nothing unless the lease row still has the
// leader's owner and token, locking it FOR SHARE until the statement's transaction ends, so no takeover commits in
// between. A fenced claim also takes over rows leased by an earlier leadership term (lease owner other than this
// term's): a demoted leader can no longer mark them, so there is no reason to wait for their row leases to lapse.
//
// Partitioned, the claim keeps to its partition's hash range, @part_lo to @part_hi inclusive.
func (q *queries) relay(fenced bool, partitioned bool, by PartitionBy) (relayStatements, error) {
	st := relayStatements{fenced: fenced, partitioned: partitioned}
	var err error
	build := func(field *sqlfile.Named[relayRow], name string, claim bool, extra ...string) {
		if err != nil {
			return
		}
		mode := map[string]string{"fence,": "", "with fence": "", "fenced": "", "takeover": "", "partition": "",
			"on conflict": ""}
		for i := 0; i+1 < len(extra); i += 2 {
			mode[extra[i]] = extra[i+1]
		}
		if claim && partitioned {
			hash := keyHash
			if by == PartitionByTenant {
				hash = tenantHash
			}
			mode["partition"] = "\n          AND " + hash + " BETWEEN @part_lo::int4 AND @part_hi::int4"
		}
		if fenced {
			mode["fence,"], mode["with fence"], mode["fenced"] = "{relay_fence}, ", "WITH {relay_fence}\n",
				" AND EXISTS (SELECT 1 FROM fence)"
			if claim {
				mode["takeover"] = " OR o.lease_owner <> @owner"
			}
		}
		var text string
		if text, err = statements.Expand(name, mode, q.idents); err == nil {
			*field, err = sqlfile.Bind[relayRow](text)
		}
	}
	build(&st.claim, "claim", true)
	build(&st.mark, "mark", false)
	build(&st.markDedup, "mark", false, "on conflict", "\nON CONFLICT (message_id, topic, tenant_id) DO NOTHING")
	build(&st.fail, "fail", false)
	build(&st.release, "release", false)
	build(&st.unreachable, "unreachable", false)
	build(&st.extend, "extend", false)
	build(&st.deadLetter, "dead_letter", false)
	return st, err
}
