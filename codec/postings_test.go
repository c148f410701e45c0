package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/golang/snappy"
)

// u32s and u64s spell values as big-endian references; tsdbList adds the
// TSDB count in front.
func u32s(refs ...uint32) []byte {
	out := []byte{}
	for _, r := range refs {
		out = binary.BigEndian.AppendUint32(out, r)
	}
	return out
}

func u64s(refs ...uint64) []byte {
	out := []byte{}
	for _, r := range refs {
		out = binary.BigEndian.AppendUint64(out, r)
	}
	return out
}

func tsdbList(refs ...uint32) []byte {
	return append(u32s(uint32(len(refs))), u32s(refs...)...)
}

// tsdbPostings is postingsPayload with the TSDB count in front: the value a
// raw index postings list takes.
func tsdbPostings(refs int, seed uint64) []byte {
	return append(u32s(uint32(refs)), postingsPayload(4*refs, seed)...)
}

// u64Postings widens postingsPayload's references to uint64 above 2^32.
func u64Postings(refs int, seed uint64) []byte {
	p := postingsPayload(4*refs, seed)
	out := make([]byte, 0, 8*refs)
	for i := 0; i < len(p); i += 4 {
		out = binary.BigEndian.AppendUint64(out, 1<<40+uint64(binary.BigEndian.Uint32(p[i:])))
	}
	return out
}

func TestDetectPostings(t *testing.T) {
	const none = 0xff
	cases := []struct {
		name   string
		v      []byte
		layout byte // none: not a postings list
	}{
		{"empty value", nil, none},
		{"one byte", []byte{1}, none},
		{"odd length", []byte{0, 0, 0, 1, 0, 0, 0, 2, 3}, none},
		{"length not a multiple of 4", u32s(1, 2)[:6], none},
		{"tsdb count 0", u32s(0), layoutTSDB},
		{"tsdb one reference", tsdbList(42), layoutTSDB},
		{"tsdb reference 0 first", tsdbList(0, 1, 2), layoutTSDB},
		{"tsdb max uint32", tsdbList(1, math.MaxUint32), layoutTSDB},
		{"tsdb count that does not match, read as a u32 array", u32s(3, 5, 6), layoutU32},
		{"tsdb count over the references", append(u32s(5), u32s(1, 2)...), none},
		{"tsdb equal neighbours", tsdbList(1, 2, 2), none},
		{"tsdb descending", tsdbList(3, 2, 1), none},
		{"u32 one reference", u32s(42), layoutU32},
		{"u32 max uint32", u32s(0, math.MaxUint32-1, math.MaxUint32), layoutU32},
		{"u32 equal neighbours", u32s(5, 6, 6), none},
		{"u32 descending", u32s(7, 6, 5), none},
		{"u32 descending at the end", u32s(10, 20, 30, 40, 39), none},
		{"u32 equal neighbours read as ascending uint64 pairs", u32s(1, 2, 2, 3), layoutU64},
		{"u64 one reference", u64s(1 << 40), layoutU64},
		{"u64 max uint64", u64s(0, math.MaxUint64), layoutU64},
		{"u64 equal neighbours", u64s(1<<40, 1<<40), none},
		{"u64 descending", u64s(1<<41, 1<<40), none},
		{"generated u32", postingsPayload(4000, 1), layoutU32},
		{"generated tsdb", tsdbPostings(1000, 2), layoutTSDB},
		{"generated u64", u64Postings(500, 3), layoutU64},
		{"series entries", seriesPayload(4000, 1), none},
		{"mimir dm", mimirPostingsPayload(4000, 1), none},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pl, ok := detectPostings(tc.v)
			if tc.layout == none {
				if ok {
					t.Fatalf("accepted as layout %d", pl.layout)
				}
				return
			}
			if !ok || pl.layout != tc.layout {
				t.Fatalf("got layout %d (ok %v), want %d", pl.layout, ok, tc.layout)
			}
			// The stream length counted while detecting must be the
			// one written.
			stream := make([]byte, pl.streamLen)
			if w := putStream(stream, tc.v, pl.layout); w != pl.streamLen {
				t.Fatalf("stream is %d bytes, detection counted %d", w, pl.streamLen)
			}
		})
	}
}

