package proxy

import (
	"slices"

	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
)

// zoned reports whether the proxy serves zones.
func (p *Proxy) zoned() bool { return len(p.zones) > 1 || p.zones[0].Name != "" }

// uniqueServers returns the current servers of every zone, each name once:
// DNS may name one server in two zones, and its metrics must be exported
// once.
func (p *Proxy) uniqueServers() []*upstream.Server {
	all := p.allServers()
	if len(p.zones) == 1 {
		return all
	}
	seen := make(map[string]bool, len(all))
	return slices.DeleteFunc(all, func(s *upstream.Server) bool {
		dup := seen[s.Name()]
		seen[s.Name()] = true
		return dup
	})
}

// allServers returns the current servers of every zone.
func (p *Proxy) allServers() []*upstream.Server {
	if len(p.zones) == 1 {
		return p.upstreams().Servers
	}
	var all []*upstream.Server
	for _, z := range p.zones {
		all = append(all, z.Up.Load().Servers...)
	}
	return all
}

// writeFailed reports whether a write did not take in its zone.
func writeFailed(line []byte, err error) bool { return err != nil || stats.IsServerError(line) }
