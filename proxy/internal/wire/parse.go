// Package wire reads the words and numbers of memcached's text protocol
// the way memcached itself reads them, for both sides of the proxy: the
// requests of clients and the replies of servers.
package wire

import (
	"bytes"
	"time"
)

// Tokenize splits line on single spaces the way memcached's tokenize_command
// does: runs of spaces separate words, other bytes (tabs included) belong to
// words. Words are appended to dst as sub-slices of line, so nothing is
// copied. At most limit words are taken; more reports true in overflow.
func Tokenize(dst [][]byte, line []byte, limit int) (words [][]byte, overflow bool) {
	words = dst[:0]
	for i := 0; i < len(line); {
		if line[i] == ' ' {
			i++
			continue
		}
		// A word runs to the next space: found by IndexByte, which reads
		// a 224-byte key many bytes at a time.
		end := bytes.IndexByte(line[i:], ' ')
		if end < 0 {
			end = len(line)
		} else {
			end += i
		}
		if len(words) == limit {
			return words, true
		}
		words = append(words, line[i:end])
		i = end + 1
	}
	return words, false
}

// isCSpace reports whether b is white space for C's isspace in the C locale.
func isCSpace(b byte) bool {
	return b == ' ' || (b >= '\t' && b <= '\r')
}

// parseCUnsigned parses s the way C's strtoull does in base 10: leading
// white space, an optional sign, then digits. A minus sign negates the value
// modulo 2^64, as C does. It fails when no digit is read, on overflow, or
// when anything but white space follows the digits — memcached's
// safe_strto* rules.
func parseCUnsigned(s []byte) (v uint64, negative, ok bool) {
	i := 0
	for i < len(s) && isCSpace(s[i]) {
		i++
	}
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		negative = s[i] == '-'
		i++
	}
	start := i
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		d := uint64(s[i] - '0')
		if v > (1<<64-1-d)/10 {
			return 0, false, false
		}
		v = v*10 + d
	}
	if i == start || (i < len(s) && !isCSpace(s[i])) {
		return 0, false, false
	}
	if negative {
		v = -v
	}
	return v, negative, true
}

// ParseUint64 is memcached's safe_strtoull: a result that reads as a
// negative signed number is refused when a '-' appears anywhere in the word
// (memcached asks strchr, so a '-' after the digits and a tab counts too).
func ParseUint64(s []byte) (uint64, bool) {
	v, _, ok := parseCUnsigned(s)
	if !ok || int64(v) < 0 && bytes.IndexByte(s, '-') >= 0 {
		return 0, false
	}
	return v, true
}

// ParseUint32 is memcached's safe_strtoul on a 64-bit build: it parses 64
// bits and keeps the low 32, as the C assignment does.
func ParseUint32(s []byte) (uint32, bool) {
	v, ok := ParseUint64(s)
	return uint32(v), ok
}

// ParseInt32 is memcached's safe_strtol on a 64-bit build: strtol's range is
// int64, and the result is truncated to 32 bits.
func ParseInt32(s []byte) (int32, bool) {
	v, neg, ok := parseCUnsigned(s)
	if !ok {
		return 0, false
	}
	// strtol reports ERANGE outside [-2^63, 2^63-1]; after the modular
	// negation an in-range negative number reads as negative (or zero).
	if neg && v != 0 && int64(v) > 0 || !neg && int64(v) < 0 {
		return 0, false
	}
	return int32(int64(v)), true
}

// MaxRelativeTTL is the longest exptime memcached reads as seconds from
// now; a larger one is a Unix time.
const MaxRelativeTTL = 60 * 60 * 24 * 30

// ExptimeOf is the exptime that gives an item ttl seconds left to live
// (-1: forever), as memcached reads exptimes: a relative one only up to 30
// days, a Unix time beyond.
func ExptimeOf(ttl int32) int64 {
	t := int64(ttl)
	switch {
	case t < 0:
		return 0 // never expires
	case t == 0:
		return 1
	case t > MaxRelativeTTL:
		return t + time.Now().Unix()
	}
	return t
}

// ParseDecimal parses a non-empty run of decimal digits no larger than max.
func ParseDecimal(b []byte, max uint64) (uint64, bool) {
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

// ValueLine is what the line that begins a retrieval's hit says.
type ValueLine struct {
	Key    []byte
	Flags  uint32
	Size   int
	CAS    uint64
	HasCAS bool // a fourth word: the line answers a gets
}

// ParseValue reads the line memcached begins a retrieval's hit with,
// "VALUE <key> <flags> <bytes>[ <cas>]\r\n", as memcached writes it: single
// spaces, no word empty, numbers in decimal. The size is at most 2^31-1.
func ParseValue(line []byte) (v ValueLine, ok bool) {
	rest, ok := bytes.CutPrefix(line, []byte("VALUE "))
	if !ok {
		return v, false
	}
	rest, ok = bytes.CutSuffix(rest, []byte("\r\n"))
	if !ok {
		return v, false
	}
	// Three or four words, single spaces, none empty, as memcached
	// writes them.
	var f [4][]byte
	n := 0
	for {
		i := bytes.IndexByte(rest, ' ')
		if n == 4 || i == 0 || len(rest) == 0 {
			return v, false
		}
		if i < 0 {
			f[n] = rest
			n++
			break
		}
		f[n], rest = rest[:i], rest[i+1:]
		n++
	}
	if n < 3 {
		return v, false
	}
	fl, okF := ParseDecimal(f[1], 1<<32-1)
	sz, okS := ParseDecimal(f[2], 1<<31-1)
	okC := true
	if n == 4 {
		v.CAS, okC = ParseDecimal(f[3], 1<<64-1)
	}
	v.Key, v.Flags, v.Size, v.HasCAS = f[0], uint32(fl), int(sz), n == 4
	return v, okF && okS && okC
}

// ParseValueLine is ParseValue with the line's parts apart.
func ParseValueLine(line []byte) (key []byte, flags uint32, size int, cas uint64, ok bool) {
	v, ok := ParseValue(line)
	if !ok {
		return nil, 0, 0, 0, false
	}
	return v.Key, v.Flags, v.Size, v.CAS, true
}
