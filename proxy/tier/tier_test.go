package tier

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func entry(key string, size int) *Entry {
	return &Entry{Key: key, Value: bytes.Repeat([]byte{'v'}, size), Flags: 7}
}

func TestCache(t *testing.T) {
	t.Run("a stored entry is returned as stored", func(t *testing.T) {
		c := New(1 << 20)
		e := entry("client-a", 100)
		c.Set("up-a", e)
		got, ok := c.Get("up-a", 1)
		if !ok || got != e {
			t.Fatalf("Get = %v, %v; want the stored entry", got, ok)
		}
		if _, ok := c.Get("up-b", 1); ok {
			t.Fatal("a key never stored hits")
		}
	})
	t.Run("set replaces the entry", func(t *testing.T) {
		c := New(1 << 20)
		c.Set("k", entry("k", 10))
		e := entry("k", 20)
		c.Set("k", e)
		if got, _ := c.Get("k", 1); got != e {
			t.Fatalf("Get = %v; want the second entry", got)
		}
		if st := c.Stats(); st.Entries != 1 || st.Bytes != Cost("k", e) {
			t.Fatalf("after a replace: %+v; want 1 entry of %d bytes", st, Cost("k", e))
		}
	})
	t.Run("delete removes the entry", func(t *testing.T) {
		c := New(1 << 20)
		c.Set("k", entry("k", 10))
		c.Delete("k")
		c.Delete("never-stored")
		if _, ok := c.Get("k", 1); ok {
			t.Fatal("a deleted key hits")
		}
	})
	t.Run("clear removes every entry and keeps the counters", func(t *testing.T) {
		c := New(1 << 20)
		for i := range 10 {
			c.Set(fmt.Sprint(i), entry("k", 10))
		}
		c.Get("0", 1)
		c.Clear()
		for i := range 10 {
			if _, ok := c.Get(fmt.Sprint(i), 1); ok {
				t.Fatalf("key %d hits after Clear", i)
			}
		}
		if st := c.Stats(); st.Entries != 0 || st.Bytes != 0 || st.Hits != 1 || st.Misses != 10 {
			t.Fatalf("after Clear: %+v; want empty, 1 hit, 10 misses", st)
		}
	})
	t.Run("an entry over a sixteenth of the budget is not admitted", func(t *testing.T) {
		const maxBytes = 1 << 20
		c := New(maxBytes)
		fits := entry("k", maxBytes/16-EntryOverhead-2)
		c.Set("k", fits)
		if _, ok := c.Get("k", 1); !ok {
			t.Fatalf("an entry of cost %d (the limit) was not admitted", Cost("k", fits))
		}
		c.Set("k", entry("k", maxBytes/16-EntryOverhead-1))
		if _, ok := c.Get("k", 1); ok {
			t.Fatal("an entry one byte over the limit was admitted, or the old one kept")
		}
	})
	t.Run("an expired entry is never returned and is dropped", func(t *testing.T) {
		c := New(1 << 20)
		e := entry("k", 10)
		e.Expires = 1000
		c.Set("k", e)
		if _, ok := c.Get("k", 999); !ok {
			t.Fatal("an entry before its expiry misses")
		}
		if _, ok := c.Get("k", 1000); ok {
			t.Fatal("an entry is returned at its expiry")
		}
		if _, ok := c.Get("k", 999); ok {
			t.Fatal("an expired entry was not dropped")
		}
		forever := entry("k", 10)
		c.Set("k", forever)
		if _, ok := c.Get("k", 1<<62); !ok {
			t.Fatal("an entry without expiry expired")
		}
	})
	t.Run("dropping an expired entry keeps a fresh one stored meanwhile", func(t *testing.T) {
		c := New(1 << 20)
		old := &Entry{Key: "k", Expires: 10}
		fresh := &Entry{Key: "k"}
		c.Set("k", fresh)
		c.dropIfSame("k", old)
		if got, _ := c.Get("k", 20); got != fresh {
			t.Fatal("the fresh entry was dropped")
		}
	})
	t.Run("stats count hits, misses and evictions", func(t *testing.T) {
		c := New(64 << 10)
		c.Set("a", entry("a", 100))
		c.Get("a", 1)
		c.Get("a", 1)
		c.Get("b", 1)
		c.Delete("a")
		if st := c.Stats(); st.Hits != 2 || st.Misses != 1 || st.Evictions != 0 || st.Entries != 0 {
			t.Fatalf("stats %+v; want 2 hits, 1 miss, no eviction (a delete is none), empty", st)
		}
		for i := range 100 {
			c.Set(fmt.Sprint(i), entry("k", 1<<10))
		}
		st := c.Stats()
		if st.Evictions == 0 || st.Evictions+uint64(st.Entries) != 100 {
			t.Fatalf("stats %+v after 100 KiB into 64 KiB; want evictions + entries = 100", st)
		}
	})
}

