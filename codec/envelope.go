package codec

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"math"

	"github.com/golang/snappy"
	"golang.org/x/crypto/blake2b"
)

// Header byte fields and sizes; the package doc has the layout.
const (
	version      = 1
	versionShift = 6
	bitBound     = 1 << 5
	bitReserved  = 1 << 4
	codecMask    = 0x0f

	crcOffset  = 1
	bindOffset = crcOffset + 4
	bindingLen = 16

	// minEnvelope is a header byte, a checksum and a one-byte length.
	minEnvelope = bindOffset + 1

	// MaxHeaderLen is the most bytes an envelope adds to a value that does
	// not compress: header byte, checksum, binding and a five-byte length.
	MaxHeaderLen = bindOffset + bindingLen + binary.MaxVarintLen32

	// maxDecodedLen is the largest length the format records.
	maxDecodedLen = math.MaxUint32

	// snappyMaxExpansion bounds what one stored byte of a snappy block can
	// decode to (a 3-byte copy emits at most 64 bytes), so a recorded length
	// the payload cannot fill is refused before memory is sized for it.
	snappyMaxExpansion = 22
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// AppendEncode appends to dst the envelope of value as written under the
// client key with the client flags, and returns it with the flags to store
// upstream. bindKey says that the upstream key is not the client key (it was
// rewritten), so the envelope must carry a binding to key. value must not
// overlap dst's spare capacity.
//
// dst grows at most once, to the exact size the chosen codec can need; with
// room enough (MaxEncodedLen), AppendEncode allocates nothing.
func (c *Codec) AppendEncode(dst, key []byte, bindKey bool, flags uint32, value []byte) (out []byte, storedFlags uint32) {
	return c.appendEncode(dst, key, bindKey, flags, value, false)
}

// AppendEncodePostings is AppendEncode for a value stored under a
// postings-bearing key: when the value is a raw postings list and
// Config.Postings is on, the postings codec is tried too, and the envelope
// holds whichever of the postings codec, snappy and the value as it is
// takes fewest bytes. Any other value is enveloped exactly as AppendEncode
// does.
func (c *Codec) AppendEncodePostings(dst, key []byte, bindKey bool, flags uint32, value []byte) (out []byte, storedFlags uint32) {
	return c.appendEncode(dst, key, bindKey, flags, value, c.postings)
}

func (c *Codec) appendEncode(dst, key []byte, bindKey bool, flags uint32, value []byte, postings bool) (out []byte, storedFlags uint32) {
	storedFlags = flags | c.mask
	hdr := byte(version << versionShift)
	if flags&c.mask != 0 {
		hdr |= bitReserved
	}
	lenAt := bindOffset
	if bindKey {
		hdr |= bitBound
		lenAt += bindingLen
	}

	start := len(dst)
	n := len(value)
	plain := lenAt + uvarintLen(uint64(n)) + n
	compress := c.worthCompressing(value)
	need := plain
	if compress {
		need = max(need, lenAt+maxSnappyLen(n))
	}
	// A postings list is encoded first, at lenAt; snappy then writes
	// behind the room the postings codec took, so that the shorter of
	// the two can be kept. The list is tried only if its uvarint stream
	// is shorter than the value, which bounds the room.
	var pl postingsList
	tryPostings := false
	snappyAt := lenAt
	if postings && compress {
		pl, tryPostings = detectPostings(value)
		tryPostings = tryPostings && pl.streamLen < n
	}
	if tryPostings {
		snappyAt = lenAt + postingsRoom(n, pl.streamLen)
		need = max(need, snappyAt+maxSnappyLen(n))
	}
	dst = grow(dst, need)[:start+lenAt]
	if bindKey {
		sum := blake2b.Sum256(key)
		copy(dst[start+bindOffset:], sum[:bindingLen])
	}

	// body is how many bytes follow lenAt in the best form found so far;
	// a compressed form is kept only if it saves the configured fraction.
	codec := byte(CodecNone)
	body := plain - lenAt
	limit := body - c.requiredSavings(n)
	if tryPostings {
		if m, id := c.encodePostings(dst[start+lenAt:start+snappyAt], value, pl); m <= limit {
			codec, body = id, m
		}
	}
	if codec == CodecNone {
		snappyAt = lenAt
	}
	if compress {
		enc := c.encodeSnappy(dst[start+snappyAt:start+snappyAt+maxSnappyLen(n)], value)
		if enc > 0 && enc <= limit && enc < body {
			if snappyAt != lenAt {
				// Both ranges lie past len(dst), within its capacity:
				// slice them explicitly, or copy sees an empty target.
				copy(dst[start+lenAt:start+lenAt+enc], dst[start+snappyAt:start+snappyAt+enc])
			}
			codec, body = CodecSnappy, enc
		}
	}
	hdr |= codec
	dst[start] = hdr
	var sum uint32
	if codec == CodecNone {
		dst = binary.AppendUvarint(dst, uint64(n))
		// Checksum the value where it is, before copying it: a large
		// copy bypasses the cache, and reading it back would not.
		sum = checksum(flags, key, dst[start:], value)
		dst = append(dst, value...)
	} else {
		dst = dst[:start+lenAt+body]
		sum = checksum(flags, key, dst[start:], nil)
	}
	binary.LittleEndian.PutUint32(dst[start+crcOffset:], sum)
	return dst, storedFlags
}

// DecodedLen returns the length and the client's flags of the value that
// AppendDecode would append, read from the envelope's header without
// verifying it: a reply's header can be written before the value it
// announces is decoded behind it. ok is false when there is no header to
// read; when AppendDecode then refuses the envelope, nothing was written.
func (c *Codec) DecodedLen(storedFlags uint32, stored []byte) (n int, flags uint32, ok bool) {
	if storedFlags&c.mask == 0 || len(stored) < minEnvelope || stored[0]>>versionShift != version {
		return 0, 0, false
	}
	lenAt := bindOffset
	if stored[0]&bitBound != 0 {
		lenAt += bindingLen
	}
	if len(stored) <= lenAt {
		return 0, 0, false
	}
	u, k := binary.Uvarint(stored[lenAt:])
	if k <= 0 || u > maxDecodedLen {
		return 0, 0, false
	}
	return int(u), c.clientFlags(storedFlags, stored[0]), true
}

// AppendDecode verifies the envelope stored upstream with storedFlags under
// the client key, and appends the client's value to dst. It returns that
// with the client's flags, or one of the Err values when the envelope must
// be served as a miss. bindKey must be what AppendEncode was given: whether
// the upstream key is a rewrite of key. stored must not overlap dst's spare
// capacity.
//
// The output is sized once from the recorded decoded length (for a
// postings payload whose stream is snappy-compressed, plus the stream's
// recorded length, to decompress it into): with room enough in dst,
// AppendDecode allocates nothing, and otherwise only the output buffer. On
// error dst is returned as it was.
func (c *Codec) AppendDecode(dst, key []byte, bindKey bool, storedFlags uint32, stored []byte) (value []byte, flags uint32, err error) {
	value, flags, _, err = c.decode(dst, key, bindKey, storedFlags, stored, false)
	return value, flags, err
}

// AppendDecodeInPlace is AppendDecode for a caller that can use the value
// where it lies: a value the envelope holds as it is (no compression, as
// for values compressed already) is checked as AppendDecode checks it and
// returned as the slice of stored it is, with inPlace true and nothing
// appended to dst. Any other is decoded onto dst.
func (c *Codec) AppendDecodeInPlace(dst, key []byte, bindKey bool, storedFlags uint32, stored []byte) (value []byte, flags uint32, inPlace bool, err error) {
	return c.decode(dst, key, bindKey, storedFlags, stored, true)
}

// decode is AppendDecode, and AppendDecodeInPlace when inPlace; placed
// reports a value returned where it lies.
func (c *Codec) decode(dst, key []byte, bindKey bool, storedFlags uint32, stored []byte, inPlace bool) (value []byte, flags uint32, placed bool, err error) {
	if storedFlags&c.mask == 0 || len(stored) < minEnvelope {
		return dst, 0, false, ErrBadHeader
	}
	hdr := stored[0]
	if hdr>>versionShift != version {
		return dst, 0, false, ErrBadVersion
	}
	bound := hdr&bitBound != 0
	if bound != bindKey {
		return dst, 0, false, ErrKeyMismatch
	}
	lenAt := bindOffset
	if bound {
		lenAt += bindingLen
	}
	if len(stored) <= lenAt {
		return dst, 0, false, ErrBadHeader
	}
	n, k := binary.Uvarint(stored[lenAt:])
	if k <= 0 || n > maxDecodedLen {
		return dst, 0, false, ErrBadHeader
	}
	if c.maxValue > 0 && n > c.maxValue {
		return dst, 0, false, ErrLengthMismatch
	}
	flags = c.clientFlags(storedFlags, hdr)
	if checksum(flags, key, stored, nil) != binary.LittleEndian.Uint32(stored[crcOffset:]) {
		return dst, 0, false, ErrChecksumMismatch
	}
	if bound {
		sum := blake2b.Sum256(key)
		if !bytes.Equal(sum[:bindingLen], stored[bindOffset:bindOffset+bindingLen]) {
			return dst, 0, false, ErrKeyMismatch
		}
	}

	payload := stored[lenAt+k:]
	switch hdr & codecMask {
	case CodecNone:
		if uint64(len(payload)) != n {
			return dst, 0, false, ErrLengthMismatch
		}
		if inPlace {
			return payload[:n:n], flags, true, nil
		}
		return append(grow(dst, len(payload)), payload...), flags, false, nil
	case CodecSnappy:
		if n > uint64(len(payload))*snappyMaxExpansion || n > math.MaxInt-uint64(len(dst)) {
			return dst, 0, false, ErrLengthMismatch
		}
		start := len(dst)
		out := grow(dst, int(n))[:start+int(n)]
		dec, derr := snappy.Decode(out[start:], stored[lenAt:])
		if derr != nil {
			return dst, 0, false, ErrDecodeError
		}
		if len(dec) != int(n) {
			return dst, 0, false, ErrLengthMismatch
		}
		return out, flags, false, nil
	case CodecPostings:
		out, err := appendPostings(dst, n, payload)
		if err != nil {
			return dst, 0, false, err
		}
		return out, flags, false, nil
	case CodecPostingsPacked:
		out, err := appendPacked(dst, n, payload)
		if err != nil {
			return dst, 0, false, err
		}
		return out, flags, false, nil
	}
	return dst, 0, false, ErrUnknownCodec
}

// snappyBlock is the size of the independent blocks snappy compresses. A
// value longer than one is compressed a block at a time, so that an
// incompressible one is given up after its first block rather than at the
// end; snappyHeadroom is the extra room that needs. A value longer than
// probeAfter is first judged by compressing its first probeLen bytes.
const (
	snappyBlock    = 64 << 10
	probeAfter     = 8 << 10
	probeLen       = 4 << 10
	snappyHeadroom = 64
)

// MaxEncodedLen returns the most bytes AppendEncode or AppendEncodePostings
// may need for a value of n bytes, bound or not: a dst with that much spare
// capacity is never grown. The most is the postings codec's, whose stream
// is tried only when shorter than n, followed by snappy's room. The envelope
// itself is never longer than n+MaxHeaderLen.
func MaxEncodedLen(n int) int {
	return MaxHeaderLen + 1 + n + 2*maxSnappyLen(n)
}

// maxSnappyLen is the room encodeSnappy needs for a value of n bytes.
func maxSnappyLen(n int) int {
	m := snappy.MaxEncodedLen(n)
	if n > snappyBlock {
		m += snappyHeadroom
	}
	return m
}

// encodeSnappy writes the snappy block of value at the start of body, which
// has room for maxSnappyLen(len(value)) bytes, and
// returns its length, or 0 when the first 64 KiB already save less than the
// configured fraction. The result is byte for byte what snappy.Encode
// writes: a snappy block is one length then elements whose copies reach
// back only within their own 64 KiB block, so blocks encoded apart
// concatenate.
func (c *Codec) encodeSnappy(body, value []byte) int {
	// A value past probeAfter is judged by its first probeLen bytes first:
	// compressing an incompressible value whole (raw postings, already
	// compressed payloads) would cost as much as compressing it, for
	// nothing. The probe's output is overwritten below.
	if len(value) > probeAfter {
		if len(snappy.Encode(body, value[:probeLen])) > probeLen-c.requiredSavings(probeLen) {
			return 0
		}
	}
	if len(value) <= snappyBlock {
		return len(snappy.Encode(body, value))
	}
	const firstLen = 3 // uvarint(snappyBlock)
	first := len(snappy.Encode(body, value[:snappyBlock])) - firstLen
	if first > snappyBlock-c.requiredSavings(snappyBlock) {
		return 0
	}
	// Put the whole value's length in front of the first block's elements.
	p := uvarintLen(uint64(len(value)))
	if p != firstLen {
		copy(body[p:], body[firstLen:firstLen+first])
	}
	binary.PutUvarint(body, uint64(len(value)))
	end := p + first

	// Encode the rest right after, its own length prefix overwriting (and
	// then giving back) the last bytes of the first block.
	rest := value[snappyBlock:]
	q := uvarintLen(uint64(len(rest)))
	var saved [binary.MaxVarintLen64]byte
	copy(saved[:q], body[end-q:end])
	enc := snappy.Encode(body[end-q:], rest)
	copy(body[end-q:end], saved[:q])
	return end - q + len(enc)
}

// clientFlags returns the client's flags of an envelope stored upstream
// with storedFlags: those flags with the reserved bit as the header byte
// recorded it.
func (c *Codec) clientFlags(storedFlags uint32, hdr byte) uint32 {
	if hdr&bitReserved != 0 {
		return storedFlags | c.mask
	}
	return storedFlags &^ c.mask
}

// checksum computes the CRC-32C of an envelope as the package doc defines
// it; the envelope is stored followed by tail (which the encoder has not
// copied in yet), and stored begins with the header byte. It covers the client's
// flags rather than the upstream ones so that a codec reserving another bit
// cannot read an envelope with the wrong flags. The key counts only when no
// binding is stored: a stored binding stands for it.
func checksum(flags uint32, key, stored, tail []byte) uint32 {
	// The flags and header byte go through the table by hand: a slice of a
	// local array passed to crc32.Update would escape to the heap.
	crc := ^uint32(0)
	for i := 0; i < 4; i++ {
		crc = castagnoli[byte(crc)^byte(flags>>(8*i))] ^ crc>>8
	}
	crc = ^crc
	if stored[0]&bitBound == 0 {
		crc = crc32.Update(crc, castagnoli, key)
	}
	crc = ^crc
	crc = castagnoli[byte(crc)^stored[0]] ^ crc>>8
	crc = ^crc
	crc = crc32.Update(crc, castagnoli, stored[bindOffset:])
	return crc32.Update(crc, castagnoli, tail)
}

// grow returns dst with room for n more bytes, allocating exactly that much
// when it has to.
func grow(dst []byte, n int) []byte {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	out := make([]byte, len(dst), len(dst)+n)
	copy(out, dst)
	return out
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}
