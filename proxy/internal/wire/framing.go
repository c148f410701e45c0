package wire

import (
	"bytes"
	"errors"
)

// This file holds memcached's framing rules for a client's byte stream:
// where a command line ends, and how long one may run without its newline.

// LineLimit is memcached's framing rule: with more than this many bytes
// buffered and still no newline, only a retrieval command may go on; any
// other client is cut off.
const LineLimit = 2048

// ErrLineTooLong means the client sent a line memcached would not frame.
var ErrLineTooLong = errors.New("request line too long")

// CommandLine is a line, up to its newline, as memcached reads it: without
// the '\r' before the newline, which it does not require, and cut at the
// first NUL, as its C string handling does.
func CommandLine(line []byte) []byte {
	if len(line) > 1 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	if z := bytes.IndexByte(line, 0); z >= 0 {
		line = line[:z]
	}
	return line
}

// Unframed reports whether data, the start of a line whose newline has not
// come, breaks memcached's framing rule: past LineLimit bytes, unless it
// is a retrieval, which may keep growing, or names a key and is within
// keyLine.
func Unframed(data []byte, keyLine int) bool {
	return len(data) > LineLimit && !isRetrievalPrefix(data) && (len(data) > keyLine || !isKeyedPrefix(data))
}

// isRetrievalPrefix reports whether an unterminated line may keep growing:
// memcached lets "get " and "gets " lines run past the framing limit when no
// more than 100 spaces precede them.
func isRetrievalPrefix(data []byte) bool {
	rest, ok := commandStart(data)
	return ok && (bytes.HasPrefix(rest, []byte("get ")) || bytes.HasPrefix(rest, []byte("gets ")))
}

// commandStart returns data from its command on, and whether no more
// than the 100 spaces memcached skips precede it.
func commandStart(data []byte) ([]byte, bool) {
	i := 0
	for i < len(data) && data[i] == ' ' {
		i++
	}
	return data[i:], i <= 100
}

// keyedCommands are the commands whose first argument, or for gat and
// gats second, is a key.
var keyedCommands = [...]string{"set", "add", "replace", "append", "prepend", "cas",
	"delete", "touch", "incr", "decr", "gat", "gats", "mg", "ms", "md", "ma", "me"}

// isKeyedPrefix reports whether an unterminated line is one of
// keyedCommands, which may run past the framing limit by the length of a
// key: a federated query's results key lists every tenant, tens of KB.
func isKeyedPrefix(data []byte) bool {
	rest, ok := commandStart(data)
	if !ok {
		return false
	}
	for _, cmd := range keyedCommands {
		if len(rest) > len(cmd) && rest[len(cmd)] == ' ' && string(rest[:len(cmd)]) == cmd {
			return true
		}
	}
	return false
}

// KeyedLineMax is the longest a line that names a key may run without a
// newline: the framing limit, and the longest key a client may send, in
// base64 as a meta command may send it.
func KeyedLineMax(maxKey int) int { return LineLimit + (maxKey+2)/3*4 }
