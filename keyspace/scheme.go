package keyspace

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// NoScheme is the scheme name AppendRewrite reports for a key no scheme
// matches. No scheme may take this name.
const NoScheme = "none"

// Scheme is one named key format: which of its segments carry the tenant,
// which may be hashed next, and whether its values are postings lists.
type Scheme struct {
	// Name labels the scheme in flags and metrics.
	Name string
	// Postings is true when the values stored under the scheme's keys are
	// postings-bearing, which the value codec compresses and verifies.
	Postings bool
	// Immutable is true when a value stored under one of the scheme's
	// keys never changes: the sidecar's local tier may keep it. A built-in
	// scheme may also mark only some of its patterns (see presets.go).
	Immutable bool
}

// holeKind says what a placeholder matches and when the rewrite hashes it.
type holeKind uint8

const (
	holeKeep    holeKind = iota // {}: any segment, kept until step 3
	holeTenant                  // {tenant}: hashed from step 1 on
	holeTenants                 // {tenants}: as {tenant}, and holds a '|'
	holeULID                    // {ulid}: a 26-character block ID, kept
	holeHash                    // {1}..{9}: hashed at step 2, in number order
)

// maxHoles bounds the placeholders of one pattern, so a match fits in a
// fixed array on the stack and the hashed set in a uint16.
const maxHoles = 16

// ulidLen is the length of a ULID in its canonical Crockford base-32 text.
const ulidLen = 26

// part is a literal (lit != nil) or a placeholder.
type part struct {
	lit   []byte
	kind  holeKind
	order int // 1..9 for holeHash
}

// pattern is one parsed scheme pattern.
type pattern struct {
	scheme     *Scheme
	immutable  bool // values under the keys it matches never change
	text       string
	parts      []part
	holes      int
	litLen     int
	tenantMask uint16 // holes hashed at step 1
	pipe       bool   // a {tenants} hole: only keys with a '|' match
	hashOrder  []int  // holes hashed at step 2, one after another
}

// span is a segment of the key, key[start:end].
type span struct{ start, end int }

// match holds where a pattern's segments lie in one key, and which of them
// have been found fit to stay verbatim in an upstream key.
type match struct {
	spans           [maxHoles]span
	checked, keepOK uint16
}

// parseSchemeFlag parses NAME[+postings][+immutable]=PATTERN.
func parseSchemeFlag(def string) (*Scheme, *pattern, error) {
	head, text, ok := strings.Cut(def, "=")
	if !ok {
		return nil, nil, errors.New("want NAME[+postings][+immutable]=PATTERN")
	}
	s := &Scheme{}
	name, opts, _ := strings.Cut(head, "+")
	for opts != "" {
		var opt string
		opt, opts, _ = strings.Cut(opts, "+")
		switch opt {
		case "postings":
			s.Postings = true
		case "immutable":
			s.Immutable = true
		default:
			return nil, nil, fmt.Errorf("unknown option +%s (+postings and +immutable are known)", opt)
		}
	}
	if err := checkName(name); err != nil {
		return nil, nil, err
	}
	s.Name = name
	p, err := parsePattern(text)
	if err != nil {
		return nil, nil, err
	}
	p.scheme, p.immutable = s, s.Immutable
	return s, p, nil
}

// checkName keeps scheme names short and fit for a metric label.
func checkName(name string) error {
	if name == "" || len(name) > 40 {
		return errors.New("scheme name must be 1 to 40 characters")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '-' && c != '_' && c != '.') {
			return fmt.Errorf("scheme name %q: use a-z, 0-9, '-', '_' and '.', starting with a letter or digit", name)
		}
	}
	return nil
}

