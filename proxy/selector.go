package proxy

import "mcsidecar/proxy/upstream"

// ServerSelector places keys on memcached servers exactly as the proxy
// does, for a gomemcache client (memcache.NewFromSelector); see
// upstream.ServerSelector.
type ServerSelector = upstream.ServerSelector

// NewServerSelector returns the selector named by scheme (jump or ketama)
// over servers, each host:port or unix:/path as in --upstream.
func NewServerSelector(scheme string, servers []string) (*ServerSelector, error) {
	return upstream.NewServerSelector(scheme, servers)
}
