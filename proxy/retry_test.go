package proxy

import (
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// cutForwarder relays every connection the proxy makes to a real
// memcached. Armed, it lets the next request bytes the proxy sends
// through, waits for memcached's answer to them (memcached has applied
// them by then), and closes the proxy's connection instead of relaying
// that answer: a connection lost after the server did the work, before
// the proxy read a byte of the reply.
type cutForwarder struct {
	addr, memcached string
	armed           atomic.Bool
	// cuts says, for every cut made, whether the connection had carried
	// a request before the one cut: whether the proxy reused it.
	cuts chan bool
}

func newCutForwarder(tb testing.TB, memcached string) *cutForwarder {
	tb.Helper()
	f := &cutForwarder{memcached: memcached, cuts: make(chan bool, 16)}
	f.addr, _ = fakeUpstream(tb, f.relay)
	return f
}

// arm cuts the next request any connection carries.
func (f *cutForwarder) arm() { f.armed.Store(true) }

// relay carries one connection of the proxy's to memcached and back.
func (f *cutForwarder) relay(pc net.Conn) {
	mc, err := net.DialTimeout("tcp", f.memcached, 2*time.Second)
	if err != nil {
		return
	}
	defer mc.Close()
	var cut atomic.Bool
	var reused bool // written before cut is set, read after
	go func() {
		defer mc.Close()
		buf := make([]byte, 64<<10)
		carried := false
		for {
			n, err := pc.Read(buf)
			if err != nil {
				return
			}
			if f.armed.CompareAndSwap(true, false) {
				reused = carried
				cut.Store(true)
			}
			carried = true
			if _, err := mc.Write(buf[:n]); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := mc.Read(buf)
		if err != nil {
			return
		}
		if cut.Load() {
			// memcached answered the request cut: it was applied.
			f.cuts <- reused
			return // the deferred closes cut both sides
		}
		if _, err := pc.Write(buf[:n]); err != nil {
			return
		}
	}
}

// TestALostReplyIsNotAppliedTwice: when the pooled connection a request
// goes out on is lost after memcached applied the request, before any
// byte of its reply came back, the proxy must not send the request again.
// An incr, an append, an add or a delete applied twice moves a counter by
// twice its delta, doubles a suffix, or answers the client NOT_STORED or
// NOT_FOUND about its own write. The client may be told the request
// failed (memcached may or may not have applied it, as far as the proxy
// knows) or, had the proxy its reply, what memcached answered; never a
// reply that shows a second application. A get, which is safe to repeat,
// is not repeated either: the event loop fails what was in flight on a
// lost connection, so the get may miss.
func TestALostReplyIsNotAppliedTwice(t *testing.T) {
	if loopMoveAlways.Load() {
		t.Skip("the request cut must go on the connection the warm-up opened")
	}
	mc := startMemcached(t)
	f := newCutForwarder(t, mc)
	direct := newLineClient(t, mc)
	failed := func(reply string) bool { return strings.HasPrefix(reply, "SERVER_ERROR ") }
	cases := []struct {
		name     string
		warm     string // the request before, when not a get
		before   string // on memcached itself, first
		req      string
		want     string // the reply of a request applied once
		stored   string // what memcached must hold after, as a get answers it
		repeated bool   // safe to repeat: answers want, or a miss
	}{
		{name: "incr", before: "set {k} 0 0 4\r\n1000\r\n", req: "incr {k} 1\r\n", want: "1001\r\n", stored: "VALUE {k} 0 4\r\n1001\r\nEND\r\n"},
		{name: "append", before: "set {k} 0 0 1\r\na\r\n", req: "append {k} 0 0 1\r\nb\r\n", want: "STORED\r\n", stored: "VALUE {k} 0 2\r\nab\r\nEND\r\n"},
		{name: "add", req: "add {k} 0 0 1\r\nv\r\n", want: "STORED\r\n", stored: "VALUE {k} 0 1\r\nv\r\nEND\r\n"},
		{name: "delete", before: "set {k} 0 0 1\r\nv\r\n", req: "delete {k}\r\n", want: "DELETED\r\n", stored: "END\r\n"},
		{name: "get", before: "set {k} 0 0 1\r\nv\r\n", req: "get {k}\r\n", want: "VALUE {k} 0 1\r\nv\r\nEND\r\n", stored: "VALUE {k} 0 1\r\nv\r\nEND\r\n", repeated: true},
		// gat goes out apart from other clients' gets, and is read as
		// the reply of a request over several servers is.
		{name: "gat", warm: "gat 0 warm\r\n", before: "set {k} 0 0 1\r\nv\r\n", req: "gat 0 {k}\r\n", want: "VALUE {k} 0 1\r\nv\r\nEND\r\n", stored: "VALUE {k} 0 1\r\nv\r\nEND\r\n", repeated: true},
	}
	for _, loops := range []int{1, 2} {
		t.Run(fmt.Sprintf("EventLoops=%d", loops), func(t *testing.T) {
			cfg := testConfig(f.addr)
			cfg.EventLoops = loops
			_, addr := startProxy(t, cfg)
			lc := newLineClient(t, addr)
			for _, tc := range cases {
				k := fmt.Sprintf("cut:%d:%s", loops, tc.name)
				with := func(s string) string { return strings.ReplaceAll(s, "{k}", k) }
				if tc.before != "" {
					direct.do(with(tc.before))
				}
				// A request that goes through first, so that the
				// one cut goes out on a connection the proxy reuses.
				warm := "get warm\r\n"
				if tc.warm != "" {
					warm = tc.warm
				}
				if got := lc.do(warm); got != "END\r\n" {
					t.Fatalf("%s: the request before answered %q", tc.name, got)
				}
				f.arm()
				got := lc.do(with(tc.req))
				select {
				case reused := <-f.cuts:
					if !reused {
						t.Fatalf("%s: the connection cut was a new one", tc.name)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("%s: no connection was cut (answered %q)", tc.name, got)
				}
				want := with(tc.want)
				switch {
				case tc.repeated:
					if got != want && got != "END\r\n" {
						t.Errorf("%s: answered %q, want %q or a miss", tc.name, got, want)
					}
				case got != want && !failed(got):
					t.Errorf("%s applied once: answered %q, want %q or SERVER_ERROR", tc.name, got, want)
				}
				if held := direct.do(with("get {k}\r\n")); held != with(tc.stored) {
					t.Errorf("%s: memcached holds %q after it, want %q", tc.name, held, with(tc.stored))
				}
				t.Logf("%s: answered %q", tc.name, got)
			}
		})
	}
}
