package codec

import (
	"encoding/binary"
	"math"
	"math/bits"

	"github.com/golang/snappy"
)

// A raw postings list is a sorted list of series references. Stored as
// fixed-width big-endian integers it has no repeated bytes for snappy to
// find, but its gaps are small: written as the first reference and then the
// differences, each as a uvarint, it takes about a quarter of its size, and
// snappy then halves that stream again (runs of equal gaps repeat).
//
// The postings codecs recognise three layouts and give each back byte for
// byte: codec 2 (this file) stores the uvarint stream, codec 3 (packed.go)
// bit-packed blocks of gaps; the package doc has the payloads' layouts.
const (
	// layoutTSDB is a TSDB index postings list: a 4-byte big-endian count,
	// then exactly that many big-endian uint32 references.
	layoutTSDB = 0
	// layoutU32 is a bare array of big-endian uint32 references.
	layoutU32 = 1
	// layoutU64 is a bare array of big-endian uint64 references.
	layoutU64 = 2

	layoutMask = 0x03
	// streamSnappy marks a payload whose uvarint stream is a snappy block.
	streamSnappy = 0x04
)

// postingsList is what detectPostings found: the layout and the exact
// length of its uvarint stream.
type postingsList struct {
	layout    byte
	streamLen int
}

// detectPostings reports whether v is a raw postings list in one of the
// layouts, references strictly ascending, and which layout has the shortest
// uvarint stream when v reads as more than one. It reads v once, word by
// word, and stops at the first word that rules every layout out, so a value
// that is not a postings list usually costs a few words. An empty value is
// no list: nothing would be saved.
func detectPostings(v []byte) (postingsList, bool) {
	n := len(v)
	if n == 0 || n%4 != 0 || n > maxDecodedLen {
		return postingsList{}, false
	}
	words := n / 4
	w0 := binary.BigEndian.Uint32(v)
	tsdb := w0 == uint32(words-1)
	u32 := true
	u64 := n%8 == 0

	// The TSDB and uint32 streams share the gaps from word 2 on (tail);
	// they differ in how they start.
	var w1 uint32
	var tail, len64 int
	var prev64 uint64
	prev := w0
	for i := 1; i < words && (tsdb || u32 || u64); i++ {
		w := binary.BigEndian.Uint32(v[4*i:])
		switch {
		case i == 1:
			// Word 0 is the TSDB count, not a reference.
			w1 = w
			u32 = w > w0
		case w > prev:
			tail += uvarintLen32(w - prev)
		default:
			tsdb, u32 = false, false
		}
		if i%2 == 1 && u64 {
			x := uint64(prev)<<32 | uint64(w)
			switch {
			case i == 1:
				len64 = uvarintLen64(x)
			case x > prev64:
				len64 += uvarintLen64(x - prev64)
			default:
				u64 = false
			}
			prev64 = x
		}
		prev = w
	}

	best := postingsList{streamLen: math.MaxInt}
	if tsdb {
		best = postingsList{layoutTSDB, 0}
		if words > 1 {
			best.streamLen = uvarintLen32(w1) + tail
		}
	}
	if u32 {
		l := uvarintLen32(w0) + tail
		if words > 1 {
			l += uvarintLen32(w1 - w0)
		}
		if l < best.streamLen {
			best = postingsList{layoutU32, l}
		}
	}
	if u64 && len64 < best.streamLen {
		best = postingsList{layoutU64, len64}
	}
	return best, best.streamLen != math.MaxInt
}

// postingsRoom is the room encodePostings needs for a value of n bytes
// whose stream is streamLen bytes long: the decoded length, the form byte,
// the stream and snappy's output for it.
func postingsRoom(n, streamLen int) int {
	return uvarintLen(uint64(n)) + 1 + streamLen + maxSnappyLen(streamLen)
}

// encodePostings writes the decoded length and the payload of value, a
// list detectPostings accepted as pl, at the start of body, which has
// postingsRoom bytes, and returns how many bytes it wrote and the codec.
// A list of 32-bit references takes codec 3 when its packed stream fits in
// the room of the uvarint stream, as it does unless its gaps are unusual;
// otherwise, and for 64-bit references, the uvarint stream is written,
// then snappy's block of it right behind, which replaces the stream only
// when it is shorter.
func (c *Codec) encodePostings(body, value []byte, pl postingsList) (int, byte) {
	k := binary.PutUvarint(body, uint64(len(value)))
	if pl.layout != layoutU64 && !c.codec2 {
		if m, ok := c.encodePacked(body[k:], value, pl.layout, pl.streamLen); ok {
			return k + m, CodecPostingsPacked
		}
	}
	body[k] = pl.layout
	stream := body[k+1 : k+1+pl.streamLen]
	// A stream shorter than detectPostings counted would be a bug; one
	// longer could not be written (PutUvarint panics past the slice).
	w := putStream(stream, value, pl.layout)
	stream = stream[:w]
	block := body[k+1+w:]
	if enc := c.encodeSnappy(block, stream); enc > 0 && enc < w {
		copy(body[k+1:], block[:enc])
		body[k] |= streamSnappy
		return k + 1 + enc, CodecPostings
	}
	return k + 1 + w, CodecPostings
}

