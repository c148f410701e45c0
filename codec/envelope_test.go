package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"testing"

	"github.com/golang/snappy"
)

func newTestCodec(t testing.TB, edit func(*Config)) *Codec {
	t.Helper()
	cfg := Config{FlagBit: DefaultFlagBit, Prefixes: DefaultPrefixes, MinSize: 64, MinSavings: 0.1, Postings: true}
	if edit != nil {
		edit(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var (
	testKey      = []byte("P2:tenant-1:01JD6Y3K4Q8ZJ5X0W7N2M9B1C3:X19uYW1lX186dXA")
	rewrittenKey = []byte("E2:" + string(bytes.Repeat([]byte("team_a|"), 60)) + ":01JD6Y3K4Q8ZJ5X0W7N2M9B1C3:all")
)

var testFlags = []uint32{0, 1, 42, 0x200000, 1 << DefaultFlagBit, 1<<DefaultFlagBit | 1, 0x7fffffff, 0x80000000, 0xbfffffff, math.MaxUint32}

func testValues() map[string][]byte {
	return map[string][]byte{
		"empty":            {},
		"one byte":         {0},
		"short text":       []byte("hello, world"),
		"series 4 KiB":     seriesPayload(4<<10, 1),
		"repetitive 1 KiB": bytes.Repeat([]byte("abcd"), 256),
		"raw postings":     postingsPayload(2<<10, 2),
		"mimir dm":         mimirPostingsPayload(1<<10, 3),
	}
}

// codecOf returns the codec id of an envelope.
func codecOf(stored []byte) byte { return stored[0] & codecMask }

// reseal recomputes an envelope's checksum after a test changed it on
// purpose, so that a later check is the one that must refuse it.
func reseal(c *Codec, storedFlags uint32, key, stored []byte) []byte {
	binary.LittleEndian.PutUint32(stored[crcOffset:], checksum(c.clientFlags(storedFlags, stored[0]), key, stored, nil))
	return stored
}

func mustDecodeTo(t *testing.T, c *Codec, key []byte, bind bool, storedFlags uint32, stored, want []byte, wantFlags uint32) {
	t.Helper()
	got, flags, err := c.AppendDecode(nil, key, bind, storedFlags, stored)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("decoded %d bytes %.40x, want %d bytes %.40x", len(got), got, len(want), want)
	}
	if flags != wantFlags {
		t.Fatalf("decoded flags %#x, want %#x", flags, wantFlags)
	}
}

func TestClientFlagsAndValueComeBackExactly(t *testing.T) {
	c := newTestCodec(t, nil)
	for name, v := range testValues() {
		for _, flags := range testFlags {
			for _, bind := range []bool{false, true} {
				key := testKey
				if bind {
					key = rewrittenKey
				}
				t.Run(fmt.Sprintf("%s/flags=%#x/bind=%v", name, flags, bind), func(t *testing.T) {
					stored, sf := c.AppendEncode(nil, key, bind, flags, v)
					if !c.IsEnveloped(sf) {
						t.Fatalf("stored flags %#x lack the reserved bit", sf)
					}
					mustDecodeTo(t, c, key, bind, sf, stored, v, flags)
				})
			}
		}
	}
}

func TestCompressionPolicy(t *testing.T) {
	c := newTestCodec(t, nil)
	series := seriesPayload(4<<10, 7)
	cases := []struct {
		name  string
		c     *Codec
		value []byte
		codec byte
	}{
		{"compressible series are stored with snappy", c, series, CodecSnappy},
		{"a value below the minimum size is stored as it is", c, bytes.Repeat([]byte{'a'}, 63), CodecNone},
		{"a value at the minimum size is compressed", c, bytes.Repeat([]byte{'a'}, 64), CodecSnappy},
		{"raw postings, which snappy cannot shrink, are stored as they are", c, postingsPayload(4<<10, 7), CodecNone},
		{"savings under the threshold are not worth it", newTestCodec(t, func(cfg *Config) { cfg.MinSavings = 0.99 }), series, CodecNone},
		{"min savings 1 never compresses", newTestCodec(t, func(cfg *Config) { cfg.MinSavings = 1 }), bytes.Repeat([]byte{'a'}, 4096), CodecNone},
		{"min savings 0 compresses whenever a byte is saved", newTestCodec(t, func(cfg *Config) { cfg.MinSavings = 0 }), series, CodecSnappy},
	}
	compressed := map[string][]byte{
		"mimir dm":             mimirPostingsPayload(4<<10, 1),
		"mimir dvs":            append([]byte("dvs"), bytes.Repeat([]byte{'x'}, 4096)...),
		"thanos dss":           append([]byte("dss\xff\x06\x00\x00sNaPpY"), bytes.Repeat([]byte{'x'}, 4096)...),
		"snappy framed stream": append([]byte("\xff\x06\x00\x00sNaPpY"), bytes.Repeat([]byte{'x'}, 4096)...),
		"gzip":                 append([]byte{0x1f, 0x8b, 0x08}, bytes.Repeat([]byte{'x'}, 4096)...),
		"zstd":                 append([]byte{0x28, 0xb5, 0x2f, 0xfd}, bytes.Repeat([]byte{'x'}, 4096)...),
		"lz4 frame":            append([]byte{0x04, 0x22, 0x4d, 0x18}, bytes.Repeat([]byte{'x'}, 4096)...),
	}
	for name, v := range compressed {
		cases = append(cases, struct {
			name  string
			c     *Codec
			value []byte
			codec byte
		}{"already compressed " + name + " is stored as it is", c, v, CodecNone})
	}
	// Magic bytes only count in full: "ds" followed by no framing is text.
	cases = append(cases, struct {
		name  string
		c     *Codec
		value []byte
		codec byte
	}{"dss without snappy framing is compressed", c, append([]byte("dss"), bytes.Repeat([]byte{'x'}, 4096)...), CodecSnappy})

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stored, sf := tc.c.AppendEncode(nil, testKey, false, 0, tc.value)
			if got := codecOf(stored); got != tc.codec {
				t.Fatalf("codec %d, want %d (%d bytes stored for %d)", got, tc.codec, len(stored), len(tc.value))
			}
			if tc.codec == CodecNone && len(stored) != headerLen(false, len(tc.value))+len(tc.value) {
				t.Fatalf("stored %d bytes for %d: more than the header", len(stored), len(tc.value))
			}
			mustDecodeTo(t, tc.c, testKey, false, sf, stored, tc.value, 0)
		})
	}
}

