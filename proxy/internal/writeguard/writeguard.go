// Package writeguard orders what the sidecar stores again of what a read
// fetched against the writes to the same keys.
//
// What a read fetched is stored again by the sidecar in two places: the
// local tier keeps a hit (--local-cache-size), and a hit of another zone
// fills the local zone (--zone-fill). Both store a value after memcached
// gave it, and a write to the key through this sidecar may have run in
// between: stored then, the value the write replaced, or the item it
// deleted, would be back. The write guard orders them:
//
//   - Every write through the sidecar marks its key's stripe before it
//     goes upstream (Writing) and once it is answered (Wrote); flush_all
//     marks every stripe.
//   - A read notes its keys' stripes (Note) before it asks upstream
//     for them; the local zone's misses are noted again before the next
//     zone is asked.
//   - The tier keeps a value only if its stripe did not move since, and
//     a write drops the key's entry at both marks (see the proxy's keep).
//   - A fill is sent only if no write to its stripe was under way when
//     the read noted it and none began since (WroteSince); and when one
//     began after the fill was sent, which may have reached memcached
//     first on another connection, the fill is deleted again once it is
//     answered: a miss, never the old value.
//
// A write through another sidecar, or straight to memcached, is not seen:
// such a write that reaches the local zone between another zone's read and
// its fill's add is undone by the add, until the item expires.
package writeguard

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"mcsidecar/proxy/internal/wire"
)

// stripes is how many write counts there are: a read is refused what it
// fetched when a key of its stripe was written meanwhile. Enough that
// writes to other keys seldom cost a read its fill.
const stripes = 4096

// A stripe's count holds the writes begun in its high 32 bits and the
// writes under way in its low 32: a write adds begin when it begins and
// takes one away when it ends, so the count moves at both, and is quiet
// (no write under way) when its low half is 0.
const begin = 1<<32 | 1

// Never is what a read notes when it is to keep and fill nothing: a write
// to the key was under way, a delayed flush_all is pending, or nothing is
// guarded. No stripe holds it (4 billion writes under way at once), and
// it is not quiet.
const Never = math.MaxUint32

// Guard is the write counts. A nil Guard guards nothing: every read notes
// Never, and writes are not counted.
type Guard struct {
	writes [stripes]atomic.Uint64
	// pausedUntil is, while a delayed flush_all is pending, the time
	// (Unix ns) until which no read keeps or fills anything; 0 once a
	// read found it past. memcached counts its clock in whole seconds,
	// and acts on a delayed flush up to two seconds before the delay
	// runs out by the wall clock.
	pausedUntil atomic.Int64
}

func (g *Guard) stripe(k []byte) *atomic.Uint64 { return &g.writes[xxhash.Sum64(k)%stripes] }

func (g *Guard) stripeString(k string) *atomic.Uint64 {
	return &g.writes[xxhash.Sum64String(k)%stripes]
}

// Note returns the count a read of upstream key k notes before it asks
// upstream: Never when a write to k's stripe is under way or a delayed
// flush_all is pending.
func (g *Guard) Note(k []byte) uint64 {
	if g == nil {
		return Never
	}
	return g.note(g.stripe(k))
}

// NoteString is Note for a key in a string.
func (g *Guard) NoteString(k string) uint64 {
	if g == nil {
		return Never
	}
	return g.note(g.stripeString(k))
}

func (g *Guard) note(stripe *atomic.Uint64) uint64 {
	n := stripe.Load()
	if until := g.pausedUntil.Load(); until != 0 {
		if time.Now().UnixNano() < until {
			return Never
		}
		g.pausedUntil.CompareAndSwap(until, 0)
	}
	if uint32(n) != 0 {
		return Never
	}
	return n
}

// WroteSince reports whether a write to k's stripe began since a read
// noted n, or n was Never: what the read fetched must not be kept.
func (g *Guard) WroteSince(k []byte, n uint64) bool {
	return n == Never || g.stripe(k).Load() != n
}

// WroteSinceString is WroteSince for a key in a string.
func (g *Guard) WroteSinceString(k string, n uint64) bool {
	return n == Never || g.stripeString(k).Load() != n
}

// OwnWrite is the count a read that noted n expects of the stripe while a
// write of its own to the key is under way (mg with T).
func OwnWrite(n uint64) uint64 {
	if n == Never {
		return n
	}
	return n + begin
}

// OwnWriteEnded is OwnWrite once the read's own write has ended too.
func OwnWriteEnded(n uint64) uint64 {
	if n == Never {
		return n
	}
	return n - 1
}

// Writing marks a write to k begun, and Wrote ended.
func (g *Guard) Writing(k []byte) {
	if g != nil {
		g.stripe(k).Add(begin)
	}
}

func (g *Guard) Wrote(k []byte) {
	if g != nil {
		g.stripe(k).Add(math.MaxUint64)
	}
}

// Flushing marks every stripe written, for a flush_all about to go
// upstream. With a delay, it also keeps reads from keeping or filling
// anything until memcached has surely acted on it (it may do so up to two
// seconds before the delay runs out by the wall clock), so that no fill
// of a value read before the flush can reach the local zone after it.
// Flushed ends the marks once memcached has answered.
func (g *Guard) Flushing(delay int32, withDelay bool) {
	if g == nil {
		return
	}
	for i := range g.writes {
		g.writes[i].Add(begin)
	}
	if withDelay && delay > 0 {
		until := time.Now().Add(time.Duration(delay) * time.Second)
		if delay > wire.MaxRelativeTTL {
			until = time.Unix(int64(delay), 0)
		}
		g.pauseUntil(until.Add(time.Second).UnixNano())
	}
}

func (g *Guard) Flushed() {
	if g == nil {
		return
	}
	for i := range g.writes {
		g.writes[i].Add(math.MaxUint64)
	}
}

// pauseUntil makes reads keep and fill nothing until until (Unix ns), or
// a later time another delayed flush_all set.
func (g *Guard) pauseUntil(until int64) {
	for {
		old := g.pausedUntil.Load()
		if old >= until || g.pausedUntil.CompareAndSwap(old, until) {
			return
		}
	}
}
