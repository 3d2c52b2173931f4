package staging

import (
	"fmt"

	"github.com/stagehand-es/stagehand"
)

// ConfigError is stagehand.ConfigError, the configuration error every stagehand package returns (Package "staging"
// here). It matches ErrInvalidConfig.
type ConfigError = stagehand.ConfigError

// check validates what New needs before resolving the strategy, naming the field at fault.
func (c *Config) check() error {
	switch {
	case c == nil:
		return &ConfigError{Package: "staging", Field: "Mapping",
			Reason: "is required (a nil *Config has none: pass &Config{Mapping: m})"}
	case c.Mapping == nil:
		return &ConfigError{Package: "staging", Field: "Mapping", Reason: "is required"}
	case c.Strategy < Auto || c.Strategy > Deferred:
		return &ConfigError{Package: "staging", Field: "Strategy", Reason: fmt.Sprintf(
			"%d is not a strategy (Auto, Transactional, EventuallyConsistent or Deferred)", int(c.Strategy))}
	}
	return nil
}
