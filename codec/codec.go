// Package codec wraps the values of postings-bearing keys, rewritten keys and
// flagged items in a compact envelope: compressed with snappy when that pays,
// checksummed, and bound to the exact client key, so that a damaged or
// colliding upstream item is refused instead of served. Every other value
// passes through byte for byte. The package is pure: no sockets, no metrics,
// no flag parsing beyond registering its Config.
//
// # Envelope format, version 1
//
// An enveloped item is marked upstream by one reserved bit of the memcached
// flags (Config.FlagBit, default bit 30 = 0x40000000). The upstream flags are
// the client's flags with that bit set; the client's own value of the bit is
// kept in the header byte (R below). The client's 32-bit flags thus travel
// with the item at no cost in bytes, and the checksum covers them.
//
// The stored data, byte by byte:
//
//	offset  size  field
//	0       1     header byte: bits 7-6 version (01), bit 5 B (a key binding
//	              is stored), bit 4 R (the client's flags had the reserved
//	              bit set), bits 3-0 codec id
//	1       4     CRC-32C (Castagnoli), little-endian, of the input below
//	5       16    key binding, only when B = 1: the first 16 bytes of
//	              blake2b-256 of the exact client key
//	5 or 21 1-5   decoded length n, uvarint (at most 2^32-1)
//	...           payload, by codec id:
//	                0 none:   the value itself, exactly n bytes
//	                1 snappy: the rest of a snappy block; the length field
//	                          above is the block's own preamble, so length and
//	                          payload together are one snappy block
//	                2 postings: one form byte, then the list's uvarint
//	                          stream, or a snappy block of it (see below)
//	                3 packed postings: one form byte, then the list's
//	                          packed stream, or a snappy block of it
//	                4-15:     reserved
//
// The CRC-32C input is the client's flags as 4 little-endian bytes, then the
// client key when B = 0 (nothing is stored for it: the upstream key is then
// the client key, so the key itself is the binding), then byte 0, then every
// stored byte from offset 5 to the end. The checksum thus covers every stored
// byte but its own four, in one contiguous run. Any change confined to 32
// consecutive bits of that run (a single changed byte is one) is a burst
// error that CRC-32C always detects, and a change in the checksum field
// itself no longer matches the recomputed one: no single-byte change anywhere
// in an envelope can decode. Nor can any change of the upstream flags word
// that keeps the reserved bit, as it changes the client's flags derived from
// it (an item that lost the reserved bit is, by definition, a plain value:
// the codec never sees it). Checksumming the stored bytes rather than the
// decoded value gives that guarantee for compressed payloads too (where one
// changed byte can change many decoded ones), and refuses a damaged payload
// before decompressing it. Decoding is deterministic, so the intact stored
// bytes stand for the value.
//
// The header is 6 bytes for values under 128 bytes, 7 under 16 KiB and 8
// under 2 MiB, one more per further 7 bits of length; a stored binding adds
// 16. A value that does not compress costs only the header.
//
// The binding is stored when the upstream key is not the client key (the key
// was rewritten). 16 bytes of blake2b-256 keep the header small and still
// leave 128 bits against a second preimage (another client key taking over a
// stored item) and 64 bits against an accidental collision among all keys
// ever written, on top of the collision resistance of the rewritten upstream
// key, which must collide first.
//
// Reading checks, in order: the reserved bit and the least size, the
// version, that a binding is stored exactly when one is expected, the rest
// of the header, the decoded length against Config.MaxValueSize, the
// checksum, the binding, the codec id, the decoded length against the
// payload, and the decode itself. The first failure is returned
// as an *Error naming its Reason; the caller serves a miss. Values of 4 GiB
// or more cannot be enveloped (memcached items stop at 1 GiB).
//
// # Compression
//
// Snappy is tried on a value of at least Config.MinSize bytes that does not
// start with the magic of a compressed format (Mimir "dm" and "dvs", Thanos
// "dss" plus snappy framing, the snappy framed stream, gzip, zstd, lz4
// frame), and kept only when it saves Config.MinSavings of the value's size
// and at least one byte. A value over 64 KiB is given up after its first
// 64 KiB block if that block alone does not save enough, so an
// incompressible megabyte costs one block of snappy, not a megabyte. A bare
// snappy block has no magic: the savings check is what leaves one alone.
//
// # Postings codec
//
// Under a postings-bearing key (AppendEncodePostings: the key starts with
// one of Config.Prefixes, or the caller knows it from its key scheme) a
// value that is a raw postings list is also tried with the postings codec,
// wherever snappy would be tried (the same minimum size, magic bytes and
// savings checks). A raw postings list is, exactly:
//
//	layout  bytes
//	0 tsdb  4-byte big-endian count c, then c big-endian uint32 references
//	1 u32   big-endian uint32 references (length a multiple of 4, not 0)
//	2 u64   big-endian uint64 references (length a multiple of 8, not 0)
//
// with the references strictly ascending. Detection reads the value once,
// four bytes at a time, and stops as soon as no layout fits; when a value
// reads as more than one layout, the one with the shortest stream is used
// (ties: tsdb, u32, u64). The payload is:
//
//	offset  size  field
//	0       1     form: bits 1-0 layout, bit 2 S (the stream is a snappy
//	              block), bits 7-3 zero
//	1       ...   the stream: the first reference, then each gap to the next
//	              reference, as uvarints (S = 0); or a snappy block of it
//	              (S = 1), kept only when shorter
//
// The number of references is not stored: the decoded length n and the
// layout give it (n/4, n/8, or (n-4)/4 after the count, which decoding
// writes back). Decoding refuses, before sizing any memory, a length that
// is no whole list in the layout, a stream shorter than one byte per
// reference or longer than ten, and a snappy stream longer than its block
// can expand to; then it refuses a stream with a gap of zero, a reference
// over the layout's width, or bytes left over. Its output buffer holds n
// bytes plus, for S = 1, the stream decompressed behind them.
//
// The envelope keeps whichever of postings, snappy and none takes fewest
// bytes (a compressed form must also save Config.MinSavings). The list is
// tried only when its uvarint stream is shorter than the value, which
// bounds the room encoding needs (MaxEncodedLen). Any value that is not a
// raw postings list, or is stored with AppendEncode, is enveloped exactly
// as before the postings codec existed. Proxies without it read codec-2
// items as refused (ReasonUnknownCodec), a miss: turn Config.Postings off
// while any of them still reads the upstreams.
//
// # Packed postings codec
//
// A list of 32-bit references (layouts tsdb and u32) is written with codec
// 3, which stores less than codec 2 and never needs snappy to do it (the
// two decode at similar speeds); codec 2 is still written for u64 lists, for a list whose packed stream
// would be longer than its uvarint stream, and with Config.PostingsCodec2.
// Both are always read. The payload:
//
//	offset  size  field
//	0       1     form: bits 1-0 layout (0 tsdb, 1 u32), bit 2 S (the
//	              stream is a snappy block), bits 7-3 zero
//	1       ...   the packed stream (S = 0), or a snappy block of it
//	              (S = 1), kept only when it saves a quarter of the stream
//
// The packed stream of c references is empty when c = 0; otherwise it is
// the first reference as a uvarint, then the c-1 gaps to each next
// reference in blocks of 32 (the last block holds what is left, k gaps).
// A block:
//
//	size         field
//	1            header: bits 5-0 width w (0-32), bit 6 P (exceptions
//	             follow), bit 7 O (order 2)
//	1, if P      e, the number of exceptions, 1 to k
//	(k*w+7)/8    the low w bits of the k values, value i in bits i*w to
//	             i*w+w-1 counted from bit 0 of the block's first byte
//	e, if P      the positions of the exceptions in the block, strictly
//	             ascending
//	..., if P    for each exception, the value's bits above w: a uvarint
//	             of one to five bytes, not 0, below 2^(32-w)
//
// With O = 0 a value is its gap less one; with O = 1 it is the gap minus
// the gap before it (1 before the first gap), zigzag-encoded: d >= 0 is
// 2d, d < 0 is -2d-1. Runs of equal gaps are thus order-2 values of 0, a
// block of them a single header byte. The encoder picks for each block the
// order and width that take fewest bytes. Decoding refuses, before sizing
// any memory, a length that is no whole list in the layout, a stream
// shorter than a byte for the first reference and one per block, and a
// snappy stream longer than its block can expand to; then a width over 32,
// exceptions at width 32, a gap below one, a reference over 32 bits, or
// bytes left over. Its output buffer holds n bytes plus, for S = 1, the
// stream decompressed behind them.
//
// Proxies that know codec 2 but not codec 3 read codec-3 items as refused
// (ReasonUnknownCodec, not Damaged, so never deleted), a miss: set
// Config.PostingsCodec2 while any of them still reads the upstreams.
//
// Changing the reserved bit, like changing the format, needs the upstreams
// flushed: items written under the old bit would pass through as plain
// values.
package codec

