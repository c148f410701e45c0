package proxy

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/upstream"
)

// TestRefusedCommandDoesNotDisturbOtherClients: requests of many clients
// share the upstream connection. Commands memcached refuses with
// CLIENT_ERROR (incr of a value that is not a number), noreply commands
// whose answers are dropped, and misses run beside clients that
// check every reply; none of them may see another client's answer, and the
// shared connection must keep working.
// SPEC: "one client's bad request never costs another client anything".
func TestRefusedCommandDoesNotDisturbOtherClients(t *testing.T) {
	cfg := testConfig(startMemcached(t))
	p, addr := startProxy(t, cfg)
	setup := newLineClient(t, addr)
	if r := setup.do("set text 0 0 5\r\nhello\r\n"); r != "STORED\r\n" {
		t.Fatalf("set: %q", r)
	}
	const rounds = 300
	var wrong atomic.Int64
	var wg sync.WaitGroup
	report := func(format string, args ...any) {
		if wrong.Add(1) <= 5 {
			t.Errorf(format, args...)
		}
	}
	for range 2 { // clients whose commands memcached refuses
		wg.Go(func() {
			lc := newLineClient(t, addr)
			for range rounds {
				if r := lc.do("incr text 1\r\n"); r != string(wire.LineNonNumeric) {
					report("incr of text: %q", r)
				}
				if r := lc.do("decr missing 1\r\n"); r != "NOT_FOUND\r\n" {
					report("decr of a missing key: %q", r)
				}
			}
		})
	}
	for range 2 { // clients that send noreply commands: nothing comes back
		wg.Go(func() {
			lc := newLineClient(t, addr)
			for i := range rounds {
				// The get after the noreply commands must be the first
				// thing answered.
				r := lc.do("set nr 0 0 1 noreply\r\nx\r\nadd nr 0 0 1 noreply\r\ny\r\ndelete gone noreply\r\nget nr\r\n")
				if r != "VALUE nr 0 1\r\nx\r\nEND\r\n" {
					report("noreply round %d: %q", i, r)
				}
			}
		})
	}
	for c := range 4 { // clients that check every answer
		wg.Go(func() {
			lc := newLineClient(t, addr)
			for i := range rounds {
				key := fmt.Sprintf("k%d", c)
				val := strconv.Itoa(i)
				if r := lc.do(fmt.Sprintf("set %s %d 0 %d\r\n%s\r\n", key, i, len(val), val)); r != "STORED\r\n" {
					report("set: %q", r)
				}
				want := fmt.Sprintf("VALUE %s %d %d\r\n%s\r\nEND\r\n", key, i, len(val), val)
				if r := lc.do("get " + key + "\r\n"); r != want {
					report("get %s: %q, want %q", key, r, want)
				}
				if r := lc.do("incr " + key + " 1\r\n"); r != strconv.Itoa(i+1)+"\r\n" {
					report("incr %s: %q", key, r)
				}
				if r := lc.do("touch " + key + " 0\r\n"); r != "TOUCHED\r\n" {
					report("touch %s: %q", key, r)
				}
			}
		})
	}
	wg.Wait()
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d wrong answers", n)
	}
	st := p.upstreams().Servers[0]
	// Upstream requests: 2 per round of the refused, 4 of the noreply
	// and 4 of the checking clients.
	requests := uint64(2*rounds*2 + 2*rounds*4 + 4*rounds*4)
	if n := st.Requests(); n == 0 || n >= requests {
		t.Errorf("%d upstream batches for %d requests: want fewer batches than requests, more than none", n, requests)
	}
	for k := range upstream.NumKinds {
		if n := st.Errors(k); n != 0 {
			t.Errorf("%d upstream errors of kind %q", n, k.String())
		}
	}
}

// TestStalledServerTimesOutItsQueue: requests queued behind a batch on a
// server that stopped answering end within about one upstream timeout of
// when they were sent, with memcached's SERVER_ERROR for a storage command
// and a miss for a get.
func TestStalledServerTimesOutItsQueue(t *testing.T) {
	addr, stop := fakeUpstream(t, func(c net.Conn) {
		// Read everything, answer nothing.
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	})
	defer stop()
	cfg := testConfig(addr)
	cfg.Timeout = 200 * time.Millisecond
	cfg.FailureLimit = 0
	_, via := startProxy(t, cfg)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			lc := newLineClient(t, via)
			began := time.Now()
			var r, want string
			if i%2 == 0 {
				r, want = lc.do("set a 0 0 1\r\nx\r\n"), string(wire.LineUpstreamSlow)
			} else {
				r, want = lc.do("get a\r\n"), "END\r\n"
			}
			if took := time.Since(began); took > 3*cfg.Timeout {
				t.Errorf("request %d took %v, upstream timeout %v", i, took, cfg.Timeout)
			}
			if r != want {
				t.Errorf("request %d: %q, want %q", i, r, want)
			}
		})
	}
	wg.Wait()
}

// BenchmarkPipelinedSet measures what the proxy allocates and spends per
// set when many clients' sets share the pipelined upstream connection:
// the value is sent from the client's read buffer, the reply line relayed.
func BenchmarkPipelinedSet(b *testing.B) {
	_, addr := startProxy(b, testConfig(startMemcached(b)))
	req := []byte("set bench 0 0 100\r\n" + strings.Repeat("v", 100) + "\r\n")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		rc := newRawClient(b, addr)
		for pb.Next() {
			if err := rc.roundTrip(req, "STORED"); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
