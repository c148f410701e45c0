package proxy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"mcsidecar/codec"
	"mcsidecar/keyspace"
)

// rawPostings returns a TSDB-index-like postings list as big-endian uint32
// series references, shaped as codec/gen_test.go's genPostings: runs of
// near-constant gaps (1 to 64) with occasional large jumps, n references.
// A run ends with a new gap (10 %) or a jump to another range of series
// (2 %); within a run each gap varies by up to jitter-1 (0: gaps exactly
// constant, as between series entries of equal size).
func rawPostings(rng *rand.Rand, n int, jitter uint32) []byte {
	b := make([]byte, 4*n)
	ref := rng.Uint32N(1 << 16)
	gap := 1 + rng.Uint32N(64)
	for i := range n {
		binary.BigEndian.PutUint32(b[4*i:], ref)
		switch x := rng.IntN(100); {
		case x < 2:
			ref += 10_000 + rng.Uint32N(1_000_000)
		case x < 12:
			gap = 1 + rng.Uint32N(64)
			ref += gap
		case jitter > 0:
			ref += gap + rng.Uint32N(jitter)
		default:
			ref += gap
		}
	}
	return b
}

// TestRawPostingsStoredBytes loads 10,000 raw postings lists (lengths
// log-uniform from 10 to 50,000 references) through three proxies under
// Mimir postings keys: without the codec, with the generic codec (the
// postings codec off) and with the postings codec, and compares what each
// memcached holds ("stats" bytes). Snappy saves nothing on raw postings, so
// the generic codec must store them as they are: the envelope may cost its
// header, and memcached the 4 bytes it keeps for non-zero flags, nothing
// more. The postings codec must store them at a fraction of their size,
// and every value read back must be the client's exact bytes. Two shapes
// of lists: gaps exactly constant within runs, and gaps varying by up to 2.
// The figures are logged for the record.
func TestRawPostingsStoredBytes(t *testing.T) {
	if testing.Short() {
		t.Skip("loads about 500 MB")
	}
	for _, shape := range []struct {
		name   string
		jitter uint32
		want   float64 // most the postings codec may store, of the raw bytes
	}{
		{"constant gaps within runs", 0, 1.0 / 7},
		{"gaps varying by up to 2", 3, 0.3},
	} {
		t.Run(shape.name, func(t *testing.T) {
			loadRawPostings(t, shape.jitter, shape.want)
		})
	}
}

func loadRawPostings(t *testing.T, jitter uint32, want float64) {
	const values = 10_000
	plainUp := startMemcached(t, "-m", "1024")
	genericUp := startMemcached(t, "-m", "1024")
	postingsUp := startMemcached(t, "-m", "1024")
	_, plain := startProxy(t, testConfig(plainUp))
	cfg := testConfig(genericUp)
	cfg.Codec = codecConfig()
	_, generic := startProxy(t, cfg)
	cfg = testConfig(postingsUp)
	cfg.Codec = codecConfig()
	cfg.Codec.Postings = true
	_, postings := startProxy(t, cfg)

	rng := rand.New(rand.NewPCG(1, 2))
	var logical int
	clients := []*rawClient{newRawClient(t, plain), newRawClient(t, generic), newRawClient(t, postings)}
	reader := newRawClient(t, postings)
	for i := range values {
		n := int(math.Exp(math.Log(10) + rng.Float64()*(math.Log(50_000)-math.Log(10))))
		v := rawPostings(rng, n, jitter)
		logical += len(v)
		key := fmt.Sprintf("P2:tenant-%d:01HZ%022d:%s", i%50, i/50, strconv.Itoa(i))
		req := []byte("set " + key + " 0 604800 " + strconv.Itoa(len(v)) + "\r\n" + string(v) + "\r\n")
		for _, c := range clients {
			if err := c.roundTrip(req, "STORED"); err != nil {
				t.Fatalf("value %d: %v", i, err)
			}
		}
		if i%100 == 0 {
			got, err := reader.get(key)
			if err != nil || !bytes.Equal(got, v) {
				t.Fatalf("value %d read back through the postings codec: %d bytes, want %d (%v)", i, len(got), len(v), err)
			}
		}
	}
	plainBytes := newLineClient(t, plainUp).stat("bytes")
	genericBytes := newLineClient(t, genericUp).stat("bytes")
	postingsBytes := newLineClient(t, postingsUp).stat("bytes")
	t.Logf("%d raw postings values, %d bytes: memcached holds %d bytes without the codec (%.4f× raw), %d with the generic codec (%.4f× raw), %d with the postings codec (%.4f× raw, %.4f× generic)",
		values, logical, plainBytes, float64(plainBytes)/float64(logical), genericBytes, float64(genericBytes)/float64(logical),
		postingsBytes, float64(postingsBytes)/float64(logical), float64(postingsBytes)/float64(genericBytes))
	// Each envelope header is at most 8 bytes here (values < 2 MiB), and
	// memcached spends 4 more bytes on an item whose flags are not zero.
	if genericBytes > plainBytes+(8+4)*values {
		t.Errorf("with the generic codec memcached holds %d bytes, over %d plus 12 per value", genericBytes, plainBytes)
	}
	if r := float64(postingsBytes) / float64(logical); r > want {
		t.Errorf("with the postings codec memcached holds %.4f× the raw bytes, want under %.4f×", r, want)
	}
}