// parsePattern parses the pattern syntax described in the package doc.
func parsePattern(text string) (*pattern, error) {
	p := &pattern{text: text}
	var lit []byte
	flush := func() {
		if lit != nil {
			p.parts = append(p.parts, part{lit: lit})
			p.litLen += len(lit)
			lit = nil
		}
	}
	orders := map[int]int{} // order number -> hole index
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case c == '{' && i+1 < len(text) && text[i+1] == '{', c == '}' && i+1 < len(text) && text[i+1] == '}':
			lit = append(lit, c)
			i++
			continue
		case c == '}':
			return nil, fmt.Errorf("pattern %q: unmatched '}' (write '}}' for a literal one)", text)
		case c != '{':
			if c <= ' ' || c == 0x7f || c == marker {
				return nil, fmt.Errorf("pattern %q: literal byte %q cannot appear in an upstream key as it is", text, c)
			}
			lit = append(lit, c)
			continue
		}
		end := strings.IndexByte(text[i:], '}')
		if end < 0 {
			return nil, fmt.Errorf("pattern %q: unclosed '{'", text)
		}
		name := text[i+1 : i+end]
		i += end
		if lit == nil && len(p.parts) > 0 {
			return nil, fmt.Errorf("pattern %q: placeholders must be separated by literal text", text)
		}
		flush()
		if p.holes == maxHoles {
			return nil, fmt.Errorf("pattern %q: more than %d placeholders", text, maxHoles)
		}
		h := part{}
		switch name {
		case "":
			h.kind = holeKeep
		case "tenant":
			h.kind = holeTenant
		case "tenants":
			h.kind = holeTenants
			p.pipe = true
		case "ulid":
			h.kind = holeULID
		default:
			n, err := strconv.Atoi(name)
			if err != nil || n < 1 || n > 9 || len(name) != 1 {
				return nil, fmt.Errorf("pattern %q: unknown placeholder {%s}", text, name)
			}
			if _, dup := orders[n]; dup {
				return nil, fmt.Errorf("pattern %q: {%d} appears twice", text, n)
			}
			h.kind, h.order = holeHash, n
			orders[n] = p.holes
		}
		if h.kind == holeTenant || h.kind == holeTenants {
			p.tenantMask |= 1 << p.holes
		}
		p.parts = append(p.parts, h)
		p.holes++
	}
	flush()
	if p.holes == 0 {
		return nil, fmt.Errorf("pattern %q: no placeholder", text)
	}
	for n := 1; n <= len(orders); n++ {
		h, ok := orders[n]
		if !ok {
			return nil, fmt.Errorf("pattern %q: numbered placeholders must run {1}..{%d} without a gap", text, len(orders))
		}
		p.hashOrder = append(p.hashOrder, h)
	}
	return p, nil
}

// matchKey reports whether key has the pattern's shape, and records its
// segments in m. A placeholder followed by literal text takes the bytes up to
// the first occurrence of that text, at least one; the last placeholder takes
// the rest of the key. There is no backtracking.
func (p *pattern) matchKey(key []byte, m *match) bool {
	pos, h := 0, 0
	last := len(p.parts) - 1
	for i := range p.parts {
		pt := &p.parts[i]
		if pt.lit != nil {
			if !bytes.HasPrefix(key[pos:], pt.lit) {
				return false
			}
			pos += len(pt.lit)
			continue
		}
		var end int
		switch {
		case pt.kind == holeULID:
			end = pos + ulidLen
			if end > len(key) || !isULID(key[pos:end]) {
				return false
			}
		case i < last:
			j := bytes.Index(key[pos:], p.parts[i+1].lit)
			if j <= 0 {
				return false
			}
			end = pos + j
		default:
			end = len(key)
			if end == pos {
				return false
			}
		}
		if pt.kind == holeTenants && bytes.IndexByte(key[pos:end], '|') < 0 {
			return false
		}
		m.spans[h] = span{pos, end}
		h++
		pos = end
	}
	return pos == len(key)
}

// crockford marks the characters of Crockford's base 32 as ULIDs print it.
var crockford = func() (t [256]bool) {
	for _, c := range []byte("0123456789ABCDEFGHJKMNPQRSTVWXYZ") {
		t[c] = true
	}
	return t
}()

// isULID reports whether b is a canonical ULID: 26 Crockford base-32
// characters, the first at most '7' (48-bit timestamps end there).
func isULID(b []byte) bool {
	if len(b) != ulidLen || b[0] > '7' {
		return false
	}
	for _, c := range b {
		if !crockford[c] {
			return false
		}
	}
	return true
}