// postingsCodec is a codec that tries compression on values of any size,
// so that the shortest lists take the postings codec too.
func postingsCodec(t testing.TB) *Codec {
	return newTestCodec(t, func(cfg *Config) { cfg.MinSize = 0 })
}

// codec2Codec is postingsCodec writing codec 2, as sidecars did before
// codec 3 and do with Config.PostingsCodec2.
func codec2Codec(t testing.TB) *Codec {
	return newTestCodec(t, func(cfg *Config) { cfg.MinSize = 0; cfg.PostingsCodec2 = true })
}

func TestPostingsRoundTrip(t *testing.T) {
	c := postingsCodec(t)
	values := map[string][]byte{
		"tsdb count 0":      u32s(0),
		"tsdb one":          tsdbList(42),
		"tsdb max":          tsdbList(1, 2, math.MaxUint32),
		"u32 one":           u32s(42),
		"u32 max":           u32s(0, math.MaxUint32-1, math.MaxUint32),
		"u64 one":           u64s(1 << 40),
		"u64 max":           u64s(0, 1, math.MaxUint64),
		"u32 100":           postingsPayload(400, 1),
		"u32 10,000":        postingsPayload(40_000, 2),
		"u32 1,000,000":     postingsPayload(4_000_000, 3),
		"tsdb 10,000":       tsdbPostings(10_000, 4),
		"u64 10,000":        u64Postings(10_000, 5),
		"consecutive":       consecutive(100_000),
		"u32 huge gaps":     u32s(0, 1<<28, 1<<29, 1<<30, 1<<31),
		"not a list":        seriesPayload(3000, 1),
		"u32 equal at last": u32s(1, 2, 3, 3),
	}
	for name, v := range values {
		for _, bind := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, bind %v", name, bind), func(t *testing.T) {
				key := testKey
				if bind {
					key = rewrittenKey
				}
				stored, sf := c.AppendEncodePostings([]byte("keep"), key, bind, 7, v)
				if !bytes.HasPrefix(stored, []byte("keep")) {
					t.Fatal("encode overwrote dst")
				}
				stored = stored[4:]
				generic, _ := c.AppendEncode(nil, key, bind, 7, v)
				if len(stored) > len(generic) {
					t.Fatalf("postings-aware envelope %d bytes, generic %d: not the fewest", len(stored), len(generic))
				}
				_, isList := detectPostings(v)
				if !isList && !bytes.Equal(stored, generic) {
					t.Fatal("a value that is no postings list was stored differently")
				}
				mustDecodeTo(t, c, key, bind, sf, stored, v, 7)
			})
		}
	}
}

func consecutive(n int) []byte {
	out := make([]byte, 0, 4*n)
	for i := range n {
		out = binary.BigEndian.AppendUint32(out, uint32(1000+i))
	}
	return out
}

