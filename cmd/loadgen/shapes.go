package main

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strconv"

	"github.com/golang/snappy"
)

// A load's shape is what its keys and values look like. The plain shape is
// loadgen's own: short keys, values of --value-size bytes that name their
// key and version in a printable header. The others are shaped like what
// a Mimir store-gateway keeps in memcached, one tenant with the longest
// name Mimir allows (150 bytes) and a few blocks, all derived from the
// seed:
//
//	dm            P2:<tenant>:<block>:<label id> (224 bytes), values Mimir's
//	              "dm" postings of 2-4 KiB: the sidecar stores them as they are
//	raw-postings  the same keys, values raw postings lists of 10 to 50,000
//	              big-endian uint32 references (log-uniform, about 23 KB on
//	              average): the sidecar compresses them
//	series        S:<tenant>:<block>:<series ref> (at most 192 bytes), values
//	              of a few hundred bytes shaped like TSDB series entries,
//	              uncompressed
//
// In every shape version v of a key's value is derived from the seed, the
// key and v alone, and is stored with flags v, so a value read can be
// checked byte for byte against the version its flags name. Like the
// plain fillers, the bulk of a shaped value is cut from material built
// once (a pool of postings blocks, one long postings list, a pool of
// chunk lists), so that checking one is mostly a comparison of memory;
// what names the key and version is built per value: a dm value's
// matchers key, a series value's labels. A raw postings list has room for
// neither: where in the long list it is cut, and how long, are chosen by
// key and version, so a list read under another key or of another version
// is told apart unless both happen to be cut at the same place to the same
// length.
type shape interface {
	// appendKey appends the name of key id key.
	appendKey(dst []byte, key int) []byte
	// appendValue appends version v of key's value.
	appendValue(dst []byte, key int, v uint32) []byte
	// isValue reports whether data is, byte for byte, version v of key's
	// value.
	isValue(data []byte, key int, v uint32) bool
}

// The shapes' names, as --shape takes them.
const (
	shapePlain       = "plain"
	shapeDM          = "dm"
	shapeRawPostings = "raw-postings"
	shapeSeries      = "series"
)

var shapeNames = []string{shapePlain, shapeDM, shapeRawPostings, shapeSeries}

// newShape builds the shape cfg names, with everything its values are cut
// from.
func newShape(cfg *config) shape {
	switch cfg.shapeName {
	case shapeDM:
		return newDMShape(cfg.seed)
	case shapeRawPostings:
		return newRawShape(cfg.seed)
	case shapeSeries:
		return newSeriesShape(cfg.seed)
	}
	return plainShape{cfg}
}

// plainShape is loadgen's own shape (see values.go).
type plainShape struct{ cfg *config }

func (s plainShape) appendKey(dst []byte, key int) []byte {
	return strconv.AppendInt(append(dst, s.cfg.keyPrefix...), int64(key), 10)
}

func (s plainShape) appendValue(dst []byte, key int, v uint32) []byte {
	return appendValue(dst, s.cfg, key, v)
}

func (s plainShape) isValue(data []byte, key int, v uint32) bool { return isValue(data, s.cfg, key, v) }

// mix returns the seed of what is chosen for version v of key's value.
func mix(seed uint64, key int, v uint32) uint64 {
	s := seed ^ uint64(key)*0xd1b54a32d192ed03 ^ uint64(v)<<40
	return splitmix(&s)
}

// Mimir's key material: tenant IDs are at most 150 bytes of this alphabet,
// block IDs ULIDs (Crockford base32).
const (
	tenantLen      = 150
	tenantAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!-_.*'()"
	crockford      = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
	mimirBlocks    = 4
	// blocksEnd is when the newest block ends (November 2025), in
	// milliseconds; the others are two hours apart before it.
	blocksEnd = 1_763_000_000_000
)

// mimirKeys names keys as Mimir's index cache does, for one tenant and
// mimirBlocks blocks derived from the seed; key i is in block i mod
// mimirBlocks.
type mimirKeys struct {
	seed   uint64
	tenant []byte
	blocks [mimirBlocks][]byte
}

