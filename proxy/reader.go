package proxy

import (
	"bytes"
	"errors"
	"io"
	"sync"
)

// lineLimit is memcached's framing rule: with more than this many bytes
// buffered and still no newline, only a retrieval command may go on; any
// other client is cut off.
const lineLimit = 2048

var (
	// errLineTooLong means the client sent a line memcached would not frame.
	errLineTooLong = errors.New("request line too long")
	// errNeedMore means no complete request is buffered yet.
	errNeedMore = errors.New("need more input")
	// errWouldBlock means the client has sent nothing more for now: a
	// read found the socket empty.
	errWouldBlock = errors.New("no input ready")
)

// idleReadSize is the read buffer of a connection waiting for a request:
// enough for most requests to arrive in one read, a sixteenth of the
// buffer a busy connection reads into.
const idleReadSize = 1024

// readBuffers holds the full-size read buffers of connections that wait
// for a request, as memcached hands its read buffers back when a
// connection goes idle.
var readBuffers sync.Pool

// reader frames a client's byte stream into command lines and data blocks.
// While it works on a request it owns one full-size buffer; lines and small
// data blocks are returned as slices of it and stay valid only until the
// next call. While the connection waits for a request with nothing
// buffered, park swaps that buffer for a small one of the reader's own, and
// the next fill takes a full-size buffer again, from the pool.
type reader struct {
	src   io.Reader
	buf   []byte
	small []byte // the buffer read into while parked; nil: never parks
	// full carries a full-size buffer in and out of readBuffers; it is
	// kept with the reader between uses so parking allocates nothing.
	full *[]byte
	r, w int
	size int // the buffer's usual size
	max  int // largest buffer a long retrieval line may grow to
	// keyLine is the longest line a command that names a key may run to
	// without a newline: memcached's framing limit plus the longest key a
	// client may send (see keyedLineMax).
	keyLine int
	flush   func() error // called before a read that may block
	err     error        // sticky read error

	// want is how many bytes, from r, the request being framed needs
	// before it can run: its line and its whole data block. 0: none.
	want int
	// skip counts the bytes of a refused data block that are still to
	// arrive; they are dropped as they come.
	skip int
	// ready says reads never block: the caller reads only once the
	// socket is readable, so nothing is gained by waiting in the small
	// buffer.
	ready bool
	// short records that the last read did not fill the free space: the
	// socket had nothing more to give at that moment.
	short bool
	// primed says the buffer holds bytes read elsewhere (see prime): the
	// next fill returns at once so that they are handled first.
	primed bool
}

func newReader(src io.Reader, size, max, keyLine int, flush func() error) *reader {
	rd := &reader{src: src, size: size, max: max, keyLine: keyLine, flush: flush}
	// Smaller buffers, which only tests use, park into half their size.
	if idle := min(idleReadSize, size/2); idle > 0 {
		rd.small = make([]byte, idle)
		rd.buf = rd.small // a new connection is waiting for a request
	} else {
		rd.buf = make([]byte, size)
	}
	return rd
}

// park gives back the full-size buffer when nothing is buffered, before
// the connection blocks waiting for its next request.
func (rd *reader) park() {
	if rd.small == nil || rd.r != rd.w || len(rd.buf) != rd.size {
		return
	}
	if rd.full == nil {
		rd.full = new([]byte)
	}
	*rd.full = rd.buf
	readBuffers.Put(rd.full)
	rd.full = nil
	rd.buf, rd.r, rd.w = rd.small, 0, 0
}

// release gives the full-size buffer back when the connection closes,
// whatever it still holds.
func (rd *reader) release() {
	rd.r = rd.w
	rd.park()
}

// parked reports whether the reader holds only its small buffer.
func (rd *reader) parked() bool {
	return rd.small != nil && len(rd.buf) == len(rd.small) && &rd.buf[0] == &rd.small[0]
}

// unpark moves what the small buffer holds into a full-size buffer.
func (rd *reader) unpark() {
	var buf []byte
	if b, ok := readBuffers.Get().(*[]byte); ok && len(*b) == rd.size {
		buf, rd.full = *b, b
	} else {
		buf = make([]byte, rd.size)
	}
	rd.w = copy(buf, rd.buf[rd.r:rd.w])
	rd.r = 0
	rd.buf = buf
}

// line returns the next complete command line with its "\r\n" removed, cut
// at the first NUL as memcached's C string handling does. It returns
// errNeedMore when no full line is buffered and errLineTooLong when the
// buffered bytes break memcached's framing rule.
func (rd *reader) line() ([]byte, error) {
	data := rd.buf[rd.r:rd.w]
	i := bytes.IndexByte(data, '\n')
	if i < 0 {
		if unframed(data, rd.keyLine) || len(data) == len(rd.buf) && len(rd.buf) >= rd.max {
			return nil, errLineTooLong
		}
		return nil, errNeedMore
	}
	rd.r += i + 1
	return commandLine(data[:i]), nil
}

// commandLine is a line, up to its newline, as memcached reads it: without
// the '\r' before the newline, which it does not require, and cut at the
// first NUL, as its C string handling does.
func commandLine(line []byte) []byte {
	if len(line) > 1 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	if z := bytes.IndexByte(line, 0); z >= 0 {
		line = line[:z]
	}
	return line
}

