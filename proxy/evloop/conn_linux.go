//go:build linux && !evloop_portable

package evloop

import (
	"errors"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// Conn is a connection on a loop. Its methods must be called on the
// loop's goroutine: in a callback, or in a task given to Execute.
type Conn struct {
	loop   *Loop
	fd     int // -1 once closed
	ctx    any
	remote net.Addr

	// Bytes read and not yet discarded: in[inOff:], left by earlier
	// reads, then fresh, the last read's, during OnTraffic.
	in    []byte
	inOff int
	fresh []byte

	// Bytes to write once the socket has room: out[outOff:].
	out    []byte
	outOff int

	watchOut bool // epoll reports when the socket can be written
	paused   bool // the socket is not read (see PauseReading)
	ended    bool // the peer ended its side (see ReadEnder)
	closing  bool // close has begun: OnClose is running or has run
}

// Fd returns the connection's socket, or -1 once it is closed (and always
// with the portable poller). Writing to it directly is allowed while
// OutboundBuffered is 0.
func (c *Conn) Fd() int { return c.fd }

// OutboundBuffered is how many bytes the connection holds to write.
func (c *Conn) OutboundBuffered() int { return len(c.out) - c.outOff }

// Write writes b: straight to the socket when the connection holds
// nothing to write, and what the socket does not take, or all of b when
// it holds some, into the connection's buffer, written as the socket
// makes room. It returns len(b), or the error of a write that failed,
// which closes the connection there and then (OnClose has run when Write
// returns).
func (c *Conn) Write(b []byte) (int, error) {
	if c.fd < 0 {
		return 0, net.ErrClosed
	}
	if c.closing || c.outOff < len(c.out) {
		c.queue(b)
		return len(b), nil
	}
	n, err := write(c.fd, b)
	if err != nil {
		c.close(os.NewSyscallError("write", err))
		return 0, err
	}
	if n < len(b) {
		c.queue(b[n:])
		if err := c.waitRoom(); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

// Writev writes bufs, in order, as Write writes one buffer, in one system
// call.
func (c *Conn) Writev(bufs [][]byte) (int, error) {
	if c.fd < 0 {
		return 0, net.ErrClosed
	}
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	if c.closing || c.outOff < len(c.out) {
		for _, b := range bufs {
			c.queue(b)
		}
		return total, nil
	}
	n, err := c.loop.writev(c.fd, bufs)
	if err == unix.EAGAIN {
		n, err = 0, nil
	}
	if err != nil {
		c.close(os.NewSyscallError("writev", err))
		return 0, err
	}
	if n == total {
		return total, nil
	}
	for _, b := range bufs {
		if n >= len(b) {
			n -= len(b)
			continue
		}
		c.queue(b[n:])
		n = 0
	}
	if err := c.waitRoom(); err != nil {
		return 0, err
	}
	return total, nil
}

// flush writes what the connection holds to write, as far as the socket
// takes it in one write. A write that fails closes the connection, unless
// it is closing already.
func (c *Conn) flush() error {
	if c.fd < 0 || c.outOff == len(c.out) {
		return nil
	}
	n, err := write(c.fd, c.out[c.outOff:])
	if err != nil {
		if !c.closing {
			c.close(os.NewSyscallError("write", err))
		}
		return err
	}
	c.outOff += n
	if c.outOff < len(c.out) {
		return nil
	}
	c.out, c.outOff = c.out[:0], 0
	if cap(c.out) > bufKeepMax {
		c.out = nil
	}
	if c.watchOut && !c.closing {
		if err := c.loop.watch(c, false); err != nil {
			c.close(err)
			return err
		}
	}
	return nil
}

// queue appends b to the bytes to write, first moving them to the front
// of their buffer once at least half of it was written.
func (c *Conn) queue(b []byte) {
	if c.outOff > 0 && 2*c.outOff >= len(c.out) {
		c.out = c.out[:copy(c.out, c.out[c.outOff:])]
		c.outOff = 0
	}
	c.out = append(c.out, b...)
}

// waitRoom has epoll report when the socket can take the bytes queued.
func (c *Conn) waitRoom() error {
	if c.watchOut {
		return nil
	}
	if err := c.loop.watch(c, true); err != nil {
		c.close(err)
		return err
	}
	return nil
}

// PauseReading stops reading the socket until ResumeReading: what the
// peer sends meanwhile waits in the socket's buffer, and once that is
// full, in the peer, as with a server that reads no more requests than it
// answers. A hang-up is still reported. A failure closes the connection.
func (c *Conn) PauseReading() { c.setPaused(true) }

// ResumeReading reads the socket again after PauseReading.
func (c *Conn) ResumeReading() { c.setPaused(false) }

func (c *Conn) setPaused(paused bool) {
	if c.fd < 0 || c.closing || c.paused == paused || c.ended {
		return
	}
	if err := c.loop.interest(c, c.watchOut, paused); err != nil {
		c.close(err)
	}
}

// MoveTo hands the connection to loop dst, which handles it from its next
// wait on; the handler's OnOpen runs there first, as for a connection
// enrolled, and may change the Context. It must be called on the
// connection's loop outside the connection's own callbacks (in OnPollEnd,
// say), with nothing read and not discarded, nothing held to write, and
// reading not paused. Once it returns nil the connection's old loop
// handles nothing more of it; on an error the connection stays on its
// loop, where Close closes it (other than ErrBusy, an error may leave it
// unwatched). What the peer sends meanwhile waits in the socket.
func (c *Conn) MoveTo(dst *Loop) error {
	src := c.loop
	switch {
	case dst == src:
		return nil
	case c.fd < 0 || c.closing:
		return net.ErrClosed
	case c.InboundBuffered() > 0 || c.OutboundBuffered() > 0 || c.paused || c.ended:
		return ErrBusy
	}
	if err := unix.EpollCtl(src.epfd, unix.EPOLL_CTL_DEL, c.fd, nil); err != nil {
		return os.NewSyscallError("epoll_ctl", err)
	}
	src.byFd[c.fd] = nil
	err := dst.Execute(func() {
		c.loop = dst
		c.watchOut = false
		if err := dst.open(c); err != nil {
			// Not in dst's epoll set: closed, and the handler told.
			dst.count.Add(1) // close takes it off again
			dst.keep(c)
			c.close(err)
		}
	})
	if err != nil {
		// dst is stopping: the connection stays, as it was, unless
		// putting it back fails too (then only Close is left).
		src.byFd[c.fd] = c
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(c.fd)}
		if aerr := unix.EpollCtl(src.epfd, unix.EPOLL_CTL_ADD, c.fd, &ev); aerr != nil {
			return errors.Join(err, os.NewSyscallError("epoll_ctl", aerr))
		}
		c.watchOut = false
		return err
	}
	src.count.Add(-1)
	dst.count.Add(1)
	return nil
}

// Close closes the connection now: OnClose runs before Close returns, and
// what the connection holds to write is written after it, as far as the
// socket takes it without waiting. Closing a closed connection does
// nothing. From another goroutine, give the loop a task that calls Close.
func (c *Conn) Close() { c.close(nil) }

func (c *Conn) close(err error) {
	if c.closing || c.fd < 0 {
		return
	}
	c.closing = true
	l := c.loop
	l.byFd[c.fd] = nil
	l.count.Add(-1)
	l.h.OnClose(c, err)
	for c.outOff < len(c.out) {
		n, err := write(c.fd, c.out[c.outOff:])
		if err != nil || n == 0 {
			break
		}
		c.outOff += n
	}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, c.fd, nil); err != nil {
		l.log.Error("event loop: epoll_ctl del failed", "fd", c.fd, "err", err)
	}
	if err := unix.Close(c.fd); err != nil {
		l.log.Error("event loop: close failed", "fd", c.fd, "err", err)
	}
	c.fd = -1
	c.in, c.inOff, c.fresh = nil, 0, nil
	c.out, c.outOff = nil, 0
}

// event handles what epoll reported for the connection.
func (c *Conn) event(ev uint32) {
	const broken = unix.EPOLLERR | unix.EPOLLHUP
	if ev&broken != 0 && ev&(unix.EPOLLIN|unix.EPOLLOUT) == 0 {
		// Nothing to read and no room to write: the socket is gone, and
		// what it held to write with it.
		c.out, c.outOff = nil, 0
		c.close(io.EOF)
		return
	}
	if ev&(unix.EPOLLOUT|broken) != 0 && c.outOff < len(c.out) {
		if c.flush(); c.fd < 0 {
			return
		}
	}
	if ev&(unix.EPOLLIN|broken) != 0 {
		c.read()
	}
}

// read reads once and hands what came to OnTraffic.
func (c *Conn) read() {
	l := c.loop
	buf := l.buf
	if l.readInto != nil {
		if b := l.readInto.ReadInto(c); len(b) > 0 {
			buf = b
		}
	}
	var n int
	var err error
	for {
		n, err = unix.Read(c.fd, buf)
		if err != unix.EINTR {
			break
		}
	}
	switch {
	case err == unix.EAGAIN:
		return
	case err != nil:
		c.close(os.NewSyscallError("read", err))
		return
	case n == 0 && l.readEnd != nil:
		// Nothing more comes: a level-triggered poll would report the
		// end again and again.
		c.setPaused(true)
		c.ended = true
		if c.fd >= 0 && !c.closing && l.readEnd.OnReadEnd(c) == Close {
			c.close(os.NewSyscallError("read", io.EOF))
		}
		return
	case n == 0:
		c.close(os.NewSyscallError("read", io.EOF))
		return
	}
	c.traffic(buf[:n])
}

// write writes b to fd once, and returns what the socket took: 0, and no
// error, when it has no room.
func write(fd int, b []byte) (int, error) {
	for {
		n, err := unix.Write(fd, b)
		switch err {
		case nil:
			return n, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, nil
		}
		return 0, err
	}
}