func newMimirKeys(seed uint64) *mimirKeys {
	k := &mimirKeys{seed: seed, tenant: make([]byte, tenantLen)}
	s := seed ^ 0x7e4a47
	for i := range k.tenant {
		k.tenant[i] = tenantAlphabet[splitmix(&s)%uint64(len(tenantAlphabet))]
	}
	for b := range k.blocks {
		ms := uint64(blocksEnd - b*2*3600*1000)
		k.blocks[b] = appendULID(nil, ms, splitmix(&s), splitmix(&s))
	}
	return k
}

// appendULID appends the 26 characters of the ULID of time ms (48 bits)
// and 80 random bits, taken from r1's low 16 bits and r2.
func appendULID(dst []byte, ms, r1, r2 uint64) []byte {
	hi, lo := ms<<16|r1&0xffff, r2
	// 26 characters of 5 bits are 130 bits: the first has only 3.
	for i := 25; i >= 0; i-- {
		shift := uint(5 * i)
		var c uint64
		switch {
		case shift >= 64:
			c = hi >> (shift - 64)
		case shift+5 <= 64:
			c = lo >> shift
		default:
			c = lo>>shift | hi<<(64-shift)
		}
		dst = append(dst, crockford[c&31])
	}
	return dst
}

// appendPrefix appends "<kind>:<tenant>:<block>:" for key.
func (k *mimirKeys) appendPrefix(dst []byte, kind string, key int) []byte {
	dst = append(dst, kind...)
	dst = append(dst, ':')
	dst = append(dst, k.tenant...)
	dst = append(dst, ':')
	dst = append(dst, k.blocks[key%mimirBlocks]...)
	return append(dst, ':')
}

// appendP2 appends key's postings key: P2:<tenant>:<block>:<label id>, the
// label id 43 characters of base64url as Mimir writes a blake2b-256 hash.
// Its last 8 bytes are the key id times an odd number, so no two keys
// share one.
func (k *mimirKeys) appendP2(dst []byte, key int) []byte {
	var id [32]byte
	s := k.seed ^ uint64(key)<<20
	for i := 0; i < 24; i += 8 {
		binary.BigEndian.PutUint64(id[i:], splitmix(&s))
	}
	binary.BigEndian.PutUint64(id[24:], uint64(key)*0x9e3779b97f4a7c15)
	return base64.RawURLEncoding.AppendEncode(k.appendPrefix(dst, "P2", key), id[:])
}

// appendS appends key's series key: S:<tenant>:<block>:<series ref>. The
// refs of successive keys are 37 apart, give or take under 32, so no two
// keys share one.
func (k *mimirKeys) appendS(dst []byte, key int) []byte {
	s := k.seed ^ uint64(key)<<20 ^ 0x5e
	ref := 4096 + uint64(key)*37 + splitmix(&s)%32
	return strconv.AppendUint(k.appendPrefix(dst, "S", key), ref, 10)
}

// postingsRefs returns n strictly ascending series references from a
// generator seeded by s: runs of a constant gap of 1 to 64, give or take
// 2, a new gap now and then and a jump of up to 21,000 rarely, the way
// series of one label value lie in a TSDB index. A longer list from the
// same s begins with the shorter one. n up to about 115,000 stays within
// 32 bits.
func postingsRefs(s uint64, n int) []uint32 {
	r := rand.New(rand.NewPCG(s, 0x9057))
	refs := make([]uint32, n)
	ref, gap := 1<<20+r.Uint32N(1<<20), 1+r.Uint32N(64)
	for i := range refs {
		refs[i] = ref
		switch x := r.IntN(100); {
		case x < 2:
			ref += 1000 + r.Uint32N(20_000)
		case x < 12:
			gap = 1 + r.Uint32N(64)
			ref += gap
		default:
			ref += gap + r.Uint32N(3)
		}
	}
	return refs
}

// appendDiffVarint appends refs as Mimir's postings codec writes them
// before snappy: the first reference, then each gap to the next, as
// uvarints.
func appendDiffVarint(dst []byte, refs []uint32) []byte {
	prev := uint32(0)
	for _, r := range refs {
		dst = binary.AppendUvarint(dst, uint64(r-prev))
		prev = r
	}
	return dst
}

