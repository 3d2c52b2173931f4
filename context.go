package stagehand

import (
	"context"
	"maps"
	"strings"
)

// NoTenant is the reserved tenant value stored for data written without a tenant in scope.
//
// Tenant columns are never NULL: "no tenant" is a value, so a tenant-scoped read and an unscoped one compare the
// same kind of thing. Compare against NoTenant rather than testing for an empty string.
const NoTenant = "__untenanted__"

// Standard header names, used in event metadata and in the metadata of every Watermill message the outbox
// publishes.
const (
	HeaderAggregateID   = "aggregate-id"
	HeaderAggregateType = "aggregate-type"
	HeaderTenantID      = "tenant-id"
	HeaderCorrelationID = "correlation-id"
	HeaderCausationID   = "causation-id"
	HeaderEventID       = "event-id"
	HeaderEventType     = "event-type"
	HeaderMessageType   = "message-type"
	HeaderOccurredAt    = "occurred-at"
)

type ctxKey int

const (
	tenantKey ctxKey = iota
	correlationKey
	causationKey
	metadataKey
)

// WithTenant returns a context whose writes carry tenant. An empty tenant means NoTenant.
func WithTenant(ctx context.Context, tenant string) context.Context {
	return context.WithValue(ctx, tenantKey, NormalizeTenant(tenant))
}

// TenantFrom returns the tenant carried by ctx, or NoTenant when none is set.
func TenantFrom(ctx context.Context) string {
	if t, ok := ctx.Value(tenantKey).(string); ok {
		return t
	}
	return NoTenant
}

// NormalizeTenant maps the empty string (and whitespace) to NoTenant and returns any other value unchanged.
func NormalizeTenant(tenant string) string {
	if strings.TrimSpace(tenant) == "" {
		return NoTenant
	}
	return tenant
}

// WithCorrelationID returns a context whose writes carry the correlation ID.
func WithCorrelationID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, correlationKey, id)
}

// CorrelationIDFrom returns the correlation ID carried by ctx, or "".
func CorrelationIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(correlationKey).(string)
	return id
}

// WithCausationID returns a context whose writes carry the causation ID (the ID of the message or command that
// caused them).
func WithCausationID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, causationKey, id)
}

// CausationIDFrom returns the causation ID carried by ctx, or "".
func CausationIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(causationKey).(string)
	return id
}

// WithMetadata returns a context whose writes carry the user key/value pair in addition to any already set.
// Later values for the same key win.
func WithMetadata(ctx context.Context, key, value string) context.Context {
	old := MetadataFrom(ctx)
	m := make(map[string]string, len(old)+1)
	maps.Copy(m, old)
	m[key] = value
	return context.WithValue(ctx, metadataKey, m)
}

// MetadataFrom returns a copy of the user key/values carried by ctx (nil when none).
func MetadataFrom(ctx context.Context) map[string]string {
	m, _ := ctx.Value(metadataKey).(map[string]string)
	if m == nil {
		return nil
	}
	return maps.Clone(m)
}
