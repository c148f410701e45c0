package codec

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/golang/snappy"
)

// Benchmarks measure what the proxy pays per item on its hot path, at the
// sizes index-cache values take (1 KiB series, 64 KiB postings, 1 MiB at
// memcached's item limit), against bare snappy on the same input: the
// envelope (header, CRC-32C, savings check) must stay within 0.8× of it.
// Raw postings are the exception: the postings codec does more work than
// snappy, which stores them whole, to keep about a quarter. Output buffers are reused, as the proxy reuses them, so allocs/op shows
// what the codec itself allocates.

var benchSizes = []int{1 << 10, 64 << 10, 1 << 20}

type benchInput struct {
	name string
	gen  func(size int, seed uint64) []byte
}

// series compresses (about 2:1) with snappy and is no postings list;
// postings is a raw postings list, which snappy cannot compress and the
// postings codec stores at about a quarter (its gaps vary within runs); dm
// is recognised and never tried.
var benchInputs = []benchInput{
	{"series", seriesPayload},
	{"postings", postingsPayload},
	{"dm", mimirPostingsPayload},
}

func forEachInput(b *testing.B, run func(b *testing.B, v []byte)) {
	for _, in := range benchInputs {
		for _, size := range benchSizes {
			runSized(b, fmt.Sprintf("%s/%dKiB", in.name, size>>10), in.gen(size, 1), run)
		}
	}
}

// runSized runs one sub-benchmark over v, its MB/s counted on v's length.
func runSized(b *testing.B, name string, v []byte, run func(b *testing.B, v []byte)) {
	b.Run(name, func(b *testing.B) {
		b.SetBytes(int64(len(v)))
		b.ReportAllocs()
		run(b, v)
	})
}

// BenchmarkEncode encodes as the proxy does under testKey, a
// postings-bearing key: with AppendEncodePostings.
func BenchmarkEncode(b *testing.B) { forEachInput(b, benchEncode) }

func benchEncode(b *testing.B, v []byte) {
	c := newTestCodec(b, nil)
	dst := make([]byte, 0, MaxEncodedLen(len(v)))
	var stored []byte
	for b.Loop() {
		stored, _ = c.AppendEncodePostings(dst, testKey, false, 0, v)
	}
	b.ReportMetric(float64(len(stored))/float64(len(v)), "stored/value")
}

func BenchmarkEncodeBound(b *testing.B) {
	c := newTestCodec(b, nil)
	forEachInput(b, func(b *testing.B, v []byte) {
		dst := make([]byte, 0, MaxEncodedLen(len(v)))
		for b.Loop() {
			c.AppendEncodePostings(dst, rewrittenKey, true, 0, v)
		}
	})
}

// BenchmarkSnappyEncode is the yardstick: bare snappy.Encode into a reused
// buffer.
func BenchmarkSnappyEncode(b *testing.B) { forEachInput(b, benchSnappyEncode) }

func benchSnappyEncode(b *testing.B, v []byte) {
	dst := make([]byte, snappy.MaxEncodedLen(len(v)))
	var enc []byte
	for b.Loop() {
		enc = snappy.Encode(dst, v)
	}
	b.ReportMetric(float64(len(enc))/float64(len(v)), "stored/value")
}

// BenchmarkDecode decodes into a buffer reused as the proxy reuses its
// own: after a first decode has sized it (a postings payload needs room
// for its stream too), nothing is allocated.
func BenchmarkDecode(b *testing.B) { forEachInput(b, benchDecode) }

