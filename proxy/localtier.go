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
//     writeguard); flush_all empties it, a get that overlapped it keeps
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

// fromTier returns, when read, the tier's entry of the immutable client
// key key, sent upstream as k, or nil; and the count of k's write stripe,
// for keep.
func (p *Proxy) fromTier(key []byte, k string, read bool, now int64) (*tier.Entry, uint64) {
	gen := p.guard.NoteString(k)
	if read {
		if e, ok := p.tier.Get(k, now); ok && e.Key == string(key) {
			return e, gen
		}
	}
	return nil, gen
}

// keep is conn.keep for a retrieval that began at now (Unix ns), on
// either path.
func (p *Proxy) keep(key []byte, k string, gen uint64, immutable bool, now int64, value []byte, flags uint32, ttl int32) {
	if !immutable {
		p.stats.TierMutable.Add(1)
		return
	}
	if p.guard.WroteSinceString(k, gen) {
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
	if p.guard.WroteSinceString(k, gen) {
		p.tier.Delete(k)
	}
}

// The sidecar's side of the write guard (proxy/internal/writeguard), which
// the tier and zone fills share: which features store what reads fetched,
// and the tier's entry of a key dropped at both marks of a write to it.

// guards reports whether anything stores what reads fetched, so that
// writes are counted: the tier, or zone fills.
func (p *Proxy) guards() bool {
	return p.tier != nil || p.cfg.ZoneFill && len(p.zones) > 1
}

// writingOf and wroteOf mark a write to upstream key k begun and ended,
// and drop the tier's entry of k at both.
func (p *Proxy) writingOf(k []byte) {
	p.guard.Writing(k)
	p.forgetOf(k)
}

func (p *Proxy) wroteOf(k []byte) {
	p.guard.Wrote(k)
	p.forgetOf(k)
}

func (p *Proxy) forgetOf(k []byte) {
	if p.tier != nil {
		p.tier.Delete(string(k))
	}
}

// flushing marks every stripe written, for a flush_all about to go
// upstream, and empties the tier (see writeguard.Guard.Flushing, which
// with a delay keeps it empty until memcached has surely acted on it).
// flushed ends the marks once memcached has answered, and empties the
// tier again.
func (p *Proxy) flushing(delay int32, withDelay bool) {
	p.guard.Flushing(delay, withDelay)
	if p.tier != nil {
		p.tier.Clear()
	}
}

func (p *Proxy) flushed() {
	p.guard.Flushed()
	if p.tier != nil {
		p.tier.Clear()
	}
}