func headerLen(bind bool, n int) int {
	h := bindOffset + uvarintLen(uint64(n))
	if bind {
		h += bindingLen
	}
	return h
}

func TestHeaderIsCompact(t *testing.T) {
	c := newTestCodec(t, nil)
	for _, tc := range []struct {
		n          int
		plain, key int
	}{
		{0, 6, 22}, {127, 6, 22}, {128, 7, 23}, {16383, 7, 23}, {16384, 8, 24}, {2<<20 - 1, 8, 24}, {2 << 20, 9, 25},
	} {
		v := postingsPayload(tc.n+4, 1)[:tc.n] // incompressible: stored as it is
		for _, bind := range []bool{false, true} {
			stored, _ := c.AppendEncode(nil, testKey, bind, math.MaxUint32, v)
			want := tc.plain
			if bind {
				want = tc.key
			}
			if got := len(stored) - tc.n; got != want {
				t.Errorf("%d-byte value, bind %v: header %d bytes, want %d", tc.n, bind, got, want)
			}
			if got := len(stored) - tc.n; got > MaxHeaderLen {
				t.Errorf("header %d exceeds MaxHeaderLen %d", got, MaxHeaderLen)
			}
		}
	}
}

func TestSnappyPayloadIsAPlainSnappyBlock(t *testing.T) {
	c := newTestCodec(t, nil)
	v := seriesPayload(8<<10, 3)
	stored, _ := c.AppendEncode(nil, testKey, false, 0, v)
	if codecOf(stored) != CodecSnappy {
		t.Fatal("not compressed")
	}
	got, err := snappy.Decode(nil, stored[bindOffset:])
	if err != nil || !bytes.Equal(got, v) {
		t.Fatalf("bytes after the checksum are not the snappy block of the value: %v", err)
	}
}