// get reads one key's value, or nil for a miss.
func (rc *rawClient) get(key string) ([]byte, error) {
	if _, err := rc.rw.WriteString("get " + key + "\r\n"); err != nil {
		return nil, err
	}
	if err := rc.rw.Flush(); err != nil {
		return nil, err
	}
	line, err := rc.rw.ReadString('\n')
	if err != nil || line == "END\r\n" {
		return nil, err
	}
	var k string
	var flags, size int
	if _, err := fmt.Sscanf(line, "VALUE %s %d %d", &k, &flags, &size); err != nil {
		return nil, fmt.Errorf("reply %q: %v", line, err)
	}
	v := make([]byte, size+2)
	if _, err := io.ReadFull(rc.rw, v); err != nil {
		return nil, err
	}
	if end, err := rc.rw.ReadString('\n'); err != nil || end != "END\r\n" {
		return nil, fmt.Errorf("after the value %q: %v", end, err)
	}
	return v[:size], nil
}

// TestPostingsCodecOnlyUnderPostingsKeys checks which keys' values the
// postings codec may take: a key under --codec-prefixes and a rewritten key
// of a scheme marked +postings do; a rewritten key of a scheme without
// +postings keeps the generic codec. Every value reads back exactly.
func TestPostingsCodecOnlyUnderPostingsKeys(t *testing.T) {
	up := startMemcached(t)
	cfg := keyspaceConfig(up)
	cfg.Codec.Prefixes = []string{"P2:"}
	cfg.Codec.Postings = true
	cfg.Keys.Schemes = []string{"idx+postings=IDX:{tenant}:{ulid}:{1}", "plainidx=PIDX:{tenant}:{ulid}:{1}"}
	_, addr := startProxy(t, cfg)
	ks, err := keyspace.New(*cfg.Keys)
	if err != nil {
		t.Fatal(err)
	}
	pc, direct := newRawClient(t, addr), newLineClient(t, up)
	v := rawPostings(rand.New(rand.NewPCG(3, 4)), 400, 0)
	tenant := testTenant("big", 260)
	for _, tc := range []struct {
		key   string
		codec byte
	}{
		{"P2:tenant-1:" + testBlock + ":am9iOmFwaQ", codec.CodecPostingsPacked},
		{"IDX:" + tenant + ":" + testBlock + ":am9iOmFwaQ", codec.CodecPostingsPacked},
		{"PIDX:" + tenant + ":" + testBlock + ":am9iOmFwaQ", 0},
	} {
		req := []byte("set " + tc.key + " 0 0 " + strconv.Itoa(len(v)) + "\r\n" + string(v) + "\r\n")
		if err := pc.roundTrip(req, "STORED"); err != nil {
			t.Fatalf("%.20s: %v", tc.key, err)
		}
		k := tc.key
		if ks.NeedsRewrite([]byte(k)) {
			upKey, _, _ := ks.AppendRewrite(nil, []byte(k))
			k = string(upKey)
		}
		_, data, ok := rawItem(t, direct, k)
		if !ok {
			t.Fatalf("%.20s: memcached holds nothing under %q", tc.key, k)
		}
		if c := data[0] & 0x0f; c != tc.codec {
			t.Errorf("%.20s: upstream item of codec %d, want %d", tc.key, c, tc.codec)
		}
		if got, err := pc.get(tc.key); err != nil || !bytes.Equal(got, v) {
			t.Errorf("%.20s: read back %d bytes, want %d (%v)", tc.key, len(got), len(v), err)
		}
	}
}

// TestPostingsOfBothCodecsReadBack runs two sidecars on one memcached, one
// writing raw postings with codec 3 (the default) and one with codec 2
// (--codec-postings-codec2, as for a rolling upgrade from sidecars that do
// not read codec 3). Each reads back, byte for byte, what either wrote,
// and memcached holds each item in the codec its writer chose.
func TestPostingsOfBothCodecsReadBack(t *testing.T) {
	up := startMemcached(t)
	cfg := testConfig(up)
	cfg.Codec = codecConfig()
	cfg.Codec.Postings = true
	_, packed := startProxy(t, cfg)
	cfg = testConfig(up)
	cfg.Codec = codecConfig()
	cfg.Codec.Postings = true
	cfg.Codec.PostingsCodec2 = true
	_, old := startProxy(t, cfg)
	clients := map[byte]*rawClient{codec.CodecPostingsPacked: newRawClient(t, packed), codec.CodecPostings: newRawClient(t, old)}
	direct := newLineClient(t, up)
	rng := rand.New(rand.NewPCG(5, 6))
	for id, writer := range clients {
		for i, n := range []int{20, 1000, 40_000} {
			v := rawPostings(rng, n, uint32(i%2)*3)
			key := fmt.Sprintf("P2:tenant-1:%s:codec%d-%d", testBlock, id, n)
			req := []byte("set " + key + " 0 0 " + strconv.Itoa(len(v)) + "\r\n" + string(v) + "\r\n")
			if err := writer.roundTrip(req, "STORED"); err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			if _, data, ok := rawItem(t, direct, key); !ok || data[0]&0x0f != id {
				t.Fatalf("%s: upstream item of codec %d, want %d", key, data[0]&0x0f, id)
			}
			for readerID, reader := range clients {
				if got, err := reader.get(key); err != nil || !bytes.Equal(got, v) {
					t.Errorf("%s read through the codec-%d sidecar: %d bytes, want %d (%v)", key, readerID, len(got), len(v), err)
				}
			}
		}
	}
}
