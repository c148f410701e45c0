package keyspace

import "encoding/binary"

// Reason says why a client key was refused.
type Reason uint8

// Reasons a key is refused. Every one is answered with memcached's
// "CLIENT_ERROR bad command line format".
const (
	ReasonOK      Reason = iota
	ReasonEmpty          // the key has no bytes
	ReasonTooLong        // longer than --key-max-client-length
	ReasonBadByte        // holds a space, CR, LF or NUL
)

var reasonNames = [...]string{ReasonOK: "ok", ReasonEmpty: "empty", ReasonTooLong: "too_long", ReasonBadByte: "bad_byte"}

// String names the reason as a metric label.
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// Reasons returns every reason a key can be refused for, so a metric can
// create each label at zero.
func Reasons() []Reason { return []Reason{ReasonEmpty, ReasonTooLong, ReasonBadByte} }

// marker starts every rewritten key and every hash token inside one. It is
// outside the Mimir/Cortex tenant alphabet (a-zA-Z0-9!-_.*'()), base64url,
// ULIDs and decimal numbers, so a token is never mistaken for a tenant or a
// real segment, and it is printable ASCII, so upstream keys stay readable.
const marker = '~'

// Check reports whether memcached would accept key: 1 to
// --key-max-client-length bytes, none of them space, CR, LF or NUL. It
// allocates nothing.
func (k *Keyspace) Check(key []byte) (ok bool, reason Reason) {
	r, _ := k.Inspect(key)
	return r == ReasonOK, r
}

// Inspect is Check and NeedsRewrite in one scan of key: why it is refused
// (ReasonOK when it is not) and, when it is accepted, whether it cannot be
// sent upstream as it is. A request that looks at both reads each key once.
func (k *Keyspace) Inspect(key []byte) (reason Reason, rewrite bool) {
	switch {
	case len(key) == 0:
		return ReasonEmpty, false
	case len(key) > k.maxClientLen:
		return ReasonTooLong, false
	}
	rewrite = len(key) > k.maxLen
	b := key
	for len(b) >= 8 {
		if w := binary.LittleEndian.Uint64(b); hasLess(w, ' '+1) || hasByte(w, 0x7f) {
			if badIn(b[:8]) {
				return ReasonBadByte, false
			}
			rewrite = true // a control byte or DEL
		}
		b = b[8:]
	}
	if badIn(b) {
		return ReasonBadByte, false
	}
	return ReasonOK, rewrite || hasIllegal(b)
}

// CheckBinary is Check for a key a meta command sent in base64 (flag b),
// decoded: memcached takes any bytes in it, so only its length counts.
// Such a key holding a byte memcached would end a key at is rewritten
// (see NeedsRewrite), like any key the upstream cannot carry as it is.
func (k *Keyspace) CheckBinary(key []byte) (ok bool, reason Reason) {
	switch {
	case len(key) == 0:
		return false, ReasonEmpty
	case len(key) > k.maxClientLen:
		return false, ReasonTooLong
	}
	return true, ReasonOK
}

// NeedsRewrite reports whether key, already accepted by Check, cannot be
// sent upstream as it is: it is longer than --key-max-length, holds a
// control byte (below 0x20) or DEL (0x7f), which gomemcache refuses. (A
// space would count too, but Check refuses it first.) Every other accepted
// key, '~' included wherever it stands, goes upstream unchanged. It
// allocates nothing.
func (k *Keyspace) NeedsRewrite(key []byte) bool {
	if len(key) == 0 {
		return false
	}
	return len(key) > k.maxLen || hasIllegal(key)
}

// The scans below look at eight bytes at a time: keys are checked on every
// request, and most are 40 to 250 bytes of printable ASCII. The tests are the
// classic word-at-a-time ones ("Bit Twiddling Hacks"): hasLess(w, n) is true
// exactly when some byte of w is below n (n ≤ 128), hasByte(w, c) when some
// byte equals c.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

func hasLess(w, n uint64) bool { return (w-ones*n)&^w&highs != 0 }

func hasByte(w, c uint64) bool { return hasLess(w^(ones*c), 1) }

// badIn reports whether b holds a byte memcached ends a key at.
func badIn(b []byte) bool {
	for _, c := range b {
		if c == ' ' || c == '\r' || c == '\n' || c == 0 {
			return true
		}
	}
	return false
}

// hasIllegal reports whether b holds a byte gomemcache refuses: a control
// byte, space or DEL.
func hasIllegal(b []byte) bool {
	for len(b) >= 8 {
		w := binary.LittleEndian.Uint64(b)
		if hasLess(w, ' '+1) || hasByte(w, 0x7f) {
			return true
		}
		b = b[8:]
	}
	for _, c := range b {
		if c <= ' ' || c == 0x7f {
			return true
		}
	}
	return false
}

// keepable reports whether seg may stay verbatim in an upstream key: no
// byte gomemcache refuses (space, control bytes, DEL) and no '~', so that
// in an upstream key every '~' after the first byte starts a hash token.
func keepable(seg []byte) bool {
	for len(seg) >= 8 {
		w := binary.LittleEndian.Uint64(seg)
		if hasLess(w, ' '+1) || hasByte(w, 0x7f) || hasByte(w, marker) {
			return false
		}
		seg = seg[8:]
	}
	for _, c := range seg {
		if c <= ' ' || c == 0x7f || c == marker {
			return false
		}
	}
	return true
}
