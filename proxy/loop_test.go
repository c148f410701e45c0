package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spf13/pflag"

	"mcsidecar/codec"
	"mcsidecar/keyspace"
	"mcsidecar/proxy/evloop"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/upstream"
)

// loopHandovers is how many connections p's event loops handed to the
// goroutine path.
func loopHandovers(p *Proxy) uint64 { return p.stats.connsHandedOver.Load() }

// loopConfig is testConfig served on one event loop.
func loopConfig(upstreams ...string) Config {
	cfg := testConfig(upstreams...)
	cfg.EventLoops = 1
	return cfg
}

// The differential cases and memccapable through the event loop: get,
// gets, the storage commands, delete, touch, incr and decr are answered
// on the loop, everything else after the connection moved to the
// goroutine path, often with replies still owed.
func TestEventLoopDifferential(t *testing.T) {
	runDifferential(t, slices.Concat(diffCases, regressionDiffCases), 1, loopConfig, nil)
}

func TestEventLoopDifferentialThreeServers(t *testing.T) {
	runDifferential(t, slices.Concat(diffCases, regressionDiffCases), 3, loopConfig, nil)
}

func TestEventLoopMemccapable(t *testing.T) { runMemccapable(t, loopConfig) }

// TestEventLoopKeepsGetsAndSets checks that gets, storage commands,
// deletes, touches, incr and decr stay on the loop, and that the first other command
// moves the connection, once, with the replies it is owed written first
// and in order.
func TestEventLoopKeepsGetsAndSets(t *testing.T) {
	ups := []string{startMemcached(t), startMemcached(t)}
	p, addr := startProxy(t, loopConfig(ups...))
	c := newLineClient(t, addr)
	var keys []string
	for i := range 50 {
		k := "loop:" + strconv.Itoa(i)
		keys = append(keys, k)
		if got := c.do("set " + k + " 7 0 " + strconv.Itoa(len(k)) + "\r\n" + k + "\r\n"); got != "STORED\r\n" {
			t.Fatalf("set %s answered %q", k, got)
		}
	}
	var want strings.Builder
	for _, k := range keys {
		want.WriteString("VALUE " + k + " 7 " + strconv.Itoa(len(k)) + "\r\n" + k + "\r\n")
	}
	want.WriteString("END\r\n")
	if got := c.do("get " + strings.Join(keys, " ") + "\r\n"); got != want.String() {
		t.Fatalf("a get of 50 keys over two servers answered %q", short(got))
	}
	if got := c.do("get loop:1 nothing loop:1\r\n"); got != "VALUE loop:1 7 6\r\nloop:1\r\nVALUE loop:1 7 6\r\nloop:1\r\nEND\r\n" {
		t.Fatalf("a get naming a key twice answered %q", got)
	}
	// Over 16 keys the repeats are found by hash.
	many := slices.Concat(keys[:20], []string{keys[3], "nothing", keys[3], keys[19], "nothing"})
	want.Reset()
	for _, k := range many {
		if k != "nothing" {
			want.WriteString("VALUE " + k + " 7 " + strconv.Itoa(len(k)) + "\r\n" + k + "\r\n")
		}
	}
	want.WriteString("END\r\n")
	asked := p.stats.upstreamGetKeys.Load()
	for range 2 { // the second time, with the slot's table used again
		if got := c.do("get " + strings.Join(many, " ") + "\r\n"); got != want.String() {
			t.Fatalf("a get of 25 keys with repeats answered %q", short(got))
		}
	}
	if n := p.stats.upstreamGetKeys.Load() - asked; n != 2*21 {
		t.Errorf("two gets of 21 distinct keys among 25 asked %d keys upstream", n)
	}
	for _, tc := range []struct{ req, want string }{
		{"add loop:1 0 0 1\r\nx\r\n", "NOT_STORED\r\n"},
		{"replace loop:1 9 0 2\r\nyy\r\n", "STORED\r\n"},
		{"append loop:1 0 0 1\r\nz\r\n", "STORED\r\n"},
		{"prepend loop:1 0 0 1\r\na\r\n", "STORED\r\n"},
		{"get loop:1\r\n", "VALUE loop:1 9 4\r\nayyz\r\nEND\r\n"},
		{"touch loop:1 100\r\n", "TOUCHED\r\n"},
		{"delete loop:1\r\n", "DELETED\r\n"},
		{"delete loop:1 0\r\n", "NOT_FOUND\r\n"},
		{"touch loop:1 100\r\n", "NOT_FOUND\r\n"},
		{"cas loop:2 0 0 1 1\r\nq\r\n", "EXISTS\r\n"},
		{"set n 0 0 2\r\n41\r\n", "STORED\r\n"},
		{"incr n 1\r\n", "42\r\n"},
		{"decr n 50\r\n", "0\r\n"},
		{"incr loop:2 1\r\n", "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"},
		{"incr nothing 1\r\n", "NOT_FOUND\r\n"},
		{"version\r\n", "VERSION mcsidecar-test\r\n"},
	} {
		if got := c.do(tc.req); got != tc.want {
			t.Errorf("%q answered %q, want %q", tc.req, got, tc.want)
		}
	}
	// A version between gets owed upstream is answered in its place.
	c.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.c.Write([]byte("get loop:2\r\nversion\r\nget loop:3\r\n")); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"VALUE loop:2 7 6\r\nloop:2\r\nEND\r\n", "VERSION mcsidecar-test\r\n", "VALUE loop:3 7 6\r\nloop:3\r\nEND\r\n"} {
		if got, err := readReply(c.br); err != nil || got != want {
			t.Fatalf("pipelined reply %q (%v), want %q", got, err, want)
		}
	}
	if n := loopHandovers(p); n != 0 {
		t.Fatalf("%d connections left the loop for commands it answers", n)
	}

	// Pipelined in one write: gets owed upstream, then a command the loop
	// does not answer, then more.
	c.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.c.Write([]byte("get loop:2\r\nset loop:x 0 0 1\r\nx\r\nverbosity 1\r\nget loop:x\r\ndelete loop:x\r\n")); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"VALUE loop:2 7 6\r\nloop:2\r\nEND\r\n",
		"STORED\r\n",
		"OK\r\n",
		"VALUE loop:x 0 1\r\nx\r\nEND\r\n",
		"DELETED\r\n",
	} {
		got, err := readReply(c.br)
		if err != nil || got != want {
			t.Fatalf("pipelined reply %q (%v), want %q", got, err, want)
		}
	}
	if n := loopHandovers(p); n != 1 {
		t.Errorf("%d handovers, want 1", n)
	}
	const exported = `# HELP mcsidecar_client_connections_handed_over_total Client connections moved from an event loop to the goroutine path: at the first command the loop does not answer, at a reply too long to copy, at a half-close with replies owed, or with too many requests it cannot answer yet.
# TYPE mcsidecar_client_connections_handed_over_total counter
mcsidecar_client_connections_handed_over_total 1
`
	if err := testutil.GatherAndCompare(registry(t, p), strings.NewReader(exported), "mcsidecar_client_connections_handed_over_total"); err != nil {
		t.Error(err)
	}
}

// TestEventLoopByDefault: --event-loops -1, the flag's default, serves
// clients on one loop.
func TestEventLoopByDefault(t *testing.T) {
	up := startMemcached(t)
	cfg := keyspaceConfig(up)
	cfg.EventLoops = EventLoopsAuto
	p, addr := startProxy(t, cfg)
	c := newLineClient(t, addr)
	if got := c.do("set k 0 0 1\r\nx\r\n"); got != "STORED\r\n" {
		t.Fatalf("set answered %q", got)
	}
	p.mu.Lock()
	l := p.loops
	p.mu.Unlock()
	if l == nil || p.cfg.EventLoops != 1 {
		t.Fatalf("--event-loops -1 serves on %d loops", p.cfg.EventLoops)
	}
	fs := pflag.NewFlagSet("proxy", pflag.ContinueOnError)
	var flagCfg Config
	flagCfg.RegisterFlags(fs)
	if flagCfg.EventLoops != EventLoopsAuto {
		t.Errorf("--event-loops defaults to %d", flagCfg.EventLoops)
	}
}

