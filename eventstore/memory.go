package eventstore

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
)

// MemoryConfig configures a MemoryStore. A nil *MemoryConfig uses the defaults.
type MemoryConfig struct {
	// Clock stamps OccurredAt (when an event carries none) and RecordedAt. Default time.Now.
	Clock func() time.Time
}

// MemoryStore is an in-memory Store with the same semantics as the PostgreSQL store, for users' unit tests. It
// passes the same conformance suite. It does not implement TransactionalStore.
type MemoryStore struct {
	clock func() time.Time

	mu        sync.RWMutex
	streams   map[streamKey]*memStream
	log       []Record
	eventIDs  map[uuid.UUID]struct{}
	snapshots map[streamKey]Snapshot
	// lifecycle holds the archived and deleted streams; tombs the log indexes of deleted events.
	lifecycle map[streamKey]*StreamLifecycle
	tombs     map[int]bool
}

type streamKey struct{ tenant, id string }

type memStream struct {
	info    StreamInfo
	records []int // indexes into log
}

// NewMemory returns an empty in-memory store.
func NewMemory(cfg *MemoryConfig) *MemoryStore {
	clock := time.Now
	if cfg != nil && cfg.Clock != nil {
		clock = cfg.Clock
	}
	return &MemoryStore{
		clock:     clock,
		streams:   map[streamKey]*memStream{},
		eventIDs:  map[uuid.UUID]struct{}{},
		snapshots: map[streamKey]Snapshot{},
		lifecycle: map[streamKey]*StreamLifecycle{},
		tombs:     map[int]bool{},
	}
}

