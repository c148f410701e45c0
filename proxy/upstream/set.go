package upstream

import (
	"unsafe"

	"github.com/cespare/xxhash/v2"
	jump "github.com/dgryski/go-jump"
)

// Set is one set of servers and the selector over them. It never changes:
// discovery builds a new one and swaps it in whole, so a request takes the
// current set with one atomic load and uses it throughout, without a lock.
// Its slices are not to be modified.
type Set struct {
	Names   []string  // in selector order
	Servers []*Server // Servers[i] is Names[i]
	sel     selector
}

// NewSet builds the set of servers named, under the selector named by
// scheme, keeping the servers of old that are still named, with their
// pools and health; old may be nil. It returns the servers of old that are
// not, for the caller to close once no request uses them.
func NewSet(scheme string, names []string, old *Set, o *Options) (*Set, []*Server, error) {
	names = OrderServers(names)
	sel, err := newSelector(scheme, names)
	if err != nil {
		return nil, nil, err
	}
	kept := map[string]*Server{}
	if old != nil {
		for _, s := range old.Servers {
			kept[s.name] = s
		}
	}
	u := &Set{Names: names, sel: sel}
	var created []*Server
	for _, name := range names {
		s, ok := kept[name]
		if ok {
			delete(kept, name)
		} else if s, err = NewServer(name, o); err != nil {
			for _, s := range created {
				s.Close()
			}
			return nil, nil, err
		} else {
			created = append(created, s)
		}
		u.Servers = append(u.Servers, s)
	}
	var removed []*Server
	for _, s := range kept {
		removed = append(removed, s)
	}
	return u, removed, nil
}

// Pick returns the index of the server that owns key. With rehash, a key
// whose server is ejected goes to one that is not.
func (u *Set) Pick(key string, rehash bool) int {
	i := u.sel.pick(key)
	if rehash && u.Servers[i].health.down.Load() {
		return u.rehash(key, i)
	}
	return i
}

// PickBytes is Pick of a key in a buffer, which it does not copy: the
// selectors only hash the key, and keep nothing of it.
func (u *Set) PickBytes(key []byte, rehash bool) int {
	return u.Pick(unsafe.String(unsafe.SliceData(key), len(key)), rehash)
}

// rehash picks a server that is up for a key whose own server is ejected.
// Candidates are drawn by jump hash of the key under successive seeds, so
// the keys of an ejected server spread over all the others instead of
// piling onto one, and a key keeps its stand-in while the ejected servers
// stay the same. Keys of servers that are up never move.
func (u *Set) rehash(key string, own int) int {
	n := len(u.Servers)
	h := xxhash.Sum64String(key)
	for seed := range uint64(4 * n) {
		j := int(jump.Hash(h+(seed+1)*0x9e3779b97f4a7c15, n))
		if !u.Servers[j].health.down.Load() {
			return j
		}
	}
	// Most servers are out: take the first one up, if any is.
	for j, s := range u.Servers {
		if !s.health.down.Load() {
			return j
		}
	}
	return own
}
