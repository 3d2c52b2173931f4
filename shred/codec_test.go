package shred_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/shred"
)

type Address struct {
	Street string
	City   string
}

type Registered struct {
	CustomerID string  `json:"customer_id"`
	Name       string  `json:"name" stagehand:"pii,subject=CustomerID"`
	Age        int     `json:"age" stagehand:"pii,subject=CustomerID"`
	Home       Address `json:"home" stagehand:"pii,subject=CustomerID"`
	Nick       *string `json:"nick,omitempty" stagehand:"pii,subject=CustomerID"`
	Tags       []string
	Plan       string `json:"plan"`
}

func newCodec(t *testing.T, keys shred.KeyStore, cfg *shred.CodecConfig) *shred.Codec {
	t.Helper()
	c, err := shred.NewCodec(keys, cfg)
	require.NoError(t, err)
	return c
}

// Personal fields are stored encrypted (no trace of their plaintext), the rest in clear, and read back as written.
func TestRoundTripEncryptsOnlyPersonalFields(t *testing.T) {
	t.Parallel()
	c := newCodec(t, shred.NewMemoryKeyStore(), nil)
	nick := "ally-nick-7f3"
	in := Registered{CustomerID: "c-1", Name: "Alice Liddell-7f3", Age: 41, Home: Address{"1 Rabbit Hole-7f3",
		"Oxford-7f3"}, Nick: &nick, Tags: []string{"gold"}, Plan: "premium"}
	data, err := c.Marshal(in)
	require.NoError(t, err)
	require.NotContains(t, string(data), "7f3", "no plaintext of a personal field is stored")
	require.NotContains(t, string(data), `"age":41`)
	require.Contains(t, string(data), `"customer_id":"c-1"`)
	require.Contains(t, string(data), `"plan":"premium"`)
	require.Contains(t, string(data), `"Tags":["gold"]`)
	require.Equal(t, 4, bytes.Count(data, []byte(`"$pii":1`)))

	var out Registered
	require.NoError(t, c.Unmarshal(data, &out))
	require.Equal(t, in, out)

	// Two encryptions of one value differ (a fresh nonce each time).
	again, err := c.Marshal(in)
	require.NoError(t, err)
	require.NotEqual(t, data, again)

	// A value without personal fields is plain encoding/json.
	plain, err := c.Marshal(Address{"x", "y"})
	require.NoError(t, err)
	require.JSONEq(t, `{"Street":"x","City":"y"}`, string(plain))
}

// Once a subject is forgotten its fields read as the documented redacted values, without an error; another
// subject's data is untouched.
func TestForgottenSubjectReadsRedacted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	keys := shred.NewMemoryKeyStore()
	c := newCodec(t, keys, nil)
	nick := "n"
	alice, err := c.Marshal(Registered{CustomerID: "alice", Name: "Alice", Age: 41, Home: Address{"a", "b"},
		Nick: &nick, Plan: "premium"})
	require.NoError(t, err)
	bob, err := c.Marshal(Registered{CustomerID: "bob", Name: "Bob", Age: 50, Plan: "basic"})
	require.NoError(t, err)

	versions, err := c.Forget(ctx, "alice", shred.Audit{Actor: "test", Reason: "erasure request"})
	require.NoError(t, err)
	require.Equal(t, []int{1}, versions)

	var got Registered
	require.NoError(t, c.Unmarshal(alice, &got))
	require.Equal(t, Registered{CustomerID: "alice", Name: shred.Redacted, Plan: "premium"}, got,
		"strings read as Redacted, everything else as its zero value")
	got = Registered{}
	require.NoError(t, c.Unmarshal(bob, &got))
	require.Equal(t, "Bob", got.Name)
	require.Equal(t, 50, got.Age)

	opened, err := c.Open(alice)
	require.NoError(t, err)
	require.JSONEq(t, `{"customer_id":"alice","name":null,"age":null,"home":null,"nick":null,"Tags":null,`+
		`"plan":"premium"}`, string(opened), "without a Go type, a forgotten field is null")

	hist, err := keys.History(ctx, "alice")
	require.NoError(t, err)
	require.Len(t, hist, 1)
	require.Equal(t, "forget", hist[0].Action)
	require.Equal(t, []int{1}, hist[0].Versions)
	require.Equal(t, "erasure request", hist[0].Reason)
}

