package proxy

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// Meta replies memcached 1.6 gives to the read-modify-write of an
// enveloped item.
var (
	metaValue    = []byte("VA ")
	metaMiss     = []byte("EN\r\n")
	metaStored   = []byte("HD\r\n")
	metaExists   = []byte("EX\r\n")
	metaNotFound = []byte("NF\r\n")
	metaNotStore = []byte("NS\r\n")
)

// maxRelativeTTL is the longest exptime memcached reads as seconds from
// now; a larger one is a Unix time.
const maxRelativeTTL = 60 * 60 * 24 * 30

// metaItem is what a read-modify-write needs of an item besides its value.
type metaItem struct {
	flags uint32
	cas   uint64
	ttl   int32 // seconds left to live; -1: never expires
}

// getForUpdate reads key's item with memcached's meta get, which, unlike
// gets, also tells how long the item has left to live, so that writing it
// back keeps its expiry as memcached's own append and incr do. The value is
// read into dst, grown once to its size. found is false on a miss.
func (p *rawPool) getForUpdate(key string, dst []byte) (value []byte, it metaItem, found bool, err error) {
	err = p.do(func(c *rawConn) error {
		found = false
		c.rw.WriteString("mg ")
		c.rw.WriteString(key)
		c.rw.WriteString(" v f c t\r\n")
		if err := c.rw.Flush(); err != nil {
			return err
		}
		line, err := c.rw.ReadSlice('\n')
		if err != nil {
			return err
		}
		if bytes.Equal(line, metaMiss) {
			return nil
		}
		var size int
		if size, it, err = parseMetaValue(line); err != nil {
			return err
		}
		value = slices.Grow(dst[:0], size)[:size]
		if err := readValue(c.rw.Reader, value); err != nil {
			return err
		}
		found = true
		return nil
	})
	return value, it, found, err
}

// parseMetaValue reads the header line of a meta get hit, "VA <size>
// <flags>*\r\n", as "mg <key> v f c t" is answered: the value's size and
// the item's flags, CAS value and time to live. It is strict where the
// request parser is lenient: memcached writes this line one way (single
// spaces, plain decimals), and anything else means the connection is not
// talking to a memcached any more. Flags the proxy did not ask for are
// skipped; a size over 1 GiB is refused, so a broken server cannot make
// the proxy reserve more.
func parseMetaValue(line []byte) (size int, it metaItem, err error) {
	bad := func() (int, metaItem, error) {
		return 0, metaItem{}, fmt.Errorf("%w: %q", errUnexpectedReply, line)
	}
	rest, ok := bytes.CutPrefix(line, metaValue)
	if !ok || !bytes.HasSuffix(rest, crlf) {
		return bad()
	}
	rest = rest[:len(rest)-2]
	word, rest, more := bytes.Cut(rest, []byte{' '})
	n, ok := parseDecimal(word, 1<<30)
	if !ok {
		return bad()
	}
	it = metaItem{ttl: -1}
	for more {
		word, rest, more = bytes.Cut(rest, []byte{' '})
		if len(word) == 0 || bytes.ContainsFunc(word, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			return bad()
		}
		var v uint64
		switch word[0] {
		case 'f':
			v, ok = parseDecimal(word[1:], math.MaxUint32)
			it.flags = uint32(v)
		case 'c':
			v, ok = parseDecimal(word[1:], math.MaxUint64)
			it.cas = v
		case 't':
			// -1 is "never expires"; memcached writes no other negative.
			if string(word[1:]) == "-1" {
				it.ttl = -1
				continue
			}
			v, ok = parseDecimal(word[1:], math.MaxInt32)
			it.ttl = int32(v)
		}
		if !ok {
			return bad()
		}
	}
	return int(n), it, nil
}

// exptimeOf is the exptime that gives an item ttl seconds left to live
// (-1: forever), as memcached reads exptimes: a relative one only up to 30
// days, a Unix time beyond.
func exptimeOf(ttl int32) int64 {
	t := int64(ttl)
	switch {
	case t < 0:
		return 0 // never expires
	case t == 0:
		return 1
	case t > maxRelativeTTL:
		return t + time.Now().Unix()
	}
	return t
}

// parseDecimal parses a non-empty run of decimal digits no larger than max.
func parseDecimal(b []byte, max uint64) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (max-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// storeIfUnchanged writes value under key with memcached's meta set, only
// if the item still has it.cas, with the item's flags and remaining time to
// live. conflict reports that the item changed or went away since it was
// read; notStored that memcached refused the value (too large); cas is the
// CAS value of the item stored. Unlike
// other requests on this pool it is never sent twice: when a reply is lost
// the write may have happened, and joining twice would corrupt the value.
func (p *rawPool) storeIfUnchanged(key string, it metaItem, value []byte) (conflict, notStored bool, cas uint64, err error) {
	ttl := exptimeOf(it.ttl)
	// Not through do, which may send twice: once, under the server's
	// health all the same.
	err = p.guard(func() error {
		return p.once(func(c *rawConn) error {
			b := append(c.rw.AvailableBuffer(), "ms "...)
			b = append(b, key...)
			b = append(b, ' ')
			b = strconv.AppendInt(b, int64(len(value)), 10)
			b = append(b, " C"...)
			b = strconv.AppendUint(b, it.cas, 10)
			b = append(b, " F"...)
			b = strconv.AppendUint(b, uint64(it.flags), 10)
			b = append(b, " T"...)
			b = strconv.AppendInt(b, ttl, 10)
			b = append(b, " c\r\n"...)
			c.rw.Write(b)
			c.rw.Write(value)
			c.rw.Write(crlf)
			if err := c.rw.Flush(); err != nil {
				return err
			}
			line, err := c.rw.ReadSlice('\n')
			if err != nil {
				return err
			}
			switch {
			case bytes.HasPrefix(line, storedWithCAS) && bytes.HasSuffix(line, crlf):
				var ok bool
				if cas, ok = parseDecimal(line[len(storedWithCAS):len(line)-2], math.MaxUint64); !ok {
					return fmt.Errorf("%w: %q", errUnexpectedReply, line)
				}
			case bytes.HasPrefix(line, metaExists[:2]), bytes.HasPrefix(line, metaNotFound[:2]):
				conflict = true
			case bytes.HasPrefix(line, metaNotStore[:2]), bytes.Equal(line, replyTooLarge):
				notStored = true
			default:
				return fmt.Errorf("%w: %q", errUnexpectedReply, line)
			}
			return nil
		})
	})
	return conflict, notStored, cas, err
}

// storedWithCAS begins memcached's answer to a meta set that asked for
// the new CAS value ("HD c<cas>").
var storedWithCAS = []byte("HD c")
