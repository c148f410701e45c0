package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spf13/pflag"
)

// The clients that read nothing in the tests below: how many, how many
// gets of a long value each pipelines, the values' length, and the
// --max-client-output-bytes they run with.
const (
	unreadClients = 50
	unreadGets    = 20
	unreadValue   = 900_000
	unreadLimit   = 1 << 20
)

// TestUnreadRepliesStayWithinTheOutputLimit has 50 clients each pipeline
// 20 gets of 900 KB values and read none of the replies (18 MB each),
// after another client read short values, and then one more client gets
// the long values and reads them. What the
// proxy holds for the 50 must stay within 50 times
// --max-client-output-bytes and a fixed allowance: the live heap, and the
// event loop's own count of what its clients are owed, at its highest.
// The reading client gets every value, whole.
func TestUnreadRepliesStayWithinTheOutputLimit(t *testing.T) {
	up := startMemcached(t, "-I", "2m")
	cfg := testConfig(up)
	cfg.MaxItemSize = 2 << 20
	cfg.MaxClientOutput = unreadLimit
	cfg.Timeout = 10 * time.Second // every reply comes: none is given up as a miss
	p, addr := startProxy(t, cfg)
	wants := setValues(t, addr, unreadValue)
	// A client that reads short values first: what it is owed
	// says nothing of what the others ask for.
	short := newLineClient(t, addr)
	short.do("set short 0 0 2\r\nhi\r\n")
	for range 10 {
		if got := short.do("get short\r\n"); got != "VALUE short 0 2\r\nhi\r\nEND\r\n" {
			t.Fatalf("get short answered %q", got)
		}
	}
	base := liveHeap()

	for range unreadClients {
		c := dialSmallWindow(t, addr)
		var req strings.Builder
		for i := range unreadGets {
			fmt.Fprintf(&req, "get v%d\r\n", i%len(wants))
		}
		if _, err := io.WriteString(c, req.String()); err != nil {
			t.Fatal(err)
		}
	}
	// Until memcached has written no more for a second than its
	// own stats (a minute at most), the proxy's live heap at its
	// highest.
	mc := newLineClient(t, up)
	top := liveHeap()
	sent, still := mc.stat("bytes_written"), 0
	for deadline := time.Now().Add(time.Minute); still < 5 && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		top = max(top, liveHeap())
		n := mc.stat("bytes_written")
		if n-sent > 64<<10 {
			still = 0
		} else {
			still++
		}
		sent = n
	}
	t.Logf("memcached answered %d gets of the %d sent, %d MB; live heap at most %d MB over %d MB before",
		mc.stat("get_hits"), unreadClients*unreadGets, sent>>20, (top-base)>>20, base>>20)
	if bound := uint64(2*unreadClients*unreadLimit + 64<<20); top-base > bound {
		t.Errorf("the live heap grew by %d MB with %d clients that read nothing, over %d MB (twice --max-client-output-bytes each, and 64 MB)",
			(top-base)>>20, unreadClients, bound>>20)
	}
	p.mu.Lock()
	l := p.loops
	p.mu.Unlock()
	peak := l.outputPeak()
	t.Logf("the loop's clients were owed %d KB at most", peak>>10)
	if bound := (unreadClients + 1) * unreadLimit; peak > bound {
		t.Errorf("the loop's clients were owed %d KB at once, over %d KB (--max-client-output-bytes each)", peak>>10, bound>>10)
	}

	// A client that reads its replies gets them all.
	c := dial(t, addr)
	br := bufio.NewReader(c)
	for i := range 8 {
		want := wants[i%len(wants)]
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := fmt.Fprintf(c, "get v%d\r\n", i%len(wants)); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(want))
		if _, err := io.ReadFull(br, got); err != nil || string(got) != want {
			t.Fatalf("get %d of a client that reads: %.40q (%v)", i, got, err)
		}
	}
}

