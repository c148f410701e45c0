package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
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

// upstreamReadSize is the read buffer of an upstream connection: large
// enough that the reply to a multi-get of many values arrives in few reads
// (a value larger than it is read straight into place). Only connections
// in use or idle hold one, a few per server.
const upstreamReadSize = 64 << 10

type rawConn struct {
	nc    net.Conn
	rw    *bufio.ReadWriter
	src   *sendFirst // under rw's reader
	out   []byte     // a batch of requests being gathered
	lines []int      // how many retrieval lines each run of gets of it has
	used  time.Time  // when its last use began
}

// staleAfter is how long a pooled connection sits unused before get looks
// whether the server closed it meanwhile. A busy connection, reused
// within microseconds, costs no system call for the look; a restart takes
// far longer, so after one every connection the pool kept is found closed
// before a request is written on it.
const staleAfter = time.Millisecond

// sendFirst reads an upstream connection for its bufio.Reader. A batch of
// requests handed to it is written as the first read begins, inside the
// wait for the socket to become readable: the read then happens once the
// replies are there. Writing first and reading after would cost one more
// read, which finds the socket empty while the server is still answering.
type sendFirst struct {
	nc  net.Conn
	rc  syscall.RawConn // nil: not a plain socket; write, then read
	out []byte          // to write before the next read; nil: none
	w   *sockio.Writer  // writeNow's writes, with rc

	// The read in progress, for onReadable: kept here, with the callback
	// made once, so that a read allocates nothing.
	turn func(fd uintptr) bool
	p    []byte
	n    int
	err  error
	sent bool

	// got counts the bytes read since the connection's current use
	// began: none means no reply had begun to arrive when it failed.
	got int
}

func newSendFirst(nc net.Conn) *sendFirst {
	s := &sendFirst{nc: nc, rc: sockio.RawConnOf(nc)}
	s.turn = s.onReadable
	if s.rc != nil {
		s.w = sockio.NewWriter(s.rc)
	}
	return s
}

func (s *sendFirst) Read(p []byte) (int, error) {
	if s.rc == nil {
		if err := s.writeNow(); err != nil {
			return 0, err
		}
		n, err := s.nc.Read(p)
		s.got += n
		return n, err
	}
	s.p, s.n, s.err, s.sent = p, 0, nil, s.out == nil
	err := s.rc.Read(s.turn)
	s.p, s.out = nil, nil
	if s.err != nil {
		return 0, s.err
	}
	if err != nil {
		return 0, err
	}
	s.got += s.n
	return s.n, nil
}

// onReadable is the callback of the wait. Its first call writes the batch
// (the wait has begun: no readiness the replies raise is lost) and waits;
// later ones read.
func (s *sendFirst) onReadable(fd uintptr) bool {
	if !s.sent {
		s.sent = true
		s.err = s.writeNow()
		return s.err != nil
	}
	n, again, err := sockio.Read(int(fd), s.p)
	if again {
		return false
	}
	s.n, s.err = n, err
	return true
}

// writeNow writes the batch: at once, or as the first read begins. A
// batch larger than the socket's send buffer waits for room.
func (s *sendFirst) writeNow() error {
	out := s.out
	s.out = nil
	if out == nil {
		return nil
	}
	if s.rc == nil {
		_, err := s.nc.Write(out)
		return err
	}
	_, err := s.w.WriteOne(out)
	return err
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
	src := newSendFirst(nc)
	return &rawConn{nc: nc, src: src, rw: bufio.NewReadWriter(bufio.NewReaderSize(src, upstreamReadSize), bufio.NewWriterSize(nc, 4<<10))}, false, nil
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
