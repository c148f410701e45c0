package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"mcsidecar/proxy/memcachedtest"
	"mcsidecar/proxy/upstream"

	"github.com/prometheus/client_golang/prometheus"
)

// memcachedBin is the memcached the tests run; the README's test command
// installs it.
func memcachedBin(tb testing.TB) string {
	tb.Helper()
	path, err := exec.LookPath("memcached")
	if err != nil {
		tb.Fatalf("memcached is not installed (the README's test command installs it): %v", err)
	}
	return path
}

// startMemcached runs a real memcached on a free loopback port for the
// test's lifetime and returns its address.
func startMemcached(tb testing.TB, extra ...string) string {
	tb.Helper()
	addr, _ := startKillableMemcached(tb, extra...)
	return addr
}

// startKillableMemcached is startMemcached that also returns a function
// that kills the server before the test ends.
func startKillableMemcached(tb testing.TB, extra ...string) (addr string, kill func()) {
	tb.Helper()
	for attempt := 0; attempt < 5; attempt++ {
		addr = "127.0.0.1:" + strconv.Itoa(freePort(tb))
		if kill, ok := runMemcached(tb, addr, extra...); ok {
			return addr, kill
		}
	}
	tb.Fatal("could not start memcached")
	return "", nil
}

// runMemcached starts memcached on addr (a loopback address) and waits
// until it listens. The server is killed when the test ends, or earlier by
// kill.
func runMemcached(tb testing.TB, addr string, extra ...string) (kill func(), ok bool) {
	tb.Helper()
	host, port := hostPort(addr)
	args := append([]string{"-l", host, "-p", port, "-U", "0", "-t", "2", "-m", "64", "-u", "nobody"}, extra...)
	cmd := exec.Command(memcachedBin(tb), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	memcachedtest.CloseInherited() // see there: a fuzz worker's pipes
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start memcached: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	var once sync.Once
	kill = func() {
		once.Do(func() {
			cmd.Process.Kill()
			<-exited
		})
	}
	if !waitListening(addr, exited) || !listenerIs(addr, cmd.Process.Pid, exited) {
		kill()
		tb.Logf("memcached on %s did not start (%s)", addr, stderr.String())
		return nil, false
	}
	tb.Cleanup(kill)
	return kill, true
}

// fakeLineUpstream is fakeUpstream for a server that answers line by
// line: serve gets each line the connection sends, with its CRLF, until it
// returns false or the client goes.
func fakeLineUpstream(tb testing.TB, serve func(c net.Conn, line string) bool) (addr string, stop func()) {
	tb.Helper()
	return fakeUpstream(tb, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil || !serve(c, line) {
				return
			}
		}
	})
}

// fakeUpstream serves every connection to a loopback listener with serve,
// for upstreams that misbehave in ways a real memcached will not. stop
// closes the listener and every connection and waits for serve to return;
// it also runs when the test ends.
func fakeUpstream(tb testing.TB, serve func(net.Conn)) (addr string, stop func()) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c)
			}()
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ln.Close()
			mu.Lock()
			for _, c := range conns {
				c.Close()
			}
			mu.Unlock()
			wg.Wait()
		})
	}
	tb.Cleanup(stop)
	return ln.Addr().String(), stop
}

func waitListening(addr string, exited <-chan struct{}) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return false
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// listenerIs reports whether the server listening on addr is memcached
// process pid. Tests of other packages start memcached on free ports at
// the same time: one that lost the race for a port exits, but another's
// server may answer on it first, and die with that test. memcached's own
// stats name its pid; a server that answers no plain stats (TLS) counts
// as pid if pid is still running a moment later.
func listenerIs(addr string, pid int, exited <-chan struct{}) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		if _, err = c.Write([]byte("stats\r\n")); err == nil {
			sc := bufio.NewScanner(c)
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), "STAT pid "); ok {
					return v == strconv.Itoa(pid)
				}
				if sc.Text() == "END" {
					break
				}
			}
		}
	}
	select {
	case <-exited:
		return false
	case <-time.After(50 * time.Millisecond):
		return true
	}
}

func freePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// testConfig is the default configuration pointed at upstreams.
func testConfig(upstreams ...string) Config {
	return Config{
		Listen:           "127.0.0.1:0",
		Upstreams:        upstreams,
		Selector:         upstream.SelectJump,
		Timeout:          time.Second,
		ConnectTimeout:   time.Second,
		MaxIdleConns:     100,
		GetBatchKeys:     100,
		RetrievalFailure: failureMiss,
		MaxItemSize:      1 << 20,
		MaxRequestLine:   1 << 20,
	}
}

// startProxy serves cfg on a free loopback port until the test ends and
// returns the proxy and its address.
func startProxy(tb testing.TB, cfg Config) (*Proxy, string) {
	tb.Helper()
	p, addr, _ := serveProxy(tb, cfg)
	return p, addr
}

// serveProxy builds a proxy with New and serves it on a free loopback port.
// Unlike startProxy it leaves Shutdown to the test; its cleanup calls
// Shutdown once more, which must be harmless, and checks that Serve
// returned nil. The returned channel yields Serve's result.
func serveProxy(tb testing.TB, cfg Config) (*Proxy, string, <-chan error) {
	tb.Helper()
	return serveProxyLog(tb, cfg, nil)
}

// serveProxyLog is serveProxy with the proxy logging to log.
func serveProxyLog(tb testing.TB, cfg Config, log *slog.Logger) (*Proxy, string, <-chan error) {
	tb.Helper()
	if loopMoveAlways.Load() && cfg.EventLoops >= 0 && cfg.EventLoops < 2 {
		cfg.EventLoops = 2
	}
	p, err := New(cfg, "mcsidecar-test", log)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	served := make(chan error, 1)
	go func() {
		// Closed after the one result, so the test and the cleanup may
		// both wait on it; the test sees the result, the cleanup nil.
		served <- p.Serve(ln)
		close(served)
	}()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			tb.Errorf("cleanup shutdown: %v", err)
		}
		select {
		case err := <-served:
			if err != nil {
				tb.Errorf("serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			tb.Errorf("Serve still running after Shutdown")
		}
	})
	return p, ln.Addr().String(), served
}

// exchange sends each chunk of req to addr (pausing between chunks so they
// arrive as separate reads, and long enough that a loaded machine has
// answered one chunk before the next: memcached drops replies it has not
// sent yet when a later command in the same read closes the connection),
// half-closes, and returns everything the server wrote until it closed.
func exchange(tb testing.TB, addr string, chunks ...string) string {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(c)
		got <- b
	}()
	for i, chunk := range chunks {
		if i > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		if _, err := io.WriteString(c, chunk); err != nil {
			break // the server may close first, as after a framing error
		}
	}
	c.(*net.TCPConn).CloseWrite()
	return string(<-got)
}

// dial connects to addr for the length of the test.
func dial(tb testing.TB, addr string) net.Conn {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

func requireMemccapable(tb testing.TB) string {
	tb.Helper()
	path, err := exec.LookPath("memccapable")
	if err != nil {
		tb.Fatalf("memccapable is not installed (libmemcached-tools; the README's test command installs it): %v", err)
	}
	return path
}

func hostPort(addr string) (string, string) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		panic(fmt.Sprint(addr, err))
	}
	return h, p
}

// registry returns a registry holding p's metrics, for tests that read them.
func registry(tb testing.TB, p *Proxy) *prometheus.Registry {
	tb.Helper()
	reg := prometheus.NewRegistry()
	if err := p.Register(reg); err != nil {
		tb.Fatal(err)
	}
	return reg
}

// setBig stores a value of size bytes under the key "big" through the
// proxy at addr, and returns memcached's reply to a get of it.
func setBig(tb testing.TB, addr string, size int) string {
	tb.Helper()
	value := strings.Repeat("v", size)
	c := newLineClient(tb, addr)
	defer c.c.Close()
	if got := c.do("set big 0 0 " + strconv.Itoa(size) + "\r\n" + value + "\r\n"); got != "STORED\r\n" {
		tb.Fatalf("set answered %q", got)
	}
	return "VALUE big 0 " + strconv.Itoa(size) + "\r\n" + value + "\r\nEND\r\n"
}
