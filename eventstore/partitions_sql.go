package eventstore

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// trackFunctionSQL is the trigger function of the events table while it is converted (still unpartitioned, its
// unique indexes in force): BEFORE INSERT, for each row, it records the row's event ID and widens its stream's
// head to the row's version and position. It enforces nothing. {{s}} is the quoted schema.
const trackFunctionSQL = `CREATE OR REPLACE FUNCTION {{s}}.events_track_append() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {{s}}.event_ids (event_id, position) VALUES (NEW.event_id, NEW.position) ON CONFLICT DO NOTHING;
    INSERT INTO {{s}}.event_streams AS h (tenant_id, stream_id, version, first_position, last_position)
        VALUES (NEW.tenant_id, NEW.stream_id, NEW.version, NEW.position, NEW.position)
        ON CONFLICT (tenant_id, stream_id) DO UPDATE SET version = greatest(h.version, EXCLUDED.version),
            first_position = least(h.first_position, EXCLUDED.first_position),
            last_position = greatest(h.last_position, EXCLUDED.last_position);
    RETURN NEW;
END
$$`

// checkFunctionSQL is the trigger function of the partitioned events table, BEFORE INSERT, for each row (in the
// appending statement, before the row is stored; its position is drawn already): its event ID must be new, and
// its version must continue its stream's head (1 creates the head; v moves it from v-1 to v, and the stream's last
// position to the row's). A failure is a unique violation naming the
// constraint the unpartitioned table had (events_stream_version_key; event_ids_pkey for an ID), so the store
// reports a concurrency conflict or a duplicate event ID as it always has, and the statement stores nothing. Under
// READ COMMITTED the UPDATE of a head that a concurrent append holds waits for it, then re-checks the version
// against the committed row: of two appends that read the same version, one fails, exactly as on the unique
// index. A row trigger costs less than a statement trigger with a transition table for the appends a store makes
// (one to a few rows). The names are qualified, so the function runs with no search_path of its own.
const checkFunctionSQL = `CREATE OR REPLACE FUNCTION {{s}}.events_check_append() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.version IS NULL THEN
        RETURN NEW; -- a failed version check: the column's NOT NULL constraint reports it
    END IF;
    INSERT INTO {{s}}.event_ids (event_id, position) VALUES (NEW.event_id, NEW.position);
    IF NEW.version = 1 THEN
        INSERT INTO {{s}}.event_streams (tenant_id, stream_id, version, first_position, last_position)
            VALUES (NEW.tenant_id, NEW.stream_id, 1, NEW.position, NEW.position) ON CONFLICT DO NOTHING;
    ELSE
        UPDATE {{s}}.event_streams SET version = NEW.version, last_position = NEW.position
            WHERE tenant_id = NEW.tenant_id AND stream_id = NEW.stream_id AND version = NEW.version - 1;
    END IF;
    IF NOT FOUND THEN
        RAISE unique_violation USING
            MESSAGE = format('stream %L (tenant %L): version %s does not continue its head', NEW.stream_id,
                NEW.tenant_id, NEW.version),
            CONSTRAINT = 'events_stream_version_key', TABLE = 'events', SCHEMA = TG_TABLE_SCHEMA;
    END IF;
    RETURN NEW;
END
$$`

// functionSQL writes a trigger function out for schema.
func functionSQL(tmpl, schema string) string {
	return strings.ReplaceAll(tmpl, "{{s}}", pgx.Identifier{schema}.Sanitize())
}
