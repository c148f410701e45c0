package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"mcsidecar/proxy/internal/wire"
	"mcsidecar/proxy/stats"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

var parseRequests = []struct {
	name, req string
}{
	{"get 1 key", "get P2:tenant-1:01HZ0000000000000000000000:bmFtZTp2YWx1ZQ\r\n"},
	{"get 100 keys", "get " + strings.TrimSpace(strings.Repeat("S:tenant-1:01HZ0000000000000000000000:123456 ", 100)) + "\r\n"},
	{"set", "set S:tenant-1:01HZ0000000000000000000000:123456 0 604800 16\r\n0123456789abcdef\r\n"},
}

// parseOne frames and parses one request, as the loop does with the
// bytes a read brought: its line, and a storage command's data block.
func parseOne(req []byte, words [][]byte) ([][]byte, error) {
	i := bytes.IndexByte(req, '\n')
	if i < 0 {
		return words, fmt.Errorf("no line in %q", req)
	}
	line := wire.CommandLine(req[:i])
	cmd, words, v := wire.ParseLine(words, line)
	if v != wire.VerdictRun {
		return words, fmt.Errorf("verdict %d for %q", v, line)
	}
	if cmd.ID == wire.CmdSet {
		a := wire.ParseStoreArgs(words, false)
		if !a.OK || len(req)-(i+1) < a.Vlen+2 {
			return words, fmt.Errorf("bad set %q", req)
		}
	}
	return words, nil
}

