package codec

import (
	"fmt"
	"testing"

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

// Postings benchmarks measure the postings codec on raw postings lists of
// 100, 10,000 and 1,000,000 references (gaps constant within runs, the
// issue's shape), against bare snappy on the same bytes. MB/s counts the
// raw list; stored/value is what the envelope keeps of it.
var postingsRefs = []int{100, 10_000, 1_000_000}

func forEachPostings(b *testing.B, run func(b *testing.B, v []byte)) {
	for _, refs := range postingsRefs {
		runSized(b, fmt.Sprintf("refs=%d", refs), postingsRuns(4*refs, 1), run)
	}
}

func BenchmarkPostingsEncode(b *testing.B)       { forEachPostings(b, benchEncode) }
func BenchmarkPostingsDecode(b *testing.B)       { forEachPostings(b, benchDecode) }
func BenchmarkPostingsSnappyEncode(b *testing.B) { forEachPostings(b, benchSnappyEncode) }
func BenchmarkPostingsSnappyDecode(b *testing.B) { forEachPostings(b, benchSnappyDecode) }