func TestEncodeAppendsAfterExistingBytes(t *testing.T) {
	c := newTestCodec(t, nil)
	for name, v := range testValues() {
		t.Run(name, func(t *testing.T) {
			prefix := []byte("VALUE x 0 0\r\n")
			alone, sf := c.AppendEncode(nil, testKey, true, 7, v)
			out, sf2 := c.AppendEncode(bytes.Clone(prefix), testKey, true, 7, v)
			if sf != sf2 || !bytes.HasPrefix(out, prefix) || !bytes.Equal(out[len(prefix):], alone) {
				t.Fatal("appending to a non-empty dst changed the envelope")
			}
			dec, _, err := c.AppendDecode(bytes.Clone(prefix), testKey, true, sf, alone)
			if err != nil || !bytes.HasPrefix(dec, prefix) || !bytes.Equal(dec[len(prefix):], v) {
				t.Fatalf("decoding after existing bytes: %v", err)
			}
		})
	}
}

func TestChecksumMatchesCRC32C(t *testing.T) {
	// checksum feeds the flags and header byte through the table by hand;
	// it must agree with hash/crc32 over the documented input.
	for _, bound := range []bool{false, true} {
		stored := make([]byte, 40)
		for i := range stored {
			stored[i] = byte(i * 7)
		}
		stored[0] = version << versionShift
		if bound {
			stored[0] |= bitBound
		}
		flags := uint32(0xdeadbeef)
		var in []byte
		in = binary.LittleEndian.AppendUint32(in, flags)
		if !bound {
			in = append(in, testKey...)
		}
		in = append(in, stored[0])
		in = append(in, stored[bindOffset:]...)
		if got, want := checksum(flags, testKey, stored, nil), crc32.Checksum(in, crc32.MakeTable(crc32.Castagnoli)); got != want {
			t.Fatalf("bound %v: checksum %#x, want %#x", bound, got, want)
		}
	}
}

