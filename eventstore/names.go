package eventstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/names"
)

// Limits on what an append stores, checked before anything reaches the database (so a bad value fails with
// ErrInvalidAppend naming it, never with a raw SQLSTATE) and the same in every store.
const (
	// MaxStreamIDLen is the longest stream ID, in bytes.
	MaxStreamIDLen = 1024
	// MaxTypeLen is the longest stream type or event type, in bytes.
	MaxTypeLen = 255
)

// checkNames checks the request's tenant, stream ID and stream type: valid UTF-8, no NUL or other control
// character, within their lengths.
func checkNames(req AppendRequest) error {
	if err := stagehand.ValidateTenant(req.Tenant); err != nil {
		return fmt.Errorf("%w: stream %q: %w", ErrInvalidAppend, names.Cut(req.StreamID, 64), err)
	}
	if err := checkName("StreamID", req.StreamID, MaxStreamIDLen); err != nil {
		return fmt.Errorf("%w: stream %q: %s", ErrInvalidAppend, names.Cut(req.StreamID, 64), err)
	}
	if err := checkName("StreamType", req.StreamType, MaxTypeLen); err != nil {
		return fmt.Errorf("%w: stream %q: %s", ErrInvalidAppend, req.StreamID, err)
	}
	return nil
}

// checkEvent checks event i's type and metadata (keys and values must be storable text).
func checkEvent(stream string, i int, e EventData) error {
	if err := checkName("Type", e.Type, MaxTypeLen); err != nil {
		return fmt.Errorf("%w: event %d of stream %q: %s", ErrInvalidAppend, i, stream, err)
	}
	for k, v := range e.Metadata {
		if reason := names.Stored(k); reason != "" {
			return fmt.Errorf("%w: event %d of stream %q: metadata key %q %s", ErrInvalidAppend, i, stream,
				names.Cut(k, 64), reason)
		}
		if reason := names.Stored(v); reason != "" {
			return fmt.Errorf("%w: event %d of stream %q: metadata value of %q %s", ErrInvalidAppend, i, stream,
				names.Cut(k, 64), reason)
		}
	}
	return nil
}

func checkName(field, v string, limit int) error {
	if len(v) > limit {
		return fmt.Errorf("%s is %d bytes, longer than %d", field, len(v), limit)
	}
	if reason := names.Text(v); reason != "" {
		return fmt.Errorf("%s %s", field, reason)
	}
	return nil
}

// checkQuery checks a log query's tenant filter, so a tenant that could never have been stored fails with a
// typed error instead of reaching PostgreSQL, and normalises it as every tenant input is: a blank tenant is
// NoTenant (the caller's slice is left as it was).
func checkQuery(q *LogQuery) error {
	var norm []string
	for i, t := range q.Tenants {
		if err := stagehand.ValidateTenant(t); err != nil {
			return fmt.Errorf("eventstore: read log: tenant filter: %w", err)
		}
		if n := stagehand.NormalizeTenant(t); n != t {
			if norm == nil {
				norm = slices.Clone(q.Tenants)
			}
			norm[i] = n
		}
	}
	if norm != nil {
		q.Tenants = norm
	}
	return nil
}

// translateData turns a data error PostgreSQL raised for an append (class 22: a payload that is not JSON, a
// \u0000 jsonb refuses; class 54: a value past one of its limits) into ErrInvalidAppend naming the stream and,
// where it can be found, the event. It returns nil for other errors.
func translateData(err error, req AppendRequest) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 || (pgErr.Code[:2] != "22" && pgErr.Code[:2] != "54") {
		return nil
	}
	for i, e := range req.Events {
		switch {
		case !json.Valid(e.Payload):
			return fmt.Errorf("%w: event %d (type %q) of stream %q: payload is not valid JSON", ErrInvalidAppend, i,
				e.Type, req.StreamID)
		case bytes.Contains(e.Payload, []byte(`\u0000`)):
			return fmt.Errorf(`%w: event %d (type %q) of stream %q: payload contains \u0000, which PostgreSQL's `+
				"jsonb cannot store", ErrInvalidAppend, i, e.Type, req.StreamID)
		}
	}
	// Not an input the checks above recognise: name the stream and PostgreSQL's reason, without its code.
	return fmt.Errorf("%w: stream %q: PostgreSQL refused a value: %s", ErrInvalidAppend, req.StreamID, pgErr.Message)
}
