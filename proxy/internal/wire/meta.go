package wire

// The meta commands' request lines, read the way memcached 1.6.18 reads
// them (proto_text.c: _meta_flag_preparse and the process_m*_command
// functions): the same checks in the same order, answered with the same
// words, so that a refused request is refused here, before anything is
// sent upstream. Parsing allocates nothing: flag tokens are sub-slices of
// the line, and a base64 key is decoded into a buffer the request keeps.

const (
	// MetaMaxTokens is memcached's MFLAG_MAX_OPT_LENGTH: a line of more
	// tokens than this (the terminal one included) is refused.
	MetaMaxTokens = 20
	// MetaMaxOpaque is memcached's MFLAG_MAX_OPAQUE_LENGTH, the longest
	// opaque token, its 'O' included.
	MetaMaxOpaque = 32
)

// Errors memcached answers meta requests with.
var (
	LineMetaNoop         = []byte("MN\r\n")
	LineMetaDuplicate    = []byte("CLIENT_ERROR duplicate flag\r\n")
	LineMetaInvalid      = []byte("CLIENT_ERROR invalid flag\r\n")
	LineMetaBadToken     = []byte("CLIENT_ERROR bad token in command line format\r\n")
	LineMetaBadKey       = []byte("CLIENT_ERROR error decoding key\r\n")
	LineMetaModeLength   = []byte("CLIENT_ERROR incorrect length for M token\r\n")
	LineMetaBadInitial   = []byte("CLIENT_ERROR invalid numeric initial value\r\n")
	LineMetaBadDelta     = []byte("CLIENT_ERROR invalid numeric delta value\r\n")
	LineMetaInvalidOrDup = []byte("CLIENT_ERROR invalid or duplicate flag\r\n")
	LineMetaOpaqueLong   = []byte("CLIENT_ERROR opaque token too long\r\n")
	LineMetaGetTooMany   = []byte("CLIENT_ERROR options flags are too long\r\n")
	LineMetaTooMany      = []byte("CLIENT_ERROR options flags too long\r\n")
	LineMetaSetMode      = []byte("CLIENT_ERROR invalid mode for ms M token\r\n")
	LineMetaArithMode    = []byte("CLIENT_ERROR invalid mode for ma M token\r\n")
)

// MetaFlagLetters are the flags memcached 1.6.18 knows, for every meta
// command alike: a flag that does not apply to a command is accepted and
// ignored. Any other letter is an invalid flag.
const MetaFlagLetters = "bNTRlOPLkstcfvhuqFCMJDI"

// MetaFlagBit is the bit of a flag letter in Meta.Seen.
func MetaFlagBit(b byte) uint64 { return 1 << (b - 'A') }

// metaKnown has the bits of MetaFlagLetters.
var metaKnown = func() uint64 {
	var m uint64
	for i := 0; i < len(MetaFlagLetters); i++ {
		m |= MetaFlagBit(MetaFlagLetters[i])
	}
	return m
}()

// Meta is one meta request line, parsed. A connection keeps one and
// reuses it.
type Meta struct {
	Verb byte   // g, s, d, a, e or n: the second letter of mg, ms…
	Raw  []byte // the key as the client sent it
	Key  []byte // the key: raw, or raw base64-decoded (flag b)
	Vlen int    // ms: the data block's length, without its "\r\n"
	// VlenOK says Vlen was read: a refused ms's data block can be
	// consumed.
	VlenOK bool
	Flags  [MetaMaxTokens][]byte // the flag tokens, in request order
	NFlags int
	Seen   uint64 // MetaFlagBit of every flag given

	Bin, Quiet, RetKey, Value, Stale bool
	// WireBin says the key goes upstream in base64 too (flag b), which
	// it does when the client sent it so and it fits memcached's limit
	// encoded.
	WireBin                       bool
	HasTTL, HasVivify, HasRecache bool
	HasCAS                        bool
	TTL, Vivify, Recache          int32  // T, N and R
	ClientFlags                   uint32 // F
	CAS                           uint64 // C
	Mode                          byte   // M; 0: none
	Initial, Delta                uint64 // J and D (ma)
	Opaque                        []byte // the O token, 'O' included

	// Err is the reply that refuses the request; nil: accepted.
	Err []byte
	// keyBuf holds the decoded key.
	keyBuf []byte
}

