package proxy

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"mcsidecar/proxy/internal/wire"
)

// What a read fetched is stored again by the sidecar in two places: the
// local tier keeps a hit (--local-cache-size), and a hit of another zone
// fills the local zone (--zone-fill). Both store a value after memcached
// gave it, and a write to the key through this sidecar may have run in
// between: stored then, the value the write replaced, or the item it
// deleted, would be back. The write guard orders them:
//
//   - Every write through the sidecar marks its key's stripe before it
//     goes upstream (writing) and once it is answered (wrote); flush_all
//     marks every stripe.
//   - A read notes its keys' stripes (writeCount) before it asks upstream
//     for them; the local zone's misses are noted again before the next
//     zone is asked.
//   - The tier keeps a value only if its stripe did not move since, and
//     a write drops the key's entry at both marks (see Proxy.keep).
//   - A fill is sent only if no write to its stripe was under way when
//     the read noted it and none began since (wroteSince); and when one
//     began after the fill was sent, which may have reached memcached
//     first on another connection, the fill is deleted again once it is
//     answered: a miss, never the old value.
//
// A write through another sidecar, or straight to memcached, is not seen:
// such a write that reaches the local zone between another zone's read and
// its fill's add is undone by the add, until the item expires.

// writeStripes is how many write counts there are: a read is refused
// what it fetched when a key of its stripe was written meanwhile. Enough
// that writes to other keys seldom cost a read its fill.
const writeStripes = 4096

// A stripe's count holds the writes begun in its high 32 bits and the
// writes under way in its low 32: a write adds writeBegin when it begins
// and takes one away when it ends, so the count moves at both, and is
// quiet (no write under way) when its low half is 0.
const writeBegin = 1<<32 | 1

// noteNever is what a read notes when it is to keep and fill nothing: a
// write to the key was under way, or a delayed flush_all is pending. No
// stripe holds it (4 billion writes under way at once), and it is not
// quiet.
const noteNever = math.MaxUint32

// writeGuard is the proxy's write counts.
type writeGuard struct {
	writes [writeStripes]atomic.Uint64
	// pausedUntil is, while a delayed flush_all is pending, the time
	// (Unix ns) until which no read keeps or fills anything; 0 once a
	// read found it past. memcached counts its clock in whole seconds,
	// and acts on a delayed flush up to two seconds before the delay
	// runs out by the wall clock.
	pausedUntil atomic.Int64
}

func (g *writeGuard) stripe(k string) *atomic.Uint64 {
	return &g.writes[xxhash.Sum64String(k)%writeStripes]
}

// stripeOf is stripe for a key in bytes, which the event loop has.
func (g *writeGuard) stripeOf(k []byte) *atomic.Uint64 {
	return &g.writes[xxhash.Sum64(k)%writeStripes]
}

// guards reports whether anything stores what reads fetched, so that
// writes are counted: the tier, or zone fills.
func (p *Proxy) guards() bool {
	return p.tier != nil || p.cfg.ZoneFill && len(p.zones) > 1
}

// writeCount returns the count a read of upstream key k notes before it
// asks upstream: noteNever when a write to k's stripe is under way or a
// delayed flush_all is pending, or when nothing is guarded.
func (p *Proxy) writeCount(k string) uint64 {
	if !p.guarding {
		return noteNever
	}
	return p.note(p.guard.stripe(k))
}

// writeCountOf is writeCount for a key in bytes.
func (p *Proxy) writeCountOf(k []byte) uint64 {
	if !p.guarding {
		return noteNever
	}
	return p.note(p.guard.stripeOf(k))
}

// note returns the count a read notes of stripe (see writeCount).
func (p *Proxy) note(stripe *atomic.Uint64) uint64 {
	n := stripe.Load()
	if until := p.guard.pausedUntil.Load(); until != 0 {
		if time.Now().UnixNano() < until {
			return noteNever
		}
		p.guard.pausedUntil.CompareAndSwap(until, 0)
	}
	if uint32(n) != 0 {
		return noteNever
	}
	return n
}

// wroteSinceOf is wroteSince for a key in bytes.
func (p *Proxy) wroteSinceOf(k []byte, n uint64) bool {
	return n == noteNever || p.guard.stripeOf(k).Load() != n
}

// ownWrite is the count a read that noted n expects of the stripe while a
// write of its own to the key is under way (mg with T).
func ownWrite(n uint64) uint64 {
	if n == noteNever {
		return n
	}
	return n + writeBegin
}

// ownWriteEnded is ownWrite once the read's own write has ended too.
func ownWriteEnded(n uint64) uint64 {
	if n == noteNever {
		return n
	}
	return n - 1
}

// writingOf and wroteOf are writing and wrote for a key in bytes; the
// key is copied only for the tier.
func (p *Proxy) writingOf(k []byte) {
	if p.guarding {
		p.guard.stripeOf(k).Add(writeBegin)
		p.forgetOf(k)
	}
}

func (p *Proxy) wroteOf(k []byte) {
	if p.guarding {
		p.guard.stripeOf(k).Add(math.MaxUint64)
		p.forgetOf(k)
	}
}

func (p *Proxy) forgetOf(k []byte) {
	if p.tier != nil {
		p.tier.Delete(string(k))
	}
}

// flushing marks every stripe written, for a flush_all about to go
// upstream, and empties the tier. With a delay, it also keeps reads from
// keeping or filling anything until memcached has surely acted on it (it
// may do so up to two seconds before the delay runs out by the wall
// clock): the tier stays empty until then, and no fill of a value read
// before the flush can reach the local zone after it. flushed ends the
// marks once memcached has answered, and empties the tier again.
func (p *Proxy) flushing(delay int32, withDelay bool) {
	if !p.guarding {
		return
	}
	for i := range p.guard.writes {
		p.guard.writes[i].Add(writeBegin)
	}
	if withDelay && delay > 0 {
		until := time.Now().Add(time.Duration(delay) * time.Second)
		if delay > wire.MaxRelativeTTL {
			until = time.Unix(int64(delay), 0)
		}
		p.pauseUntil(until.Add(time.Second).UnixNano())
	}
	if p.tier != nil {
		p.tier.Clear()
	}
}

func (p *Proxy) flushed() {
	if !p.guarding {
		return
	}
	for i := range p.guard.writes {
		p.guard.writes[i].Add(math.MaxUint64)
	}
	if p.tier != nil {
		p.tier.Clear()
	}
}

// pauseUntil makes reads keep and fill nothing until until (Unix ns), or
// a later time another delayed flush_all set.
func (p *Proxy) pauseUntil(until int64) {
	for {
		old := p.guard.pausedUntil.Load()
		if old >= until || p.guard.pausedUntil.CompareAndSwap(old, until) {
			return
		}
	}
}
