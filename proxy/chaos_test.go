package proxy

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestEventLoopSurvivesUpstreamResets serves an event loop over two zones
// whose servers reset one in ten of the proxy's connections just after
// passing on a chunk of reply, with the codec deleting damaged items, and
// envelopes damaged straight in memcached all the while: what the proxy
// writes after it handles a reply (the delete of a damaged item, a fill,
// a zone's next read) often fails on the spot. Checking clients pipeline gets,
// storage commands, deletes, incrs and noreply sets; a rude client
// pipelines and resets without reading; the loop is stalled now and then,
// so that much arrives in one pass. Misses and upstream errors are
// expected. The loop must not panic (that kills the test binary), each
// checking client must get a well-formed reply of the right kind to every
// request, in order, within 5 s, every hit must be for a key the get asked
// for and hold a value written for it, and once the chaos stops a new
// client is served normally.
//
// The load is light on purpose: a connection is then often idle when a
// reply comes, so what the proxy writes in answer goes out at once and can
// fail there, and a reply made too early goes straight to its client.
// Under heavy load both wait behind other requests, which hides mistakes
// such as a slot given back while its reply was still being made.
func TestEventLoopSurvivesUpstreamResets(t *testing.T) {
	const chaos = 3 * time.Second
	var permille atomic.Int32 // the servers' chance to reset, per chunk of reply
	permille.Store(100)
	var conns atomic.Uint64 // seeds each relayed connection's resets
	mcA, mcB := startMemcached(t), startMemcached(t)
	zoneA := []string{resettingRelay(t, mcA, &permille, &conns), resettingRelay(t, mcA, &permille, &conns)}
	zoneB := []string{resettingRelay(t, mcB, &permille, &conns), resettingRelay(t, mcB, &permille, &conns)}
	cfg := zonedConfig("a", zoneEntry("a", zoneA), zoneEntry("b", zoneB))
	cfg.EventLoops = 1
	cfg.Codec = codecConfig()
	cfg.Codec.DeleteCorrupt = true
	cfg.Timeout = 200 * time.Millisecond
	p, addr := startProxy(t, cfg)

	// P2: keys are enveloped, the others stored as they are. Each key has
	// a few values of its own, so a hit can be checked against the values
	// written for its key.
	var keys []string
	values := map[string][]string{}
	for i := range 12 {
		for _, k := range []string{"P2:k" + strconv.Itoa(i), "n" + strconv.Itoa(i)} {
			keys = append(keys, k)
			for v := range 3 {
				values[k] = append(values[k], fmt.Sprintf("%s/%d ", k, v)+strings.Repeat("postings 1234567 ", 20))
			}
		}
	}

	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var wg sync.WaitGroup
	// Deferred as well, so that a failure of the test goroutine stops the
	// clients before the proxy is shut down.
	stopChaos := sync.OnceFunc(func() {
		permille.Store(0)
		close(stop)
		wg.Wait()
	})
	defer stopChaos()
	for i := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(1, uint64(i)))
			for !stopped() {
				if err := checkingConn(addr, rng, "counter"+strconv.Itoa(i), keys, values); err != nil {
					t.Errorf("checking client %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(2, 0))
		for !stopped() {
			rudeConn(addr, rng, keys, values)
		}
	})
	wg.Go(func() {
		for !stopped() {
			time.Sleep(30 * time.Millisecond)
			stallLoop(t, p, 5*time.Millisecond)
		}
	})

	// Damages envelopes in place, so that gets find them and the proxy
	// deletes them on connections about to be reset. Only envelopes: the
	// codec finds their damage, while a plain value's is its data.
	direct := []*lineClient{newLineClient(t, mcA), newLineClient(t, mcB)}
	rng := rand.New(rand.NewPCG(3, 0))
	for end := time.Now().Add(chaos); time.Now().Before(end); time.Sleep(3 * time.Millisecond) {
		mc := direct[rng.IntN(len(direct))]
		k := "P2:k" + strconv.Itoa(rng.IntN(12))
		flags, data, ok := rawItem(t, mc, k)
		if !ok || flags&(1<<cfg.Codec.FlagBit) == 0 {
			continue
		}
		b := []byte(data)
		b[len(b)/2] ^= 1
		rawSet(t, mc, k, flags, string(b))
	}
	stopChaos()

	c := newLineClient(t, addr)
	value := strings.Repeat("after 1234567 ", 20)
	if got := c.do("set P2:after 7 0 " + strconv.Itoa(len(value)) + "\r\n" + value + "\r\n"); got != "STORED\r\n" {
		t.Fatalf("set after the resets answered %q", got)
	}
	want := "VALUE P2:after 7 " + strconv.Itoa(len(value)) + "\r\n" + value + "\r\nEND\r\n"
	if got := c.do("get P2:after\r\n"); got != want {
		t.Fatalf("get after the resets answered %q, want %q", short(got), short(want))
	}
}

