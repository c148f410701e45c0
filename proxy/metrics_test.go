package proxy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// metricCommands and metricOutcomes are the label values the requests
// metric promises, written out here so that a change to them is a
// deliberate change to this test too.
var (
	metricCommands = []string{
		"get", "gets", "gat", "gats", "set", "add", "replace", "append", "prepend", "cas",
		"incr", "decr", "touch", "delete", "flush_all", "version", "verbosity", "stats", "quit",
		"mg", "ms", "md", "ma", "mn", "me", "unknown",
	}
	metricOutcomes = []string{
		"hit", "miss", "stored", "not_stored", "exists", "not_found", "client_error", "upstream_error", "ok",
	}
)

// requestsExposition is the whole mcsidecar_requests_total family in the
// text format: every command and outcome pair, at the count in nonzero
// ("command/outcome") or at zero.
func requestsExposition(nonzero map[string]int) string {
	var b strings.Builder
	b.WriteString("# HELP mcsidecar_requests_total Client requests by command and outcome.\n")
	b.WriteString("# TYPE mcsidecar_requests_total counter\n")
	for _, cmd := range metricCommands {
		for _, oc := range metricOutcomes {
			fmt.Fprintf(&b, "mcsidecar_requests_total{command=%q,outcome=%q} %d\n", cmd, oc, nonzero[cmd+"/"+oc])
		}
	}
	return b.String()
}

