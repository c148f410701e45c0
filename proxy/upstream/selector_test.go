package upstream

import (
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// dskitJump is grafana/dskit's jumpHash (Lamping and Veach), written out
// here so the test checks the library the proxy uses against the loop
// store-gateways run.
func dskitJump(key uint64, buckets int) int {
	var b, j int64 = -1, 0
	for j < int64(buckets) {
		b = j
		key = key*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((key>>33)+1)))
	}
	return int(b)
}

func TestJumpPicksTheServerDskitPicks(t *testing.T) {
	for n := 1; n <= 12; n++ {
		sel := jumpSelector(n)
		for i := range 5000 {
			key := fmt.Sprintf("P2:tenant-%d:01HZ%022d:label", i%7, i)
			if got, want := sel.pick(key), dskitJump(xxhash.Sum64String(key), n); got != want {
				t.Fatalf("%d servers, key %q: picked %d, dskit picks %d", n, key, got, want)
			}
		}
	}
}

func TestServersAreInNaturalSortOrder(t *testing.T) {
	in := []string{"mc-10:11211", "mc-2:11211", "mc-1:11211", "mc-0:11211"}
	want := []string{"mc-0:11211", "mc-1:11211", "mc-2:11211", "mc-10:11211"}
	if got := OrderServers(in); !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	if in[0] != "mc-10:11211" {
		t.Fatal("orderServers changed its argument")
	}
}

func TestJumpMovesFewKeysWhenAServerIsAdded(t *testing.T) {
	moved := 0
	const keys = 20000
	for i := range keys {
		k := "S:t:" + strconv.Itoa(i)
		if jumpSelector(4).pick(k) != jumpSelector(5).pick(k) {
			moved++
		}
	}
	// A fifth server should take about a fifth of the keys.
	if moved < keys/10 || moved > keys*3/10 {
		t.Fatalf("%d of %d keys moved from 4 to 5 servers, want about %d", moved, keys, keys/5)
	}
}
