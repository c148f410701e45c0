package evloop

import "net"

// bufKeepMax is the largest buffer a connection keeps once it is empty.
const bufKeepMax = 64 << 10

// What follows is the part of Conn both pollers share: the connection's
// context and the bytes read and not yet discarded.

// Context returns what was given to Enroll, or to SetContext since.
func (c *Conn) Context() any { return c.ctx }

// SetContext replaces the connection's Context.
func (c *Conn) SetContext(ctx any) { c.ctx = ctx }

// Loop returns the loop the connection is on.
func (c *Conn) Loop() *Loop { return c.loop }

// InboundBuffered is how many bytes were read and not yet discarded.
func (c *Conn) InboundBuffered() int { return len(c.in) - c.inOff + len(c.fresh) }

// Peek returns every byte read and not yet discarded, in one slice. It is
// the read buffer itself when no earlier bytes wait before the last read's;
// otherwise those are appended to the earlier ones first. The slice is
// valid until the callback or task that called Peek returns, or Discard
// and Peek have been called again.
func (c *Conn) Peek() []byte {
	if c.inOff == len(c.in) {
		return c.fresh
	}
	if len(c.fresh) > 0 {
		c.keepIn(c.fresh)
		c.fresh = nil
	}
	return c.in[c.inOff:]
}

// Discard drops the first n bytes read (all of them when there are
// fewer).
func (c *Conn) Discard(n int) {
	if n <= 0 {
		return
	}
	if held := len(c.in) - c.inOff; held > 0 {
		if n < held {
			c.inOff += n
			return
		}
		n -= held
		c.in, c.inOff = c.in[:0], 0
		if cap(c.in) > bufKeepMax {
			c.in = nil
		}
	}
	c.fresh = c.fresh[min(n, len(c.fresh)):]
}

// traffic calls OnTraffic with fresh, the last read's bytes, after the
// bytes held, and reports whether the connection is still open.
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
		c.keepIn(c.fresh) // the read buffer is the loop's, or the handler's
	}
	c.fresh = nil
	return true
}

// keepIn appends b to the bytes kept from earlier reads.
func (c *Conn) keepIn(b []byte) {
	if c.inOff > 0 {
		c.in = c.in[:copy(c.in, c.in[c.inOff:])]
		c.inOff = 0
	}
	c.in = append(c.in, b...)
}

// Reading reports whether the socket is read: false between PauseReading
// and ResumeReading.
func (c *Conn) Reading() bool { return !c.paused }

// RemoteAddr returns the address of the connection's peer, as its
// net.Conn gave it when it was enrolled.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// Closed reports whether the connection is closed, or closing: OnClose
// has run or is running.
func (c *Conn) Closed() bool { return c.closing }
