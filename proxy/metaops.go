package proxy

import (
	"bytes"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"strconv"
)

// The meta commands go upstream as meta commands under the upstream key,
// asking memcached only for what the proxy needs; the client's own flags
// that only shape the reply (b, O, q, k) stay here. The reply is then
// written as memcached would have written it to the client: its return
// flags in the client's order, the client's key and opaque in place, the
// value, size and flags of an enveloped item as the client stored them.

// Meta reply codes, the two letters a reply line starts with.
var (
	metaCodeValue    = []byte("VA")
	metaCodeStored   = []byte("HD")
	metaCodeMiss     = []byte("EN")
	metaCodeExists   = []byte("EX")
	metaCodeNotFound = []byte("NF")
	metaCodeNotStore = []byte("NS")
)

// metaReply is an upstream meta reply line, split: its code, and the
// token of each return flag by letter.
type metaReply struct {
	code [2]byte
	has  uint64
	tok  [58][]byte // by letter, from 'A'
}

// metaParse parses memcached's reply line to the meta command being
// handled into the connection's reply, from a copy of line: line lies in a
// call's buffer, which the next upstream request reuses. ok is false for
// a line that is no meta reply, to be relayed as it is.
func (c *conn) metaParse(line []byte) (r *metaReply, ok bool) {
	c.mst.up = append(c.mst.up[:0], line...)
	return &c.mst.rep, c.mst.rep.parse(c.mst.up)
}

// parseMetaReply splits line ("XX[ <size>][ <flag>…]\r\n"); ok is false
// for a line that is no meta reply (an error line, for one). The tokens
// are sub-slices of line.
func (r *metaReply) parse(line []byte) bool {
	r.has = 0
	if len(line) < 4 || line[2] != ' ' && line[2] != '\r' || !bytes.HasSuffix(line, wire.CRLF) {
		return false
	}
	r.code = [2]byte{line[0], line[1]}
	if r.code[0] < 'A' || r.code[0] > 'Z' || r.code[1] < 'A' || r.code[1] > 'Z' {
		return false
	}
	rest := line[2 : len(line)-2]
	if r.code == [2]byte{'V', 'A'} {
		// The size: the data block is already in the call's arena.
		rest = bytes.TrimPrefix(rest, []byte{' '})
		if i := bytes.IndexByte(rest, ' '); i >= 0 {
			rest = rest[i:]
		} else {
			rest = nil
		}
	}
	for len(rest) > 0 {
		rest = rest[1:] // the space
		word := rest
		if i := bytes.IndexByte(rest, ' '); i >= 0 {
			word, rest = rest[:i], rest[i:]
		} else {
			rest = nil
		}
		if len(word) == 0 || word[0] < 'A' || word[0] > 'z' {
			continue
		}
		r.has |= wire.MetaFlagBit(word[0])
		r.tok[word[0]-'A'] = word[1:]
	}
	return true
}

// flag returns the token of return flag b, and whether it was there.
func (r *metaReply) flag(b byte) ([]byte, bool) {
	if r.has&wire.MetaFlagBit(b) == 0 {
		return nil, false
	}
	return r.tok[b-'A'], true
}

// metaOutcome is the outcome a meta reply code counts as: NF, EX and NS
// name theirs, any other is the command's success, ok.
func metaOutcome(code []byte, ok stats.Outcome) stats.Outcome {
	switch {
	case bytes.Equal(code, metaCodeNotFound):
		return stats.OutcomeNotFound
	case bytes.Equal(code, metaCodeExists):
		return stats.OutcomeExists
	case bytes.Equal(code, metaCodeNotStore):
		return stats.OutcomeNotStored
	}
	return ok
}

// appendMetaHead appends "<verb> <key>", the key in base64 with the b flag
// when the client sent it so: memcached then marks the item's key binary,
// as it would have for the client.
func appendMetaHead(dst []byte, verb string, k string, bin bool) []byte {
	dst = append(dst, verb...)
	if !bin {
		return append(dst, k...)
	}
	dst = wire.AppendBase64(dst, []byte(k))
	return append(dst, " b"...)
}

// appendMetaFlag appends " <letter><n>".
func appendMetaFlag(dst []byte, letter byte, n int64) []byte {
	dst = append(dst, ' ', letter)
	return strconv.AppendInt(dst, n, 10)
}

// appendMetaKey appends the k return flag: the key, or when it is binary
// its base64 and the b flag.
func appendMetaKey(dst, key []byte, bin bool) []byte {
	dst = append(dst, " k"...)
	if !bin {
		return append(dst, key...)
	}
	dst = wire.AppendBase64(dst, key)
	return append(dst, " b"...)
}

// appendMetaNoItem appends the flags memcached returns when there is no
// item to describe (EN, NF, NS, EX): the opaque and the key.
func appendMetaNoItem(dst []byte, m *metaReq) []byte {
	for _, f := range m.Flags[:m.NFlags] {
		switch f[0] {
		case 'O':
			dst = append(dst, ' ')
			dst = append(dst, f...)
		case 'k':
			dst = appendMetaKey(dst, m.Key, m.Bin)
		}
	}
	return append(dst, wire.CRLF...)
}

// metaNoop answers mn.
func (c *conn) metaNoop() {
	c.p.stats.Record(wire.CmdMetaNoop, stats.OutcomeOK)
	c.wr.Write(wire.LineMetaNoop)
}

// metaAnswer answers md or ma with code and the client's return flags in
// its order: c and t from memcached's reply r when there is an item (HD,
// VA), the opaque and key always. value is ma's number (VA). quiet hides
// the nominal reply (HD, and ma's VA).
func (c *conn) metaAnswer(id int, m *metaReq, code []byte, r *metaReply, value []byte) {
	oc := metaOutcome(code, stats.OutcomeOK)
	c.p.stats.Record(id, oc)
	if oc == stats.OutcomeOK && m.Quiet {
		return
	}
	out := c.mst.out[:0]
	if oc != stats.OutcomeOK || r == nil {
		out = appendMetaNoItem(append(out, code...), m)
	} else {
		if value != nil {
			out = append(out, wire.LineMetaValue...)
			out = strconv.AppendInt(out, int64(len(value)), 10)
		} else {
			out = append(out, code...)
		}
		for _, f := range m.Flags[:m.NFlags] {
			switch l := f[0]; l {
			case 'c', 't':
				if id != wire.CmdMetaArithmetic {
					continue
				}
				if tok, ok := r.flag(l); ok {
					out = append(append(out, ' ', l), tok...)
				}
			case 'O':
				out = append(append(out, ' '), f...)
			case 'k':
				out = appendMetaKey(out, m.Key, m.Bin)
			}
		}
		out = append(out, wire.CRLF...)
		if value != nil {
			out = append(append(out, value...), wire.CRLF...)
		}
	}
	c.mst.out = out
	c.wr.Write(out)
}