func TestEveryRefusalHasItsReason(t *testing.T) {
	c := newTestCodec(t, nil)
	mask := c.FlagMask()
	plainV := []byte("a value that stays as it is")
	snapV := seriesPayload(2<<10, 5)
	enc := func(key []byte, bind bool, v []byte) ([]byte, uint32) {
		return c.AppendEncode(nil, key, bind, 0, v)
	}
	plain, pf := enc(testKey, false, plainV)
	snap, sf := enc(testKey, false, snapV)
	bound, bf := enc(rewrittenKey, true, plainV)
	if codecOf(plain) != CodecNone || codecOf(snap) != CodecSnappy {
		t.Fatal("fixtures use the wrong codecs")
	}
	edit := func(stored []byte, f func([]byte) []byte) []byte { return f(bytes.Clone(stored)) }

	cases := []struct {
		name  string
		key   []byte
		bind  bool
		flags uint32
		data  []byte
		want  error
	}{
		{"flags without the reserved bit", testKey, false, pf &^ mask, plain, ErrBadHeader},
		{"empty item", testKey, false, pf, nil, ErrBadHeader},
		{"shorter than a header", testKey, false, pf, plain[:5], ErrBadHeader},
		{"binding but no length", rewrittenKey, true, bf, bound[:bindOffset+bindingLen], ErrBadHeader},
		{"unterminated length", testKey, false, pf, edit(plain, func(s []byte) []byte {
			return append(s[:bindOffset], 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
		}), ErrBadHeader},
		{"length over 32 bits", testKey, false, pf, edit(plain, func(s []byte) []byte {
			return reseal(c, pf, testKey, binary.AppendUvarint(s[:bindOffset], 1<<32))
		}), ErrBadHeader},
		{"version 0", testKey, false, pf, edit(plain, func(s []byte) []byte { s[0] &^= 0xc0; return s }), ErrBadVersion},
		{"version 2", testKey, false, pf, edit(plain, func(s []byte) []byte { s[0] = s[0]&^0xc0 | 2<<versionShift; return s }), ErrBadVersion},
		{"version 3", testKey, false, pf, edit(plain, func(s []byte) []byte { s[0] |= 0xc0; return s }), ErrBadVersion},
		{"bound envelope read for a key that was not rewritten", rewrittenKey, false, bf, bound, ErrKeyMismatch},
		{"unbound envelope read for a rewritten key", testKey, true, pf, plain, ErrKeyMismatch},
		{"bound envelope read for another key", append(bytes.Clone(rewrittenKey), 'x'), true, bf, bound, ErrKeyMismatch},
		{"changed payload byte", testKey, false, pf, edit(plain, func(s []byte) []byte { s[len(s)-1] ^= 1; return s }), ErrChecksumMismatch},
		{"changed checksum byte", testKey, false, pf, edit(plain, func(s []byte) []byte { s[crcOffset] ^= 1; return s }), ErrChecksumMismatch},
		{"changed upstream flags", testKey, false, pf | 1, plain, ErrChecksumMismatch},
		{"unbound envelope read for another key", []byte("P2:tenant-2:x"), false, pf, plain, ErrChecksumMismatch},
		{"codec 4 (not yet known)", testKey, false, pf, edit(plain, func(s []byte) []byte { s[0] |= 4; return reseal(c, pf, testKey, s) }), ErrUnknownCodec},
		{"codec 15", testKey, false, pf, edit(plain, func(s []byte) []byte { s[0] |= 15; return reseal(c, pf, testKey, s) }), ErrUnknownCodec},
		{"plain value longer than recorded", testKey, false, pf, edit(plain, func(s []byte) []byte { return reseal(c, pf, testKey, append(s, 'x')) }), ErrLengthMismatch},
		{"plain value shorter than recorded", testKey, false, pf, edit(plain, func(s []byte) []byte { return reseal(c, pf, testKey, s[:len(s)-1]) }), ErrLengthMismatch},
		{"snappy length beyond what the payload can hold", testKey, false, sf, edit(snap, func(s []byte) []byte {
			body := s[bindOffset+uvarintLen(uint64(len(snapV))):]
			s = binary.AppendUvarint(s[:bindOffset], uint64(len(body))*snappyMaxExpansion+1)
			return reseal(c, sf, testKey, append(s, body...))
		}), ErrLengthMismatch},
		{"snappy length one more than the block", testKey, false, sf, edit(snap, func(s []byte) []byte {
			body := s[bindOffset+uvarintLen(uint64(len(snapV))):]
			s = binary.AppendUvarint(s[:bindOffset], uint64(len(snapV)+1))
			return reseal(c, sf, testKey, append(s, body...))
		}), ErrDecodeError},
		{"snappy block that is not one", testKey, false, sf, edit(snap, func(s []byte) []byte {
			s = binary.AppendUvarint(s[:bindOffset], 100)
			return reseal(c, sf, testKey, append(s, 0xfe, 0xff, 0xff, 0xff, 0xff))
		}), ErrDecodeError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dst := []byte("keep")
			out, flags, err := c.AppendDecode(dst, tc.key, tc.bind, tc.flags, tc.data)
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if ReasonOf(err) != ReasonOf(tc.want) {
				t.Fatalf("reason %v, want %v", ReasonOf(err), ReasonOf(tc.want))
			}
			if string(out) != "keep" || flags != 0 {
				t.Fatalf("refusal returned %q, flags %#x; want dst untouched", out, flags)
			}
		})
	}
	seen := map[Reason]bool{}
	for _, tc := range cases {
		seen[ReasonOf(tc.want)] = true
	}
	for _, r := range Reasons() {
		if !seen[r] {
			t.Errorf("reason %v has no test", r)
		}
	}
}

