package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// gatedUpstream is a fake memcached that holds every get until release is
// called, then answers each key with the value "value-of-<key>". It
// reports each get line it receives on the returned channel.
func gatedUpstream(tb testing.TB) (addr string, received <-chan string, release func()) {
	tb.Helper()
	lines := make(chan string, 64)
	gate := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	addr, _ = fakeUpstream(tb, func(c net.Conn) { serveGated(c, lines, gate) })
	tb.Cleanup(release) // runs before fakeUpstream's stop, which waits for serveGated
	return addr, lines, release
}

func serveGated(c net.Conn, lines chan<- string, gate <-chan struct{}) {
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		words := strings.Fields(line)
		if len(words) < 2 || words[0] != "get" && words[0] != "gets" {
			io.WriteString(c, "ERROR\r\n")
			continue
		}
		select {
		case lines <- line:
		default:
		}
		<-gate
		var reply strings.Builder
		for _, k := range words[1:] {
			v := "value-of-" + k
			reply.WriteString("VALUE " + k + " 0 " + itoa(len(v)) + " 1\r\n" + v + "\r\n")
		}
		reply.WriteString("END\r\n")
		if _, err := io.WriteString(c, reply.String()); err != nil {
			return
		}
	}
}

// shutdownAsync runs Shutdown on its own goroutine and reports its result.
func shutdownAsync(ctx context.Context, p *Proxy) <-chan error {
	done := make(chan error, 1)
	go func() { done <- p.Shutdown(ctx) }()
	return done
}

// readUntilClosed reads what the server sends until it closes the
// connection (an EOF or a reset) or wait passes, and reports whether it
// closed.
func readUntilClosed(c net.Conn, wait time.Duration) (string, bool) {
	c.SetReadDeadline(time.Now().Add(wait))
	b, err := io.ReadAll(c)
	return string(b), !errors.Is(err, os.ErrDeadlineExceeded)
}

// TestShutdownLetsARequestInFlightFinish starts Shutdown while a get waits
// on its upstream. Shutdown must wait for it: the client receives its
// whole reply, including the reply to the request pipelined behind it,
// and only then is the connection closed. Shutdown then returns nil.
func TestShutdownLetsARequestInFlightFinish(t *testing.T) {
	up, received, release := gatedUpstream(t)
	cfg := testConfig(up)
	cfg.Timeout = 5 * time.Second
	p, addr, served := serveProxy(t, cfg)
	c := dial(t, addr)
	if _, err := io.WriteString(c, "get k\r\nget k2\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-received:
	case <-time.After(2 * time.Second):
		t.Fatal("the get never reached the upstream")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	shut := shutdownAsync(ctx, p)
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) while a request was in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	// New clients are refused while the proxy drains.
	if nc, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		nc.Close()
		t.Error("a new connection was accepted during Shutdown")
	}

	release()
	got, closed := readUntilClosed(c, 2*time.Second)
	want := "VALUE k 0 10\r\nvalue-of-k\r\nEND\r\n" + "VALUE k2 0 11\r\nvalue-of-k2\r\nEND\r\n"
	if got != want {
		t.Errorf("client received %q, want %q", got, want)
	}
	if !closed {
		t.Error("connection still open 2s after its requests were answered")
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Errorf("Shutdown: %v, want nil", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Shutdown still running 2s after the last request finished")
	}
	waitServed(t, served)
}

