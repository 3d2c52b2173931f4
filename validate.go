package stagehand

import (
	"errors"
	"fmt"

	"github.com/stagehand-es/stagehand/internal/names"
)

// MaxTenantLen is the longest tenant accepted, in bytes.
const MaxTenantLen = 255

// ErrInvalidTenant is matched (errors.Is) by the error of a tenant that is not accepted.
var ErrInvalidTenant = errors.New("stagehand: invalid tenant")

// TenantError names a tenant that is not accepted and why. It matches ErrInvalidTenant.
type TenantError struct {
	// Tenant is the value, cut to 64 bytes for display.
	Tenant string
	Reason string
}

func (e *TenantError) Error() string {
	return fmt.Sprintf("stagehand: invalid tenant %q: %s", e.Tenant, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidTenant) true.
func (e *TenantError) Is(target error) bool { return target == ErrInvalidTenant }

// ValidateTenant checks a tenant as every entry point does (appends and saves, staged and handled messages, log
// filters and projection topics) and returns a *TenantError when it is not accepted. The accepted alphabet: at most
// MaxTenantLen bytes of valid UTF-8 with no control characters (U+0000 to U+001F, U+007F to U+009F); any other
// character, separators such as ',' and ';' included, is accepted. An empty or whitespace-only tenant is accepted:
// it means NoTenant (see NormalizeTenant).
func ValidateTenant(tenant string) error {
	tenant = NormalizeTenant(tenant)
	if len(tenant) > MaxTenantLen {
		return &TenantError{Tenant: names.Cut(tenant, 64),
			Reason: fmt.Sprintf("%d bytes, longer than %d", len(tenant), MaxTenantLen)}
	}
	if reason := names.Text(tenant); reason != "" {
		return &TenantError{Tenant: names.Cut(tenant, 64), Reason: reason}
	}
	return nil
}