func TestReasonNames(t *testing.T) {
	want := []string{"bad_header", "bad_version", "key_mismatch", "checksum_mismatch", "unknown_codec", "length_mismatch", "decode_error"}
	rs := Reasons()
	if len(rs) != len(want) {
		t.Fatalf("%d reasons, want %d", len(rs), len(want))
	}
	for i, r := range rs {
		if r.String() != want[i] {
			t.Errorf("reason %d is %q, want %q", i, r, want[i])
		}
	}
	damaged := map[Reason]bool{ReasonBadHeader: true, ReasonChecksumMismatch: true, ReasonLengthMismatch: true, ReasonDecodeError: true}
	for _, r := range rs {
		if r.Damaged() != damaged[r] {
			t.Errorf("%v: Damaged() = %v; only unreadable items may be deleted", r, r.Damaged())
		}
	}
	if Reason(0).String() != "unknown" || ReasonOf(errors.New("x")) != 0 {
		t.Error("a non-reason must not name one")
	}
	if ReasonOf(fmt.Errorf("wrapped: %w", ErrKeyMismatch)) != ReasonKeyMismatch {
		t.Error("a wrapped refusal lost its reason")
	}
}

// fixtures returns envelopes of every shape: each codec, bound or not,
// empty, and client flags that use the reserved bit.
type fixture struct {
	name  string
	key   []byte
	bind  bool
	flags uint32
	value []byte
}

func fixtures() []fixture {
	return []fixture{
		{"empty value", testKey, false, 0, nil},
		{"short plain value", testKey, false, 0, []byte("hello")},
		{"short plain value, bound", rewrittenKey, true, 3, []byte("hello")},
		{"raw postings", testKey, false, math.MaxUint32, postingsPayload(600, 1)},
		{"snappy series", testKey, false, 0, seriesPayload(3<<10, 1)},
		{"snappy series, bound, reserved flag", rewrittenKey, true, 1<<DefaultFlagBit | 5, seriesPayload(3<<10, 2)},
		{"mimir dm, bound", rewrittenKey, true, 0, mimirPostingsPayload(300, 1)},
	}
}

func TestNoSingleByteChangeDecodes(t *testing.T) {
	c := newTestCodec(t, nil)
	for _, fx := range fixtures() {
		t.Run(fx.name, func(t *testing.T) {
			stored, sf := c.AppendEncode(nil, fx.key, fx.bind, fx.flags, fx.value)
			mustDecodeTo(t, c, fx.key, fx.bind, sf, stored, fx.value, fx.flags)
			bad := bytes.Clone(stored)
			dst := make([]byte, 0, len(fx.value)+1)
			for i := range bad {
				orig := bad[i]
				for x := 1; x < 256; x++ {
					bad[i] = orig ^ byte(x)
					if _, _, err := c.AppendDecode(dst, fx.key, fx.bind, sf, bad); err == nil {
						t.Fatalf("byte %d changed %#02x -> %#02x and the envelope still decoded", i, orig, bad[i])
					}
				}
				bad[i] = orig
			}
			// The upstream flags are checksummed too: any change that
			// keeps the reserved bit is refused, and one that drops it
			// is not an envelope.
			for i := 0; i < 4; i++ {
				for x := 1; x < 256; x++ {
					f := sf ^ uint32(x)<<(8*i)
					if _, _, err := c.AppendDecode(dst, fx.key, fx.bind, f, stored); err == nil {
						t.Fatalf("flags %#x -> %#x and the envelope still decoded", sf, f)
					}
				}
			}
		})
	}
}

func TestTruncatedOrExtendedEnvelopeNeverDecodes(t *testing.T) {
	c := newTestCodec(t, nil)
	for _, fx := range fixtures() {
		t.Run(fx.name, func(t *testing.T) {
			stored, sf := c.AppendEncode(nil, fx.key, fx.bind, fx.flags, fx.value)
			for n := 0; n < len(stored); n++ {
				if _, _, err := c.AppendDecode(nil, fx.key, fx.bind, sf, stored[:n]); err == nil {
					t.Fatalf("envelope cut to %d of %d bytes still decoded", n, len(stored))
				}
			}
			for _, tail := range [][]byte{{0}, {1}, []byte("xyz"), stored} {
				long := append(bytes.Clone(stored), tail...)
				if _, _, err := c.AppendDecode(nil, fx.key, fx.bind, sf, long); err == nil {
					t.Fatalf("envelope with %d extra bytes still decoded", len(tail))
				}
			}
		})
	}
}

