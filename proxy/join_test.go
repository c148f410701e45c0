package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestEventLoopJoinsGetsOfManyClients has six clients send their gets
// while the loop is stalled, so that the loop reads them all at once and
// writes them upstream together, where the gets next to each other join
// one get line. Each client still gets exactly its own reply: misses
// skipped, a key named twice, a key another client asked too, and the CAS
// of a gets, which joins no get.
func TestEventLoopJoinsGetsOfManyClients(t *testing.T) {
	fake, sentSince := joinFake(t)
	p, addr := startProxy(t, loopConfig(fake))
	// The upstream connection is made before, so that the gets below
	// wait for no dial.
	if got := newLineClient(t, addr).do("get a\r\n"); got != "VALUE a 0 1\r\n1\r\nEND\r\n" {
		t.Fatalf("get a answered %q", got)
	}
	cases := []struct {
		req, want string
		keys      int // asked upstream
	}{
		{"get a\r\n", "VALUE a 0 1\r\n1\r\nEND\r\n", 1},
		{"get x a\r\n", "VALUE a 0 1\r\n1\r\nEND\r\n", 2},
		{"get b d b x\r\n", "VALUE b 0 2\r\n22\r\nVALUE d 0 4\r\n4444\r\nVALUE b 0 2\r\n22\r\nEND\r\n", 3},
		{"gets a\r\n", "VALUE a 0 1 101\r\n1\r\nEND\r\n", 1},
		{"get x\r\n", "END\r\n", 1},
		{"get d a\r\n", "VALUE d 0 4\r\n4444\r\nVALUE a 0 1\r\n1\r\nEND\r\n", 2},
	}
	reqs := make([]string, len(cases))
	for i, tc := range cases {
		reqs[i] = tc.req
	}
	before := len(sentSince(0))
	gets, keys := p.stats.UpstreamGets.Load(), p.stats.UpstreamGetKeys.Load()
	wantKeys := 0
	for i, got := range stalledGets(t, p, addr, reqs) {
		if got != cases[i].want {
			t.Errorf("%q answered %q, want %q", cases[i].req, got, cases[i].want)
		}
		wantKeys += cases[i].keys
	}
	sent := sentSince(before)
	// Five gets and a gets: whatever order the loop reads them in, the
	// gets splits the gets after the first into two runs at most.
	if len(sent) > 4 {
		t.Errorf("six retrievals went upstream in %d lines, want at most 4: %q", len(sent), sent)
	}
	if n := p.stats.UpstreamGets.Load() - gets; n != uint64(len(sent)) {
		t.Errorf("upstream_gets counted %d, but %d get lines were sent", n, len(sent))
	}
	if n := p.stats.UpstreamGetKeys.Load() - keys; n != uint64(wantKeys) {
		t.Errorf("upstream_get_keys counted %d, want %d", n, wantKeys)
	}
	asked := 0
	for _, l := range sent {
		asked += len(strings.Fields(l)) - 1
	}
	if asked != wantKeys {
		t.Errorf("%d keys asked upstream in %q, want %d", asked, sent, wantKeys)
	}

	// memcached's error in reply to a line fails every request joined in
	// it: each is answered (a miss, as for one multi-get), none waits, and
	// the connection stays in step. Whichever goes first, the other two
	// join one line.
	for i, got := range stalledGets(t, p, addr, []string{"get boom\r\n", "get boom a\r\n", "get b boom\r\n"}) {
		if got != "END\r\n" {
			t.Errorf("get %d with a line memcached failed answered %q, want a miss", i, got)
		}
	}
	if got := newLineClient(t, addr).do("get a\r\n"); got != "VALUE a 0 1\r\n1\r\nEND\r\n" {
		t.Errorf("get a after a failed line answered %q", got)
	}
}

