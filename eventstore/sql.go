package eventstore

import (
	"embed"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/stagehand-es/stagehand/internal/sqlfile"
)

// The package's SQL lives in sql/, a file per table (events.sql: the events table and its stream heads, appends
// and reads; snapshots.sql; lifecycle.sql: archived and deleted streams; partitions.sql: converting, creating and
// archiving partitions), each statement named there and documented beside it. Statements are written out once per
// store for its schema (package sqlfile), with named parameters bound from a struct (sqlfile.Bind); DDL that names a
// partition or an index is written out when it runs, its identifiers quoted.
//
//go:embed sql/*.sql
var sqlFiles embed.FS

// sqlSet is the package's SQL files, read once: embedded data, checked by the package's tests.
var sqlSet = sqlfile.MustLoad(sqlFiles, "sql/*.sql")

// param holds the named parameters of the store's statements (sql/events.sql, snapshots.sql, lifecycle.sql): a
// statement takes the ones it names.
type param struct {
	Tenant     string `sql:"tenant_id"`
	StreamID   string `sql:"stream_id"`
	StreamType string `sql:"stream_type"`
	// An append of one event: its columns.
	EventID     pgtype.UUID `sql:"event_id"`
	EventType   string      `sql:"event_type"`
	Payload     string      `sql:"payload"`
	TypeVersion int32       `sql:"event_version"`
	Metadata    string      `sql:"metadata"`
	OccurredAt  time.Time   `sql:"occurred_at"`
	// An append of several: arrays of what differs (of every column, for mixed ones).
	EventIDs     []pgtype.UUID `sql:"event_ids"`
	EventTypes   []string      `sql:"event_types"`
	Payloads     []string      `sql:"payloads"`
	TypeVersions []int32       `sql:"event_versions"`
	Metadatas    []string      `sql:"metadatas"`
	OccurredAts  []time.Time   `sql:"occurred_ats"`
	Expected     int64         `sql:"expected"`

	// Reads.
	EventsTable string   `sql:"events_table"` // the events table, quoted, as text (to_regclass)
	FromVersion int64    `sql:"from_version"`
	Limit       *int     `sql:"limit"` // NULL: no limit
	After       int64    `sql:"after"`
	Through     int64    `sql:"through"`
	TypesIn     []string `sql:"event_types_in"` // a log query's filters, NULL for none
	StreamsIn   []string `sql:"stream_types_in"`
	TenantsIn   []string `sql:"tenants_in"`
	Deletions   bool     `sql:"deletions"` // a log query's Deletions
	Holders     []string `sql:"holders"`
	Positions   []int64  `sql:"positions"`

	// Snapshots.
	Version       int64  `sql:"version"`
	SchemaVersion int    `sql:"schema_version"`
	Snapshot      []byte `sql:"snapshot"`

	// The stream lifecycle.
	Schema         string    `sql:"schema"`
	MarkerPosition int64     `sql:"marker_position"`
	MarkerID       uuid.UUID `sql:"marker_id"`
	MarkerType     string    `sql:"marker_type"`
	Actor          any       `sql:"actor"`  // NULL: the session's user
	Reason         any       `sql:"reason"` // text, or NULL
	MarkerPrefix   string    `sql:"marker_prefix"`
	State          string    `sql:"state"`
	Since          time.Time `sql:"since"`

	// Lost commits.
	IDs []uuid.UUID `sql:"ids"`
	PID int32       `sql:"pid"`
}

// storeSQL are the store's statements, written out for its schema. Each is one fixed text, so pgx prepares it once
// per connection.
type storeSQL struct {
	// appends are the append statements, by table layout (unpartitioned, partitioned), expectationKind and
	// parameter layout.
	appends [2][4][3]sqlfile.Named[param]
	// version and streamHead by table layout (unpartitioned, partitioned); readStream likewise.
	version, streamHead, readStream                      [2]sqlfile.Named[param]
	streamInfo, headPosition, layout                     sqlfile.Named[param]
	readLog, readLogFiltered, lockHolders, holdersLeft   sqlfile.Named[param]
	inRecovery, recordedAt, countLog                     sqlfile.Named[param]
	saveSnapshot, loadSnapshot, deleteSnapshot           sqlfile.Named[param]
	lifecycleLock, closeHead                             sqlfile.Named[param]
	readLifecycle                                        [2]sqlfile.Named[param] // plain, FOR UPDATE
	recordArchiving, recordDeleting                      sqlfile.Named[param]
	appendMarker                                         [2]sqlfile.Named[param] // by table layout
	clock, olderTransactions, eraseArchived, recordMoved sqlfile.Named[param]
	moveEvents                                           [2]sqlfile.Named[param] // archive, delete
	readArchive, movedStreamTimes, archivedRange         sqlfile.Named[param]
	backendPID, backendAlive, countEvents, firstVersion  sqlfile.Named[param]
}