func TestPostingsCodecChosenForRawPostings(t *testing.T) {
	// Raw postings of every layout, long enough to pass the default
	// minimum size, take a postings codec (packed for 32-bit references,
	// codec 2 for 64-bit ones or when asked) and under a seventh of their
	// size (gaps constant within runs); through AppendEncode, or with
	// Config.Postings off, they are enveloped exactly as before.
	c := newTestCodec(t, nil)
	c2 := newTestCodec(t, func(cfg *Config) { cfg.PostingsCodec2 = true })
	off := newTestCodec(t, func(cfg *Config) { cfg.Postings = false })
	for name, v := range map[string][]byte{
		"u32":  postingsRuns(40_000, 1),
		"tsdb": append(u32s(10_000), postingsRuns(40_000, 2)...),
		"u64":  u64Postings(5_000, 3),
	} {
		stored, _ := c.AppendEncodePostings(nil, testKey, false, 0, v)
		want := byte(CodecPostingsPacked)
		if name == "u64" {
			want = CodecPostings
		}
		if codecOf(stored) != want {
			t.Errorf("%s: codec %d, want %d", name, codecOf(stored), want)
		}
		if old, _ := c2.AppendEncodePostings(nil, testKey, false, 0, v); codecOf(old) != CodecPostings {
			t.Errorf("%s: codec %d with PostingsCodec2, want %d", name, codecOf(old), CodecPostings)
		}
		if r := float64(len(stored)) / float64(len(v)); r > 1.0/7 {
			t.Errorf("%s: stored %.3f of its size, want under 1/7", name, r)
		}
		generic, _ := c.AppendEncode(nil, testKey, false, 0, v)
		offStored, _ := off.AppendEncodePostings(nil, testKey, false, 0, v)
		if codecOf(generic) == CodecPostings || !bytes.Equal(offStored, generic) {
			t.Errorf("%s: the generic codec changed", name)
		}
	}
}

func TestValuesThatAreNoPostingsStoredAsBefore(t *testing.T) {
	c := newTestCodec(t, nil)
	for _, fx := range fixtures() {
		if _, ok := detectPostings(fx.value); ok {
			continue
		}
		got, gotSF := c.AppendEncodePostings(nil, fx.key, fx.bind, fx.flags, fx.value)
		want, wantSF := c.AppendEncode(nil, fx.key, fx.bind, fx.flags, fx.value)
		if !bytes.Equal(got, want) || gotSF != wantSF {
			t.Errorf("%s: stored differently under a postings key", fx.name)
		}
	}
}

func TestPostingsStreamSnappyOnlyWhenShorter(t *testing.T) {
	c := codec2Codec(t)
	// Regular gaps: the stream repeats and snappy shortens it.
	regular, _ := c.AppendEncodePostings(nil, testKey, false, 0, consecutive(1000))
	// Random large gaps: the stream has nothing for snappy.
	r := rand.New(rand.NewPCG(1, 2))
	refs := make([]uint32, 200)
	for i := 1; i < len(refs); i++ {
		refs[i] = refs[i-1] + 128 + r.Uint32N(1<<13)
	}
	random, _ := c.AppendEncodePostings(nil, testKey, false, 0, u32s(refs...))
	for _, tc := range []struct {
		name   string
		stored []byte
		snappy bool
	}{{"regular gaps", regular, true}, {"random gaps", random, false}} {
		if codecOf(tc.stored) != CodecPostings {
			t.Fatalf("%s: codec %d", tc.name, codecOf(tc.stored))
		}
		_, k := binary.Uvarint(tc.stored[bindOffset:])
		form := tc.stored[bindOffset+k]
		if got := form&streamSnappy != 0; got != tc.snappy {
			t.Errorf("%s: stream snappy %v, want %v", tc.name, got, tc.snappy)
		}
	}
}

// TestPostingsHandCheckedVector spells a codec-2 envelope out byte by byte,
// as the package doc describes it, independently of the encoder.
func TestPostingsHandCheckedVector(t *testing.T) {
	c := codec2Codec(t)
	v := tsdbList(5, 6, 200)
	stored, sf := c.AppendEncodePostings(nil, []byte("k"), false, 1, v)
	// Header 0x42 (version 1, codec 2), CRC, length 16, form 0 (TSDB, raw
	// stream), then the uvarints 5, 1, 194 (0xc2 0x01).
	body := []byte{16, 0x00, 5, 1, 0xc2, 0x01}
	crc := crc32c(append([]byte{1, 0, 0, 0, 'k', 0x42}, body...))
	want := append([]byte{0x42, byte(crc), byte(crc >> 8), byte(crc >> 16), byte(crc >> 24)}, body...)
	if !bytes.Equal(stored, want) || sf != 0x40000001 {
		t.Fatalf("got %#08x % x, want 0x40000001 % x", sf, stored, want)
	}
	mustDecodeTo(t, c, []byte("k"), false, sf, stored, v, 1)
}

