package proxy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
)

// Zones keep a sidecar's reads inside its availability zone. Each zone is
// a server set of its own, with its own discovery, selector and health; a
// key's server within a zone is chosen as without zones. The local zone
// comes first and the others follow in the order given, which is the
// order a read falls through them:
//
//   - A read asks the local zone; its misses, and keys whose local server
//     failed or is ejected, are asked of the next zone, in one request per
//     server, and so on. The first hit answers, with the flags and CAS of
//     the zone that had it. A hit from another zone is stored into the
//     local zone (--zone-fill) with an add and its remaining time to live,
//     so a newer local value is never overwritten.
//   - With --zone-writes=all a write reaches every zone and the local
//     zone's reply answers the client; when the local zone fails, the
//     first zone that answered does, so the sidecar keeps taking writes.
//     A zone may lack a copy another holds (dropped, not yet filled), so
//     no write is decided by a missing copy. set, delete, touch and
//     flush_all go to every zone at once. add goes to every zone too,
//     and stores only if no zone held the key. replace, cas, append,
//     prepend, incr and decr go zone after zone until one takes them;
//     then the others get a set of the value stored (replace, cas) or
//     drop their copy (the others, which change the value in place), to
//     be filled from the deciding zone. A copy can thus be missing in a
//     zone, never older than the deciding zone's, except across a write
//     that failed in a zone (counted in
//     mcsidecar_zone_write_failures_total).
const (
	zoneWritesAll   = "all"
	zoneWritesLocal = "local"
)

// zoneSpec is one zone as configured: its name and --upstream entries.
type zoneSpec struct {
	name    string
	entries []string
}

// zoneSpecs returns the zones to serve, the local one first and the others
// in the order given. Without zones it is one unnamed zone of Upstreams.
func (c *Config) zoneSpecs() ([]zoneSpec, error) {
	if len(c.ZoneUpstreams) == 0 {
		if c.Zone != "" {
			return nil, errors.New("--zone needs --upstream-zone: the servers of every zone")
		}
		if len(c.Upstreams) == 0 {
			return nil, errors.New("--upstream names no server: want one or more of " + upstream.EntryForms)
		}
		for _, u := range c.Upstreams {
			if _, err := upstream.ParseEntry(u); err != nil {
				return nil, err
			}
		}
		return []zoneSpec{{entries: c.Upstreams}}, nil
	}
	if len(c.Upstreams) > 0 {
		return nil, errors.New("give --upstream or --upstream-zone, not both")
	}
	if c.Zone == "" {
		return nil, errors.New("--upstream-zone needs --zone: the zone this sidecar serves")
	}
	var zones []zoneSpec
	static := map[string]string{} // server -> its zone
	for _, s := range c.ZoneUpstreams {
		name, list, ok := strings.Cut(s, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.TrimSpace(list) == "" {
			return nil, fmt.Errorf("--upstream-zone %q: want NAME=ENTRY[,ENTRY…]", s)
		}
		if slices.ContainsFunc(zones, func(z zoneSpec) bool { return z.name == name }) {
			return nil, fmt.Errorf("--upstream-zone: zone %q is given twice", name)
		}
		z := zoneSpec{name: name}
		for _, u := range strings.Split(list, ",") {
			u = strings.TrimSpace(u)
			if u == "" {
				return nil, fmt.Errorf("--upstream-zone %q: bad entry \"\": want %s", s, upstream.EntryForms)
			}
			e, err := upstream.ParseEntry(u)
			if bad := (*upstream.EntryError)(nil); errors.As(err, &bad) {
				return nil, fmt.Errorf("--upstream-zone %q: bad entry %q: %s", s, u, bad.Reason)
			} else if err != nil {
				return nil, err
			}
			if e.Static() {
				if other, dup := static[u]; dup && other != name {
					return nil, fmt.Errorf("--upstream-zone: server %s is in zones %q and %q", u, other, name)
				}
				static[u] = name
			}
			z.entries = append(z.entries, u)
		}
		zones = append(zones, z)
	}
	i := slices.IndexFunc(zones, func(z zoneSpec) bool { return z.name == strings.TrimSpace(c.Zone) })
	if i < 0 {
		names := make([]string, len(zones))
		for j, z := range zones {
			names[j] = z.name
		}
		return nil, fmt.Errorf("--zone %q is not one of the --upstream-zone names (%s)", c.Zone, strings.Join(names, ", "))
	}
	local := zones[i]
	zones = append(zones[:i], zones[i+1:]...)
	return append([]zoneSpec{local}, zones...), nil
}

// zone is one zone's current server set, swapped whole by discovery, and
// its counters.
type zone struct {
	zoneSpec
	up atomic.Pointer[upstream.Set]

	// Keys asked of the zone by result, the value bytes of its hits, and
	// writes that failed in it while another zone answered the client.
	reads         [numZoneResults]atomic.Uint64
	readBytes     atomic.Uint64
	writeFailures atomic.Uint64
}

// Results of one key asked of one zone.
const (
	zoneHit = iota
	zoneMiss
	zoneError
	numZoneResults
)

var zoneResultNames = [numZoneResults]string{zoneHit: "hit", zoneMiss: "miss", zoneError: "error"}

// Results of a fill. dropped: a write to the key through the sidecar
// raced it, and it was not sent or was deleted again (see writeguard).
const (
	fillStored = iota
	fillNotStored
	fillFailed
	fillDropped
	numFillResults
)

var fillResultNames = [numFillResults]string{fillStored: "stored", fillNotStored: "not_stored", fillFailed: "failed", fillDropped: "dropped"}

// zoned reports whether the proxy serves zones.
func (p *Proxy) zoned() bool { return len(p.zones) > 1 || p.zones[0].name != "" }

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
		all = append(all, z.up.Load().Servers...)
	}
	return all
}

// writeFailed reports whether a write did not take in its zone.
func writeFailed(line []byte, err error) bool { return err != nil || stats.IsServerError(line) }
