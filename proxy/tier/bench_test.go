package tier

import (
	"fmt"
	"testing"
)

// BenchmarkGetHit measures what a request the tier answers pays for the
// lookup: Get on a key present and unexpired, in a cache of 10,000 entries
// read in a scattered order so that not every lookup finds its node in the
// CPU cache. A hit must not allocate.
func BenchmarkGetHit(b *testing.B) {
	const n = 10_000
	c := New(1 << 30)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("P2:tenant-%d:01HZ8K3R6W4V2N7Q9T5X1Y0B3C:%08d", i%13, i)
		c.Set(keys[i], &Entry{Key: keys[i], Value: make([]byte, 64), Expires: 1 << 62})
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, ok := c.Get(keys[i], 1); !ok {
			b.Fatal("miss")
		}
		i = (i + 7919) % n
	}
}

// BenchmarkGetHitParallel is BenchmarkGetHit from every core at once: the
// sidecar serves many connections, and reads must not serialise.
func BenchmarkGetHitParallel(b *testing.B) {
	const n = 10_000
	c := New(1 << 30)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("P2:tenant-%d:01HZ8K3R6W4V2N7Q9T5X1Y0B3C:%08d", i%13, i)
		c.Set(keys[i], &Entry{Key: keys[i], Value: make([]byte, 64), Expires: 1 << 62})
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, ok := c.Get(keys[i], 1); !ok {
				b.Fatal("miss")
			}
			i = (i + 7919) % n
		}
	})
}