// dmShape is the dm shape: Mimir postings keys with values as Mimir's
// postings codec writes them,
//
//	"dm" uvarint(len(m)) m  uvarint(#pending) {pending matcher}  snappy block
//
// m being the request's matchers key (each matcher as name, operator,
// value and a NUL) and the block the diff+varint postings. Here m names
// the key and the version, so it is built per value; the block is one of
// a pool built once.
type dmShape struct {
	keys   *mimirKeys
	seed   uint64
	blocks [][]byte
}

// dmPool is how many postings blocks the dm values are cut from.
const dmPool = 256

func newDMShape(seed uint64) *dmShape {
	s := &dmShape{keys: newMimirKeys(seed), seed: seed, blocks: make([][]byte, dmPool)}
	for i := range s.blocks {
		s.blocks[i] = snappy.Encode(nil, appendDiffVarint(nil, dmRefs(seed, i)))
	}
	return s
}

// dmRefs returns the postings of block i of the pool: a list whose block
// is 2 to 4 KiB (as near as a few rounds of resizing get), so that a value
// is about 3 KB.
func dmRefs(seed uint64, i int) []uint32 {
	r := rand.New(rand.NewPCG(seed, 0xd300+uint64(i)))
	target, s := 2048+r.IntN(2048), r.Uint64()
	n := 3000
	for range 3 {
		size := len(snappy.Encode(nil, appendDiffVarint(nil, postingsRefs(s, n))))
		n = max(1, n*target/size)
	}
	return postingsRefs(s, n)
}

func (s *dmShape) appendKey(dst []byte, key int) []byte { return s.keys.appendP2(dst, key) }

// block returns the pool index of version v of key's postings.
func (s *dmShape) block(key int, v uint32) int { return int(mix(s.seed, key, v) % dmPool) }

// appendHead appends what precedes the snappy block in version v of
// key's value. Every other value has one pending matcher, pod=~"lg-.+"
// (type 2, a regular expression), as a query whose matchers were not all
// applied to the postings leaves.
func (s *dmShape) appendHead(dst []byte, key int, v uint32) []byte {
	var mb [80]byte
	m := append(mb[:0], "__name__=lg_postings\x00lg_key="...)
	m = strconv.AppendInt(m, int64(key), 10)
	m = append(m, "\x00lg_version="...)
	m = strconv.AppendUint(m, uint64(v), 10)
	m = append(m, 0)
	dst = append(dst, "dm"...)
	dst = binary.AppendUvarint(dst, uint64(len(m)))
	dst = append(dst, m...)
	if (key+int(v))%2 == 0 {
		return append(dst, 0)
	}
	return append(dst, 1, 3, 'p', 'o', 'd', 2, 5, 'l', 'g', '-', '.', '+')
}

func (s *dmShape) appendValue(dst []byte, key int, v uint32) []byte {
	return append(s.appendHead(dst, key, v), s.blocks[s.block(key, v)]...)
}

func (s *dmShape) isValue(data []byte, key int, v uint32) bool {
	var hb [128]byte
	head := s.appendHead(hb[:0], key, v)
	rest, ok := bytes.CutPrefix(data, head)
	return ok && bytes.Equal(rest, s.blocks[s.block(key, v)])
}

// rawShape is the raw-postings shape: Mimir postings keys with values
// that are raw postings lists, big-endian uint32 references strictly
// ascending, each cut from one long list.
type rawShape struct {
	keys *mimirKeys
	seed uint64
	list []byte // rawPostingsMax+padSpan references
}

// The shortest and the longest raw postings list, in references.
const (
	rawPostingsMin = 10
	rawPostingsMax = 50_000
)

func newRawShape(seed uint64) *rawShape {
	refs := postingsRefs(seed^0x4a3, rawPostingsMax+padSpan)
	list := make([]byte, 0, 4*len(refs))
	for _, r := range refs {
		list = binary.BigEndian.AppendUint32(list, r)
	}
	return &rawShape{keys: newMimirKeys(seed), seed: seed, list: list}
}

func (s *rawShape) appendKey(dst []byte, key int) []byte { return s.keys.appendP2(dst, key) }

// value returns version v of key's list: rawPostingsMin to rawPostingsMax
// references, the count log-uniform (about 5,900, 23 KB, on average),
// from one of padSpan places in the long list.
func (s *rawShape) value(key int, v uint32) []byte {
	h := mix(s.seed, key, v)
	u := float64(h>>11) / (1 << 53)
	n := int(rawPostingsMin * math.Pow(rawPostingsMax/rawPostingsMin, u))
	n = min(max(n, rawPostingsMin), rawPostingsMax)
	off := int(splitmix(&h) % padSpan)
	return s.list[4*off : 4*(off+n)]
}

