package shred

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/stagehand-es/stagehand"
)

// Redacted is what a personal field of a plain string type reads as once its subject is forgotten. Fields of every
// other type (numbers, structs, slices, pointers, and string types with their own JSON or text decoding) read as
// their zero value.
const Redacted = "[forgotten]"

// marker is the key that makes a JSON object an encrypted field.
const marker = "$pii"

var markerBytes = []byte(`"` + marker + `"`)

var (
	// ErrTampered is matched by the error of an encrypted field that does not authenticate under its key (its
	// ciphertext, subject or key version was changed, or it is not an encrypted field the codec wrote). It is an
	// error, never a redaction.
	ErrTampered = errors.New("shred: encrypted field does not authenticate")
	// ErrNoSubject is matched by the error of a personal field whose subject field is empty, null or absent: the
	// value cannot be encrypted, so nothing is written.
	ErrNoSubject = errors.New("shred: personal data without a subject")
)

// FieldError is the error of one personal field: Path is its place in the JSON document (for example
// "customer.email"), Subject and Version the key it needed (when known).
type FieldError struct {
	Path    string
	Subject string
	Version int
	Err     error
}

func (e *FieldError) Error() string {
	s := "shred: field " + strconv.Quote(e.Path)
	if e.Subject != "" {
		s += " of subject " + strconv.Quote(e.Subject)
	}
	if e.Version > 0 {
		s += " (key version " + strconv.Itoa(e.Version) + ")"
	}
	return s + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *FieldError) Unwrap() error { return e.Err }

// CodecConfig configures a Codec. A nil *CodecConfig uses the defaults.
type CodecConfig struct {
	// CacheTTL is how long a key (or the news that it was forgotten) read from the KeyStore is used without
	// asking the store again. It bounds how long a process that did not itself forget a subject goes on reading
	// that subject's data after another process forgot it, and how long it goes on writing with a key another
	// process rotated or forgot (a write in that window is encrypted with the forgotten key: it reads as redacted,
	// never in clear). Default 5s; a negative value turns the cache off (every field asks the store).
	CacheTTL time.Duration
	// CacheSize bounds how many subjects' keys are cached. Default 10,000.
	CacheSize int
	// Timeout bounds each KeyStore call that Marshal and Unmarshal make (they take no context). Default 5s.
	Timeout time.Duration
}

// Codec encrypts the personal fields of the values it encodes and decrypts them when decoding; it implements
// aggregate.Codec, so it plugs into an aggregate.Registry (RegistryConfig.Codec) and, through it, into staging's
// message payloads. Values without personal fields are plain encoding/json. It is safe for concurrent use.
type Codec struct {
	keys    KeyStore
	ttl     time.Duration
	size    int
	timeout time.Duration
	now     func() time.Time
	types   infos

	mu    sync.Mutex
	cache map[string]*subjectKeys
	gen   uint64 // counts Forget and Rotate calls: a key read before one is not cached after it
}

type subjectKeys struct {
	current  *cachedKey
	versions map[int]*cachedKey
}

type cachedKey struct {
	version   int
	aead      cipher.AEAD // nil when forgotten
	forgotten bool
	expires   time.Time
}

// NewCodec returns a codec whose keys come from keys.
func NewCodec(keys KeyStore, cfg *CodecConfig) (*Codec, error) {
	var c CodecConfig
	if cfg != nil {
		c = *cfg
	}
	switch {
	case keys == nil:
		return nil, &stagehand.ConfigError{Package: "shred", Field: "keys", Reason: "must not be nil"}
	case c.CacheSize < 0:
		return nil, &stagehand.ConfigError{Package: "shred", Field: "CacheSize", Reason: fmt.Sprintf(
			"must not be negative, got %d", c.CacheSize)}
	case c.Timeout < 0:
		return nil, &stagehand.ConfigError{Package: "shred", Field: "Timeout", Reason: fmt.Sprintf(
			"must not be negative, got %s", c.Timeout)}
	}
	if c.CacheTTL == 0 {
		c.CacheTTL = 5 * time.Second
	}
	if c.CacheSize == 0 {
		c.CacheSize = 10_000
	}
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second
	}
	return &Codec{keys: keys, ttl: c.CacheTTL, size: c.CacheSize, timeout: c.Timeout, now: time.Now,
		cache: map[string]*subjectKeys{}}, nil
}

// KeyStore returns the codec's key store.
func (c *Codec) KeyStore() KeyStore { return c.keys }

// Check reports whether the stagehand struct tags of v's type (and of the types inside it) can be followed: nil,
// or an error matching ErrInvalidTag naming each fault. Marshal refuses such a type with the same error; call
// Check where you register event types to fail at start-up instead.
func (c *Codec) Check(v any) error { return c.types.get(reflect.TypeOf(v)).err }

