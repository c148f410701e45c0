package proxy

import (
	"bytes"
	"time"

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
//     writeGuard); flush_all empties it, a get that overlapped it keeps
//     nothing, and a delayed one keeps it empty until memcached has
//     surely acted on it, so that it is empty at the flush's time.
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
// as resolve found). When the tier may keep the value, it also returns the
// count of k's write stripe, for keep (see writeGuard); otherwise
// noteNever.
func (c *conn) fromTier(key []byte, k string, immutable bool) (*tier.Entry, uint64) {
	switch c.tierMode {
	case tierRead, tierFill:
		if immutable {
			return c.p.fromTier(key, k, c.tierMode == tierRead, c.now)
		}
	case tierDrop:
		c.p.tier.Delete(k)
	}
	return nil, noteNever
}

// fromTier returns, when read, the tier's entry of the immutable client
// key key, sent upstream as k, or nil; and the count of k's write stripe,
// for keep.
func (p *Proxy) fromTier(key []byte, k string, read bool, now int64) (*tier.Entry, uint64) {
	gen := p.writeCount(k)
	if read {
		if e, ok := p.tier.Get(k, now); ok && e.Key == string(key) {
			return e, gen
		}
	}
	return nil, gen
}

// keep puts a hit that memcached answered into the tier: the client's
// key, value and flags, and the item's time to live. gen is the count of
// k's write stripe before the value was fetched: if a write was under way
// then or ran since, or a flush_all did, the value may be the one it
// replaced, and is not kept (see writeGuard).
// immutable says the client key's scheme promises that its value never
// changes; without that promise nothing is kept.
func (c *conn) keep(key []byte, k string, gen uint64, immutable bool, value []byte, flags uint32, ttl int32) {
	if c.tierMode == tierRead || c.tierMode == tierFill {
		c.p.keep(key, k, gen, immutable, c.now, value, flags, ttl)
	}
}

// keep is conn.keep for a retrieval that began at now (Unix ns), on
// either path.
func (p *Proxy) keep(key []byte, k string, gen uint64, immutable bool, now int64, value []byte, flags uint32, ttl int32) {
	if !immutable {
		p.stats.tierMutable.Add(1)
		return
	}
	stripe := p.guard.stripe(k)
	if gen == noteNever || stripe.Load() != gen {
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
