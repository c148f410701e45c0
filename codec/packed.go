package codec

import (
	"encoding/binary"
	"math"
	"math/bits"

	"github.com/golang/snappy"
)

//go:generate go run ./internal/genunpack

// The packed postings codec (id 3) stores a raw postings list of 32-bit
// references (the tsdb and u32 layouts) so that it decodes at memory
// speed: after the first reference, the gaps go in blocks of 32, each
// bit-packed at the width that block needs, the few values wider than that
// patched in from a short list of exceptions. A block stores either the
// gaps less one (order 1, for scattered lists) or the differences between
// consecutive gaps, zigzag-encoded (order 2, for runs of equal or nearly
// equal gaps, as adjacent series entries of similar size give): a run of
// equal gaps costs no bits at all. Decoding a full block is one unrolled
// unpacking function per width, then one pass that adds and writes
// big-endian words into the output, which is sized once from the recorded
// length. The package doc has the byte layout.
const (
	// blockLen is the number of gaps in a full block.
	blockLen = 32

	// Block header byte: bits 5-0 the width, bit 6 exceptions follow,
	// bit 7 the values are order 2.
	blockWidth   = 0x3f
	blockPatched = 0x40
	blockOrder2  = 0x80

	// firstGap is the gap before the first one, from which order 2
	// counts: a list of consecutive references is order 2 at width 0
	// from its first block on.
	firstGap = 1
)

// packedSaves reports whether a snappy block of enc bytes is worth keeping
// over the packed stream of n bytes it compresses: only when it saves a
// quarter, as decompressing it costs more time than the bytes it saves.
func packedSaves(enc, n int) bool { return enc > 0 && enc <= n-n/4 }

// encodePacked writes the codec-3 form byte and stream of value, a list in
// the tsdb or u32 layout, into body, and returns how many bytes it wrote,
// or false when the stream does not fit in body's first room bytes. The
// snappy block of the stream is written behind it and replaces it only
// when packedSaves says so; body holds room plus maxSnappyLen(room).
func (c *Codec) encodePacked(body, value []byte, layout byte, room int) (int, bool) {
	body[0] = layout
	w, ok := putPacked(body[1:1+room], value, layout)
	if !ok {
		return 0, false
	}
	stream := body[1 : 1+w]
	block := body[1+w:]
	if enc := c.encodeSnappy(block, stream); packedSaves(enc, w) {
		copy(body[1:], block[:enc])
		body[0] |= streamSnappy
		return 1 + enc, true
	}
	return 1 + w, true
}

// putPacked writes the packed stream of a list of 32-bit references into
// out and returns its length, or false when it does not fit.
func putPacked(out, v []byte, layout byte) (int, bool) {
	if layout == layoutTSDB {
		v = v[4:]
	}
	count := len(v) / 4
	if count == 0 {
		return 0, true
	}
	prev := binary.BigEndian.Uint32(v)
	if uvarintLen32(prev) > len(out) {
		return 0, false
	}
	k := binary.PutUvarint(out, uint64(prev))
	gap := uint32(firstGap)
	var o1, o2 [blockLen]uint32
	for i := 1; i < count; i += blockLen {
		n := min(blockLen, count-i)
		order2 := true
		for j := range n {
			x := binary.BigEndian.Uint32(v[4*(i+j):])
			g := x - prev
			o1[j] = g - 1
			z := zigzag(int64(g) - int64(gap))
			o2[j] = uint32(z)
			order2 = order2 && z <= math.MaxUint32
			prev, gap = x, g
		}
		w, cost := bestWidth(o1[:n])
		vals := o1[:n]
		hdr := byte(0)
		if order2 {
			if w2, cost2 := bestWidth(o2[:n]); cost2 < cost {
				w, cost, vals, hdr = w2, cost2, o2[:n], blockOrder2
			}
		}
		if cost > len(out)-k {
			return 0, false
		}
		k += putBlock(out[k:], vals, hdr, w)
	}
	return k, true
}

// bestWidth returns the width at which the values take fewest bytes as a
// block, with what lies above it stored as exceptions, and that size; on
// a tie, the widest (no exceptions), else the narrowest. It lowers the
// width one bit at a time from the widest value down, counting what each
// step adds: the values one bit wider become exceptions of one byte, and
// those whose bits above the width reach a further multiple of 7 need one
// more uvarint byte.
func bestWidth(vals []uint32) (width, size int) {
	var hist [33]int // hist[l]: values of bit length l
	var all uint32
	for _, x := range vals {
		hist[bits.Len32(x)]++
		all |= x
	}
	top := bits.Len32(all)
	n := len(vals)
	width, size = top, blockSize(n, top, 0, 0)
	e, high := 0, 0
	for w := top - 1; w >= 0; w-- {
		e += hist[w+1]
		high += hist[w+1]
		for l := w + 8; l <= top; l += 7 {
			high += hist[l]
		}
		if s := blockSize(n, w, e, high); s < size || (s == size && width < top) {
			width, size = w, s
		}
	}
	return width, size
}