// TestUnreadRepliesCloseAtIdleTimeout has three clients pipeline gets,
// more than their sockets take, and read nothing: each is closed once its replies have waited on it for
// --idle-timeout, counted in mcsidecar_client_output_limit_closed_total
// (and as an idle kick), and a client that reads meanwhile is not: with
// gets of 16 KB values, and of 900 KB ones.
func TestUnreadRepliesCloseAtIdleTimeout(t *testing.T) {
	for _, tc := range []struct {
		name       string
		size, gets int
	}{
		{"short values", 16 << 10, 200},
		{"long values", unreadValue, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startMemcached(t, "-I", "2m")
			cfg := testConfig(up)
			cfg.MaxItemSize = 2 << 20
			cfg.MaxClientOutput = unreadLimit
			cfg.IdleTimeout = 2 * time.Second // long enough for the reading client on a busy machine
			cfg.Timeout = 10 * time.Second    // the reading client's gets are not given up as misses
			p, addr := startProxy(t, cfg)
			reg := registry(t, p)
			if err := testutil.GatherAndCompare(reg, strings.NewReader(unreadClosed(0)), "mcsidecar_client_output_limit_closed_total"); err != nil {
				t.Error(err)
			}
			wants := setValues(t, up, tc.size) // straight to memcached: the proxy would close a slow setter
			var unread []net.Conn
			for range 3 {
				c := dialSmallWindow(t, addr)
				if _, err := io.WriteString(c, strings.Repeat("get v0 v1 v2 v3\r\n", tc.gets)); err != nil {
					t.Fatal(err)
				}
				unread = append(unread, c)
			}
			// Meanwhile a client that reads gets a value every tenth of
			// the idle timeout.
			reader := dial(t, addr)
			br := bufio.NewReader(reader)
			for deadline := time.Now().Add(30 * time.Second); p.stats.ConnsOutputClosed.Load() < 3 && time.Now().Before(deadline); {
				reader.SetDeadline(time.Now().Add(30 * time.Second))
				time.Sleep(cfg.IdleTimeout / 10)
				if _, err := io.WriteString(reader, "get v1\r\n"); err != nil {
					t.Fatalf("the client that reads: %v", err)
				}
				got := make([]byte, len(wants[1]))
				if _, err := io.ReadFull(br, got); err != nil || string(got) != wants[1] {
					t.Fatalf("the client that reads got %.40q (%v)", got, err)
				}
			}
			if err := testutil.GatherAndCompare(reg, strings.NewReader(unreadClosed(3)), "mcsidecar_client_output_limit_closed_total"); err != nil {
				t.Error(err)
			}
			// Closed: reading on ends, after what the sockets held, in an
			// end of stream or a reset.
			for i, c := range unread {
				c.SetDeadline(time.Now().Add(30 * time.Second))
				if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
					t.Errorf("client %d that read nothing: %v, want its connection closed", i, err)
				}
			}
		})
	}
}

// unreadClosed is the exposition of mcsidecar_client_output_limit_closed_total at n.
func unreadClosed(n int) string {
	return fmt.Sprintf(`
# HELP mcsidecar_client_output_limit_closed_total Client connections closed after --idle-timeout with replies they had not read waiting in the proxy: held by an event loop (at --max-client-output-bytes, or for a socket that took no more). Counted in the idle closes too.
# TYPE mcsidecar_client_output_limit_closed_total counter
mcsidecar_client_output_limit_closed_total %d
`, n)
}

// setValues stores four values of size bytes, v0 to v3, at addr (the
// proxy, or memcached), and returns the reply to a get of each.
func setValues(tb testing.TB, addr string, size int) []string {
	tb.Helper()
	c := newLineClient(tb, addr)
	defer c.c.Close()
	wants := make([]string, 4)
	for i := range wants {
		v := strings.Repeat(string(rune('a'+i)), size)
		if got := c.do(fmt.Sprintf("set v%d 0 0 %d\r\n%s\r\n", i, len(v), v)); got != "STORED\r\n" {
			tb.Fatalf("set v%d answered %q", i, got)
		}
		wants[i] = fmt.Sprintf("VALUE v%d 0 %d\r\n%s\r\nEND\r\n", i, len(v), v)
	}
	return wants
}

// liveHeap returns the bytes of the heap that a collection leaves.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestMaxClientOutputFlag: --max-client-output-bytes defaults to 4 MiB,
// takes memcached's size suffixes, and a Config that leaves it 0 gets the
// default; a negative one is refused.
func TestMaxClientOutputFlag(t *testing.T) {
	fs := pflag.NewFlagSet("proxy", pflag.ContinueOnError)
	var cfg Config
	cfg.RegisterFlags(fs)
	if cfg.MaxClientOutput != 4<<20 {
		t.Errorf("--max-client-output-bytes defaults to %d", cfg.MaxClientOutput)
	}
	if err := fs.Parse([]string{"--max-client-output-bytes=2m"}); err != nil || cfg.maxClientOutput() != 2<<20 {
		t.Errorf("--max-client-output-bytes=2m: %d (%v)", cfg.maxClientOutput(), err)
	}
	cfg = testConfig("127.0.0.1:11211")
	if got := cfg.maxClientOutput(); got != defaultMaxClientOutput {
		t.Errorf("a Config without a limit has %d", got)
	}
	cfg.MaxClientOutput = -1
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--max-client-output-bytes") {
		t.Errorf("a negative limit: Validate() = %v", err)
	}
}