func (s *rawShape) appendValue(dst []byte, key int, v uint32) []byte {
	return append(dst, s.value(key, v)...)
}

func (s *rawShape) isValue(data []byte, key int, v uint32) bool {
	return bytes.Equal(data, s.value(key, v))
}

// seriesShape is the series shape: Mimir series keys with values shaped
// like a TSDB index series entry, uncompressed:
//
//	uvarint(#labels) {uvarint(name ref) uvarint(value ref)}
//	uvarint(#chunks) {chunk meta}
//
// the first chunk meta being varint(mint) uvarint(maxt-mint) uvarint(ref),
// the others uvarint(mint-previous maxt) uvarint(maxt-mint) varint(ref
// delta). The labels name the key and the version, so they are built per
// value; the chunk metas are one of a pool built once.
type seriesShape struct {
	keys   *mimirKeys
	seed   uint64
	chunks [][]byte
}

// seriesPool is how many chunk lists the series values are cut from.
const seriesPool = 256

func newSeriesShape(seed uint64) *seriesShape {
	s := &seriesShape{keys: newMimirKeys(seed), seed: seed, chunks: make([][]byte, seriesPool)}
	for i := range s.chunks {
		s.chunks[i] = seriesChunks(seed, i)
	}
	return s
}

// seriesChunks returns chunk list i of the pool: 15 to 60 chunks of half
// an hour each (120 samples 15 s apart), 7 bytes or so apiece.
func seriesChunks(seed uint64, i int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x5e00+uint64(i)))
	n := 15 + r.IntN(46)
	b := binary.AppendUvarint(nil, uint64(n))
	mint := int64(blocksEnd) - 86_400_000 + r.Int64N(3_600_000)
	ref := uint64(1<<32 + r.IntN(1<<24)) // segment file 1, an offset in it
	var prevMaxt int64
	var prevRef uint64
	for c := range n {
		maxt := mint + 1_785_000 + r.Int64N(30_000)
		if c == 0 {
			b = binary.AppendVarint(b, mint)
			b = binary.AppendUvarint(b, uint64(maxt-mint))
			b = binary.AppendUvarint(b, ref)
		} else {
			b = binary.AppendUvarint(b, uint64(mint-prevMaxt))
			b = binary.AppendUvarint(b, uint64(maxt-mint))
			b = binary.AppendVarint(b, int64(ref-prevRef))
		}
		prevMaxt, prevRef = maxt, ref
		mint = maxt + 15_000
		ref += 100 + uint64(r.IntN(200))
	}
	return b
}

func (s *seriesShape) appendKey(dst []byte, key int) []byte { return s.keys.appendS(dst, key) }

// appendHead appends the labels of version v of key's value: six to ten,
// as symbol references, the second naming the key and the third the
// version.
func (s *seriesShape) appendHead(dst []byte, key int, v uint32, h uint64) []byte {
	n := 6 + h%5
	dst = binary.AppendUvarint(dst, n)
	dst = binary.AppendUvarint(binary.AppendUvarint(dst, 1), 1000+h>>8%1000)
	dst = binary.AppendUvarint(binary.AppendUvarint(dst, 3), 100_000+uint64(key))
	dst = binary.AppendUvarint(binary.AppendUvarint(dst, 5), uint64(v))
	for i := uint64(3); i < n; i++ {
		dst = binary.AppendUvarint(binary.AppendUvarint(dst, 1+2*i), 2000+h>>(8+4*i)%5000)
	}
	return dst
}

func (s *seriesShape) appendValue(dst []byte, key int, v uint32) []byte {
	h := mix(s.seed, key, v)
	return append(s.appendHead(dst, key, v, h), s.chunks[h%seriesPool]...)
}

func (s *seriesShape) isValue(data []byte, key int, v uint32) bool {
	var hb [64]byte
	h := mix(s.seed, key, v)
	rest, ok := bytes.CutPrefix(data, s.appendHead(hb[:0], key, v, h))
	return ok && bytes.Equal(rest, s.chunks[h%seriesPool])
}