// TestNoGoroutineOutlivesUse guards the absence of a Close method: the
// proxy's leak tests would catch a goroutine the cache keeps running.
func TestNoGoroutineOutlivesUse(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := New(64 << 10)
	for i := range 200 {
		c.Set(fmt.Sprint(i), entry("k", 1<<10))
		c.Get(fmt.Sprint(i/2), 1)
	}
	c.Stats()
}

// TestByteBudgetHolds writes far more than the budget, concurrently, with
// sizes up to the admission limit.
func TestByteBudgetHolds(t *testing.T) {
	const maxBytes = 4 << 20
	c := New(maxBytes)
	// Values share one buffer: only their lengths matter here.
	backing := make([]byte, maxBytes/16)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				k := fmt.Sprintf("g%d-%d", g, i)
				size := (i * 7919) % (maxBytes/16 - EntryOverhead - 2*len(k))
				c.Set(k, &Entry{Key: k, Value: backing[:size]})
			}
		})
	}
	wg.Wait()
	st := c.Stats()
	if st.Bytes > maxBytes || st.Bytes <= 0 {
		t.Fatalf("holds %d bytes with a budget of %d", st.Bytes, maxBytes)
	}
	var sum int64
	for k, e := range c.c.All() {
		sum += Cost(k, e)
	}
	if sum != st.Bytes || st.Evictions == 0 {
		t.Fatalf("entries cost %d, Stats says %+v; want equal, with evictions", sum, st)
	}
}

// TestConcurrentUse is for the race detector: readers, writers, deleters,
// expiry and Clear on a small set of keys, so that they meet on the same
// entries. Every hit must be an entry stored under that key and unexpired.
func TestConcurrentUse(t *testing.T) {
	c := New(256 << 10)
	const keys = 64
	rounds := 20_000
	if raceEnabled {
		rounds = 4_000
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range rounds {
				k := fmt.Sprint((i * (g + 1)) % keys)
				now := int64(i)
				switch i % 16 {
				case 0:
					c.Delete(k)
				case 1:
					c.Set(k, &Entry{Key: k, Value: make([]byte, 2<<10), Expires: now + 5})
				case 2, 3, 4:
					c.Set(k, &Entry{Key: k, Value: make([]byte, i%(8<<10))})
				default:
					if e, ok := c.Get(k, now); ok && (e.Key != k || e.Expires != 0 && now >= e.Expires) {
						t.Errorf("Get(%q, %d) returned %q expiring at %d", k, now, e.Key, e.Expires)
					}
				}
				if g == 0 && i%5000 == 4999 {
					c.Clear()
				}
			}
		})
	}
	wg.Wait()
	st := c.Stats()
	if st.Bytes > 256<<10 || st.Hits == 0 || st.Misses == 0 {
		t.Fatalf("stats %+v", st)
	}
}

