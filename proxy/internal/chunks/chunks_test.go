package chunks

import (
	"math/rand/v2"
	"testing"
)

// checkKept checks what the pool keeps: chunks of Size apart from longer
// ones, each within its bounds, and longKept counting the longer ones.
func checkKept(t *testing.T, p *Pool) {
	t.Helper()
	long := 0
	for _, b := range p.chunks {
		if cap(b) != Size || len(b) != 0 {
			t.Fatalf("a kept chunk of %d bytes (%d in use) among those of %d", cap(b), len(b), Size)
		}
	}
	for _, b := range p.long {
		if n := cap(b); n <= Size || n > KeepMax {
			t.Fatalf("a kept long chunk of %d bytes", n)
		}
		long += cap(b)
	}
	if len(p.chunks) > kept || long != p.longKept || long > longBytes {
		t.Fatalf("kept %d chunks of %d bytes and %d bytes of longer ones, counted as %d", len(p.chunks), Size, long, p.longKept)
	}
}

// TestPoolKeepsWithinItsBounds gets and releases chunks of every size,
// some shared, some adopted arrays, in a random order, and checks what the
// pool keeps after each step, and that a chunk is reused, not allocated
// again, once given back.
func TestPoolKeepsWithinItsBounds(t *testing.T) {
	var p Pool
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{1, Size - 1, Size, Size + 1, 700_000, 2_500_000, KeepMax, KeepMax + 1, 5_000_000}
	var held []*Share
	for range 5000 {
		switch r := rng.IntN(10); {
		case r < 4 || len(held) == 0:
			n := sizes[rng.IntN(len(sizes))]
			sh := p.Get(n)
			if cap(sh.Buf) < n || len(sh.Buf) != 0 || sh.Refs != 1 {
				t.Fatalf("Get(%d): %d bytes, %d in use, %d refs", n, cap(sh.Buf), len(sh.Buf), sh.Refs)
			}
			if rng.IntN(4) == 0 {
				sh.Refs++ // two replies in it
				held = append(held, sh)
			}
			held = append(held, sh)
		case r < 5:
			// A reply that outgrew its chunk, appended into a larger array.
			i := rng.IntN(len(held))
			grown := append(held[i].Buf[:cap(held[i].Buf)], make([]byte, 1000)...)
			p.Release(held[i])
			held[i] = p.Adopt(grown)
		default:
			i := rng.IntN(len(held))
			p.Release(held[i])
			held = append(held[:i], held[i+1:]...)
		}
		checkKept(t, &p)
	}
	for _, sh := range held {
		p.Release(sh)
	}
	checkKept(t, &p)

	// Once given back, a chunk of Size serves the next Get of it.
	made := p.Made()
	for range 100 {
		p.Release(p.Get(Size))
	}
	if p.Made() != made {
		t.Errorf("%d bytes allocated for chunks given back and taken again", p.Made()-made)
	}
}
