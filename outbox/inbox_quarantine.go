package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/jsonmeta"
	"github.com/stagehand-es/stagehand/internal/names"
)

// Metadata the inbox sets on a quarantined dead letter (see Inbox.Handler): what the message carried that could
// not be stored, made storable and cut, and why it was refused.
const (
	// HeaderQuarantinedReason says why the inbox refused the message before handling it.
	HeaderQuarantinedReason = "stagehand-quarantined-reason"
	// HeaderQuarantinedTenant is the tenant header as received (invalid UTF-8 and NUL bytes replaced, cut).
	HeaderQuarantinedTenant = "stagehand-quarantined-tenant"
	// HeaderQuarantinedID is the message ID as received (invalid UTF-8 and NUL bytes replaced, cut).
	HeaderQuarantinedID = "stagehand-quarantined-id"
)

// quarantinedIDPrefix starts the ID a quarantined message is dead-lettered under when its own cannot be stored.
const quarantinedIDPrefix = "quarantined-"

// quarantine dead-letters, for handler name, a received message whose tenant or ID the inbox can never record
// (refused by checkInbound, cause): it is kept under NoTenant when its tenant is invalid, and under
// "quarantined-" + the SHA-256 of its ID when that ID cannot be stored, so the same message redelivered lands on
// the same dead letter. Its metadata is made storable, with the original tenant and ID and the reason in headers of
// their own; its payload is kept as received. The message is then acknowledged: a refusal repeated on every
// redelivery would hold its subscription forever (and, with per-key order, every later message of its key).
// It returns nil once the dead letter is recorded, else the error, and the message is redelivered.
func (i *Inbox) quarantine(ctx context.Context, name string, msg *message.Message, cause error) error {
	rawTenant := msg.Metadata.Get(stagehand.HeaderTenantID)
	tenant := stagehand.NormalizeTenant(rawTenant)
	if stagehand.ValidateTenant(tenant) != nil {
		tenant = stagehand.NoTenant
	}
	id := msg.UUID
	if names.Stored(id) != "" || len(id) > MaxMessageIDLen || id == "" {
		sum := sha256.Sum256([]byte(msg.UUID))
		id = quarantinedIDPrefix + hex.EncodeToString(sum[:])
	}
	meta := make(message.Metadata, len(msg.Metadata)+3)
	for k, v := range msg.Metadata {
		meta[storable(k, 256)] = storable(v, 4096)
	}
	meta[HeaderQuarantinedReason] = storable(cause.Error(), 1000)
	meta[HeaderQuarantinedTenant] = storable(rawTenant, 1000)
	meta[HeaderQuarantinedID] = storable(msg.UUID, 1000)
	msgType := storable(msg.Metadata.Get(stagehand.HeaderMessageType), 256)
	topic := message.SubscribeTopicFromCtx(ctx)
	payload := []byte(msg.Payload)
	if payload == nil {
		payload = []byte{}
	}
	rec := recordFailure(cause)
	now := i.o.now()
	err := pgx.BeginFunc(ctx, i.o.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(i.o.q.inboxDeadLetter, id, name, tenant, msgType, topic, payload, jsonmeta.Encode(meta), 1,
			truncateError(cause), now, rec.typ, rec.signature)
		b.Queue(i.o.q.inboxMarkDead, id, name, tenant, msgType, now)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		i.logger.Warn("stagehand: inbox could not quarantine a message it cannot handle; it will be redelivered",
			"handler", name, "message_id", names.Cut(storable(msg.UUID, 200), 64), "reason", cause, "error", err)
		return err
	}
	i.logger.Warn("stagehand: inbox quarantined a message it cannot handle among the dead letters",
		"handler", name, "message_id", id, "tenant", tenant, "reason", cause)
	return nil
}

// storable returns s with invalid UTF-8 and NUL bytes replaced by U+FFFD, cut to at most n bytes on a character
// boundary: a value PostgreSQL's text and jsonb accept.
func storable(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
