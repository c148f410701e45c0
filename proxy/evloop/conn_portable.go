//go:build !linux || evloop_portable

package evloop

import (
	"errors"
	"io"
	"net"
	"os"
	"time"
)

// smallRead is the size of a connection's own read buffer.
const smallRead = 4 << 10

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

	small   []byte      // the connection's read buffer, made at its first read
	large   bool        // the next read goes into a large buffer (see armRead)
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
// paused, and how the read ended.
func (c *Conn) resume() {
	if c.closing || c.paused || !c.held {
		return
	}
	err := c.heldErr
	c.held, c.heldErr = false, nil
	if c.InboundBuffered() > 0 && !c.traffic(nil) {
		return
	}
	c.deliver(nil, nil, err)
}

// armRead has the reader read once, unless the connection is paused or a
// read is under way: into the connection's small buffer, or when the last
// read filled its buffer, into a large one of the loop's. An idle
// connection holds only its small one.
func (c *Conn) armRead() {
	if c.closing || c.paused || c.ended || c.reading || c.held {
		return
	}
	var buf []byte
	if c.large {
		buf = c.loop.takeLarge()
	} else {
		if c.small == nil {
			c.small = make([]byte, min(smallRead, c.loop.bufSize))
		}
		buf = c.small
	}
	c.reading = true
	c.next <- buf
}

// reader reads once for each buffer the loop gives it and hands the loop
// what came.
func (c *Conn) reader() {
	for buf := range c.next {
		n, err := c.nc.Read(buf)
		c.loop.post(func() { c.arrived(buf, n, err) })
	}
}

// arrived handles a read's outcome on the loop.
func (c *Conn) arrived(buf []byte, n int, err error) {
	c.reading = false
	if c.closing {
		return
	}
	c.large = n == len(buf) && len(buf) < c.loop.bufSize || c.large && n > len(buf)/2
	c.deliver(buf[:n], buf, err)
}

// deliver hands b to OnTraffic, in as many calls as ReadInto's buffers
// cut it into (each takes a copy of as much as it holds, so a buffer the
// handler gives is written to at once, not when a read ends), then ends
// the connection's reading if err says the read failed, and reads again
// otherwise. buf, b's buffer, goes back to the loop if it is a large one.
func (c *Conn) deliver(b, buf []byte, err error) {
	l := c.loop
	defer l.giveLarge(buf)
	for len(b) > 0 {
		if c.paused {
			c.keepIn(b)
			c.held, c.heldErr = true, err
			return
		}
		fresh := b
		if l.readInto != nil {
			if into := l.readInto.ReadInto(c); len(into) > 0 {
				fresh = into[:copy(into, b)]
			}
		}
		b = b[len(fresh):]
		if !c.traffic(fresh) {
			return
		}
	}
	switch {
	case err == nil:
		c.armRead()
	case c.paused:
		c.held, c.heldErr = true, err
	case errors.Is(err, io.EOF) && l.readEnd != nil:
		c.paused, c.ended = true, true
		if l.readEnd.OnReadEnd(c) == Close {
			c.close(os.NewSyscallError("read", io.EOF))
		}
	default:
		c.close(os.NewSyscallError("read", err))
	}
}

// traffic calls OnTraffic with fresh after the bytes held, and reports
// whether the connection is still open.
func (c *Conn) traffic(fresh []byte) bool {
	c.fresh = fresh
	action := c.loop.h.OnTraffic(c)
	if c.closing {
		return false
	}
	if action == Close {
		c.close(nil)
		return false
	}
	if len(c.fresh) > 0 {
		c.keepIn(c.fresh) // the read buffer goes back, or to the next read
	}
	c.fresh = nil
	return true
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
	c.in, c.inOff, c.fresh, c.small = nil, 0, nil, nil
	c.out, c.spare, c.flight = nil, nil, 0
}