// blockSize is the size of a block of n values at width w with e
// exceptions whose high bits take high bytes as uvarints.
func blockSize(n, w, e, high int) int {
	s := 1 + (n*w+7)/8
	if e > 0 {
		s += 1 + e + high
	}
	return s
}

// putBlock writes one block: the header byte, the number of exceptions
// when there are any, the low w bits of every value packed from the least
// significant bit of the first byte on, then the exceptions' positions and
// the bits above w of each, as uvarints.
func putBlock(out []byte, vals []uint32, hdr byte, w int) int {
	out[0] = hdr | byte(w)
	k := 1
	e := 0
	if w < 32 {
		for _, x := range vals {
			if x>>w != 0 {
				e++
			}
		}
	}
	if e > 0 {
		out[0] |= blockPatched
		out[k] = byte(e)
		k++
	}
	mask := uint64(1)<<w - 1
	var acc uint64
	have := 0
	for _, x := range vals {
		acc |= (uint64(x) & mask) << have
		have += w
		if have >= 32 {
			binary.LittleEndian.PutUint32(out[k:], uint32(acc))
			k += 4
			acc >>= 32
			have -= 32
		}
	}
	for ; have > 0; have -= 8 {
		out[k] = byte(acc)
		k++
		acc >>= 8
	}
	if e > 0 {
		for i, x := range vals {
			if x>>w != 0 {
				out[k] = byte(i)
				k++
			}
		}
		for _, x := range vals {
			if x>>w != 0 {
				k += binary.PutUvarint(out[k:], uint64(x>>w))
			}
		}
	}
	return k
}

func zigzag(d int64) uint64 { return uint64(d<<1) ^ uint64(d>>63) }

// appendPacked appends to dst the n bytes that a codec-3 payload decodes
// to, or returns an error and dst as it was. The lengths are checked
// against the payload before memory is sized: a list of count references
// needs a stream of at least a byte for the first and one per block, and
// a snappy block cannot expand more than snappyMaxExpansion times. The
// output is sized once, to n plus, for a snappy stream, room to
// decompress the stream into.
func appendPacked(dst []byte, n uint64, payload []byte) ([]byte, error) {
	if len(payload) == 0 || payload[0]&^(layoutMask|streamSnappy) != 0 {
		return dst, ErrDecodeError
	}
	layout, body := payload[0]&layoutMask, payload[1:]
	head := uint64(0)
	switch layout {
	case layoutTSDB:
		head = 4
	case layoutU32:
	default:
		return dst, ErrDecodeError
	}
	if n < 4 || (n-head)%4 != 0 {
		return dst, ErrLengthMismatch
	}
	count := (n - head) / 4
	streamLen := uint64(len(body))
	compressed := payload[0]&streamSnappy != 0
	if compressed {
		dl, err := snappy.DecodedLen(body)
		if err != nil {
			return dst, ErrDecodeError
		}
		streamLen = uint64(dl)
		if streamLen > uint64(len(body))*snappyMaxExpansion {
			return dst, ErrLengthMismatch
		}
	}
	least := uint64(0)
	if count > 0 {
		least = 1 + (count-1+blockLen-1)/blockLen
	}
	if streamLen < least || (count == 0 && streamLen > 0) {
		return dst, ErrLengthMismatch
	}
	out, stream, err := reserveStream(dst, n, streamLen, compressed, body)
	if err != nil {
		return dst, err
	}
	refs := out[len(dst):]
	if layout == layoutTSDB {
		binary.BigEndian.PutUint32(refs, uint32(count))
		refs = refs[4:]
	}
	if !expandPacked(refs, stream) {
		return dst, ErrDecodeError
	}
	return out, nil
}

