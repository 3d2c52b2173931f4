package eventstore

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/stagehand-es/stagehand"
)

// prepare validates an append request and fills defaults (tenant, event IDs, occurred-at, type version) in a copy.
func prepare(req AppendRequest, now time.Time) (AppendRequest, error) {
	if strings.TrimSpace(req.StreamID) == "" {
		return req, fmt.Errorf("%w: StreamID must not be empty", ErrInvalidAppend)
	}
	if len(req.Events) == 0 {
		return req, fmt.Errorf("%w: no events to append to stream %q", ErrInvalidAppend, req.StreamID)
	}
	if req.Expected < StreamExists {
		return req, fmt.Errorf("%w: expected version %d is not a version, AnyVersion, NoStream or StreamExists",
			ErrInvalidAppend, int64(req.Expected))
	}
	req.Tenant = stagehand.NormalizeTenant(req.Tenant)
	if err := checkNames(req); err != nil {
		return req, err
	}
	events := make([]EventData, len(req.Events))
	seen := make(map[uuid.UUID]struct{}, len(events))
	for i, e := range req.Events {
		if strings.TrimSpace(e.Type) == "" {
			return req, fmt.Errorf("%w: event %d of stream %q has no type", ErrInvalidAppend, i, req.StreamID)
		}
		if err := checkEvent(req.StreamID, i, e); err != nil {
			return req, err
		}
		if IsLifecycleMarker(e.Type) {
			return req, fmt.Errorf("%w: event %d of stream %q: type %q: types starting with %q are reserved for the "+
				"store's lifecycle markers", ErrInvalidAppend, i, req.StreamID, e.Type, LifecycleTypePrefix)
		}
		if e.EventID == uuid.Nil {
			id, err := uuid.NewV7()
			if err != nil {
				return req, fmt.Errorf("eventstore: generate event id: %w", err)
			}
			e.EventID = id
		}
		if _, dup := seen[e.EventID]; dup {
			return req, fmt.Errorf("%w: event id %s appears twice in one append", ErrDuplicateEventID, e.EventID)
		}
		seen[e.EventID] = struct{}{}
		if e.TypeVersion == 0 {
			e.TypeVersion = 1
		}
		if e.OccurredAt.IsZero() {
			e.OccurredAt = now
		}
		// PostgreSQL keeps microseconds; every store does the same so values round-trip identically.
		e.OccurredAt = e.OccurredAt.UTC().Truncate(time.Microsecond)
		if len(e.Payload) == 0 {
			e.Payload = []byte("null")
		}
		events[i] = e
	}
	req.Events = events
	return req, nil
}

func tenantOrDefault(tenant string) string { return stagehand.NormalizeTenant(tenant) }

func (q LogQuery) limit() int {
	if q.Limit <= 0 {
		return 1000
	}
	return q.Limit
}

// matches reports whether r passes the query's filters.
func (q LogQuery) matches(r *Record) bool {
	return contains(q.EventTypes, r.Type) && contains(q.StreamTypes, r.StreamType) && contains(q.Tenants, r.Tenant)
}

func contains(set []string, v string) bool { return len(set) == 0 || slices.Contains(set, v) }
