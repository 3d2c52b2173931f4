package eventstore

import (
	"strings"
	"testing"

	"github.com/stagehand-es/stagehand/internal/sqlfile"
)

// Every statement of sql/*.sql writes out for a schema, with each variant's markers filled, and its named
// parameters bind: the store's and the partition operations' statements at construction, the DDL with a
// partition's identifiers and bounds. A misspelt marker or parameter fails here, not at a statement's first run.
func TestEveryStatementWritesOut(t *testing.T) {
	t.Parallel()
	p := &Partitions{cfg: PartitionConfig{Schema: `we"ird`}}
	p.idents = map[string]string{}
	for _, name := range []string{"schema", "events", "seq", "streams", "ids", "archives", "snapshots",
		"checkpoints", "watermarks", "projection_parked", "staging_parked", "lifecycle"} {
		p.idents[name] = `"we""ird"."` + name + `"`
	}
	if _, err := newPartitionSQL(p.idents); err != nil {
		t.Fatal(err)
	}
	q, err := newStoreSQL(tables{events: `"s"."events"`, snapshots: `"s"."snapshots"`, streams: `"s"."event_streams"`,
		archives: `"s"."event_archives"`, lifecycle: `"s"."stream_lifecycle"`, streamArchive: `"s"."stream_archive"`})
	if err != nil {
		t.Fatal(err)
	}
	// The variants differ where they should: the partitioned append reads the head, the unpartitioned one the
	// lifecycle guard; a delete erases what it moves.
	a := q.appends[1][3][single].SQL
	if !strings.Contains(a, `"s"."event_streams"`) || strings.Contains(a, "stream_lifecycle") {
		t.Fatalf("partitioned exact append:\n%s", a)
	}
	if a := q.appends[0][0][mixed].SQL; !strings.Contains(a, `"s"."stream_lifecycle"`) || strings.Contains(a, "$10") {
		t.Fatalf("unpartitioned NoStream append:\n%s", a)
	}
	if m := q.moveEvents[1].SQL; !strings.Contains(m, "NULL::jsonb, NULL::jsonb") {
		t.Fatalf("a delete's move keeps the payload:\n%s", m)
	}
	idents := p.partitionIdents("events_p0000000000000000011")
	idents["archive_schema"], idents["first"], idents["first_name"], idents["first_pkey"] = `"a"`, `"f"`, `"f"`, `"fp"`
	raw := bound("bound", 7)
	raw["from"], raw["to"] = "11", "21"
	for _, name := range sqlSet.Names() {
		text, err := ddl(name, raw, idents)
		if err != nil {
			// A statement of the store: its tables are the store's.
			text, err = sqlSet.Expand(name, map[string]string{"base": "{base_no_stream}", "bounds": "",
				"last": "{last_event}", "data": "{payload_kept}"}, map[string]string{"events": "e", "snapshots": "sn",
				"streams": "h", "archives": "a", "lifecycle": "l", "stream_archive": "sa"})
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := sqlfile.Bind[param](text); err != nil {
			if _, perr := sqlfile.Bind[partParam](text); perr != nil {
				t.Fatalf("%s: %v; %v", name, err, perr)
			}
		}
	}
}