// expandPacked fills out, whole references, from a packed stream, and
// reports whether the stream held exactly that many strictly ascending
// 32-bit references. The encoder only writes such streams; anything else
// is refused rather than guessed at.
func expandPacked(out, stream []byte) bool {
	count := len(out) / 4
	if count == 0 {
		return len(stream) == 0
	}
	x, j := binary.Uvarint(stream)
	if j <= 0 || x > math.MaxUint32 {
		return false
	}
	binary.BigEndian.PutUint32(out, uint32(x))
	out = out[4:]
	gap := uint64(firstGap)
	var vals [blockLen]uint32
	for len(out) > 0 {
		n := min(blockLen, len(out)/4)
		if j >= len(stream) {
			return false
		}
		hdr := stream[j]
		j++
		w := int(hdr & blockWidth)
		if w > 32 {
			return false
		}
		e := 0
		if hdr&blockPatched != 0 {
			if j >= len(stream) || w == 32 {
				return false
			}
			e = int(stream[j])
			j++
			if e == 0 || e > n {
				return false
			}
		}
		size := (n*w + 7) / 8
		if len(stream)-j < size+e {
			return false
		}
		if n == blockLen {
			unpackBlock(&vals, stream[j:j+size], w)
		} else {
			unpackTail(&vals, stream[j:j+size], n, w)
		}
		j += size
		if e > 0 {
			// A full order-2 block of width 0 is a run of equal gaps
			// changed only at the exceptions, as runs of equal-sized
			// series give: patch stores the exceptions zigzag-decoded
			// for expandDeltas, and no other value needs decoding.
			k := patch(&vals, stream[j:], e, n, w, w == 0 && n == blockLen && hdr&blockOrder2 != 0)
			if k == 0 {
				return false
			}
			j += k
		}
		var ok bool
		switch {
		case n < blockLen:
			x, gap, ok = expandTail(out[:4*n], vals[:n], x, gap, hdr&blockOrder2 != 0)
		case w == 0 && e == 0:
			// Equal gaps: one, or the gap before the block.
			if hdr&blockOrder2 == 0 {
				gap = 1
			}
			x, ok = expandConstant((*[4 * blockLen]byte)(out), x, gap)
		case hdr&blockOrder2 == 0:
			x, gap, ok = expandOrder1((*[4 * blockLen]byte)(out), &vals, x)
		case w == 0:
			// Decoded by patch.
			x, gap, ok = expandDeltas((*[4 * blockLen]byte)(out), &vals, x, gap)
		default:
			x, gap, ok = expandOrder2((*[4 * blockLen]byte)(out), &vals, x, gap)
		}
		if !ok {
			return false
		}
		out = out[4*n:]
	}
	return j == len(stream)
}

// patch reads the e exceptions of a block of n values of w bits from the
// start of b: their positions, strictly ascending and below n, then the
// bits above w of each, not zero and below 2^(32-w), which it ors into
// vals. For an order-2 block of width 0 (zz), whose other values are zero,
// it stores each value zigzag-decoded instead, as expandDeltas takes them.
// It returns how many bytes it read, or 0 when they are no exceptions a
// block can hold. Most exceptions take one byte: those are read without
// the general path.
func patch(vals *[blockLen]uint32, b []byte, e, n, w int, zz bool) int {
	if len(b) < e {
		return 0
	}
	pos := b[:e]
	last := -1
	for _, p := range pos {
		if int(p) <= last {
			return 0
		}
		last = int(p)
	}
	if last >= n {
		return 0
	}
	k := e
	for _, p := range pos {
		var h uint64
		var m int
		if k < len(b) && b[k] < 0x80 {
			h, m = uint64(b[k]), 1
		} else {
			h, m = exception(b[k:])
		}
		// A refused or overlong uvarint reads as 0. w is below 32
		// here: the masks only spare the compiler its shift checks.
		if h == 0 || h>>((32-w)&63) != 0 {
			return 0
		}
		k += m
		v := uint32(h) << (w & 31)
		if zz {
			v = v>>1 ^ -(v & 1)
		}
		vals[p&(blockLen-1)] |= v
	}
	return k
}

// exception reads the high bits of an exception: a uvarint of at most
// five bytes (32 bits need no more), as binary.Uvarint reads it. Where
// eight bytes are left it reads them at once and finds the last byte
// without a branch per byte: the length of an exception is data, and a
// mispredicted branch per exception would cost more than the arithmetic.
func exception(b []byte) (uint64, int) {
	if len(b) < 8 {
		h, k := binary.Uvarint(b)
		if k > 5 {
			return 0, 0
		}
		return h, k
	}
	w := binary.LittleEndian.Uint64(b)
	k := bits.TrailingZeros64(^w&0x8080808080808080)/8 + 1
	if k > 5 {
		return 0, 0
	}
	w &= 1<<(8*k) - 1
	return w&0x7f | w>>1&(0x7f<<7) | w>>2&(0x7f<<14) | w>>3&(0x7f<<21) | w>>4&(0x7f<<28), k
}