// SetWire decides how the upstream key up goes upstream: in base64 when
// the client sent its key so, unless that is over memcached's key limit
// (a long binary key under key settings), when it goes as it is.
func (m *Meta) SetWire(up []byte) {
	m.WireBin = m.Bin && (len(up)+2)/3*4 <= KeyMaxLength
}

// Has reports whether flag letter b was given.
func (m *Meta) Has(b byte) bool { return m.Seen&MetaFlagBit(b) != 0 }

// ParseMeta reads the words of a meta command line (words[0] is the verb,
// as the command table matched it) into m. limitKey applies memcached's
// own 250-byte limit to the key as sent; without it (key settings on) the
// caller checks the decoded key. A refused line leaves its reply in m.err.
func ParseMeta(m *Meta, words [][]byte, limitKey bool) {
	*m = Meta{keyBuf: m.keyBuf[:0], Verb: words[0][1], Delta: 1}
	// memcached counts the terminal token too.
	ntokens := len(words) + 1
	switch m.Verb {
	case 'n':
		return
	case 'e':
		parseMetaDebug(m, words, limitKey)
		return
	}
	if len(words) < 2 {
		m.Err = LineError
		return
	}
	m.Raw, m.Key = words[1], words[1]
	if limitKey && len(m.Raw) > KeyMaxLength {
		m.Err = LineBadFormat
		if m.Verb == 's' && len(words) > 2 {
			m.readLength(words[2])
		}
		return
	}
	start := 2
	if m.Verb == 's' {
		if len(words) == 2 {
			m.Err = LineBadFormat
			return
		}
		if ntokens > MetaMaxTokens {
			m.Err = LineMetaTooMany
			m.readLength(words[2])
			return
		}
		if !m.readLength(words[2]) {
			m.Err = LineBadFormat
			return
		}
		start = 3
	} else if ntokens > MetaMaxTokens {
		m.Err = LineMetaTooMany
		if m.Verb == 'g' {
			m.Err = LineMetaGetTooMany
		}
		return
	}
	for _, w := range words[start:] {
		m.Flags[m.NFlags] = w
		m.NFlags++
	}
	if err := m.preparse(); err != nil {
		m.Err = err
		if m.Verb == 'd' || m.Verb == 'a' {
			m.Err = LineMetaInvalidOrDup
		}
		return
	}
	opaqueLong := len(m.Opaque) > MetaMaxOpaque
	switch m.Verb {
	case 's':
		switch m.Mode {
		case 0, 'E', 'A', 'P', 'R', 'S':
		default:
			m.Err = LineMetaSetMode
			return
		}
	case 'a':
		switch m.Mode {
		case 0, 'I', '+', 'D', '-':
		default:
			m.Err = LineMetaArithMode
			return
		}
	}
	if opaqueLong {
		m.Err = LineMetaOpaqueLong
	}
}

// readLength reads ms's data length as memcached does (safe_strtol, then
// 0 to INT_MAX-2).
func (m *Meta) readLength(w []byte) bool {
	n, ok := ParseInt32(w)
	if !ok || n < 0 || n > 1<<31-1-2 {
		return false
	}
	m.Vlen, m.VlenOK = int(n), true
	return true
}