// FuzzLoopReplyScan feeds upstream replies to the event loop's scanner in
// pieces cut at arbitrary places: it must find the same end of the first
// reply, with the same bytes, and call it broken in the same cases, as
// when the reply arrives at once; and the VALUE headers it accepts must
// parse the same way as memcached writes them.
func FuzzLoopReplyScan(f *testing.F) {
	for _, seed := range []string{
		"END\r\n",
		"VALUE k 0 1\r\nx\r\nEND\r\n",
		"VALUE a 7 3 99\r\nabc\r\nVALUE b 0 0 100\r\n\r\nEND\r\nSTORED\r\n",
		"VALUE k 0 5\r\nab\r\n\r\nEND\r\n",
		"SERVER_ERROR out of memory storing object\r\n",
		"VALUE k 0 2\r\nabcEND\r\n",
		"VALUE k x 1\r\nx\r\nEND\r\n",
		"STORED\r\n",
		"VA 3 f0 t-1 c7\r\nabc\r\nEN\r\n",
		"EN\r\nVA 0 f5 t10 c1\r\n\r\nSERVER_ERROR out of memory\r\n",
		"VA 2 f0\r\nabcEN\r\n",
	} {
		f.Add([]byte(seed), uint8(1), uint8(1), uint8(3))
		f.Add([]byte(seed), uint8(0), uint8(1), uint8(1))
		f.Add([]byte(seed), uint8(2), uint8(2), uint8(2))
	}
	// kind: 0 a reply of one line, 1 a retrieval's, 2 the replies to keys
	// mg lines.
	f.Fuzz(func(t *testing.T, data []byte, kind, keys, step uint8) {
		req := &loopReq{store: kind%3 == 0, meta: kind%3 == 2, asked: make([]int, int(keys%8)+1)}
		var whole replyScan
		n1, done1, badAt := whole.feed(data, req)
		bad1 := badAt != nil
		var parts replyScan
		n2, done2, bad2 := 0, false, false
		size := int(step%16) + 1
		for n2 < len(data) && !done2 && !bad2 {
			end := min(n2+size, len(data))
			took, done, badAt := parts.feed(data[n2:end], req)
			done2, bad2 = done, badAt != nil
			n2 += took
			if took < end-(n2-took) && !done2 && !bad2 {
				t.Fatalf("took %d of a %d-byte piece without finishing", took, end-(n2-took))
			}
		}
		if bad1 != bad2 || !bad1 && (done1 != done2 || done1 && n1 != n2) {
			t.Fatalf("at once: took %d, whole %v, bad %v; in %d-byte pieces: took %d, whole %v, bad %v", n1, done1, bad1, size, n2, done2, bad2)
		}
		if done1 && !bytes.Equal(whole.acc, parts.acc) {
			t.Fatalf("the reply read at once %q differs from the one read in pieces %q", whole.acc, parts.acc)
		}
		if done1 && !bytes.Equal(whole.acc, data[:n1]) {
			t.Fatalf("the reply %q is not the first %d bytes", whole.acc, n1)
		}
		if done1 && !slices.Equal(whole.vals, parts.vals) {
			t.Fatalf("VALUE lines read at once %+v differ from those read in pieces %+v", whole.vals, parts.vals)
		}
		if done1 {
			// The VALUE blocks the scan noted follow one another from the
			// reply's start, each as its line says.
			at := 0
			for _, v := range whole.vals {
				line := whole.acc[v.at : v.at+v.line]
				w, ok := wire.ParseValue(line)
				if v.at != at || !ok || !bytes.Equal(w.Key, v.keyIn(whole.acc)) || w.Flags != v.flags || w.Size != v.size || w.CAS != v.cas || w.HasCAS != v.hasCAS {
					t.Fatalf("VALUE line noted as %+v at %d in %q", v, at, whole.acc)
				}
				at = v.at + len(v.block(whole.acc))
			}
		}
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			if key, flags, size, cas, ok := wire.ParseValueLine(data[:i+1]); ok {
				if len(key) == 0 || bytes.IndexByte(key, ' ') >= 0 {
					t.Fatalf("header %q accepted with key %q", data[:i+1], key)
				}
				withCAS := bytes.Count(data[:i], []byte{' '}) == 4
				again := appendValueHeader(nil, string(key), flags, size, cas, withCAS)
				k2, f2, s2, c2, ok2 := wire.ParseValueLine(again)
				if !ok2 || !bytes.Equal(k2, key) || f2 != flags || s2 != size || c2 != cas {
					t.Fatalf("header %q parsed as %q %d %d %d, written back as %q", data[:i+1], key, flags, size, cas, again)
				}
			}
		}
	})
}

// TestEventLoopKeepsEnvelopesAndRewrites checks that values the codec
// envelopes and keys sent rewritten stay on the loop: sets are enveloped
// there, bound to the client key, and gets opened and checked there, with
// the same counters as on the goroutine path.
func TestEventLoopKeepsEnvelopesAndRewrites(t *testing.T) {
	up := startMemcached(t)
	cfg := keyspaceConfig(up)
	cfg.EventLoops = 1
	cfg.Codec.DeleteCorrupt = true
	p, addr := startProxy(t, cfg)
	c, direct := newLineClient(t, addr), newLineClient(t, up)
	ks, err := keyspace.New(*keysConfig())
	if err != nil {
		t.Fatal(err)
	}
	long := mimirLV2Key()
	upKey, _, _ := ks.AppendRewrite(nil, []byte(long))
	value := strings.Repeat("postings 1234567 ", 20)
	rewrites := 0 // requests naming the long key
	do := func(req, want string, naming int) {
		t.Helper()
		rewrites += naming
		if got := c.do(req); got != want {
			t.Fatalf("%q answered %q, want %q", short(req), short(got), short(want))
		}
		if n := loopHandovers(p); n != 0 {
			t.Fatalf("%q moved the connection off the loop", short(req))
		}
	}
	valueOf := func(key, v string, flags int) string {
		return "VALUE " + key + " " + strconv.Itoa(flags) + " " + strconv.Itoa(len(v)) + "\r\n" + v + "\r\n"
	}

	do("set "+long+" 3 0 "+strconv.Itoa(len(value))+"\r\n"+value+"\r\n", "STORED\r\n", 1)
	do("set P2:loop 5 0 "+strconv.Itoa(len(value))+"\r\n"+value+"\r\n", "STORED\r\n", 0)
	do("set plain 0 0 1\r\nx\r\n", "STORED\r\n", 0)
	do("get "+long+"\r\n", valueOf(long, value, 3)+"END\r\n", 1)
	do("get "+long+" plain P2:loop "+long+"\r\n",
		valueOf(long, value, 3)+valueOf("plain", "x", 0)+valueOf("P2:loop", value, 5)+valueOf(long, value, 3)+"END\r\n", 2)
	if got := c.do("gets " + long + "\r\n"); !strings.HasPrefix(got, "VALUE "+long+" 3 "+strconv.Itoa(len(value))+" ") || !strings.HasSuffix(got, value+"\r\nEND\r\n") {
		t.Fatalf("gets of the long key answered %q", short(got))
	}
	rewrites++
	flags, stored, ok := rawItem(t, direct, "P2:loop")
	if !ok || flags != 5|1<<codec.DefaultFlagBit || len(stored) >= len(value) {
		t.Fatalf("postings value stored with flags %d, %d bytes for %d", flags, len(stored), len(value))
	}
	do("touch "+long+" 100\r\n", "TOUCHED\r\n", 1)
	do("delete "+long+"\r\n", "DELETED\r\n", 1)
	do("get "+long+"\r\n", "END\r\n", 1)

	// A plain item at the rewritten key is another client's value: a miss.
	rawSet(t, direct, string(upKey), 0, "plain")
	do("get "+long+"\r\n", "END\r\n", 1)
	if n := p.stats.keyUnbound.Load(); n != 1 {
		t.Errorf("%d unbound items counted, want 1", n)
	}
	// A damaged envelope is a miss, deleted at the rewritten key.
	do("set "+long+" 3 0 "+strconv.Itoa(len(value))+"\r\n"+value+"\r\n", "STORED\r\n", 1)
	flags, stored, _ = rawItem(t, direct, string(upKey))
	b := []byte(stored)
	b[len(b)/2] ^= 1
	rawSet(t, direct, string(upKey), flags, string(b))
	do("get "+long+"\r\n", "END\r\n", 1)
	if !waitFor(5*time.Second, func() bool {
		_, _, still := rawItem(t, direct, string(upKey))
		return !still && p.stats.codecDeleted.Load() == 1
	}) {
		t.Error("the damaged item was not deleted")
	}

	if n := loopHandovers(p); n != 0 {
		t.Fatalf("%d connections left the loop for commands it answers", n)
	}
	var counted uint64
	for i := range p.stats.keyRewrites {
		counted += p.stats.keyRewrites[i].Load()
	}
	if counted != uint64(rewrites) {
		t.Errorf("%d rewrites counted for %d requests naming the long key", counted, rewrites)
	}
	// Three enveloped values stored: the long key's twice, P2:loop once.
	if logical := p.stats.codecLogical.Load(); logical != uint64(3*len(value)) {
		t.Errorf("%d enveloped bytes counted, want %d", logical, 3*len(value))
	}
}

// TestReqQueueStaysSmall: a queue that never empties, as a busy
// connection's, keeps its requests in order in an array that does not grow
// past what it holds at once.
func TestReqQueueStaysSmall(t *testing.T) {
	var q reqQueue
	reqs := make([]*loopReq, 10000)
	for i := range reqs {
		reqs[i] = &loopReq{}
	}
	next := 0
	for i, r := range reqs {
		q.push(r)
		if i%3 != 0 { // more pushed than popped, until 3 are held
			continue
		}
		for q.len() > 3 {
			if q.front() != reqs[next] {
				t.Fatalf("request %d came out of order", next)
			}
			q.pop()
			next++
		}
	}
	if c := cap(q.buf); c > 16 {
		t.Errorf("a queue of at most 6 requests grew to %d", c)
	}
	for q.len() > 0 {
		if q.front() != reqs[next] {
			t.Fatalf("request %d came out of order", next)
		}
		q.pop()
		next++
	}
	if next != len(reqs) {
		t.Errorf("%d requests came out of %d", next, len(reqs))
	}
}