// TestShutdownClosesIdleConnectionsAndRefusesNewOnes shuts down a proxy
// whose clients are connected but idle: each is closed promptly, new
// connections are refused, and Shutdown returns nil long before its
// deadline.
func TestShutdownClosesIdleConnectionsAndRefusesNewOnes(t *testing.T) {
	p, addr, served := serveProxy(t, testConfig(startMemcached(t)))
	var clients []*lineClient
	for range 3 {
		c := newLineClient(t, addr)
		if got := c.do("set k 0 0 1\r\nv\r\n"); got != "STORED\r\n" {
			t.Fatalf("set answered %q", got)
		}
		clients = append(clients, c)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	err := p.Shutdown(ctx)
	took := time.Since(start)
	if err != nil {
		t.Errorf("Shutdown: %v, want nil", err)
	}
	if took > 2*time.Second {
		t.Errorf("Shutdown of idle connections took %v, want well under its 5s deadline", took)
	}
	for i, c := range clients {
		if got, closed := readUntilClosed(c.c, time.Second); !closed || got != "" {
			t.Errorf("idle client %d: closed %v, received %q", i, closed, got)
		}
	}
	if nc, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		nc.Close()
		t.Error("a new connection was accepted after Shutdown")
	}
	waitServed(t, served)
}

// TestShutdownAgainIsHarmless calls Shutdown a second time, as a deferred
// cleanup would: it returns nil at once.
func TestShutdownAgainIsHarmless(t *testing.T) {
	p, addr, _ := serveProxy(t, testConfig(startMemcached(t)))
	c := newLineClient(t, addr)
	if got := c.do("version\r\n"); got != "VERSION mcsidecar-test\r\n" {
		t.Fatalf("version answered %q", got)
	}
	for i := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		err := p.Shutdown(ctx)
		cancel()
		if err != nil {
			t.Errorf("Shutdown #%d: %v", i+1, err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("Shutdown #%d took %v", i+1, took)
		}
	}
}

// TestShutdownGraceRunsOut starts Shutdown with a short grace period while
// a get is stuck on an upstream that never answers. When the grace period
// ends, the connection is closed and Shutdown returns the context's error.
// Shutdown returns only once the stuck get has given up (after the 1s
// upstream timeout), so its bound here is generous; how soon it should
// return is TestShutdownReturnsSoonAfterGraceRunsOut's concern.
func TestShutdownGraceRunsOut(t *testing.T) {
	up, received := stuckUpstream(t)
	cfg := testConfig(up)
	// The upstream timeout outlasts the grace period, so the request is
	// still stuck when the grace period ends.
	cfg.Timeout = time.Second
	p, addr, _ := serveProxy(t, cfg)
	c := dial(t, addr)
	if _, err := io.WriteString(c, "get k\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-received:
	case <-time.After(2 * time.Second):
		t.Fatal("the get never reached the upstream")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	shut := shutdownAsync(ctx, p)
	got, closed := readUntilClosed(c, 2*time.Second)
	if !closed {
		t.Errorf("connection still open %v after Shutdown began with a 200ms grace period", time.Since(start))
	}
	if got != "" {
		t.Errorf("client received %q from a request cut off by Shutdown", got)
	}
	select {
	case err := <-shut:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Shutdown: %v, want %v", err, context.DeadlineExceeded)
		}
		t.Logf("Shutdown returned after %v (grace 200ms, upstream timeout %v)", time.Since(start), cfg.Timeout)
	case <-time.After(3 * time.Second):
		t.Fatal("Shutdown still running 3s after its 200ms grace period")
	}
}

// TestShutdownReturnsSoonAfterGraceRunsOut starts Shutdown with a short
// grace period while a get is held open by an upstream whose reply takes
// far longer than that. The connection is closed when the grace period ends, and
// Shutdown must return then too rather than wait for the upstream.
func TestShutdownReturnsSoonAfterGraceRunsOut(t *testing.T) {
	up, stop := tricklingUpstream(t)
	cfg := testConfig(up)
	// The whole-request upstream timeout outlasts the grace period, so the
	// get is still in flight when the grace period ends.
	cfg.Timeout = 2 * time.Second
	p, addr, _ := serveProxy(t, cfg)
	t.Cleanup(stop) // runs before serveProxy's Shutdown, which waits for the get
	c := dial(t, addr)
	if _, err := io.WriteString(c, "get k\r\n"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the get is now in flight upstream

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	shut := shutdownAsync(ctx, p)
	if _, closed := readUntilClosed(c, 2*time.Second); !closed {
		t.Errorf("connection still open %v after Shutdown began with a 200ms grace period", time.Since(start))
	}
	select {
	case err := <-shut:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Shutdown: %v, want %v", err, context.DeadlineExceeded)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("Shutdown still running %v after Shutdown began with a 200ms grace period", time.Since(start).Round(time.Millisecond))
	}
}

// waitServed checks that Serve returned nil soon after Shutdown.
func waitServed(t *testing.T, served <-chan error) {
	t.Helper()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v, want nil", err)
		}
	case <-time.After(2 * time.Second):
		t.Error("Serve still running after Shutdown")
	}
}