func TestValueBoundToOneKeyNeverDecodesUnderAnother(t *testing.T) {
	c := newTestCodec(t, nil)
	for _, fx := range fixtures() {
		t.Run(fx.name, func(t *testing.T) {
			stored, sf := c.AppendEncode(nil, fx.key, fx.bind, fx.flags, fx.value)
			others := [][]byte{
				nil,
				append(bytes.Clone(fx.key), 'x'),
				fx.key[:len(fx.key)-1],
				fx.key[1:],
				[]byte("P2:tenant-2:01JD6Y3K4Q8ZJ5X0W7N2M9B1C3:X19uYW1lX186dXA"),
			}
			for i := range fx.key {
				k := bytes.Clone(fx.key)
				k[i] ^= 0x20
				others = append(others, k)
			}
			for _, other := range others {
				for _, bind := range []bool{false, true} {
					if _, _, err := c.AppendDecode(nil, other, bind, sf, stored); err == nil {
						t.Fatalf("written for %q, decoded for %q (bind %v)", fx.key, other, bind)
					}
				}
			}
			// The same key read with the wrong idea of whether it was
			// rewritten is refused as well.
			if _, _, err := c.AppendDecode(nil, fx.key, !fx.bind, sf, stored); !errors.Is(err, ErrKeyMismatch) {
				t.Fatalf("bind %v envelope read with bind %v: %v, want key mismatch", fx.bind, !fx.bind, err)
			}
		})
	}
}

func TestCodecReservingAnotherBitNeverReturnsWrongFlags(t *testing.T) {
	// An envelope written under bit 30 whose client flags carry bit 29 looks
	// like an envelope to a codec reserving bit 29. That codec must then
	// either give back the client's exact flags or refuse the item.
	a := newTestCodec(t, nil)
	b := newTestCodec(t, func(cfg *Config) { cfg.FlagBit = 29 })
	for _, flags := range []uint32{1 << 29, 1<<29 | 1<<30, 1<<29 | 7, math.MaxUint32} {
		stored, sf := a.AppendEncode(nil, testKey, false, flags, []byte("v"))
		v, got, err := b.AppendDecode(nil, testKey, false, sf, stored)
		if err == nil && (got != flags || string(v) != "v") {
			t.Fatalf("client flags %#x came back as %#x under another bit", flags, got)
		}
	}
}

func TestShouldEnvelope(t *testing.T) {
	c := newTestCodec(t, nil)
	for _, tc := range []struct {
		key   string
		flags uint32
		want  bool
	}{
		{"P2:t:b:x", 0, true},
		{"E2:t:b:x:all", 0, true},
		{"SP2:t:b:all:x", 0, true},
		{"P:b:x:dss", 0, true},
		{"E:t:b", 0, true},
		{"EP:b:x:dss", 0, true},
		{"SP:t:b", 0, true},
		{"S:t:b:123", 0, false},
		{"LN:t:b:x", 0, false},
		{"p2:t:b:x", 0, false},
		{"", 0, false},
		{"S:t:b:123", 1 << DefaultFlagBit, true},
		{"S:t:b:123", 0xbfffffff, false},
		{"S:t:b:123", math.MaxUint32, true},
	} {
		if got := c.ShouldEnvelope([]byte(tc.key), tc.flags); got != tc.want {
			t.Errorf("ShouldEnvelope(%q, %#x) = %v, want %v", tc.key, tc.flags, got, tc.want)
		}
	}
	none := newTestCodec(t, func(cfg *Config) { cfg.Prefixes = nil })
	if none.ShouldEnvelope([]byte("P2:t:b:x"), 0) {
		t.Error("with no prefixes, a postings key was enveloped")
	}
	s := newTestCodec(t, func(cfg *Config) { cfg.Prefixes = append(append([]string(nil), DefaultPrefixes...), "S:") })
	if !s.ShouldEnvelope([]byte("S:t:b:123"), 0) {
		t.Error("an added S: prefix did not envelope series")
	}
}

