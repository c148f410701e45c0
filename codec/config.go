package codec

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/spf13/pflag"
)

// DefaultFlagBit is the memcached flags bit that marks an enveloped item:
// bit 30, 0x40000000. Client libraries number their own flags from the
// bottom (mcrouter's table runs 0x1–0x200000; pymemcache, Dalli,
// spymemcached and libmemcached stay in the low 16 bits), and bit 31 is
// avoided because clients that hold flags in a signed 32-bit integer (Java,
// PHP on 32-bit builds) would see the item's flags turn negative. A client
// that uses bit 30 anyway loses nothing: its values are enveloped and its
// flags, bit 30 included, come back exactly.
const DefaultFlagBit = 30

// DefaultPrefixes are the key prefixes of Mimir's and Thanos's
// postings-bearing index-cache entries: postings, expanded postings and
// series-for-postings, current and older spellings.
var DefaultPrefixes = []string{"P2:", "E2:", "SP2:", "P:", "E:", "EP:", "SP:"}

// Config holds the value settings.
type Config struct {
	// FlagBit is the number (0 = least significant) of the memcached flags
	// bit that marks an enveloped item upstream.
	FlagBit uint
	// Prefixes are the key prefixes whose values are enveloped.
	Prefixes []string
	// MinSize is the smallest value worth trying to compress.
	MinSize int
	// MinSavings is the fraction of a value's size that compressing must
	// save for the compressed form to be stored.
	MinSavings float64
	// Postings stores raw postings lists under postings-bearing keys with
	// a postings codec (id 3, or 2, see PostingsCodec2) when that takes
	// fewest bytes. Proxies of a version without postings codecs read such
	// items as misses (unknown codec): keep it off while one of them still
	// reads the same upstreams.
	Postings bool
	// PostingsCodec2 writes raw postings lists with codec 2 (uvarint
	// gaps) where codec 3 (bit-packed gaps, stored smaller) would be
	// used. Sidecars that know codec 2 but not codec 3
	// read codec-3 items as misses: turn it on while one of them still
	// reads the same upstreams. Both are always read.
	PostingsCodec2 bool
	// MaxValueSize, when above 0, is the longest value the caller ever
	// envelopes: a stored envelope that records a longer one is refused
	// before memory is sized for it, so a forged item cannot make a read
	// allocate many times its stored size. The proxy sets it from
	// --max-value-size; it is not a flag of its own.
	MaxValueSize int
	// DeleteCorrupt asks the proxy to delete an item upstream when its
	// envelope is refused for a reason that is Damaged. The codec itself
	// never acts on it.
	DeleteCorrupt bool
}

// RegisterFlags adds the value settings to fs, with defaults meant for a
// sidecar of a Mimir store-gateway.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.UintVar(&c.FlagBit, "codec-flag-bit", DefaultFlagBit,
		"number (0-31) of the memcached flags bit that marks an enveloped item upstream; changing it orphans every enveloped item, so flush the upstreams when you do")
	fs.StringSliceVar(&c.Prefixes, "codec-prefixes", append([]string(nil), DefaultPrefixes...),
		"key prefixes whose values are compressed, checksummed and bound to their key; give the whole list to add one (e.g. --codec-prefixes=P2:,E2:,SP2:,P:,E:,EP:,SP:,S: adds series), or an empty list to envelope none by prefix")
	fs.IntVar(&c.MinSize, "codec-min-size", 64, "smallest enveloped value (bytes) worth trying to compress with snappy")
	fs.Float64Var(&c.MinSavings, "codec-min-savings", 0.1, "fraction of its size that compressing must save for a value to be stored compressed (0-1; 1 never compresses)")
	fs.BoolVar(&c.Postings, "codec-postings", true,
		"store raw postings lists (TSDB count-prefixed, or ascending big-endian uint32/uint64 arrays) under postings-bearing keys as their gaps (bit-packed, codec 3; uvarints then snappy, codec 2, for 64-bit references), when that takes fewest bytes; turn off while proxies without this codec still read the same upstreams (they see those items as misses)")
	fs.BoolVar(&c.PostingsCodec2, "codec-postings-codec2", false,
		"write raw postings lists with the older codec 2 (uvarint gaps) instead of codec 3 (bit-packed gaps, faster to decode); turn on while sidecars that read codec 2 but not codec 3 still read the same upstreams (they see codec-3 items as misses)")
	fs.BoolVar(&c.DeleteCorrupt, "codec-delete-corrupt", false,
		"also delete an item upstream when its envelope is damaged (it is a miss either way, and the client's refill overwrites it); items of another key or a newer format are never deleted")
}

// Validate reports the first setting that cannot work.
func (c *Config) Validate() error {
	if c.FlagBit > 31 {
		return fmt.Errorf("--codec-flag-bit %d: want a bit number from 0 to 31", c.FlagBit)
	}
	for _, p := range c.Prefixes {
		if p == "" {
			return errors.New("--codec-prefixes: empty prefix (it would envelope every key)")
		}
		if strings.ContainsAny(p, " \r\n\x00") {
			return fmt.Errorf("--codec-prefixes %q: a key never holds space, CR, LF or NUL", p)
		}
	}
	if c.MinSize < 0 {
		return errors.New("--codec-min-size must not be negative")
	}
	if math.IsNaN(c.MinSavings) || c.MinSavings < 0 || c.MinSavings > 1 {
		return errors.New("--codec-min-savings must be a fraction from 0 to 1")
	}
	return nil
}
