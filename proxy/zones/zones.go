// Package zones holds what the sidecar knows of availability zones: the
// zones configured, each zone's current servers and counters, and the
// names of the results it counts. How a request goes through the zones is
// the proxy's (see proxy/loopzones.go); the rules are these.
//
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
package zones

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"mcsidecar/proxy/upstream"
)

// Writes, --zone-writes: to every zone, or to the local zone only.
const (
	WritesAll   = "all"
	WritesLocal = "local"
)

// Spec is one zone as configured: its name and --upstream entries.
type Spec struct {
	Name    string
	Entries []string
}

// Specs returns the zones to serve, the local one first and the others in
// the order given, from the flags: --upstream (upstreams), --upstream-zone
// (zoneUpstreams) and --zone (local). Without zones it is one unnamed zone
// of upstreams.
func Specs(upstreams, zoneUpstreams []string, local string) ([]Spec, error) {
	if len(zoneUpstreams) == 0 {
		if local != "" {
			return nil, errors.New("--zone needs --upstream-zone: the servers of every zone")
		}
		if len(upstreams) == 0 {
			return nil, errors.New("--upstream names no server: want one or more of " + upstream.EntryForms)
		}
		for _, u := range upstreams {
			if _, err := upstream.ParseEntry(u); err != nil {
				return nil, err
			}
		}
		return []Spec{{Entries: upstreams}}, nil
	}
	if len(upstreams) > 0 {
		return nil, errors.New("give --upstream or --upstream-zone, not both")
	}
	if local == "" {
		return nil, errors.New("--upstream-zone needs --zone: the zone this sidecar serves")
	}
	var zones []Spec
	static := map[string]string{} // server -> its zone
	for _, s := range zoneUpstreams {
		name, list, ok := strings.Cut(s, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.TrimSpace(list) == "" {
			return nil, fmt.Errorf("--upstream-zone %q: want NAME=ENTRY[,ENTRY…]", s)
		}
		if slices.ContainsFunc(zones, func(z Spec) bool { return z.Name == name }) {
			return nil, fmt.Errorf("--upstream-zone: zone %q is given twice", name)
		}
		z := Spec{Name: name}
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
			z.Entries = append(z.Entries, u)
		}
		zones = append(zones, z)
	}
	i := slices.IndexFunc(zones, func(z Spec) bool { return z.Name == strings.TrimSpace(local) })
	if i < 0 {
		names := make([]string, len(zones))
		for j, z := range zones {
			names[j] = z.Name
		}
		return nil, fmt.Errorf("--zone %q is not one of the --upstream-zone names (%s)", local, strings.Join(names, ", "))
	}
	home := zones[i]
	zones = append(zones[:i], zones[i+1:]...)
	return append([]Spec{home}, zones...), nil
}

// Zone is one zone's current server set, swapped whole by discovery, and
// its counters.
type Zone struct {
	Spec
	Up atomic.Pointer[upstream.Set]

	// Keys asked of the zone by result, the value bytes of its hits, and
	// writes that failed in it while another zone answered the client.
	Reads         [NumResults]atomic.Uint64
	ReadBytes     atomic.Uint64
	WriteFailures atomic.Uint64
}

// Results of one key asked of one zone, and their names as metric labels.
const (
	Hit = iota
	Miss
	Error
	NumResults
)

var ResultNames = [NumResults]string{Hit: "hit", Miss: "miss", Error: "error"}

// Results of a fill, and their names as metric labels. FillDropped: a
// write to the key through the sidecar raced the fill, which was not sent
// or was deleted again (see proxy/internal/writeguard).
const (
	FillStored = iota
	FillNotStored
	FillFailed
	FillDropped
	NumFillResults
)

var FillResultNames = [NumFillResults]string{FillStored: "stored", FillNotStored: "not_stored", FillFailed: "failed", FillDropped: "dropped"}

// MayHaveStored reports whether a fill with result may have stored its
// value: it did, or it failed after it may have. One that a write to its
// key raced, which may have reached memcached first on another
// connection, is then deleted again.
func MayHaveStored(result int) bool { return result == FillStored || result == FillFailed }
