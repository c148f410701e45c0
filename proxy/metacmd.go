package proxy

import "mcsidecar/proxy/internal/wire"

// The meta commands' request lines, read the way memcached 1.6.18 reads
// them (proto_text.c: _meta_flag_preparse and the process_m*_command
// functions): the same checks in the same order, answered with the same
// words, so that a refused request is refused here, before anything is
// sent upstream. Parsing allocates nothing: flag tokens are sub-slices of
// the line, and a base64 key is decoded into a buffer the request keeps.

const (
	// metaMaxTokens is memcached's MFLAG_MAX_OPT_LENGTH: a line of more
	// tokens than this (the terminal one included) is refused.
	metaMaxTokens = 20
	// metaMaxOpaque is memcached's MFLAG_MAX_OPAQUE_LENGTH, the longest
	// opaque token, its 'O' included.
	metaMaxOpaque = 32
)

// Errors memcached answers meta requests with.
var (
	replyMetaNoop         = []byte("MN\r\n")
	replyMetaDuplicate    = []byte("CLIENT_ERROR duplicate flag\r\n")
	replyMetaInvalid      = []byte("CLIENT_ERROR invalid flag\r\n")
	replyMetaBadToken     = []byte("CLIENT_ERROR bad token in command line format\r\n")
	replyMetaBadKey       = []byte("CLIENT_ERROR error decoding key\r\n")
	replyMetaModeLength   = []byte("CLIENT_ERROR incorrect length for M token\r\n")
	replyMetaBadInitial   = []byte("CLIENT_ERROR invalid numeric initial value\r\n")
	replyMetaBadDelta     = []byte("CLIENT_ERROR invalid numeric delta value\r\n")
	replyMetaInvalidOrDup = []byte("CLIENT_ERROR invalid or duplicate flag\r\n")
	replyMetaOpaqueLong   = []byte("CLIENT_ERROR opaque token too long\r\n")
	replyMetaGetTooMany   = []byte("CLIENT_ERROR options flags are too long\r\n")
	replyMetaTooMany      = []byte("CLIENT_ERROR options flags too long\r\n")
	replyMetaSetMode      = []byte("CLIENT_ERROR invalid mode for ms M token\r\n")
	replyMetaArithMode    = []byte("CLIENT_ERROR invalid mode for ma M token\r\n")
)

// metaFlagLetters are the flags memcached 1.6.18 knows, for every meta
// command alike: a flag that does not apply to a command is accepted and
// ignored. Any other letter is an invalid flag.
const metaFlagLetters = "bNTRlOPLkstcfvhuqFCMJDI"

// metaFlagBit is the bit of a flag letter in metaReq.seen.
func metaFlagBit(b byte) uint64 { return 1 << (b - 'A') }

// metaKnown has the bits of metaFlagLetters.
var metaKnown = func() uint64 {
	var m uint64
	for i := 0; i < len(metaFlagLetters); i++ {
		m |= metaFlagBit(metaFlagLetters[i])
	}
	return m
}()

// metaReq is one meta request line, parsed. A connection keeps one and
// reuses it.
type metaReq struct {
	verb byte   // g, s, d, a, e or n: the second letter of mg, ms…
	raw  []byte // the key as the client sent it
	key  []byte // the key: raw, or raw base64-decoded (flag b)
	vlen int    // ms: the data block's length, without its "\r\n"
	// vlenOK says vlen was read: a refused ms's data block can be
	// consumed.
	vlenOK bool
	flags  [metaMaxTokens][]byte // the flag tokens, in request order
	nflags int
	seen   uint64 // metaFlagBit of every flag given

	bin, quiet, retKey, value, stale bool
	// wireBin says the key goes upstream in base64 too (flag b), which
	// it does when the client sent it so and it fits memcached's limit
	// encoded.
	wireBin                       bool
	hasTTL, hasVivify, hasRecache bool
	hasCAS                        bool
	ttl, vivify, recache          int32  // T, N and R
	clientFlags                   uint32 // F
	cas                           uint64 // C
	mode                          byte   // M; 0: none
	initial, delta                uint64 // J and D (ma)
	opaque                        []byte // the O token, 'O' included

	// err is the reply that refuses the request; nil: accepted.
	err []byte
	// keyBuf holds the decoded key.
	keyBuf []byte
	// rk is what the proxy learned of key (see metaKey).
	rk resolvedKey
}

// setWire decides how the upstream key up goes upstream: in base64 when
// the client sent its key so, unless that is over memcached's key limit
// (a long binary key under key settings), when it goes as it is.
func (m *metaReq) setWire(up []byte) {
	m.wireBin = m.bin && (len(up)+2)/3*4 <= keyMaxLength
}

// has reports whether flag letter b was given.
func (m *metaReq) has(b byte) bool { return m.seen&metaFlagBit(b) != 0 }

