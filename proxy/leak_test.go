package proxy

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package when any test leaves a goroutine behind once
// its cleanups have run: a connection the proxy never let go, an upstream
// call that never returned, a memcached whose waiter still runs. No
// goroutine is ignored: everything the tests start (proxies, memcached
// processes, fake upstreams, client readers) is stopped by a cleanup.
//
// MCSIDECAR_MOVE_ALWAYS=1 runs every test with two loops or more and moves
// each client to the next loop whenever it has nothing owed (see
// loopMoveAlways), so that every path runs across moves.
func TestMain(m *testing.M) {
	if os.Getenv("MCSIDECAR_MOVE_ALWAYS") != "" {
		loopMoveAlways.Store(true)
	}
	goleak.VerifyTestMain(m)
}

// TestMisbehavingClientsLeaveNoConnectionBehind has 50 clients send binary
// garbage, start commands they never finish and vanish mid-request, some
// with a reset. Afterwards the proxy holds no more connections than before
// and still answers correctly.
func TestMisbehavingClientsLeaveNoConnectionBehind(t *testing.T) {
	_, addr := startProxy(t, testConfig(startMemcached(t)))
	probe := newLineClient(t, addr)
	baseline := probe.stat("curr_connections") // the probe itself
	total := probe.stat("total_connections")

	rng := rand.New(rand.NewChaCha8([32]byte{'m', 'c', 's', 'i', 'd', 'e', 'c', 'a', 'r'}))
	garbage := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		return b
	}
	type client struct {
		name  string
		send  []byte
		reset bool // close with SO_LINGER 0, so the proxy sees a reset
	}
	var clients []client
	for i := range 50 {
		var c client
		switch i % 10 {
		case 0:
			c = client{name: "binary garbage", send: garbage(64 + rng.IntN(4096))}
		case 1:
			c = client{name: "binary garbage then reset", send: garbage(64 + rng.IntN(4096)), reset: true}
		case 2:
			c = client{name: "set cut off in its data block", send: []byte("set k 0 0 100\r\nabc")}
		case 3:
			c = client{name: "set cut off in its data block then reset", send: []byte("set k 0 0 100\r\nabc"), reset: true}
		case 4:
			c = client{name: "get line cut off", send: []byte("get a b c")}
		case 5:
			c = client{name: "storage line cut off", send: []byte("set k 0 0")}
		case 6:
			c = client{name: "large value cut off", send: []byte("set big 0 0 500000\r\n" + strings.Repeat("x", 70000))}
		case 7:
			c = client{name: "binary-protocol get", send: []byte("\x80\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00k")}
		case 8:
			c = client{name: "pipelined gets, replies never read", send: []byte(strings.Repeat("get k a b c\r\n", 500)), reset: true}
		case 9:
			c = client{name: "connects and says nothing"}
		}
		clients = append(clients, c)
	}

	var wg sync.WaitGroup
	errs := make(chan error, len(clients))
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				errs <- fmt.Errorf("client %d (%s): %v", i, c.name, err)
				return
			}
			nc.SetDeadline(time.Now().Add(5 * time.Second))
			// The proxy may hang up first (framing errors); that is fine.
			nc.Write(c.send)
			if c.reset {
				nc.(*net.TCPConn).SetLinger(0)
			}
			nc.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// First every client must have been accepted, or the count below could
	// read the baseline before the proxy saw them at all.
	deadline := time.Now().Add(5 * time.Second)
	for probe.stat("total_connections") < total+uint64(len(clients)) {
		if time.Now().After(deadline) {
			t.Fatalf("total_connections = %d 5s after the clients left, want at least %d", probe.stat("total_connections"), total+uint64(len(clients)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	for {
		curr := probe.stat("curr_connections")
		if curr == baseline {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("curr_connections = %d 5s after the clients left, want %d", curr, baseline)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := probe.stat("total_connections"); got < total+uint64(len(clients)) {
		t.Errorf("total_connections went from %d to %d, want at least %d more", total, got, len(clients))
	}

	for _, c := range []*lineClient{probe, newLineClient(t, addr)} {
		if got := c.do("set after 3 0 2\r\nok\r\nget after\r\n"); got != "STORED\r\n" {
			t.Fatalf("set after the clients left answered %q", got)
		}
		got, err := readReply(c.br)
		if want := "VALUE after 3 2\r\nok\r\nEND\r\n"; err != nil || got != want {
			t.Fatalf("get after the clients left answered %q (%v), want %q", got, err, want)
		}
	}
	if got := exchange(t, addr, "version\r\n"); got != "VERSION mcsidecar-test\r\n" {
		t.Errorf("version on a new connection answered %q", got)
	}
}
