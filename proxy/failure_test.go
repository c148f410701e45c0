package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"mcsidecar/proxy/internal/wire"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// lineClient is one client connection that sends a request and reads back
// exactly one reply, so a test can go on using the same connection.
type lineClient struct {
	tb testing.TB
	c  net.Conn
	br *bufio.Reader
}

func newLineClient(tb testing.TB, addr string) *lineClient {
	c := dial(tb, addr)
	return &lineClient{tb: tb, c: c, br: bufio.NewReader(c)}
}

// do sends req and returns the reply to it: VALUE and STAT blocks up to the
// END that closes them, or the one line of any other reply.
func (lc *lineClient) do(req string) string {
	lc.tb.Helper()
	lc.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(lc.c, req); err != nil {
		lc.tb.Fatalf("sending %q: %v", short(req), err)
	}
	reply, err := readReply(lc.br)
	if err != nil {
		lc.tb.Fatalf("reply to %q: %v (read so far %q)", short(req), err, reply)
	}
	return reply
}

// readReply reads one complete reply from br.
func readReply(br *bufio.Reader) (string, error) {
	var out strings.Builder
	for {
		line, err := br.ReadString('\n')
		out.WriteString(line)
		if err != nil {
			return out.String(), err
		}
		switch {
		case strings.HasPrefix(line, "VALUE "):
			f := strings.Fields(line)
			if len(f) < 4 {
				return out.String(), fmt.Errorf("bad VALUE line %q", line)
			}
			n, err := strconv.Atoi(f[3])
			if err != nil {
				return out.String(), fmt.Errorf("bad VALUE line %q", line)
			}
			data := make([]byte, n+2)
			if _, err := io.ReadFull(br, data); err != nil {
				return out.String(), err
			}
			out.Write(data)
		case strings.HasPrefix(line, "VA "):
			// A meta get's value: its block ends the reply.
			f := strings.Fields(line)
			n, err := strconv.Atoi(f[1])
			if err != nil {
				return out.String(), fmt.Errorf("bad VA line %q", line)
			}
			data := make([]byte, n+2)
			_, err = io.ReadFull(br, data)
			out.Write(data)
			return out.String(), err
		case strings.HasPrefix(line, "STAT "):
		default:
			return out.String(), nil
		}
	}
}

// stat returns one counter of the proxy's "stats" reply.
func (lc *lineClient) stat(name string) uint64 {
	lc.tb.Helper()
	reply := lc.do("stats\r\n")
	for _, line := range strings.Split(reply, "\r\n") {
		if v, ok := strings.CutPrefix(line, "STAT "+name+" "); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				lc.tb.Fatalf("stat %s: %q", name, v)
			}
			return n
		}
	}
	lc.tb.Fatalf("stats has no %s:\n%s", name, reply)
	return 0
}

// deadUpstream returns a loopback address nothing listens on.
func deadUpstream(tb testing.TB) string {
	return "127.0.0.1:" + strconv.Itoa(freePort(tb))
}

// stuckUpstream listens on loopback, accepts every connection, reads what
// it is sent and never answers. It returns its address and a channel that
// receives every line a client sent it.
func stuckUpstream(tb testing.TB) (string, <-chan string) {
	tb.Helper()
	addr, lines, _ := stuckUntilReleased(tb, "") // never released
	return addr, lines
}

// tricklingUpstream is a server that answers every request with a VALUE
// line announcing a megabyte and then sends the data one byte every 50ms.
// Each read of the reply arrives well within any read timeout, but the
// reply as a whole takes hours. stop ends the stream; register it with
// t.Cleanup after the proxy's own cleanup, so that it runs first and lets
// the proxy's stuck requests finish.
func tricklingUpstream(tb testing.TB) (addr string, stop func()) {
	tb.Helper()
	quit := make(chan struct{})
	var once sync.Once
	addr, stopServing := fakeUpstream(tb, func(c net.Conn) {
		go io.Copy(io.Discard, c) // ends when c is closed
		if _, err := io.WriteString(c, "VALUE k 0 1048576 1\r\n"); err != nil {
			return
		}
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			if _, err := io.WriteString(c, "x"); err != nil {
				return
			}
		}
	})
	stop = func() {
		once.Do(func() { close(quit) })
		stopServing()
	}
	tb.Cleanup(stop)
	return addr, stop
}