func TestPostingsRefusals(t *testing.T) {
	c := postingsCodec(t)
	key := testKey
	// body builds a resealed codec-2 envelope of recorded length n.
	env := func(n uint64, payload ...byte) []byte {
		s := []byte{version<<versionShift | CodecPostings, 0, 0, 0, 0}
		s = binary.AppendUvarint(s, n)
		return reseal(c, c.mask, key, append(s, payload...))
	}
	snappyOf := func(b []byte) []byte { return snappy.Encode(nil, b) }
	cases := []struct {
		name   string
		stored []byte
		want   error
	}{
		{"no form byte", env(4), ErrDecodeError},
		{"unknown form bits", env(4, 0x08, 1), ErrDecodeError},
		{"layout 3", env(4, 0x03, 1), ErrDecodeError},
		{"u32 length not a multiple of 4", env(6, layoutU32, 1, 1), ErrLengthMismatch},
		{"u64 length not a multiple of 8", env(12, layoutU64, 1), ErrLengthMismatch},
		{"u32 of no reference", env(0, layoutU32), ErrLengthMismatch},
		{"tsdb shorter than its count", env(2, layoutTSDB), ErrLengthMismatch},
		{"more references than stream bytes", env(4*100, layoutU32, 1, 1), ErrLengthMismatch},
		{"stream longer than the references can take", env(4, layoutU32, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), ErrLengthMismatch},
		{"stream with a byte left over", env(8, layoutU32, 1, 1, 1), ErrDecodeError},
		{"equal neighbours", env(8, layoutU32, 1, 0), ErrDecodeError},
		{"reference over 32 bits", env(8, layoutU32, 0xff, 0xff, 0xff, 0xff, 0x0f, 1), ErrDecodeError},
		{"uint64 that overflows", env(16, layoutU64, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 1), ErrDecodeError},
		{"unterminated uvarint", env(4, layoutU32, 0x80), ErrDecodeError},
		{"snappy stream that is not a block", env(8, layoutU32|streamSnappy, 0xfe, 0xff, 0xff, 0xff, 0xff), ErrDecodeError},
		{"snappy stream beyond what the block can hold", env(4*1000, append([]byte{layoutU32 | streamSnappy}, binary.AppendUvarint(nil, 1000)...)...), ErrLengthMismatch},
		{"snappy stream shorter than the references", env(4*10, append([]byte{layoutU32 | streamSnappy}, snappyOf([]byte{1, 1, 1})...)...), ErrLengthMismatch},
		{"snappy stream with a bad reference", env(12, append([]byte{layoutU32 | streamSnappy}, snappyOf([]byte{1, 0, 1})...)...), ErrDecodeError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dst := []byte("keep")
			out, _, err := c.AppendDecode(dst, key, false, c.mask, tc.stored)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if !bytes.Equal(out, []byte("keep")) {
				t.Fatal("dst changed on a refusal")
			}
		})
	}
	// A well-formed envelope built the same way decodes: the refusals
	// above are for what they name.
	ok := env(12, layoutU32, 1, 1, 1)
	mustDecodeTo(t, c, key, false, c.mask, ok, u32s(1, 2, 3), 0)
}

