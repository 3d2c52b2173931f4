package stagehand

import (
	"errors"
	"strings"
)

// ErrInvalidConfig is matched (errors.Is) by every configuration error of every stagehand package: each package's
// own ErrInvalidConfig is this same value.
var ErrInvalidConfig = errors.New("stagehand: invalid configuration")

// ConfigError is the one configuration error type of every stagehand package (each package's ConfigError is an
// alias of it): Package names the package whose constructor refused the configuration, Field the setting at fault
// and Reason the rule it breaks. It matches ErrInvalidConfig, so errors.As(err, &ce) with a *stagehand.ConfigError
// (or any package's *ConfigError) works for every package alike.
type ConfigError struct {
	// Package is the package that refused the configuration ("eventstore", "outbox", ...); empty means stagehand.
	Package string
	// Component names the configured instance when a package builds several (a staging worker, say); optional.
	Component string
	// Field is the setting at fault, as named in its Config struct.
	Field string
	// Reason is the rule the value breaks.
	Reason string
	// Err is the error of the check that refused the value, when there is one: a *TenantError for a tenant, so
	// errors.Is(err, ErrInvalidTenant) holds for a refused tenant at a constructor as at every other entry point.
	// Optional.
	Err error
}

func (e *ConfigError) Error() string {
	pkg := e.Package
	if pkg == "" {
		pkg = "stagehand"
	}
	msg := pkg + ": invalid configuration: "
	if e.Component != "" {
		msg += e.Component + ": "
	}
	if e.Field == "" || strings.HasPrefix(e.Reason, e.Field) {
		return msg + e.Reason
	}
	return msg + e.Field + " " + e.Reason
}

// Is makes errors.Is(err, ErrInvalidConfig) true.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// Unwrap returns Err.
func (e *ConfigError) Unwrap() error { return e.Err }