func TestAllocations(t *testing.T) {
	c := newTestCodec(t, nil)
	for _, v := range [][]byte{seriesPayload(16<<10, 1), seriesPayload(200<<10, 1), postingsPayload(16<<10, 1), postingsPayload(200<<10, 1), []byte("short")} {
		for _, bind := range []bool{false, true} {
			key := testKey
			if bind {
				key = rewrittenKey
			}
			stored, sf := c.AppendEncode(nil, key, bind, 9, v)
			if len(stored) > len(v)+MaxHeaderLen || len(stored) > MaxEncodedLen(len(v)) {
				t.Fatalf("%d bytes stored for %d, beyond the documented bounds", len(stored), len(v))
			}
			name := fmt.Sprintf("codec %d, %d bytes, bind %v", codecOf(stored), len(v), bind)
			encBuf := make([]byte, 0, MaxEncodedLen(len(v)))
			decBuf := make([]byte, 0, len(v))
			if n := testing.AllocsPerRun(20, func() { c.AppendEncode(encBuf, key, bind, 9, v) }); n != 0 {
				t.Errorf("%s: encode into a roomy buffer allocated %v times", name, n)
			}
			if n := testing.AllocsPerRun(20, func() { c.AppendEncode(nil, key, bind, 9, v) }); n != 1 {
				t.Errorf("%s: encode into nil allocated %v times, want 1", name, n)
			}
			if n := testing.AllocsPerRun(20, func() { c.AppendDecode(decBuf, key, bind, sf, stored) }); n != 0 {
				t.Errorf("%s: decode into a roomy buffer allocated %v times", name, n)
			}
			if n := testing.AllocsPerRun(20, func() { c.AppendDecode(nil, key, bind, sf, stored) }); n != 1 {
				t.Errorf("%s: decode into nil allocated %v times, want 1", name, n)
			}
			bad := bytes.Clone(stored)
			bad[len(bad)-1] ^= 1
			if n := testing.AllocsPerRun(20, func() { c.AppendDecode(nil, key, bind, sf, bad) }); n != 0 {
				t.Errorf("%s: refusing allocated %v times", name, n)
			}
		}
	}
}

func TestDecodeSizesOutputFromRecordedLength(t *testing.T) {
	c := newTestCodec(t, nil)
	v := seriesPayload(64<<10, 4)
	stored, sf := c.AppendEncode(nil, testKey, false, 0, v)
	out, _, err := c.AppendDecode(nil, testKey, false, sf, stored)
	if err != nil {
		t.Fatal(err)
	}
	if cap(out) != len(v) {
		t.Fatalf("output capacity %d for a %d-byte value: not sized once from the header", cap(out), len(v))
	}
	odd := postingsPayload(1000, 1)[:999] // stored as it is
	stored, sf = c.AppendEncode(nil, testKey, false, 0, odd)
	out, _, err = c.AppendDecode(nil, testKey, false, sf, stored)
	if err != nil || cap(out) != len(odd) {
		t.Fatalf("plain value: capacity %d for %d bytes (%v)", cap(out), len(odd), err)
	}
}

func crc32c(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }

func TestLargeValuesCompressAsSnappyEncodeDoes(t *testing.T) {
	// Values over one snappy block are compressed a block at a time; the
	// result must still be exactly snappy.Encode's, whatever the length
	// prefix's size.
	c := newTestCodec(t, nil)
	for _, n := range []int{snappyBlock + 1, snappyBlock + 17, 100_000, 2*snappyBlock + 3, 1<<21 - 1, 1 << 21, 1<<21 + 12345} {
		v := seriesPayload(n, uint64(n))
		stored, sf := c.AppendEncode(nil, testKey, false, 0, v)
		if codecOf(stored) != CodecSnappy {
			t.Fatalf("%d bytes: not compressed", n)
		}
		if want := snappy.Encode(nil, v); !bytes.Equal(stored[bindOffset:], want) {
			t.Fatalf("%d bytes: envelope payload differs from snappy.Encode", n)
		}
		mustDecodeTo(t, c, testKey, false, sf, stored, v, 0)
	}
}