// A ciphertext that does not authenticate (changed bytes, moved to another subject, a version the store never
// made) is a typed error, never a redacted value.
func TestTamperedFieldIsATypedError(t *testing.T) {
	t.Parallel()
	c := newCodec(t, shred.NewMemoryKeyStore(), nil)
	alice, err := c.Marshal(Registered{CustomerID: "alice", Name: "Alice"})
	require.NoError(t, err)
	_, err = c.Marshal(Registered{CustomerID: "bob", Name: "Bob"})
	require.NoError(t, err)

	edit := func(fn func(e map[string]any)) []byte {
		var doc map[string]any
		require.NoError(t, json.Unmarshal(alice, &doc))
		fn(doc["name"].(map[string]any))
		out, err := json.Marshal(doc)
		require.NoError(t, err)
		return out
	}
	flip := edit(func(e map[string]any) {
		b := []byte(e["c"].(string))
		if b[5] == 'A' {
			b[5] = 'B'
		} else {
			b[5] = 'A'
		}
		e["c"] = string(b)
	})
	moved := edit(func(e map[string]any) { e["s"] = "bob" })
	future := edit(func(e map[string]any) { e["k"] = 9 })
	malformed := edit(func(e map[string]any) { e["c"] = "not base64!" })

	for name, tc := range map[string]struct {
		data []byte
		want error
	}{
		"changed ciphertext": {flip, shred.ErrTampered},
		"another subject":    {moved, shred.ErrTampered},
		"unknown version":    {future, shred.ErrUnknownKey},
		"malformed":          {malformed, shred.ErrTampered},
	} {
		var out Registered
		err := c.Unmarshal(tc.data, &out)
		require.ErrorIs(t, err, tc.want, name)
		var fe *shred.FieldError
		require.ErrorAs(t, err, &fe, name)
		require.Equal(t, "name", fe.Path, name)
		require.NotContains(t, err.Error(), "Alice", name)
	}
}

// Rotation: new writes use the new version, older versions stay readable until the subject is forgotten; the
// first write after a forget makes a fresh key at the next version.
func TestRotation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	keys := shred.NewMemoryKeyStore()
	c := newCodec(t, keys, nil)
	enc := func(name string) ([]byte, int) {
		data, err := c.Marshal(Registered{CustomerID: "alice", Name: name})
		require.NoError(t, err)
		var doc struct{ Name struct{ K int } }
		require.NoError(t, json.Unmarshal(data, &doc))
		return data, doc.Name.K
	}
	name := func(data []byte) string {
		var r Registered
		require.NoError(t, c.Unmarshal(data, &r))
		return r.Name
	}
	v1, k := enc("one")
	require.Equal(t, 1, k)
	v, err := c.Rotate(ctx, "alice", shred.Audit{Actor: "ops", Reason: "yearly"})
	require.NoError(t, err)
	require.Equal(t, 2, v)
	v2, k := enc("two")
	require.Equal(t, 2, k, "new writes use the rotated key")
	require.Equal(t, "one", name(v1), "the old version stays readable")
	require.Equal(t, "two", name(v2))

	forgotten, err := c.Forget(ctx, "alice", shred.Audit{})
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, forgotten)
	require.Equal(t, shred.Redacted, name(v1))
	require.Equal(t, shred.Redacted, name(v2))
	v3, k := enc("three")
	require.Equal(t, 3, k, "a key made after a forget never reuses a forgotten version")
	require.Equal(t, "three", name(v3))
	require.Equal(t, shred.Redacted, name(v1))

	hist, err := keys.History(ctx, "alice")
	require.NoError(t, err)
	require.Len(t, hist, 2)
	require.Equal(t, "rotate", hist[0].Action)
	require.Equal(t, []int{2}, hist[0].Versions)
	require.Equal(t, "ops", hist[0].Actor)
	require.Equal(t, "forget", hist[1].Action)
}

type Line struct {
	PersonID string
	Email    string `stagehand:"pii,subject=PersonID"`
}

type Envelope struct {
	Lines  []Line
	ByName map[string]Line
	First  *Line
	Meta
}

type Meta struct {
	OwnerID string
	Owner   string `stagehand:"pii,subject=OwnerID"`
}

type Tree struct {
	ID       string
	Label    string `stagehand:"pii,subject=ID"`
	Children []Tree
}

