package keyspace

import (
	"bytes"
	"math/bits"
)

// Hash lengths in base64 characters: a segment token keeps 96 bits of
// blake2b-256, the whole-key hash all 256.
const (
	tokenChars = 16
	wholeChars = 43
)

// Keyspace validates client keys and maps them to upstream keys under one
// Config. It is immutable and safe for concurrent use.
type Keyspace struct {
	maxLen       int
	maxClientLen int
	tokenChars   int
	wholeChars   int
	patterns     []*pattern
	// byFirst[b] lists, in table order, the patterns a key starting with
	// byte b can match, so a key is tried against few patterns.
	byFirst [256][]*pattern
	names   []string
}

// New checks cfg and builds its Keyspace.
func New(cfg Config) (*Keyspace, error) {
	pats, err := cfg.compile()
	if err != nil {
		return nil, err
	}
	k := &Keyspace{
		maxLen:       cfg.MaxLength,
		maxClientLen: cfg.MaxClientLength,
		tokenChars:   tokenChars,
		wholeChars:   wholeChars,
		patterns:     pats,
	}
	if n := cfg.TestHashChars; n > 0 {
		k.tokenChars, k.wholeChars = n, n
	}
	seen := map[string]bool{}
	for _, p := range pats {
		for b := range k.byFirst {
			if first := p.parts[0].lit; first == nil || first[0] == byte(b) {
				k.byFirst[b] = append(k.byFirst[b], p)
			}
		}
		if !seen[p.scheme.Name] {
			seen[p.scheme.Name] = true
			k.names = append(k.names, p.scheme.Name)
		}
	}
	k.names = append(k.names, NoScheme)
	return k, nil
}

// MaxLength returns the longest key sent upstream.
func (k *Keyspace) MaxLength() int { return k.maxLen }

// MaxClientLength returns the longest key a client may send.
func (k *Keyspace) MaxClientLength() int { return k.maxClientLen }

// SchemeNames returns the name of every scheme that is on, in the order
// they are tried, then NoScheme: the values of a "scheme" metric label.
func (k *Keyspace) SchemeNames() []string { return append([]string(nil), k.names...) }

// SchemeOf returns the scheme of the first pattern key matches, and false
// if none does. The value codec asks it whether a key is postings-bearing.
// It allocates nothing.
func (k *Keyspace) SchemeOf(key []byte) (Scheme, bool) {
	var m match
	if p := k.find(key, &m); p != nil {
		return *p.scheme, true
	}
	return Scheme{}, false
}

// Immutable reports whether the value stored under key never changes: the
// first pattern it matches is of an immutable scheme, or one marked so. A
// key no scheme matches is not. It allocates nothing.
func (k *Keyspace) Immutable(key []byte) bool {
	var m match
	p := k.find(key, &m)
	return p != nil && p.immutable
}

// find returns the first pattern key matches, with its segments in m.
func (k *Keyspace) find(key []byte, m *match) *pattern {
	if len(key) == 0 {
		return nil
	}
	pipe := 0 // whether key holds a '|': 1 yes, -1 no, 0 not looked yet
	for _, p := range k.byFirst[key[0]] {
		if p.pipe {
			if pipe == 0 {
				pipe = -1
				if bytes.IndexByte(key, '|') >= 0 {
					pipe = 1
				}
			}
			if pipe < 0 {
				continue
			}
		}
		if p.matchKey(key, m) {
			return p
		}
	}
	return nil
}

// Tenant returns the tenant segment of key: the first {tenant} or
// {tenants} segment of the first pattern key matches, as a sub-slice of
// key, or nil when no scheme matches or the scheme names no tenant. A
// cross-tenant key's {tenants} segment is returned whole ("a|b"). It
// allocates nothing.
func (k *Keyspace) Tenant(key []byte) []byte {
	var m match
	return k.find(key, &m).tenant(key, &m)
}

// tenant returns the first tenant segment of key, which p matched with its
// segments in m, or nil when p is nil or names no tenant.
func (p *pattern) tenant(key []byte, m *match) []byte {
	if p == nil || p.tenantMask == 0 {
		return nil
	}
	s := m.spans[bits.TrailingZeros16(p.tenantMask)]
	return key[s.start:s.end:s.end]
}
