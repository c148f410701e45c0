package keyspace

import (
	"encoding/base64"
	"slices"

	"golang.org/x/crypto/blake2b"
)

// Step says how far the rewrite of a key had to go.
type Step uint8

// Rewrite steps, in the order they are tried (see the package doc).
const (
	StepNone     Step = iota // the key passes unchanged
	StepTenant               // tenant segments hashed
	StepSegments             // tenant segments and some numbered segments hashed
	StepWhole                // the whole key hashed
)

var stepNames = [...]string{StepNone: "none", StepTenant: "tenant", StepSegments: "segments", StepWhole: "whole"}

// String names the step as a metric label.
func (s Step) String() string {
	if int(s) < len(stepNames) {
		return stepNames[s]
	}
	return "unknown"
}

// Steps returns the steps a rewrite can end at, so a metric can create each
// label at zero.
func Steps() []Step { return []Step{StepTenant, StepSegments, StepWhole} }

// AppendRewrite appends the upstream key for key to dst and returns it, with
// the step the rewrite ended at and the name of the scheme that matched
// (NoScheme if none did). A key that needs no rewrite is appended as it is,
// with StepNone and an empty scheme name. key must have passed Check.
//
// The result is at most --key-max-length bytes of bytes gomemcache accepts
// and depends on nothing but key and the key settings. It allocates only
// when dst has no room for the result, once.
func (k *Keyspace) AppendRewrite(dst, key []byte) (out []byte, step Step, scheme string) {
	if !k.NeedsRewrite(key) {
		return append(dst, key...), StepNone, ""
	}
	var m match
	return k.rewrite(dst, key, k.find(key, &m), &m)
}

// rewrite appends the upstream key for key, which needs a rewrite and
// whose first matching pattern is p (nil: none), with its segments in m.
func (k *Keyspace) rewrite(dst, key []byte, p *pattern, m *match) ([]byte, Step, string) {
	if p == nil {
		return k.appendWhole(dst, key), StepWhole, NoScheme
	}
	mask := p.tenantMask
	if mask != 0 {
		if n, ok := k.fits(p, key, m, mask); ok {
			return k.render(dst, key, p, m, mask, n), StepTenant, p.scheme.Name
		}
	}
	for _, h := range p.hashOrder {
		mask |= 1 << h
		if n, ok := k.fits(p, key, m, mask); ok {
			return k.render(dst, key, p, m, mask, n), StepSegments, p.scheme.Name
		}
	}
	return k.appendWhole(dst, key), StepWhole, p.scheme.Name
}

// fits returns the length of the upstream key that hashes the holes in
// mask, and whether that key is allowed: short enough, and every segment
// kept verbatim fit to be kept.
func (k *Keyspace) fits(p *pattern, key []byte, m *match, mask uint16) (int, bool) {
	n := 1 + p.litLen
	for h := range p.holes {
		if mask&(1<<h) != 0 {
			n += 1 + k.tokenChars
			continue
		}
		s := m.spans[h]
		if m.checked&(1<<h) == 0 {
			m.checked |= 1 << h
			if keepable(key[s.start:s.end]) {
				m.keepOK |= 1 << h
			}
		}
		if m.keepOK&(1<<h) == 0 {
			return 0, false
		}
		n += s.end - s.start
	}
	return n, n <= k.maxLen
}

// render appends the n-byte upstream key that hashes the holes in mask.
func (k *Keyspace) render(dst, key []byte, p *pattern, m *match, mask uint16, n int) []byte {
	dst = slices.Grow(dst, n)
	dst = append(dst, marker)
	h := 0
	for i := range p.parts {
		pt := &p.parts[i]
		if pt.lit != nil {
			dst = append(dst, pt.lit...)
			continue
		}
		seg := key[m.spans[h].start:m.spans[h].end]
		if mask&(1<<h) != 0 {
			dst = appendHash(append(dst, marker), seg, k.tokenChars)
		} else {
			dst = append(dst, seg...)
		}
		h++
	}
	return dst
}

// appendWhole appends the last-resort upstream key: "~~" and the hash of
// the whole key.
func (k *Keyspace) appendWhole(dst, key []byte) []byte {
	dst = slices.Grow(dst, 2+k.wholeChars)
	return appendHash(append(dst, marker, marker), key, k.wholeChars)
}

// appendHash appends the first n characters of the unpadded base64url
// encoding of blake2b-256(b). Sum256 keeps the state on the stack; New
// would allocate it.
func appendHash(dst, b []byte, n int) []byte {
	sum := blake2b.Sum256(b)
	var enc [wholeChars]byte
	base64.RawURLEncoding.Encode(enc[:], sum[:])
	return append(dst, enc[:n]...)
}