// expandOrder1 writes a full block of gaps less one after reference x,
// and returns the last reference and gap, and whether every reference fits
// in 32 bits. Gaps are at least one, so the references ascend; the last is
// the largest.
func expandOrder1(out *[4 * blockLen]byte, vals *[blockLen]uint32, x uint64) (uint64, uint64, bool) {
	for i, v := range vals {
		x += uint64(v) + 1
		binary.BigEndian.PutUint32(out[4*i:], uint32(x))
	}
	return x, uint64(vals[blockLen-1]) + 1, x <= math.MaxUint32
}

// expandConstant writes a full block of equal gaps after reference x: an
// order-2 block of width 0 without exceptions, as consecutive references
// and runs of equal gaps give.
func expandConstant(out *[4 * blockLen]byte, x, gap uint64) (uint64, bool) {
	for i := 0; i < blockLen; i++ {
		x += gap
		binary.BigEndian.PutUint32(out[4*i:], uint32(x))
	}
	return x, x <= math.MaxUint32
}

// expandOrder2 writes a full block of gap differences after reference x
// and gap g. A gap below one or of 2^32 and more is refused (as the last
// reference over 32 bits): only a damaged stream holds one. The loop takes
// four references a turn, which the compiler does not do by itself.
func expandOrder2(out *[4 * blockLen]byte, vals *[blockLen]uint32, x, g uint64) (uint64, uint64, bool) {
	var bad uint64
	for i := 0; i < blockLen; i += 4 {
		v0, v1, v2, v3 := vals[i], vals[i+1], vals[i+2], vals[i+3]
		g += uint64(-int64(v0&1)) ^ uint64(v0>>1)
		bad |= g - 1
		x += g
		binary.BigEndian.PutUint32(out[4*i:], uint32(x))
		g += uint64(-int64(v1&1)) ^ uint64(v1>>1)
		bad |= g - 1
		x += g
		binary.BigEndian.PutUint32(out[4*i+4:], uint32(x))
		g += uint64(-int64(v2&1)) ^ uint64(v2>>1)
		bad |= g - 1
		x += g
		binary.BigEndian.PutUint32(out[4*i+8:], uint32(x))
		g += uint64(-int64(v3&1)) ^ uint64(v3>>1)
		bad |= g - 1
		x += g
		binary.BigEndian.PutUint32(out[4*i+12:], uint32(x))
	}
	return x, g, bad>>32 == 0 && x <= math.MaxUint32
}

// expandDeltas is expandOrder2 for values already zigzag-decoded: each is
// the signed difference, as a 32-bit two's complement, between a gap and
// the gap before it.
func expandDeltas(out *[4 * blockLen]byte, vals *[blockLen]uint32, x, g uint64) (uint64, uint64, bool) {
	var bad uint64
	for i := 0; i < blockLen; i += 4 {
		v := vals[i : i+4 : i+4]
		g += uint64(int64(int32(v[0])))
		bad |= g - 1
		x += g
		binary.BigEndian.PutUint32(out[4*i:], uint32(x))
		g += uint64(int64(int32(v[1])))
		bad |= g - 1
		x += g
		binary.BigEndian.PutUint32(out[4*i+4:], uint32(x))
		g += uint64(int64(int32(v[2])))
		bad |= g - 1
		x += g
		binary.BigEndian.PutUint32(out[4*i+8:], uint32(x))
		g += uint64(int64(int32(v[3])))
		bad |= g - 1
		x += g
		binary.BigEndian.PutUint32(out[4*i+12:], uint32(x))
	}
	return x, g, bad>>32 == 0 && x <= math.MaxUint32
}

// expandTail is expandOrder1 and expandOrder2 for the last, shorter block.
func expandTail(out []byte, vals []uint32, x, g uint64, order2 bool) (uint64, uint64, bool) {
	var bad uint64
	for i, v := range vals {
		if order2 {
			g += uint64(-int64(v&1)) ^ uint64(v>>1)
		} else {
			g = uint64(v) + 1
		}
		bad |= g - 1
		x += g
		binary.BigEndian.PutUint32(out[4*i:], uint32(x))
	}
	return x, g, bad>>32 == 0 && x <= math.MaxUint32
}

// unpackTail unpacks the n values of w bits of a block shorter than
// blockLen, packed as putBlock packs them.
func unpackTail(vals *[blockLen]uint32, in []byte, n, w int) {
	mask := uint64(1)<<w - 1
	var acc uint64
	have, k := 0, 0
	for i := range n {
		for have < w {
			acc |= uint64(in[k]) << have
			k++
			have += 8
		}
		vals[i] = uint32(acc & mask)
		acc >>= w
		have -= w
	}
}