func TestPostingsAllocations(t *testing.T) {
	c := newTestCodec(t, nil)
	for _, v := range [][]byte{postingsPayload(16<<10, 1), postingsPayload(1<<20, 2), tsdbPostings(300, 3), u64Postings(1000, 4)} {
		stored, sf := c.AppendEncodePostings(nil, testKey, false, 9, v)
		if id := codecOf(stored); id != CodecPostings && id != CodecPostingsPacked {
			t.Fatalf("%d bytes took codec %d", len(v), id)
		}
		if len(stored) > len(v)+MaxHeaderLen {
			t.Fatalf("%d bytes stored for %d, beyond the documented bound", len(stored), len(v))
		}
		encBuf := make([]byte, 0, MaxEncodedLen(len(v)))
		if n := testing.AllocsPerRun(10, func() { c.AppendEncodePostings(encBuf, testKey, false, 9, v) }); n != 0 {
			t.Errorf("%d bytes: encode into a roomy buffer allocated %v times", len(v), n)
		}
		if n := testing.AllocsPerRun(10, func() { c.AppendEncodePostings(nil, testKey, false, 9, v) }); n != 1 {
			t.Errorf("%d bytes: encode into nil allocated %v times, want 1", len(v), n)
		}
		if n := testing.AllocsPerRun(10, func() { c.AppendDecode(nil, testKey, false, sf, stored) }); n != 1 {
			t.Errorf("%d bytes: decode into nil allocated %v times, want 1", len(v), n)
		}
		// A buffer reused as the proxy reuses it: after the first
		// decode, none allocates.
		decBuf, _, _ := c.AppendDecode(nil, testKey, false, sf, stored)
		if n := testing.AllocsPerRun(10, func() { c.AppendDecode(decBuf[:0], testKey, false, sf, stored) }); n != 0 {
			t.Errorf("%d bytes: decode into a reused buffer allocated %v times", len(v), n)
		}
	}
}

func TestMaxEncodedLenBoundsPostings(t *testing.T) {
	// The worst room the postings codec takes: a stream just shorter
	// than the value (gaps of 2^21 and more take 4 bytes each), bound.
	c := postingsCodec(t)
	for _, refs := range []int{1, 2, 3, 16, 100, 20_000} {
		rs := make([]uint32, refs)
		for i := range rs {
			rs[i] = uint32(i) << 21
		}
		v := u32s(rs...)
		buf := make([]byte, 0, MaxEncodedLen(len(v)))
		out, _ := c.AppendEncodePostings(buf, rewrittenKey, true, 0, v)
		if &out[:1][0] != &buf[:1][0] {
			t.Errorf("%d references: dst grew past MaxEncodedLen", refs)
		}
	}
}

// TestPostingsRatio measures what each codec stores of realistic raw
// postings: lists of log-uniform length from 10 to 50,000 references, runs
// of near-constant gaps with occasional large jumps, in two shapes: gaps
// exactly constant within a run (the shape), and gaps that vary by
// up to 2 within a run; and, for the record, consecutive references and
// sparse random gaps. Snappy alone saves nothing on any. Codec 3 must
// store no more than codec 2 did on every shape.
func TestPostingsRatio(t *testing.T) {
	lists := 1000
	if testing.Short() {
		lists = 100
	}
	for _, shape := range []struct {
		name string
		gen  func(size int, seed uint64) []byte
		want float64
	}{
		{"constant gaps within runs", postingsRuns, 1.0 / 7},
		{"gaps varying by up to 2", postingsPayload, 0.3},
		{"consecutive", consecutiveList, 0.05},
		{"sparse gaps up to 4096", sparseList, 0.5},
	} {
		t.Run(shape.name, func(t *testing.T) {
			r := postingsRatio(t, lists, shape.gen)
			t.Logf("%d lists, %d bytes raw: none %.4f, snappy %.4f, uvarint stream %.4f, codec 2 %.4f, codec 3 %.4f (envelopes included)",
				lists, r.raw, r.none, r.snappy, r.stream, r.codec2, r.packed)
			if r.snappy < 0.95 {
				t.Errorf("snappy stored %.3f of raw postings: the generator is not realistic", r.snappy)
			}
			if r.packed > shape.want {
				t.Errorf("codec 3 stored %.3f of raw, want under %.3f", r.packed, shape.want)
			}
			if r.packed > r.codec2 {
				t.Errorf("codec 3 stored %.4f of raw, more than codec 2's %.4f", r.packed, r.codec2)
			}
		})
	}
}