// Marshal encodes v as JSON, with each personal field replaced by its encryption under its subject's current key
// (made on the subject's first write).
func (c *Codec) Marshal(v any) ([]byte, error) {
	t := reflect.TypeOf(v)
	info := c.types.get(t)
	if info.err != nil {
		return nil, info.err
	}
	data, err := json.Marshal(v)
	if err != nil || !info.hasPII {
		return data, err
	}
	lc := &lazyCtx{timeout: c.timeout}
	defer lc.done()
	return c.encode(lc, data, t, "")
}

// encode encrypts the personal fields inside raw, a JSON value of type t at path.
func (c *Codec) encode(lc *lazyCtx, raw []byte, t reflect.Type, path string) ([]byte, error) {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || bytes.Equal(bytes.TrimSpace(raw), jsonNull) {
		return raw, nil
	}
	info := c.types.get(t)
	if !info.hasPII {
		return raw, nil
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return raw, nil // a []byte-like value or a custom encoding: nothing the codec can walk
		}
		for i, it := range items {
			out, err := c.encode(lc, it, t.Elem(), path+"["+strconv.Itoa(i)+"]")
			if err != nil {
				return nil, err
			}
			items[i] = out
		}
		return json.Marshal(items)
	case reflect.Map:
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return raw, nil
		}
		for k, it := range m {
			out, err := c.encode(lc, it, t.Elem(), join(path, k))
			if err != nil {
				return nil, err
			}
			m[k] = out
		}
		return writeObject(m), nil
	case reflect.Struct:
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return raw, nil // a type with its own JSON encoding that is not an object
		}
		for _, f := range info.plan {
			v, ok := m[f.name]
			if !ok {
				continue
			}
			p := join(path, f.name)
			if !f.pii {
				out, err := c.encode(lc, v, f.typ, p)
				if err != nil {
					return nil, err
				}
				m[f.name] = out
				continue
			}
			if bytes.Equal(bytes.TrimSpace(v), jsonNull) {
				continue // nothing to protect
			}
			subject, err := subjectOf(m[f.subject])
			if err != nil {
				return nil, &FieldError{Path: p, Err: fmt.Errorf("%w: subject field %s (%s): %v", ErrNoSubject,
					f.subjGo, f.subject, err)}
			}
			out, err := c.seal(lc, subject, v)
			if err != nil {
				return nil, &FieldError{Path: p, Subject: subject, Err: err}
			}
			m[f.name] = out
		}
		return writeObject(m), nil
	}
	return raw, nil
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// subjectOf reads a subject's ID from the JSON value of its field: a string or a number.
func subjectOf(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, jsonNull) {
		return "", errors.New("absent or null")
	}
	var s string
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
	} else {
		var n json.Number
		if err := json.Unmarshal(raw, &n); err != nil {
			return "", errors.New("neither a string nor a number")
		}
		s = n.String()
	}
	if s == "" {
		return "", errors.New("empty")
	}
	return s, CheckSubject(s)
}

// envelope is an encrypted field as stored: {"$pii":1,"s":subject,"k":version,"c":nonce+ciphertext}.
type envelope struct {
	Format  int    `json:"$pii"`
	Subject string `json:"s"`
	Version int    `json:"k"`
	Data    []byte `json:"c"`
}

// aad binds a ciphertext to its subject and key version.
func aad(subject string, version int) []byte {
	b := make([]byte, 0, len(subject)+24)
	b = append(b, "stagehand/pii/1\x00"...)
	b = append(b, subject...)
	b = append(b, 0)
	return strconv.AppendInt(b, int64(version), 10)
}

func (c *Codec) seal(lc *lazyCtx, subject string, plain []byte) ([]byte, error) {
	k, err := c.writeKey(lc, subject)
	if err != nil {
		return nil, err
	}
	ns := k.aead.NonceSize()
	buf := make([]byte, ns, ns+len(plain)+k.aead.Overhead())
	if _, err := rand.Read(buf); err != nil {
		return nil, fmt.Errorf("shred: nonce: %w", err)
	}
	buf = k.aead.Seal(buf, buf, plain, aad(subject, k.version))
	return json.Marshal(envelope{Format: 1, Subject: subject, Version: k.version, Data: buf})
}

// Unmarshal decodes data into v, decrypting every encrypted field. A field whose subject was forgotten reads as
// Redacted (plain string types) or as its zero value; a field that does not authenticate is a *FieldError
// matching ErrTampered, and a key store failure is a *FieldError wrapping it: neither is ever redacted.
func (c *Codec) Unmarshal(data []byte, v any) error {
	if !bytes.Contains(data, markerBytes) {
		return json.Unmarshal(data, v)
	}
	var t reflect.Type
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && !rv.IsNil() {
		t = rv.Type().Elem()
	}
	lc := &lazyCtx{timeout: c.timeout}
	defer lc.done()
	out, err := c.decode(lc, data, t, "")
	if err != nil {
		return err
	}
	return json.Unmarshal(out, v)
}

