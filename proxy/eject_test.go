package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"mcsidecar/proxy/upstream"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// logLines records the messages a proxy logs, so that a test can count
// the lines of each kind.
type logLines struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logLines) logger() *slog.Logger { return slog.New(l) }

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }

func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}

func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }

// count returns how many lines had msg as their message.
func (l *logLines) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

// stuckUntilReleased is an upstream that accepts connections and never
// answers until release; every connection accepted after release is
// relayed to the memcached at target, so the same address "comes back".
// lines receives every line sent to it while stuck.
func stuckUntilReleased(tb testing.TB, target string) (addr string, lines <-chan string, release func()) {
	tb.Helper()
	var released atomic.Bool
	ch := make(chan string, 1024)
	addr, _ = fakeUpstream(tb, func(c net.Conn) {
		if released.Load() {
			up, err := net.Dial("tcp", target)
			if err != nil {
				return
			}
			go func() {
				io.Copy(up, c) // ends when c is closed
				up.Close()
			}()
			io.Copy(c, up)
			return
		}
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			select {
			case ch <- line:
			default:
			}
		}
	})
	return addr, ch, func() { released.Store(true) }
}

// waitFor polls cond until it holds or bound passes.
func waitFor(bound time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cond()
}

// healthExposition is the two per-server health families for one server.
func healthExposition(server string, up, ejections int) string {
	return fmt.Sprintf(`# HELP mcsidecar_upstream_ejections_total Times an upstream server was ejected.
# TYPE mcsidecar_upstream_ejections_total counter
mcsidecar_upstream_ejections_total{server=%q} %d
# HELP mcsidecar_upstream_server_up Whether an upstream server is in use: 1, or 0 while it is ejected after --upstream-failure-limit consecutive failures.
# TYPE mcsidecar_upstream_server_up gauge
mcsidecar_upstream_server_up{server=%q} %d
`, server, ejections, server, up)
}

