// Package tier is a bounded in-memory cache the sidecar answers hits from
// without a network round trip. It is meant for items that never change once
// written (index-cache entries of immutable blocks), holds decoded values
// and is bounded by the bytes it holds, not by a count of entries.
//
// It is a thin layer over otter's W-TinyLFU cache, which kept the best hit
// ratio on a skewed trace of postings-sized values (see
// TestLibrariesOnZipfTrace).
package tier

import (
	"math"
	"sync/atomic"

	"github.com/maypok86/otter/v2"
)

// EntryOverhead is what an entry costs beyond its two keys and its value:
// the Entry struct, otter's node, its hash-table slot and its share of the
// frequency sketch. TestEntryOverhead measures 161 to 177 bytes (it varies
// with how full otter's hash table and sketch are); this is that, rounded up.
const EntryOverhead = 192

// maxShare is the denominator of the largest share of the budget one entry
// may take. Admitting an entry larger than 1/16 of the budget would evict
// many small hot entries for one cold item, and an entry near the whole
// budget would flush the cache.
const maxShare = 16

// Entry is one cached item. Value is never modified after Set: a reply may
// refer to it after the entry is evicted.
type Entry struct {
	Key     string // the client key the value belongs to
	Value   []byte
	Flags   uint32
	Expires int64 // Unix nanoseconds from which it must not be served; 0: never expires
}

// Stats is a snapshot of a Cache's counters. Hits, Misses and Evictions only
// grow, across Clear too, so they can be exported as counters.
type Stats struct {
	Hits      uint64
	Misses    uint64
	Evictions uint64 // entries removed to stay within the byte budget
	Bytes     int64  // sum of Cost of the entries held
	Entries   int
}

// Cache is a byte-bounded cache of entries keyed by upstream key. It is safe
// for concurrent use.
type Cache struct {
	c        *otter.Cache[string, *Entry]
	maxEntry int64

	hits      atomic.Uint64
	misses    atomic.Uint64
	evictions atomic.Uint64
}

// New returns a cache that holds at most maxBytes, counted with Cost. It
// panics if maxBytes is not positive. The cache needs no Close: without
// expiry in otter there is no periodic clean-up goroutine, and the
// maintenance after writes runs on the writer's goroutine.
func New(maxBytes int64) *Cache {
	if maxBytes <= 0 {
		panic("tier: maxBytes must be positive")
	}
	c := &Cache{maxEntry: min(maxBytes/maxShare, math.MaxUint32)}
	c.c = otter.Must(&otter.Options[string, *Entry]{
		MaximumWeight: uint64(maxBytes),
		// Set admits only entries whose cost fits in maxEntry ≤ MaxUint32.
		Weigher: func(k string, e *Entry) uint32 { return uint32(Cost(k, e)) },
		// Atomic, so that counting an eviction costs an add rather than a
		// task on the executor.
		OnAtomicDeletion: func(ev otter.DeletionEvent[string, *Entry]) {
			if ev.Cause == otter.CauseOverflow {
				c.evictions.Add(1)
			}
		},
		// Maintenance after writes runs on the writer's goroutine: a
		// goroutine started for it wakes an idle thread, a futex call and
		// two context switches per write, which cost an event loop more
		// than the maintenance itself. No function the cache calls back
		// calls the cache, so running it there cannot deadlock.
		Executor: func(fn func()) { fn() },
	})
	return c
}

// Cost is the number of bytes an entry stored under k is charged against the
// budget. Both keys are counted even when they share memory, which keeps the
// charge independent of how the caller built them.
func Cost(k string, e *Entry) int64 {
	return int64(len(k)+len(e.Key)+len(e.Value)) + EntryOverhead
}

// Get returns the entry stored under k if it has not expired at now (Unix
// nanoseconds). An expired entry counts as a miss and is dropped. A hit does
// not allocate.
func (c *Cache) Get(k string, now int64) (*Entry, bool) {
	e, ok := c.c.GetIfPresent(k)
	if !ok {
		c.misses.Add(1)
		return nil, false
	}
	if e.Expires != 0 && now >= e.Expires {
		c.misses.Add(1)
		c.dropIfSame(k, e)
		return nil, false
	}
	c.hits.Add(1)
	return e, true
}

// dropIfSame deletes k only if it still holds e, so that a Get that found an
// expired entry does not delete a fresh one another goroutine just stored.
func (c *Cache) dropIfSame(k string, e *Entry) {
	c.c.ComputeIfPresent(k, func(old *Entry) (*Entry, otter.ComputeOp) {
		if old == e {
			return nil, otter.InvalidateOp
		}
		return old, otter.CancelOp
	})
}

// Set stores e under k, replacing what k held. An entry whose Cost exceeds
// 1/16 of the budget is not admitted, and k then holds nothing. The cache
// keeps e and e.Value as they are: the caller must not modify them later.
func (c *Cache) Set(k string, e *Entry) {
	if Cost(k, e) > c.maxEntry {
		c.c.Invalidate(k)
		return
	}
	c.c.Set(k, e)
}

// Delete removes the entry stored under k, if any.
func (c *Cache) Delete(k string) {
	c.c.Invalidate(k)
}

// Clear removes every entry. The counters of Stats keep their values.
func (c *Cache) Clear() {
	c.c.InvalidateAll()
}

// Stats returns the counters and the size of the cache. It first runs the
// maintenance otter otherwise does in the background after writes, so that
// Bytes reflects every eviction due so far and stays within the budget.
func (c *Cache) Stats() Stats {
	c.c.CleanUp()
	return Stats{
		Hits:      c.hits.Load(),
		Misses:    c.misses.Load(),
		Evictions: c.evictions.Load(),
		Bytes:     int64(c.c.WeightedSize()),
		Entries:   c.c.EstimatedSize(),
	}
}
