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
//     prepend, cas, incr, decr, delete, touch, gat); flush_all empties it.
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
// retrieval reads the tier and the key's value never changes.
func (c *conn) fromTier(key []byte, k string) *tier.Entry {
	switch c.tierMode {
	case tierRead:
		if !c.p.keys.Immutable(key) {
			return nil
		}
		if e, ok := c.p.tier.Get(k, c.now); ok && e.Key == string(key) {
			return e
		}
	case tierDrop:
		c.p.tier.Delete(k)
	}
	return nil
}

// keep puts a hit that memcached answered into the tier: the client's
// key, value and flags, and the item's time to live.
func (c *conn) keep(key []byte, k string, value []byte, flags uint32, ttl int32) {
	if c.tierMode != tierRead && c.tierMode != tierFill {
		return
	}
	if !c.p.keys.Immutable(key) {
		c.p.stats.tierMutable.Add(1)
		return
	}
	var expires int64
	switch {
	case ttl < 0: // never expires
	case ttl <= 1:
		return // gone within memcached's next tick
	default:
		expires = c.now + int64(ttl-1)*int64(time.Second)
	}
	c.p.tier.Set(k, &tier.Entry{Key: string(key), Value: bytes.Clone(value), Flags: flags, Expires: expires})
}

// forget drops k's entry from the tier, for a write to it.
func (c *conn) forget(k string) {
	if c.p.tier != nil {
		c.p.tier.Delete(k)
	}
}
