package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestEventLoopHalfCloseGetsEveryReply pipelines 2,000 gets of a 16 KiB
// value and does not read until evloop holds replies the socket did not
// take, then ends its side of the connection and reads everything: the
// loop answers every request read before the end, on the loop, and closes
// once all is written, as memcached does.
func TestEventLoopHalfCloseGetsEveryReply(t *testing.T) {
	_, addr := startProxy(t, loopConfig(startMemcached(t)))
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
}

// TestEventLoopStopsTakingRequestsOfAClientThatReadsNone sends gets of a
// 16 KiB value for 3 s as fast as the proxy takes them, without reading,
// and without --idle-timeout: the requests the loop cannot answer yet must
// not pile up without end (the loop stops reading the client's socket, and
// keeps the client), and the client must then get its replies, whole and
// in order.
func TestEventLoopStopsTakingRequestsOfAClientThatReadsNone(t *testing.T) {
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
	if p.stats.ClientReadPauses.Load() == 0 {
		t.Error("the loop never stopped reading the client")
	}
}

// TestEventLoopHalfCloseAfterEveryReplyMade sends gets one at a time,
// reading nothing, until the loop owes no reply and evloop holds more than
// 32 KiB of them, then ends its side: with nothing owed and nothing
// unread, the connection stays until evloop has written what it holds.
func TestEventLoopHalfCloseAfterEveryReplyMade(t *testing.T) {
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
	// Requests held back while replies were owed are handled after
	// those are written, outside a read: each byte counts once all the
	// same.
	if got := p.stats.BytesRead.Load(); got != uint64(b.Len()) {
		t.Errorf("bytes read: %d, the client sent %d", got, b.Len())
	}
}

// TestShutdownEndsClientsThatReadNothing lets Shutdown's grace run out on
// clients of the loop that read nothing: one not read after sending more
// than the loop lets wait, and one owed replies after a half-close. Every
// connection must be gone soon after, none left waiting for a loop that
// stopped or for a client that does not read.
func TestShutdownEndsClientsThatReadNothing(t *testing.T) {
	cases := map[string]func(t *testing.T, p *Proxy, c net.Conn){
		"requests piled up": func(t *testing.T, p *Proxy, c net.Conn) {
			sendGetsUnread(t, c, func() bool { return p.stats.ClientReadPauses.Load() > 0 })
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
			if !waitFor(3*time.Second, func() bool { return p.stats.CurrConns.Load() == 0 }) {
				t.Errorf("%d connections left 3 s after the grace", p.stats.CurrConns.Load())
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

// TestEventLoopAnswersOddLinesItself: lines memcached reads without the
// '\r' or cut at a NUL, a line it will not frame, an HTTP request and a
// quit while evloop holds replies are answered on the loop, byte for byte
// as memcached answers them, and no connection leaves it.
func TestEventLoopAnswersOddLinesItself(t *testing.T) {
	mc := startMemcached(t)
	_, addr := startProxy(t, loopConfig(mc))
	exchange(t, addr, "set odd 0 0 3\r\nabc\r\n")
	for _, chunks := range [][]string{
		{"get odd\n", "gets odd\x00ignored\r\n", "set odd2 0 0 1\nx\r\nget odd2\n"},
		{"verbosity 1\x00 2\r\n", "get odd\r\n", "get " + strings.Repeat("k", 300) + "\n"},
		{"get odd\r\n", "set " + strings.Repeat("x", 3000)},
		{"get odd\r\n", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"set odd3 0 0 1\r\nv\r\nGET / HTTP/1.1\r\n"},
		{"get odd\r\nquit\r\nget odd\r\n"},
		// Values over the size limit, their blocks in one read and in
		// many: refused, the old value gone, the block dropped.
		{"set odd 0 0 2000000\r\n" + strings.Repeat("y", 2000000) + "\r\nget odd\r\n"},
		{"set odd4 0 0 1\r\nv\r\n", "set odd4 0 0 1048577 noreply\r\n" + strings.Repeat("y", 5000),
			strings.Repeat("z", 1048577-5000) + "\r\nget odd4\r\n", "add odd4 0 0 3000000\r\n", strings.Repeat("w", 3000002), "get odd4\r\n"},
	} {
		want := exchange(t, mc, chunks...)
		if got := exchange(t, addr, chunks...); got != want {
			t.Errorf("%.60q: proxy answered %.200q, memcached %.200q", chunks, got, want)
		}
	}

	// quit after a reply too long for the socket: evloop holds the rest,
	// written before the connection closes.
	want := setBig(t, addr, 900<<10)
	c := dialSmallWindow(t, addr)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "get big\r\nquit\r\n")
	time.Sleep(100 * time.Millisecond) // the loop answers while nothing is read
	if got, err := io.ReadAll(c); err != nil || string(got) != want {
		t.Errorf("get then quit: %d bytes (%v), want the %d of the reply, then the end", len(got), err, len(want))
	}
}

// TestEventLoopAnswersGatItself: gat and gats are answered on the loop,
// byte for byte as memcached answers them: hits, misses and repeats, an
// exptime that expires the item at once, a key refused after keys that
// are touched, no keys, a bad exptime, and the new time to live read back.
func TestEventLoopAnswersGatItself(t *testing.T) {
	mc := startMemcached(t)
	_, addr := startProxy(t, loopConfig(mc))
	const setup = "set ga 1 0 1\r\nA\r\nset gb 2 0 2\r\nBB\r\n"
	long := strings.Repeat("k", 251)
	for _, chunks := range [][]string{
		{setup, "gat 100 ga gb gc ga\r\n", "gats 100 gb\r\n", "mg ga t v\r\n"},
		{setup, "gat -1 ga ga gb\r\n", "get ga gb\r\n"},
		{setup, "gat 0 gb " + long + " ga\r\n", "mg gb t\r\n", "mg ga t\r\n"},
		{setup, "gat 10\r\n", "gat x ga\r\n", "gats\r\n", "gat 10 " + long + "\r\n"},
		{setup, "gat 100 ga\r\nget gb\r\ngat 200 gb\r\ngets ga\r\n"},
	} {
		// The sets of each run give the items CAS values of their own.
		cas := regexp.MustCompile(`(?m)^(VALUE \S+ \d+ \d+) \d+\r$`)
		want := cas.ReplaceAllString(exchange(t, mc, chunks...), "$1 CAS\r")
		if got := cas.ReplaceAllString(exchange(t, addr, chunks...), "$1 CAS\r"); got != want {
			t.Errorf("%.80q: proxy answered %q, memcached %q", chunks, got, want)
		}
	}
}