// appendBases are the base fragments of the append statements (sql/events.sql), by expectationKind and table layout
// (unpartitioned, partitioned).
var appendBases = [4][2]string{
	{"base_no_stream", "base_no_stream"},
	{"base_any", "base_any_partitioned"},
	{"base_exists", "base_exists_partitioned"},
	{"base_exact", "base_exact_partitioned"},
}

// newStoreSQL writes the store's statements out for the tables t.
func newStoreSQL(t tables) (storeSQL, error) {
	idents := map[string]string{"events": t.events, "snapshots": t.snapshots, "streams": t.streams,
		"archives": t.archives, "lifecycle": t.lifecycle, "stream_archive": t.streamArchive}
	var q storeSQL
	var err error
	each := func(field *sqlfile.Named[param], name string, raw map[string]string) {
		if err != nil {
			return
		}
		*field, err = named[param](name, raw, idents)
	}
	for p := range 2 {
		for k, bases := range appendBases {
			raw := map[string]string{"base": "{" + bases[p] + "}"}
			if p == 0 {
				// Unpartitioned: an archived or deleted stream's lifecycle row makes the base NULL.
				raw = map[string]string{"base": "{base_guarded}", "unguarded": "{" + bases[p] + "}"}
			}
			for l, name := range []string{"append_single", "append_uniform", "append_mixed"} {
				each(&q.appends[p][k][l], name, raw)
			}
		}
	}
	each(&q.version[0], "version", nil)
	each(&q.version[1], "version_partitioned", nil)
	each(&q.streamHead[0], "stream_head", nil)
	each(&q.streamHead[1], "stream_head_partitioned", nil)
	each(&q.readStream[0], "read_stream", map[string]string{"bounds": ""})
	each(&q.readStream[1], "read_stream", map[string]string{"bounds": "{head_bounds}"})
	for _, st := range []struct {
		field *sqlfile.Named[param]
		name  string
	}{
		{&q.streamInfo, "stream_info"}, {&q.headPosition, "head_position"}, {&q.layout, "layout"},
		{&q.readLog, "read_log"}, {&q.readLogFiltered, "read_log_filtered"}, {&q.lockHolders, "lock_holders"},
		{&q.holdersLeft, "holders_left"}, {&q.inRecovery, "in_recovery"}, {&q.recordedAt, "recorded_at"},
		{&q.countLog, "count_log"}, {&q.saveSnapshot, "save_snapshot"}, {&q.loadSnapshot, "load_snapshot"},
		{&q.deleteSnapshot, "delete_snapshot"}, {&q.lifecycleLock, "lifecycle_lock"}, {&q.closeHead, "close_head"},
		{&q.readLifecycle[0], "read_lifecycle"}, {&q.readLifecycle[1], "read_lifecycle_for_update"},
		{&q.recordArchiving, "record_archiving"}, {&q.recordDeleting, "record_deleting"}, {&q.clock, "clock"},
		{&q.olderTransactions, "older_transactions"}, {&q.eraseArchived, "erase_archived"},
		{&q.recordMoved, "record_moved"}, {&q.readArchive, "read_archive"},
		{&q.movedStreamTimes, "moved_stream_times"}, {&q.archivedRange, "archived_range"},
		{&q.backendPID, "backend_pid"}, {&q.backendAlive, "backend_alive"}, {&q.countEvents, "count_events"},
		{&q.firstVersion, "first_version"},
	} {
		each(st.field, st.name, nil)
	}
	each(&q.appendMarker[0], "append_marker", map[string]string{"last": "{last_event}"})
	each(&q.appendMarker[1], "append_marker", map[string]string{"last": "{last_event_partitioned}"})
	each(&q.moveEvents[0], "move_events", map[string]string{"data": "{payload_kept}"})
	each(&q.moveEvents[1], "move_events", map[string]string{"data": "{payload_erased}"})
	return q, err
}