func TestIncompressibleFirstBlockGivesUpEarly(t *testing.T) {
	c := newTestCodec(t, nil)
	// A value whose first 64 KiB do not compress is stored as it is, even
	// if the rest would.
	v := append(postingsPayload(snappyBlock, 1), bytes.Repeat([]byte("x"), 1<<20)...)
	stored, sf := c.AppendEncode(nil, testKey, false, 0, v)
	if codecOf(stored) != CodecNone {
		t.Fatal("compressed although the first block saves nothing")
	}
	mustDecodeTo(t, c, testKey, false, sf, stored, v, 0)
	// One whose first block compresses but the whole does not save enough
	// is still stored as it is.
	v = append(bytes.Repeat([]byte("x"), snappyBlock), postingsPayload(1<<20, 2)...)
	stored, sf = c.AppendEncode(nil, testKey, false, 0, v)
	if codecOf(stored) != CodecNone {
		t.Fatalf("compressed to %d of %d bytes, under the 10%% savings", len(stored), len(v))
	}
	mustDecodeTo(t, c, testKey, false, sf, stored, v, 0)
}

// TestDecodeRefusesValuesOverTheMaximum checks that an envelope recording a
// value longer than Config.MaxValueSize is refused without allocating for
// it: a postings payload can record many times its stored size, and such an
// item can only have been forged, since the proxy never envelopes values
// that long.
func TestDecodeRefusesValuesOverTheMaximum(t *testing.T) {
	value := postingsRuns(100_000, 1) // stores at a fraction of its size
	writer := newTestCodec(t, nil)
	stored, sf := writer.AppendEncodePostings(nil, testKey, false, 0, value)
	if len(stored)*4 > len(value) {
		t.Fatalf("stored %d of %d bytes: the test needs a value that compresses", len(stored), len(value))
	}
	reader := newTestCodec(t, func(cfg *Config) { cfg.MaxValueSize = len(value) - 1 })
	var err error
	allocs := testing.AllocsPerRun(10, func() {
		_, _, err = reader.AppendDecode(nil, testKey, false, sf, stored)
	})
	if !errors.Is(err, ErrLengthMismatch) || allocs != 0 {
		t.Errorf("decode over the maximum: err %v, %v allocations; want %v and none", err, allocs, ErrLengthMismatch)
	}
	exact := newTestCodec(t, func(cfg *Config) { cfg.MaxValueSize = len(value) })
	if got, _, err := exact.AppendDecode(nil, testKey, false, sf, stored); err != nil || !bytes.Equal(got, value) {
		t.Errorf("decode at the maximum: %v", err)
	}
}

// TestDecodeInPlaceAgreesWithDecode: AppendDecodeInPlace gives what
// AppendDecode gives for every fixture, a value stored as it is as the
// very bytes of the envelope (and nothing appended), any other decoded;
// and it refuses every single-byte change AppendDecode refuses.
func TestDecodeInPlaceAgreesWithDecode(t *testing.T) {
	c := newTestCodec(t, nil)
	placed := 0
	for _, fx := range fixtures() {
		t.Run(fx.name, func(t *testing.T) {
			stored, sf := c.AppendEncode(nil, fx.key, fx.bind, fx.flags, fx.value)
			dst := []byte("before")
			got, flags, inPlace, err := c.AppendDecodeInPlace(dst, fx.key, fx.bind, sf, stored)
			if err != nil || flags != fx.flags {
				t.Fatalf("decode: %v, flags %#x want %#x", err, flags, fx.flags)
			}
			if inPlace != (codecOf(stored) == CodecNone) {
				t.Fatalf("in place %v for codec %d", inPlace, codecOf(stored))
			}
			if inPlace {
				placed++
				if !bytes.Equal(got, fx.value) || len(got) > 0 && &got[0] != &stored[len(stored)-len(got)] {
					t.Fatal("a value stored as it is did not come back as the envelope's own bytes")
				}
			} else if !bytes.Equal(got, append([]byte("before"), fx.value...)) {
				t.Fatalf("decoded %.40q", got)
			}
			bad := bytes.Clone(stored)
			for i := range bad {
				bad[i] ^= 0x55
				if _, _, _, err := c.AppendDecodeInPlace(nil, fx.key, fx.bind, sf, bad); err == nil {
					t.Fatalf("byte %d changed and the envelope still decoded in place", i)
				}
				bad[i] ^= 0x55
			}
		})
	}
	if placed == 0 {
		t.Error("no fixture is stored as it is: the in-place path was not tested")
	}
}