import "bytes"

// Codec ids, stored in the low four bits of the header byte.
const (
	// CodecNone stores the value as it is.
	CodecNone = 0
	// CodecSnappy stores a snappy block (github.com/golang/snappy, block
	// format, not the framed stream).
	CodecSnappy = 1
	// CodecPostings stores a raw postings list as the gaps between its
	// references, as uvarints (postings.go). Written today only for lists
	// of 64-bit references, or with Config.PostingsCodec2.
	CodecPostings = 2
	// CodecPostingsPacked stores a raw postings list of 32-bit references
	// as bit-packed blocks of gaps (packed.go).
	CodecPostingsPacked = 3
)

// Codec envelopes values and verifies envelopes. It holds only settings, so
// one Codec may be used by any number of goroutines.
type Codec struct {
	mask       uint32
	prefixes   [][]byte
	minSize    int
	minSavings float64
	postings   bool
	codec2     bool   // write codec 2 where codec 3 would do
	maxValue   uint64 // 0: as long as the format records
}

// New returns a Codec for cfg, or the first reason cfg cannot work.
func New(cfg Config) (*Codec, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Codec{
		mask:       1 << cfg.FlagBit,
		minSize:    cfg.MinSize,
		minSavings: cfg.MinSavings,
		postings:   cfg.Postings,
		codec2:     cfg.PostingsCodec2,
		maxValue:   uint64(max(cfg.MaxValueSize, 0)),
	}
	for _, p := range cfg.Prefixes {
		c.prefixes = append(c.prefixes, []byte(p))
	}
	return c, nil
}

// FlagMask returns the reserved flags bit as a mask.
func (c *Codec) FlagMask() uint32 { return c.mask }

// ShouldEnvelope reports whether a value stored under the client key with
// the client flags must be enveloped: the key starts with a postings-bearing
// prefix, or the flags use the reserved bit (which only an envelope can give
// back). A caller also envelopes every value whose key it rewrote.
func (c *Codec) ShouldEnvelope(key []byte, flags uint32) bool {
	return flags&c.mask != 0 || c.PostingsKey(key)
}

// PostingsKey reports whether the client key starts with one of the
// configured prefixes, whose values are postings-bearing: the caller
// envelopes them with AppendEncodePostings.
func (c *Codec) PostingsKey(key []byte) bool {
	for _, p := range c.prefixes {
		if bytes.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// IsEnveloped reports whether an item read from upstream with these flags is
// an envelope, to be opened with AppendDecode; any other item is the
// client's value as it was stored.
func (c *Codec) IsEnveloped(storedFlags uint32) bool { return storedFlags&c.mask != 0 }