// TestUnavailableUpstream points the proxy at a port nothing listens on.
// Retrievals answer a miss (or SERVER_ERROR when so configured), every
// other command answers SERVER_ERROR, the client keeps its connection, and
// stats counts each failure.
func TestUnavailableUpstream(t *testing.T) {
	const down = "SERVER_ERROR upstream unavailable\r\n"
	for _, tc := range []struct {
		name      string
		failure   string
		retrieved string
	}{
		{"retrievals miss by default", failureMiss, "END\r\n"},
		{"retrievals answer SERVER_ERROR when configured", failureError, down},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(deadUpstream(t))
			cfg.Timeout = 200 * time.Millisecond
			cfg.ConnectTimeout = 100 * time.Millisecond
			cfg.RetrievalFailure = tc.failure
			_, addr := startProxy(t, cfg)
			c := newLineClient(t, addr)
			reqs := []struct{ req, want string }{
				{"get k\r\n", tc.retrieved},
				{"get k1 k2 k3\r\n", tc.retrieved},
				{"gets k\r\n", tc.retrieved},
				{"gat 0 k\r\n", tc.retrieved},
				{"gats 0 k\r\n", tc.retrieved},
				{"set k 0 0 1\r\nv\r\n", down},
				{"add k 0 0 1\r\nv\r\n", down},
				{"cas k 0 0 1 1\r\nv\r\n", down},
				{"delete k\r\n", down},
				{"incr k 1\r\n", down},
				{"decr k 1\r\n", down},
				{"touch k 0\r\n", down},
				{"flush_all\r\n", down},
				{"flush_all 10\r\n", down},
			}
			for _, req := range reqs {
				if got := c.do(req.req); got != req.want {
					t.Errorf("%q answered %q, want %q", req.req, got, req.want)
				}
			}
			if got := c.do("version\r\n"); got != "VERSION mcsidecar-test\r\n" {
				t.Errorf("after the failures, version answered %q", got)
			}
			// upstream_errors counts failed upstream requests: every
			// request above failed upstream once. A request is sent
			// again only when a pooled connection turns out broken,
			// never after a connect failed.
			if got := c.stat("upstream_errors"); got != uint64(len(reqs)) {
				t.Errorf("stats upstream_errors = %d, want %d", got, len(reqs))
			}
		})
	}
}

// TestStuckUpstream points the proxy at a server that accepts connections
// and never answers. Each request gives up after the upstream timeout: a
// retrieval is a miss (or SERVER_ERROR upstream timeout when so
// configured), anything else is SERVER_ERROR upstream timeout.
func TestStuckUpstream(t *testing.T) {
	const slow = "SERVER_ERROR upstream timeout\r\n"
	// Generous on purpose: the point is that the request ends at all, not
	// how close to the 100ms timeout it ends.
	const bound = 2 * time.Second
	for _, tc := range []struct {
		name      string
		failure   string
		retrieved string
	}{
		{"retrievals miss by default", failureMiss, "END\r\n"},
		{"retrievals answer SERVER_ERROR when configured", failureError, slow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up, _ := stuckUpstream(t)
			cfg := testConfig(up)
			cfg.Timeout = 100 * time.Millisecond
			cfg.ConnectTimeout = 100 * time.Millisecond
			cfg.RetrievalFailure = tc.failure
			_, addr := startProxy(t, cfg)
			c := newLineClient(t, addr)
			for _, req := range []struct{ req, want string }{
				{"get k\r\n", tc.retrieved},
				{"get k1 k2\r\n", tc.retrieved},
				{"gat 0 k\r\n", tc.retrieved},
				{"set k 0 0 5\r\nhello\r\n", slow},
				{"delete k\r\n", slow},
				{"flush_all\r\n", slow},
			} {
				start := time.Now()
				got := c.do(req.req)
				if took := time.Since(start); took > bound {
					t.Errorf("%q took %v, want under %v", req.req, took, bound)
				}
				if got != req.want {
					t.Errorf("%q answered %q, want %q", req.req, got, req.want)
				}
			}
			if got := c.do("version\r\n"); got != "VERSION mcsidecar-test\r\n" {
				t.Errorf("after the timeouts, version answered %q", got)
			}
		})
	}
}

