package proxy

import (
	"errors"
	"net"
	"os"
	"time"
)

// overLimit reports whether --max-connections client connections are open
// already. The count is the one "stats" reports as curr_connections.
func (p *Proxy) overLimit() bool {
	limit := p.cfg.MaxConnections
	return limit > 0 && p.stats.currConns.Load() >= int64(limit)
}

// refuse turns away a connection over the limit the way memcached does when
// it is at -c: one error line, in plain text even on a TLS listener, and
// close. It runs on the accept loop, so the write may not block: a new
// socket's send buffer is empty, and the deadline guards the rest.
func (p *Proxy) refuse(nc net.Conn) {
	p.stats.connsRefused.Add(1)
	nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	nc.Write(replyTooManyConns)
	nc.Close()
}

// startIdleClock gives the client --idle-timeout from now to complete its
// next request. It runs when the connection opens and after each request,
// so time spent on a request (waiting on an upstream, say) never counts as
// idle, and a client that trickles in a line or a data block byte by byte
// is still closed when the whole request does not arrive in time.
func (c *conn) startIdleClock() {
	if t := c.p.cfg.IdleTimeout; t > 0 {
		c.idleBy = time.Now().Add(t)
		c.nc.SetReadDeadline(c.idleBy)
	}
}

// idleClosed reports whether err ended the connection because the idle
// clock ran out, and counts it. A deadline set by a shutdown is not one,
// and a write that timed out (the client took no replies) was counted
// where it failed: the reader passes on the error of the flush it made.
func (c *conn) idleClosed(err error) bool {
	if c.p.cfg.IdleTimeout <= 0 || c.p.draining() || c.cc.failed.Load() || !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	c.cc.countIdle()
	return true
}
