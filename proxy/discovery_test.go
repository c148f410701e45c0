package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"mcsidecar/proxy/upstream"
)

// fakeResolver answers DNS lookups from its tables, which a test changes
// while the proxy runs. A name not in the tables is not found.
type fakeResolver struct {
	mu    sync.Mutex
	hosts map[string][]string
	srv   map[string][]*net.SRV
	err   error // when set, every lookup fails with it
	calls int
}

func (r *fakeResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.err != nil {
		return nil, r.err
	}
	addrs, ok := r.hosts[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return slices.Clone(addrs), nil
}

func (r *fakeResolver) LookupSRV(_ context.Context, service, proto, name string) (string, []*net.SRV, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.err != nil {
		return "", nil, r.err
	}
	if service != "" || proto != "" {
		return "", nil, errors.New("want the whole SRV name in name")
	}
	recs, ok := r.srv[name]
	if !ok {
		return "", nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
	}
	return name, slices.Clone(recs), nil
}

// change runs fn on the resolver's tables under its lock.
func (r *fakeResolver) change(fn func(r *fakeResolver)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn(r)
}

func (r *fakeResolver) lookups() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// srvTo returns SRV records for the loopback memcached servers at addrs,
// each target a name of its own that resolves to 127.0.0.1.
func srvTo(r *fakeResolver, addrs ...string) []*net.SRV {
	var recs []*net.SRV
	for _, a := range addrs {
		_, port := hostPort(a)
		n, _ := strconv.Atoi(port)
		target := "mc-" + port + ".test."
		r.hosts[target] = []string{"127.0.0.1"}
		recs = append(recs, &net.SRV{Target: target, Port: uint16(n)})
	}
	return recs
}

// srvProxy serves a proxy whose one upstream entry is an SRV name that
// the returned resolver answers with the servers at addrs, looked up
// again every interval. It returns a client connected to it and the
// proxy's log.
func srvProxy(t *testing.T, interval time.Duration, addrs ...string) (*Proxy, *fakeResolver, *logLines, *lineClient) {
	t.Helper()
	r := &fakeResolver{hosts: map[string][]string{}, srv: map[string][]*net.SRV{}}
	r.srv["_memcached._tcp.cache.test"] = srvTo(r, addrs...)
	cfg := testConfig("dnssrv+_memcached._tcp.cache.test")
	cfg.Resolver = r
	cfg.DNSInterval = interval
	logs := &logLines{}
	p, addr, _ := serveProxyLog(t, cfg, logs.logger())
	return p, r, logs, newLineClient(t, addr)
}

// TestDiscoveryResolvesEntries checks what each kind of --upstream entry
// becomes, with grafana/dskit's meanings: dns+ every A/AAAA record at the
// entry's port, dnssrv+ the addresses of every SRV target at the record's
// port (or the entry's), dnssrvnoa+ the SRV targets as named.
func TestDiscoveryResolvesEntries(t *testing.T) {
	r := &fakeResolver{
		hosts: map[string][]string{
			"cache.test": {"127.0.0.1", "127.0.0.2", "::1"},
			"a.test.":    {"127.0.0.1"},
			"b.test.":    {"127.0.0.2", "127.0.0.3"},
		},
		srv: map[string][]*net.SRV{
			"_memcached._tcp.cache.test": {{Target: "a.test.", Port: 11211}, {Target: "b.test.", Port: 11212}},
			// Named in /etc/hosts: the proxy's upstream client resolves
			// the names itself, and no test may ask a real DNS server.
			"_memcached._tcp.local.test": {{Target: "localhost.", Port: 11211}, {Target: "localhost.", Port: 11212}},
		},
	}
	for _, tc := range []struct {
		name    string
		entries []string
		want    []string
	}{
		{"dns+ takes every A and AAAA record", []string{"dns+cache.test:11211"},
			[]string{"127.0.0.1:11211", "127.0.0.2:11211", "[::1]:11211"}},
		{"dnssrv+ takes the addresses of every target", []string{"dnssrv+_memcached._tcp.cache.test"},
			[]string{"127.0.0.1:11211", "127.0.0.2:11212", "127.0.0.3:11212"}},
		{"dnssrv+ with a port overrides the records'", []string{"dnssrv+_memcached._tcp.cache.test:9999"},
			[]string{"127.0.0.1:9999", "127.0.0.2:9999", "127.0.0.3:9999"}},
		{"dnssrvnoa+ takes the targets as named", []string{"dnssrvnoa+_memcached._tcp.local.test"},
			[]string{"localhost:11211", "localhost:11212"}},
		{"static and discovered entries mix, each server once", []string{"127.0.0.1:11211", "dns+cache.test:11211"},
			[]string{"127.0.0.1:11211", "127.0.0.2:11211", "[::1]:11211"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(tc.entries...)
			cfg.Resolver = r
			cfg.DNSInterval = time.Hour
			p, err := New(cfg, "test", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Shutdown(context.Background())
			if got, want := p.upstreams().Names, upstream.OrderServers(tc.want); !slices.Equal(got, want) {
				t.Errorf("servers %q, want %q", got, want)
			}
		})
	}
	for _, tc := range []struct{ entry, wantErr string }{
		{"dns+cache.test", "want dns+host:port"},
		{"dns+:11211", "want dns+host:port"},
		{"dnssrv+", "want dnssrv+_service._proto.name"},
		{"dnssrvnoa+", "want dnssrvnoa+_service._proto.name"},
		{"dns+missing.test:11211", "no such host"},
		{"dnssrv+_memcached._tcp.missing.test", "no such host"},
	} {
		t.Run("refused: "+tc.entry, func(t *testing.T) {
			cfg := testConfig(tc.entry)
			cfg.Resolver = r
			cfg.DNSInterval = time.Hour
			p, err := New(cfg, "test", nil)
			if err == nil {
				p.Shutdown(context.Background())
				t.Fatalf("New accepted %q", tc.entry)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("New(%q): %v, want an error saying %q", tc.entry, err, tc.wantErr)
			}
		})
	}
}

// TestDNSRecordsServeKeys runs two memcached servers on the same port of
// two loopback addresses behind one dns+ name: every key stored through
// the proxy sits on the server the selector picks for it, and both get
// some.
func TestDNSRecordsServeKeys(t *testing.T) {
	port := strconv.Itoa(freePort(t))
	for _, host := range []string{"127.0.0.1", "127.0.0.2"} {
		if _, ok := runMemcached(t, host+":"+port); !ok {
			t.Fatalf("could not start memcached on %s:%s", host, port)
		}
	}
	r := &fakeResolver{hosts: map[string][]string{"cache.test": {"127.0.0.2", "127.0.0.1"}}}
	cfg := testConfig("dns+cache.test:" + port)
	cfg.Resolver = r
	cfg.DNSInterval = time.Hour
	p, addr := startProxy(t, cfg)
	up := p.upstreams()
	c := newLineClient(t, addr)
	perServer := map[string]int{}
	for i := range 40 {
		k := "dns:" + strconv.Itoa(i)
		if got := c.do("set " + k + " 0 0 1\r\nv\r\n"); got != "STORED\r\n" {
			t.Fatalf("set %s answered %q", k, got)
		}
		owner := up.Servers[up.Pick(k, false)].Name()
		perServer[owner]++
		if got := exchange(t, owner, "get "+k+"\r\n"); got != "VALUE "+k+" 0 1\r\nv\r\nEND\r\n" {
			t.Errorf("%s is not on %s, its server: %q", k, owner, got)
		}
	}
	if len(perServer) != 2 {
		t.Errorf("keys by server %v, want both servers used", perServer)
	}
}

// TestServerSetChangesUnderAnOpenConnection adds a server to the SRV
// records, then removes another, while one client connection stays open.
// The connection keeps getting correct answers throughout, each key lands
// on the server the new selector picks, a server that stays keeps its
// pools and state, and a removed server is closed afterwards.
func TestServerSetChangesUnderAnOpenConnection(t *testing.T) {
	a, b, c3 := startMemcached(t), startMemcached(t), startMemcached(t)
	p, r, logs, c := srvProxy(t, 20*time.Millisecond, a, b)

	keys := make([]string, 60)
	for i := range keys {
		keys[i] = "set:" + strconv.Itoa(i)
	}
	// round stores every key with a value of this round through the same
	// connection, reads each back, and checks it sits on its server.
	round := func(name string) {
		t.Helper()
		up := p.upstreams()
		for _, k := range keys {
			v := k + "@" + name
			if got := c.do("set " + k + " 0 0 " + strconv.Itoa(len(v)) + "\r\n" + v + "\r\n"); got != "STORED\r\n" {
				t.Fatalf("%s: set %s answered %q", name, k, got)
			}
		}
		for _, k := range keys {
			v := k + "@" + name
			want := "VALUE " + k + " 0 " + strconv.Itoa(len(v)) + "\r\n" + v + "\r\nEND\r\n"
			if got := c.do("get " + k + "\r\n"); got != want {
				t.Errorf("%s: get %s answered %q, want %q", name, k, got, want)
			}
			if owner := up.Servers[up.Pick(k, false)].Name(); exchange(t, owner, "get "+k+"\r\n") != want {
				t.Errorf("%s: %s is not on %s, its server", name, k, owner)
			}
		}
	}
	waitSet := func(want ...string) {
		t.Helper()
		if !waitFor(5*time.Second, func() bool { return slices.Equal(p.upstreams().Names, upstream.OrderServers(want)) }) {
			t.Fatalf("servers %q, want %q", p.upstreams().Names, upstream.OrderServers(want))
		}
	}

	waitSet(a, b)
	round("two servers")
	before := p.upstreams()
	serverA, serverB := before.Servers[slices.Index(before.Names, a)], before.Servers[slices.Index(before.Names, b)]

	r.change(func(r *fakeResolver) { r.srv["_memcached._tcp.cache.test"] = srvTo(r, a, b, c3) })
	waitSet(a, b, c3)
	if now := p.upstreams(); now.Servers[slices.Index(now.Names, a)] != serverA {
		t.Error("a server that stayed was replaced")
	}
	round("three servers")

	r.change(func(r *fakeResolver) { r.srv["_memcached._tcp.cache.test"] = srvTo(r, a, c3) })
	waitSet(a, c3)
	round("b removed")
	closed := func() bool {
		return serverB.Closed()
	}
	if !waitFor(5*time.Second, closed) {
		t.Error("the removed server was not closed")
	}
	if got := c.stat("total_connections"); got != 1 {
		t.Errorf("total_connections = %d: the client's connection was replaced", got)
	}
	if n := logs.count("upstream servers changed"); n != 2 {
		t.Errorf("logged %d set changes, want 2", n)
	}
}

// TestFailedLookupKeepsLastServers makes every lookup fail, then find
// nothing, then work again: the server set never changes, requests keep
// being answered from it, and the failure is logged once when it starts
// and once when it ends, not at every lookup.
func TestFailedLookupKeepsLastServers(t *testing.T) {
	a, b := startMemcached(t), startMemcached(t)
	p, r, logs, c := srvProxy(t, 10*time.Millisecond, a, b)
	first := p.upstreams()
	want := upstream.OrderServers([]string{a, b})
	if !slices.Equal(first.Names, want) {
		t.Fatalf("servers %q, want %q", first.Names, want)
	}
	check := func(stage string) {
		t.Helper()
		if got := p.upstreams(); got != first {
			t.Fatalf("%s: server set changed to %q", stage, got.Names)
		}
		for i := range 10 {
			k := stage + ":" + strconv.Itoa(i)
			k = strings.ReplaceAll(k, " ", "_")
			if got := c.do("set " + k + " 0 0 1\r\nv\r\n"); got != "STORED\r\n" {
				t.Errorf("%s: set %s answered %q", stage, k, got)
			}
			if got := c.do("get " + k + "\r\n"); got != "VALUE "+k+" 0 1\r\nv\r\nEND\r\n" {
				t.Errorf("%s: get %s answered %q", stage, k, got)
			}
		}
	}
	// lookupsPass waits until the discovery loop has looked up n more times.
	lookupsPass := func(n int) {
		t.Helper()
		from := r.lookups()
		if !waitFor(5*time.Second, func() bool { return r.lookups() >= from+n }) {
			t.Fatalf("discovery looked up %d times in 5s, want %d", r.lookups()-from, n)
		}
	}

	r.change(func(r *fakeResolver) { r.err = errors.New("SERVFAIL") })
	lookupsPass(10)
	check("lookups failing")
	r.change(func(r *fakeResolver) {
		r.err = nil
		r.srv["_memcached._tcp.cache.test"] = nil
	})
	lookupsPass(10)
	check("lookups finding nothing")
	if n := logs.count("upstream lookup failed; keeping the last servers"); n != 1 {
		t.Errorf("logged %d lookup failures, want 1", n)
	}
	r.change(func(r *fakeResolver) { r.srv["_memcached._tcp.cache.test"] = srvTo(r, b, a) })
	lookupsPass(10)
	check("lookups working again")
	if n := logs.count("upstream lookup works again"); n != 1 {
		t.Errorf("logged %d recoveries, want 1", n)
	}
	if n := logs.count("upstream servers changed"); n != 0 {
		t.Errorf("logged %d set changes, want none", n)
	}
}

// TestRemovedServerLeavesNoConnectionBehind holds a set's reply at a relay
// in front of memcached while discovery removes that server and closes it:
// the request still in flight on the old set finishes, and then its
// connection is closed rather than kept idle in a pool nothing will ever
// use or close again.
func TestRemovedServerLeavesNoConnectionBehind(t *testing.T) {
	target, other := startMemcached(t), startMemcached(t)
	var open atomic.Int32
	seen := make(chan struct{}, 1)
	release := make(chan struct{})
	relay, _ := fakeUpstream(t, func(c net.Conn) {
		open.Add(1)
		defer open.Add(-1)
		up, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		defer up.Close()
		go func() {
			// Replies wait for release, then flow; this ends when
			// up is closed.
			br := bufio.NewReader(up)
			if _, err := br.Peek(1); err != nil {
				return
			}
			<-release
			io.Copy(c, br)
		}()
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				select {
				case seen <- struct{}{}:
				default:
				}
				up.Write(buf[:n])
			}
			if err != nil {
				return // the proxy closed its connection
			}
		}
	})

	r := &fakeResolver{hosts: map[string][]string{}, srv: map[string][]*net.SRV{}}
	r.srv["_memcached._tcp.cache.test"] = srvTo(r, relay)
	cfg := testConfig("dnssrv+_memcached._tcp.cache.test")
	cfg.Resolver = r
	cfg.DNSInterval = 20 * time.Millisecond
	cfg.Timeout = 10 * time.Second // the held reply must not time out
	p, addr := startProxy(t, cfg)
	removed := p.upstreams().Servers[0]

	c := dial(t, addr)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, "set k 0 0 1\r\nv\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-seen:
	case <-time.After(5 * time.Second):
		t.Fatal("the set did not reach the relay")
	}
	r.change(func(r *fakeResolver) { r.srv["_memcached._tcp.cache.test"] = srvTo(r, other) })
	closed := func() bool {
		return removed.Closed()
	}
	if !waitFor(5*time.Second, closed) {
		t.Fatal("the removed server was not closed")
	}
	close(release)
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || reply != "STORED\r\n" {
		t.Fatalf("set answered %q, %v", reply, err)
	}
	if !waitFor(3*time.Second, func() bool { return open.Load() == 0 }) {
		t.Errorf("%d connections to the removed server still open after its request ended", open.Load())
	}
}

