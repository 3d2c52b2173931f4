package logfollow

// WithDefaults returns the configuration with every default applied, as New applies them, or the error New would
// return. The packages built on the follower use it to check their documented defaults.
func (c *Config) WithDefaults() (Config, error) { return c.withDefaults() }