// named writes statement name out (its fragments and raw variants, then the identifiers) and binds its named
// parameters to P.
func named[P any](name string, raw, idents map[string]string) (sqlfile.Named[P], error) {
	text, err := sqlSet.Expand(name, raw, idents)
	if err != nil {
		return sqlfile.Named[P]{}, fmt.Errorf("eventstore: write the statement %s: %w", name, err)
	}
	n, err := sqlfile.Bind[P](text)
	if err != nil {
		return sqlfile.Named[P]{}, fmt.Errorf("eventstore: statement %s: %w", name, err)
	}
	return n, nil
}

// ddl writes the statement name out, which takes no parameters: DDL, whose identifiers (and partition bounds,
// numbers the code writes) go in as text.
func ddl(name string, raw, idents map[string]string) (string, error) {
	text, err := sqlSet.Expand(name, raw, idents)
	if err != nil {
		return "", fmt.Errorf("eventstore: write the statement %s: %w", name, err)
	}
	return text, nil
}

// partParam holds the named parameters of the partition statements (sql/partitions.sql).
type partParam struct {
	Schema        string `sql:"schema"`
	EventsTable   string `sql:"events_table"`  // the events table, quoted, as text (to_regclass)
	StreamsTable  string `sql:"streams_table"` // event_streams, likewise
	Partition     string `sql:"partition"`
	FromPosition  int64  `sql:"from_position"`
	ToPosition    int64  `sql:"to_position"`
	Events        int64  `sql:"events"`
	State         string `sql:"state"`
	ArchiveSchema any    `sql:"archive_schema"` // text, or NULL
	Last          int64  `sql:"last"`
}

// partitionSQL are the partition statements that take parameters, written out for the schema.
type partitionSQL struct {
	tableKind, listAttached, listArchived, lock, unlock, lastDrawn sqlfile.Named[partParam]
	recordDetaching, recordArchived                                sqlfile.Named[partParam]
	followersBehind, watermarksBehind, parkedIn                    sqlfile.Named[partParam]
	migrated, tracking                                             sqlfile.Named[partParam]
}

func newPartitionSQL(idents map[string]string) (partitionSQL, error) {
	var q partitionSQL
	var err error
	for _, st := range []struct {
		field *sqlfile.Named[partParam]
		name  string
	}{
		{&q.tableKind, "table_kind"}, {&q.listAttached, "list_attached"}, {&q.listArchived, "list_archived"},
		{&q.lock, "partition_lock"}, {&q.unlock, "partition_unlock"}, {&q.lastDrawn, "last_drawn"},
		{&q.recordDetaching, "record_detaching"}, {&q.recordArchived, "record_archived"},
		{&q.followersBehind, "followers_behind"}, {&q.watermarksBehind, "watermarks_behind"},
		{&q.parkedIn, "parked_in"}, {&q.migrated, "convert_migrated"}, {&q.tracking, "tracking"},
	} {
		if *st.field, err = named[partParam](st.name, nil, idents); err != nil {
			return partitionSQL{}, err
		}
	}
	return q, nil
}

// partitionIdents are the identifiers of partition part's statements, besides the schema's tables.
func (p *Partitions) partitionIdents(part string) map[string]string {
	out := make(map[string]string, len(p.idents)+3)
	for k, v := range p.idents {
		out[k] = v
	}
	out["partition"] = pgx.Identifier{p.cfg.Schema, part}.Sanitize()
	out["stream_version_idx"] = pgx.Identifier{part + "_stream_version_idx"}.Sanitize()
	out["event_id_idx"] = pgx.Identifier{part + "_event_id_idx"}.Sanitize()
	return out
}

// bound is a raw partition bound of a DDL statement: a number the code writes.
func bound(marker string, v int64) map[string]string {
	return map[string]string{marker: strconv.FormatInt(v, 10)}
}
