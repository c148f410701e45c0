package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"mcsidecar/proxy/memcachedtest"
)

// sidecar is the whole command, run in the test process.
type sidecar struct {
	listen, metrics string
	logs            *bytes.Buffer
}

// startSidecar runs the command with args against upstream until the test
// ends, and checks then that it stopped cleanly. An empty upstream gives
// no --upstream, for args that name the servers (--upstream-zone).
//
// Its ports were free a moment before; another test package running at the
// same time may take one first. The command then fails at once to listen,
// and is started again on other ports.
func startSidecar(t *testing.T, upstream string, args ...string) sidecar {
	t.Helper()
	for attempt := 1; ; attempt++ {
		s, err := trySidecar(t, upstream, args...)
		if err == nil {
			return s
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 3 {
			t.Fatalf("run: %v", err)
		}
	}
}

// trySidecar is one attempt of startSidecar: it returns run's error when
// run returns before it listens.
func trySidecar(t *testing.T, upstream string, args ...string) (sidecar, error) {
	t.Helper()
	addrs := memcachedtest.FreeAddrs(t, 2)
	s := sidecar{listen: addrs[0], metrics: addrs[1], logs: &bytes.Buffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var mu sync.Mutex
	out := writerFunc(func(b []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return s.logs.Write(b) })
	flags := []string{"--listen=" + s.listen, "--metrics-listen=" + s.metrics,
		"--upstream-timeout=300ms", "--upstream-connect-timeout=300ms", "--shutdown-grace=5s"}
	if upstream != "" {
		flags = append(flags, "--upstream="+upstream)
	}
	go func() {
		done <- run(ctx, append(flags, args...), out, out)
	}()
	for deadline := time.Now().Add(10 * time.Second); !dialable(s.metrics) || !dialable(s.listen); {
		select {
		case err := <-done:
			cancel()
			if err == nil {
				err = errors.New("returned before it listened")
			}
			return s, err
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("the sidecar does not accept connections on %s and %s", s.listen, s.metrics)
		}
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("run did not return 10s after its context ended")
		}
	})
	return s, nil
}

// dialable reports whether addr accepts a connection.
func dialable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// get fetches an HTTP path of the sidecar.
func (s sidecar) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + s.metrics + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// do sends one memcached request and reads the reply up to want's length.
func (s sidecar) do(t *testing.T, req string) string {
	t.Helper()
	c, err := net.Dial("tcp", s.listen)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, req+"quit\r\n")
	b, _ := io.ReadAll(c)
	return string(b)
}

// scrape returns the families of /metrics, parsed.
func (s sidecar) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := s.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// sampleNames returns every sample name a scrape holds: a histogram
// family X has X_bucket, X_sum and X_count.
func sampleNames(mfs map[string]*dto.MetricFamily) map[string]bool {
	names := map[string]bool{}
	for name, mf := range mfs {
		names[name] = true
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		}
	}
	return names
}

// startBusySidecar runs the sidecar against a real memcached and sends it
// some traffic, so every family has samples.
func startBusySidecar(t *testing.T) sidecar {
	t.Helper()
	return busy(t, startSidecar(t, memcachedtest.Start(t)))
}

// busy sends a sidecar a set and a get of a key, and a get of a key no
// server has.
func busy(t *testing.T, s sidecar) sidecar {
	t.Helper()
	key := "S:team-a:01HZX3K5R9W1V8Q2N4M6P7T0AB:1"
	if got := s.do(t, "set "+key+" 0 0 2\r\nhi\r\nget "+key+" nope\r\n"); !strings.HasPrefix(got, "STORED\r\nVALUE ") {
		t.Fatalf("set and get answered %q", got)
	}
	return s
}

// zoneOnlyKey is a key that startBusyZonedSidecar stores in zone-b only.
const zoneOnlyKey = "S:team-a:01HZX3K5R9W1V8Q2N4M6P7T0AB:2"

