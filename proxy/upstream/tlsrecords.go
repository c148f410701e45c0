package upstream

import (
	"bytes"
	"crypto/tls"
	"io"
)

// memcached (1.6.18 at least) can stall a TLS connection: it reads the
// rest of a value with a read of exactly its size, and other requests into
// a 16 KiB buffer, and a TLS record holding more than such a read takes
// leaves the rest decrypted inside OpenSSL, where epoll does not see it.
// The connection then waits for bytes that have already arrived, until
// the upstream timeout. Pipelined requests meet this all the time: a batch
// of sets of 1 KiB values stalled within 30 batches, a batch of 157 gets
// of long keys too, from a plain Go TLS client with no proxy.
//
// RequestRecords avoids it: a record never holds bytes after the end of
// a value, and lines of requests without a value go together only up to
// recordLines bytes. memcached reads such a record whole, because it
// reads when its buffer holds no request, and crypto/tls never puts the
// bytes of two writes in one record.

// recordLines is how many bytes of request lines a record holds before
// it ends at the next line's end: a quarter of memcached's read buffer.
const recordLines = 4 << 10

// RequestRecords returns a writer of memcached requests to w, a TLS
// client, that ends TLS records where requests end (see above). It keeps
// the start of a line that a write leaves unfinished.
func RequestRecords(w io.Writer) io.Writer { return &recordWriter{w: w} }

type recordWriter struct {
	w     io.Writer
	line  []byte // the start of the line being written
	value int    // bytes of a value, with its CRLF, still to come
}

func (r *recordWriter) Write(p []byte) (int, error) {
	from := 0 // the start of the record being gathered
	for i := 0; i < len(p); {
		if r.value > 0 {
			n := min(r.value, len(p)-i)
			i += n
			r.value -= n
			if r.value == 0 {
				if err := r.record(p[from:i]); err != nil {
					return from, err
				}
				from = i
			}
			continue
		}
		j := bytes.IndexByte(p[i:], '\n')
		if j < 0 {
			r.line = append(r.line, p[i:]...)
			break
		}
		line := p[i : i+j+1]
		if len(r.line) > 0 {
			line = append(r.line, line...)
			r.line = line[:0]
			if cap(r.line) > recordLines {
				r.line = nil // once read, a long line's buffer goes
			}
		}
		i += j + 1
		r.value = valueSize(line)
		if r.value == 0 && i-from >= recordLines {
			if err := r.record(p[from:i]); err != nil {
				return from, err
			}
			from = i
		}
	}
	if from < len(p) {
		if err := r.record(p[from:]); err != nil {
			return from, err
		}
	}
	return len(p), nil
}

func (r *recordWriter) record(b []byte) error {
	_, err := r.w.Write(b)
	return err
}

// valueSize returns the bytes of the value, with its CRLF, that follow
// request line line: set, add, replace, append, prepend and cas name it in
// their fifth word, ms in its third; other requests carry none.
func valueSize(line []byte) int {
	var at int
	switch {
	case bytes.HasPrefix(line, []byte("set ")), bytes.HasPrefix(line, []byte("add ")),
		bytes.HasPrefix(line, []byte("replace ")), bytes.HasPrefix(line, []byte("append ")),
		bytes.HasPrefix(line, []byte("prepend ")), bytes.HasPrefix(line, []byte("cas ")):
		at = 4
	case bytes.HasPrefix(line, []byte("ms ")):
		at = 2
	default:
		return 0
	}
	for ; at > 0; at-- { // skip to the word
		sp := bytes.IndexByte(line, ' ')
		if sp < 0 {
			return 0
		}
		line = bytes.TrimLeft(line[sp:], " ")
	}
	n := 0
	for i, c := range line {
		if c < '0' || c > '9' {
			if i == 0 || c != ' ' && c != '\r' && c != '\n' {
				return 0
			}
			return n + 2
		}
		if n > 1<<30 {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return 0
}

// requestConn is a TLS connection to memcached whose writes go through
// RequestRecords.
type requestConn struct {
	*tls.Conn
	w io.Writer
}

func (c *requestConn) Write(p []byte) (int, error) { return c.w.Write(p) }