// Open decrypts data, a JSON document the codec wrote, into the same document in clear (redacted where a
// subject was forgotten), for readers that have no Go type for it. Personal fields of unknown type read as null
// once forgotten.
func (c *Codec) Open(data []byte) ([]byte, error) {
	if !bytes.Contains(data, markerBytes) {
		return data, nil
	}
	lc := &lazyCtx{timeout: c.timeout}
	defer lc.done()
	return c.decode(lc, data, nil, "")
}

// decode replaces every envelope inside raw (a JSON value whose Go type is t, or nil when unknown) with its
// plaintext.
func (c *Codec) decode(lc *lazyCtx, raw []byte, t reflect.Type, path string) ([]byte, error) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || !bytes.Contains(trimmed, markerBytes) {
		return raw, nil
	}
	switch trimmed[0] {
	case '{':
		if path != "" { // most values holding the marker below the top are envelopes: one parse for those
			var e envelope
			if err := json.Unmarshal(trimmed, &e); err == nil && e.Format != 0 {
				return c.openEnvelope(lc, e, t, path)
			}
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(trimmed, &m); err != nil {
			return nil, err
		}
		if _, ok := m[marker]; ok {
			return c.open(lc, trimmed, t, path)
		}
		for k, it := range m {
			out, err := c.decode(lc, it, c.types.child(t, k), join(path, k))
			if err != nil {
				return nil, err
			}
			m[k] = out
		}
		return writeObject(m), nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(trimmed, &items); err != nil {
			return nil, err
		}
		et := elem(t)
		for i, it := range items {
			out, err := c.decode(lc, it, et, path+"["+strconv.Itoa(i)+"]")
			if err != nil {
				return nil, err
			}
			items[i] = out
		}
		return json.Marshal(items)
	}
	return raw, nil
}

// open decrypts one envelope.
func (c *Codec) open(lc *lazyCtx, raw []byte, t reflect.Type, path string) ([]byte, error) {
	var e envelope
	if err := json.Unmarshal(raw, &e); err != nil {
		return nil, &FieldError{Path: path, Err: fmt.Errorf("%w: malformed encrypted field", ErrTampered)}
	}
	return c.openEnvelope(lc, e, t, path)
}

// openEnvelope decrypts one parsed envelope.
func (c *Codec) openEnvelope(lc *lazyCtx, e envelope, t reflect.Type, path string) ([]byte, error) {
	if e.Format != 1 || e.Version < 1 {
		return nil, &FieldError{Path: path, Err: fmt.Errorf("%w: malformed encrypted field", ErrTampered)}
	}
	if err := CheckSubject(e.Subject); err != nil {
		return nil, &FieldError{Path: path, Err: fmt.Errorf("%w: %w", ErrTampered, err)}
	}
	k, err := c.readKey(lc, e.Subject, e.Version)
	if err != nil {
		return nil, &FieldError{Path: path, Subject: e.Subject, Version: e.Version, Err: err}
	}
	if k.forgotten {
		return redacted(t), nil
	}
	ns := k.aead.NonceSize()
	if len(e.Data) < ns+k.aead.Overhead() {
		return nil, &FieldError{Path: path, Subject: e.Subject, Version: e.Version,
			Err: fmt.Errorf("%w: ciphertext too short", ErrTampered)}
	}
	plain, err := k.aead.Open(nil, e.Data[:ns], e.Data[ns:], aad(e.Subject, e.Version))
	if err != nil || !json.Valid(plain) {
		return nil, &FieldError{Path: path, Subject: e.Subject, Version: e.Version, Err: ErrTampered}
	}
	return plain, nil
}

// writeKey returns subject's current key, from the cache when fresh.
func (c *Codec) writeKey(lc *lazyCtx, subject string) (*cachedKey, error) {
	now := c.now()
	c.mu.Lock()
	if s := c.cache[subject]; s != nil && s.current != nil && now.Before(s.current.expires) {
		k := s.current
		c.mu.Unlock()
		return k, nil
	}
	gen := c.gen
	c.mu.Unlock()
	key, err := c.keys.CurrentKey(lc.get(), subject)
	if err != nil {
		return nil, err
	}
	k, err := newCached(key, now.Add(c.ttl))
	if err != nil {
		return nil, err
	}
	c.store(subject, gen, func(s *subjectKeys) { s.current = k; s.versions[k.version] = k })
	return k, nil
}