// startBusyZonedSidecar runs the sidecar, with a local tier, in zone-a of two zones, each a
// real memcached, and sends it the traffic of startBusySidecar, which
// reaches both zones, and a get of a key that only zone-b has, which is
// read across zones and filled into zone-a. So the families exported only
// with zones have samples too.
func startBusyZonedSidecar(t *testing.T) sidecar {
	t.Helper()
	a, b := memcachedtest.Start(t), memcachedtest.Start(t)
	s := startSidecar(t, "", "--zone=zone-a", "--upstream-zone=zone-a="+a, "--upstream-zone=zone-b="+b, "--local-cache-size=16m")
	busy(t, s)
	// Straight to zone-b's memcached, past the sidecar.
	zoneB := sidecar{listen: b}
	if got := zoneB.do(t, "set "+zoneOnlyKey+" 0 0 2\r\nho\r\n"); got != "STORED\r\n" {
		t.Fatalf("zone-b's memcached answered the set %q", got)
	}
	if got, want := s.do(t, "get "+zoneOnlyKey+"\r\n"), "VALUE "+zoneOnlyKey+" 0 2\r\nho\r\nEND\r\n"; got != want {
		t.Fatalf("get of a key only zone-b has answered %q, want %q", got, want)
	}
	// The fill goes out after the reply, and is counted once zone-a
	// answers it: wait for that, for a while.
	stored := map[string]string{"result": "stored"}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if n, _ := counterValue(s.scrape(t), "mcsidecar_zone_fills_total", stored); n > 0 {
			break
		}
	}
	return s
}

// exportedNames returns the sample names that the dashboard and the alert
// rules may use: those of a busy sidecar without zones and with them.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	names := sampleNames(startBusySidecar(t).scrape(t))
	for n := range sampleNames(startBusyZonedSidecar(t).scrape(t)) {
		names[n] = true
	}
	return names
}