// parseMeta reads the words of a meta command line (words[0] is the verb,
// as the command table matched it) into m. limitKey applies memcached's
// own 250-byte limit to the key as sent; without it (key settings on) the
// caller checks the decoded key. A refused line leaves its reply in m.err.
func parseMeta(m *metaReq, words [][]byte, limitKey bool) {
	*m = metaReq{keyBuf: m.keyBuf[:0], verb: words[0][1], delta: 1}
	// memcached counts the terminal token too.
	ntokens := len(words) + 1
	switch m.verb {
	case 'n':
		return
	case 'e':
		parseMetaDebug(m, words, limitKey)
		return
	}
	if len(words) < 2 {
		m.err = replyError
		return
	}
	m.raw, m.key = words[1], words[1]
	if limitKey && len(m.raw) > keyMaxLength {
		m.err = replyBadFormat
		if m.verb == 's' && len(words) > 2 {
			m.readLength(words[2])
		}
		return
	}
	start := 2
	if m.verb == 's' {
		if len(words) == 2 {
			m.err = replyBadFormat
			return
		}
		if ntokens > metaMaxTokens {
			m.err = replyMetaTooMany
			m.readLength(words[2])
			return
		}
		if !m.readLength(words[2]) {
			m.err = replyBadFormat
			return
		}
		start = 3
	} else if ntokens > metaMaxTokens {
		m.err = replyMetaTooMany
		if m.verb == 'g' {
			m.err = replyMetaGetTooMany
		}
		return
	}
	for _, w := range words[start:] {
		m.flags[m.nflags] = w
		m.nflags++
	}
	if err := m.preparse(); err != nil {
		m.err = err
		if m.verb == 'd' || m.verb == 'a' {
			m.err = replyMetaInvalidOrDup
		}
		return
	}
	opaqueLong := len(m.opaque) > metaMaxOpaque
	switch m.verb {
	case 's':
		switch m.mode {
		case 0, 'E', 'A', 'P', 'R', 'S':
		default:
			m.err = replyMetaSetMode
			return
		}
	case 'a':
		switch m.mode {
		case 0, 'I', '+', 'D', '-':
		default:
			m.err = replyMetaArithMode
			return
		}
	}
	if opaqueLong {
		m.err = replyMetaOpaqueLong
	}
}

// readLength reads ms's data length as memcached does (safe_strtol, then
// 0 to INT_MAX-2).
func (m *metaReq) readLength(w []byte) bool {
	n, ok := wire.ParseInt32(w)
	if !ok || n < 0 || n > 1<<31-1-2 {
		return false
	}
	m.vlen, m.vlenOK = int(n), true
	return true
}

// preparse is memcached's _meta_flag_preparse: a repeated or unknown flag
// stops at once; a bad token is remembered and the flags after it are
// still read, the last error's words answering.
func (m *metaReq) preparse() []byte {
	var err []byte
	for i := 0; i < m.nflags; i++ {
		w := m.flags[i]
		o := w[0]
		if o >= 127 || o >= 'A' && o <= 'z' && m.seen&metaFlagBit(o) != 0 {
			return replyMetaDuplicate
		}
		if o < 'A' || o > 'z' || metaKnown&metaFlagBit(o) == 0 {
			return replyMetaInvalid
		}
		m.seen |= metaFlagBit(o)
		arg := w[1:]
		var ok bool
		switch o {
		case 'b':
			m.bin = true
			m.keyBuf = appendBase64Decode(m.keyBuf[:0], m.raw)
			m.key = m.keyBuf
			if len(m.key) == 0 {
				err = replyMetaBadKey
			}
		case 'N':
			if m.vivify, ok = wire.ParseInt32(arg); !ok {
				err = replyMetaBadToken
			}
			m.hasVivify = true
		case 'T':
			if m.ttl, ok = wire.ParseInt32(arg); !ok {
				err = replyMetaBadToken
			}
			m.hasTTL = true
		case 'R':
			if m.recache, ok = wire.ParseInt32(arg); !ok {
				err = replyMetaBadToken
			}
			m.hasRecache = true
		case 'O':
			m.opaque = w
		case 'k':
			m.retKey = true
		case 'v':
			m.value = true
		case 'q':
			m.quiet = true
		case 'F':
			// memcached leaves the default words for a bad F.
			if m.clientFlags, ok = wire.ParseUint32(arg); !ok && err == nil {
				err = replyBadFormat
			}
		case 'C':
			if m.cas, ok = wire.ParseUint64(arg); !ok {
				err = replyMetaBadToken
			}
			m.hasCAS = ok
		case 'M':
			if len(w) != 2 {
				err = replyMetaModeLength
			} else {
				m.mode = w[1]
			}
		case 'J':
			if m.initial, ok = wire.ParseUint64(arg); !ok {
				err = replyMetaBadInitial
			}
		case 'D':
			if m.delta, ok = wire.ParseUint64(arg); !ok {
				err = replyMetaBadDelta
			}
		case 'I':
			m.stale = true
		}
	}
	return err
}

// parseMetaDebug reads "me <key> [b]": memcached looks at nothing else.
func parseMetaDebug(m *metaReq, words [][]byte, limitKey bool) {
	if len(words) < 2 || limitKey && len(words[1]) > keyMaxLength {
		m.err = replyBadFormat
		return
	}
	m.raw, m.key = words[1], words[1]
	if len(words) >= 3 && len(words[2]) == 1 && words[2][0] == 'b' {
		m.bin = true
		m.keyBuf = appendBase64Decode(m.keyBuf[:0], m.raw)
		m.key = m.keyBuf
		if len(m.key) == 0 {
			m.err = replyBadFormat
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

// appendBase64Decode decodes src as memcached's base64_decode does, and
// appends the bytes to dst: bytes outside the alphabet are skipped, the
// rest must come in groups of four, and decoding stops after the first
// group that holds padding. A failure appends nothing (memcached's 0).
func appendBase64Decode(dst, src []byte) []byte {
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

// appendBase64 encodes src with padding, as memcached returns binary keys.
func appendBase64(dst, src []byte) []byte {
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
