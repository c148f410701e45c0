package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestEventLoopSlowReaderGetsEveryReply pipelines 400 gets of a 16 KiB
// value, 6.4 MiB of replies, and reads them slowly: the loop holds replies
// back while evloop holds more than loopOutMax of them, and must go on by
// itself once the client has read, answering every get in order, on the
// loop.
func TestEventLoopSlowReaderGetsEveryReply(t *testing.T) {
	_, addr := startProxy(t, loopConfig(startMemcached(t)))
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
}

// TestEventLoopHeldClientThatLeavesIsGone sends gets of a 16 KiB value
// until the loop holds the client's replies back, then closes without
// reading any: the connection must go, with nothing left waiting for
// replies no one will write.
func TestEventLoopHeldClientThatLeavesIsGone(t *testing.T) {
	_, addr := startProxy(t, loopConfig(startMemcached(t)))
	want := setBig(t, addr, 16<<10)
	probe := newLineClient(t, addr)
	// setBig's client has closed, but the proxy may not have seen it go
	// yet (the portable poller learns of it from a goroutine): count
	// from when the probe is the only client.
	const baseline = 1
	waitStat(t, probe, "curr_connections", func(v uint64) bool { return v == baseline })

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

// TestEventLoopLongRepliesInOrder gets a 900 KiB value, longer than the
// loop copies at a time, many times over sockets that do not take it at
// once: one get at a time, pipelined and read slowly, and pipelined and
// read in bursts. Replies the loop holds back and replies it gives a part
// at a time must all arrive, whole and in order, with the reply of a
// version after them, and no connection leaves the loop.
func TestEventLoopLongRepliesInOrder(t *testing.T) {
	cfg := loopConfig(startMemcached(t))
	cfg.Timeout = 10 * time.Second // 54 MB of replies, under the race detector too
	p, addr := startProxy(t, cfg)
	want := setBig(t, addr, 900<<10)
	// Most of a 900 KB value's rest is read straight into place.
	defer func() {
		if p.stats.UpstreamReadsInPlace.Load() == 0 {
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
