package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"mcsidecar/codec"
	"mcsidecar/keyspace"
)

// The differential cases and memccapable through the event loop, with one
// and with three servers.
func TestEventLoopDifferential(t *testing.T) {
	runDifferential(t, slices.Concat(diffCases, regressionDiffCases), 1, loopConfig, nil)
}

func TestEventLoopDifferentialThreeServers(t *testing.T) {
	runDifferential(t, slices.Concat(diffCases, regressionDiffCases), 3, loopConfig, nil)
}

func TestEventLoopMemccapable(t *testing.T) { runMemccapable(t, loopConfig) }

// TestEventLoopKeepsGetsAndSets checks gets, storage commands, deletes,
// touches, incr, decr and the commands the sidecar answers by itself on
// the loop, one at a time and pipelined, the replies owed written in
// order.
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
	asked := p.stats.UpstreamGetKeys.Load()
	for range 2 { // the second time, with the slot's table used again
		if got := c.do("get " + strings.Join(many, " ") + "\r\n"); got != want.String() {
			t.Fatalf("a get of 25 keys with repeats answered %q", short(got))
		}
	}
	if n := p.stats.UpstreamGetKeys.Load() - asked; n != 2*21 {
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
		{"verbosity 1\r\n", "OK\r\n"},
		{"mn\r\n", "MN\r\n"},
		{"verbosity x\r\n", "CLIENT_ERROR bad command line format\r\n"},
		{"nosuchcommand\r\n", "ERROR\r\n"},
		{"get\r\n", "ERROR\r\n"},
		{"stats items\r\n", "END\r\n"},
		{"stats nosuch\r\n", "ERROR\r\n"},
		{"get loop:1 " + strings.Repeat("k", 251) + "\r\n", "CLIENT_ERROR bad command line format\r\n"},
		{"delete " + strings.Repeat("k", 251) + "\r\n", "CLIENT_ERROR bad command line format\r\n"},
		{"delete loop:2 5\r\n", "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"},
		{"touch loop:2 soon\r\n", "CLIENT_ERROR invalid exptime argument\r\n"},
		{"incr n many\r\n", "CLIENT_ERROR invalid numeric delta argument\r\n"},
		{"incr n many noreply\r\nversion\r\n", "VERSION mcsidecar-test\r\n"},
		{"flush_all soon\r\n", "CLIENT_ERROR invalid exptime argument\r\n"},
		{"flush_all 0\r\n", "OK\r\n"},
		{"get loop:1 loop:2 n\r\n", "END\r\n"},
		{"set loop:2 7 0 6\r\nloop:2\r\nflush_all noreply\r\nget loop:2\r\n", "STORED\r\n"},
		{"", "END\r\n"},
		{"set loop:2 7 0 6\r\nloop:2\r\n", "STORED\r\n"},
		{"set loop:3 7 0 6\r\nloop:3\r\n", "STORED\r\n"},
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
	// stats counts every request before it; quit closes once the replies
	// owed are written, and nothing after it is read.
	c.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.c.Write([]byte("get loop:2\r\nstats\r\nget loop:3\r\nquit\r\nget loop:2\r\n")); err != nil {
		t.Fatal(err)
	}
	if got, err := readReply(c.br); err != nil || got != "VALUE loop:2 7 6\r\nloop:2\r\nEND\r\n" {
		t.Fatalf("pipelined reply %q (%v)", got, err)
	}
	if got, err := readReply(c.br); err != nil || !strings.HasPrefix(got, "STAT pid ") || !strings.HasSuffix(got, "END\r\n") {
		t.Fatalf("pipelined stats answered %q (%v)", short(got), err)
	}
	if got, err := readReply(c.br); err != nil || got != "VALUE loop:3 7 6\r\nloop:3\r\nEND\r\n" {
		t.Fatalf("pipelined reply %q (%v)", got, err)
	}
	if rest, err := io.ReadAll(c.br); err != nil || len(rest) > 0 {
		t.Fatalf("after quit the connection sent %q (%v), want its end", rest, err)
	}
	c = newLineClient(t, addr)

	// Pipelined in one write: gets owed upstream, a set refused in the
	// middle, then more; all of it on the loop.
	c.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.c.Write([]byte("get loop:2\r\nset loop:x 0 0 1\r\nx\r\n" + refusedSet + "get loop:x\r\ndelete loop:x\r\n")); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"VALUE loop:2 7 6\r\nloop:2\r\nEND\r\n",
		"STORED\r\n",
		refusedSetReply,
		"VALUE loop:x 0 1\r\nx\r\nEND\r\n",
		"DELETED\r\n",
	} {
		got, err := readReply(c.br)
		if err != nil || got != want {
			t.Fatalf("pipelined reply %q (%v), want %q", got, err, want)
		}
	}
}

// TestEventLoopByDefault: --event-loops -1, the flag's default, serves
// clients on autoLoops() loops.
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
	if l == nil || p.cfg.EventLoops != autoLoops() {
		t.Fatalf("--event-loops -1 serves on %d loops", p.cfg.EventLoops)
	}
	fs := pflag.NewFlagSet("proxy", pflag.ContinueOnError)
	var flagCfg Config
	flagCfg.RegisterFlags(fs)
	if flagCfg.EventLoops != EventLoopsAuto {
		t.Errorf("--event-loops defaults to %d", flagCfg.EventLoops)
	}
}

// TestEventLoopKeepsEnvelopesAndRewrites checks that values the codec
// envelopes and keys sent rewritten stay on the loop: sets are enveloped
// there, bound to the client key, and gets opened and checked there, and
// each is counted.
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
	if n := p.stats.KeyUnbound.Load(); n != 1 {
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
		return !still && p.stats.CodecDeleted.Load() == 1
	}) {
		t.Error("the damaged item was not deleted")
	}

	var counted uint64
	for i := range p.stats.KeyRewrites {
		counted += p.stats.KeyRewrites[i].Load()
	}
	if counted != uint64(rewrites) {
		t.Errorf("%d rewrites counted for %d requests naming the long key", counted, rewrites)
	}
	// Three enveloped values stored: the long key's twice, P2:loop once.
	if logical := p.stats.CodecLogical.Load(); logical != uint64(3*len(value)) {
		t.Errorf("%d enveloped bytes counted, want %d", logical, 3*len(value))
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
	if p.stats.ClientReadsInPlace.Load() == 0 {
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
		var mu sync.Mutex // with two loops or more, asked on each at once
		onLoop(t, p, func(lc *loopClient) bool {
			mu.Lock()
			defer mu.Unlock()
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
