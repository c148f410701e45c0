package proxy

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"
)

// holdRelay is a forwarder between the proxy and a real memcached that
// holds bytes back on command, to put a race in a set order: memcached's
// replies on every connection (holdReplies), or the requests of a
// connection from the first read of them that holds a given string on
// (holdRequests). What is held is passed on, in order, when released.
type holdRelay struct {
	addr string

	mu      sync.Mutex
	replies bool   // hold replies on every connection
	request []byte // hold a connection's requests from one holding this
	conns   []*relayConn
}

// relayConn is one connection through the relay: what it holds of each
// direction, and whether it holds that direction now.
type relayConn struct {
	toProxy, toServer         net.Conn
	replies, requests         []byte
	holdReplies, holdRequests bool
}

// startHoldRelay starts a relay to the memcached at target, passing
// everything on until told to hold. It stops when the test ends.
func startHoldRelay(t *testing.T, target string) *holdRelay {
	r := &holdRelay{}
	r.addr, _ = fakeUpstream(t, func(c net.Conn) {
		up, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		defer up.Close()
		rc := &relayConn{toProxy: c, toServer: up}
		r.mu.Lock()
		rc.holdReplies = r.replies
		r.conns = append(r.conns, rc)
		r.mu.Unlock()
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.pump(c, rc, false)
			up.Close()
		}()
		r.pump(up, rc, true)
		c.Close()
		<-done
	})
	return r
}

// pump passes what from reads on to the other side of rc, or holds it.
func (r *holdRelay) pump(from net.Conn, rc *relayConn, replies bool) {
	buf := make([]byte, 64<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			r.mu.Lock()
			var werr error
			switch {
			case replies && rc.holdReplies:
				rc.replies = append(rc.replies, buf[:n]...)
			case replies:
				_, werr = rc.toProxy.Write(buf[:n])
			case rc.holdRequests || r.request != nil && bytes.Contains(buf[:n], r.request):
				rc.holdRequests = true
				rc.requests = append(rc.requests, buf[:n]...)
			default:
				_, werr = rc.toServer.Write(buf[:n])
			}
			r.mu.Unlock()
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// holdReplies holds memcached's replies on every connection, and on those
// made later.
func (r *holdRelay) holdReplies() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.replies = true
	for _, rc := range r.conns {
		rc.holdReplies = true
	}
}

// holdRequests holds the requests of a connection from the first read of
// them that holds s.
func (r *holdRelay) holdRequests(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.request = []byte(s)
}

// waitHeld reports whether, within 5 s, a connection holds s in its
// replies (or its requests).
func (r *holdRelay) waitHeld(s string, requests bool) bool {
	return waitFor(5*time.Second, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, rc := range r.conns {
			held := rc.replies
			if requests {
				held = rc.requests
			}
			if bytes.Contains(held, []byte(s)) {
				return true
			}
		}
		return false
	})
}

// release passes on what the connections whose held replies or requests
// hold s (all of them, for "") held, and holds nothing more on them; with
// "", it holds nothing more on new ones either.
func (r *holdRelay) release(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s == "" {
		r.replies, r.request = false, nil
	}
	for _, rc := range r.conns {
		if s != "" && !bytes.Contains(rc.replies, []byte(s)) && !bytes.Contains(rc.requests, []byte(s)) {
			continue
		}
		rc.toServer.Write(rc.requests)
		rc.toProxy.Write(rc.replies)
		rc.requests, rc.replies = nil, nil
		rc.holdRequests, rc.holdReplies = false, false
	}
}