func benchDecode(b *testing.B, v []byte) {
	c := newTestCodec(b, nil)
	stored, sf := c.AppendEncodePostings(nil, testKey, false, 0, v)
	dst, _, err := c.AppendDecode(nil, testKey, false, sf, stored)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, _, err := c.AppendDecode(dst[:0], testKey, false, sf, stored); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeFresh decodes into nil, as a caller without a buffer to
// reuse would: one allocation, the output.
func BenchmarkDecodeFresh(b *testing.B) {
	c := newTestCodec(b, nil)
	forEachInput(b, func(b *testing.B, v []byte) {
		stored, sf := c.AppendEncodePostings(nil, testKey, false, 0, v)
		for b.Loop() {
			if _, _, err := c.AppendDecode(nil, testKey, false, sf, stored); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkSnappyDecode(b *testing.B) { forEachInput(b, benchSnappyDecode) }

func benchSnappyDecode(b *testing.B, v []byte) {
	enc := snappy.Encode(nil, v)
	dst := make([]byte, len(v))
	for b.Loop() {
		if _, err := snappy.Decode(dst, enc); err != nil {
			b.Fatal(err)
		}
	}
}

// Postings benchmarks measure the postings codecs on raw postings lists of
// 100, 10,000 and 1,000,000 references in four shapes: runs of constant
// gaps with occasional jumps (the shape), the same with gaps
// varying by up to 2 within a run, consecutive references, and sparse
// lists of random gaps up to 4096. Each list is encoded with codec 3, as
// written today, and with codec 2, as written before it (old items are
// still read), so that one run compares them interleaved. Bare snappy on
// the same bytes is the yardstick. MB/s counts the raw list; stored/value
// is what the envelope keeps of it.
var postingsRefs = []int{100, 10_000, 1_000_000}

var postingsShapes = []benchInput{
	{"runs", postingsRuns},
	{"jitter", postingsPayload},
	{"consecutive", consecutiveList},
	{"sparse", sparseList},
}

// consecutiveList is size bytes of consecutive references from 1,000.
func consecutiveList(size int, _ uint64) []byte {
	out := make([]byte, 0, size)
	for i := uint32(1000); len(out)+4 <= size; i++ {
		out = binary.BigEndian.AppendUint32(out, i)
	}
	return out
}

// sparseList is size bytes of references with random gaps from 1 to
// 4096, as a rare label value's postings spread over a block.
func sparseList(size int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 0x5a45))
	out := make([]byte, 0, size)
	x := uint32(r.IntN(4096))
	for len(out)+4 <= size {
		out = binary.BigEndian.AppendUint32(out, x)
		x += 1 + uint32(r.IntN(4096))
	}
	return out
}

func forEachPostings(b *testing.B, codecs bool, run func(b *testing.B, c *Codec, v []byte)) {
	for _, shape := range postingsShapes {
		for _, refs := range postingsRefs {
			if refs == 1_000_000 && shape.name == "sparse" {
				continue // 4,096 × 10^6 is past 32 bits
			}
			v := shape.gen(4*refs, 1)
			if !codecs {
				runSized(b, fmt.Sprintf("%s/refs=%d", shape.name, refs), v, func(b *testing.B, v []byte) { run(b, nil, v) })
				continue
			}
			for _, codec2 := range []bool{false, true} {
				c := newTestCodec(b, func(cfg *Config) { cfg.PostingsCodec2 = codec2 })
				id := map[bool]int{false: CodecPostingsPacked, true: CodecPostings}[codec2]
				runSized(b, fmt.Sprintf("%s/refs=%d/codec=%d", shape.name, refs, id), v, func(b *testing.B, v []byte) { run(b, c, v) })
			}
		}
	}
}

// benchPostingsEncode and benchPostingsDecode are benchEncode and
// benchDecode with the codec given.
func benchPostingsEncode(b *testing.B, c *Codec, v []byte) {
	dst := make([]byte, 0, MaxEncodedLen(len(v)))
	var stored []byte
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := threadCPU()
	for b.Loop() {
		stored, _ = c.AppendEncodePostings(dst, testKey, false, 0, v)
	}
	reportCPU(b, len(v), start)
	b.ReportMetric(float64(len(stored))/float64(len(v)), "stored/value")
}

func benchPostingsDecode(b *testing.B, c *Codec, v []byte) {
	stored, sf := c.AppendEncodePostings(nil, testKey, false, 0, v)
	dst, _, err := c.AppendDecode(nil, testKey, false, sf, stored)
	if err != nil {
		b.Fatal(err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := threadCPU()
	for b.Loop() {
		if _, _, err := c.AppendDecode(dst[:0], testKey, false, sf, stored); err != nil {
			b.Fatal(err)
		}
	}
	reportCPU(b, len(v), start)
	b.ReportMetric(float64(len(stored))/float64(len(v)), "stored/value")
}

// reportCPU reports the bytes of v processed per second of the thread's
// CPU time since start (see threadCPU), when it is measured.
func reportCPU(b *testing.B, n int, start time.Duration) {
	if cpu := threadCPU() - start; cpu > 0 {
		b.ReportMetric(float64(n)*float64(b.N)/cpu.Seconds()/1e6, "MB/cpu-s")
	}
}

// BenchmarkPostingsDecodeMix decodes lists of the sizes the comparison's
// raw-postings load reads (loadgen --shape raw-postings): 10 to 50,000
// references, the count log-uniform, 256 lists of each shape, each stored
// with codec 3. MB/s counts the raw lists: the rate at which a 100-key get
// of such lists is rebuilt. Its bytes are mostly in the longer lists.
func BenchmarkPostingsDecodeMix(b *testing.B) {
	c := newTestCodec(b, nil)
	for _, shape := range postingsShapes[:2] { // runs and jitter: the load's gaps
		b.Run(shape.name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(7, 0x3e1))
			var stored [][]byte
			var flags []uint32
			total := 0
			for i := range 256 {
				refs := int(10 * math.Pow(50_000.0/10, r.Float64()))
				v := shape.gen(4*refs, uint64(i))
				st, sf := c.AppendEncodePostings(nil, testKey, false, 0, v)
				stored, flags = append(stored, st), append(flags, sf)
				total += len(v)
			}
			dst := make([]byte, 0, 4*50_000+64)
			b.SetBytes(int64(total))
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			start := threadCPU()
			for b.Loop() {
				for i, st := range stored {
					if _, _, err := c.AppendDecode(dst[:0], testKey, false, flags[i], st); err != nil {
						b.Fatal(err)
					}
				}
			}
			reportCPU(b, total, start)
		})
	}
}

func BenchmarkPostingsEncode(b *testing.B) { forEachPostings(b, true, benchPostingsEncode) }
func BenchmarkPostingsDecode(b *testing.B) { forEachPostings(b, true, benchPostingsDecode) }
func BenchmarkPostingsSnappyEncode(b *testing.B) {
	forEachPostings(b, false, func(b *testing.B, _ *Codec, v []byte) { benchSnappyEncode(b, v) })
}
func BenchmarkPostingsSnappyDecode(b *testing.B) {
	forEachPostings(b, false, func(b *testing.B, _ *Codec, v []byte) { benchSnappyDecode(b, v) })
}