// unframed reports whether data, the start of a line whose newline has not
// come, breaks memcached's framing rule: past lineLimit bytes, unless it
// is a retrieval, which may keep growing, or names a key and is within
// keyLine.
func unframed(data []byte, keyLine int) bool {
	return len(data) > lineLimit && !isRetrievalPrefix(data) && (len(data) > keyLine || !isKeyedPrefix(data))
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

// keyedLineMax is the longest a line that names a key may run without a
// newline: the framing limit, and the longest key a client may send, in
// base64 as a meta command may send it.
func keyedLineMax(maxKey int) int { return lineLimit + (maxKey+2)/3*4 }

// prime puts bytes read elsewhere (by an event loop) before whatever the
// client sends next.
func (rd *reader) prime(b []byte) {
	if len(b) == 0 {
		return
	}
	if len(b) > len(rd.buf) {
		rd.buf = make([]byte, max(rd.size, len(b)))
	}
	rd.r, rd.w = 0, copy(rd.buf, b)
	rd.primed = true
}

// fill reads more bytes from the client, making room first: consumed bytes
// are dropped, and a buffer full of one unfinished line grows up to max.
func (rd *reader) fill() error {
	if rd.err != nil {
		return rd.err
	}
	if rd.primed {
		rd.primed = false
		return nil
	}
	if rd.parked() {
		if rd.r < rd.w || rd.ready {
			// Bytes are waiting, or the read cannot block (the caller
			// waited for readiness): go on in a full buffer.
			rd.unpark()
		} else {
			// The connection was waiting for a request: wait on the
			// small buffer, and handle what arrived in a full one.
			rd.r, rd.w = 0, 0
			if err := rd.readSome(); err != nil {
				return err // the connection is closing: no buffer to take
			}
			rd.unpark()
			return nil
		}
	}
	if rd.r > 0 {
		n := copy(rd.buf, rd.buf[rd.r:rd.w])
		rd.r, rd.w = 0, n
	}
	if rd.w == len(rd.buf) {
		size := min(2*len(rd.buf), max(rd.max, rd.want))
		if size <= len(rd.buf) {
			return errLineTooLong
		}
		grown := make([]byte, size)
		copy(grown, rd.buf[:rd.w])
		rd.buf = grown
	}
	return rd.readSome()
}

// data returns the next n bytes. A block that fits the buffer is returned in
// place; a larger one is copied into a slice that grows only as bytes really
// arrive, so a client cannot make the proxy reserve memory by merely
// announcing a large value.
func (rd *reader) data(n int) ([]byte, error) {
	if n <= len(rd.buf) {
		for rd.w-rd.r < n {
			if rd.r+n > len(rd.buf) {
				m := copy(rd.buf, rd.buf[rd.r:rd.w])
				rd.r, rd.w = 0, m
			}
			if err := rd.readSome(); err != nil {
				return nil, err
			}
		}
		b := rd.buf[rd.r : rd.r+n]
		rd.r += n
		return b, nil
	}
	// One buffer's worth to start with: a client that claims 2 MiB and
	// sends ten bytes costs 16 KiB, not 2 MiB (nor 64 KiB per connection).
	out := make([]byte, 0, len(rd.buf))
	for len(out) < n {
		if rd.r == rd.w {
			rd.r, rd.w = 0, 0
			if err := rd.readSome(); err != nil {
				return nil, err
			}
		}
		take := min(n-len(out), rd.w-rd.r)
		out = append(out, rd.buf[rd.r:rd.r+take]...)
		rd.r += take
	}
	return out, nil
}

// discard drops the next n bytes without keeping them. Bytes that have
// not arrived yet when the client has nothing more ready are dropped later,
// as they arrive.
func (rd *reader) discard(n int) error {
	for n > 0 {
		if rd.r == rd.w {
			rd.r, rd.w = 0, 0
			if err := rd.readSome(); err != nil {
				if err == errWouldBlock {
					rd.skip = n
					return nil
				}
				return err
			}
		}
		take := min(n, rd.w-rd.r)
		rd.r += take
		n -= take
	}
	return nil
}

// shrink returns a buffer that a long retrieval line grew to its first
// size once the bytes in it fit, so memory follows what a connection does
// now, not the largest line it ever sent.
func (rd *reader) shrink() {
	if len(rd.buf) <= rd.size || rd.w-rd.r > rd.size {
		return
	}
	small := make([]byte, rd.size)
	rd.w = copy(small, rd.buf[rd.r:rd.w])
	rd.r = 0
	rd.buf = small
}

// readSome reads into the free tail of the buffer, which the caller has
// made non-empty.
func (rd *reader) readSome() error {
	if rd.err != nil {
		return rd.err
	}
	if rd.flush != nil {
		if err := rd.flush(); err != nil {
			rd.err = err
			return err
		}
	}
	free := rd.buf[rd.w:]
	n, err := rd.src.Read(free)
	rd.short = n < len(free)
	rd.w += n
	if rd.skip > 0 {
		drop := min(rd.skip, rd.w-rd.r)
		rd.r += drop
		rd.skip -= drop
	}
	if n == 0 && err == nil {
		err = io.ErrNoProgress
	}
	if err != nil && n == 0 {
		if err != errWouldBlock {
			rd.err = err
		}
		return err
	}
	return nil
}

// buffered reports whether n bytes from r have arrived.
func (rd *reader) buffered(n int) bool { return rd.w-rd.r >= n }
