package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"mcsidecar/proxy/internal/chunks"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"mcsidecar/proxy/upstream"
)

// FuzzLoopReplyScan feeds upstream replies to the loop's scanner
// (upstream.ReplyScan) in pieces cut at arbitrary places: it must find the
// same end of the first reply, with the same bytes, and call it broken in
// the same cases, as when the reply arrives at once; and the VALUE headers
// it accepts must parse the same way as memcached writes them.
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
		var whole upstream.ReplyScan
		n1, done1, badAt := whole.Feed(data, req.want())
		bad1 := badAt != nil
		var parts upstream.ReplyScan
		n2, done2, bad2 := 0, false, false
		size := int(step%16) + 1
		for n2 < len(data) && !done2 && !bad2 {
			end := min(n2+size, len(data))
			took, done, badAt := parts.Feed(data[n2:end], req.want())
			done2, bad2 = done, badAt != nil
			n2 += took
			if took < end-(n2-took) && !done2 && !bad2 {
				t.Fatalf("took %d of a %d-byte piece without finishing", took, end-(n2-took))
			}
		}
		if bad1 != bad2 || !bad1 && (done1 != done2 || done1 && n1 != n2) {
			t.Fatalf("at once: took %d, whole %v, bad %v; in %d-byte pieces: took %d, whole %v, bad %v", n1, done1, bad1, size, n2, done2, bad2)
		}
		if done1 && !bytes.Equal(whole.Acc, parts.Acc) {
			t.Fatalf("the reply read at once %q differs from the one read in pieces %q", whole.Acc, parts.Acc)
		}
		if done1 && !bytes.Equal(whole.Acc, data[:n1]) {
			t.Fatalf("the reply %q is not the first %d bytes", whole.Acc, n1)
		}
		if done1 && !slices.Equal(whole.Vals, parts.Vals) {
			t.Fatalf("VALUE lines read at once %+v differ from those read in pieces %+v", whole.Vals, parts.Vals)
		}
		if done1 {
			// The VALUE blocks the scan noted follow one another from the
			// reply's start, each as its line says.
			at := 0
			for _, v := range whole.Vals {
				line := whole.Acc[v.At : v.At+v.Line]
				w, ok := wire.ParseValue(line)
				if v.At != at || !ok || !bytes.Equal(w.Key, v.KeyIn(whole.Acc)) || w.Flags != v.Flags || w.Size != v.Size || w.CAS != v.CAS || w.HasCAS != v.HasCAS {
					t.Fatalf("VALUE line noted as %+v at %d in %q", v, at, whole.Acc)
				}
				at = v.At + len(v.Block(whole.Acc))
			}
		}
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			if key, flags, size, cas, ok := wire.ParseValueLine(data[:i+1]); ok {
				if len(key) == 0 || bytes.IndexByte(key, ' ') >= 0 {
					t.Fatalf("header %q accepted with key %q", data[:i+1], key)
				}
				withCAS := bytes.Count(data[:i], []byte{' '}) == 4
				again := appendValueHeader(nil, key, flags, size, cas, withCAS)
				k2, f2, s2, c2, ok2 := wire.ParseValueLine(again)
				if !ok2 || !bytes.Equal(k2, key) || f2 != flags || s2 != size || c2 != cas {
					t.Fatalf("header %q parsed as %q %d %d %d, written back as %q", data[:i+1], key, flags, size, cas, again)
				}
			}
		}
	})
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