// BenchmarkParse measures framing and parsing one request out of a
// pipelined stream: the per-request work the proxy does before it talks to
// any upstream. It must not allocate.
func BenchmarkParse(b *testing.B) {
	for _, r := range parseRequests {
		b.Run(r.name, func(b *testing.B) {
			req := []byte(r.req)
			words := make([][]byte, 0, wire.MaxTokens)
			b.ReportAllocs()
			b.SetBytes(int64(len(r.req)))
			for b.Loop() {
				var err error
				if words, err = parseOne(req, words); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestParsingAllocatesNothing(t *testing.T) {
	for _, r := range parseRequests {
		req := []byte(r.req)
		words := make([][]byte, 0, wire.MaxTokens)
		// Warm up: the 100-key line grows words once.
		for range 3 {
			words, _ = parseOne(req, words)
		}
		allocs := testing.AllocsPerRun(1000, func() {
			var err error
			if words, err = parseOne(req, words); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %.1f allocations per request, want 0", r.name, allocs)
		}
	}
}

// rawClient speaks the text protocol directly, so end-to-end benchmarks
// measure the servers and not a client library.
type rawClient struct {
	c  net.Conn
	rw *bufio.ReadWriter
}

func newRawClient(tb testing.TB, addr string) *rawClient {
	c := dial(tb, addr)
	return &rawClient{c: c, rw: bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))}
}

// roundTrip sends req and reads until the reply's last line, which starts
// with end.
func (rc *rawClient) roundTrip(req []byte, end string) error {
	if _, err := rc.rw.Write(req); err != nil {
		return err
	}
	if err := rc.rw.Flush(); err != nil {
		return err
	}
	for {
		line, err := rc.rw.ReadSlice('\n')
		if err != nil {
			return err
		}
		if strings.HasPrefix(string(line), end) {
			return nil
		}
		if strings.HasPrefix(string(line), "VALUE ") {
			var key string
			var flags, size int
			if _, err := fmt.Sscanf(string(line), "VALUE %s %d %d", &key, &flags, &size); err != nil {
				return err
			}
			if _, err := rc.rw.Discard(size + 2); err != nil {
				return err
			}
			continue
		}
		if strings.HasPrefix(string(line), "VA ") { // a meta get's value
			var size int
			if _, err := fmt.Sscanf(string(line), "VA %d", &size); err != nil {
				return err
			}
			if _, err := rc.rw.Discard(size + 2); err != nil {
				return err
			}
			continue
		}
		return fmt.Errorf("unexpected reply %q", line)
	}
}

// BenchmarkEndToEnd runs the same get and set calls straight to memcached
// and through the proxy in one run, so their ratio is measured on the same
// machine state. "parallel" drives 32 connections at once, where the
// proxy's coalescing of gets matters.
func BenchmarkEndToEnd(b *testing.B) {
	mc := startMemcached(b)
	_, px := startProxy(b, testConfig(mc))
	value := strings.Repeat("v", 1024)
	setReq := []byte("set bench:key 0 0 1024\r\n" + value + "\r\n")
	getReq := []byte("get bench:key\r\n")
	if err := newRawClient(b, mc).roundTrip(setReq, "STORED"); err != nil {
		b.Fatal(err)
	}
	for _, target := range []struct{ name, addr string }{{"memcached", mc}, {"proxy", px}} {
		for _, op := range []struct {
			name, end string
			req       []byte
		}{{"get", "END", getReq}, {"set", "STORED", setReq}} {
			b.Run(op.name+"/"+target.name, func(b *testing.B) { benchRoundTrips(b, target.addr, op.req, op.end) })
			b.Run(op.name+"/parallel/"+target.name, func(b *testing.B) { benchParallel(b, target.addr, op.req, op.end) })
		}
	}
}

// BenchmarkEndToEndTransformed is BenchmarkEndToEnd for what the sidecar
// transforms: a postings value (enveloped, compressed) and a long Mimir
// key (rewritten, its value enveloped and bound), each got and set over
// 32 connections.
func BenchmarkEndToEndTransformed(b *testing.B) {
	mc := startMemcached(b)
	_, px := startProxy(b, keyspaceConfig(mc))
	value := strings.Repeat("postings 1234567 ", 240) // 4 KiB that compress
	for _, key := range []struct{ name, key string }{{"postings", "P2:team-a:" + testBlock + ":am9iOmFwaQ"}, {"long-key", mimirLV2Key()}} {
		setReq := []byte("set " + key.key + " 0 0 " + strconv.Itoa(len(value)) + "\r\n" + value + "\r\n")
		getReq := []byte("get " + key.key + "\r\n")
		if err := newRawClient(b, px).roundTrip(setReq, "STORED"); err != nil {
			b.Fatal(err)
		}
		for _, target := range []struct{ name, addr string }{{"proxy", px}} {
			for _, op := range []struct {
				name, end string
				req       []byte
			}{{"get", "END", getReq}, {"set", "STORED", setReq}} {
				b.Run(key.name+"/"+op.name+"/"+target.name, func(b *testing.B) { benchParallel(b, target.addr, op.req, op.end) })
			}
		}
	}
}

// benchParallel sends req to addr b.N times over 32 connections on 2
// cores, each reply read up to its line starting with end.
func benchParallel(b *testing.B, addr string, req []byte, end string) {
	b.ReportAllocs()
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		rc := newRawClient(b, addr)
		for pb.Next() {
			if err := rc.roundTrip(req, end); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// benchRoundTrips sends req to addr b.N times on one connection, each
// reply read up to its line starting with end.
func benchRoundTrips(b *testing.B, addr string, req []byte, end string) {
	rc := newRawClient(b, addr)
	b.ReportAllocs()
	for b.Loop() {
		if err := rc.roundTrip(req, end); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTenantCounters measures what the per-tenant view adds to each
// key of a request: finding the key's tenant through the key schemes and
// its counters in the table, for a tenant with a slot (the common case)
// and for one folded into "other" (the sketch, under a mutex).
func BenchmarkTenantCounters(b *testing.B) {
	cfg := keyspaceConfig("127.0.0.1:1")
	p, err := New(cfg, "bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer p.closeServers()
	p.tenants = stats.NewTenants(1)
	c := &conn{p: p}
	hot := []byte("P2:team-hot:" + testBlock + ":am9iOmFwaQ")
	cold := []byte("P2:team-cold:" + testBlock + ":am9iOmFwaQ")
	p.tenants.Counters(c.resolve(hot, needTenant).tenant) // takes the one slot
	for _, bc := range []struct {
		name string
		key  []byte
	}{{"tenant with a slot", hot}, {"tenant in other", cold}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p.tenants.Counters(c.resolve(bc.key, needTenant).tenant).Requests.Add(1)
			}
		})
	}
	// The keys of a 100-key get of one tenant, as the loop finds them.
	long := []byte("P2:" + strings.Repeat("t", 150) + ":" + testBlock + ":am9iOmFwaQ")
	p.tenants.Counters(c.resolve(long, needTenant).tenant)
	b.Run("100 keys of one tenant", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var run stats.TenantRun
			for range 100 {
				run.Counters(p.tenants, c.resolve(long, needTenant).tenant)
			}
			run.End()
		}
	})
}

// BenchmarkLatencyObserve measures what timing a request costs on the
// request path: two clock reads and one histogram observation, as
// dispatch does for every command.
func BenchmarkLatencyObserve(b *testing.B) {
	st := stats.New()
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		st.Latency[wire.CmdGet].Observe(time.Since(start).Seconds())
	}
}
