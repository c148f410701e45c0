package proxy

import (
	"bytes"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/tier"
)

// The local tier (--local-cache-size) keeps, in the sidecar's own memory,
// the values of keys whose scheme says they never change, so that hot hits
// cost no network and no decode. It sits in front of the zones: a get is
// answered by the tier, then the local zone, then the other zones.
//
//   - Only get reads it. gets and gats need memcached's CAS, which the tier
//     cannot know, and go upstream, as gat does (it changes the time to
//     live); get and gets both fill it from what memcached answered.
//   - It holds the client's value (decoded, verified) with the client's
//     flags, keyed by the upstream key, with the client key checked on a
//     hit. It is filled only from hits upstream, whose remaining time to
//     live memcached gives (upstream gets are asked as mg … t), and an
//     entry is never served past it (less a second: memcached's clock
//     counts whole seconds).
//   - Every write through the sidecar to a key drops its entry, before
//     and after the write goes upstream (set, add, replace, append,
//     prepend, cas, incr, decr, delete, touch, gat), and a get that
//     overlapped a write to its key does not keep what it fetched (see
//     tierGuard); flush_all empties it, and a delayed one keeps it empty
//     until memcached has acted on it.
//     A write through another sidecar or straight to memcached is not
//     seen: the tier relies on the key scheme's promise that the value
//     never changes, and a deleted key is served until its entry expires
//     or is evicted.
const (
	tierOff  uint8 = iota // no tier, or the command does not use it
	tierRead              // get: answer from it, fill it
	tierFill              // gets: fill it only
	tierDrop              // gat, gats: drop the entries of the keys
)

// tierStripes is how many write counters guard the tier's fills: a fill
// is dropped when a write to a key of its stripe ran while the value was
// fetched. Enough that writes to other keys seldom drop a fill.
const tierStripes = 4096

// tierGuard orders fills after writes: a write bumps its key's stripe
// before and after it goes upstream, and a get notes the stripe's count
// before it asks upstream, so a value fetched around a write is never
// kept. A delayed flush_all pauses fills until memcached has acted on it.
type tierGuard struct {
	writes [tierStripes]atomic.Uint32
	// pausedUntil is when fills may resume after a delayed flush_all
	// (Unix ns); memcached counts its clock in whole seconds, and acts on
	// a delayed flush up to two seconds early.
	pausedUntil atomic.Int64
}

func (g *tierGuard) stripe(k string) *atomic.Uint32 {
	return &g.writes[xxhash.Sum64String(k)%tierStripes]
}

// useTier sets how the retrieval about to run uses the tier.
func (c *conn) useTier(mode uint8) {
	if c.p.tier == nil {
		mode = tierOff
	}
	c.tierMode = mode
	if mode != tierOff {
		c.now = time.Now().UnixNano()
	}
}

// fromTier returns the tier's entry for key, sent upstream as k, when the
// retrieval reads the tier and the key's value never changes (immutable,
// as resolve found). Otherwise it returns the count of k's write stripe,
// for keep.
func (c *conn) fromTier(key []byte, k string, immutable bool) (*tier.Entry, uint32) {
	switch c.tierMode {
	case tierRead, tierFill:
		if !immutable {
			return nil, 0 // never kept
		}
		return c.p.fromTier(key, k, c.tierMode == tierRead, c.now)
	case tierDrop:
		c.p.tier.Delete(k)
	}
	return nil, 0
}

// fromTier returns, when read, the tier's entry of the immutable client
// key key, sent upstream as k, or nil; and the count of k's write stripe,
// for keep.
func (p *Proxy) fromTier(key []byte, k string, read bool, now int64) (*tier.Entry, uint32) {
	gen := p.tierGuard.stripe(k).Load()
	if read {
		if e, ok := p.tier.Get(k, now); ok && e.Key == string(key) {
			return e, gen
		}
	}
	return nil, gen
}

// keep puts a hit that memcached answered into the tier: the client's
// key, value and flags, and the item's time to live. gen is the count of
// k's write stripe before the value was fetched: if a write ran since, the
// value may be the one it replaced, and is not kept.
// immutable says the client key's scheme promises that its value never
// changes; without that promise nothing is kept.
func (c *conn) keep(key []byte, k string, gen uint32, immutable bool, value []byte, flags uint32, ttl int32) {
	if c.tierMode == tierRead || c.tierMode == tierFill {
		c.p.keep(key, k, gen, immutable, c.now, value, flags, ttl)
	}
}

// keep is conn.keep for a retrieval that began at now (Unix ns), on
// either path.
func (p *Proxy) keep(key []byte, k string, gen uint32, immutable bool, now int64, value []byte, flags uint32, ttl int32) {
	if !immutable {
		p.stats.tierMutable.Add(1)
		return
	}
	g := &p.tierGuard
	stripe := g.stripe(k)
	if stripe.Load() != gen || now < g.pausedUntil.Load() {
		return
	}
	var expires int64
	switch {
	case ttl < 0: // never expires
	case ttl <= 1:
		return // gone within memcached's next tick
	default:
		expires = now + int64(ttl-1)*int64(time.Second)
	}
	p.tier.Set(k, &tier.Entry{Key: string(key), Value: bytes.Clone(value), Flags: flags, Expires: expires})
	// A write that began between the check and the Set has already
	// dropped k and will drop it again when it is done; one that ended in
	// between would not: look again.
	if stripe.Load() != gen {
		p.tier.Delete(k)
	}
}

// forget drops k's entry from the tier, for a write to it. A write calls
// it before it goes upstream and after: the stripe's count moves twice, so
// no get that overlapped the write keeps what it fetched.
func (c *conn) forget(k string) { c.p.forget(k) }

func (p *Proxy) forget(k string) {
	if p.tier != nil {
		p.tierGuard.stripe(k).Add(1)
		p.tier.Delete(k)
	}
}

// pauseFills empties the tier for a flush_all, and with a delay keeps it
// from filling until memcached has surely acted on it (it may do so up to
// two seconds before the delay runs out by the wall clock).
func (p *Proxy) pauseFills(delay int32, withDelay bool) {
	p.tier.Clear()
	if !withDelay || delay <= 0 {
		return
	}
	until := time.Now().Add(time.Duration(delay) * time.Second)
	if delay > wire.MaxRelativeTTL {
		until = time.Unix(int64(delay), 0)
	}
	until = until.Add(time.Second)
	for {
		old := p.tierGuard.pausedUntil.Load()
		if old >= until.UnixNano() || p.tierGuard.pausedUntil.CompareAndSwap(old, until.UnixNano()) {
			return
		}
	}
}