// Personal fields are found inside nested structs, slices, maps, pointers, embedded structs and recursive types,
// each under its own subject.
func TestNestedPersonalFields(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newCodec(t, shred.NewMemoryKeyStore(), nil)
	in := Envelope{
		Lines:  []Line{{"p1", "p1@secret"}, {"p2", "p2@secret"}},
		ByName: map[string]Line{"x": {"p1", "p1-map@secret"}},
		First:  &Line{"p2", "p2-first@secret"},
		Meta:   Meta{OwnerID: "p1", Owner: "owner@secret"},
	}
	data, err := c.Marshal(in)
	require.NoError(t, err)
	require.NotContains(t, string(data), "secret")
	var out Envelope
	require.NoError(t, c.Unmarshal(data, &out))
	require.Equal(t, in, out)

	tree := Tree{ID: "p1", Label: "root@secret", Children: []Tree{{ID: "p2", Label: "leaf@secret",
		Children: []Tree{{ID: "p2", Label: "deep@secret"}}}}}
	tdata, err := c.Marshal(tree)
	require.NoError(t, err)
	require.NotContains(t, string(tdata), "secret")

	_, err = c.Forget(ctx, "p2", shred.Audit{})
	require.NoError(t, err)
	out = Envelope{}
	require.NoError(t, c.Unmarshal(data, &out))
	require.Equal(t, "p1@secret", out.Lines[0].Email)
	require.Equal(t, shred.Redacted, out.Lines[1].Email)
	require.Equal(t, shred.Redacted, out.First.Email)
	require.Equal(t, "owner@secret", out.Owner)
	var tout Tree
	require.NoError(t, c.Unmarshal(tdata, &tout))
	require.Equal(t, "root@secret", tout.Label)
	require.Equal(t, shred.Redacted, tout.Children[0].Label)
	require.Equal(t, shred.Redacted, tout.Children[0].Children[0].Label)
}

type noSubject struct {
	Email string `stagehand:"pii"`
}

type unknownSubject struct {
	Email string `stagehand:"pii,subject=Missing"`
}

type piiSubject struct {
	ID    string `stagehand:"pii,subject=Email"`
	Email string `stagehand:"pii,subject=ID"`
}

type badOption struct {
	ID    string
	Email string `stagehand:"secret,subject=ID"`
}

type inner struct{ Bad noSubject }

// Tags that cannot be followed are refused, by Check and by Marshal, naming the type and field.
func TestInvalidTags(t *testing.T) {
	t.Parallel()
	c := newCodec(t, shred.NewMemoryKeyStore(), nil)
	for _, v := range []any{noSubject{}, unknownSubject{}, piiSubject{}, badOption{}, inner{}, []inner{}} {
		err := c.Check(v)
		require.ErrorIs(t, err, shred.ErrInvalidTag, "%T", v)
		_, err = c.Marshal(v)
		require.ErrorIs(t, err, shred.ErrInvalidTag, "%T", v)
	}
	require.ErrorContains(t, c.Check(unknownSubject{}), `subject "Missing" is not an encoded field`)
	require.NoError(t, c.Check(Registered{}))
	require.NoError(t, c.Check(Tree{}))
}

// A personal value without a subject cannot be encrypted: Marshal refuses it rather than store it in clear.
func TestPersonalDataNeedsASubject(t *testing.T) {
	t.Parallel()
	c := newCodec(t, shred.NewMemoryKeyStore(), nil)
	_, err := c.Marshal(Registered{Name: "Alice"})
	require.ErrorIs(t, err, shred.ErrNoSubject)
	require.NotContains(t, err.Error(), "Alice")
	_, err = c.Marshal(Line{})
	require.ErrorIs(t, err, shred.ErrNoSubject, "an empty string is personal data too")
	// A null (or omitted) personal field has nothing to protect.
	data, err := c.Marshal(optional{})
	require.NoError(t, err)
	require.JSONEq(t, `{"ID":"","Nick":null}`, string(data))
}

type optional struct {
	ID   string
	Nick *string `stagehand:"pii,subject=ID"`
}

// failingKeys fails every read: a key store outage is an error, never a redaction.
type failingKeys struct{ shred.KeyStore }

var errOutage = errors.New("key store unreachable")

func (failingKeys) Key(context.Context, string, int) (shred.Key, error) {
	return shred.Key{}, errOutage
}

func TestKeyStoreFailureIsNotRedaction(t *testing.T) {
	t.Parallel()
	keys := shred.NewMemoryKeyStore()
	data, err := newCodec(t, keys, nil).Marshal(Registered{CustomerID: "alice", Name: "Alice"})
	require.NoError(t, err)
	var out Registered
	err = newCodec(t, failingKeys{keys}, nil).Unmarshal(data, &out)
	require.ErrorIs(t, err, errOutage)
	var fe *shred.FieldError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "alice", fe.Subject)
}