// putStream writes the uvarint stream of a postings list: the first
// reference, then the gap to each next one.
func putStream(out, v []byte, layout byte) int {
	k := 0
	if layout == layoutU64 {
		var prev uint64
		for i := 0; i < len(v); i += 8 {
			x := binary.BigEndian.Uint64(v[i:])
			k += binary.PutUvarint(out[k:], x-prev)
			prev = x
		}
		return k
	}
	if layout == layoutTSDB {
		v = v[4:]
	}
	var prev uint32
	for i := 0; i < len(v); i += 4 {
		x := binary.BigEndian.Uint32(v[i:])
		// Most gaps take one byte: write it without the general loop.
		if d := x - prev; d < 0x80 {
			out[k] = byte(d)
			k++
		} else {
			k += binary.PutUvarint(out[k:], uint64(d))
		}
		prev = x
	}
	return k
}

// appendPostings appends to dst the n bytes that a codec-2 payload decodes
// to, or returns an error and dst as it was. Every length is checked
// against the payload before memory is sized: a list of count references
// needs a stream of count to count*10 bytes, and a snappy block cannot
// expand more than snappyMaxExpansion times. The output is sized once, to
// n plus, for a snappy stream, room to decompress the stream into.
func appendPostings(dst []byte, n uint64, payload []byte) ([]byte, error) {
	if len(payload) == 0 || payload[0]&^(layoutMask|streamSnappy) != 0 {
		return dst, ErrDecodeError
	}
	layout, body := payload[0]&layoutMask, payload[1:]
	width, head, least := uint64(4), uint64(0), uint64(4)
	switch layout {
	case layoutTSDB:
		head = 4
	case layoutU32:
	case layoutU64:
		width, least = 8, 8
	default:
		return dst, ErrDecodeError
	}
	if n < least || (n-head)%width != 0 {
		return dst, ErrLengthMismatch
	}
	count := (n - head) / width
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
	if count > streamLen || streamLen > count*binary.MaxVarintLen64 {
		return dst, ErrLengthMismatch
	}
	out, stream, err := reserveStream(dst, n, streamLen, compressed, body)
	if err != nil {
		return dst, err
	}
	if !expandStream(out[len(dst):], stream, layout, int(count)) {
		return dst, ErrDecodeError
	}
	return out, nil
}

// reserveStream extends dst by n bytes for the references, and returns it
// with the stream to expand into them: body itself, or body
// snappy-decoded (to streamLen bytes) into room past the n bytes, so that
// one allocation serves both.
func reserveStream(dst []byte, n, streamLen uint64, compressed bool, body []byte) (out, stream []byte, err error) {
	scratch := uint64(0)
	if compressed {
		scratch = streamLen
	}
	if n+scratch > math.MaxInt-uint64(len(dst)) {
		return dst, nil, ErrLengthMismatch
	}
	end := len(dst) + int(n)
	out = grow(dst, int(n+scratch))[:end]
	if !compressed {
		return out, body, nil
	}
	dec, err := snappy.Decode(out[end:end+int(streamLen)], body)
	if err != nil || len(dec) != int(streamLen) {
		return dst, nil, ErrDecodeError
	}
	return out, dec, nil
}

// expandStream writes the count references of stream into out, in their
// layout, and reports whether the stream held exactly that many strictly
// ascending references that fit the layout's width. The encoder only
// writes such streams; anything else is refused rather than guessed at.
func expandStream(out, stream []byte, layout byte, count int) bool {
	switch layout {
	case layoutTSDB:
		binary.BigEndian.PutUint32(out, uint32(count))
		return expand32(out[4:4+4*count], stream)
	case layoutU32:
		return expand32(out[:4*count], stream)
	}
	return expand64(out[:8*count], stream)
}