// TestEventLoopDrainAnswersFromEjectedServer: while the proxy drains, a
// request that fails at once (its server is ejected) is answered and the
// connection closed, from inside the client's own read: the loop must not
// close the connection under evloop there. The request races the drain's
// next check, which would close the idle connection first, so the case
// runs many times.
func TestEventLoopDrainAnswersFromEjectedServer(t *testing.T) {
	for range 30 {
		cfg := loopConfig("127.0.0.1:1") // refused: ejected at the first failure
		cfg.FailureLimit = 1
		cfg.RetryInterval = time.Minute
		p, addr, _ := serveProxy(t, cfg)
		c := newLineClient(t, addr)
		if got := c.do("get a\r\n"); got != "END\r\n" {
			t.Fatalf("get with the server down answered %q", got)
		}
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done <- p.Shutdown(ctx)
		}()
		for !p.draining() {
			time.Sleep(50 * time.Microsecond)
		}
		c.c.SetDeadline(time.Now().Add(5 * time.Second))
		c.c.Write([]byte("get a\r\n"))
		// The reply, or the close of the drain's check if it came first.
		if got, err := readReply(c.br); err == nil && got != "END\r\n" {
			t.Fatalf("get while draining answered %q", got)
		}
		if err := <-done; err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	}
}

// TestEventLoopServesZones checks that zones stay on the loop: a gets
// falls through the zones in order, answering each key with the flags and
// CAS of the first zone that has it, a duplicate key included; the hits
// of other zones are filled into the local one with their time to live;
// reads are counted per zone; set, touch and delete reach every zone.
func TestEventLoopServesZones(t *testing.T) {
	a, b, c := startZone(t, 2), startZone(t, 2), startZone(t, 2)
	cfg := zonedConfig("a", zoneEntry("a", a), zoneEntry("b", b), zoneEntry("c", c))
	cfg.EventLoops = 1
	p, addr := startProxy(t, cfg)
	reg := registry(t, p)
	sidecar := newLineClient(t, addr)

	type item struct {
		key   string
		zone  []string
		flags uint32
		ttl   int
		data  string
	}
	items := []item{
		{"in-c", c, 42, 1000, "from zone c"},
		{"in-b", b, 7, 0, "from zone b"},
		{"in-a", a, 1, 0, "from zone a"},
	}
	want := ""
	for _, it := range items {
		owner := ownerOf(t, it.zone, it.key)
		directSet(t, owner, it.key, it.flags, it.ttl, it.data)
		cas := strings.Fields(directDo(t, owner, "gets "+it.key+"\r\n"))[4]
		want += fmt.Sprintf("VALUE %s %d %d %s\r\n%s\r\n", it.key, it.flags, len(it.data), cas, it.data)
	}
	// The first key again, at the end, and a key no zone holds.
	want += want[:strings.Index(want, "VALUE in-b")] + "END\r\n"
	if got := sidecar.do("gets in-c in-b in-a nowhere in-c\r\n"); got != want {
		t.Fatalf("gets through zone a's sidecar:\n got %q\nwant %q", got, want)
	}
	if got := sidecar.do("get in-b\r\n"); got != valueReply("in-b", 7, "from zone b") {
		t.Errorf("get after the fill: %q", got)
	}

	for _, w := range []struct {
		key    string
		lo, hi int
	}{{"in-c", 900, 1000}, {"in-b", -1, -1}} {
		own := ownerOf(t, a, w.key)
		var ttl int
		if !waitFor(2*time.Second, func() bool {
			var ok bool
			ttl, ok = ttlIn(t, own, w.key)
			return ok
		}) {
			t.Fatalf("%s was not filled into zone a", w.key)
		}
		if ttl < w.lo || ttl > w.hi {
			t.Errorf("%s filled with a TTL of %d, want %d to %d", w.key, ttl, w.lo, w.hi)
		}
	}
	if !waitFor(2*time.Second, func() bool { return counterWith(t, reg, "mcsidecar_zone_fills_total", "result", "stored") == 2 }) {
		t.Errorf("fills stored: %v, want 2", counterWith(t, reg, "mcsidecar_zone_fills_total", "result", "stored"))
	}
	for _, w := range []struct {
		zone, local, result string
		want                float64
	}{
		// gets: a has in-a; b is asked for in-c, in-b and nowhere; c
		// for in-c and nowhere. Then the get of in-b hits in a.
		{"a", "true", "hit", 2}, {"a", "true", "miss", 3},
		{"b", "false", "hit", 1}, {"b", "false", "miss", 2},
		{"c", "false", "hit", 1}, {"c", "false", "miss", 1},
		{"a", "true", "error", 0}, {"b", "false", "error", 0}, {"c", "false", "error", 0},
	} {
		if got := counterWith(t, reg, "mcsidecar_zone_reads_total", "zone", w.zone, "local", w.local, "result", w.result); got != w.want {
			t.Errorf("zone reads {zone=%s,result=%s}: %v, want %v", w.zone, w.result, got, w.want)
		}
	}

	// Writes of every zone.
	if got := sidecar.do(setReq("set", "everywhere", "v1")); got != "STORED\r\n" {
		t.Fatalf("set: %q", got)
	}
	for _, z := range [][]string{a, b, c} {
		if _, d, ok := inZone(t, z, "everywhere"); !ok || d != "v1" {
			t.Errorf("zone %v after the set: %q, %v", z, d, ok)
		}
	}
	if got := sidecar.do("touch everywhere 600\r\n"); got != "TOUCHED\r\n" {
		t.Fatalf("touch: %q", got)
	}
	for _, z := range [][]string{a, b, c} {
		if ttl, ok := ttlIn(t, ownerOf(t, z, "everywhere"), "everywhere"); !ok || ttl < 500 || ttl > 600 {
			t.Errorf("zone %v after the touch: TTL %d, %v", z, ttl, ok)
		}
	}
	if got := sidecar.do("delete everywhere\r\n"); got != "DELETED\r\n" {
		t.Fatalf("delete: %q", got)
	}
	for _, z := range [][]string{a, b, c} {
		if _, _, ok := inZone(t, z, "everywhere"); ok {
			t.Errorf("zone %v still has the key after the delete", z)
		}
	}
	if got := sidecar.do("delete everywhere\r\n"); got != "NOT_FOUND\r\n" {
		t.Errorf("second delete: %q", got)
	}
	if n := loopHandovers(p); n != 0 {
		t.Errorf("%d connections left the loop", n)
	}
}

// TestEventLoopZonesKeepEnvelopes reads, through zone a's sidecar on a
// loop, a rewritten key and a postings key that only zone c holds: both
// are opened and answered, and filled into zone a as the envelopes zone c
// holds, from which the next read answers the same.
func TestEventLoopZonesKeepEnvelopes(t *testing.T) {
	a, c := startMemcached(t), startMemcached(t)
	zoned := func(local, writes string) Config {
		cfg := zonedConfig(local, zoneEntry("a", []string{a}), zoneEntry("c", []string{c}))
		cfg.Keys, cfg.Codec, cfg.ZoneWrites, cfg.EventLoops = keysConfig(), codecConfig(), writes, 1
		return cfg
	}
	_, addrC := startProxy(t, zoned("c", zoneWritesLocal))
	p, addrA := startProxy(t, zoned("a", zoneWritesAll))
	long := mimirLV2Key()
	ks, err := keyspace.New(*keysConfig())
	if err != nil {
		t.Fatal(err)
	}
	upKey, _, _ := ks.AppendRewrite(nil, []byte(long))
	value := strings.Repeat("postings 1234567 ", 20)
	inC := newLineClient(t, addrC)
	for _, k := range []string{long, "P2:zoned"} {
		if got := inC.do(setReq("set", k, value)); got != "STORED\r\n" {
			t.Fatalf("set %s in zone c: %q", short(k), got)
		}
	}
	if _, _, ok := inZone(t, []string{a}, "P2:zoned"); ok {
		t.Fatal("a write of zone c's sidecar reached zone a")
	}
	want := valueReply(long, 0, value)
	want = want[:len(want)-len("END\r\n")] + valueReply("P2:zoned", 0, value)
	sidecar := newLineClient(t, addrA)
	if got := sidecar.do("get " + long + " P2:zoned\r\n"); got != want {
		t.Fatalf("get through zone a's sidecar: %q", short(got))
	}
	for _, k := range []string{string(upKey), "P2:zoned"} {
		var fa, fc uint32
		var da, dc string
		if !waitFor(2*time.Second, func() bool {
			var ok bool
			fa, da, ok = inZone(t, []string{a}, k)
			return ok
		}) {
			t.Fatalf("%s was not filled into zone a", short(k))
		}
		fc, dc, _ = inZone(t, []string{c}, k)
		if fa != fc || da != dc || fa&(1<<codec.DefaultFlagBit) == 0 {
			t.Errorf("%s filled as flags %d, %d bytes; zone c holds flags %d, %d bytes", short(k), fa, len(da), fc, len(dc))
		}
	}
	if got := sidecar.do("get " + long + " P2:zoned\r\n"); got != want {
		t.Fatalf("get from zone a after the fill: %q", short(got))
	}
	reg := registry(t, p)
	if got := counterWith(t, reg, "mcsidecar_zone_reads_total", "zone", "a", "local", "true", "result", "hit"); got != 2 {
		t.Errorf("zone a hits: %v, want 2 (the second get)", got)
	}
	if n := loopHandovers(p); n != 0 {
		t.Errorf("%d connections left zone a's loop", n)
	}
}