// TestEventLoopJoinedLinesKeepToTheBatchKeys: a line holds at most
// --upstream-get-batch-keys keys.
func TestEventLoopJoinedLinesKeepToTheBatchKeys(t *testing.T) {
	fake, sentSince := joinFake(t)
	cfg := loopConfig(fake)
	cfg.GetBatchKeys = 3
	p, addr := startProxy(t, cfg)
	if got := newLineClient(t, addr).do("get x\r\n"); got != "END\r\n" {
		t.Fatalf("get x answered %q", got)
	}
	before := len(sentSince(0))
	cases := []struct{ req, want string }{
		{"get a\r\n", "VALUE a 0 1\r\n1\r\nEND\r\n"},
		{"get b x\r\n", "VALUE b 0 2\r\n22\r\nEND\r\n"},
		{"get d\r\n", "VALUE d 0 4\r\n4444\r\nEND\r\n"},
		{"get a b\r\n", "VALUE a 0 1\r\n1\r\nVALUE b 0 2\r\n22\r\nEND\r\n"},
		{"get x d\r\n", "VALUE d 0 4\r\n4444\r\nEND\r\n"},
		{"get b\r\n", "VALUE b 0 2\r\n22\r\nEND\r\n"},
	}
	reqs := make([]string, len(cases))
	for i, tc := range cases {
		reqs[i] = tc.req
	}
	for i, got := range stalledGets(t, p, addr, reqs) {
		if got != cases[i].want {
			t.Errorf("%q answered %q, want %q", cases[i].req, got, cases[i].want)
		}
	}
	sent := sentSince(before)
	for _, l := range sent {
		if n := len(strings.Fields(l)) - 1; n > 3 {
			t.Errorf("a line of %d keys with --upstream-get-batch-keys 3: %q", n, l)
		}
	}
	// A key alone after any line of fewer than three joins it.
	if len(sent) >= len(cases) {
		t.Errorf("%d requests in %d lines: none joined: %q", len(cases), len(sent), sent)
	}
}

// joinFake serves gets from a fixed set of items; a line naming boom is
// answered with memcached's error for a get it could not answer. sent
// returns the lines it was sent after the first n.
func joinFake(t *testing.T) (addr string, sent func(n int) []string) {
	items := map[string]string{"a": "1", "b": "22", "d": "4444"}
	var mu sync.Mutex
	var lines []string
	addr, _ = fakeLineUpstream(t, func(c net.Conn, line string) bool {
		mu.Lock()
		lines = append(lines, line)
		mu.Unlock()
		w := strings.Fields(line)
		switch {
		case len(w) < 2 || (w[0] != "get" && w[0] != "gets"):
			io.WriteString(c, "ERROR\r\n")
			return true
		case slices.Contains(w, "boom"):
			io.WriteString(c, "SERVER_ERROR out of memory writing get response\r\n")
			return true
		}
		var out strings.Builder
		for _, k := range w[1:] {
			if v, ok := items[k]; ok {
				fmt.Fprintf(&out, "VALUE %s 0 %d", k, len(v))
				if w[0] == "gets" {
					fmt.Fprintf(&out, " %d", 100+len(v))
				}
				out.WriteString("\r\n" + v + "\r\n")
			}
		}
		out.WriteString("END\r\n")
		io.WriteString(c, out.String())
		return true
	})
	return addr, func(n int) []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lines[n:])
	}
}

// stalledGets sends each of reqs on a client of its own while p's loop is
// stalled, so that the loop reads them all at once, and returns the
// replies.
func stalledGets(t *testing.T, p *Proxy, addr string, reqs []string) []string {
	t.Helper()
	clients := make([]*lineClient, len(reqs))
	for i := range clients {
		// A version is answered on the loop: the client is on it before
		// the stall, not waiting to join it.
		clients[i] = newLineClient(t, addr)
		if got := clients[i].do("version\r\n"); !strings.HasPrefix(got, "VERSION ") {
			t.Fatalf("version answered %q", got)
		}
	}
	stallLoop(t, p, 300*time.Millisecond)
	for i, req := range reqs {
		clients[i].c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(clients[i].c, req); err != nil {
			t.Fatal(err)
		}
	}
	replies := make([]string, len(reqs))
	for i := range reqs {
		got, err := readReply(clients[i].br)
		if err != nil {
			t.Errorf("%q: %v after %q", reqs[i], err, got)
		}
		replies[i] = got
	}
	return replies
}