// resettingRelay is an upstream that relays to the memcached at target and
// resets the proxy's connection just after passing on a chunk of reply,
// with a chance of permille in 1000.
func resettingRelay(t *testing.T, target string, permille *atomic.Int32, conns *atomic.Uint64) string {
	addr, _ := fakeUpstream(t, func(c net.Conn) {
		up, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		defer up.Close()
		go func() {
			io.Copy(up, c) // ends when c is closed
			up.Close()
		}()
		rng := rand.New(rand.NewPCG(4, conns.Add(1)))
		buf := make([]byte, 4096)
		for {
			n, err := up.Read(buf)
			if n > 0 {
				// The reset follows the chunk at once, so that it is often
				// there by the time the proxy has read the chunk.
				reset := rng.Int32N(1000) < permille.Load()
				if reset {
					c.(*net.TCPConn).SetLinger(0) // a reset, not a close
				}
				if _, err := c.Write(buf[:n]); err != nil || reset {
					c.Close()
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	return addr
}

// checkingConn is one client connection that sends 20 pipelined batches
// of requests and checks every reply, within 5 s each. It returns what was
// wrong, if anything. Each batch begins with a get of several keys: its
// reply is the first the client is owed, so it is written as soon as it
// is made, and a damaged key in it mostly has keys after it. One
// connection in four ends with a version, which moves it off the loop
// with replies still owed.
func checkingConn(addr string, rng *rand.Rand, counter string, keys []string, values map[string][]string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	br := bufio.NewReader(c)
	type request struct {
		cmd   string          // the command its reply must be a reply to
		asked map[string]bool // a get's keys
	}
	for batch := range 20 {
		var req strings.Builder
		var sent []request
		for i := range 1 + rng.IntN(8) {
			k := keys[rng.IntN(len(keys))]
			v := values[k][rng.IntN(len(values[k]))]
			n := rng.IntN(10)
			if i == 0 {
				n = 0
			}
			switch n {
			case 0, 1, 2:
				asked := map[string]bool{}
				req.WriteString("get")
				for range 3 + rng.IntN(4) {
					k := keys[rng.IntN(len(keys))]
					asked[k] = true
					req.WriteString(" " + k)
				}
				req.WriteString("\r\n")
				sent = append(sent, request{"get", asked})
			case 3, 4, 5:
				cmd := []string{"set", "add", "replace"}[n-3]
				fmt.Fprintf(&req, "%s %s 7 0 %d\r\n%s\r\n", cmd, k, len(v), v)
				sent = append(sent, request{cmd: cmd})
			case 6:
				fmt.Fprintf(&req, "delete %s\r\n", k)
				sent = append(sent, request{cmd: "delete"})
			case 7:
				fmt.Fprintf(&req, "set %s 0 0 1\r\n5\r\nincr %s 1\r\n", counter, counter)
				sent = append(sent, request{cmd: "set"}, request{cmd: "incr"})
			default:
				fmt.Fprintf(&req, "set %s 7 0 %d noreply\r\n%s\r\n", k, len(v), v)
			}
		}
		if batch == 19 && rng.IntN(4) == 0 {
			req.WriteString("version\r\n")
			sent = append(sent, request{cmd: "version"})
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, req.String()); err != nil {
			return fmt.Errorf("sending %q: %v", short(req.String()), err)
		}
		for i, r := range sent {
			c.SetDeadline(time.Now().Add(5 * time.Second))
			reply, err := readReply(br)
			if err != nil {
				return fmt.Errorf("reply %d (to %s) of %q: %v (read %q)", i, r.cmd, short(req.String()), err, short(reply))
			}
			if problem := badReply(r.cmd, r.asked, reply, values); problem != "" {
				return fmt.Errorf("reply %d (to %s) of %q is %q: %s", i, r.cmd, short(req.String()), short(reply), problem)
			}
		}
	}
	return nil
}

// badReply says what is wrong with reply as the reply to a cmd (and to a
// get of asked), or returns "". Any command may fail upstream.
func badReply(cmd string, asked map[string]bool, reply string, values map[string][]string) string {
	if strings.HasPrefix(reply, "SERVER_ERROR ") && strings.Count(reply, "\r\n") == 1 {
		return ""
	}
	switch cmd {
	case "get":
		for strings.HasPrefix(reply, "VALUE ") {
			head, rest, _ := strings.Cut(reply, "\r\n")
			f := strings.Fields(head) // readReply has read the value and two bytes more
			n, _ := strconv.Atoi(f[3])
			switch data := rest[:n]; {
			case rest[n:n+2] != "\r\n":
				return "a value not ended by CRLF"
			case !asked[f[1]]:
				return "a hit for a key not asked for"
			case f[2] != "7" || !slices.Contains(values[f[1]], data):
				return "a value never written for " + f[1]
			}
			reply = rest[n+2:]
		}
		if reply != "END\r\n" {
			return "not ended by END"
		}
	case "set":
		if reply != "STORED\r\n" {
			return "not a set's reply"
		}
	case "add", "replace":
		if reply != "STORED\r\n" && reply != "NOT_STORED\r\n" {
			return "not an " + cmd + "'s reply"
		}
	case "delete":
		if reply != "DELETED\r\n" && reply != "NOT_FOUND\r\n" {
			return "not a delete's reply"
		}
	case "incr":
		if _, err := strconv.ParseUint(strings.TrimSuffix(reply, "\r\n"), 10, 64); err != nil && reply != "NOT_FOUND\r\n" {
			return "not an incr's reply"
		}
	case "version":
		if !strings.HasPrefix(reply, "VERSION ") {
			return "not a version's reply"
		}
	}
	return ""
}

// rudeConn is one client connection that pipelines up to 8 gets and
// storage commands, maybe waits up to 3 ms, and resets without reading
// the replies.
func rudeConn(addr string, rng *rand.Rand, keys []string, values map[string][]string) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return
	}
	defer c.Close()
	var req strings.Builder
	for range 1 + rng.IntN(8) {
		k := keys[rng.IntN(len(keys))]
		v := values[k][rng.IntN(len(values[k]))]
		switch n := rng.IntN(4); n {
		case 0:
			fmt.Fprintf(&req, "get %s %s\r\n", k, keys[rng.IntN(len(keys))])
		default:
			fmt.Fprintf(&req, "%s %s 7 0 %d\r\n%s\r\n", []string{"set", "add", "replace"}[n-1], k, len(v), v)
		}
	}
	c.SetDeadline(time.Now().Add(time.Second))
	io.WriteString(c, req.String())
	if rng.IntN(2) == 0 {
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
	}
	c.(*net.TCPConn).SetLinger(0)
}
