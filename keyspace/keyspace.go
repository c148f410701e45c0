// Package keyspace decides what key the sidecar stores a client's key under
// upstream. Keys memcached and gomemcache can carry as they are pass
// unchanged; rewriting over-long keys by hashing their tenant-bearing
// segments is planned and will live here. The package is pure: no sockets,
// no metrics, no flag parsing beyond registering its Config.
package keyspace

import "github.com/spf13/pflag"

// Config holds the key settings.
type Config struct{}

// RegisterFlags adds the key settings to fs. There are none yet: keys pass
// through unchanged.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {}

// Validate reports the first setting that cannot work.
func (c *Config) Validate() error { return nil }