// TestEventLoopJoinedGetsKeepEachClientsOrder runs clients that each
// pipeline a get of its own key, a set of it, a get of a shared key with
// its own key and a miss, a gets of the shared key, and a get of its own
// key again, against memcached. Gets of different clients join, but no
// get moves past a set: the first get of the client's key sees the value
// of the round before, the last sees the round's own. Every reply is
// checked, CAS included.
func TestEventLoopJoinedGetsKeepEachClientsOrder(t *testing.T) {
	mc := startMemcached(t)
	p, addr := startProxy(t, loopConfig(mc))
	const shared, clients, rounds = 40, 8, 100
	direct := newLineClient(t, mc)
	cas := make([]string, shared)
	for j := range shared {
		k, v := fmt.Sprintf("j:%d", j), fmt.Sprintf("shared-%d", j)
		if got := direct.do(fmt.Sprintf("set %s 3 0 %d\r\n%s\r\n", k, len(v), v)); got != "STORED\r\n" {
			t.Fatalf("set %s: %q", k, got)
		}
		reply := direct.do("gets " + k + "\r\n")
		head, _, _ := strings.Cut(reply, "\r\n")
		w := strings.Fields(head)
		if len(w) != 5 {
			t.Fatalf("gets %s answered %q", k, reply)
		}
		cas[j] = w[4]
	}
	value := func(k, v string, flags int) string {
		return fmt.Sprintf("VALUE %s %d %d\r\n%s\r\n", k, flags, len(v), v)
	}
	gets := p.stats.UpstreamGets.Load()
	var wg sync.WaitGroup
	for c := range clients {
		lc := dial(t, addr)
		br := bufio.NewReader(lc)
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := fmt.Sprintf("own:%d", c)
			prev := "END\r\n"
			for i := range rounds {
				j := (c*7 + i) % shared
				sk, sv := fmt.Sprintf("j:%d", j), fmt.Sprintf("shared-%d", j)
				v := fmt.Sprintf("%d-%d", c, i)
				req := fmt.Sprintf("get %s\r\nset %s 5 0 %d\r\n%s\r\nget %s %s nothing:%d\r\ngets %s\r\nget %s\r\n",
					own, own, len(v), v, sk, own, i, sk, own)
				want := []string{
					prev,
					"STORED\r\n",
					value(sk, sv, 3) + value(own, v, 5) + "END\r\n",
					fmt.Sprintf("VALUE %s 3 %d %s\r\n%s\r\nEND\r\n", sk, len(sv), cas[j], sv),
					value(own, v, 5) + "END\r\n",
				}
				lc.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.WriteString(lc, req); err != nil {
					t.Error(err)
					return
				}
				for n, w := range want {
					got, err := readReply(br)
					if err != nil || got != w {
						t.Errorf("client %d, round %d, reply %d: %q (%v), want %q", c, i, n, got, err, w)
						return
					}
				}
				prev = value(own, v, 5) + "END\r\n"
			}
		}()
	}
	wg.Wait()
	// Each round sent four retrievals; without joining, each is a line.
	if n := p.stats.UpstreamGets.Load() - gets; n >= 4*clients*rounds {
		t.Errorf("%d get lines for %d retrievals: no get joined another", n, 4*clients*rounds)
	}
}

