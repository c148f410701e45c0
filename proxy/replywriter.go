package proxy

import (
	"net"
	"sync"
)

// refMin is the smallest value a reply refers to in place rather than
// copies: below it a copy costs less than one more piece for writev.
const refMin = 2048

// flushAt is how many reply bytes a connection gathers before it writes
// them without waiting for the end of the batch of requests.
const flushAt = 256 << 10

// replyWriter gathers a connection's replies and writes them in one system
// call when the batch of requests that produced them is done. Lines and
// small values are copied into one buffer; large values are referred to
// where they were read from upstream, and the pieces go out together with
// writev, so a multi-get of large values is neither copied nor written in
// fixed-size pieces.
type replyWriter struct {
	cc  *countingConn
	buf []byte // copied bytes
	// pieces, once a value is referred to, are the pending replies in
	// order: slices of buf and the values themselves.
	pieces net.Buffers
	done   int // bytes of buf already in pieces
	size   int // bytes pending in all
}

// replyWriters holds the reply buffers of connections that wait for a
// request: a connection takes one when a request arrives and puts it back
// once its replies are written, so a thousand idle clients do not hold
// their buffers.
var replyWriters = sync.Pool{New: func() any { return &replyWriter{buf: make([]byte, 0, writeBufferSize)} }}

func (w *replyWriter) reset(cc *countingConn) {
	w.cc = cc
	w.buf = w.buf[:0]
	clear(w.pieces)
	w.pieces = w.pieces[:0]
	w.done, w.size = 0, 0
}

// Write copies b into the pending replies. It never fails: errors surface
// at flush. Without a connection (an event loop gathering a reply) it
// only gathers.
func (w *replyWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	w.size += len(b)
	if w.size >= flushAt && w.cc != nil {
		w.flush()
	}
	return len(b), nil
}

// writeRef adds b to the pending replies without copying it when it is
// large; b must stay unchanged until the next flush.
func (w *replyWriter) writeRef(b []byte) {
	if len(b) < refMin || !w.cc.direct {
		w.Write(b)
		return
	}
	w.cut()
	w.pieces = append(w.pieces, b)
	w.size += len(b)
	if w.size >= flushAt {
		w.flush()
	}
}

// cut closes the copied bytes gathered since the last piece into a piece.
func (w *replyWriter) cut() {
	if len(w.buf) > w.done {
		w.pieces = append(w.pieces, w.buf[w.done:len(w.buf):len(w.buf)])
		w.done = len(w.buf)
	}
}

// refers reports whether pending replies refer to values the writer does
// not own, which must stay unchanged until the next flush.
func (w *replyWriter) refers() bool { return len(w.pieces) > 0 }

// flush writes every pending reply: one write, or one writev when values
// are referred to.
func (w *replyWriter) flush() error {
	if w.size == 0 {
		return nil
	}
	var err error
	if len(w.pieces) == 0 {
		_, err = w.cc.Write(w.buf)
	} else {
		w.cut()
		out := w.pieces // WriteTo consumes the slice it is given
		err = w.cc.writeBuffers(&out)
	}
	if cap(w.buf) > 4*writeBufferSize {
		w.buf = make([]byte, 0, writeBufferSize)
	}
	w.reset(w.cc)
	return err
}
