package proxy

import (
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"

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
	selectJump   = "jump"
	selectKetama = "ketama"
)

// orderServers returns the servers in the order a selector indexes them.
// Jump hash depends on the order, so it uses the natural sort order that
// grafana/dskit's MemcachedJumpHashSelector uses; ketama does not care.
func orderServers(servers []string) []string {
	out := slices.Clone(servers)
	natsort.Sort(out)
	return out
}

// newSelector builds the selector named by scheme over servers, which must
// already be in orderServers order.
func newSelector(scheme string, servers []string) (selector, error) {
	switch scheme {
	case selectJump:
		return jumpSelector(len(servers)), nil
	case selectKetama:
		return newKetama(servers), nil
	}
	return nil, fmt.Errorf("unknown selector %q", scheme)
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