// The cache bound: a codec that forgets sees it at once; another codec (another process) with the cache off sees
// it at once too, and one with a warm cache only once its CacheTTL has passed.
func TestForgetAcrossCodecs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	keys := shred.NewMemoryKeyStore()
	a := newCodec(t, keys, nil)
	uncached := newCodec(t, keys, &shred.CodecConfig{CacheTTL: -1})
	warm := newCodec(t, keys, &shred.CodecConfig{CacheTTL: 1 << 62})
	data, err := a.Marshal(Registered{CustomerID: "alice", Name: "Alice"})
	require.NoError(t, err)
	name := func(c *shred.Codec) string {
		var r Registered
		require.NoError(t, c.Unmarshal(data, &r))
		return r.Name
	}
	require.Equal(t, "Alice", name(a))
	require.Equal(t, "Alice", name(warm))
	_, err = a.Forget(ctx, "alice", shred.Audit{})
	require.NoError(t, err)
	require.Equal(t, shred.Redacted, name(a))
	require.Equal(t, shred.Redacted, name(uncached))
	require.Equal(t, "Alice", name(warm), "a warm cache reads on until its CacheTTL (documented bound)")
}

func TestConfig(t *testing.T) {
	t.Parallel()
	_, err := shred.NewCodec(nil, nil)
	require.ErrorContains(t, err, "shred: invalid configuration: keys must not be nil")
	_, err = shred.NewCodec(shred.NewMemoryKeyStore(), &shred.CodecConfig{CacheSize: -1})
	require.ErrorContains(t, err, "CacheSize")
	_, err = shred.NewPostgresKeyStore(nil, nil)
	require.ErrorContains(t, err, "db must not be nil")
	require.ErrorIs(t, shred.CheckSubject(""), shred.ErrInvalidSubject)
	require.ErrorIs(t, shred.CheckSubject(strings.Repeat("x", 513)), shred.ErrInvalidSubject)
	require.ErrorIs(t, shred.CheckSubject("a\x00b"), shred.ErrInvalidSubject)
}

// sameKeys hands every subject the same material: only the binding of a ciphertext to its subject and version
// (the additional data of AES-GCM) tells them apart.
type sameKeys struct{ shred.KeyStore }

var oneMaterial = bytes.Repeat([]byte{7}, shred.KeySize)

func (sameKeys) CurrentKey(_ context.Context, s string) (shred.Key, error) {
	return shred.Key{Subject: s, Version: 1, Material: oneMaterial}, nil
}

func (sameKeys) Key(_ context.Context, s string, v int) (shred.Key, error) {
	return shred.Key{Subject: s, Version: v, Material: oneMaterial}, nil
}

// A ciphertext moved to another subject or version fails even where the keys are the same.
func TestCiphertextIsBoundToItsSubjectAndVersion(t *testing.T) {
	t.Parallel()
	c := newCodec(t, sameKeys{}, nil)
	data, err := c.Marshal(Registered{CustomerID: "alice", Name: "Alice"})
	require.NoError(t, err)
	var out Registered
	require.NoError(t, c.Unmarshal(data, &out))
	for _, swap := range [][2]string{{`"s":"alice"`, `"s":"bob"`}, {`"k":1`, `"k":2`}} {
		moved := bytes.Replace(data, []byte(swap[0]), []byte(swap[1]), 1)
		require.NotEqual(t, data, moved)
		require.ErrorIs(t, c.Unmarshal(moved, &out), shred.ErrTampered, swap[1])
	}
}

// slowKeys holds CurrentKey until released, so a Forget can run while a write has its key in hand.
type slowKeys struct {
	shred.KeyStore
	reading chan struct{}
	release chan struct{}
}

func (s *slowKeys) CurrentKey(ctx context.Context, subject string) (shred.Key, error) {
	k, err := s.KeyStore.CurrentKey(ctx, subject)
	if s.reading != nil {
		close(s.reading)
		<-s.release
		s.reading = nil
	}
	return k, err
}

// A key read before this codec's Forget is not cached after it: the next write makes a fresh key instead of
// writing with the forgotten one.
func TestAKeyReadBeforeAForgetIsNotCached(t *testing.T) {
	t.Parallel()
	ks := &slowKeys{KeyStore: shred.NewMemoryKeyStore(), reading: make(chan struct{}), release: make(chan struct{})}
	c := newCodec(t, ks, &shred.CodecConfig{CacheTTL: 1 << 62})
	reading := ks.reading
	done := make(chan error, 1)
	go func() {
		_, err := c.Marshal(Registered{CustomerID: "alice", Name: "in flight"})
		done <- err
	}()
	<-reading
	_, err := c.Forget(context.Background(), "alice", shred.Audit{})
	require.NoError(t, err)
	close(ks.release)
	require.NoError(t, <-done)
	data, err := c.Marshal(Registered{CustomerID: "alice", Name: "after"})
	require.NoError(t, err)
	require.Contains(t, string(data), `"k":2`, "written with a fresh key")
	var out Registered
	require.NoError(t, c.Unmarshal(data, &out))
	require.Equal(t, "after", out.Name)
}
