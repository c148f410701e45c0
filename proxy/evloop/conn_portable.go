//go:build !linux || evloop_portable

package evloop

import (
	"errors"
	"io"
	"net"
	"os"
	"time"
)

// closeLinger bounds how long the writer of a closed connection may take
// to write what the connection held: the peer that reads nothing does not
// keep the goroutine longer.
const closeLinger = time.Second

// Conn is a connection on a loop. Its methods must be called on the
// loop's goroutine: in a callback, or in a task given to Execute.
//
// Its reader goroutine reads once each time the loop gives it a buffer
// (next), which the loop does only while the connection is read and no
// read is under way; its writer goroutine writes each buffer the loop
// gives it (wch), one at a time, and closes the socket once wch is closed.
type Conn struct {
	loop   *Loop
	nc     net.Conn
	ctx    any
	remote net.Addr

	// Bytes read and not yet discarded: in[inOff:], left by earlier
	// reads, then fresh, the last read's, during OnTraffic.
	in    []byte
	inOff int
	fresh []byte

	own     []byte      // the connection's read buffer, made at its first read
	next    chan []byte // the buffer of the next read, to the reader
	reading bool        // a read is under way
	held    bool        // a read ended while paused: its bytes are in in
	heldErr error       // and how it ended

	wch    chan []byte // buffers to write, to the writer
	flight int         // bytes of the write under way
	out    []byte      // bytes to write after those
	spare  []byte      // a written buffer, for out to reuse

	paused  bool // the socket is not read (see PauseReading)
	ended   bool // the peer ended its side (see ReadEnder)
	closing bool // close has begun: OnClose is running or has run
}

// Fd is -1: the portable poller has no descriptor to give.
func (c *Conn) Fd() int { return -1 }

// OutboundBuffered is how many bytes the connection holds to write.
func (c *Conn) OutboundBuffered() int { return c.flight + len(c.out) }

// Write writes b, in the background: it returns len(b) once it holds a
// copy. A write that fails later closes the connection then.
func (c *Conn) Write(b []byte) (int, error) {
	if c.closing {
		return 0, net.ErrClosed
	}
	c.out = append(c.out, b...)
	c.startWrite()
	return len(b), nil
}

// Writev writes bufs, in order, as Write writes one buffer.
func (c *Conn) Writev(bufs [][]byte) (int, error) {
	if c.closing {
		return 0, net.ErrClosed
	}
	total := 0
	for _, b := range bufs {
		c.out = append(c.out, b...)
		total += len(b)
	}
	c.startWrite()
	return total, nil
}

// startWrite gives the writer what the connection holds, unless a write
// is under way: its end starts the next.
func (c *Conn) startWrite() {
	if c.flight > 0 || len(c.out) == 0 {
		return
	}
	b := c.out
	c.out, c.spare = c.spare[:0], nil
	c.flight = len(b)
	c.wch <- b
}

// writer writes what the loop gives it and tells the loop how each write
// ended; once the loop closes wch, it closes the socket.
func (c *Conn) writer() {
	for b := range c.wch {
		_, err := c.nc.Write(b)
		c.loop.post(func() { c.written(b, err) })
	}
	c.nc.Close()
}

// written ends a write on the loop.
func (c *Conn) written(b []byte, err error) {
	if c.closing {
		return
	}
	c.flight = 0
	if cap(b) <= bufKeepMax {
		c.spare = b[:0]
	}
	if err != nil {
		c.close(os.NewSyscallError("write", err))
		return
	}
	c.startWrite()
}

// PauseReading stops reading the socket until ResumeReading: what the
// peer sends meanwhile waits in the socket's buffer, and once that is
// full, in the peer. A read under way when it is called keeps what it
// brings for ResumeReading.
func (c *Conn) PauseReading() {
	if !c.closing && !c.ended {
		c.paused = true
	}
}

// ResumeReading reads the socket again after PauseReading.
func (c *Conn) ResumeReading() {
	if c.closing || c.ended || !c.paused {
		return
	}
	c.paused = false
	if c.held {
		// OnTraffic must not run inside the caller's callback.
		c.loop.post(c.resume)
		return
	}
	c.armRead()
}

// resume hands OnTraffic what a read brought while the connection was
// paused.
func (c *Conn) resume() {
	if c.closing || c.paused || !c.held {
		return
	}
	err := c.heldErr
	c.held, c.heldErr = false, nil
	c.deliver(nil, err, c.InboundBuffered() > 0)
}

// armRead has the reader read once, into the handler's buffer or the
// connection's own, unless the connection is paused or a read is under
// way.
func (c *Conn) armRead() {
	if c.closing || c.paused || c.ended || c.reading || c.held {
		return
	}
	buf := c.own
	if c.loop.readInto != nil {
		if b := c.loop.readInto.ReadInto(c); len(b) > 0 {
			buf = b
		}
	}
	if len(buf) == 0 {
		c.own = make([]byte, c.loop.bufSize)
		buf = c.own
	}
	c.reading = true
	c.next <- buf
}

// reader reads once for each buffer the loop gives it and hands the loop
// what came.
func (c *Conn) reader() {
	for buf := range c.next {
		n, err := c.nc.Read(buf)
		c.loop.post(func() { c.arrived(buf[:n], err) })
	}
}

// arrived handles a read's outcome on the loop.
func (c *Conn) arrived(b []byte, err error) {
	c.reading = false
	if c.closing {
		return
	}
	if c.paused {
		c.keepIn(b)
		c.held, c.heldErr = true, err
		return
	}
	c.deliver(b, err, len(b) > 0)
}

// deliver hands fresh bytes to OnTraffic when traffic says so, then ends
// the connection's reading if err says the read failed, and reads again
// otherwise.
func (c *Conn) deliver(b []byte, err error, traffic bool) {
	l := c.loop
	if traffic {
		c.fresh = b
		action := l.h.OnTraffic(c)
		if c.closing {
			return
		}
		if action == Close {
			c.close(nil)
			return
		}
		if len(c.fresh) > 0 {
			c.keepIn(c.fresh) // the read buffer is the connection's, or the handler's
		}
		c.fresh = nil
	}
	switch {
	case err == nil:
		c.armRead()
	case errors.Is(err, io.EOF) && l.readEnd != nil:
		c.paused, c.ended = true, true
		if l.readEnd.OnReadEnd(c) == Close {
			c.close(os.NewSyscallError("read", io.EOF))
		}
	default:
		c.close(os.NewSyscallError("read", err))
	}
}

// Close closes the connection now: OnClose runs before Close returns, and
// what the connection holds to write is written after it, for at most
// closeLinger. Closing a closed connection does nothing. From another
// goroutine, give the loop a task that calls Close.
func (c *Conn) Close() { c.close(nil) }

func (c *Conn) close(err error) {
	if c.closing {
		return
	}
	c.closing = true
	l := c.loop
	delete(l.conns, c)
	l.count.Add(-1)
	l.h.OnClose(c, err)
	close(c.next) // a read under way ends when the socket closes
	if len(c.out) > 0 {
		c.nc.SetWriteDeadline(time.Now().Add(closeLinger))
		c.wch <- c.out // wch has room: startWrite gives one buffer at a time
	} else if c.flight > 0 {
		c.nc.SetWriteDeadline(time.Now().Add(closeLinger))
	}
	close(c.wch)
	c.in, c.inOff, c.fresh, c.own = nil, 0, nil, nil
	c.out, c.spare, c.flight = nil, nil, 0
}