// TestStuckUpstreamIsEjectedThenProbedBack points the proxy at a server
// that accepts connections and never answers. Each of the first
// --upstream-failure-limit requests ends at the upstream timeout; then the
// server is ejected, and requests answer at once without reaching it
// (only the prober's version does). When the server starts answering, the
// prober puts it back and requests work again. Each state change is
// logged once, and the metrics follow it.
func TestStuckUpstreamIsEjectedThenProbedBack(t *testing.T) {
	const down = "SERVER_ERROR upstream unavailable\r\n"
	up, lines, release := stuckUntilReleased(t, startMemcached(t))
	cfg := testConfig(up)
	cfg.Timeout = 200 * time.Millisecond
	cfg.ConnectTimeout = 100 * time.Millisecond
	cfg.FailureLimit = 3
	cfg.RetryInterval = 100 * time.Millisecond
	logs := &logLines{}
	p, addr, _ := serveProxyLog(t, cfg, logs.logger())
	reg := registry(t, p)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(healthExposition(up, 1, 0)),
		"mcsidecar_upstream_server_up", "mcsidecar_upstream_ejections_total"); err != nil {
		t.Errorf("before any request: %v", err)
	}
	srv := p.upstreams().Servers[0]
	c := newLineClient(t, addr)

	// Generous: the point is that each request ends, not how close to the
	// timeout it ends.
	const slack = 2 * time.Second
	for i := range cfg.FailureLimit {
		if srv.Ejected() {
			t.Fatalf("ejected after %d failures, want %d", i, cfg.FailureLimit)
		}
		start := time.Now()
		if got := c.do("get k\r\n"); got != "END\r\n" {
			t.Errorf("get from a stuck server answered %q, want a miss", got)
		}
		if took := time.Since(start); took > cfg.Timeout+slack {
			t.Errorf("get %d took %v with a %v upstream timeout", i, took, cfg.Timeout)
		}
	}
	if !srv.Ejected() {
		t.Fatalf("not ejected after %d timeouts", cfg.FailureLimit)
	}

	// Ejected: nothing but the prober's version reaches the server, and 30
	// requests together take less than one upstream timeout.
	for len(lines) > 0 {
		<-lines
	}
	start := time.Now()
	for range 10 {
		for _, req := range []struct{ req, want string }{
			{"get k\r\n", "END\r\n"},
			{"set k 0 0 1\r\nv\r\n", down},
			{"delete k\r\n", down},
		} {
			if got := c.do(req.req); got != req.want {
				t.Errorf("%q to an ejected server answered %q, want %q", req.req, got, req.want)
			}
		}
	}
	if took := time.Since(start); took >= cfg.Timeout {
		t.Errorf("30 requests to an ejected server took %v, more than one upstream timeout (%v)", took, cfg.Timeout)
	}
	for len(lines) > 0 {
		if line := <-lines; line != "version\r\n" {
			t.Errorf("an ejected server was sent %q", line)
		}
	}
	if err := p.Ready(context.Background()); err == nil {
		t.Error("ready with the only server ejected")
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(healthExposition(up, 0, 1)),
		"mcsidecar_upstream_server_up", "mcsidecar_upstream_ejections_total"); err != nil {
		t.Errorf("while ejected: %v", err)
	}

	// The server answers again: the prober puts it back by itself.
	release()
	if !waitFor(5*time.Second, func() bool { return !srv.Ejected() }) {
		t.Fatal("the server answers again but is still ejected after 5s")
	}
	if got := c.do("set k 0 0 5\r\nhello\r\n"); got != "STORED\r\n" {
		t.Errorf("set after the server came back answered %q", got)
	}
	if got := c.do("get k\r\n"); got != "VALUE k 0 5\r\nhello\r\nEND\r\n" {
		t.Errorf("get after the server came back answered %q", got)
	}
	if err := p.Ready(context.Background()); err != nil {
		t.Errorf("not ready with the server back: %v", err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(healthExposition(up, 1, 1)),
		"mcsidecar_upstream_server_up", "mcsidecar_upstream_ejections_total"); err != nil {
		t.Errorf("after coming back: %v", err)
	}
	if n := logs.count("upstream server ejected"); n != 1 {
		t.Errorf("logged %d ejections, want 1", n)
	}
	if n := logs.count("upstream server back"); n != 1 {
		t.Errorf("logged %d returns, want 1", n)
	}
	// One state machine: the outage is logged as failing, ejected and
	// back, and not also as answering again.
	if n := logs.count("upstream failing"); n != 1 {
		t.Errorf("logged %d starts of failing, want 1", n)
	}
	if n := logs.count("upstream answers again"); n != 0 {
		t.Errorf("logged %d answers again after the server came back, want none", n)
	}
}

// TestFailureLimitZeroNeverEjects sends many failing requests to a dead
// server with ejection disabled: each one still tries the server.
func TestFailureLimitZeroNeverEjects(t *testing.T) {
	cfg := testConfig(deadUpstream(t))
	cfg.FailureLimit = 0
	p, addr := startProxy(t, cfg)
	c := newLineClient(t, addr)
	for range 10 {
		if got := c.do("set k 0 0 1\r\nv\r\n"); got != "SERVER_ERROR upstream unavailable\r\n" {
			t.Errorf("set to a dead server answered %q", got)
		}
	}
	// Each set tries the server (a set that meets a broken connection is
	// tried once more), and none is refused for an ejection.
	srv := p.upstreams().Servers[0]
	if got := c.stat("upstream_errors"); got < 10 {
		t.Errorf("upstream_errors = %d, want at least 10: every request tried the server", got)
	}
	if n := srv.Errors(upstream.KindEjected); n != 0 {
		t.Errorf("%d requests refused as ejected", n)
	}
	if srv.Ejected() || srv.Ejections() != 0 {
		t.Error("ejected with --upstream-failure-limit 0")
	}
}