// heapInUse returns the bytes of live heap objects after a full collection.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestMemoryStaysWithinBudget fills a 64 MiB cache with 256 MiB of values
// of postings-like sizes and checks what stays live: the entries held plus
// what Go's allocator rounds a value up to (size classes, up to 1/8 for
// these sizes), which Cost does not charge.
func TestMemoryStaysWithinBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 256 MiB")
	}
	const (
		maxBytes    = 64 << 20
		overheadPct = 15 // the allowed share beyond maxBytes, in percent
		slack       = 4 << 20
	)
	before := heapInUse()
	c := New(maxBytes)
	var written int64
	for i := 0; written < 4*maxBytes; i++ {
		k := fmt.Sprintf("P2:tenant-%d:01HZ8K3R6W4V2N7Q9T5X1Y0B3C:%08d", i%13, i)
		e := &Entry{Key: k, Value: make([]byte, 1<<10+(i*7919)%(31<<10))}
		written += int64(len(e.Value))
		c.Set(k, e)
	}
	st := c.Stats()
	grew := heapInUse() - before
	runtime.KeepAlive(c)
	measured := float64(grew)/float64(st.Bytes) - 1
	t.Logf("%d entries charged %.1f MiB of a %d MiB budget: heap grew %.1f MiB, %.1f%% over the bytes charged, %.1f%% over the budget",
		st.Entries, float64(st.Bytes)/(1<<20), maxBytes>>20, float64(grew)/(1<<20),
		100*measured, 100*(float64(grew)/maxBytes-1))
	if limit := int64(maxBytes + maxBytes*overheadPct/100 + slack); grew > limit {
		t.Errorf("heap grew %d bytes; want at most %d (budget + %d%% + %d MiB)", grew, limit, overheadPct, slack>>20)
	}
}

// TestEntryOverhead measures what an entry costs beyond its keys and its
// value, on entries so small that the bookkeeping dominates, and checks that
// EntryOverhead is not below it. Keys and values are sized to Go's size
// classes (48 and 64 bytes) so that rounding them up adds nothing. The cache
// is filled to 3/4 of its budget, so that otter has sized its frequency
// sketch, and nothing is evicted.
//
// It is a measurement, not a test of concurrency, and takes ~10 s under the
// race detector: skipped there.
func TestEntryOverhead(t *testing.T) {
	if raceEnabled {
		t.Skip("a measurement; slow under the race detector")
	}
	for _, n := range []int{33_000, 50_000, 66_000, 100_000, 131_000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { testEntryOverhead(t, n) })
	}
}

func testEntryOverhead(t *testing.T, n int) {
	keys := make([]string, 2*n)
	for i := range keys {
		keys[i] = fmt.Sprintf("P2:tenant-1:01HZ8K3R6W4V2N7Q9T5X1Y0B3C:%020d", i) // 48 bytes
	}
	values := make([][]byte, n)
	for i := range values {
		values[i] = make([]byte, 64)
	}
	perEntry := int64(48 + 48 + 64 + EntryOverhead)
	before := heapInUse()
	c := New(perEntry * int64(n) * 4 / 3)
	for i := range n {
		c.Set(keys[2*i], &Entry{Key: keys[2*i+1], Value: values[i]})
	}
	st := c.Stats()
	grew := heapInUse() - before
	// The slices must stay live too, or their freeing is counted against the entries.
	runtime.KeepAlive(c)
	runtime.KeepAlive(keys)
	runtime.KeepAlive(values)
	if st.Entries != n || st.Evictions != 0 {
		t.Fatalf("stats %+v; want all %d entries held", st, n)
	}
	// The keys and values were allocated before the baseline.
	measured := grew / int64(n)
	t.Logf("measured per-entry overhead: %d bytes (EntryOverhead = %d)", measured, EntryOverhead)
	if measured > EntryOverhead {
		t.Errorf("an entry costs %d bytes beyond its keys and value; EntryOverhead is %d", measured, EntryOverhead)
	}
}
