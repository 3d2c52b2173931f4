// Package shred crypto-shreds personal data. The fields of events, of the messages staged from them and of
// snapshots that are marked as personal data are stored encrypted (AES-256-GCM) with a key of their subject (the
// person they describe), and forgetting the subject deletes its keys: every copy stagehand wrote, in the events,
// the outbox, the dead letters and the snapshots, becomes unreadable at once, while the log itself stays
// append-only and every reader goes on.
//
// # Marking personal data
//
// Tag each personal field with the field that holds its subject's ID:
//
//	type CustomerRegistered struct {
//		CustomerID string
//		Name       string  `stagehand:"pii,subject=CustomerID"`
//		Email      string  `stagehand:"pii,subject=CustomerID"`
//		Address    Address `stagehand:"pii,subject=CustomerID"` // any type: the whole value is encrypted
//		Plan       string  // in clear
//	}
//
// The subject field names a Go field of the same struct (a field promoted from an embedded struct counts); its
// value, a string or a number, must not be empty, and it stays in clear (the key is found by it), so make subject
// IDs opaque identifiers rather than personal data themselves. One value may hold several subjects' data (tag
// each field with its own subject). Tagged fields are found inside nested structs, pointers, slices, arrays and
// maps, recursive types included; a field typed as an interface (any) is encoded as it is, so tag it as a whole.
// A tag that cannot be followed fails Marshal (and Codec.Check, to call where types are registered) with
// ErrInvalidTag; a personal value whose subject is empty fails with ErrNoSubject rather than be stored in clear.
//
// # Wiring
//
// Codec implements aggregate.Codec. Give it to the registry and everything that encodes or decodes through the
// registry encrypts and decrypts: repositories' saves and loads, projections and their rebuilds, staging workers,
// and the messages staging derives, whose typed payloads are encoded with the registry's codec (so tag the message
// types too):
//
//	keys, err := shred.NewPostgresKeyStore(pool, &shred.PostgresConfig{Schema: "stagehand"})
//	codec, err := shred.NewCodec(keys, nil)
//	reg := aggregate.NewRegistry(&aggregate.RegistryConfig{Codec: codec})
//
// A consumer decodes a message's payload with a Codec on the same key store (Codec.Unmarshal), or Codec.Open for
// the JSON in clear. A snapshot is the aggregate's own encoding (aggregate.Snapshotter): encode a tagged snapshot
// struct with the codec there too (the aggregate's constructor can hand it the codec).
//
// An encrypted field is stored as a JSON object in place of its value:
//
//	{"$pii":1,"s":"<subject>","k":<key version>,"c":"<base64 of nonce, ciphertext and tag>"}
//
// The 12-byte nonce is random for every field written, and the subject and key version are bound to the
// ciphertext as additional data, so a ciphertext moved to another subject or version does not authenticate.
// Rotate a key well before 2^32 fields are written with one version.
//
// # Forgetting
//
// Codec.Forget, KeyStore.Forget and the CLI's "stagehand forget --subject ID" delete every version of the
// subject's key and write an audit record (who, why, which versions; KeyStore.History reads them). From then on the
// subject's personal fields read as a documented redacted value, never as an error that stalls a reader: the
// string Redacted ("[forgotten]") for fields of a plain string type, the zero value for every other type (and
// null from Codec.Open). Loads, projections, rebuilds, parked-event replays, staging workers and redriven dead
// letters all see it. The console shows stored payloads as they are: an encrypted field appears as its envelope.
//
// A field that cannot be decrypted for any other reason is an error, never a redaction: a ciphertext that does not
// authenticate (ErrTampered), a key version the store never made (ErrUnknownKey), a key store that cannot be
// reached; each a *FieldError naming the field's path, subject and version (never its content).
//
// What forgetting does not reach: messages already delivered to a broker or a consumer (out of stagehand's hands:
// consumers that keep personal data need their own erasure), read models an application built from the events
// (rebuild them, or erase there), fields that were not tagged, data written before the codec was adopted (it stays
// in clear), error texts an application put in dead letters or parked events, the subject IDs themselves, and
// copies of deleted key rows in PostgreSQL's pages until VACUUM, and in WAL, replicas and backups until they are
// recycled.
//
// # Keys, cache and rotation
//
// PostgresKeyStore keeps keys in tables of their own (shred_subjects, shred_keys, shred_audit, created by
// stagehand.Migrate); MemoryKeyStore is for tests; a KeyStore of your own can back keys with a KMS. Keys are per
// subject across the whole schema, not per tenant: when two tenants may use one subject ID for two people, make
// the subject field tenant-qualified. A subject's first write makes its key in a short transaction of its own (on
// the key store's pool, so a SaveTx briefly needs a second connection; a key made for a save that rolls back is
// harmless). The first write after a forget makes a fresh key at the next version, so data written later is
// readable and what was forgotten stays forgotten.
//
// A Codec caches keys (and the news that one was forgotten) for CodecConfig.CacheTTL, 5 seconds by default, for
// at most CacheSize subjects. The process that forgets drops the subject from its cache at once; another process
// reads the subject's data for at most its CacheTTL after the forget, and a write it makes in that window uses the
// forgotten key (the value reads as redacted, never in clear). A negative CacheTTL turns the cache off. Rotate
// (Codec.Rotate or KeyStore.Rotate) makes a new current version: new writes use it (in other processes within
// their CacheTTL), and older versions stay readable until the subject is forgotten. Marshal and Unmarshal take no
// context: each key store call they make is bounded by CodecConfig.Timeout.
//
// Cost: an encrypted field is a JSON object of about 80 bytes plus its base64 ciphertext; the codec re-reads the
// document to replace fields, a few tens of microseconds of CPU per event, small beside a save's round trip
// (benchmarks in this package: go test ./shred -run '^$' -bench . -benchtime 1x).
package shred
