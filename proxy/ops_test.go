package proxy

import (
	"bufio"
	"bytes"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// histogramCounts returns the sample count of every series of a histogram
// family, by the value of its one label.
func histogramCounts(t *testing.T, reg *prometheus.Registry, name string) map[string]uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		if mf.GetType() != dto.MetricType_HISTOGRAM {
			t.Fatalf("%s is a %v, want a histogram", name, mf.GetType())
		}
		for _, m := range mf.GetMetric() {
			out[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
		}
	}
	return out
}

func TestRequestLatencyIsObservedOncePerRequestByCommand(t *testing.T) {
	up := startMemcached(t)
	p, addr := startProxy(t, testConfig(up))
	reg := registry(t, p)
	counts := histogramCounts(t, reg, "mcsidecar_request_duration_seconds")
	if len(counts) != len(metricCommands) {
		t.Fatalf("%d command series before any request, want %d: %v", len(counts), len(metricCommands), counts)
	}
	c := newLineClient(t, addr)
	c.do("set a 0 0 1\r\n1\r\n")
	for range 3 {
		c.do("get a b\r\n")
	}
	c.do("version\r\n")
	// A request is timed once its reply is handed to the socket, so the
	// client may read the last reply a moment before it is counted.
	waitFor(2*time.Second, func() bool {
		return histogramCounts(t, reg, "mcsidecar_request_duration_seconds")["version"] > 0
	})
	counts = histogramCounts(t, reg, "mcsidecar_request_duration_seconds")
	for _, cmd := range metricCommands {
		want := map[string]uint64{"set": 1, "get": 3, "version": 1}[cmd]
		if counts[cmd] != want {
			t.Errorf("command %s: %d observations, want %d", cmd, counts[cmd], want)
		}
	}
	// The set and the three gets went upstream: four requests, each timed.
	if got := histogramCounts(t, reg, "mcsidecar_upstream_request_duration_seconds")[up]; got != 4 {
		t.Errorf("upstream latency has %d observations for %s, want 4", got, up)
	}
}

// answerEveryLine is a fake upstream that reads request lines (and the
// data line after a storage command) and answers each with reply.
func answerEveryLine(reply string) func(net.Conn) {
	return func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if strings.HasPrefix(line, "set ") {
				if _, err := br.ReadString('\n'); err != nil {
					return
				}
			}
			if _, err := c.Write([]byte(reply)); err != nil {
				return
			}
		}
	}
}

