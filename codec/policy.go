package codec

import (
	"bytes"
	"math"
)

// Magic bytes of values that are compressed already. Compressing them again
// costs CPU and saves nothing, so they are stored as they are.
var (
	magicSnappyFramed = []byte("\xff\x06\x00\x00sNaPpY")
	// Thanos postings: "dss" then a snappy framed stream.
	magicThanosPostings = []byte("dss\xff\x06\x00\x00sNaPpY")
	magicMimirPostings  = []byte("dm")  // Mimir: "dm" + matchers + snappy block
	magicMimirOld       = []byte("dvs") // Mimir (old): "dvs" + snappy block
	magicGzip           = []byte{0x1f, 0x8b}
	magicZstd           = []byte{0x28, 0xb5, 0x2f, 0xfd}
	magicLZ4Frame       = []byte{0x04, 0x22, 0x4d, 0x18}
)

// alreadyCompressed reports whether v starts with the magic bytes of a
// compressed format. A bare snappy block has no magic; the savings check
// catches it.
func alreadyCompressed(v []byte) bool {
	if len(v) < 2 {
		return false
	}
	switch v[0] {
	case 'd':
		return bytes.HasPrefix(v, magicMimirPostings) ||
			bytes.HasPrefix(v, magicMimirOld) ||
			bytes.HasPrefix(v, magicThanosPostings)
	case 0xff:
		return bytes.HasPrefix(v, magicSnappyFramed)
	case 0x1f:
		return bytes.HasPrefix(v, magicGzip)
	case 0x28:
		return bytes.HasPrefix(v, magicZstd)
	case 0x04:
		return bytes.HasPrefix(v, magicLZ4Frame)
	}
	return false
}

// worthCompressing reports whether snappy is worth a try on v.
func (c *Codec) worthCompressing(v []byte) bool {
	return len(v) >= c.minSize && len(v) <= maxDecodedLen && c.minSavings < 1 && !alreadyCompressed(v)
}

// requiredSavings is how many bytes compressing a value of n bytes must
// save: the configured fraction, and at least one byte.
func (c *Codec) requiredSavings(n int) int {
	return max(1, int(math.Ceil(c.minSavings*float64(n))))
}
