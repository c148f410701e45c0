package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"mcsidecar/proxy/internal/sockio"
)

// rawPool holds a few connections to one server for what is asked
// outside the event loops: the version of readiness checks and of the
// probes of an ejected server. One deadline bounds each request.
type rawPool struct {
	dial           func(ctx context.Context, network, addr string) (net.Conn, error)
	timeout        time.Duration
	connectTimeout time.Duration
	maxIdle        int
	health         *health
	// outOfStep counts and logs a connection found out of step.
	outOfStep func(error)

	mu     sync.Mutex
	idle   []*rawConn
	closed bool
}

// rawConn is a pooled connection, read through a counting reader.
type rawConn struct {
	nc   net.Conn
	rw   *bufio.ReadWriter
	src  *countingReader // under rw's reader
	used time.Time       // when its last use began
}

// staleAfter is how long a pooled connection sits unused before get looks
// whether the server closed it meanwhile. A busy connection, reused
// within microseconds, costs no system call for the look; a restart takes
// far longer, so after one every connection the pool kept is found closed
// before a request is written on it.
const staleAfter = time.Millisecond

// countingReader reads a pooled connection for its bufio.Reader and
// counts the bytes read since the connection's current use began: none
// means no reply had begun to arrive when it failed, so that a request
// safe to repeat may be sent again (see try).
type countingReader struct {
	nc  net.Conn
	got int
}

func (r *countingReader) Read(p []byte) (int, error) {
	n, err := r.nc.Read(p)
	r.got += n
	return n, err
}

var errUnexpectedReply = errors.New("unexpected reply from upstream")

// do runs fn as try does, under the server's health.
func (p *rawPool) do(idempotent bool, fn func(*rawConn) error) error {
	return p.guard(func() error { return p.try(idempotent, fn) })
}

// guard sends a request unless the server is ejected, and counts the
// result towards ejecting it.
func (p *rawPool) guard(send func() error) error {
	if err := p.health.admit(); err != nil {
		return err
	}
	return p.health.observe(send())
}

// try runs fn on a pooled connection under one deadline. The connection is
// kept only if fn succeeded. When a connection taken from the idle pool
// fails other than by timing out, the server has most likely restarted
// since get looked at the connection: every idle connection is dropped.
// fn then runs once more, on a new connection, only if idempotent says
// its request may be applied twice and no byte of a reply had arrived.
// Any other request fails: memcached may have applied it before the
// connection broke, and an incr sent again would count twice.
func (p *rawPool) try(idempotent bool, fn func(*rawConn) error) error {
	c, reused, err := p.get()
	if err != nil {
		return err
	}
	err = p.run(c, fn)
	if err != nil && reused && !IsTimeout(err) && !IsOutOfStep(err) {
		p.dropIdle()
		if !idempotent || c.src.got > 0 {
			return err
		}
		if c, _, err = p.get(); err != nil {
			return err
		}
		err = p.run(c, fn)
	}
	return err
}

// get returns an idle connection, or a new one. An idle connection unused
// for staleAfter is looked at first: when the server closed it meanwhile
// (it restarted, or its idle timeout ran out), it is not used, nor is any
// other idle one, and a new connection is made before anything is
// written. A request that fails on a connection get hands out may have
// been applied; one never written can be sent anywhere.
func (p *rawPool) get() (c *rawConn, reused bool, err error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		c, p.idle = p.idle[n-1], p.idle[:n-1]
	}
	p.mu.Unlock()
	if c != nil {
		if time.Since(c.used) < staleAfter || sockio.Quiet(c.nc) {
			return c, true, nil
		}
		c.nc.Close()
		p.dropIdle()
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(p.connectTimeout, p.timeout))
	defer cancel()
	nc, err := p.dial(ctx, "", "")
	if err != nil {
		return nil, false, err
	}
	src := &countingReader{nc: nc}
	return &rawConn{nc: nc, src: src, rw: bufio.NewReadWriter(bufio.NewReaderSize(src, 512), bufio.NewWriterSize(nc, 512))}, false, nil
}

// run runs fn on c under one deadline and pools c again if fn succeeded.
func (p *rawPool) run(c *rawConn, fn func(*rawConn) error) error {
	c.begin(time.Now(), p.timeout)
	if err := fn(c); err != nil {
		p.closeOn(c, err)
		return err
	}
	p.put(c)
	return nil
}

// closeOn closes c, which failed with err: a connection out of step is
// never read on, and is counted.
func (p *rawPool) closeOn(c *rawConn, err error) {
	c.nc.Close()
	if p.outOfStep != nil && IsOutOfStep(err) {
		p.outOfStep(err)
	}
}

// begin starts a use of c at now: its deadline, and its count of bytes
// read from zero.
func (c *rawConn) begin(now time.Time, timeout time.Duration) {
	c.nc.SetDeadline(now.Add(timeout))
	c.used = now
	c.src.got = 0
}

// put pools c again, or closes it when the pool is full or closed.
func (p *rawPool) put(c *rawConn) {
	p.mu.Lock()
	if !p.closed && len(p.idle) < p.maxIdle {
		p.idle = append(p.idle, c)
		c = nil
	}
	p.mu.Unlock()
	if c != nil {
		c.nc.Close()
	}
}

// dropIdle closes every idle connection.
func (p *rawPool) dropIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		c.nc.Close()
	}
}

func (p *rawPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, c := range p.idle {
		c.nc.Close()
	}
	p.idle = nil
}

// ping asks the server for its version, the cheapest request it answers
// and one that changes nothing, safe to repeat. An ejected server is not
// asked: it does not answer.
func (p *rawPool) ping() error { return p.do(true, askVersion) }

// probe asks an ejected server for its version, to see if it is back.
func (p *rawPool) probe() error { return p.try(true, askVersion) }

func askVersion(c *rawConn) error {
	c.rw.WriteString("version\r\n")
	return expectLine(c, []byte("VERSION "))
}

// expectLine flushes the request and reads one reply line starting with
// prefix.
func expectLine(c *rawConn, prefix []byte) error {
	if err := c.rw.Flush(); err != nil {
		return err
	}
	line, err := c.rw.ReadSlice('\n')
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(line, prefix) {
		return fmt.Errorf("%w: %q", errUnexpectedReply, line)
	}
	return nil
}

// MaxValueLen is the longest value memcached can hold (its -I is at most
// 1 GiB): a reply that announces a longer one is out of step, not a value
// to wait for.
const MaxValueLen = 1 << 30