// TestRemovedServerLeavesNoMetricSeries takes a server out of the set, and
// later back in: while it is out, none of the per-server families exports
// it (with DNS names that change as pods move, series of servers long gone
// would pile up), and when it is back its request times are exported
// again.
func TestRemovedServerLeavesNoMetricSeries(t *testing.T) {
	a, b := startMemcached(t), startMemcached(t)
	p, r, _, c := srvProxy(t, 20*time.Millisecond, a, b)
	reg := registry(t, p)
	// servers returns the servers each per-server family has a series for.
	servers := func() map[string][]string {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]string{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "server" && !slices.Contains(out[mf.GetName()], l.GetValue()) {
						out[mf.GetName()] = append(out[mf.GetName()], l.GetValue())
					}
				}
			}
		}
		return out
	}
	// touchAll sends a request to every server of the current set, so
	// each has observed a request time.
	touchAll := func() {
		t.Helper()
		for i := range 40 {
			k := "m:" + strconv.Itoa(i)
			if got := c.do("set " + k + " 0 0 1\r\nv\r\n"); got != "STORED\r\n" {
				t.Fatalf("set %s answered %q", k, got)
			}
		}
	}
	touchAll()
	if got := servers()["mcsidecar_upstream_request_duration_seconds"]; len(got) != 2 {
		t.Fatalf("request times exported for %q, want both servers", got)
	}

	before := p.upstreams()
	removed := before.Servers[slices.Index(before.Names, b)]
	r.change(func(r *fakeResolver) { r.srv["_memcached._tcp.cache.test"] = srvTo(r, a) })
	closed := func() bool {
		return removed.Closed()
	}
	if !waitFor(5*time.Second, closed) {
		t.Fatal("the removed server was not closed")
	}
	for family, names := range servers() {
		if slices.Contains(names, b) {
			t.Errorf("%s still has a series for %s, removed from the set", family, b)
		}
	}

	r.change(func(r *fakeResolver) { r.srv["_memcached._tcp.cache.test"] = srvTo(r, a, b) })
	if !waitFor(5*time.Second, func() bool { return len(p.upstreams().Names) == 2 }) {
		t.Fatal("the server was not added back")
	}
	touchAll()
	if got := servers()["mcsidecar_upstream_request_duration_seconds"]; !slices.Contains(got, b) {
		t.Errorf("request times exported for %q after %s came back", got, b)
	}
}
