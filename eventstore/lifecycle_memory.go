package eventstore

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
)

var _ LifecycleStore = (*MemoryStore)(nil)

// ArchiveStream implements LifecycleStore. The in-memory store has no hot table: the stream's events stay where
// they are (loads and the log read them as before), a marker is appended, and appends are refused.
func (m *MemoryStore) ArchiveStream(ctx context.Context, req LifecycleRequest) (StreamLifecycle, error) {
	if err := checkLifecycleRequest(&req, "archive stream", false); err != nil {
		return StreamLifecycle{}, err
	}
	return m.lifecycleOp(ctx, req, StreamArchived)
}

// DeleteStream implements LifecycleStore: the stream's events lose their payloads and metadata and become
// tombstones the log passes over, its snapshot is deleted, and a deletion marker is appended.
func (m *MemoryStore) DeleteStream(ctx context.Context, req LifecycleRequest) (StreamLifecycle, error) {
	if err := checkLifecycleRequest(&req, "delete stream", true); err != nil {
		return StreamLifecycle{}, err
	}
	return m.lifecycleOp(ctx, req, StreamDeleted)
}

// Lifecycle implements LifecycleStore.
func (m *MemoryStore) Lifecycle(ctx context.Context, tenant, streamID string) (StreamLifecycle, error) {
	if err := ctx.Err(); err != nil {
		return StreamLifecycle{}, err
	}
	tenant = tenantOrDefault(tenant)
	m.mu.RLock()
	defer m.mu.RUnlock()
	key := streamKey{tenant, streamID}
	if lc := m.lifecycle[key]; lc != nil {
		return *lc, nil
	}
	st := m.streams[key]
	if st == nil {
		return StreamLifecycle{Tenant: tenant, StreamID: streamID},
			fmt.Errorf("%w: %q (tenant %q)", ErrStreamNotFound, streamID, tenant)
	}
	return StreamLifecycle{Tenant: tenant, StreamID: streamID, StreamType: st.info.StreamType, State: StreamActive,
		Version: st.info.Version}, nil
}

func (m *MemoryStore) lifecycleOp(ctx context.Context, req LifecycleRequest, to StreamState) (StreamLifecycle,
	error) {
	if err := ctx.Err(); err != nil {
		return StreamLifecycle{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	key := streamKey{req.Tenant, req.StreamID}
	st := m.streams[key]
	if st == nil {
		return StreamLifecycle{}, fmt.Errorf("%w: %q (tenant %q)", ErrStreamNotFound, req.StreamID, req.Tenant)
	}
	lc := m.lifecycle[key]
	switch {
	case lc != nil && lc.State == StreamDeleted:
		return *lc, lifecycleError(*lc)
	case lc != nil && to == StreamArchived:
		return *lc, lifecycleError(*lc)
	case lc == nil:
		lc = &StreamLifecycle{Tenant: req.Tenant, StreamID: req.StreamID, StreamType: st.info.StreamType,
			Version: st.info.Version}
		for _, i := range st.records {
			if !IsLifecycleMarker(m.log[i].Type) {
				if lc.FirstPosition == 0 {
					lc.FirstPosition = m.log[i].Position
				}
				lc.LastPosition = m.log[i].Position
				lc.Events++
			}
		}
	}
	actor := req.Actor
	if actor == "" {
		actor = "unknown"
	}
	now := m.clock().UTC().Truncate(time.Microsecond)
	marker := StreamArchivedType
	if to == StreamArchived {
		lc.ArchivedAt, lc.ArchivedBy, lc.Reason = now, actor, req.Reason
	} else {
		marker = StreamDeletedType
		lc.DeletedAt, lc.DeletedBy, lc.Reason = now, actor, req.Reason
		for _, i := range st.records {
			if !IsLifecycleMarker(m.log[i].Type) {
				m.log[i].Payload, m.log[i].Metadata = nil, nil
				m.tombs[i] = true
			}
		}
		delete(m.snapshots, key)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return StreamLifecycle{}, fmt.Errorf("eventstore: generate event id: %w", err)
	}
	last := m.log[st.records[len(st.records)-1]]
	r := Record{Position: int64(len(m.log)) + 1, Tenant: req.Tenant, StreamID: req.StreamID,
		StreamType: st.info.StreamType, Version: last.Version + 1, EventID: id, Type: marker, TypeVersion: 1,
		Payload: []byte(`{}`), OccurredAt: now, RecordedAt: now}
	m.log = append(m.log, r)
	m.eventIDs[id] = struct{}{}
	st.records = append(st.records, len(m.log)-1)
	lc.State, lc.MarkerPosition = to, r.Position
	m.lifecycle[key] = lc
	return *lc, nil
}
