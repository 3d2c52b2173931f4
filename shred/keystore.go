package shred

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// KeySize is the size of every key's material: AES-256.
const KeySize = 32

// MaxSubjectLen is the longest subject ID accepted, in bytes.
const MaxSubjectLen = 512

var (
	// ErrForgotten is matched by the error of a key whose subject was forgotten. The Codec never returns it from
	// Unmarshal: a field encrypted with a forgotten key reads as its redacted value.
	ErrForgotten = errors.New("shred: the subject's key was forgotten")
	// ErrUnknownKey is matched by the error of a key the store never made (a version beyond the subject's
	// current one, or a subject it does not know): data encrypted with it did not come from this store, so
	// reading it is an error, never a redaction.
	ErrUnknownKey = errors.New("shred: no such key")
	// ErrInvalidSubject is matched by the error of a subject ID that cannot be stored: empty, longer than
	// MaxSubjectLen bytes, not UTF-8, or holding a NUL byte.
	ErrInvalidSubject = errors.New("shred: invalid subject")
)

// Key is one version of a subject's key.
type Key struct {
	Subject string
	// Version counts from 1; every rotation, and the first key made after a forget, takes the next one.
	Version int
	// Material is the AES-256 key (KeySize bytes).
	Material []byte
}

// Audit says who asked for a rotation or a forget, and why; it is stored with the audit record.
type Audit struct {
	// Actor is the person or process that asked (an operator's name, "stagehand-cli", a service name).
	Actor string
	// Reason is free text: a ticket, "erasure request", ...
	Reason string
}

// AuditEntry is one audit record of a key store.
type AuditEntry struct {
	At time.Time
	// Action is "forget" or "rotate".
	Action  string
	Subject string
	// Versions are, for a forget, the versions whose material was deleted (empty when the subject had none); for
	// a rotation, the new version.
	Versions []int
	Actor    string
	Reason   string
}

// KeyStore keeps the subjects' keys. A KeyStore must be safe for concurrent use; implementations may back it with
// a KMS. The Codec calls CurrentKey on writes and Key on reads, and caches what they return for at most its
// CacheTTL.
type KeyStore interface {
	// CurrentKey returns the key new writes for subject use, making it (at the version after the subject's last
	// one) when the subject has none: on its first write, and on the first write after it was forgotten.
	CurrentKey(ctx context.Context, subject string) (Key, error)
	// Key returns subject's key at version: an error matching ErrForgotten when that key was forgotten, one
	// matching ErrUnknownKey when the store never made it.
	Key(ctx context.Context, subject string, version int) (Key, error)
	// Rotate makes a new current key for subject (the next version) and records it in the audit; older versions
	// stay readable until the subject is forgotten.
	Rotate(ctx context.Context, subject string, audit Audit) (Key, error)
	// Forget deletes every version of subject's key and records it in the audit, returning the versions deleted
	// (none when the subject had no key; the forget is recorded all the same).
	Forget(ctx context.Context, subject string, audit Audit) ([]int, error)
	// History returns the audit records of subject, oldest first.
	History(ctx context.Context, subject string) ([]AuditEntry, error)
}

// CheckSubject returns an error matching ErrInvalidSubject when subject cannot be a subject ID.
func CheckSubject(subject string) error {
	switch {
	case subject == "":
		return fmt.Errorf("%w: empty", ErrInvalidSubject)
	case len(subject) > MaxSubjectLen:
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidSubject, len(subject), MaxSubjectLen)
	case !utf8.ValidString(subject):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidSubject)
	case strings.IndexByte(subject, 0) >= 0:
		return fmt.Errorf("%w: holds a NUL byte", ErrInvalidSubject)
	}
	return nil
}

func newMaterial() ([]byte, error) {
	m := make([]byte, KeySize)
	if _, err := rand.Read(m); err != nil {
		return nil, fmt.Errorf("shred: make key material: %w", err)
	}
	return m, nil
}

// MemoryKeyStore is a KeyStore in memory, for tests and single-process tools: its keys die with the process.
// The zero value is not usable; call NewMemoryKeyStore.
type MemoryKeyStore struct {
	mu       sync.Mutex
	subjects map[string]*memSubject
	audit    []AuditEntry
	now      func() time.Time
}

type memSubject struct {
	current int
	keys    map[int][]byte
}

// NewMemoryKeyStore returns an empty in-memory key store.
func NewMemoryKeyStore() *MemoryKeyStore {
	return &MemoryKeyStore{subjects: map[string]*memSubject{}, now: time.Now}
}

func (m *MemoryKeyStore) subject(s string) *memSubject {
	sub := m.subjects[s]
	if sub == nil {
		sub = &memSubject{keys: map[int][]byte{}}
		m.subjects[s] = sub
	}
	return sub
}

// CurrentKey implements KeyStore.
func (m *MemoryKeyStore) CurrentKey(_ context.Context, subject string) (Key, error) {
	if err := CheckSubject(subject); err != nil {
		return Key{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	sub := m.subject(subject)
	if mat, ok := sub.keys[sub.current]; ok {
		return Key{Subject: subject, Version: sub.current, Material: mat}, nil
	}
	return m.next(subject, sub)
}

func (m *MemoryKeyStore) next(subject string, sub *memSubject) (Key, error) {
	mat, err := newMaterial()
	if err != nil {
		return Key{}, err
	}
	sub.current++
	sub.keys[sub.current] = mat
	return Key{Subject: subject, Version: sub.current, Material: mat}, nil
}

// Key implements KeyStore.
func (m *MemoryKeyStore) Key(_ context.Context, subject string, version int) (Key, error) {
	if err := CheckSubject(subject); err != nil {
		return Key{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	sub := m.subjects[subject]
	switch {
	case sub == nil || version < 1 || version > sub.current:
		return Key{}, fmt.Errorf("%w: subject %q version %d", ErrUnknownKey, subject, version)
	case sub.keys[version] == nil:
		return Key{}, fmt.Errorf("%w: subject %q version %d", ErrForgotten, subject, version)
	}
	return Key{Subject: subject, Version: version, Material: sub.keys[version]}, nil
}

// Rotate implements KeyStore.
func (m *MemoryKeyStore) Rotate(_ context.Context, subject string, audit Audit) (Key, error) {
	if err := CheckSubject(subject); err != nil {
		return Key{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k, err := m.next(subject, m.subject(subject))
	if err != nil {
		return Key{}, err
	}
	m.audit = append(m.audit, AuditEntry{At: m.now(), Action: "rotate", Subject: subject, Versions: []int{k.Version},
		Actor: audit.Actor, Reason: audit.Reason})
	return k, nil
}

// Forget implements KeyStore.
func (m *MemoryKeyStore) Forget(_ context.Context, subject string, audit Audit) ([]int, error) {
	if err := CheckSubject(subject); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	sub := m.subject(subject)
	versions := []int{}
	for v := range sub.keys {
		versions = append(versions, v)
	}
	slices.Sort(versions)
	clear(sub.keys)
	m.audit = append(m.audit, AuditEntry{At: m.now(), Action: "forget", Subject: subject, Versions: versions,
		Actor: audit.Actor, Reason: audit.Reason})
	return slices.Clone(versions), nil
}

// History implements KeyStore.
func (m *MemoryKeyStore) History(_ context.Context, subject string) ([]AuditEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []AuditEntry
	for _, e := range m.audit {
		if e.Subject == subject {
			e.Versions = slices.Clone(e.Versions)
			out = append(out, e)
		}
	}
	return out, nil
}