// TestEventLoopServesFromTheLocalTier checks the local tier on the loop:
// an immutable key's hits after the first cost memcached nothing, gets
// still goes upstream for its CAS, every write through the loop drops
// the entry at once, and nothing leaves the loop.
func TestEventLoopServesFromTheLocalTier(t *testing.T) {
	up := startMemcached(t)
	cfg := tierConfig(tierTestSize, up)
	cfg.EventLoops = 1
	p, addr := startProxy(t, cfg)
	sc, direct := newLineClient(t, addr), newLineClient(t, up)
	key, long := tierKey("loop"), mimirLV2Key()
	reached := func(req, want string) int {
		t.Helper()
		before := direct.stat("get_hits") + direct.stat("get_misses")
		if got := sc.do(req); got != want {
			t.Fatalf("%q answered %q, want %q", short(req), short(got), short(want))
		}
		return int(direct.stat("get_hits") + direct.stat("get_misses") - before)
	}
	for i, v := range []string{"first", "second"} {
		if got := sc.do(setReq("set", key, v)); got != "STORED\r\n" {
			t.Fatalf("set %d: %q", i, got)
		}
		if got := sc.do(setReq("set", long, v+" long")); got != "STORED\r\n" {
			t.Fatalf("set %d of the long key: %q", i, got)
		}
		both := valueReply(key, 0, v)
		both = both[:len(both)-len("END\r\n")] + valueReply(long, 0, v+" long")
		if n := reached("get "+key+" "+long+"\r\n", both); n != 2 {
			t.Errorf("first get after set %d reached memcached for %d keys, want 2", i, n)
		}
		for range 3 {
			if n := reached("get "+key+" "+long+"\r\n", both); n != 0 {
				t.Errorf("a get of kept keys reached memcached for %d keys", n)
			}
		}
		if got := sc.do("gets " + key + "\r\n"); !strings.HasPrefix(got, "VALUE "+key+" 0 "+strconv.Itoa(len(v))+" ") {
			t.Errorf("gets: %q", got)
		}
	}
	if got := sc.do("delete " + key + "\r\n"); got != "DELETED\r\n" {
		t.Fatalf("delete: %q", got)
	}
	if n := reached("get "+key+"\r\n", "END\r\n"); n != 1 {
		t.Errorf("get after the delete reached memcached for %d keys, want 1", n)
	}
	if n := loopHandovers(p); n != 0 {
		t.Errorf("%d connections left the loop", n)
	}
}

// TestEventLoopZoneWrites runs every command of one key, with
// --zone-writes=all and with --zone-writes=local, through a sidecar on a
// loop and one on goroutines, each over zones of its own that start
// alike: the replies, and what each zone holds after, must be the same,
// and the loop must keep its connection.
func TestEventLoopZoneWrites(t *testing.T) {
	for _, writes := range []string{zoneWritesAll, zoneWritesLocal} {
		t.Run(writes, func(t *testing.T) { testEventLoopZoneWrites(t, writes) })
	}
}

func testEventLoopZoneWrites(t *testing.T, writes string) {
	keys := []string{"only-b", "only-b-add", "only-b-replace", "num-b", "only-b-append", "only-b-touch", "in-both", "cas-b", "nowhere", "new-key"}
	run := func(loops int) (replies []string, held map[string]string, p *Proxy) {
		a, b := startMemcached(t), startMemcached(t)
		cfg := zonedConfig("a", zoneEntry("a", []string{a}), zoneEntry("b", []string{b}))
		cfg.ZoneWrites, cfg.EventLoops = writes, loops
		p, addr := startProxy(t, cfg)
		for _, k := range keys[:len(keys)-2] {
			v := "b's " + k
			if k == "num-b" {
				v = "10"
			}
			directSet(t, b, k, 3, 0, v)
		}
		directSet(t, a, "in-both", 4, 0, "a's in-both")
		casB := strings.Fields(directDo(t, b, "gets cas-b\r\n"))[4]
		c := newLineClient(t, addr)
		for _, req := range []string{
			setReq("set", "new-key", "fresh"),
			"delete only-b\r\n",
			"delete nowhere\r\n",
			setReq("add", "only-b-add", "added"),
			setReq("replace", "only-b-replace", "replaced"),
			setReq("replace", "nowhere", "x"),
			"incr num-b 5\r\n",
			"decr nowhere 1\r\n",
			setReq("append", "only-b-append", "+tail"),
			setReq("prepend", "nowhere", "head+"),
			"touch only-b-touch 100\r\n",
			"touch nowhere 100\r\n",
			"cas in-both 0 0 1 1\r\nx\r\n",
			"cas cas-b 9 0 3 " + casB + "\r\nnew\r\n",
			setReq("set", "in-both", "both again"),
			setReq("add", "in-both", "not stored"),
			setReq("add", "nowhere", "added everywhere"),
		} {
			replies = append(replies, c.do(req))
		}
		held = map[string]string{}
		for _, k := range keys {
			for zone, srv := range map[string]string{"a": a, "b": b} {
				if f, d, ok := inZone(t, []string{srv}, k); ok {
					held[zone+" "+k] = fmt.Sprintf("%d %q", f, d)
				}
			}
		}
		return replies, held, p
	}
	loopReplies, loopHeld, p := run(1)
	goReplies, goHeld, _ := run(0)
	if !slices.Equal(loopReplies, goReplies) {
		t.Errorf("replies on the loop:\n%q\non goroutines:\n%q", loopReplies, goReplies)
	}
	if !maps.Equal(loopHeld, goHeld) {
		t.Errorf("zones after the loop's writes:\n%v\nafter the goroutine path's:\n%v", loopHeld, goHeld)
	}
	if n := loopHandovers(p); n != 0 {
		t.Errorf("%d connections left the loop", n)
	}
	// The deletes that bring zones in line are not damaged items.
	if n := p.stats.codecDeleted.Load(); n != 0 {
		t.Errorf("%d deletes counted as of damaged items", n)
	}
	if loopReplies[0] != "STORED\r\n" || loopReplies[6] != "15\r\n" || loopReplies[15] != "NOT_STORED\r\n" {
		t.Errorf("replies %q", loopReplies)
	}
}

// TestEventLoopSlowReaderGetsEveryReply pipelines 400 gets of a 16 KiB
// value, 6.4 MiB of replies, and reads them slowly: the loop holds replies
// back while evloop holds more than loopOutMax of them, and must go on by
// itself once the client has read, answering every get in order, on the
// loop.
func TestEventLoopSlowReaderGetsEveryReply(t *testing.T) {
	p, addr := startProxy(t, loopConfig(startMemcached(t)))
	want := []byte(setBig(t, addr, 16<<10))

	const gets = 400
	c := dial(t, addr)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write([]byte(strings.Repeat("get big\r\n", gets)))
		wrote <- err
	}()
	got := make([]byte, len(want))
	for i := range gets {
		// 16 KiB at a time with a pause: slower than the loop writes.
		for n := 0; n < len(got); {
			m, err := c.Read(got[n:min(len(got), n+16<<10)])
			if err != nil {
				t.Fatalf("reply %d: %v after %d bytes", i, err, n)
			}
			n += m
			time.Sleep(100 * time.Microsecond)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("reply %d is not the value's: %.60q", i, got)
		}
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if n := loopHandovers(p); n != 0 {
		t.Errorf("%d connections handed over, want the slow reader kept on the loop", n)
	}
}