// TestReplyScanReadsLongValuesInPlace feeds a reply scan a long value the
// way the loop reads one: the header through evloop's buffer, then the value
// read straight into the room its connection gives, in uneven pieces, then the
// rest of the reply through evloop's buffer again. What it gathers is the
// reply, byte for byte; bytes that arrive elsewhere are copied, not taken
// as if they were in place.
func TestReplyScanReadsLongValuesInPlace(t *testing.T) {
	req := &loopReq{}
	upstreamOnLoop := func() *loopUpstream {
		return &loopUpstream{ls: &loopState{l: &eventLoops{p: &Proxy{stats: stats.New()}}}, sent: 1}
	}

	// The room leaves loopChunkRoom after the value's next bytes, however
	// much the chunk had: the value does not move for the END after it.
	tight := upstreamOnLoop()
	tight.takeChunk(0, 0)
	tight.scan.Acc = append(tight.scan.Acc, make([]byte, chunks.Size-loopDirectMin-2)...)
	tight.scan.Need = loopDirectMin
	if room := tight.room(); len(room) != loopDirectMin || cap(tight.scan.Acc)-len(tight.scan.Acc)-len(room) < loopChunkRoom {
		t.Fatalf("room of %d bytes leaves %d after it", len(room), cap(tight.scan.Acc)-len(tight.scan.Acc)-len(room))
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
		{"in place, longer than a kept chunk, after long replies", chunks.KeepMax + chunks.KeepMax/8, 7 * chunks.KeepMax / 8, nil, true},
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
			} else if n, whole, bad := r.Feed(data, req.want()); n != len(head) || whole || bad != nil {
				t.Fatalf("header: took %d, whole %v, bad %v", n, whole, bad)
			}
			rest := append(slices.Clone(value), "\r\n"...)
			for i := 0; len(rest) > 0; i++ {
				n := len(rest)
				if i < len(tc.pieces) {
					n = min(n, tc.pieces[i])
				}
				inPlace := direct(r)
				if r.Need >= loopDirectMin && inPlace != min(r.Need, loopDirectMax) || r.Need < loopDirectMin && inPlace != 0 {
					t.Fatalf("a direct read of %d bytes with %d to come", inPlace, r.Need)
				}
				if inPlace > 0 {
					n = min(n, inPlace)
				}
				data := read(rest[:n], tc.place)
				if len(data) != n {
					t.Fatalf("read %d: room of %d bytes for %d", i, len(data), n)
				}
				if got, whole, bad := r.Feed(data, req.want()); got != n || whole || bad != nil {
					t.Fatalf("read %d: took %d of %d, whole %v, bad %v", i, got, n, whole, bad)
				}
				u.adopt()
				rest = rest[n:]
			}
			array := &r.Acc[0]
			if n, whole, bad := r.Feed(read([]byte("END\r\n"), tc.place), req.want()); n != 5 || !whole || bad != nil {
				t.Fatalf("END: took %d, whole %v, bad %v", n, whole, bad)
			}
			if tc.place && &r.Acc[0] != array {
				t.Error("the END after a value read into place moved the reply to another array")
			}
			if string(r.Acc) != whole {
				t.Fatalf("gathered %d bytes, not the %d of the reply", len(r.Acc), len(whole))
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
	if p.stats.UpstreamReadsInPlace.Load() == 0 {
		t.Error("no value was read straight into place")
	}
}

// TestEventLoopValueLongerThanMemcachedHolds has a server announce a value
// longer than memcached can hold and send nothing more: the loop takes
// the reply as out of step at once, and does not wait for the bytes (the
// upstream timeout here is far longer than the client waits) nor make
// room for them.
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
			if n := p.stats.UpstreamReadsInPlace.Load(); n != 0 {
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
			size = loopChunkRoom + rng.IntN(chunks.Size) // long enough to cross a chunk's end
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
	// Set by a client of their own.
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
	// Each get on a client of its own.
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
		onLoops(func(ls *loopState) { n += ls.pool.Made() })
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
	if n := made() - before; n > chunks.KeepMax {
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
	if n := made() - before; n > chunks.Size {
		t.Errorf("chunks of %d bytes allocated for 3 gets of a %d-byte value after longer ones", n, values["short"])
	}
}

// TestLoopRetrievalBehindTimedOutReplyAskedAgain: a get pipelined on the
// loop's connection behind another client's get whose reply does not come
// in time is not that client's failure: when the timeout closes the
// connection, the get behind, whose reply had not begun, is asked again on
// a new one and answered, while the get that timed out misses.
func TestLoopRetrievalBehindTimedOutReplyAskedAgain(t *testing.T) {
	if loopMoveAlways.Load() {
		t.Skip("both gets must wait behind one loop's held connection")
	}
	relay := startHoldRelay(t, startMemcached(t))
	cfg := loopConfig(relay.addr)
	cfg.Timeout = 200 * time.Millisecond
	_, addr := startProxy(t, cfg)
	setup := newLineClient(t, addr)
	setup.do("set slow 0 0 1\r\ns\r\n")
	setup.do("set fast 0 0 1\r\nf\r\n")

	relay.holdReplies()
	a, b := dial(t, addr), dial(t, addr)
	io.WriteString(a, "get slow\r\n")
	if !relay.waitHeld("VALUE slow", false) {
		t.Fatal("memcached's reply to the first get never reached the relay")
	}
	io.WriteString(b, "get fast\r\n")
	if !relay.waitHeld("VALUE fast", false) {
		t.Fatal("the second get did not follow the first on its connection")
	}
	relay.mu.Lock()
	relay.replies = false // a new connection is not held
	relay.mu.Unlock()

	for _, c := range []struct {
		conn net.Conn
		want string
	}{{a, "END\r\n"}, {b, "VALUE fast 0 1\r\nf\r\nEND\r\n"}} {
		c.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, err := readReply(bufio.NewReader(c.conn))
		if err != nil || got != c.want {
			t.Errorf("got %q (%v), want %q", got, err, c.want)
		}
	}
}