func TestUpstreamErrorsAreCountedByServerAndKind(t *testing.T) {
	serverError, _ := fakeUpstream(t, answerEveryLine("SERVER_ERROR out of memory storing object\r\n"))
	garbage, _ := fakeUpstream(t, answerEveryLine("HELLO\r\n"))
	stuck, _ := stuckUpstream(t)
	dead := deadUpstream(t)
	for _, tc := range []struct{ name, up, kind string }{
		{"server error reply", serverError, "server_error"},
		{"unreadable reply", garbage, "protocol"},
		{"no answer", stuck, "timeout"},
		{"nobody listening", dead, "connect"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(tc.up)
			cfg.Timeout = 200 * time.Millisecond
			cfg.ConnectTimeout = 200 * time.Millisecond
			p, addr := startProxy(t, cfg)
			reg := registry(t, p)
			c := newLineClient(t, addr)
			if got := c.do("get k\r\n"); got != "END\r\n" {
				t.Fatalf("get answered %q", got)
			}
			want := "# HELP mcsidecar_upstream_errors_total Upstream requests that failed, by server and kind: connect, timeout, connection (broken), server_error, protocol, ejected (not sent: the server is ejected).\n" +
				"# TYPE mcsidecar_upstream_errors_total counter\n" +
				upstreamErrorsExposition(map[string]int{tc.up + "/" + tc.kind: 1}, tc.up)
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "mcsidecar_upstream_errors_total"); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestUpstreamRequestsAreCountedPerServerFromZero(t *testing.T) {
	a, b := startMemcached(t), startMemcached(t)
	p, addr := startProxy(t, testConfig(a, b))
	reg := registry(t, p)
	const head = "# HELP mcsidecar_upstream_requests_total Requests sent to upstream servers, by server; a batch of requests of many clients, written together, counts once.\n" +
		"# TYPE mcsidecar_upstream_requests_total counter\n"
	zero := head + "mcsidecar_upstream_requests_total{server=\"" + a + "\"} 0\n" +
		"mcsidecar_upstream_requests_total{server=\"" + b + "\"} 0\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(zero), "mcsidecar_upstream_requests_total"); err != nil {
		t.Fatal(err)
	}
	// flush_all goes to every server once.
	if got := newLineClient(t, addr).do("flush_all\r\n"); got != "OK\r\n" {
		t.Fatalf("flush_all answered %q", got)
	}
	one := strings.ReplaceAll(zero, "} 0\n", "} 1\n")
	if err := testutil.GatherAndCompare(reg, strings.NewReader(one), "mcsidecar_upstream_requests_total"); err != nil {
		t.Error(err)
	}
}

func TestRefusedConnectionsAreExported(t *testing.T) {
	p, _ := startProxy(t, testConfig(deadUpstream(t)))
	reg := registry(t, p)
	// The connection limit counts here; this test checks the export.
	p.stats.ConnsRefused.Add(2)
	const want = `
# HELP mcsidecar_client_connections_refused_total Client connections closed at accept because the proxy was at --max-connections.
# TYPE mcsidecar_client_connections_refused_total counter
mcsidecar_client_connections_refused_total 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "mcsidecar_client_connections_refused_total"); err != nil {
		t.Error(err)
	}
}

// tenantsExposition is the three per-tenant families for the given
// tenants, each as "requests/hits/bytes", and the count of tenants folded
// into other.
func tenantsExposition(rows map[string][3]int, folded int) string {
	var b strings.Builder
	for i, fam := range []struct{ name, help string }{
		{"mcsidecar_tenant_requests_total", "Keys asked for or stored, by the tenant their key scheme names."},
		{"mcsidecar_tenant_hits_total", "Keys asked for and found, by tenant."},
		{"mcsidecar_tenant_written_bytes_total", "Bytes of values stored upstream (as memcached holds them), by tenant."},
	} {
		b.WriteString("# HELP " + fam.name + " " + fam.help + " The busiest --metrics-tenants tenants have their own series, the rest are counted as tenant=\"other\";" +
			" a tenant ID over 150 bytes, not valid UTF-8, holding '~' or named other is labelled with its first bytes, '~' and 12 hex digits of its SHA-256.\n")
		b.WriteString("# TYPE " + fam.name + " counter\n")
		for tenant, r := range rows {
			b.WriteString(fam.name + "{tenant=\"" + tenant + "\"} " + strconv.Itoa(r[i]) + "\n")
		}
	}
	b.WriteString("# HELP mcsidecar_tenants_folded_total Tenants whose series were folded into tenant=\"other\": at a scrape, a tenant with a series of its own" +
		" that made fewer requests since the previous scrape than a tenant without one gives it its place, and its totals are added to other.\n")
	b.WriteString("# TYPE mcsidecar_tenants_folded_total counter\n")
	b.WriteString("mcsidecar_tenants_folded_total " + strconv.Itoa(folded) + "\n")
	return b.String()
}

func TestPerTenantMetricsKeepTheBusiestTenants(t *testing.T) {
	cfg := keyspaceConfig(startMemcached(t))
	cfg.MetricsTenants = 2
	p, addr := startProxy(t, cfg)
	reg := registry(t, p)
	key := func(tenant string) string { return "S:" + tenant + ":" + testBlock + ":1" }
	families := []string{"mcsidecar_tenant_requests_total", "mcsidecar_tenant_hits_total", "mcsidecar_tenant_written_bytes_total", "mcsidecar_tenants_folded_total"}
	c := newLineClient(t, addr)
	do := func(req, want string) {
		t.Helper()
		if got := c.do(req); got != want {
			t.Fatalf("%q answered %q, want %q", short(req), got, want)
		}
	}
	do("set "+key("team-a")+" 0 0 5\r\nhello\r\n", "STORED\r\n")
	do("get "+key("team-a")+"\r\n", "VALUE "+key("team-a")+" 0 5\r\nhello\r\nEND\r\n")
	do("get "+key("team-b")+"\r\n", "END\r\n")
	do("get "+key("team-c")+"\r\n", "END\r\n")
	do("get P:"+testBlock+":"+testHash43+"\r\n", "END\r\n") // Thanos: no tenant

	t.Run("the first tenants take the slots, the next counts as other", func(t *testing.T) {
		want := tenantsExposition(map[string][3]int{"team-a": {2, 1, 5}, "team-b": {1, 0, 0}, "other": {1, 0, 0}}, 0)
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), families...); err != nil {
			t.Error(err)
		}
	})
	for range 5 {
		do("get "+key("team-c")+"\r\n", "END\r\n")
	}
	for range 2 {
		do("get "+key("team-b")+"\r\n", "END\r\n")
	}
	t.Run("a busier tenant is still other until the scrape", func(t *testing.T) {
		want := tenantsExposition(map[string][3]int{"team-a": {2, 1, 5}, "team-b": {3, 0, 0}, "other": {6, 0, 0}}, 0)
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), families...); err != nil {
			t.Error(err)
		}
	})
	t.Run("then takes the quietest tenant's slot, whose totals fold into other, and is counted", func(t *testing.T) {
		want := tenantsExposition(map[string][3]int{"team-b": {3, 0, 0}, "team-c": {0, 0, 0}, "other": {8, 1, 5}}, 1)
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), families...); err != nil {
			t.Error(err)
		}
	})
}

// statLine matches one line of a stats reply as memcached tooling parses it.
var statLine = regexp.MustCompile(`^STAT [a-z_0-9]+ [^ \r\n]+\r$`)

func statsOf(t *testing.T, c *lineClient) map[string]string {
	t.Helper()
	reply := c.do("stats\r\n")
	out := map[string]string{}
	lines := strings.SplitAfter(reply, "\n")
	for _, l := range lines[:len(lines)-2] {
		if !statLine.MatchString(strings.TrimSuffix(l, "\n")) {
			t.Fatalf("stats line %q is not STAT <name> <value>", l)
		}
		f := strings.Fields(l)
		out[f[1]] = f[2]
	}
	if lines[len(lines)-2] != "END\r\n" {
		t.Fatalf("stats reply ends %q", lines[len(lines)-2])
	}
	return out
}

func TestStatsAnswersTheProxyCountersAndResetLeavesMetricsAlone(t *testing.T) {
	up := startMemcached(t)
	p, addr := startProxy(t, keyspaceConfig(up))
	reg := registry(t, p)
	c := newLineClient(t, addr)
	long := "S:" + testTenant("a", 240) + ":" + testBlock + ":1"
	if got := c.do("set " + long + " 0 0 2\r\nhi\r\n"); got != "STORED\r\n" {
		t.Fatalf("set of a long key answered %q", got)
	}
	tooLong := strings.Repeat("k", keysConfig().MaxClientLength+1)
	if got := c.do("get " + tooLong + "\r\n"); got != "CLIENT_ERROR bad command line format\r\n" {
		t.Fatalf("get of a key over the maximum answered %q", got)
	}
	st := statsOf(t, c)
	for name, want := range map[string]string{
		"key_rewrites": "1", "key_rejected_too_long": "1", "key_rejected_empty": "0", "key_unbound_items": "0",
		"codec_verification_failures_checksum_mismatch": "0", "codec_deleted": "0", "rejected_connections": "0",
		"upstream_errors": "0", "curr_connections": "1",
	} {
		if st[name] != want {
			t.Errorf("STAT %s %q, want %q", name, st[name], want)
		}
	}
	if st["codec_written_logical_bytes"] != "2" || st["codec_written_stored_bytes"] == "0" {
		t.Errorf("codec bytes: logical %s stored %s, want 2 and more than 0", st["codec_written_logical_bytes"], st["codec_written_stored_bytes"])
	}
	if got := c.do("stats reset\r\n"); got != "RESET\r\n" {
		t.Fatalf("stats reset answered %q", got)
	}
	if st := statsOf(t, c); st["key_rewrites"] != "0" || st["key_rejected_too_long"] != "0" || st["codec_written_logical_bytes"] != "0" {
		t.Errorf("after stats reset: key_rewrites %s, key_rejected_too_long %s, codec_written_logical_bytes %s, want 0",
			st["key_rewrites"], st["key_rejected_too_long"], st["codec_written_logical_bytes"])
	}
	const want = `
# HELP mcsidecar_key_rejected_total Client keys refused with CLIENT_ERROR, by reason.
# TYPE mcsidecar_key_rejected_total counter
mcsidecar_key_rejected_total{reason="bad_byte"} 0
mcsidecar_key_rejected_total{reason="empty"} 0
mcsidecar_key_rejected_total{reason="too_long"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "mcsidecar_key_rejected_total"); err != nil {
		t.Errorf("Prometheus counters went back with stats reset: %v", err)
	}
}

// syncBuffer is a log destination that tests read while the proxy writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startLoggedProxy serves cfg with a proxy that logs to the returned
// buffer, at debug level.
func startLoggedProxy(t *testing.T, cfg Config) (string, *syncBuffer) {
	t.Helper()
	var logs syncBuffer
	_, addr, _ := serveProxyLog(t, cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	return addr, &logs
}

func TestUpstreamStateChangesAreLoggedOnceNotPerRequest(t *testing.T) {
	up, kill := startKillableMemcached(t)
	cfg := testConfig(up)
	cfg.ConnectTimeout = 200 * time.Millisecond
	addr, logs := startLoggedProxy(t, cfg)
	c := newLineClient(t, addr)
	for range 3 {
		c.do("get a\r\n")
	}
	kill()
	for range 5 {
		c.do("get a\r\n")
		c.do("set a 0 0 1\r\n1\r\n")
	}
	if _, ok := runMemcached(t, up); !ok {
		t.Skip("could not restart memcached on the same port")
	}
	for range 3 {
		c.do("get a\r\n")
	}
	got := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(got) != 2 || !strings.Contains(got[0], `msg="upstream failing"`) || !strings.Contains(got[0], "kind=connect") ||
		!strings.Contains(got[1], `msg="upstream answers again"`) {
		t.Errorf("logs:\n%s\nwant one line when the server failed and one when it came back", logs.String())
	}
}

func TestAConnectionErrorIsLoggedOnceAndACleanCloseNotAtAll(t *testing.T) {
	addr, logs := startLoggedProxy(t, testConfig(startMemcached(t)))
	// A client that leaves, by quit or by closing, is no error.
	if got := exchange(t, addr, "set a 0 0 1\r\n1\r\nget a\r\nquit\r\n"); got != "STORED\r\nVALUE a 0 1\r\n1\r\nEND\r\n" {
		t.Fatalf("answered %q", got)
	}
	exchange(t, addr, "get a\r\n")
	// 4 KiB with no end of line breaks memcached's framing: the
	// connection is closed.
	exchange(t, addr, "set "+strings.Repeat("k", 4096))
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "request line too long") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(got) != 1 || !strings.Contains(got[0], `level=WARN msg="client connection closed"`) || !strings.Contains(got[0], "request line too long") {
		t.Errorf("logs:\n%s\nwant one warning for the connection that broke framing", logs.String())
	}
}

// counterValue returns the value of a counter family with no labels.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

func TestEnvelopedBytesAreCountedAsClientsSeeThemAndAsMemcachedHoldsThem(t *testing.T) {
	p, addr := startProxy(t, keyspaceConfig(startMemcached(t)))
	reg := registry(t, p)
	c := newLineClient(t, addr)
	// A postings key: its value is enveloped and, being repetitive,
	// compressed.
	key := "P2:team-a:" + testBlock + ":am9iOmFwaQ"
	value := strings.Repeat("postings ", 200)
	if got := c.do("set " + key + " 0 0 " + strconv.Itoa(len(value)) + "\r\n" + value + "\r\n"); got != "STORED\r\n" {
		t.Fatalf("set answered %q", got)
	}
	for range 2 {
		if got := c.do("get " + key + "\r\n"); got != "VALUE "+key+" 0 "+strconv.Itoa(len(value))+"\r\n"+value+"\r\nEND\r\n" {
			t.Fatalf("get answered %q", short(got))
		}
	}
	n := float64(len(value))
	written, stored := counterValue(t, reg, "mcsidecar_codec_written_logical_bytes_total"), counterValue(t, reg, "mcsidecar_codec_written_stored_bytes_total")
	read, readStored := counterValue(t, reg, "mcsidecar_codec_read_logical_bytes_total"), counterValue(t, reg, "mcsidecar_codec_read_stored_bytes_total")
	if written != n || read != 2*n {
		t.Errorf("logical bytes: written %v, read %v; want %v and %v", written, read, n, 2*n)
	}
	if stored <= 0 || stored >= n/2 || readStored != 2*stored {
		t.Errorf("stored bytes: written %v, read %v; want under half of %v, and read twice what was written", stored, readStored, n)
	}
}