// TestEventLoopHeldClientThatLeavesIsGone sends gets of a 16 KiB value
// until the loop holds the client's replies back, then closes without
// reading any: the connection must go, on the loop or after its handover,
// with nothing left waiting for replies no one will write.
func TestEventLoopHeldClientThatLeavesIsGone(t *testing.T) {
	_, addr := startProxy(t, loopConfig(startMemcached(t)))
	want := setBig(t, addr, 16<<10)
	probe := newLineClient(t, addr)
	baseline := probe.stat("curr_connections")

	deaf := dial(t, addr)
	deaf.SetDeadline(time.Now().Add(10 * time.Second))
	// 2,000 gets owe 32 MiB of replies: more than the socket buffers and
	// evloop hold, so the loop holds replies back before the client stops.
	batch := strings.Repeat("get big\r\n", 100)
	for range 20 {
		if _, err := io.WriteString(deaf, batch); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	deaf.Close()
	waitStat(t, probe, "curr_connections", func(v uint64) bool { return v == baseline })
	if got := probe.do("get big\r\n"); got != want {
		t.Errorf("get after the client left: %.60q", got)
	}
}

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

// TestEventLoopLongRepliesInOrder gets a 900 KiB value, longer than the
// loop copies, many times over sockets that do not take it at once: one
// get at a time, pipelined and read slowly, and pipelined and read in
// bursts. Replies the loop holds back and the reply that moves the
// connection to a goroutine must all arrive, whole and in order, with the
// reply of a version after them.
func TestEventLoopLongRepliesInOrder(t *testing.T) {
	cfg := loopConfig(startMemcached(t))
	cfg.Timeout = 10 * time.Second // 54 MB of replies, under the race detector too
	p, addr := startProxy(t, cfg)
	want := setBig(t, addr, 900<<10)
	// Most of a 900 KB value's rest is read straight into place.
	defer func() {
		if p.stats.upstreamReadsInPlace.Load() == 0 {
			t.Error("no value was read straight into place")
		}
	}()
	check := func(t *testing.T, c net.Conn, gets int, pause func(i int)) {
		for i := 0; i <= gets; i++ {
			w := want
			if i == gets {
				w = "VERSION mcsidecar-test\r\n"
			}
			pause(i)
			got := make([]byte, len(w))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != w {
				t.Fatalf("reply %d: %.60q (%v)", i, got, err)
			}
		}
	}
	t.Run("one at a time", func(t *testing.T) {
		c := dialSmallWindow(t, addr)
		c.SetDeadline(time.Now().Add(20 * time.Second))
		for range 6 {
			if _, err := io.WriteString(c, "get big\r\n"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		io.WriteString(c, "version\r\n")
		check(t, c, 6, func(int) {})
	})
	t.Run("pipelined, read slowly", func(t *testing.T) {
		c := dialSmallWindow(t, addr)
		c.SetDeadline(time.Now().Add(20 * time.Second))
		io.WriteString(c, strings.Repeat("get big\r\n", 30)+"version\r\n")
		check(t, c, 30, func(int) { time.Sleep(30 * time.Millisecond) })
	})
	t.Run("pipelined, read in bursts", func(t *testing.T) {
		c := dial(t, addr)
		c.SetDeadline(time.Now().Add(30 * time.Second))
		io.WriteString(c, strings.Repeat("get big\r\n", 60)+"version\r\n")
		check(t, c, 60, func(i int) {
			if i%3 == 0 {
				time.Sleep(40 * time.Millisecond)
			}
		})
	})
	if got := newLineClient(t, addr).do("version\r\n"); got != "VERSION mcsidecar-test\r\n" {
		t.Fatalf("the proxy after: %q", got)
	}
}

// TestEventLoopHalfCloseGetsEveryReply pipelines 2,000 gets of a 16 KiB
// value and does not read until evloop holds replies the socket did not
// take, then ends its side of the connection and reads everything. evloop
// drops what it holds when it closes its descriptor: the goroutine that
// goes on with the connection must write those bytes first, except what
// evloop's last write took, and then every other reply, in order and whole.
func TestEventLoopHalfCloseGetsEveryReply(t *testing.T) {
	needsWrittenCount(t)
	p, addr := startProxy(t, loopConfig(startMemcached(t)))
	want := setBig(t, addr, 16<<10)
	const gets = 2000
	c := dialSmallWindow(t, addr)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, strings.Repeat("get big\r\n", gets)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	c.(*net.TCPConn).CloseWrite()
	time.Sleep(100 * time.Millisecond)
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != gets*len(want) {
		t.Errorf("read %d bytes, want %d replies of %d", len(got), gets, len(want))
	}
	for i := 0; len(got) > 0; i++ {
		n := min(len(got), len(want))
		if string(got[:n]) != want[:n] {
			t.Fatalf("reply %d is not the value's: %.60q", i, got[:n])
		}
		got = got[n:]
	}
	if n := loopHandovers(p); n != 1 {
		t.Errorf("%d connections handed over, want the half-closed one", n)
	}
}

// TestEventLoopStopsTakingRequestsOfAClientThatReadsNone sends gets of a
// 16 KiB value for 3 s as fast as the proxy takes them, without reading,
// and without --idle-timeout: the requests the loop cannot answer yet must
// not pile up without end (evloop cannot stop reading a socket, the
// goroutine path can), and the client must then get its replies, whole
// and in order.
func TestEventLoopStopsTakingRequestsOfAClientThatReadsNone(t *testing.T) {
	needsWrittenCount(t)
	p, addr := startProxy(t, loopConfig(startMemcached(t)))
	want := setBig(t, addr, 16<<10)
	c := dialSmallWindow(t, addr)
	sent := sendGetsUnread(t, c, func() bool { return false })
	t.Logf("the client sent %d MiB of gets", sent>>20)
	// The loop's limit and a read, and what the sockets' buffers may hold
	// here (tcp_wmem's 4 MiB, tcp_rmem's 32 MiB at most); measured: 4 to
	// 11 MiB. Without the limit the loop takes all: 300 MiB.
	if limit := 48 << 20; sent > limit {
		t.Errorf("the proxy took %d MiB of requests from a client that reads no replies, want at most %d", sent>>20, limit>>20)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	got := make([]byte, len(want))
	for i := range 200 {
		if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
			t.Fatalf("reply %d: %.60q (%v)", i, got, err)
		}
	}
	if n := loopHandovers(p); n != 1 {
		t.Errorf("%d connections handed over, want the client's", n)
	}
}

// TestEventLoopHalfCloseAfterEveryReplyMade sends gets one at a time,
// reading nothing, until the loop owes no reply and evloop holds more than
// 32 KiB of them, then ends its side: with nothing owed and nothing
// unread, the connection still moves, for the bytes evloop holds.
func TestEventLoopHalfCloseAfterEveryReplyMade(t *testing.T) {
	needsWrittenCount(t)
	p, addr := startProxy(t, loopConfig(startMemcached(t)))
	want := setBig(t, addr, 16<<10)
	c := dialSmallWindow(t, addr)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	gets := 0
	for {
		if gets == 1000 {
			t.Fatal("evloop never held 32 KiB with no reply owed")
		}
		if _, err := io.WriteString(c, "get big\r\n"); err != nil {
			t.Fatal(err)
		}
		gets++
		time.Sleep(2 * time.Millisecond)
		if onLoop(t, p, func(lc *loopClient) bool { return len(lc.slots) == 0 && lc.gc.OutboundBuffered() > 32<<10 }) {
			break
		}
	}
	c.(*net.TCPConn).CloseWrite()
	time.Sleep(100 * time.Millisecond)
	got, err := io.ReadAll(c)
	if err != nil || len(got) != gets*len(want) || string(got) != strings.Repeat(want, gets) {
		t.Errorf("read %d bytes (%v), want %d replies of %d", len(got), err, gets, len(want))
	}
}

// TestEventLoopBulkPipelinerStaysOnTheLoop writes 20,000 sets of 1,000
// bytes (20 MB) at once and reads every reply as it comes: more than
// loopUnreadMax waits while the loop owes 256 replies, but the client
// reads them, so it stays on the loop; and every byte it sent counts once
// in bytes_read.
func TestEventLoopBulkPipelinerStaysOnTheLoop(t *testing.T) {
	p, addr := startProxy(t, loopConfig(startMemcached(t)))
	c := dial(t, addr)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	const n = 20000
	value := strings.Repeat("v", 1000)
	var b strings.Builder
	for i := range n {
		b.WriteString("set k" + itoa(i) + " 0 0 1000\r\n" + value + "\r\n")
	}
	read := make(chan error, 1)
	go func() {
		want := strings.Repeat("STORED\r\n", n)
		got := make([]byte, len(want))
		_, err := io.ReadFull(c, got)
		if err == nil && string(got) != want {
			err = errors.New("not every reply is STORED")
		}
		read <- err
	}()
	if _, err := io.WriteString(c, b.String()); err != nil {
		t.Fatal(err)
	}
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	if h := loopHandovers(p); h != 0 {
		t.Errorf("%d handovers of a client that reads every reply", h)
	}
	// Requests held back while replies were owed are handled after
	// those are written, outside a read: each byte counts once all the
	// same.
	if got := p.stats.bytesRead.Load(); got != uint64(b.Len()) {
		t.Errorf("bytes read: %d, the client sent %d", got, b.Len())
	}
}

// TestShutdownEndsHandoversOfClientsThatReadNothing lets Shutdown's grace
// run out on clients that read nothing, each moved from the loop while
// evloop held replies: at a command the loop does not answer, with replies
// still owed; after sending more than the loop lets wait; at a
// half-close. Every connection must be gone soon after, none left waiting
// in a handover for a loop that stopped or for a client that does not
// read.
func TestShutdownEndsHandoversOfClientsThatReadNothing(t *testing.T) {
	needsWrittenCount(t)
	cases := map[string]func(t *testing.T, p *Proxy, c net.Conn){
		"meta command": func(t *testing.T, p *Proxy, c net.Conn) {
			io.WriteString(c, strings.Repeat("get big\r\n", 250)+"mn\r\n")
			waitOnLoop(t, p, func(lc *loopClient) bool {
				return lc.handoff && len(lc.slots) > 0 && lc.gc.OutboundBuffered() > 0
			})
		},
		"requests piled up": func(t *testing.T, p *Proxy, c net.Conn) {
			sendGetsUnread(t, c, func() bool { return loopHandovers(p) > 0 })
			if n := loopHandovers(p); n != 1 {
				t.Fatalf("%d handovers", n)
			}
		},
		"half-close": func(t *testing.T, p *Proxy, c net.Conn) {
			io.WriteString(c, strings.Repeat("get big\r\n", 2000))
			time.Sleep(200 * time.Millisecond)
			c.(*net.TCPConn).CloseWrite()
			time.Sleep(200 * time.Millisecond)
		},
	}
	for name, handOver := range cases {
		t.Run(name, func(t *testing.T) {
			p, addr, _ := serveProxy(t, loopConfig(startMemcached(t)))
			setBig(t, addr, 16<<10)
			c := dialSmallWindow(t, addr)
			handOver(t, p, c)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			p.Shutdown(ctx)
			if !waitFor(3*time.Second, func() bool { return p.stats.currConns.Load() == 0 }) {
				t.Errorf("%d connections left 3 s after the grace", p.stats.currConns.Load())
			}
		})
	}
}

// sendGetsUnread writes gets of "big" to c as fast as it takes them, 63
// KiB at a time, for 3 s or until done reports true, and returns how many
// bytes it wrote.
func sendGetsUnread(t *testing.T, c net.Conn, done func() bool) int {
	t.Helper()
	chunk := []byte(strings.Repeat("get big\r\n", 7000))
	sent := 0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end) && !done(); {
		c.SetWriteDeadline(end)
		n, err := c.Write(chunk)
		sent += n
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return sent
}

// needsWrittenCount skips a test of a connection that moves while evloop
// holds its replies: only Linux counts the bytes a socket was given.
func needsWrittenCount(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("only Linux counts the bytes a socket was given")
	}
}

// TestEventLoopUnixSocketClientsKeepTheirReplies gets a 300 KiB value
// three times over TCP and over a Unix socket, which counts no bytes
// written: there evloop takes a long reply whole however much it holds, as
// a connection cannot move while evloop holds bytes, and every reply
// arrives.
func TestEventLoopUnixSocketClientsKeepTheirReplies(t *testing.T) {
	up := startMemcached(t)
	p, tcpAddr := startProxy(t, loopConfig(up))
	want := setBig(t, tcpAddr, 300<<10)
	path := filepath.Join(t.TempDir(), "proxy.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(ln)
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			addr := tcpAddr
			if network == "unix" {
				addr = path
			}
			c, err := net.Dial(network, addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			const gets = 3
			io.WriteString(c, strings.Repeat("get big\r\n", gets))
			time.Sleep(300 * time.Millisecond) // evloop holds some
			got := make([]byte, gets*len(want))
			n, err := io.ReadFull(c, got)
			if err != nil || string(got) != strings.Repeat(want, gets) {
				t.Errorf("read %d of %d bytes: %v", n, len(got), err)
			}
		})
	}
}

// onLoop reports whether f holds for a client of p's loop (the test
// proxies have one), asked on the loop.
func onLoop(t *testing.T, p *Proxy, f func(lc *loopClient) bool) bool {
	t.Helper()
	res := make(chan bool, 1)
	for el, ls := range eventLoopsOf(p) {
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
	select {
	case ok := <-res:
		return ok
	case <-time.After(5 * time.Second):
		t.Fatal("the loop did not answer")
		return false
	}
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

// TestEventLoopClientResetWhileRepliesAreWritten sends a set with noreply
// and a version behind it to a server that answers the set only when told:
// the version's reply waits for it. The loop is stalled while the set's
// reply and then the client's reset arrive, so that one pass writes the
// replies owed, and the write of the version fails and closes the client
// in the middle of that pass. The proxy must go on serving.
func TestEventLoopClientResetWhileRepliesAreWritten(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	gotSet, release := make(chan struct{}, 1), make(chan struct{})
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				br := bufio.NewReader(nc)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					switch {
					case strings.HasPrefix(line, "set "):
						br.ReadString('\n')
						gotSet <- struct{}{}
						<-release
						io.WriteString(nc, "STORED\r\n")
					case strings.HasPrefix(line, "version"):
						io.WriteString(nc, "VERSION 1.6.18\r\n")
					default:
						io.WriteString(nc, "ERROR\r\n")
					}
				}
			}()
		}
	}()
	p, addr := startProxy(t, loopConfig(ln.Addr().String()))
	c := dial(t, addr)
	if _, err := io.WriteString(c, "set a 0 0 1 noreply\r\nx\r\nversion\r\n"); err != nil {
		t.Fatal(err)
	}
	<-gotSet
	stallLoop(t, p, 300*time.Millisecond)
	close(release) // the set's reply reaches the loop's socket first
	time.Sleep(50 * time.Millisecond)
	c.(*net.TCPConn).SetLinger(0)
	c.Close() // then the client's reset
	time.Sleep(500 * time.Millisecond)
	if got := newLineClient(t, addr).do("version\r\n"); got != "VERSION mcsidecar-test\r\n" {
		t.Fatalf("the proxy after: %q", got)
	}
}