func TestMetricsEndpointExportsWhatOperatorsNeed(t *testing.T) {
	s := startBusySidecar(t)
	mfs := s.scrape(t)
	for _, name := range []string{
		"mcsidecar_requests_total", "mcsidecar_request_duration_seconds",
		"mcsidecar_upstream_requests_total", "mcsidecar_upstream_errors_total", "mcsidecar_upstream_request_duration_seconds",
		"mcsidecar_client_connections", "mcsidecar_client_connections_accepted_total", "mcsidecar_client_connections_refused_total",
		"mcsidecar_key_rewrites_total", "mcsidecar_key_rejected_total", "mcsidecar_codec_verification_failures_total",
		"mcsidecar_codec_written_logical_bytes_total", "mcsidecar_codec_written_stored_bytes_total",
		"mcsidecar_tenant_requests_total", "mcsidecar_tenant_hits_total", "mcsidecar_tenant_written_bytes_total",
		"mcsidecar_build_info",
	} {
		if mfs[name] == nil {
			t.Errorf("/metrics has no %s", name)
		}
	}
	bi := mfs["mcsidecar_build_info"]
	if bi == nil || len(bi.GetMetric()) != 1 || bi.GetMetric()[0].GetGauge().GetValue() != 1 {
		t.Fatalf("mcsidecar_build_info: %v", bi)
	}
	labels := map[string]string{}
	for _, l := range bi.GetMetric()[0].GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["version"] != version || labels["goversion"] != runtime.Version() {
		t.Errorf("build info labels %v, want version %s and goversion %s", labels, version, runtime.Version())
	}
	for _, m := range mfs["mcsidecar_tenant_requests_total"].GetMetric() {
		if m.GetLabel()[0].GetValue() == "team-a" && m.GetCounter().GetValue() != 2 {
			t.Errorf("team-a made 2 requests, the metric says %v", m.GetCounter().GetValue())
		}
	}

	// The zone families are exported with zones only.
	zoneFamilies := []string{"mcsidecar_zone_reads_total", "mcsidecar_zone_read_bytes_total",
		"mcsidecar_zone_fills_total", "mcsidecar_zone_write_failures_total"}
	for _, name := range zoneFamilies {
		if mfs[name] != nil {
			t.Errorf("/metrics without zones has %s", name)
		}
	}
	zmfs := startBusyZonedSidecar(t).scrape(t)
	for _, name := range zoneFamilies {
		if zmfs[name] == nil {
			t.Errorf("/metrics with zones has no %s", name)
		}
	}
	// The key that only zone-b had was a hit there, its 2 bytes read across
	// zones, and was filled into zone-a; every write reached both zones.
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"mcsidecar_zone_reads_total", map[string]string{"zone": "zone-b", "local": "false", "result": "hit"}, 1},
		{"mcsidecar_zone_read_bytes_total", map[string]string{"zone": "zone-b", "local": "false"}, 2},
		{"mcsidecar_zone_fills_total", map[string]string{"result": "stored"}, 1},
		{"mcsidecar_zone_write_failures_total", map[string]string{"zone": "zone-a"}, 0},
		{"mcsidecar_zone_write_failures_total", map[string]string{"zone": "zone-b"}, 0},
	} {
		if got, ok := counterValue(zmfs, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (exported: %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
}

// counterValue returns the value of the counter of family name whose
// labels are labels, and whether there is one.
func counterValue(mfs map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	for _, m := range mfs[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		if maps.Equal(have, labels) {
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// TestProfilesAndTrace fetches a CPU profile and an execution trace of a
// tenth of a second from the metrics listener: what an operator takes to
// see where a latency tail comes from.
func TestProfilesAndTrace(t *testing.T) {
	s := startBusySidecar(t)
	code, body := s.get(t, "/debug/pprof/trace?seconds=0.1")
	if code != http.StatusOK || !strings.HasPrefix(body, "go 1.") {
		t.Errorf("/debug/pprof/trace: %d, %d bytes starting %q, want 200 and an execution trace", code, len(body), body[:min(len(body), 16)])
	}
	if code, body := s.get(t, "/debug/pprof/profile?seconds=1"); code != http.StatusOK || len(body) == 0 {
		t.Errorf("/debug/pprof/profile: %d, %d bytes", code, len(body))
	}
	if code, body := s.get(t, "/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/: %d %q", code, body)
	}
}

func TestHealthReadinessAndStatusPage(t *testing.T) {
	s := startBusySidecar(t)
	if code, body := s.get(t, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := s.get(t, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz with memcached up: %d %q", code, body)
	}
	code, page := s.get(t, "/")
	if code != http.StatusOK {
		t.Fatalf("/: %d", code)
	}
	for _, want := range []string{version, `href="/metrics"`, `href="/healthz"`, `href="/readyz"`, "<td>yes</td>"} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q:\n%s", want, page)
		}
	}
	if code, _ := s.get(t, "/nosuch"); code != http.StatusNotFound {
		t.Errorf("/nosuch: %d, want 404", code)
	}
	if strings.Contains(page, "<th>zone</th>") {
		t.Errorf("status page without zones has a zone column:\n%s", page)
	}

	zoned := startBusyZonedSidecar(t)
	if code, body := zoned.get(t, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz with zones and memcached up: %d %q", code, body)
	}
	_, page = zoned.get(t, "/")
	for _, want := range []string{"<th>zone</th>", "<td>zone-a (local)</td>", "<td>zone-b</td>"} {
		if !strings.Contains(page, want) {
			t.Errorf("status page with zones lacks %q:\n%s", want, page)
		}
	}

	down := startSidecar(t, memcachedtest.FreeAddr(t))
	if code, body := down.get(t, "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz with no upstream: %d %q, want 503", code, body)
	}
	if code, body := down.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with no upstream: %d %q, want 200: the process is alive", code, body)
	}
	if _, page := down.get(t, "/"); !strings.Contains(page, "<td>no: ") {
		t.Errorf("status page does not show the upstream down:\n%s", page)
	}
}

// metricName finds the metric names in a PromQL expression: identifiers
// that name a series, not functions, keywords, labels or durations.
var metricName = regexp.MustCompile(`\b[a-z_:][a-z0-9_:]*\b`)

// promqlWords are the words of the expressions in configs/ that are not
// metric names.
var promqlWords = map[string]bool{
	"sum": true, "min": true, "or": true, "by": true, "rate": true, "topk": true, "count": true, "histogram_quantile": true,
	"le": true, "instance": true, "server": true, "kind": true, "reason": true, "outcome": true, "command": true,
	"result": true, "scheme": true, "step": true, "tenant": true, "version": true, "goversion": true, "zone": true, "local": true,
	"connect": true, "timeout": true, "connection": true, "upstream_error": true, "hit": true, "get": true, "gets": true,
	"m": true, "__rate_interval": true, "label_values": true,
}

// metricsIn returns the metric names of a PromQL expression, after
// dropping quoted strings and Grafana variables.
func metricsIn(expr string) []string {
	expr = regexp.MustCompile(`"[^"]*"|\$\w+|\[[^\]]*\]`).ReplaceAllString(expr, " ")
	var names []string
	for _, w := range metricName.FindAllString(expr, -1) {
		if !promqlWords[w] {
			names = append(names, w)
		}
	}
	return names
}

func TestDashboardQueriesUseOnlyExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("../../configs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "definition") {
					exprs = append(exprs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(dash)
	if len(exprs) < 10 {
		t.Fatalf("the dashboard has %d queries", len(exprs))
	}
	names := exportedNames(t)
	for _, e := range exprs {
		used := metricsIn(e)
		if len(used) == 0 {
			t.Errorf("query names no metric: %s", e)
		}
		for _, n := range used {
			if !names[n] {
				t.Errorf("query uses %s, which /metrics does not export: %s", n, e)
			}
		}
	}
}

func TestAlertRulesUseOnlyExportedMetricsAndPassPromtool(t *testing.T) {
	const file = "../../configs/prometheus-alerts.yaml"
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Expr, For string
				Labels           map[string]string
				Annotations      map[string]string
			}
		}
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatal(err)
	}
	names := exportedNames(t)
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("%s: want a severity label and a summary", r.Alert)
			}
			used := metricsIn(r.Expr)
			if len(used) == 0 {
				t.Errorf("%s names no metric", r.Alert)
			}
			for _, n := range used {
				if !names[n] {
					t.Errorf("%s uses %s, which /metrics does not export", r.Alert, n)
				}
			}
		}
	}
	for _, want := range []string{"McsidecarUpstreamDown", "McsidecarVerificationFailures", "McsidecarKeyRejections", "McsidecarHighErrorRatio", "McsidecarZoneWriteFailures"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s", want)
		}
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian: apt-get install prometheus); the rules were parsed and their metrics checked")
	}
	if out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules: %v\n%s", err, out)
	}
}