// expand32 fills out with uint32 references; the loop is written apart
// from expand64 because decoding spends its time here. Most gaps of a
// postings list take one or two bytes, so the stream is read eight bytes
// at a time: eight one-byte gaps, or four two-byte ones, are written
// without a branch or a check per gap (a gap of zero is looked for once
// per word, and as references only grow, the last one is the only one
// that can pass 32 bits); any other word gives its first gap, of up to
// five bytes, without a loop over its bytes. The last few references, and
// a gap written in more bytes than it needs, go through binary.Uvarint,
// which reads exactly the streams the encoder writes and nothing else.
func expand32(out, stream []byte) bool {
	if len(out) == 0 {
		return len(stream) == 0
	}
	x, k := binary.Uvarint(stream)
	if k <= 0 || x > math.MaxUint32 {
		return false
	}
	binary.BigEndian.PutUint32(out, uint32(x))
	out, stream = out[4:], stream[k:]
	// bad gets a bit at 32 or above from a gap of zero or over 32 bits.
	var bad uint64
	for len(out) >= 32 && len(stream) >= 8 {
		w := binary.LittleEndian.Uint64(stream)
		switch w & highBits {
		case 0:
			bad |= zeroByte(w)
			x = put8x1((*[32]byte)(out), x, w)
			out, stream = out[32:], stream[8:]
		case twoByteGaps:
			// Four lanes of 16 bits: the low 7 bits of each gap
			// from its first byte, the high 7 from its second.
			v := w&0x007f007f007f007f | w>>1&0x3f803f803f803f80
			bad |= zeroLane16(v)
			x = put4x2((*[16]byte)(out), x, v)
			out, stream = out[16:], stream[8:]
		default:
			n := bits.TrailingZeros64(^w&highBits)/8 + 1
			if n > 5 {
				// Six bytes or more (a gap spelled with needless
				// zero bytes): only the general reader knows.
				d, k := binary.Uvarint(stream)
				if k <= 0 {
					return false
				}
				n, w = k, d
			} else {
				w = squeeze7(w & (1<<(8*n) - 1))
			}
			bad |= w - 1
			x += w
			binary.BigEndian.PutUint32(out, uint32(x))
			out, stream = out[4:], stream[n:]
		}
	}
	for ; len(out) >= 4; out = out[4:] {
		d, k := binary.Uvarint(stream)
		if k <= 0 {
			return false
		}
		stream = stream[k:]
		bad |= d - 1
		x += d
		binary.BigEndian.PutUint32(out, uint32(x))
	}
	// A gap over 32 bits set bad, so x cannot have wrapped.
	return bad>>32 == 0 && x <= math.MaxUint32 && len(stream) == 0
}

const (
	// highBits are the continuation bits of eight bytes of uvarints.
	highBits = 0x8080808080808080
	// twoByteGaps are those of four two-byte uvarints.
	twoByteGaps = 0x0080008000800080
)

// zeroByte returns a value with a bit at 32 or above set when one of the
// eight bytes of w, none over 0x7f, is zero: setting bit 7 of each byte
// and subtracting one from each leaves bit 7 clear only in those that were
// zero (no byte borrows from the next); those bits, of whichever half, are
// then copied into the upper half.
func zeroByte(w uint64) uint64 {
	z := ((w|highBits)-0x0101010101010101)&highBits ^ highBits
	return z | z<<32
}

// zeroLane16 is zeroByte for four 16-bit lanes, none over 0x7fff.
func zeroLane16(v uint64) uint64 {
	const top = 0x8000800080008000
	z := ((v|top)-0x0001000100010001)&top ^ top
	return z | z<<32
}

// put8x1 writes the eight references after x whose gaps are the eight
// bytes of w, from its least significant, and returns the last.
func put8x1(out *[32]byte, x, w uint64) uint64 {
	x += w & 0xff
	binary.BigEndian.PutUint32(out[0:], uint32(x))
	x += w >> 8 & 0xff
	binary.BigEndian.PutUint32(out[4:], uint32(x))
	x += w >> 16 & 0xff
	binary.BigEndian.PutUint32(out[8:], uint32(x))
	x += w >> 24 & 0xff
	binary.BigEndian.PutUint32(out[12:], uint32(x))
	x += w >> 32 & 0xff
	binary.BigEndian.PutUint32(out[16:], uint32(x))
	x += w >> 40 & 0xff
	binary.BigEndian.PutUint32(out[20:], uint32(x))
	x += w >> 48 & 0xff
	binary.BigEndian.PutUint32(out[24:], uint32(x))
	x += w >> 56
	binary.BigEndian.PutUint32(out[28:], uint32(x))
	return x
}

// put4x2 writes the four references after x whose gaps are the four
// 16-bit lanes of v, and returns the last.
func put4x2(out *[16]byte, x, v uint64) uint64 {
	x += v & 0xffff
	binary.BigEndian.PutUint32(out[0:], uint32(x))
	x += v >> 16 & 0xffff
	binary.BigEndian.PutUint32(out[4:], uint32(x))
	x += v >> 32 & 0xffff
	binary.BigEndian.PutUint32(out[8:], uint32(x))
	x += v >> 48
	binary.BigEndian.PutUint32(out[12:], uint32(x))
	return x
}

// squeeze7 returns the value of a uvarint of at most five bytes, given as
// the bytes of w from its least significant (those past it zero): the low
// seven bits of each byte, put together.
func squeeze7(w uint64) uint64 {
	return w&0x7f | w>>1&(0x7f<<7) | w>>2&(0x7f<<14) | w>>3&(0x7f<<21) | w>>4&(0x7f<<28)
}

// expand64 fills out with uint64 references.
func expand64(out, stream []byte) bool {
	var prev uint64
	j := 0
	for i := 0; i < len(out); i += 8 {
		d, k := binary.Uvarint(stream[j:])
		if k <= 0 {
			return false
		}
		j += k
		x := prev + d
		if (d == 0 && i > 0) || x < prev {
			return false
		}
		binary.BigEndian.PutUint64(out[i:], x)
		prev = x
	}
	return j == len(stream)
}

// uvarintLen32 and uvarintLen64 return the length of x as a uvarint: one
// byte per 7 bits, at least one (x|1 has at least one bit).
func uvarintLen32(x uint32) int { return (bits.Len32(x|1) + 6) / 7 }
func uvarintLen64(x uint64) int { return (bits.Len64(x|1) + 6) / 7 }