// TestEventLoopPipelinesBatches: a batch goes upstream while the one
// before it is still unanswered. The server below holds its reply to
// "get hold" until it has read the next line, which the loop writes only
// if it does not wait for that reply; each batch counts once in the
// server's requests.
func TestEventLoopPipelinesBatches(t *testing.T) {
	if loopMoveAlways.Load() {
		t.Skip("the two clients' batches must share one loop's connection")
	}
	held := make(chan struct{}, 1)
	fake, _ := fakeLineUpstream(t, func(c net.Conn, line string) bool {
		switch line {
		case "get hold\r\n":
			held <- struct{}{}
			return true // answered with the next line's reply
		case "get next\r\n":
			io.WriteString(c, "VALUE hold 0 1\r\nh\r\nEND\r\nVALUE next 0 1\r\nn\r\nEND\r\n")
		default:
			io.WriteString(c, "END\r\n")
		}
		return true
	})
	cfg := loopConfig(fake)
	cfg.Timeout = 10 * time.Second // the replies must come from the server, not a timeout
	p, addr := startProxy(t, cfg)
	if got := newLineClient(t, addr).do("get x\r\n"); got != "END\r\n" {
		t.Fatalf("get x answered %q", got)
	}
	before := p.Upstreams()[0].Requests
	a, b := newLineClient(t, addr), newLineClient(t, addr)
	for _, c := range []*lineClient{a, b} {
		c.c.SetDeadline(time.Now().Add(3 * time.Second))
	}
	if _, err := io.WriteString(a.c, "get hold\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(3 * time.Second):
		t.Fatal("get hold did not reach the server")
	}
	if _, err := io.WriteString(b.c, "get next\r\n"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c    *lineClient
		want string
	}{{a, "VALUE hold 0 1\r\nh\r\nEND\r\n"}, {b, "VALUE next 0 1\r\nn\r\nEND\r\n"}} {
		if got, err := readReply(tc.c.br); got != tc.want {
			t.Errorf("answered %q (%v), want %q: the second batch waited for the first", got, err, tc.want)
		}
	}
	if n := p.Upstreams()[0].Requests - before; n != 2 {
		t.Errorf("two batches counted as %d requests to the server", n)
	}
}

// TestEventLoopLongRepliesJoinNoGetLines has the loop read six clients'
// gets at once, as TestEventLoopJoinsGetsOfManyClients does, against
// memcached: gets of a short value join one get line, but once gets of a
// long value have come back long, the same six gets of it go upstream as
// six lines, so that no reply holds six long values.
func TestEventLoopLongRepliesJoinNoGetLines(t *testing.T) {
	mc := startMemcached(t)
	p, addr := startProxy(t, loopConfig(mc))
	long := strings.Repeat("v", 8*loopJoinReplyMax)
	c := newLineClient(t, addr)
	for k, v := range map[string]string{"short": "s", "long": long} {
		if got := c.do(fmt.Sprintf("set %s 0 0 %d\r\n%s\r\n", k, len(v), v)); got != "STORED\r\n" {
			t.Fatalf("set %s answered %q", k, got)
		}
	}
	for _, tc := range []struct {
		key, value string
		lines      func(n uint64) bool
	}{
		{"short", "s", func(n uint64) bool { return n < 6 }},
		{"long", long, func(n uint64) bool { return n == 6 }},
	} {
		want := fmt.Sprintf("VALUE %s 0 %d\r\n%s\r\nEND\r\n", tc.key, len(tc.value), tc.value)
		for range 4 { // what the loop has read lately
			if got := c.do("get " + tc.key + "\r\n"); got != want {
				t.Fatalf("get %s answered %d bytes, want %d", tc.key, len(got), len(want))
			}
		}
		gets := p.stats.UpstreamGets.Load()
		for i, got := range stalledGets(t, p, addr, slices.Repeat([]string{"get " + tc.key + "\r\n"}, 6)) {
			if got != want {
				t.Errorf("client %d: get %s answered %d bytes, want %d", i, tc.key, len(got), len(want))
			}
		}
		if n := p.stats.UpstreamGets.Load() - gets; !tc.lines(n) {
			t.Errorf("six gets of %s went upstream in %d get lines", tc.key, n)
		}
	}
}