// TestTricklingUpstreamGetEndsWithinBound points the proxy at a server
// whose reply to a get never ends but never pauses longer than the
// upstream timeout either. The upstream timeout bounds one upstream
// request, so the client's get must still end, as a miss, in bounded time.
func TestTricklingUpstreamGetEndsWithinBound(t *testing.T) {
	up, stop := tricklingUpstream(t)
	cfg := testConfig(up)
	cfg.Timeout = 100 * time.Millisecond
	cfg.ConnectTimeout = 100 * time.Millisecond
	_, addr := startProxy(t, cfg)
	t.Cleanup(stop) // runs before the proxy's Shutdown, which waits for the get
	c := dial(t, addr)
	if _, err := io.WriteString(c, "get k\r\n"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.SetReadDeadline(start.Add(2 * time.Second))
	reply, err := readReply(bufio.NewReader(c))
	if err != nil {
		t.Fatalf("get with a 100ms upstream timeout still unanswered after %v: %v (read %q)", time.Since(start).Round(time.Millisecond), err, reply)
	}
	if reply != "END\r\n" {
		t.Errorf("get answered %q, want a miss", reply)
	}
}

// TestOneOfThreeUpstreamsKilled kills one of three memcached servers after
// 300 keys were stored through the proxy. Keys on the live servers still
// hit with their own values, keys on the dead one miss, and no request
// ever answers a wrong value. With ejection the dead server is ejected
// once, and when memcached is restarted on its address the prober puts it
// back by itself.
func TestOneOfThreeUpstreamsKilled(t *testing.T) {
	t.Run("without ejection", func(t *testing.T) { oneOfThreeKilled(t, 0) })
	t.Run("with ejection", func(t *testing.T) { oneOfThreeKilled(t, 2) })
}

func oneOfThreeKilled(t *testing.T, failureLimit int) {
	kills := map[string]func(){}
	var ups []string
	for range 3 {
		addr, kill := startKillableMemcached(t)
		ups = append(ups, addr)
		kills[addr] = kill
	}
	cfg := testConfig(ups...)
	cfg.Timeout = 500 * time.Millisecond
	cfg.ConnectTimeout = 100 * time.Millisecond
	cfg.FailureLimit = failureLimit
	cfg.RetryInterval = 100 * time.Millisecond
	p, addr := startProxy(t, cfg)
	up := p.upstreams()
	c := newLineClient(t, addr)

	const n = 300
	keys := make([]string, n)
	values := map[string]string{}
	owner := map[string]int{}
	perServer := make([]int, len(up.Servers))
	for i := range keys {
		k := "key:" + strconv.Itoa(i)
		keys[i] = k
		values[k] = "value-" + strconv.Itoa(i*7919)
		owner[k] = up.Pick(k, false)
		perServer[owner[k]]++
		req := fmt.Sprintf("set %s %d 0 %d\r\n%s\r\n", k, i, len(values[k]), values[k])
		if got := c.do(req); got != "STORED\r\n" {
			t.Fatalf("storing %s: %q", k, got)
		}
	}
	for s, count := range perServer {
		if count == 0 {
			t.Fatalf("server %s owns none of the %d keys; the test needs keys on every server", up.Servers[s].Name(), n)
		}
	}

	const dead = 1
	kills[up.Servers[dead].Name()]()
	t.Logf("killed %s, which owned %d of %d keys", up.Servers[dead].Name(), perServer[dead], n)

	// check parses a retrieval reply and holds every value in it to the
	// value stored under its key.
	check := func(req, reply string) map[string]bool {
		t.Helper()
		seen := map[string]bool{}
		br := bufio.NewReader(strings.NewReader(reply))
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("%q: reply ends without END: %q", short(req), short(reply))
			}
			if line == "END\r\n" {
				if rest, _ := io.ReadAll(br); len(rest) > 0 {
					t.Fatalf("%q: bytes after END: %q", short(req), rest)
				}
				return seen
			}
			var k string
			var flags, size int
			if _, err := fmt.Sscanf(line, "VALUE %s %d %d", &k, &flags, &size); err != nil {
				t.Fatalf("%q: unexpected line %q", short(req), line)
			}
			data := make([]byte, size+2)
			if _, err := io.ReadFull(br, data); err != nil || !bytes.HasSuffix(data, wire.CRLF) {
				t.Fatalf("%q: bad data block for %s", short(req), k)
			}
			want, ok := values[k]
			switch {
			case !ok:
				t.Errorf("%q: value for a key never stored: %q", short(req), k)
			case string(data[:size]) != want || strconv.Itoa(flags) != strings.TrimPrefix(k, "key:"):
				t.Errorf("%q: %s = %q flags %d, want %q flags %s", short(req), k, data[:size], flags, want, strings.TrimPrefix(k, "key:"))
			}
			seen[k] = true
		}
	}
	expect := func(req string, seen map[string]bool, asked []string) {
		t.Helper()
		for _, k := range asked {
			live := owner[k] != dead
			if seen[k] != live {
				t.Errorf("%q: %s (on %s, live %v) hit = %v", short(req), k, up.Servers[owner[k]].Name(), live, seen[k])
			}
		}
	}

	for _, k := range keys {
		req := "get " + k + "\r\n"
		expect(req, check(req, c.do(req)), []string{k})
	}
	// One multi-get spanning all three servers, and a gets of the same.
	for _, verb := range []string{"get", "gets"} {
		req := verb + " " + strings.Join(keys, " ") + "\r\n"
		expect(req, check(req, c.do(req)), keys)
	}
	// Stores keep working on the live servers and fail on the dead one.
	for _, k := range keys[:20] {
		want := "STORED\r\n"
		if owner[k] == dead {
			want = "SERVER_ERROR upstream unavailable\r\n"
		}
		req := fmt.Sprintf("set %s %s 0 %d\r\n%s\r\n", k, strings.TrimPrefix(k, "key:"), len(values[k]), values[k])
		if got := c.do(req); got != want {
			t.Errorf("set %s (on %s) answered %q, want %q", k, up.Servers[owner[k]].Name(), got, want)
		}
	}
	// flush_all answers OK only when every server did.
	if got := c.do("flush_all\r\n"); got != "SERVER_ERROR upstream unavailable\r\n" {
		t.Errorf("flush_all with one server down answered %q", got)
	}
	if failureLimit == 0 {
		return
	}
	h := up.Servers[dead]
	if !h.Ejected() || h.Ejections() != 1 {
		t.Fatalf("dead server: ejected %v, %d ejections; want ejected once", h.Ejected(), h.Ejections())
	}
	for s, srv := range up.Servers {
		if s != dead && (srv.Ejected() || srv.Ejections() != 0) {
			t.Errorf("live server %s was ejected", srv.Name())
		}
	}
	if _, ok := runMemcached(t, up.Servers[dead].Name()); !ok {
		t.Fatal("could not restart memcached on " + up.Servers[dead].Name())
	}
	if !waitFor(5*time.Second, func() bool { return !h.Ejected() }) {
		t.Fatal("the restarted server is still ejected after 5s")
	}
	for _, k := range keys[:20] {
		req := fmt.Sprintf("set %s %s 0 %d\r\n%s\r\n", k, strings.TrimPrefix(k, "key:"), len(values[k]), values[k])
		if got := c.do(req); got != "STORED\r\n" {
			t.Errorf("set %s (on %s) after the restart answered %q", k, up.Servers[owner[k]].Name(), got)
		}
	}
	req := "get " + strings.Join(keys[:20], " ") + "\r\n"
	seen := check(req, c.do(req))
	for _, k := range keys[:20] {
		if !seen[k] {
			t.Errorf("%s missed after the restart", k)
		}
	}
}

