package codec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/golang/snappy"
)

// TestPackedHandCheckedVector spells a codec-3 envelope out byte by byte,
// as the package doc describes it, independently of the encoder: 33
// references from 1000, gaps of 3 but one of 50.
func TestPackedHandCheckedVector(t *testing.T) {
	c := postingsCodec(t)
	refs := []uint32{1000}
	for i := 0; i < 32; i++ {
		gap := uint32(3)
		if i == 10 {
			gap = 50
		}
		refs = append(refs, refs[i]+gap)
	}
	v := u32s(refs...)
	stored, sf := c.AppendEncodePostings(nil, []byte("k"), false, 1, v)
	// Header 0x43 (version 1, codec 3), CRC, length 132 (0x84 0x01),
	// form 1 (u32, raw stream), first reference 1000 (0xe8 0x07), then
	// one block: 0xc0 (order 2, exceptions, width 0), 3 exceptions at
	// positions 0, 10 and 11, whose values are the zigzag differences
	// from the gap before: 3-1 = 2 (4), 50-3 = 47 (94), 3-50 = -47 (93).
	body := []byte{0x84, 0x01, 0x01, 0xe8, 0x07, 0xc0, 3, 0, 10, 11, 4, 94, 93}
	crc := crc32c(append([]byte{1, 0, 0, 0, 'k', 0x43}, body...))
	want := append([]byte{0x43, byte(crc), byte(crc >> 8), byte(crc >> 16), byte(crc >> 24)}, body...)
	if !bytes.Equal(stored, want) || sf != 0x40000001 {
		t.Fatalf("got %#08x % x, want 0x40000001 % x", sf, stored, want)
	}
	mustDecodeTo(t, c, []byte("k"), false, sf, stored, v, 1)
}

func TestShortListsTakeCodec3(t *testing.T) {
	// The packed stream of a short list is as short as its uvarint
	// stream: a list of one reference is its uvarint, and needs no more
	// room than codec 2 would.
	c := postingsCodec(t)
	for name, v := range map[string][]byte{
		"tsdb count 0": u32s(0),
		"tsdb one":     tsdbList(42),
		"u32 one":      u32s(42),
		"tsdb three":   tsdbList(5, 6, 200),
	} {
		stored, sf := c.AppendEncodePostings(nil, testKey, false, 0, v)
		if id := codecOf(stored); id != CodecPostingsPacked && id != CodecNone {
			t.Errorf("%s: codec %d, want %d (or none when nothing is saved)", name, id, CodecPostingsPacked)
		}
		mustDecodeTo(t, c, testKey, false, sf, stored, v, 0)
	}
}