// TestEventLoopDeleteOfDamagedItemFailingAtOnce checks a get whose reply
// holds a damaged envelope, from a server that resets its connection just
// after replying: the delete of the damaged item fails inside the flush
// that sends it, while the reply is being made. The client still gets
// its reply, once, and the slot it was made in is not given to another
// client early (that crashed the loop, or left a stray END for the next
// client on it).
func TestEventLoopDeleteOfDamagedItemFailingAtOnce(t *testing.T) {
	mc := startMemcached(t)
	seed := testConfig(mc)
	seed.Codec = codecConfig()
	_, seedAddr := startProxy(t, seed)
	value := strings.Repeat("postings 1234567 ", 20)
	sc := newLineClient(t, seedAddr)
	for _, k := range []string{"P2:a", "P2:b"} {
		if r := sc.do(fmt.Sprintf("set %s 7 0 %d\r\n%s\r\n", k, len(value), value)); r != "STORED\r\n" {
			t.Fatalf("set %s: %q", k, r)
		}
	}
	direct := newLineClient(t, mc)
	fa, sa, _ := rawItem(t, direct, "P2:a")
	fb, sb, _ := rawItem(t, direct, "P2:b")
	bad := []byte(sa)
	bad[len(bad)/2] ^= 1
	damaged := fmt.Sprintf("VALUE P2:a %d %d\r\n%s\r\n", fa, len(bad), bad)
	good := fmt.Sprintf("VALUE P2:b %d %d\r\n%s\r\n", fb, len(sb), sb)

	for _, tc := range []struct{ name, keys, upstream, want string }{
		{"damaged key first", "P2:a P2:b", damaged + good + "END\r\n", "VALUE P2:b 7 " + strconv.Itoa(len(value)) + "\r\n" + value + "\r\nEND\r\n"},
		{"damaged key alone", "P2:a", damaged + "END\r\n", "END\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake, _ := fakeLineUpstream(t, func(c net.Conn, line string) bool {
				switch {
				case strings.HasPrefix(line, "get "):
					c.Write([]byte(tc.upstream))
					c.(*net.TCPConn).SetLinger(0) // a reset, not a close
					c.Close()
					return false
				case strings.HasPrefix(line, "version"):
					c.Write([]byte("VERSION 1\r\n"))
				}
				return true
			})
			cfg := loopConfig(fake)
			cfg.Codec = codecConfig()
			cfg.Codec.DeleteCorrupt = true
			_, addr := startProxy(t, cfg)
			lc := newLineClient(t, addr)
			if got := lc.do("get " + tc.keys + "\r\n"); got != tc.want {
				t.Fatalf("get %s answered %q, want %q", tc.keys, short(got), short(tc.want))
			}
			// Another client on the same loop gets its own reply.
			if got := newLineClient(t, addr).do("version\r\n"); !strings.HasPrefix(got, "VERSION ") {
				t.Fatalf("version on another client answered %q", got)
			}
		})
	}
}

// TestReplyScanReadsLongValuesInPlace feeds a reply scan a long value the
// way the loop reads one: the header through evloop's buffer, then the value
// read straight into the room its connection gives, in uneven pieces, then the
// rest of the reply through evloop's buffer again. What it gathers is the
// reply, byte for byte; bytes that arrive elsewhere are copied, not taken
// as if they were in place.
func TestReplyScanReadsLongValuesInPlace(t *testing.T) {
	req := &loopReq{}
	upstreamOnLoop := func() *loopUpstream {
		return &loopUpstream{ls: &loopState{l: &eventLoops{p: &Proxy{stats: newStats()}}}, sent: 1}
	}

	// The room leaves loopChunkRoom after the value's next bytes, however
	// much the chunk had: the value does not move for the END after it.
	tight := upstreamOnLoop()
	tight.takeChunk(0, 0)
	tight.scan.acc = append(tight.scan.acc, make([]byte, loopChunk-loopDirectMin-2)...)
	tight.scan.need = loopDirectMin
	if room := tight.room(); len(room) != loopDirectMin || cap(tight.scan.acc)-len(tight.scan.acc)-len(room) < loopChunkRoom {
		t.Fatalf("room of %d bytes leaves %d after it", len(room), cap(tight.scan.acc)-len(tight.scan.acc)-len(room))
	}
	for _, tc := range []struct {
		name   string
		size   int   // of the value
		mean   int   // of the connection's replies before
		pieces []int // bytes of the value and its CRLF per read
		place  bool  // read into room; otherwise from a buffer of evloop's
	}{
		{"in place, one piece a room", 3*loopDirectMax/2 + 7, 0, nil, true},
		{"in place, uneven pieces", 3*loopDirectMax/2 + 7, 0, []int{1, 4095, loopDirectMin + 3, 100000}, true},
		{"copied from elsewhere", 3*loopDirectMax/2 + 7, 0, []int{1, 70000, loopDirectMax + 9}, false},
		{"in place, all but filling its chunk", loopDirectMax - 200, 700_000, nil, true},
		{"in place, longer than a kept chunk, after long replies", loopChunkKeepMax + loopChunkKeepMax/8, 7 * loopChunkKeepMax / 8, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			value := make([]byte, tc.size)
			for i := range value {
				value[i] = byte('a' + i%23)
			}
			head := fmt.Sprintf("VALUE k 0 %d\r\n", tc.size)
			whole := head + string(value) + "\r\nEND\r\n"
			u := upstreamOnLoop()
			u.replyMean = tc.mean
			r := &u.scan
			// read puts data where the loop's next read would: into the
			// room, or into a buffer of evloop's.
			read := func(b []byte, place bool) []byte {
				room := u.room()
				if place {
					return room[:copy(room, b)]
				}
				return slices.Clone(b)
			}
			if data := read([]byte(head), tc.place); len(data) != len(head) {
				t.Fatalf("room of %d bytes for a header of %d", len(data), len(head))
			} else if n, whole, bad := r.feed(data, req); n != len(head) || whole || bad != nil {
				t.Fatalf("header: took %d, whole %v, bad %v", n, whole, bad)
			}
			rest := append(slices.Clone(value), "\r\n"...)
			for i := 0; len(rest) > 0; i++ {
				n := len(rest)
				if i < len(tc.pieces) {
					n = min(n, tc.pieces[i])
				}
				direct := r.direct()
				if r.need >= loopDirectMin && direct != min(r.need, loopDirectMax) || r.need < loopDirectMin && direct != 0 {
					t.Fatalf("a direct read of %d bytes with %d to come", direct, r.need)
				}
				if direct > 0 {
					n = min(n, direct)
				}
				data := read(rest[:n], tc.place)
				if len(data) != n {
					t.Fatalf("read %d: room of %d bytes for %d", i, len(data), n)
				}
				if got, whole, bad := r.feed(data, req); got != n || whole || bad != nil {
					t.Fatalf("read %d: took %d of %d, whole %v, bad %v", i, got, n, whole, bad)
				}
				u.adopt()
				rest = rest[n:]
			}
			array := &r.acc[0]
			if n, whole, bad := r.feed(read([]byte("END\r\n"), tc.place), req); n != 5 || !whole || bad != nil {
				t.Fatalf("END: took %d, whole %v, bad %v", n, whole, bad)
			}
			if tc.place && &r.acc[0] != array {
				t.Error("the END after a value read into place moved the reply to another array")
			}
			if string(r.acc) != whole {
				t.Fatalf("gathered %d bytes, not the %d of the reply", len(r.acc), len(whole))
			}
		})
	}
}

