package outbox

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/names"
)

// Limits on the names a staged message stores, checked before anything reaches the database so a bad value fails
// with ErrInvalidMessage naming the message and the field, never with a raw SQLSTATE.
const (
	// MaxMessageIDLen is the longest message ID, in bytes.
	MaxMessageIDLen = 512
	// MaxTopicLen is the longest topic, message type or partition key, in bytes.
	MaxTopicLen = 512
)

// checkMessage checks the message's stored names (ID, topic, type, partition key, correlation and causation IDs,
// metadata) and its tenant (stagehand.ValidateTenant): PostgreSQL text holds no NUL byte or invalid UTF-8, and
// the indexed ones are kept within their lengths.
func checkMessage(i int, m *Message, tenant string) error {
	if err := stagehand.ValidateTenant(tenant); err != nil {
		return fmt.Errorf("%w: message %q: %w", ErrInvalidMessage, names.Cut(m.ID, 64), err)
	}
	fields := []struct {
		name, v string
		limit   int
	}{
		{"ID", m.ID, MaxMessageIDLen}, {"Topic", m.Topic, MaxTopicLen}, {"Type", m.Type, MaxTopicLen},
		{"PartitionKey", m.PartitionKey, MaxTopicLen}, {"CorrelationID", m.CorrelationID, MaxMessageIDLen},
		{"CausationID", m.CausationID, MaxMessageIDLen},
	}
	for _, f := range fields {
		if len(f.v) > f.limit {
			return invalidMessage("message %d (%q): %s is %d bytes, longer than %d", i, names.Cut(m.ID, 64),
				f.name, len(f.v), f.limit)
		}
		if reason := names.Stored(f.v); reason != "" {
			return invalidMessage("message %d (%q): %s %s", i, names.Cut(m.ID, 64), f.name, reason)
		}
	}
	for k, v := range m.Metadata {
		if reason := names.Stored(k); reason != "" {
			return invalidMessage("message %q: metadata key %q %s", names.Cut(m.ID, 64), names.Cut(k, 64), reason)
		}
		if reason := names.Stored(v); reason != "" {
			return invalidMessage("message %q: metadata value of %q %s", names.Cut(m.ID, 64), names.Cut(k, 64),
				reason)
		}
	}
	return nil
}

// checkInbound checks what the inbox stores of a received message before it touches the database: its tenant, its
// ID and the handler name. A message that fails can never be recorded, so it is a Permanent error (the router's
// poison handling takes it) naming the message, never a raw SQLSTATE on every redelivery.
func checkInbound(handler, tenant string, msg *message.Message) error {
	if err := stagehand.ValidateTenant(tenant); err != nil {
		return Permanent(fmt.Errorf("%w: received message %q: %w", ErrInvalidMessage, names.Cut(msg.UUID, 64), err))
	}
	if reason := names.Stored(msg.UUID); reason != "" || len(msg.UUID) > MaxMessageIDLen {
		if reason == "" {
			reason = fmt.Sprintf("is %d bytes, longer than %d", len(msg.UUID), MaxMessageIDLen)
		}
		return Permanent(invalidMessage("received message %q: UUID %s", names.Cut(msg.UUID, 64), reason))
	}
	if reason := names.Stored(handler); reason != "" {
		return Permanent(invalidMessage("inbox handler name %q %s", names.Cut(handler, 64), reason))
	}
	return nil
}

// checkTxOptions checks the inbox transaction's options: pgx writes IsoLevel, AccessMode and DeferrableMode into
// BEGIN as they are, so only its named values are accepted (an arbitrary string would reach the server as SQL).
func checkTxOptions(o pgx.TxOptions) error {
	switch o.IsoLevel {
	case "", pgx.Serializable, pgx.RepeatableRead, pgx.ReadCommitted, pgx.ReadUncommitted:
	default:
		return &ConfigError{Package: "outbox", Field: "TxOptions.IsoLevel", Reason: fmt.Sprintf(
			"TxOptions.IsoLevel %q is not an isolation level (use pgx.ReadCommitted, pgx.RepeatableRead or "+
				"pgx.Serializable).", names.Cut(string(o.IsoLevel), 64))}
	}
	switch o.AccessMode {
	case "", pgx.ReadWrite, pgx.ReadOnly:
	default:
		return &ConfigError{Package: "outbox", Field: "TxOptions.AccessMode", Reason: fmt.Sprintf(
			"TxOptions.AccessMode %q is not an access mode.", names.Cut(string(o.AccessMode), 64))}
	}
	switch o.DeferrableMode {
	case "", pgx.Deferrable, pgx.NotDeferrable:
	default:
		return &ConfigError{Package: "outbox", Field: "TxOptions.DeferrableMode", Reason: fmt.Sprintf(
			"TxOptions.DeferrableMode %q is not a deferrable mode.", names.Cut(string(o.DeferrableMode), 64))}
	}
	return nil
}