// TestEjectRehashMovesKeysOfTheEjectedServer kills one of three servers
// with --upstream-eject-rehash: once it is ejected its keys are stored on
// and read from the servers left, the other keys stay where they were,
// and when it comes back its keys go back to it (and miss there: the
// stand-in's copy is no longer read, which is the stale-read risk the flag
// carries if that copy is later read again).
func TestEjectRehashMovesKeysOfTheEjectedServer(t *testing.T) {
	var ups []string
	kills := map[string]func(){}
	for range 3 {
		a, kill := startKillableMemcached(t)
		ups = append(ups, a)
		kills[a] = kill
	}
	cfg := testConfig(ups...)
	cfg.FailureLimit = 1
	cfg.RetryInterval = 100 * time.Millisecond
	cfg.EjectRehash = true
	p, addr := startProxy(t, cfg)
	set := p.upstreams()
	c := newLineClient(t, addr)

	const dead = 0
	deadAddr := set.Servers[dead].Name()
	kills[deadAddr]()
	// Find keys of the dead server and of the others.
	var deadKeys, liveKeys []string
	for i := 0; len(deadKeys) < 20 || len(liveKeys) < 20; i++ {
		k := "rehash:" + strconv.Itoa(i)
		if set.Pick(k, false) == dead {
			deadKeys = append(deadKeys, k)
		} else {
			liveKeys = append(liveKeys, k)
		}
	}
	// The first request to the dead server fails and ejects it.
	if got := c.do("set " + deadKeys[0] + " 0 0 1\r\nx\r\n"); got != "SERVER_ERROR upstream unavailable\r\n" {
		t.Errorf("the set that found the server dead answered %q", got)
	}
	if !set.Servers[dead].Ejected() {
		t.Fatal("not ejected after a failure with --upstream-failure-limit 1")
	}
	for _, k := range append(deadKeys, liveKeys...) {
		if got := c.do("set " + k + " 0 0 " + strconv.Itoa(len(k)) + "\r\n" + k + "\r\n"); got != "STORED\r\n" {
			t.Errorf("set %s with its server ejected answered %q", k, got)
		}
	}
	for _, k := range append(deadKeys, liveKeys...) {
		want := "VALUE " + k + " 0 " + strconv.Itoa(len(k)) + "\r\n" + k + "\r\nEND\r\n"
		if got := c.do("get " + k + "\r\n"); got != want {
			t.Errorf("get %s answered %q, want %q", k, got, want)
		}
		// Each value sits on the server the proxy picks now, which for a
		// live key is its own.
		owner := set.Pick(k, true)
		if owner == dead {
			t.Fatalf("%s picked the ejected server", k)
		}
		if got := exchange(t, set.Servers[owner].Name(), "get "+k+"\r\n"); got != want {
			t.Errorf("%s on %s directly: %q, want %q", k, set.Servers[owner].Name(), got, want)
		}
		if own := set.Pick(k, false); own != dead && own != owner {
			t.Errorf("live key %s moved from server %d to %d", k, own, owner)
		}
	}

	// Back: the dead server's keys are its own again, and miss there.
	if _, ok := runMemcached(t, deadAddr); !ok {
		t.Fatal("could not restart memcached on " + deadAddr)
	}
	if !waitFor(5*time.Second, func() bool { return !set.Servers[dead].Ejected() }) {
		t.Fatal("the restarted server is still ejected after 5s")
	}
	for _, k := range deadKeys {
		if got := c.do("get " + k + "\r\n"); got != "END\r\n" {
			t.Errorf("get %s after its server came back answered %q, want a miss", k, got)
		}
	}
}