// TestDrainAnswersRequestsAlreadyRead pipelines gets of a large value
// over a small receive window and starts a shutdown while most replies are
// still owed. The event loop reads the requests early, while it holds
// replies back, and must answer every one before it closes the
// connection: to a client that reads at once, and to one that reads a
// reply every 15 ms, whose replies evloop holds when it has none left to
// make.
func TestDrainAnswersRequestsAlreadyRead(t *testing.T) {
	for _, tc := range []struct {
		name  string
		size  int
		gets  int
		pause time.Duration
	}{
		{"reads at once", 16 << 10, 1000, 0},
		{"slow reader", 64 << 10, 60, 15 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, addr, _ := serveProxy(t, testConfig(startMemcached(t)))
			want := setBig(t, addr, tc.size)
			c := dialSmallWindow(t, addr)
			c.SetDeadline(time.Now().Add(15 * time.Second))
			if _, err := io.WriteString(c, strings.Repeat("get big\r\n", tc.gets)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- p.Shutdown(ctx) }()
			br := bufio.NewReader(c)
			for i := range tc.gets {
				time.Sleep(tc.pause)
				got := make([]byte, len(want))
				if _, err := io.ReadFull(br, got); err != nil || string(got) != want {
					t.Fatalf("reply %d of %d: %.60q (%v)", i, tc.gets, got, err)
				}
			}
			if err := <-done; err != nil {
				t.Errorf("shutdown: %v", err)
			}
		})
	}
}

// TestDrainLetsAValueInFlightArrive starts a shutdown while a set's value
// is arriving, short and long (a long one is gathered in a buffer of its
// own), and sends the rest in two parts with a pause between: the request
// is in flight, so the rest of the value is read, the set answered and
// stored, and only then is the connection closed.
func TestDrainLetsAValueInFlightArrive(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int
	}{
		{"short", 1000},
		{"long", 300 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mc := startMemcached(t)
			p, addr, _ := serveProxy(t, testConfig(mc))
			c := dial(t, addr)
			value := strings.Repeat("d", tc.size)
			head := "set drain 0 0 " + itoa(tc.size) + "\r\n"
			cut := len(head) + tc.size*3/4 // past half: the loop gathers a long one apart
			req := head + value + "\r\n"
			if _, err := io.WriteString(c, req[:cut]); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // the proxy reads what came

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			shut := shutdownAsync(ctx, p)
			// Longer than the drain takes to close a connection that
			// waits for a request (a few ms).
			time.Sleep(150 * time.Millisecond)
			// More of it, then a pause before the rest.
			more := cut + (len(req)-cut)/2
			if _, err := io.WriteString(c, req[cut:more]); err != nil {
				t.Fatalf("more of the value: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
			if _, err := io.WriteString(c, req[more:]); err != nil {
				t.Fatalf("the rest of the value: %v", err)
			}
			got, closed := readUntilClosed(c, 5*time.Second)
			if got != "STORED\r\n" || !closed {
				t.Errorf("after the rest of the value the client read %q, closed %v; want STORED and a close", got, closed)
			}
			if err := <-shut; err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			want := "VALUE drain 0 " + itoa(tc.size) + "\r\n" + value + "\r\nEND\r\n"
			direct := newLineClient(t, mc)
			defer direct.c.Close()
			if got := direct.do("get drain\r\n"); got != want {
				t.Errorf("memcached holds %.60q, want %.60q", got, want)
			}
		})
	}
}