// slowUpstream answers every get with a miss after delay, like a memcached
// under load, so a request can be caught in flight.
func slowUpstream(t *testing.T, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					if strings.HasPrefix(line, "get") { // get or gets
						time.Sleep(delay)
						io.WriteString(c, "VALUE k 0 2\r\nhi\r\nEND\r\n")
					} else if strings.HasPrefix(line, "version") {
						io.WriteString(c, "VERSION 1.6.18\r\n")
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// TestSIGTERMFinishesTheRequestInFlightAndExitsZero runs the real binary,
// sends it SIGTERM while a get waits on a slow upstream, and checks that
// the get is answered, a new connection is refused, and the process exits
// 0 well within its grace period.
func TestSIGTERMFinishesTheRequestInFlightAndExitsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), program)
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	const delay = 700 * time.Millisecond
	up := slowUpstream(t, delay)
	addrs := memcachedtest.FreeAddrs(t, 2)
	listen, metrics := addrs[0], addrs[1]
	cmd := exec.Command(bin, "--listen="+listen, "--metrics-listen="+metrics, "--upstream="+up,
		"--upstream-timeout=5s", "--shutdown-grace=10s", "--log-format=json")
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// exited closes when the process has exited, with its result in waitErr.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	memcachedtest.WaitDial(t, listen)

	c, err := net.Dial("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "get k\r\n")
	time.Sleep(delay / 4) // the get is now waiting on the upstream
	sent := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The value proves the reply came from the upstream, not from a
	// failure served as a miss.
	reply := make([]byte, len("VALUE k 0 2\r\nhi\r\nEND\r\n"))
	if _, err := io.ReadFull(c, reply); err != nil || string(reply) != "VALUE k 0 2\r\nhi\r\nEND\r\n" {
		t.Fatalf("the get in flight got %q, %v; want the upstream's value", reply, err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("exit: %v\n%s", waitErr, logs.String())
		}
	case <-time.After(8 * time.Second):
		t.Fatalf("still running 8s after SIGTERM, with nothing in flight\n%s", logs.String())
	}
	t.Logf("exited %v after SIGTERM", time.Since(sent).Round(time.Millisecond))
	if nc, err := net.DialTimeout("tcp", listen, time.Second); err == nil {
		nc.Close()
		t.Errorf("a connection was accepted after the process exited")
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", l, err)
		}
		lines = append(lines, m)
	}
	var msgs []string
	for _, m := range lines {
		msgs = append(msgs, m["msg"].(string))
	}
	if !slices.Equal(msgs, []string{"serving", "shutting down", "stopped"}) {
		t.Errorf("log messages %q, want serving, shutting down, stopped (no line per request)\n%s", msgs, logs.String())
	}
	// Durations read as they are given: --shutdown-grace=10s.
	for _, m := range lines {
		if m["msg"] == "shutting down" && m["grace"] != "10s" {
			t.Errorf("the shutdown line logs the grace period as %#v, want \"10s\"", m["grace"])
		}
	}
}

// TestMemcstatReadsStats runs libmemcached's memcstat against the sidecar:
// it asks for the version, then parses the whole stats reply, the proxy's
// own counters included.
func TestMemcstatReadsStats(t *testing.T) {
	bin, err := exec.LookPath("memcstat")
	if err != nil {
		t.Fatalf("memcstat is not installed (libmemcached-tools; the README's test command installs it): %v", err)
	}
	s := startBusySidecar(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--servers="+s.listen).CombinedOutput()
	if err != nil {
		t.Fatalf("memcstat: %v\n%s", err, out)
	}
	for _, want := range []string{"pid:", "version: 1.6.0-mcsidecar-" + version, "cmd_set: 1", "get_hits: 1",
		"key_rewrites: 0", "codec_verification_failures_checksum_mismatch: 0", "rejected_connections: 0"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("memcstat output lacks %q:\n%s", want, out)
		}
	}
}
