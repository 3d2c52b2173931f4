package outbox

import (
	"context"
	"maps"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/jsonmeta"
)

// Metadata keys the outbox reads when staging Watermill messages and sets on the messages it delivers, in addition
// to stagehand's standard headers (stagehand.HeaderTenantID, HeaderCorrelationID, HeaderCausationID,
// HeaderMessageType).
const (
	// HeaderPartitionKey carries the partition key: messages sharing it are published in staging-commit order.
	HeaderPartitionKey = "partition-key"
	// HeaderScheduledAt (RFC 3339) asks for delivery not before that instant.
	HeaderScheduledAt = "scheduled-at"
)

// Message is one message to stage.
type Message struct {
	// ID identifies the message; it becomes the Watermill message UUID. Staging an ID that is already in the
	// outbox (pending, sent and not yet cleaned up, or dead-lettered) inserts nothing. Required.
	ID string
	// Topic is the destination topic at the broker. Required.
	Topic string
	// Type is the stable message type name consumers route on (never a Go type name). Optional.
	Type string
	// Payload is the message body.
	Payload []byte
	// Metadata is copied into the Watermill message's metadata.
	Metadata map[string]string
	// Tenant owns the message. Default: stagehand.TenantFrom(ctx) (stagehand.NoTenant when none).
	Tenant string
	// CorrelationID defaults to stagehand.CorrelationIDFrom(ctx).
	CorrelationID string
	// CausationID defaults to stagehand.CausationIDFrom(ctx).
	CausationID string
	// PartitionKey orders the message after every message of the same key staged by transactions that committed
	// before this one. Empty means unordered.
	PartitionKey string
	// SourcePosition is the global event-log position the message was derived from (0 when none). Cleanup keeps a
	// sent message's ID while a registered watermark is at or below this position, so a component re-staging from
	// the log cannot publish it twice.
	SourcePosition int64
	// ScheduledAt delays delivery until then (zero: deliver now). Scheduled messages are not part of their key's
	// order: they are published when due.
	ScheduledAt time.Time
}

// DefaultPartitionKey is the Config.PartitionKey used when none is set: the HeaderPartitionKey metadata value, else
// stagehand.HeaderAggregateID, else "" (unordered).
func DefaultPartitionKey(_ string, msg *message.Message) string {
	if k := msg.Metadata.Get(HeaderPartitionKey); k != "" {
		return k
	}
	return msg.Metadata.Get(stagehand.HeaderAggregateID)
}

// fromWatermill converts a Watermill message published on topic. Defaults not carried by the message's own
// metadata come from the message's context, then from ctx.
func (o *Outbox) fromWatermill(ctx context.Context, topic string, msg *message.Message) (Message, error) {
	if msg == nil {
		return Message{}, invalidMessage("nil message")
	}
	mctx := msg.Context()
	m := Message{
		ID:            msg.UUID,
		Topic:         topic,
		Type:          msg.Metadata.Get(stagehand.HeaderMessageType),
		Payload:       msg.Payload,
		Metadata:      maps.Clone(map[string]string(msg.Metadata)),
		Tenant:        msg.Metadata.Get(stagehand.HeaderTenantID),
		CorrelationID: firstNonEmpty(msg.Metadata.Get(stagehand.HeaderCorrelationID), middleware.MessageCorrelationID(msg)),
		CausationID:   msg.Metadata.Get(stagehand.HeaderCausationID),
		PartitionKey:  o.partitionKey(topic, msg),
	}
	if m.Tenant == "" {
		if t := stagehand.TenantFrom(mctx); t != stagehand.NoTenant {
			m.Tenant = t
		} else {
			m.Tenant = stagehand.TenantFrom(ctx)
		}
	}
	if m.CorrelationID == "" {
		m.CorrelationID = firstNonEmpty(stagehand.CorrelationIDFrom(mctx), stagehand.CorrelationIDFrom(ctx))
	}
	if m.CausationID == "" {
		m.CausationID = firstNonEmpty(stagehand.CausationIDFrom(mctx), stagehand.CausationIDFrom(ctx))
	}
	if s := msg.Metadata.Get(HeaderScheduledAt); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return Message{}, invalidMessage("message %q: metadata %q is not an RFC 3339 time: %v", msg.UUID,
				HeaderScheduledAt, err)
		}
		m.ScheduledAt = t
	}
	return m, nil
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// row is an outbox row as claimed by a relay.
type row struct {
	rid           int64 // the outbox row's own key
	id            string
	topic         string
	msgType       string
	payload       []byte
	metadata      jsonmeta.Map // read tolerantly: a row written by another tool never stalls a claim
	tenant        string
	correlationID string
	causationID   string
	partitionKey  string
	seq           *int64
	attempts      int
	createdAt     time.Time
	scheduledAt   *time.Time
	lastOfRun     bool // acknowledged as the last of its key's run here: its mark promotes the key's next message
}

func (r *row) ordered() bool { return r.seq != nil }

func (r *row) info() Delivery {
	return Delivery{MessageID: r.id, Topic: r.topic, MessageType: r.msgType, Tenant: r.tenant,
		PartitionKey: r.partitionKey, Attempt: r.attempts + 1}
}

// watermillMessage builds the message delivered for the row: UUID = message ID, stored metadata plus the standard
// headers.
func (r *row) watermillMessage() *message.Message {
	msg := message.NewMessage(r.id, r.payload)
	msg.Metadata = make(message.Metadata, len(r.metadata)+5) // room for the headers below, allocated once
	maps.Copy(msg.Metadata, r.metadata)
	if r.msgType != "" {
		msg.Metadata.Set(stagehand.HeaderMessageType, r.msgType)
	}
	msg.Metadata.Set(stagehand.HeaderTenantID, r.tenant)
	if r.correlationID != "" {
		msg.Metadata.Set(stagehand.HeaderCorrelationID, r.correlationID)
	}
	if r.causationID != "" {
		msg.Metadata.Set(stagehand.HeaderCausationID, r.causationID)
	}
	if r.partitionKey != "" {
		msg.Metadata.Set(HeaderPartitionKey, r.partitionKey)
	}
	return msg
}
