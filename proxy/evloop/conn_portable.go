//go:build !linux || evloop_portable

package evloop

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"
)

// closeLinger bounds how long the writer of a closed connection may take
// to write what the connection held: the peer that reads nothing does not
// keep the goroutine longer.
const closeLinger = time.Second

// Conn is a connection on a loop. Its methods must be called on the
// loop's goroutine: in a callback, or in a task given to Execute.
//
// Its reader goroutine reads once each time the loop asks it to (next),
// which the loop does only while the connection is read and no read is
// under way; its writer goroutine writes each buffer the loop
// gives it (wch), one at a time, and closes the socket once wch is closed.
type Conn struct {
	loop   *Loop
	nc     net.Conn
	rc     syscall.RawConn // nc's socket, when it has one
	ctx    any
	remote net.Addr

	// Bytes read and not yet discarded: in[inOff:], left by earlier
	// reads, then fresh, the last read's, during OnTraffic.
	in    []byte
	inOff int
	fresh []byte

	next    chan struct{} // asks the reader for a read
	reading bool          // a read is under way
	held    bool          // a read ended while paused: its bytes are in in
	heldErr error         // and how it ended

	wch    chan []byte  // buffers to write, to the writer
	flight int          // bytes of the write under way
	taken  atomic.Int64 // of them, those the socket took so far
	out    []byte       // bytes to write after those
	spare  []byte       // a written buffer, for out to reuse

	paused  bool // the socket is not read (see PauseReading)
	ended   bool // the peer ended its side (see ReadEnder)
	closing bool // close has begun: OnClose is running or has run
}

// MoveTo is not offered by the portable poller, whose reader and writer
// goroutines report to the loop they began on: the connection stays.
func (c *Conn) MoveTo(dst *Loop) error {
	if dst == c.loop {
		return nil
	}
	return errors.ErrUnsupported
}

// Fd is -1: the portable poller has no descriptor to give.
func (c *Conn) Fd() int { return -1 }

// OutboundBuffered is how many bytes the connection holds to write.
func (c *Conn) OutboundBuffered() int {
	n := len(c.out)
	if c.flight > 0 {
		n += c.flight - int(c.taken.Load())
	}
	return n
}

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
	c.taken.Store(0)
	c.wch <- b
}

// writePiece is the most one write of the writer takes: what the socket
// took of a buffer is no longer counted in OutboundBuffered once each
// piece is written, as epoll's writes are not.
const writePiece = 64 << 10

// writer writes what the loop gives it and tells the loop how each write
// ended; once the loop closes wch, it closes the socket.
func (c *Conn) writer() {
	for b := range c.wch {
		var err error
		for off := 0; off < len(b) && err == nil; {
			var n int
			n, err = c.nc.Write(b[off:min(off+writePiece, len(b))])
			off += n
			c.taken.Store(int64(off))
		}
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
	c.deliver(nil, err)
}

// armRead has the reader read once, unless the connection is paused or a
// read is under way.
func (c *Conn) armRead() {
	if c.closing || c.paused || c.ended || c.reading || c.held {
		return
	}
	c.reading = true
	c.next <- struct{}{}
}

// reader reads once each time the loop asks and hands the loop what came.
func (c *Conn) reader() {
	for range c.next {
		buf, n, err := c.read()
		c.loop.post(func() { c.arrived(buf, n, err) })
	}
}

// read reads once, into a buffer of the loop's taken only once the socket
// is readable, as the epoll loop reads: an idle connection holds no
// buffer, and a read takes as much as the socket holds, up to
// Config.ReadBuffer, so that a long line arrives whole, as it would on
// epoll. Without a socket (a net.Conn of another kind), the buffer is held
// while the read waits.
func (c *Conn) read() (*[]byte, int, error) {
	bufs := &c.loop.bufs
	if c.rc == nil {
		buf := bufs.Get().(*[]byte)
		n, err := c.nc.Read(*buf)
		return buf, n, err
	}
	var buf *[]byte
	var n int
	var err error
	rerr := c.rc.Read(func(fd uintptr) bool {
		buf = bufs.Get().(*[]byte)
		n, err = syscall.Read(int(fd), *buf)
		if err == syscall.EAGAIN || err == syscall.EINTR {
			// Nothing to read yet (Read tries once before it waits):
			// wait without the buffer.
			bufs.Put(buf)
			buf = nil
			return false
		}
		return true
	})
	switch {
	case rerr != nil:
		n, err = 0, rerr
	case err != nil:
		n, err = 0, os.NewSyscallError("read", err)
	case n == 0:
		err = io.EOF
	}
	if buf == nil {
		buf = bufs.Get().(*[]byte)
	}
	return buf, n, err
}

// arrived handles a read's outcome on the loop, and gives the buffer back.
func (c *Conn) arrived(buf *[]byte, n int, err error) {
	defer c.loop.bufs.Put(buf)
	c.reading = false
	if c.closing {
		return
	}
	c.deliver((*buf)[:n], err)
}

// deliver hands b to OnTraffic, in as many calls as ReadInto's buffers
// cut it into (each takes a copy of as much as it holds, so a buffer the
// handler gives is written to at once, not when a read ends), then ends
// the connection's reading if err says the read failed, and reads again
// otherwise.
func (c *Conn) deliver(b []byte, err error) {
	l := c.loop
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
	case err == io.EOF:
		c.close(os.NewSyscallError("read", io.EOF))
	default:
		c.close(err)
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
	c.in, c.inOff, c.fresh = nil, 0, nil
	c.out, c.spare, c.flight = nil, nil, 0
}