// TestServerErrorFromUpstreamIsRelayed stores a value memcached refuses
// (exactly -I bytes, too large once its header is added) through a proxy
// that accepts it: the client must see memcached's own SERVER_ERROR line,
// as memcached answers the same request sent to it directly.
func TestServerErrorFromUpstreamIsRelayed(t *testing.T) {
	direct := startMemcached(t, "-I", "1m")
	cfg := testConfig(startMemcached(t, "-I", "1m"))
	cfg.MaxItemSize = 2 << 20
	_, via := startProxy(t, cfg)
	value := strings.Repeat("v", 1<<20)
	chunks := []string{
		"set big 0 0 1\r\nx\r\n",
		"set big 0 0 1048576\r\n" + value + "\r\n",
		"get big\r\n",
	}
	want := exchange(t, direct, chunks...)
	got := exchange(t, via, chunks...)
	if !strings.Contains(want, "SERVER_ERROR ") {
		t.Fatalf("memcached accepted the value (%q); the test needs a refusal", want)
	}
	if got != want {
		t.Errorf("proxy replied %q, memcached replied %q", got, want)
	}
}

// TestQueuedGetsEndWithinTheirTimeout sends 15 gets at once through a
// proxy that sends one key per upstream get, to a server that never
// answers, with ejection off: no get may wait for the gets before it to
// time out, one by one. Every get ends within a few upstream timeouts, as
// a miss.
func TestQueuedGetsEndWithinTheirTimeout(t *testing.T) {
	up, _ := stuckUpstream(t)
	cfg := testConfig(up)
	cfg.Timeout = 200 * time.Millisecond
	cfg.ConnectTimeout = 100 * time.Millisecond
	cfg.GetBatchKeys = 1
	_, addr := startProxy(t, cfg)
	const clients = 15
	// In line up to one timeout, then one upstream request, which may
	// be tried twice; the rest is slack for a loaded machine.
	bound := 3*cfg.Timeout + cfg.ConnectTimeout + time.Second
	conns := make([]*lineClient, clients)
	for i := range conns {
		conns[i] = newLineClient(t, addr)
	}
	type result struct {
		reply string
		took  time.Duration
		err   error
	}
	results := make(chan result, clients)
	for i, c := range conns {
		go func() {
			start := time.Now()
			c.c.SetDeadline(start.Add(10 * time.Second))
			if _, err := io.WriteString(c.c, "get k"+strconv.Itoa(i)+"\r\n"); err != nil {
				results <- result{err: err}
				return
			}
			reply, err := readReply(c.br)
			results <- result{reply, time.Since(start), err}
		}()
	}
	for range clients {
		r := <-results
		switch {
		case r.err != nil:
			t.Errorf("get: %v", r.err)
		case r.reply != "END\r\n":
			t.Errorf("get answered %q, want a miss", r.reply)
		case r.took > bound:
			t.Errorf("a get took %v with a %v upstream timeout, want under %v", r.took.Round(time.Millisecond), cfg.Timeout, bound)
		}
	}
}