// preparse is memcached's _meta_flag_preparse: a repeated or unknown flag
// stops at once; a bad token is remembered and the flags after it are
// still read, the last error's words answering.
func (m *Meta) preparse() []byte {
	var err []byte
	for i := 0; i < m.NFlags; i++ {
		w := m.Flags[i]
		o := w[0]
		if o >= 127 || o >= 'A' && o <= 'z' && m.Seen&MetaFlagBit(o) != 0 {
			return LineMetaDuplicate
		}
		if o < 'A' || o > 'z' || metaKnown&MetaFlagBit(o) == 0 {
			return LineMetaInvalid
		}
		m.Seen |= MetaFlagBit(o)
		arg := w[1:]
		var ok bool
		switch o {
		case 'b':
			m.Bin = true
			m.keyBuf = AppendBase64Decode(m.keyBuf[:0], m.Raw)
			m.Key = m.keyBuf
			if len(m.Key) == 0 {
				err = LineMetaBadKey
			}
		case 'N':
			if m.Vivify, ok = ParseInt32(arg); !ok {
				err = LineMetaBadToken
			}
			m.HasVivify = true
		case 'T':
			if m.TTL, ok = ParseInt32(arg); !ok {
				err = LineMetaBadToken
			}
			m.HasTTL = true
		case 'R':
			if m.Recache, ok = ParseInt32(arg); !ok {
				err = LineMetaBadToken
			}
			m.HasRecache = true
		case 'O':
			m.Opaque = w
		case 'k':
			m.RetKey = true
		case 'v':
			m.Value = true
		case 'q':
			m.Quiet = true
		case 'F':
			// memcached leaves the default words for a bad F.
			if m.ClientFlags, ok = ParseUint32(arg); !ok && err == nil {
				err = LineBadFormat
			}
		case 'C':
			if m.CAS, ok = ParseUint64(arg); !ok {
				err = LineMetaBadToken
			}
			m.HasCAS = ok
		case 'M':
			if len(w) != 2 {
				err = LineMetaModeLength
			} else {
				m.Mode = w[1]
			}
		case 'J':
			if m.Initial, ok = ParseUint64(arg); !ok {
				err = LineMetaBadInitial
			}
		case 'D':
			if m.Delta, ok = ParseUint64(arg); !ok {
				err = LineMetaBadDelta
			}
		case 'I':
			m.Stale = true
		}
	}
	return err
}

// parseMetaDebug reads "me <key> [b]": memcached looks at nothing else.
func parseMetaDebug(m *Meta, words [][]byte, limitKey bool) {
	if len(words) < 2 || limitKey && len(words[1]) > KeyMaxLength {
		m.Err = LineBadFormat
		return
	}
	m.Raw, m.Key = words[1], words[1]
	if len(words) >= 3 && len(words[2]) == 1 && words[2][0] == 'b' {
		m.Bin = true
		m.keyBuf = AppendBase64Decode(m.keyBuf[:0], m.Raw)
		m.Key = m.keyBuf
		if len(m.Key) == 0 {
			m.Err = LineBadFormat
		}
	}
}

// base64Alphabet is the standard alphabet, as memcached encodes keys.
const base64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

// base64Values maps a byte to its 6-bit value, 0 for '=', and 0x80 for a
// byte memcached's decoder skips.
var base64Values = func() (t [256]byte) {
	for i := range t {
		t[i] = 0x80
	}
	for i := 0; i < len(base64Alphabet); i++ {
		t[base64Alphabet[i]] = byte(i)
	}
	t['='] = 0
	return t
}()

// AppendBase64Decode decodes src as memcached's base64_decode does, and
// appends the bytes to dst: bytes outside the alphabet are skipped, the
// rest must come in groups of four, and decoding stops after the first
// group that holds padding. A failure appends nothing (memcached's 0).
func AppendBase64Decode(dst, src []byte) []byte {
	count := 0
	for _, b := range src {
		if base64Values[b] != 0x80 {
			count++
		}
	}
	if count == 0 || count%4 != 0 {
		return dst
	}
	start := len(dst)
	var block [4]byte
	n, pad := 0, 0
	for _, b := range src {
		v := base64Values[b]
		if v == 0x80 {
			continue
		}
		if b == '=' {
			pad++
		}
		block[n] = v
		n++
		if n < 4 {
			continue
		}
		dst = append(dst, block[0]<<2|block[1]>>4, block[1]<<4|block[2]>>2, block[2]<<6|block[3])
		n = 0
		if pad > 0 {
			if pad > 2 {
				return dst[:start]
			}
			dst = dst[:len(dst)-pad]
			break
		}
	}
	return dst
}

// AppendBase64 encodes src with padding, as memcached returns binary keys.
func AppendBase64(dst, src []byte) []byte {
	for len(src) >= 3 {
		dst = append(dst, base64Alphabet[src[0]>>2], base64Alphabet[(src[0]&3)<<4|src[1]>>4],
			base64Alphabet[(src[1]&15)<<2|src[2]>>6], base64Alphabet[src[2]&63])
		src = src[3:]
	}
	switch len(src) {
	case 1:
		dst = append(dst, base64Alphabet[src[0]>>2], base64Alphabet[(src[0]&3)<<4], '=', '=')
	case 2:
		dst = append(dst, base64Alphabet[src[0]>>2], base64Alphabet[(src[0]&3)<<4|src[1]>>4], base64Alphabet[(src[1]&15)<<2], '=')
	}
	return dst
}