// ratios are the sizes of each form of the lists, as fractions of raw.
type ratios struct {
	raw                                  int
	none, snappy, stream, codec2, packed float64
}

// postingsRatio envelopes lists generated by gen with each codec.
func postingsRatio(t testing.TB, lists int, gen func(size int, seed uint64) []byte) ratios {
	c := newTestCodec(t, nil)
	c2 := newTestCodec(t, func(cfg *Config) { cfg.PostingsCodec2 = true })
	r := rand.New(rand.NewPCG(7, 8))
	var raw, noneN, snapN, streamN, c2N, postN int
	var buf []byte
	for i := range lists {
		refs := int(math.Exp(math.Log(10) + r.Float64()*(math.Log(50_000)-math.Log(10))))
		v := gen(4*refs, uint64(i))
		raw += len(v)
		noneN += len(v) + headerLen(false, len(v))
		snapN += len(snappy.Encode(buf[:cap(buf)], v))
		pl, _ := detectPostings(v)
		streamN += pl.streamLen
		buf, _ = c2.AppendEncodePostings(buf[:0], testKey, false, 0, v)
		c2N += len(buf)
		buf, _ = c.AppendEncodePostings(buf[:0], testKey, false, 0, v)
		postN += len(buf)
	}
	f := func(n int) float64 { return float64(n) / float64(raw) }
	return ratios{raw, f(noneN), f(snapN), f(streamN), f(c2N), f(postN)}
}

func TestPostingsWithCompressedMagicLeftAlone(t *testing.T) {
	// A list whose first bytes read "dm" (Mimir's own encoding) is left
	// as the client's already compressed value would be: never tried.
	c := newTestCodec(t, nil)
	refs := make([]uint32, 100)
	for i := range refs {
		refs[i] = 0x646d0000 + uint32(i)
	}
	v := u32s(refs...)
	if _, ok := detectPostings(v); !ok {
		t.Fatal("the list is not detected at all")
	}
	got, _ := c.AppendEncodePostings(nil, testKey, false, 0, v)
	want, _ := c.AppendEncode(nil, testKey, false, 0, v)
	if !bytes.Equal(got, want) || codecOf(got) != CodecNone {
		t.Fatalf("stored with codec %d, want as is", codecOf(got))
	}
}

// specStream reads a codec-2 stream of count references the way the
// package doc states it, one uvarint at a time, with none of the
// decoder's shortcuts: what it accepts and what it gives must be what
// expand32 and expand64 accept and give.
func specStream(stream []byte, count int, top uint64) ([]uint64, bool) {
	var refs []uint64
	var x uint64
	for i := range count {
		d, k := binary.Uvarint(stream)
		if k <= 0 || (i > 0 && d == 0) || d > top-x {
			return nil, false
		}
		stream = stream[k:]
		x += d
		refs = append(refs, x)
	}
	return refs, len(stream) == 0
}