// TestEventLoopLongValuesFromATricklingServer has a server answer gets of
// long values in uneven pieces, two replies at a time in one write when
// two clients' gets came in two lines, or one reply for two clients when
// the proxy joined them in one: each client gets its own value, whole,
// and the reply after a long value is not taken for part of it.
func TestEventLoopLongValuesFromATricklingServer(t *testing.T) {
	value := func(key string, n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = key[len(key)-1] + byte(i%7)
		}
		return string(b)
	}
	sizes := map[string]int{"k1": 700 << 10, "k2": loopDirectMin + 1, "k3": 5000, "k4": 2<<20 - 1000}
	fake, _ := fakeUpstream(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		pieces := []int{1, 3, 64 << 10, 300000, 17, 1 << 20}
		p := 0
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			var out string
			for {
				// One get line may carry the keys of several clients.
				if w := strings.Fields(line); len(w) < 2 || w[0] != "get" {
					out += "ERROR\r\n"
				} else {
					for _, key := range w[1:] {
						v := value(key, sizes[key])
						out += fmt.Sprintf("VALUE %s 0 %d\r\n%s\r\n", key, len(v), v)
					}
					out += "END\r\n"
				}
				if br.Buffered() == 0 {
					break
				}
				if line, err = br.ReadString('\n'); err != nil {
					return
				}
			}
			for len(out) > 0 {
				n := min(len(out), pieces[p%len(pieces)])
				p++
				if _, err := io.WriteString(c, out[:n]); err != nil {
					return
				}
				out = out[n:]
				time.Sleep(time.Millisecond)
			}
		}
	})
	cfg := loopConfig(fake)
	cfg.MaxItemSize = 4 << 20
	cfg.Timeout = 10 * time.Second
	p, addr := startProxy(t, cfg)
	var wg sync.WaitGroup
	for _, key := range []string{"k1", "k2", "k3", "k4"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := dial(t, addr)
			c.SetDeadline(time.Now().Add(20 * time.Second))
			for i := range 3 {
				v := value(key, sizes[key])
				want := fmt.Sprintf("VALUE %s 0 %d\r\n%s\r\nEND\r\n", key, len(v), v)
				if _, err := io.WriteString(c, "get "+key+"\r\n"); err != nil {
					t.Error(err)
					return
				}
				got := make([]byte, len(want))
				if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
					t.Errorf("get %s, time %d: %.60q (%v)", key, i, got, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if p.stats.upstreamReadsInPlace.Load() == 0 {
		t.Error("no value was read straight into place")
	}
}

// TestEventLoopValueLongerThanMemcachedHolds has a server announce a value
// longer than memcached can hold and send nothing more: the loop takes
// the reply as out of step at once, as the goroutine path does, and does
// not wait for the bytes (the upstream timeout here is far longer than
// the client waits) nor make room for them.
func TestEventLoopValueLongerThanMemcachedHolds(t *testing.T) {
	for _, announced := range []int{upstream.MaxValueLen + 1, 1<<31 - 1} {
		t.Run(strconv.Itoa(announced), func(t *testing.T) {
			fake, _ := fakeLineUpstream(t, func(c net.Conn, line string) bool {
				if strings.HasPrefix(line, "get ") {
					fmt.Fprintf(c, "VALUE k 0 %d\r\nsome bytes", announced)
				}
				return true
			})
			cfg := loopConfig(fake)
			cfg.Timeout = time.Minute
			p, addr := startProxy(t, cfg)
			c := dial(t, addr)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, "get k\r\n")
			got := make([]byte, len("END\r\n"))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != "END\r\n" {
				t.Fatalf("get k answered %q (%v), want a miss", got, err)
			}
			if n := p.stats.upstreamReadsInPlace.Load(); n != 0 {
				t.Fatalf("%d reads made room for the value", n)
			}
		})
	}
}

// TestEventLoopChunksKeepRepliesWhole has clients pipeline multi-gets of
// values of many sizes, distinct byte for byte, over two servers, some
// clients reading their replies slowly: replies read into one chunk wait
// there for slow clients and for the other server while the chunks of the
// others turn over, and replies that span the end of a chunk move. Gets
// of one to forty keys are both joined into one get line upstream and
// not. Every reply must be the values asked for, whole, in order.
func TestEventLoopChunksKeepRepliesWhole(t *testing.T) {
	_, addr := startProxy(t, loopConfig(startMemcached(t), startMemcached(t)))
	rng := rand.New(rand.NewPCG(7, 11))
	const short, long = 48, 4
	values := make([]string, short+long)
	for i := range values {
		size := 100 + rng.IntN(4<<10)
		if i >= short {
			size = loopChunkRoom + rng.IntN(loopChunk) // long enough to cross a chunk's end
		}
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		values[i] = string(b)
		c := newLineClient(t, addr)
		if got := c.do(fmt.Sprintf("set chunk%d 0 0 %d\r\n%s\r\n", i, size, b)); got != "STORED\r\n" {
			t.Fatalf("set chunk%d answered %q", i, got)
		}
		c.c.Close()
	}

	const clients, gets = 8, 12
	var wg sync.WaitGroup
	for ci := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(ci), 3))
			var req, want strings.Builder
			for range gets {
				req.WriteString("get")
				for range 1 + rng.IntN(40) {
					k := rng.IntN(short)
					if rng.IntN(40) == 0 {
						k = short + rng.IntN(long)
					}
					fmt.Fprintf(&req, " chunk%d", k)
					fmt.Fprintf(&want, "VALUE chunk%d 0 %d\r\n%s\r\n", k, len(values[k]), values[k])
				}
				req.WriteString("\r\n")
				want.WriteString("END\r\n")
			}
			c := dial(t, addr)
			c.SetDeadline(time.Now().Add(60 * time.Second))
			go io.WriteString(c, req.String())
			got := make([]byte, want.Len())
			slow := ci%2 == 0
			for n := 0; n < len(got); {
				m, err := c.Read(got[n:min(len(got), n+64<<10)])
				if err != nil {
					t.Errorf("client %d: %v after %d of %d bytes", ci, err, n, len(got))
					return
				}
				n += m
				if slow {
					time.Sleep(time.Millisecond)
				}
			}
			if w := want.String(); string(got) != w {
				i := 0
				for i < len(w) && got[i] == w[i] {
					i++
				}
				t.Errorf("client %d: replies differ from byte %d of %d: %.40q, want %.40q", ci, i, len(w), got[i:], w[i:])
			}
		}()
	}
	wg.Wait()
}

// heldGets is how many gets of a 16 KiB value holdGets pipelines.
const heldGets = 250

// holdGets has a client with a small receive window send heldGets gets of
// a 16 KiB value and read nothing, so that the loop comes to hold it back.
// It returns the proxy, and a function that reads every reply and checks
// that each arrives whole and in order.
func holdGets(t *testing.T) (*Proxy, func()) {
	t.Helper()
	p, addr := startProxy(t, loopConfig(startMemcached(t)))
	want := setBig(t, addr, 16<<10)
	c := dialSmallWindow(t, addr)
	if _, err := io.WriteString(c, strings.Repeat("get big\r\n", heldGets)); err != nil {
		t.Fatal(err)
	}
	return p, func() {
		t.Helper()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		got := make([]byte, len(want))
		for i := range heldGets {
			if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
				t.Fatalf("reply %d: %.60q (%v)", i, got, err)
			}
		}
	}
}

