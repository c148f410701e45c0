package wire

import (
	"bytes"
	"strconv"
)

// The proxy sends a client's incr or decr upstream as memcached's meta
// arithmetic command, which returns the new number and echoes a tag (an
// opaque token) of the proxy's: "ma <key> D<delta> MI|MD v O<tag>". Of the
// replies to the commands of one key, only incr's and decr's carry data, a
// number, which a reply out of place could give one client of another's
// counter even when it has the form expected; the tag proves each is the
// reply to its own request.

var (
	metaNotFound = []byte("NF")
)

// AppendArith appends the meta arithmetic request for a classic incr
// (incr true) or decr of key by delta, tagged tag.
func AppendArith(dst []byte, incr bool, key []byte, delta uint64, tag uint32) []byte {
	dst = append(dst, "ma "...)
	dst = append(dst, key...)
	dst = append(dst, " D"...)
	dst = strconv.AppendUint(dst, delta, 10)
	if incr {
		dst = append(dst, " MI v O"...)
	} else {
		dst = append(dst, " MD v O"...)
	}
	dst = strconv.AppendUint(dst, uint64(tag), 10)
	return append(dst, CRLF...)
}

// ArithLine reports whether line begins a reply to AppendArith's request
// with a data block to follow, and how long the block is, with its CRLF.
func ArithLine(line []byte) (block int, ok bool) {
	return MetaValueBlock(line, 20) // a 64-bit number has at most 20 digits
}

// MetaValueBlock reports whether line is a meta reply "VA <size> ..."
// with a data block of at most max bytes to follow, and how long the
// block is, with its CRLF. Its flags are not read: what memcached
// returns of them depends on what the client asked.
func MetaValueBlock(line []byte, max uint64) (block int, ok bool) {
	rest, found := bytes.CutPrefix(line, LineMetaValue)
	if !found {
		return 0, false
	}
	word, _, _ := bytes.Cut(rest, []byte{' '})
	word = bytes.TrimSuffix(word, CRLF)
	n, valid := ParseDecimal(word, max)
	return int(n) + 2, valid
}

// ArithReply turns memcached's whole reply to AppendArith's request tagged
// tag into the classic reply to incr or decr: the number and CRLF (a slice
// of reply), NOT_FOUND, or memcached's error line as it is, which carries
// no data. ok is false when the reply is not the one to that request.
func ArithReply(reply []byte, tag uint32) (classic []byte, ok bool) {
	i := bytes.IndexByte(reply, '\n')
	if i < 0 {
		return nil, false
	}
	line, block := reply[:i+1], reply[i+1:]
	if len(block) == 0 && IsError(line) && !OutOfStep(line) {
		return reply, true
	}
	if !bytes.HasSuffix(line, CRLF) || !taggedWith(line[:len(line)-2], tag) {
		return nil, false
	}
	switch {
	case bytes.HasPrefix(line, metaNotFound) && len(block) == 0:
		return LineNotFound, true
	case bytes.HasPrefix(line, LineMetaValue) && len(block) > 2 && isNumberLine(block):
		return block, true
	}
	return nil, false
}

// MetaTagged reports whether reply, memcached's whole reply to a meta
// arithmetic request of the client's own that went upstream with the
// opaque token O<tag> added (whose other flags the proxy does not know),
// echoes the token, or is memcached's error line, which echoes nothing.
func MetaTagged(reply []byte, tag uint32) bool {
	i := bytes.IndexByte(reply, '\n')
	if i < 0 {
		return false
	}
	line, block := reply[:i+1], reply[i+1:]
	if len(block) == 0 && IsError(line) && !OutOfStep(line) {
		return true
	}
	return bytes.HasSuffix(line, CRLF) && taggedWith(line[:len(line)-2], tag) && (len(block) == 0 || isNumberLine(block))
}

// taggedWith reports whether the words after a meta reply's code include
// the opaque token O<tag>.
func taggedWith(line []byte, tag uint32) bool {
	_, rest, more := bytes.Cut(line, []byte{' '})
	for more {
		var w []byte
		w, rest, more = bytes.Cut(rest, []byte{' '})
		if len(w) > 1 && w[0] == 'O' {
			v, ok := ParseDecimal(w[1:], 1<<32-1)
			return ok && v == uint64(tag)
		}
	}
	return false
}