// TestMetricsCountRequestsByCommandAndOutcome sends a known sequence of
// requests through a proxy registered on a fresh registry and compares
// what it exports.
func TestMetricsCountRequestsByCommandAndOutcome(t *testing.T) {
	p, addr := startProxy(t, testConfig(startMemcached(t)))
	reg := registry(t, p)

	t.Run("every command and outcome pair is exported at zero", func(t *testing.T) {
		n, err := testutil.GatherAndCount(reg, "mcsidecar_requests_total")
		if err != nil {
			t.Fatal(err)
		}
		if want := len(metricCommands) * len(metricOutcomes); n != want {
			t.Errorf("mcsidecar_requests_total has %d series, want %d", n, want)
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(requestsExposition(nil)), "mcsidecar_requests_total"); err != nil {
			t.Error(err)
		}
	})

	c := newLineClient(t, addr)
	for _, step := range []struct{ req, want string }{
		{"set a 0 0 1\r\n1\r\n", "STORED\r\n"},
		{"get a\r\n", "VALUE a 0 1\r\n1\r\nEND\r\n"},
		{"get a b c\r\n", "VALUE a 0 1\r\n1\r\nEND\r\n"},
		{"gets b\r\n", "END\r\n"},
		{"gat 0 a\r\n", "VALUE a 0 1\r\n1\r\nEND\r\n"},
		{"add a 0 0 1\r\n2\r\n", "NOT_STORED\r\n"},
		{"cas a 0 0 1 999999\r\n3\r\n", "EXISTS\r\n"},
		{"delete zz\r\n", "NOT_FOUND\r\n"},
		{"delete a\r\n", "DELETED\r\n"},
		{"incr a x\r\n", "CLIENT_ERROR invalid numeric delta argument\r\n"},
		{"touch zz 0\r\n", "NOT_FOUND\r\n"},
		{"bogus\r\n", "ERROR\r\n"},
		{"version\r\n", "VERSION mcsidecar-test\r\n"},
		{"get " + key251 + "\r\n", "CLIENT_ERROR bad command line format\r\n"},
		{"ms m 1 T0\r\nx\r\n", "HD\r\n"},
		{"md zz\r\n", "NF\r\n"},
		{"ma m\r\n", "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"},
		{"mn\r\n", "MN\r\n"},
		{"me zz\r\n", "EN\r\n"},
		{"mg m zz\r\n", "CLIENT_ERROR invalid flag\r\n"},
	} {
		if got := c.do(step.req); got != step.want {
			t.Fatalf("%q answered %q, want %q", short(step.req), got, step.want)
		}
	}

	t.Run("requests by command and outcome", func(t *testing.T) {
		want := requestsExposition(map[string]int{
			"set/stored":           1,
			"get/ok":               2,
			"get/client_error":     1,
			"gets/ok":              1,
			"gat/ok":               1,
			"add/not_stored":       1,
			"cas/exists":           1,
			"delete/not_found":     1,
			"delete/ok":            1,
			"incr/client_error":    1,
			"touch/not_found":      1,
			"unknown/client_error": 1,
			"version/ok":           1,
			"ms/stored":            1,
			"md/not_found":         1,
			"ma/client_error":      1,
			"mn/ok":                1,
			"me/miss":              1,
			"mg/client_error":      1,
		})
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "mcsidecar_requests_total"); err != nil {
			t.Error(err)
		}
	})

	t.Run("retrieved keys by result", func(t *testing.T) {
		// get a: a; get a b c: a, b, c; gets b: b; gat 0 a: a.
		const want = `
# HELP mcsidecar_retrieved_keys_total Keys asked for by retrieval commands, by result.
# TYPE mcsidecar_retrieved_keys_total counter
mcsidecar_retrieved_keys_total{result="hit"} 3
mcsidecar_retrieved_keys_total{result="miss"} 3
`
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "mcsidecar_retrieved_keys_total"); err != nil {
			t.Error(err)
		}
	})

	t.Run("client connections follow open connections", func(t *testing.T) {
		connections := func(n int) string {
			return fmt.Sprintf(`
# HELP mcsidecar_client_connections Client connections open now.
# TYPE mcsidecar_client_connections gauge
mcsidecar_client_connections %d
`, n)
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(connections(1)), "mcsidecar_client_connections"); err != nil {
			t.Error(err)
		}
		second := newLineClient(t, addr)
		second.do("version\r\n") // the proxy has accepted it once it answers
		if err := testutil.GatherAndCompare(reg, strings.NewReader(connections(2)), "mcsidecar_client_connections"); err != nil {
			t.Error(err)
		}
		second.c.Close()
		c.c.Close()
		// The proxy notices a closed connection on its next read.
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := testutil.GatherAndCompare(reg, strings.NewReader(connections(0)), "mcsidecar_client_connections")
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("5s after every client left: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// TestMetricsCountUpstreamFailures sends a set and a get to a proxy whose
// only upstream is down: both count as requests that met an upstream
// error, the get's key as a miss (what the client saw), and the upstream
// requests as failed connects, one each: a request is sent again only when
// a pooled connection turns out broken, never after a connect failed.
func TestMetricsCountUpstreamFailures(t *testing.T) {
	up := deadUpstream(t)
	cfg := testConfig(up)
	cfg.ConnectTimeout = 100 * time.Millisecond
	p, addr := startProxy(t, cfg)
	reg := registry(t, p)
	c := newLineClient(t, addr)
	if got := c.do("set k 0 0 1\r\nv\r\n"); got != "SERVER_ERROR upstream unavailable\r\n" {
		t.Fatalf("set answered %q", got)
	}
	if got := c.do("get k\r\n"); got != "END\r\n" {
		t.Fatalf("get answered %q", got)
	}
	want := requestsExposition(map[string]int{"set/upstream_error": 1, "get/upstream_error": 1}) + `
# HELP mcsidecar_retrieved_keys_total Keys asked for by retrieval commands, by result.
# TYPE mcsidecar_retrieved_keys_total counter
mcsidecar_retrieved_keys_total{result="hit"} 0
mcsidecar_retrieved_keys_total{result="miss"} 1
# HELP mcsidecar_upstream_errors_total Upstream requests that failed, by server and kind: connect, timeout, connection (broken), server_error, protocol, ejected (not sent: the server is ejected).
# TYPE mcsidecar_upstream_errors_total counter
` + upstreamErrorsExposition(map[string]int{up + "/connect": 2}, up) + `
# HELP mcsidecar_upstream_requests_total Requests sent to upstream servers, by server; a batch of requests of many clients, written together, counts once.
# TYPE mcsidecar_upstream_requests_total counter
mcsidecar_upstream_requests_total{server="` + up + `"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"mcsidecar_requests_total", "mcsidecar_retrieved_keys_total", "mcsidecar_upstream_errors_total", "mcsidecar_upstream_requests_total"); err != nil {
		t.Error(err)
	}
}

// upstreamErrorsExposition is the samples of mcsidecar_upstream_errors_total
// for servers, every kind at the count in nonzero ("server/kind") or zero.
func upstreamErrorsExposition(nonzero map[string]int, servers ...string) string {
	var b strings.Builder
	for _, srv := range servers {
		for _, kind := range []string{"connect", "timeout", "connection", "server_error", "protocol", "ejected"} {
			fmt.Fprintf(&b, "mcsidecar_upstream_errors_total{kind=%q,server=%q} %d\n", kind, srv, nonzero[srv+"/"+kind])
		}
	}
	return b.String()
}
