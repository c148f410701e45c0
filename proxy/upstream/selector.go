// Package upstream is the proxy's side towards memcached: the server set
// and the selector over it, each server's health and counters, how its
// connections are dialled, the parsing of the replies the proxy reads
// strictly, and a small pool of connections for readiness pings and
// health probes. The event loops of package proxy keep their own
// connections to each server (see DialLoop).
package upstream

import (
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"strconv"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cespare/xxhash/v2"
	jump "github.com/dgryski/go-jump"
	"github.com/facette/natsort"
)

// selector maps a key to the index of the upstream server that owns it.
type selector interface {
	pick(key string) int
}

// Server selection schemes accepted by --upstream-selector.
const (
	SelectJump   = "jump"
	SelectKetama = "ketama"
)

// OrderServers returns the servers in the order a selector indexes them.
// Jump hash depends on the order, so it uses the natural sort order that
// grafana/dskit's MemcachedJumpHashSelector uses; ketama does not care.
func OrderServers(servers []string) []string {
	out := slices.Clone(servers)
	natsort.Sort(out)
	return out
}

// newSelector builds the selector named by scheme over servers, which must
// already be in OrderServers order.
func newSelector(scheme string, servers []string) (selector, error) {
	switch scheme {
	case SelectJump:
		return jumpSelector(len(servers)), nil
	case SelectKetama:
		return newKetama(servers), nil
	}
	return nil, fmt.Errorf("unknown selector %q", scheme)
}

// CheckScheme reports whether scheme names a selector.
func CheckScheme(scheme string) error {
	_, err := newSelector(scheme, nil)
	return err
}

// jumpSelector is jump consistent hashing over xxhash64 of the key, the
// scheme Mimir's and Thanos's memcached clients use, so keys that are not
// rewritten land on the server a store-gateway would pick itself.
type jumpSelector int

func (n jumpSelector) pick(key string) int {
	if n <= 1 {
		return 0
	}
	return int(jump.Hash(xxhash.Sum64String(key), int(n)))
}

// ketama is the libmemcached and twemproxy continuum: 160 points a server,
// four per MD5 digest of "name-i", and a key served by the first point at or
// after the first four bytes (little endian) of its MD5.
type ketama struct {
	points []uint32
	owner  []int
}

const ketamaPointsPerServer = 160

func newKetama(servers []string) *ketama {
	type point struct {
		hash  uint32
		owner int
	}
	ring := make([]point, 0, len(servers)*ketamaPointsPerServer)
	for s, name := range servers {
		for i := 0; i < ketamaPointsPerServer/4; i++ {
			sum := md5.Sum([]byte(name + "-" + strconv.Itoa(i)))
			for h := 0; h < 4; h++ {
				ring = append(ring, point{binary.LittleEndian.Uint32(sum[4*h:]), s})
			}
		}
	}
	slices.SortStableFunc(ring, func(a, b point) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return 0
	})
	k := &ketama{points: make([]uint32, len(ring)), owner: make([]int, len(ring))}
	for i, p := range ring {
		k.points[i], k.owner[i] = p.hash, p.owner
	}
	return k
}

func (k *ketama) pick(key string) int {
	if len(k.points) == 0 {
		return 0
	}
	sum := md5.Sum([]byte(key))
	h := binary.LittleEndian.Uint32(sum[:4])
	i, _ := slices.BinarySearch(k.points, h)
	if i == len(k.points) {
		i = 0
	}
	return k.owner[i]
}

// ServerSelector places keys on memcached servers exactly as the proxy
// does, for a gomemcache client (memcache.NewFromSelector): the same
// selector over the same servers in the same order, as grafana/dskit's
// selectors plug into gomemcache. A client and a sidecar configured with
// the same servers and scheme agree on every key the sidecar forwards
// unchanged.
type ServerSelector struct {
	addrs []net.Addr
	sel   selector
}

var _ memcache.ServerSelector = (*ServerSelector)(nil)

// NewServerSelector returns the selector named by scheme (jump or ketama)
// over servers, each host:port or unix:/path as in --upstream.
func NewServerSelector(scheme string, servers []string) (*ServerSelector, error) {
	names := OrderServers(servers)
	sel, err := newSelector(scheme, names)
	if err != nil {
		return nil, err
	}
	ss := &ServerSelector{sel: sel}
	for _, name := range names {
		network, addr, err := splitUpstream(name)
		if err != nil {
			return nil, err
		}
		var a net.Addr
		if network == "unix" {
			a, err = net.ResolveUnixAddr(network, addr)
		} else {
			a, err = net.ResolveTCPAddr(network, addr)
		}
		if err != nil {
			return nil, err
		}
		ss.addrs = append(ss.addrs, a)
	}
	return ss, nil
}

// PickServer returns the server that owns key.
func (ss *ServerSelector) PickServer(key string) (net.Addr, error) {
	if len(ss.addrs) == 0 {
		return nil, memcache.ErrNoServers
	}
	return ss.addrs[ss.sel.pick(key)], nil
}

// Each calls f for every server, in the selector's order.
func (ss *ServerSelector) Each(f func(net.Addr) error) error {
	for _, a := range ss.addrs {
		if err := f(a); err != nil {
			return err
		}
	}
	return nil
}