func TestPackedRefusals(t *testing.T) {
	c := postingsCodec(t)
	key := testKey
	// env builds a resealed codec-3 envelope of recorded length n.
	env := func(n uint64, payload ...byte) []byte {
		s := []byte{version<<versionShift | CodecPostingsPacked, 0, 0, 0, 0}
		s = binary.AppendUvarint(s, n)
		return reseal(c, c.mask, key, append(s, payload...))
	}
	u32 := func(b ...byte) []byte { return append([]byte{layoutU32}, b...) }
	// A full block of 33 references from 10 whose gaps are all one but
	// the exceptions given.
	patched := func(hdr byte, e byte, rest ...byte) []byte {
		return u32(append([]byte{10, hdr | blockPatched, e}, rest...)...)
	}
	cases := []struct {
		name   string
		stored []byte
		want   error
	}{
		{"no form byte", env(4), ErrDecodeError},
		{"unknown form bits", env(4, 0x08, 1), ErrDecodeError},
		{"u64 layout", env(8, layoutU64, 1), ErrDecodeError},
		{"layout 3", env(4, 0x03, 1), ErrDecodeError},
		{"length not a multiple of 4", env(6, u32(1, 0, 0)...), ErrLengthMismatch},
		{"no reference", env(0, u32()...), ErrLengthMismatch},
		{"tsdb of no reference with a stream", env(4, layoutTSDB, 1), ErrLengthMismatch},
		{"fewer stream bytes than blocks", env(4*100, u32(1, 0, 0)...), ErrLengthMismatch},
		{"width over 32", env(8, u32(1, 33)...), ErrDecodeError},
		{"packed bits cut short", env(12, u32(1, 8, 1)...), ErrDecodeError},
		{"bytes left over", env(8, u32(1, 0, 0)...), ErrDecodeError},
		{"first reference over 32 bits", env(4, u32(0x80, 0x80, 0x80, 0x80, 0x10)...), ErrDecodeError},
		{"reference over 32 bits", env(8, u32(0xff, 0xff, 0xff, 0xff, 0x0f, 0x00)...), ErrDecodeError},
		{"order-2 gap of zero", env(8, u32(1, blockOrder2|1, 1)...), ErrDecodeError},
		{"order-2 gap below zero", env(12, u32(1, blockOrder2|2, 0x0f)...), ErrDecodeError},
		{"exceptions at width 32", env(8, u32(1, blockPatched|32, 1, 0, 0, 0, 0, 0, 1)...), ErrDecodeError},
		{"no exceptions behind the flag", env(4*33, patched(0, 0)...), ErrDecodeError},
		{"more exceptions than values", env(12, u32(1, blockPatched, 3, 0, 1, 1, 1, 1)...), ErrDecodeError},
		{"exception positions not ascending", env(4*33, patched(0, 2, 5, 5, 1, 1)...), ErrDecodeError},
		{"exception position past the block", env(4*33, patched(0, 1, 32, 1)...), ErrDecodeError},
		{"exception of zero", env(4*33, patched(0, 1, 3, 0)...), ErrDecodeError},
		{"exception over 32 bits", env(4*33, patched(0, 1, 3, 0x80, 0x80, 0x80, 0x80, 0x10)...), ErrDecodeError},
		{"exception over five bytes", env(4*33, patched(0, 1, 3, 0x81, 0x80, 0x80, 0x80, 0x80, 0x00)...), ErrDecodeError},
		{"exception cut short", env(4*33, patched(0, 1, 3, 0x81)...), ErrDecodeError},
		{"exception past its width", env(4*33, patched(1, 1, 0, 0, 0, 0, 3, 0x80, 0x80, 0x80, 0x80, 0x08)...), ErrDecodeError},
		{"snappy stream that is not a block", env(8, layoutU32|streamSnappy, 0xfe, 0xff, 0xff, 0xff, 0xff), ErrDecodeError},
		{"snappy stream beyond what the block can hold", env(4*1000, append([]byte{layoutU32 | streamSnappy}, binary.AppendUvarint(nil, 1000)...)...), ErrLengthMismatch},
		{"snappy stream with a bad reference", env(8, append([]byte{layoutU32 | streamSnappy}, snappy.Encode(nil, []byte{1, blockOrder2 | 1, 1})...)...), ErrDecodeError},
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
	// Envelopes built the same way decode: the refusals above are for
	// what they name.
	mustDecodeTo(t, c, key, false, c.mask, env(12, u32(1, 0)...), u32s(1, 2, 3), 0)
	mustDecodeTo(t, c, key, false, c.mask, env(12, u32(1, blockOrder2|2, 0x08)...), u32s(1, 2, 4), 0)
	want := []uint32{10}
	for i := 0; i < 32; i++ {
		gap := uint32(1)
		if i == 3 {
			gap = 2
		}
		want = append(want, want[i]+gap)
	}
	mustDecodeTo(t, c, key, false, c.mask, env(4*33, patched(0, 1, 3, 1)...), u32s(want...), 0)
	// Width 1, the exception at position 3 carrying 2^30 above it: a
	// gap of 2^31+1.
	want = []uint32{10, 11, 12, 13, 13 + 1<<31 + 1}
	for len(want) < 33 {
		want = append(want, want[len(want)-1]+1)
	}
	mustDecodeTo(t, c, key, false, c.mask, env(4*33, patched(1, 1, 0, 0, 0, 0, 3, 0x80, 0x80, 0x80, 0x80, 0x04)...), u32s(want...), 0)
}

// specExpand decodes a codec-3 stream of count references the way the
// package doc states it, one bit at a time, with none of the decoder's
// shortcuts: what it accepts and what it gives must be what
// expandPacked accepts and gives.
func specExpand(stream []byte, count int) ([]uint32, bool) {
	if count == 0 {
		return nil, len(stream) == 0
	}
	first, k := binary.Uvarint(stream)
	if k <= 0 || first > math.MaxUint32 {
		return nil, false
	}
	stream = stream[k:]
	refs := []uint32{uint32(first)}
	x, gap := int64(first), int64(firstGap)
	for left := count - 1; left > 0; {
		n := min(blockLen, left)
		left -= n
		if len(stream) == 0 {
			return nil, false
		}
		hdr := stream[0]
		stream = stream[1:]
		w := int(hdr & blockWidth)
		if w > 32 {
			return nil, false
		}
		e := 0
		if hdr&blockPatched != 0 {
			if len(stream) == 0 || w == 32 {
				return nil, false
			}
			e = int(stream[0])
			stream = stream[1:]
			if e == 0 || e > n {
				return nil, false
			}
		}
		size := (n*w + 7) / 8
		if len(stream) < size {
			return nil, false
		}
		vals := make([]uint64, n)
		for i := range n {
			for b := 0; b < w; b++ {
				bit := i*w + b
				vals[i] |= uint64(stream[bit/8]>>(bit%8)&1) << b
			}
		}
		stream = stream[size:]
		if len(stream) < e {
			return nil, false
		}
		pos := stream[:e]
		stream = stream[e:]
		for i, p := range pos {
			if int(p) >= n || (i > 0 && p <= pos[i-1]) {
				return nil, false
			}
			h, k := binary.Uvarint(stream)
			if k <= 0 || k > 5 || h == 0 || h >= 1<<(32-w) {
				return nil, false
			}
			stream = stream[k:]
			vals[p] |= h << w
		}
		for _, v := range vals {
			if hdr&blockOrder2 != 0 {
				gap += int64(v>>1) ^ -int64(v&1)
			} else {
				gap = int64(v) + 1
			}
			x += gap
			if gap < 1 || x > math.MaxUint32 {
				return nil, false
			}
			refs = append(refs, uint32(x))
		}
	}
	return refs, len(stream) == 0
}

// FuzzPackedPostings builds a sorted list of 32-bit references from
// arbitrary bytes (read as uvarint gaps, each shifted left by up to 31
// bits so that every width occurs), and checks that the packed stream
// decodes to it under both expandPacked and the spec, that the envelope
// gives the list back byte for byte, and that a stream changed in one byte
// is accepted or refused alike by both, with the same references.
func FuzzPackedPostings(f *testing.F) {
	for i, v := range [][]byte{postingsPayload(400, 1), postingsRuns(600, 2), consecutive(70)[:200], {0, 0, 0, 0}, {0, 0, 0, 1, 0, 0, 0, 7}} {
		f.Add(v, byte(i), uint16(i*7), byte(1))
	}
	c := postingsCodec(f)
	f.Fuzz(func(t *testing.T, data []byte, shift byte, pos uint16, x byte) {
		list := listFromGaps(data, layoutU32)
		if s := shift % 32; s > 0 && len(list) > 0 {
			list = scaleGaps(list, s)
		}
		count := len(list) / 4
		if count == 0 {
			return
		}
		stream := make([]byte, binary.MaxVarintLen32+count*(2+4+5)+8)
		w, ok := putPacked(stream, list, layoutU32)
		if !ok {
			t.Fatalf("%d references did not fit in %d bytes", count, len(stream))
		}
		stream = stream[:w]
		refs, ok := specExpand(stream, count)
		if !ok || !bytes.Equal(u32s(refs...), list) {
			t.Fatalf("the spec reads the stream of %x as %v (%v)", list, refs, ok)
		}
		out := make([]byte, 4*count)
		if !expandPacked(out, stream) || !bytes.Equal(out, list) {
			t.Fatalf("stream of %x decoded to %x", list, out)
		}
		stored, sf := c.AppendEncodePostings(nil, testKey, false, 0, list)
		if got, _, err := c.AppendDecode(nil, testKey, false, sf, stored); err != nil || !bytes.Equal(got, list) {
			t.Fatalf("envelope round trip of %x: %v", list, err)
		}

		bad := bytes.Clone(stream)
		bad[int(pos)%len(bad)] ^= x
		refs, specOK := specExpand(bad, count)
		clear(out)
		gotOK := expandPacked(out, bad)
		if gotOK != specOK || (gotOK && !bytes.Equal(out, u32s(refs...))) {
			t.Fatalf("changed stream %x: decoder %v %x, spec %v %v", bad, gotOK, out, specOK, refs)
		}
	})
}

// scaleGaps multiplies every gap of a u32 list by 2^s, keeping the
// references that still fit in 32 bits.
func scaleGaps(list []byte, s byte) []byte {
	var out []byte
	x := uint64(binary.BigEndian.Uint32(list))
	prev := x
	out = binary.BigEndian.AppendUint32(out, uint32(x))
	for i := 4; i < len(list); i += 4 {
		r := uint64(binary.BigEndian.Uint32(list[i:]))
		x += (r - prev) << s
		prev = r
		if x > math.MaxUint32 {
			break
		}
		out = binary.BigEndian.AppendUint32(out, uint32(x))
	}
	return out
}