// Append implements Store.
func (m *MemoryStore) Append(ctx context.Context, req AppendRequest) (AppendResult, error) {
	if err := ctx.Err(); err != nil {
		return AppendResult{}, err
	}
	now := m.clock().UTC().Truncate(time.Microsecond)
	req, err := prepare(req, now)
	if err != nil {
		return AppendResult{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	key := streamKey{req.Tenant, req.StreamID}
	if lc := m.lifecycle[key]; lc != nil {
		return AppendResult{}, lifecycleError(*lc)
	}
	st := m.streams[key]
	var current int64
	if st != nil {
		current = st.info.Version
	}
	ok := false
	switch req.Expected {
	case AnyVersion:
		ok = true
	case NoStream:
		ok = st == nil
	case StreamExists:
		ok = st != nil
	default:
		ok = st != nil && current == int64(req.Expected)
	}
	if !ok {
		return AppendResult{}, &ConflictError{Tenant: req.Tenant, StreamID: req.StreamID, Expected: req.Expected,
			Actual: current}
	}
	for _, e := range req.Events {
		if _, dup := m.eventIDs[e.EventID]; dup {
			return AppendResult{}, fmt.Errorf("%w: event %s of the append to stream %q is already stored",
				ErrDuplicateEventID, e.EventID, req.StreamID)
		}
	}
	if st == nil {
		st = &memStream{info: StreamInfo{Tenant: req.Tenant, StreamID: req.StreamID, StreamType: req.StreamType,
			CreatedAt: now, State: StreamActive}}
		m.streams[key] = st
	}
	res := AppendResult{Records: make([]Record, 0, len(req.Events))}
	for _, e := range req.Events {
		current++
		r := Record{
			Position:    int64(len(m.log)) + 1,
			Tenant:      req.Tenant,
			StreamID:    req.StreamID,
			StreamType:  req.StreamType,
			Version:     current,
			EventID:     e.EventID,
			Type:        e.Type,
			TypeVersion: e.TypeVersion,
			Payload:     slices.Clone(e.Payload),
			Metadata:    maps.Clone(e.Metadata),
			OccurredAt:  e.OccurredAt,
			RecordedAt:  now,
		}
		m.log = append(m.log, r)
		m.eventIDs[e.EventID] = struct{}{}
		st.records = append(st.records, len(m.log)-1)
		res.Records = append(res.Records, copyRecord(r))
	}
	st.info.Version = current
	st.info.UpdatedAt = now
	res.Version = current
	return res, nil
}

// ReadStream implements Store.
func (m *MemoryStore) ReadStream(ctx context.Context, tenant, streamID string, fromVersion int64) ([]Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	tenant = tenantOrDefault(tenant)
	m.mu.RLock()
	defer m.mu.RUnlock()
	st := m.streams[streamKey{tenant, streamID}]
	if st == nil {
		return nil, fmt.Errorf("%w: %q (tenant %q)", ErrStreamNotFound, streamID, tenant)
	}
	if lc := m.lifecycle[streamKey{tenant, streamID}]; lc != nil && lc.State == StreamDeleted {
		return nil, lifecycleError(*lc)
	}
	var out []Record
	for _, i := range st.records {
		if m.log[i].Version >= fromVersion && !IsLifecycleMarker(m.log[i].Type) {
			out = append(out, copyRecord(m.log[i]))
		}
	}
	return out, nil
}

// ReadLog implements Store. Positions are assigned at commit under a lock, so the in-memory log has no gaps.
func (m *MemoryStore) ReadLog(ctx context.Context, q LogQuery) (LogPage, error) {
	if err := checkQuery(&q); err != nil {
		return LogPage{}, err
	}
	if err := ctx.Err(); err != nil {
		return LogPage{}, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	page := LogPage{Last: q.After}
	if q.After < 0 {
		q.After = 0
	}
	end := min(int64(len(m.log)), q.After+int64(q.limit()))
	for i := q.After; i < end; i++ {
		r := &m.log[i]
		if q.passes(r, m.tombs[int(i)]) {
			page.Records = append(page.Records, copyRecord(*r))
		}
		page.Last = r.Position
	}
	return page, nil
}

// HeadPosition implements Store.
func (m *MemoryStore) HeadPosition(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	return int64(len(m.log)), nil
}

// Stream implements Store.
func (m *MemoryStore) Stream(ctx context.Context, tenant, streamID string) (StreamInfo, error) {
	if err := ctx.Err(); err != nil {
		return StreamInfo{}, err
	}
	tenant = tenantOrDefault(tenant)
	m.mu.RLock()
	defer m.mu.RUnlock()
	st := m.streams[streamKey{tenant, streamID}]
	if st == nil {
		return StreamInfo{Tenant: tenant, StreamID: streamID},
			fmt.Errorf("%w: %q (tenant %q)", ErrStreamNotFound, streamID, tenant)
	}
	if lc := m.lifecycle[streamKey{tenant, streamID}]; lc != nil {
		if lc.State == StreamDeleted {
			return StreamInfo{Tenant: tenant, StreamID: streamID}, lifecycleError(*lc)
		}
		info := st.info
		info.State = lc.State
		return info, nil
	}
	return st.info, nil
}

// SaveSnapshot implements Store.
func (m *MemoryStore) SaveSnapshot(ctx context.Context, s Snapshot) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.Tenant = tenantOrDefault(s.Tenant)
	m.mu.Lock()
	defer m.mu.Unlock()
	key := streamKey{s.Tenant, s.StreamID}
	if old, ok := m.snapshots[key]; ok && old.Version > s.Version {
		return nil
	}
	s.Payload = slices.Clone(s.Payload)
	s.CreatedAt = m.clock().UTC().Truncate(time.Microsecond)
	m.snapshots[key] = s
	return nil
}

// LoadSnapshot implements Store.
func (m *MemoryStore) LoadSnapshot(ctx context.Context, tenant, streamID string) (Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return Snapshot{}, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	s, ok := m.snapshots[streamKey{tenantOrDefault(tenant), streamID}]
	if !ok {
		return Snapshot{}, ErrSnapshotNotFound
	}
	s.Payload = slices.Clone(s.Payload)
	return s, nil
}

func copyRecord(r Record) Record {
	r.Payload = slices.Clone(r.Payload)
	r.Metadata = maps.Clone(r.Metadata)
	return r
}

// DeleteSnapshot implements Store.
func (m *MemoryStore) DeleteSnapshot(ctx context.Context, tenant, streamID string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tenant = tenantOrDefault(tenant)
	m.mu.Lock()
	defer m.mu.Unlock()
	key := streamKey{tenant, streamID}
	if _, ok := m.snapshots[key]; !ok {
		return fmt.Errorf("%w: stream %q (tenant %q)", ErrSnapshotNotFound, streamID, tenant)
	}
	delete(m.snapshots, key)
	return nil
}