// TestGetsToAnEjectedServerAreNotCountedAsSent times one get out against a
// stuck server, which ejects it, then sends more gets, which the proxy
// answers without sending anything. Only the first is an upstream get:
// upstream_gets and upstream_get_keys, in "stats" and in the metrics,
// count what reached a server, as mcsidecar_upstream_requests_total does;
// the others are ejected errors. The status page's "requests" and
// "failed" likewise count what was sent: one request, failed.
func TestGetsToAnEjectedServerAreNotCountedAsSent(t *testing.T) {
	up, _, _ := stuckUntilReleased(t, startMemcached(t))
	cfg := testConfig(up)
	cfg.Timeout = 200 * time.Millisecond
	cfg.FailureLimit = 1
	cfg.RetryInterval = time.Hour // stays out for the whole test
	p, addr := startProxy(t, cfg)
	reg := registry(t, p)
	c := newLineClient(t, addr)
	if got := c.do("get k\r\n"); got != "END\r\n" {
		t.Fatalf("get from a stuck server answered %q, want a miss", got)
	}
	if !p.upstreams().Servers[0].Ejected() {
		t.Fatal("not ejected after a timeout with --upstream-failure-limit 1")
	}
	for range 3 {
		if got := c.do("get a b\r\n"); got != "END\r\n" {
			t.Fatalf("get from an ejected server answered %q, want a miss", got)
		}
	}
	if n := c.stat("upstream_gets"); n != 1 {
		t.Errorf("upstream_gets = %d, want 1: only the first get was sent", n)
	}
	if n := c.stat("upstream_get_keys"); n != 1 {
		t.Errorf("upstream_get_keys = %d, want 1", n)
	}
	want := `
# HELP mcsidecar_upstream_get_keys_total Keys in the get requests sent upstream.
# TYPE mcsidecar_upstream_get_keys_total counter
mcsidecar_upstream_get_keys_total 1
# HELP mcsidecar_upstream_gets_total Get requests sent upstream; neighbouring client gets on one upstream connection are joined into one.
# TYPE mcsidecar_upstream_gets_total counter
mcsidecar_upstream_gets_total 1
# HELP mcsidecar_upstream_errors_total Upstream requests that failed, by server and kind: connect, timeout, connection (broken), server_error, protocol, ejected (not sent: the server is ejected).
# TYPE mcsidecar_upstream_errors_total counter
` + upstreamErrorsExposition(map[string]int{up + "/timeout": 1, up + "/ejected": 3}, up) + `
# HELP mcsidecar_upstream_requests_total Requests sent to upstream servers, by server; a batch of requests of many clients, written together, counts once.
# TYPE mcsidecar_upstream_requests_total counter
mcsidecar_upstream_requests_total{server="` + up + `"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "mcsidecar_upstream_gets_total", "mcsidecar_upstream_get_keys_total",
		"mcsidecar_upstream_errors_total", "mcsidecar_upstream_requests_total"); err != nil {
		t.Error(err)
	}
	if st := p.Upstreams()[0]; st.Requests != 1 || st.Errors != 1 || !st.Ejected {
		t.Errorf("status: %d requests, %d failed, ejected %v; want 1 sent, 1 failed, ejected", st.Requests, st.Errors, st.Ejected)
	}
}

// TestWriteBackTimeoutsCountTowardsEjection puts a relay in front of
// memcached that passes every command but the meta set (ms) an append to
// an enveloped item writes back with, which it swallows. With
// --upstream-failure-limit 1, the append's write-back timing out ejects
// the server, as any other request timing out does, and the timeout is
// counted as the server's.
func TestWriteBackTimeoutsCountTowardsEjection(t *testing.T) {
	mc := startMemcached(t)
	relay, _ := fakeUpstream(t, func(c net.Conn) {
		up, err := net.Dial("tcp", mc)
		if err != nil {
			return
		}
		defer up.Close()
		go io.Copy(c, up) // ends when up is closed
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if w := strings.Fields(line); len(w) > 2 && w[0] == "ms" {
				n, _ := strconv.Atoi(w[2])
				if _, err := br.Discard(n + 2); err != nil {
					return
				}
				continue // never answered
			}
			if _, err := io.WriteString(up, line); err != nil {
				return
			}
			if w := strings.Fields(line); len(w) > 4 && w[0] == "set" {
				n, _ := strconv.Atoi(w[4])
				if _, err := io.CopyN(up, br, int64(n+2)); err != nil {
					return
				}
			}
		}
	})
	cfg := envelopeAllConfig(relay)
	cfg.Timeout = 200 * time.Millisecond
	cfg.FailureLimit = 1
	cfg.RetryInterval = time.Hour // stays out for the whole test
	p, addr := startProxy(t, cfg)
	srv := p.upstreams().Servers[0]
	c := newLineClient(t, addr)
	if got := c.do("set k 0 0 5\r\nhello\r\n"); got != "STORED\r\n" {
		t.Fatalf("set answered %q", got)
	}
	if got := c.do("append k 0 0 6\r\n world\r\n"); got != "SERVER_ERROR upstream timeout\r\n" {
		t.Fatalf("append whose write-back is never answered answered %q", got)
	}
	if !srv.Ejected() {
		t.Error("a write-back that timed out did not count towards ejection")
	}
	if n := srv.Errors(upstream.KindTimeout); n != 1 {
		t.Errorf("%d timeouts counted for the server, want 1", n)
	}
}