// TestEventLoopHeldRepliesLetGoOfChunks has a client send 250 gets of a
// 16 KiB value and read nothing until the loop holds its replies back:
// the replies it holds then are copies, which refer to no chunk, so that a
// slow client keeps its own replies' bytes and not the chunks they were
// read into with everyone else's. Then every reply must still arrive,
// whole and in order.
func TestEventLoopHeldRepliesLetGoOfChunks(t *testing.T) {
	p, readAll := holdGets(t)
	// Held, with every reply made: none waits for memcached any more.
	waitOnLoop(t, p, func(lc *loopClient) bool {
		return lc.held && len(lc.slots) > 0 && !slices.ContainsFunc(lc.slots, func(s *loopSlot) bool { return s.pending > 0 })
	})
	onLoop(t, p, func(lc *loopClient) bool {
		for _, s := range lc.slots {
			for _, r := range s.reqs {
				if r.share != nil {
					t.Errorf("a held reply still refers to its chunk (%d of %d replies held)", len(lc.slots), heldGets)
					return false
				}
			}
		}
		return true
	})
	readAll()
}

// TestEventLoopResumesHeldClientsWhenWritten holds a client back, as
// TestEventLoopHeldRepliesLetGoOfChunks does, with the loop's tick an hour
// away: the client must still get every reply, resumed at the end of the
// poll in which evloop wrote enough of what it held, not at the next tick.
func TestEventLoopResumesHeldClientsWhenWritten(t *testing.T) {
	tick := loopTick
	loopTick = time.Hour
	t.Cleanup(func() { loopTick = tick }) // after the proxy's own cleanup
	p, readAll := holdGets(t)
	waitOnLoop(t, p, func(lc *loopClient) bool { return lc.held })
	readAll()
}

// TestEventLoopLongValuesReuseChunks gets one long value over and over
// through the loop: each reply is read into a chunk the loop keeps, not
// into an array allocated for it (zeroed and faulted in each time). Then
// gets of values of other lengths, longer than a kept chunk among them: a
// short one after long ones allocates nothing of their size, and the
// chunks the loop keeps stay within its bounds, counted right.
func TestEventLoopLongValuesReuseChunks(t *testing.T) {
	cfg := loopConfig(startMemcached(t, "-I", "8m"))
	cfg.MaxItemSize = 8 << 20
	p, addr := startProxy(t, cfg)
	values := map[string]int{"long": 700_000, "short": 40_000, "longer": 2_500_000, "longest": 5_000_000}
	// Set by a client of their own: a set this long moves its client to
	// the goroutine path (see loopUnreadMax).
	setter := newLineClient(t, addr)
	for k, size := range values {
		if got := setter.do(fmt.Sprintf("set %s 0 0 %d\r\n%s\r\n", k, size, strings.Repeat(k[:1], size))); got != "STORED\r\n" {
			t.Fatalf("set %s answered %q", k, got)
		}
	}
	setter.c.Close()
	wants := make(map[string]string)
	for k, size := range values {
		wants[k] = fmt.Sprintf("VALUE %s 0 %d\r\n%s\r\nEND\r\n", k, size, strings.Repeat(k[:1], size))
	}
	// Each get on a client of its own: a reply longer than the socket
	// takes at once moves its client to the goroutine path (see
	// loopCopyMax), but the loop still reads it from memcached.
	get := func(k string) {
		c := newLineClient(t, addr)
		defer c.c.Close()
		want := wants[k]
		c.c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c.c, "get "+k+"\r\n"); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(want))
		if _, err := io.ReadFull(c.br, buf); err != nil || string(buf) != want {
			t.Fatalf("get %s answered %d bytes (%v), not the value", k, len(buf), err)
		}
	}
	// onLoops runs f on the state of each of p's loops (it has one).
	onLoops := func(f func(ls *loopState)) {
		for el, ls := range eventLoopsOf(p) {
			ran := make(chan struct{})
			el.Execute(func() {
				defer close(ran)
				f(ls)
			})
			<-ran
		}
	}
	made := func() (n int) {
		onLoops(func(ls *loopState) { n += ls.made })
		return n
	}

	for range 4 {
		get("long") // the loop learns how long its replies are
	}
	const gets = 40
	before := made()
	for range gets {
		get("long")
	}
	if n := made() - before; n > loopChunkKeepMax {
		t.Errorf("chunks of %d bytes allocated for %d gets of a %d-byte value", n, gets, values["long"])
	}

	for _, k := range []string{"short", "longer", "long", "longest", "short", "long", "longer", "longest", "long"} {
		get(k)
	}
	// After replies longer than any chunk kept, a short one takes a kept
	// chunk, not an array as long as they were.
	for range 12 {
		get("longest")
	}
	before = made()
	for range 3 {
		get("short")
	}
	if n := made() - before; n > loopChunk {
		t.Errorf("chunks of %d bytes allocated for 3 gets of a %d-byte value after longer ones", n, values["short"])
	}
	onLoops(func(ls *loopState) {
		long := 0
		for _, b := range ls.chunks {
			if cap(b) != loopChunk {
				t.Errorf("a kept chunk of %d bytes among those of %d", cap(b), loopChunk)
			}
		}
		for _, b := range ls.long {
			if n := cap(b); n <= loopChunk || n > loopChunkKeepMax {
				t.Errorf("a kept long chunk of %d bytes", n)
			}
			long += cap(b)
		}
		if len(ls.chunks) > loopChunksKept || long != ls.longKept || long > loopLongChunksBytes {
			t.Errorf("kept %d chunks of %d bytes and %d bytes of longer ones, counted as %d", len(ls.chunks), loopChunk, long, ls.longKept)
		}
	})
}

// TestEventLoopLongValueInPiecesIsParsedOnce sends a set whose value
// arrives in many reads: the request is parsed once the value is all
// there, not after each read, where each look at the bytes gathered so
// far would copy them all into a new array, and the reads after the
// first go straight into a buffer for the request.
func TestEventLoopLongValueInPiecesIsParsedOnce(t *testing.T) {
	up := startMemcached(t)
	p, addr := startProxy(t, loopConfig(up))
	c := newLineClient(t, addr)
	value := make([]byte, 1000*1000)
	for i := range value {
		value[i] = byte('a' + i%26)
	}
	const piece = 16 << 10
	c.c.SetDeadline(time.Now().Add(10 * time.Second))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fmt.Fprintf(c.c, "set long 0 0 %d\r\n", len(value))
	for off := 0; off < len(value); off += piece {
		if _, err := c.c.Write(value[off:min(off+piece, len(value))]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // one read each
	}
	if got := c.do("\r\n"); got != "STORED\r\n" {
		t.Fatalf("set answered %q", got)
	}
	runtime.ReadMemStats(&after)
	if p.stats.clientReadsInPlace.Load() == 0 {
		t.Fatal("no read of the value went straight into place")
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 12<<20 {
		t.Fatalf("a set of %d bytes sent in %d-byte pieces allocated %d bytes", len(value), piece, n)
	}
	want := fmt.Sprintf("VALUE long 0 %d\r\n%s\r\nEND\r\n", len(value), value)
	if got := c.do("get long\r\n"); got != want {
		t.Fatalf("get long answered %d bytes, not the %d set", len(got), len(want))
	}
}

// TestEventLoopLongValueReservesWhatArrives has clients begin sets of
// long values and stop: memory for a value follows what has come of it,
// not what its command says will. A buffer of the request's size is taken
// only once half of it has come.
func TestEventLoopLongValueReservesWhatArrives(t *testing.T) {
	p, addr := startProxy(t, loopConfig(startMemcached(t)))
	const conns, size = 20, 300000
	value := strings.Repeat("v", size)
	var cs []net.Conn
	sent := 0
	for i := range conns {
		c := dial(t, addr)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		n, _ := fmt.Fprintf(c, "set k%d 0 0 %d\r\n%s", i, size, value[:1000])
		sent += n
		cs = append(cs, c)
	}
	// reserved sums, over the clients, the buffers their requests are
	// gathered in of their own, and got the bytes they sent.
	reserved := func() (reserved, got int) {
		onLoop(t, p, func(lc *loopClient) bool {
			reserved += cap(lc.pend)
			got += lc.buffered()
			return false
		})
		return reserved, got
	}
	if !waitFor(5*time.Second, func() bool { _, got := reserved(); return got == sent }) {
		t.Fatal("the loop did not read what was sent")
	}
	if r, got := reserved(); r > 0 {
		t.Fatalf("%d bytes reserved for %d come", r, got)
	}
	for _, c := range cs {
		n, _ := io.WriteString(c, value[1000:size*3/4])
		sent += n
	}
	if !waitFor(5*time.Second, func() bool { _, got := reserved(); return got == sent }) {
		t.Fatal("the loop did not read what was sent")
	}
	if r, got := reserved(); r == 0 || r > 2*got {
		t.Fatalf("%d bytes reserved for %d come", r, got)
	}
	for i, c := range cs {
		io.WriteString(c, value[size*3/4:]+"\r\n")
		line, err := bufio.NewReader(c).ReadString('\n')
		if line != "STORED\r\n" {
			t.Fatalf("set %d answered %q (%v)", i, line, err)
		}
	}
	if r, _ := reserved(); r > 0 {
		t.Fatalf("%d bytes still reserved once every set was answered", r)
	}
}