// TestExpandStreamShortcuts checks the word-at-a-time paths of expand32 at
// their edges: eight one-byte gaps with a zero among them, four two-byte
// gaps with a zero (a needless second byte), a gap spelled in more bytes
// than it needs, and references that pass 32 bits inside a word.
func TestExpandStreamShortcuts(t *testing.T) {
	ones := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	cases := []struct {
		name   string
		stream []byte
		count  int
	}{
		{"one-byte gaps", append([]byte{5}, ones(40, 3)...), 41},
		{"a zero gap among one-byte gaps", append(append([]byte{5}, ones(20, 3)...), append([]byte{0}, ones(19, 3)...)...), 41},
		{"a zero gap first in a word", append(append([]byte{5}, ones(8, 3)...), append([]byte{0}, ones(31, 3)...)...), 41},
		{"a zero gap last in a word", append(append([]byte{5}, ones(7, 3)...), append([]byte{0}, ones(32, 3)...)...), 41},
		{"two-byte gaps", append([]byte{5}, bytes.Repeat([]byte{0x81, 0x01}, 20)...), 21},
		{"a zero two-byte gap", append(append([]byte{5}, bytes.Repeat([]byte{0x81, 0x01}, 10)...), append([]byte{0x80, 0x00}, bytes.Repeat([]byte{0x81, 0x01}, 9)...)...), 21},
		{"a zero two-byte gap first in a word", append(append([]byte{5}, bytes.Repeat([]byte{0x81, 0x01}, 8)...), append([]byte{0x80, 0x00}, bytes.Repeat([]byte{0x81, 0x01}, 11)...)...), 21},
		{"a needlessly long gap", append(append([]byte{5}, ones(10, 1)...), append([]byte{0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}, ones(20, 1)...)...), 32},
		{"a five-byte gap", append(append([]byte{5}, ones(10, 1)...), append([]byte{0xff, 0xff, 0xff, 0xff, 0x0f}, ones(20, 1)...)...), 32},
		{"a gap of 2^32", append(append([]byte{0}, ones(10, 1)...), append([]byte{0x80, 0x80, 0x80, 0x80, 0x10}, ones(20, 1)...)...), 32},
		{"past 32 bits in a word", append([]byte{0xf0, 0xff, 0xff, 0xff, 0x0f}, ones(40, 1)...), 41},
		{"just below 32 bits", append([]byte{0xd7, 0xff, 0xff, 0xff, 0x0f}, ones(40, 1)...), 41},
		{"a byte left over", append([]byte{5}, ones(41, 3)...), 41},
		{"a byte short", append([]byte{5}, ones(39, 3)...), 41},
	}
	for _, tc := range cases {
		want, wantOK := specStream(tc.stream, tc.count, math.MaxUint32)
		out := make([]byte, 4*tc.count)
		ok := expand32(out, tc.stream)
		if ok != wantOK {
			t.Errorf("%s: expand32 %v, spec %v", tc.name, ok, wantOK)
			continue
		}
		if ok {
			got := make([]uint64, tc.count)
			for i := range got {
				got[i] = uint64(binary.BigEndian.Uint32(out[4*i:]))
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s: expand32 %v, spec %v", tc.name, got, want)
			}
		}
	}
}

// FuzzExpandStream feeds expand32 and expand64 arbitrary streams: they
// must accept exactly what the spec accepts and give the same references.
func FuzzExpandStream(f *testing.F) {
	for i, v := range [][]byte{postingsRuns(400, 1), sparseList(400, 2), consecutive(100), u64Postings(20, 3)} {
		pl, _ := detectPostings(v)
		stream := make([]byte, pl.streamLen)
		putStream(stream, v, pl.layout)
		f.Add(stream, uint16(len(v)/4-i%2))
	}
	f.Fuzz(func(t *testing.T, stream []byte, count uint16) {
		n := int(count % 2048)
		for _, width := range []int{4, 8} {
			top := uint64(math.MaxUint32)
			if width == 8 {
				top = math.MaxUint64
			}
			want, wantOK := specStream(stream, n, top)
			out := make([]byte, width*n)
			var ok bool
			if width == 4 {
				ok = expand32(out, stream)
			} else {
				ok = expand64(out, stream)
			}
			if ok != wantOK {
				t.Fatalf("width %d, %d references: decoder %v, spec %v", width, n, ok, wantOK)
			}
			if !ok {
				continue
			}
			for i, r := range want {
				var got uint64
				if width == 4 {
					got = uint64(binary.BigEndian.Uint32(out[4*i:]))
				} else {
					got = binary.BigEndian.Uint64(out[8*i:])
				}
				if got != r {
					t.Fatalf("width %d, reference %d: decoder %d, spec %d", width, i, got, r)
				}
			}
		}
	})
}
