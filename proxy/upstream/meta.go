package upstream

import (
	"bytes"
	"fmt"
	"math"
	"strconv"

	"mcsidecar/proxy/internal/wire"
)

// MetaItem is what a read-modify-write needs of an item besides its value.
type MetaItem struct {
	Flags uint32
	CAS   uint64
	TTL   int32 // seconds left to live; -1: never expires
}

// ParseMetaValue reads the header line of a meta get hit, "VA <size>
// <flags>*\r\n", as "mg <key> v f c t" is answered: the value's size and
// the item's flags, CAS value and time to live. It is strict where the
// request parser is lenient: memcached writes this line one way (single
// spaces, plain decimals), and anything else means the connection is not
// talking to a memcached any more. Flags the proxy did not ask for are
// skipped, but f, c and t, which it always asks for, must each be there:
// memcached returns every flag asked, and a hit without its flags (a
// damaged "f" read as some other letter) would make an envelope look like
// a plain value. A size over 1 GiB is refused, so a broken server cannot
// make the proxy reserve more.
func ParseMetaValue(line []byte) (size int, it MetaItem, err error) {
	bad := func() (int, MetaItem, error) {
		return 0, MetaItem{}, fmt.Errorf("%w: %q", errUnexpectedReply, line)
	}
	rest, ok := bytes.CutPrefix(line, metaValue)
	if !ok || !bytes.HasSuffix(rest, crlf) {
		return bad()
	}
	rest = rest[:len(rest)-2]
	word, rest, more := bytes.Cut(rest, []byte{' '})
	n, ok := wire.ParseDecimal(word, MaxValueLen)
	if !ok {
		return bad()
	}
	it = MetaItem{TTL: -1}
	var seen uint8 // f, c and t: 1, 2 and 4
	for more {
		word, rest, more = bytes.Cut(rest, []byte{' '})
		if len(word) == 0 || bytes.ContainsFunc(word, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			return bad()
		}
		var v uint64
		switch word[0] {
		case 'f':
			seen |= 1
			v, ok = wire.ParseDecimal(word[1:], math.MaxUint32)
			it.Flags = uint32(v)
		case 'c':
			seen |= 2
			v, ok = wire.ParseDecimal(word[1:], math.MaxUint64)
			it.CAS = v
		case 't':
			seen |= 4
			// -1 is "never expires"; memcached writes no other negative.
			if string(word[1:]) == "-1" {
				it.TTL = -1
				continue
			}
			v, ok = wire.ParseDecimal(word[1:], math.MaxInt32)
			it.TTL = int32(v)
		}
		if !ok {
			return bad()
		}
	}
	if seen != 7 {
		return bad()
	}
	return int(n), it, nil
}

// AppendStoreIfUnchanged appends the request StoreIfUnchanged sends: an
// ms of value under key with the item's flags and remaining time to live,
// only if it still has it.CAS, asking for the new CAS value.
func AppendStoreIfUnchanged(b []byte, key string, it MetaItem, value []byte) []byte {
	b = append(b, "ms "...)
	b = append(b, key...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(len(value)), 10)
	b = append(b, " C"...)
	b = strconv.AppendUint(b, it.CAS, 10)
	b = append(b, " F"...)
	b = strconv.AppendUint(b, uint64(it.Flags), 10)
	b = append(b, " T"...)
	b = strconv.AppendInt(b, wire.ExptimeOf(it.TTL), 10)
	b = append(b, " c\r\n"...)
	b = append(b, value...)
	return append(b, crlf...)
}

// StoreIfUnchangedReply reads memcached's reply line to that request (see
// StoreIfUnchanged).
func StoreIfUnchangedReply(line []byte) (conflict, notStored bool, cas uint64, err error) {
	switch {
	case bytes.HasPrefix(line, storedWithCAS) && bytes.HasSuffix(line, crlf):
		var ok bool
		if cas, ok = wire.ParseDecimal(line[len(storedWithCAS):len(line)-2], math.MaxUint64); !ok {
			return false, false, 0, fmt.Errorf("%w: %q", errUnexpectedReply, line)
		}
	case bytes.HasPrefix(line, metaExists[:2]), bytes.HasPrefix(line, metaNotFound[:2]):
		conflict = true
	case bytes.HasPrefix(line, metaNotStore[:2]), bytes.Equal(line, replyTooLarge):
		notStored = true
	default:
		return false, false, 0, fmt.Errorf("%w: %q", errUnexpectedReply, line)
	}
	return conflict, notStored, cas, nil
}
