package proxy

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
)

// rawPostings returns a TSDB-index-like postings list as big-endian uint32
// series references: runs of near-constant gaps with occasional large
// jumps, n references.
func rawPostings(rng *rand.Rand, n int) []byte {
	b := make([]byte, 4*n)
	ref := rng.Uint32N(1 << 16)
	gap := 1 + rng.Uint32N(16)
	for i := range n {
		binary.BigEndian.PutUint32(b[4*i:], ref)
		switch {
		case rng.IntN(100) == 0:
			ref += 1 + rng.Uint32N(1<<16) // a jump to another series range
			gap = 1 + rng.Uint32N(16)
		default:
			ref += gap + rng.Uint32N(3)
		}
	}
	return b
}

// TestRawPostingsStoredWithHeaderOnly loads 10,000 raw postings lists
// (lengths log-uniform from 10 to 50,000 references) through the proxy
// with and without the codec under Mimir postings keys, and compares what
// memcached holds ("stats" bytes). Snappy saves nothing on raw postings,
// so the codec must store them as they are: the envelope may cost its
// header, and memcached the 4 bytes it keeps for non-zero flags, nothing
// more. The figures are logged for the record.
func TestRawPostingsStoredWithHeaderOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("loads about 200 MB")
	}
	const values = 10_000
	plainUp := startMemcached(t, "-m", "1024")
	codecUp := startMemcached(t, "-m", "1024")
	_, plain := startProxy(t, testConfig(plainUp))
	cfg := testConfig(codecUp)
	cfg.Codec = codecConfig()
	_, withCodec := startProxy(t, cfg)

	rng := rand.New(rand.NewPCG(1, 2))
	var logical int
	plainC, codecC := newRawClient(t, plain), newRawClient(t, withCodec)
	for i := range values {
		n := int(math.Exp(math.Log(10) + rng.Float64()*(math.Log(50_000)-math.Log(10))))
		v := rawPostings(rng, n)
		logical += len(v)
		key := fmt.Sprintf("P2:tenant-%d:01HZ%022d:%s", i%50, i/50, strconv.Itoa(i))
		req := []byte("set " + key + " 0 604800 " + strconv.Itoa(len(v)) + "\r\n" + string(v) + "\r\n")
		for _, c := range []*rawClient{plainC, codecC} {
			if err := c.roundTrip(req, "STORED"); err != nil {
				t.Fatalf("value %d: %v", i, err)
			}
		}
	}
	plainBytes := newLineClient(t, plainUp).stat("bytes")
	codecBytes := newLineClient(t, codecUp).stat("bytes")
	t.Logf("%d raw postings values, %d bytes: memcached holds %d bytes without the codec, %d with it (%.4f×)",
		values, logical, plainBytes, codecBytes, float64(codecBytes)/float64(plainBytes))
	// Each envelope header is at most 8 bytes here (values < 2 MiB), and
	// memcached spends 4 more bytes on an item whose flags are not zero.
	if codecBytes > plainBytes+(8+4)*values {
		t.Errorf("with the codec memcached holds %d bytes, over %d plus 12 per value", codecBytes, plainBytes)
	}
}
