// Package codec will wrap the values of postings-bearing keys in a verified,
// compressed envelope bound to their client key. Until then every value
// passes through byte for byte. The package is pure: no sockets, no
// metrics, no flag parsing beyond registering its Config.
package codec

import "github.com/spf13/pflag"

// Config holds the value settings.
type Config struct{}

// RegisterFlags adds the value settings to fs. There are none yet: values
// pass through unchanged.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {}

// Validate reports the first setting that cannot work.
func (c *Config) Validate() error { return nil }