// readKey returns subject's key at version (or that it was forgotten), from the cache when fresh.
func (c *Codec) readKey(lc *lazyCtx, subject string, version int) (*cachedKey, error) {
	now := c.now()
	c.mu.Lock()
	if s := c.cache[subject]; s != nil {
		if k := s.versions[version]; k != nil && now.Before(k.expires) {
			c.mu.Unlock()
			return k, nil
		}
	}
	gen := c.gen
	c.mu.Unlock()
	key, err := c.keys.Key(lc.get(), subject, version)
	var k *cachedKey
	switch {
	case errors.Is(err, ErrForgotten):
		k = &cachedKey{version: version, forgotten: true, expires: now.Add(c.ttl)}
	case err != nil:
		return nil, err
	default:
		if k, err = newCached(key, now.Add(c.ttl)); err != nil {
			return nil, err
		}
	}
	c.store(subject, gen, func(s *subjectKeys) { s.versions[version] = k })
	return k, nil
}

func newCached(key Key, expires time.Time) (*cachedKey, error) {
	if len(key.Material) != KeySize {
		return nil, fmt.Errorf("shred: key %d of subject %q has %d bytes of material, want %d", key.Version,
			key.Subject, len(key.Material), KeySize)
	}
	block, err := aes.NewCipher(key.Material)
	if err != nil {
		return nil, fmt.Errorf("shred: key %d of subject %q: %w", key.Version, key.Subject, err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("shred: key %d of subject %q: %w", key.Version, key.Subject, err)
	}
	return &cachedKey{version: key.Version, aead: aead, expires: expires}, nil
}

// store updates subject's cache entry, evicting expired entries (then any) when the cache is full. With caching
// off, or when a Forget or Rotate ran since gen was read (what was read may predate it), it stores nothing.
func (c *Codec) store(subject string, gen uint64, fn func(*subjectKeys)) {
	if c.ttl < 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		return
	}
	s := c.cache[subject]
	if s == nil {
		if len(c.cache) >= c.size {
			c.evictLocked()
		}
		s = &subjectKeys{versions: map[int]*cachedKey{}}
		c.cache[subject] = s
	}
	fn(s)
}

func (c *Codec) evictLocked() {
	now := c.now()
	for subj, s := range c.cache {
		fresh := s.current != nil && now.Before(s.current.expires)
		for _, k := range s.versions {
			fresh = fresh || now.Before(k.expires)
		}
		if !fresh {
			delete(c.cache, subj)
		}
	}
	for subj := range c.cache { // still full: drop arbitrary entries down to three quarters
		if len(c.cache) < c.size*3/4+1 {
			break
		}
		delete(c.cache, subj)
	}
}

// Forget forgets subject in the key store (deleting every version of its key, with an audit record) and drops
// its keys from this codec's cache, so this process reads the subject's data as redacted at once; other
// processes do within their CacheTTL. It returns the versions deleted.
func (c *Codec) Forget(ctx context.Context, subject string, audit Audit) ([]int, error) {
	versions, err := c.keys.Forget(ctx, subject, audit)
	c.drop(subject)
	return versions, err
}

// Rotate makes a new current key for subject (with an audit record): this process's next writes use it at once,
// other processes' within their CacheTTL. Data written with older versions stays readable until the subject is
// forgotten.
func (c *Codec) Rotate(ctx context.Context, subject string, audit Audit) (int, error) {
	k, err := c.keys.Rotate(ctx, subject, audit)
	c.drop(subject)
	if err != nil {
		return 0, err
	}
	return k.Version, nil
}

func (c *Codec) drop(subject string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	delete(c.cache, subject)
}

// writeObject encodes m, whose values are valid JSON, as a JSON object with its keys sorted (as encoding/json
// encodes a map), without encoding/json's second validation of every value.
func writeObject(m map[string]json.RawMessage) []byte {
	n := 2
	for k, v := range m {
		n += len(k) + len(v) + 4
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b = append(b, ',')
		}
		key, _ := json.Marshal(k) // a string always encodes
		b = append(b, key...)
		b = append(b, ':')
		b = append(b, m[k]...)
	}
	return append(b, '}')
}

// lazyCtx is the context of the key store calls of one Marshal or Unmarshal, made on the first call that needs it
// (a cached key needs none).
type lazyCtx struct {
	timeout time.Duration
	ctx     context.Context
	cancel  context.CancelFunc
}

func (l *lazyCtx) get() context.Context {
	if l.ctx == nil {
		l.ctx, l.cancel = context.WithTimeout(context.Background(), l.timeout)
	}
	return l.ctx
}

func (l *lazyCtx) done() {
	if l.cancel != nil {
		l.cancel()
	}
}
