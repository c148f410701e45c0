package proxy

import (
	"maps"
	"net"
	"syscall"
	"testing"
	"time"

	"mcsidecar/proxy/evloop"
)

// loopConfig is testConfig served on one event loop.
func loopConfig(upstreams ...string) Config {
	cfg := testConfig(upstreams...)
	cfg.EventLoops = 1
	return cfg
}

// refusedSet is a set whose flags memcached refuses, whose data block is
// dropped, and refusedSetReply its reply.
const (
	refusedSet      = "set nokey x 0 1\r\nv\r\n"
	refusedSetReply = "CLIENT_ERROR bad command line format\r\n"
)

// dialSmallWindow connects with a 4 KiB receive buffer, so that the
// proxy's socket takes little of a long reply at once.
func dialSmallWindow(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		if cerr := rc.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); cerr != nil {
			return cerr
		}
		return err
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// onLoop reports whether f holds for a client of one of p's loops (the
// test proxies have one), asked on each loop.
func onLoop(t *testing.T, p *Proxy, f func(lc *loopClient) bool) bool {
	t.Helper()
	// A loop is known once it has had a connection: until then there is
	// nothing to ask, and f holds for no client.
	loops := eventLoopsOf(p)
	res := make(chan bool, len(loops))
	for el, ls := range loops {
		err := el.Execute(func() {
			ok := false
			for lc := range ls.clients {
				ok = ok || f(lc)
			}
			res <- ok
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	ok := false
	for range loops {
		select {
		case r := <-res:
			ok = ok || r
		case <-time.After(5 * time.Second):
			t.Fatal("the loop did not answer")
		}
	}
	return ok
}

// waitOnLoop waits up to 5 s for f to hold for a client of p's loop.
func waitOnLoop(t *testing.T, p *Proxy, f func(lc *loopClient) bool) {
	t.Helper()
	if !waitFor(5*time.Second, func() bool { return onLoop(t, p, f) }) {
		t.Fatal("no client of the loop came to the state the test waits for")
	}
}

// eventLoopsOf returns p's event loops with their states.
func eventLoopsOf(p *Proxy) map[*evloop.Loop]*loopState {
	p.mu.Lock()
	l := p.loops
	p.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.loops)
}

// stallLoop makes p's event loop (the test proxies have one) sleep for d,
// and returns once it has begun to.
func stallLoop(t *testing.T, p *Proxy, d time.Duration) {
	t.Helper()
	for el := range eventLoopsOf(p) {
		began := make(chan struct{})
		el.Execute(func() {
			close(began)
			time.Sleep(d)
		})
		<-began
	}
}
