package proxy

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"mcsidecar/keyspace"
)

// keysConfig is the key settings' defaults, as cmd/proxy registers them.
func keysConfig() *keyspace.Config {
	return &keyspace.Config{MaxLength: 250, MaxClientLength: 65536, Presets: []string{"all"}}
}

// keyspaceConfig is testConfig with the codec and key rewriting on, at the
// default limits.
func keyspaceConfig(upstreams ...string) Config {
	cfg := testConfig(upstreams...)
	cfg.Codec = codecConfig()
	cfg.Keys = keysConfig()
	return cfg
}

const (
	testBlock  = "01HZX3K5R9W1V8Q2N4M6P7T0AB"
	testHash43 = "n4bQgYhMfWWaL-qgxVrQFaO_TxsrC4Is0V1sFbDwCgg"
)

func testTenant(seed string, n int) string {
	s := "org-" + seed + "-"
	for len(s) < n {
		s += "team.platform_(eu-west-1)*"
	}
	return s[:n]
}

// mimirLV2Key is a 282-byte Mimir label-values key of a 150-byte tenant.
func mimirLV2Key() string {
	return "LV2:" + testTenant("acme", 150) + ":" + testBlock + ":kubernetes_io_hostname_and_some_longer_label_name_xyz123:" + testHash43
}

// crossTenant is a query-results key of about size bytes whose tenant
// segment joins many tenants with '|'.
func crossTenant(size int) string {
	var ts strings.Builder
	for i := 0; ts.Len() < size-80; i++ {
		if i > 0 {
			ts.WriteByte('|')
		}
		fmt.Fprintf(&ts, "tenant-%d", i)
	}
	return "1@QS:" + ts.String() + ":" + testHash43 + ":60000:1700000000000"
}

func TestKeysValidateNeedsCodec(t *testing.T) {
	cfg := testConfig("127.0.0.1:1")
	cfg.Keys = keysConfig()
	if err := cfg.Validate(); err == nil {
		t.Fatal("key rewriting without codec settings accepted")
	}
	cfg.Codec = codecConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.Keys.MaxLength = 300
	if err := cfg.Validate(); err == nil {
		t.Fatal("--key-max-length 300 accepted")
	}
}

func TestLongKeysRoundTripUnderTheirClientKeys(t *testing.T) {
	up := startMemcached(t)
	cfg := keyspaceConfig(up)
	cfg.Keys.MaxClientLength = 5000
	p, addr := startProxy(t, cfg)
	lc := newLineClient(t, addr)
	direct := newLineClient(t, up)
	keys := []string{mimirLV2Key(), crossTenant(4096), "memcaslap\x01key\x7f", "~short", "P2:" + testTenant("big", 230) + ":" + testBlock + ":am9iOmFwaQ"}
	for i, k := range keys {
		if len(k) > 250 || i == 0 {
			t.Logf("key %d: %d bytes", i, len(k))
		}
		v := fmt.Sprintf("value-%d", i)
		if r := lc.do(fmt.Sprintf("set %s %d 0 %d\r\n%s\r\n", k, i, len(v), v)); r != "STORED\r\n" {
			t.Fatalf("set key %d: %q", i, r)
		}
		want := fmt.Sprintf("VALUE %s %d %d\r\n%s\r\nEND\r\n", k, i, len(v), v)
		if r := lc.do("get " + k + "\r\n"); r != want {
			t.Fatalf("get key %d: %q, want %q", i, short(r), short(want))
		}
	}
	// What memcached holds: at most 250 bytes, the block ULID readable.
	ks, _ := keyspace.New(*cfg.Keys)
	lv2up, _, _ := ks.AppendRewrite(nil, []byte(keys[0]))
	if len(lv2up) > 250 || !strings.Contains(string(lv2up), testBlock) {
		t.Fatalf("upstream key %q", lv2up)
	}
	if _, _, ok := rawItem(t, direct, string(lv2up)); !ok {
		t.Fatalf("memcached holds nothing under %q", lv2up)
	}
	// The short key starting with '~' went upstream unchanged, as a
	// plain value.
	if fl, data, ok := rawItem(t, direct, "~short"); !ok || fl != 3 || data != "value-3" {
		t.Fatalf("~short upstream: %v %q %v", fl, data, ok)
	}

	// A multi-get mixing long, odd and short keys answers in request
	// order with the client's keys, repeats included.
	order := []int{4, 2, 3, 0, 1, 2}
	var req, want strings.Builder
	req.WriteString("gets")
	for _, i := range order {
		req.WriteString(" " + keys[i])
	}
	req.WriteString(" missing\r\n")
	r := lc.do(req.String())
	for _, i := range order {
		v := fmt.Sprintf("value-%d", i)
		want.WriteString(fmt.Sprintf("VALUE %s %d %d CAS\r\n%s\r\n", keys[i], i, len(v), v))
	}
	want.WriteString("END\r\n")
	if got := casValue.ReplaceAllString(r, "$1 CAS\r"); got != want.String() {
		t.Fatalf("multi-get:\n%q\nwant\n%q", short(got), short(want.String()))
	}
	if r := lc.do("gat 100 " + keys[0] + " " + keys[2] + "\r\n"); !strings.HasPrefix(r, "VALUE "+keys[0]+" 0 7\r\n") || !strings.Contains(r, "VALUE "+keys[2]+" 2 7\r\n") {
		t.Fatalf("gat: %q", short(r))
	}

	// Every other command reaches the same upstream key.
	k := keys[0]
	steps := []struct{ req, want string }{
		{"append " + k + " 0 0 1\r\n!\r\n", "STORED\r\n"},
		{"prepend " + k + " 0 0 1\r\n<\r\n", "STORED\r\n"},
		{"get " + k + "\r\n", "VALUE " + k + " 0 9\r\n<value-0!\r\nEND\r\n"},
		{"set " + k + " 5 0 2\r\n41\r\n", "STORED\r\n"},
		{"incr " + k + " 2\r\n", "43\r\n"},
		{"decr " + k + " 50\r\n", "0\r\n"},
		{"touch " + k + " 100\r\n", "TOUCHED\r\n"},
		{"add " + k + " 0 0 1\r\nx\r\n", "NOT_STORED\r\n"},
		{"replace " + k + " 7 0 1\r\ny\r\n", "STORED\r\n"},
		{"get " + k + "\r\n", "VALUE " + k + " 7 1\r\ny\r\nEND\r\n"},
		{"delete " + k + "\r\n", "DELETED\r\n"},
		{"get " + k + "\r\n", "END\r\n"},
		{"incr " + k + " 1\r\n", "NOT_FOUND\r\n"},
		{"append " + k + " 0 0 1\r\n!\r\n", "NOT_STORED\r\n"},
		{"add " + k + " 0 0 1\r\nx\r\n", "STORED\r\n"},
	}
	for _, s := range steps {
		if r := lc.do(s.req); r != s.want {
			t.Fatalf("%q: %q, want %q", short(s.req), r, s.want)
		}
	}
	// cas with a CAS from gets.
	r = lc.do("gets " + keys[1] + "\r\n")
	head, _, _ := strings.Cut(r, "\r\n")
	f := strings.Fields(head)
	if r := lc.do("cas " + keys[1] + " 0 0 2 " + f[4] + "\r\nok\r\n"); r != "STORED\r\n" {
		t.Fatalf("cas: %q", r)
	}
	if r := lc.do("cas " + keys[1] + " 0 0 2 " + f[4] + "\r\nno\r\n"); r != "EXISTS\r\n" {
		t.Fatalf("second cas: %q", r)
	}

	exp := scrape(t, p)
	for _, line := range []string{
		`mcsidecar_key_rewrites_total{scheme="results",step="tenant"}`,
		`mcsidecar_key_rewrites_total{scheme="mimir-lv2",step="tenant"}`,
		`mcsidecar_key_rewrites_total{scheme="none",step="whole"}`,
		`mcsidecar_key_rejected_total{reason="too_long"} 0`,
		`mcsidecar_key_rejected_total{reason="empty"} 0`,
		`mcsidecar_key_rewrites_total{scheme="thanos-p",step="segments"} 0`,
	} {
		if !strings.Contains(exp, line) {
			t.Errorf("metrics lack %s", line)
		}
	}
}

// scrape returns the proxy's metrics in the text format.
func scrape(t *testing.T, p *Proxy) string {
	t.Helper()
	reg := codecMetrics(t, p)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			b.WriteString(mf.GetName() + "{")
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			b.WriteString(strings.Join(labels, ",") + "} ")
			fmt.Fprintf(&b, "%g\n", m.GetCounter().GetValue()+m.GetGauge().GetValue())
		}
	}
	return b.String()
}

func TestKeyOverTheClientMaximumIsRefusedAndTheConnectionStaysUsable(t *testing.T) {
	up := startMemcached(t)
	p, addr := startProxy(t, keyspaceConfig(up))
	lc := newLineClient(t, addr)
	maxKey := keysConfig().MaxClientLength
	over := strings.Repeat("k", maxKey+1)
	atMax := strings.Repeat("m", maxKey)
	steps := []struct{ req, want string }{
		{"set " + over + " 0 0 5\r\nset x\r\n", "CLIENT_ERROR bad command line format\r\n"},
		{"append " + over + " 0 0 3\r\nabc\r\n", "CLIENT_ERROR bad command line format\r\n"},
		{"get " + over + "\r\n", "CLIENT_ERROR bad command line format\r\n"},
		{"get a " + over + "\r\n", "CLIENT_ERROR bad command line format\r\n"},
		{"incr " + over + " 1\r\n", "CLIENT_ERROR bad command line format\r\n"},
		{"touch " + over + " 1\r\n", "CLIENT_ERROR bad command line format\r\n"},
		{"delete " + over + "\r\n", "CLIENT_ERROR bad command line format\r\n"},
		{"set " + atMax + " 0 0 2\r\nok\r\n", "STORED\r\n"},
		{"get " + atMax + "\r\n", "VALUE " + atMax + " 0 2\r\nok\r\nEND\r\n"},
		{"version\r\n", "VERSION mcsidecar-test\r\n"},
	}
	for _, s := range steps {
		if r := lc.do(s.req); r != s.want {
			t.Fatalf("%q: %q, want %q", short(s.req), short(r), short(s.want))
		}
	}
	if exp := scrape(t, p); !strings.Contains(exp, `mcsidecar_key_rejected_total{reason="too_long"} 7`) {
		t.Errorf("rejections not counted:\n%s", exp)
	}
}

// TestCollidingUpstreamKeysNeverServeAnotherKeysValue cuts every hash to
// one base64 character, so many long keys share upstream keys: a client may
// miss, but never reads a value written for another key.
func TestCollidingUpstreamKeysNeverServeAnotherKeysValue(t *testing.T) {
	up := startMemcached(t)
	cfg := keyspaceConfig(up)
	cfg.Keys.TestHashChars = 1
	_, addr := startProxy(t, cfg)
	lc := newLineClient(t, addr)
	ks, err := keyspace.New(*cfg.Keys)
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	keys := make([]string, n)
	ups := map[string][]int{}
	for i := range keys {
		switch i % 3 {
		case 0:
			keys[i] = "P2:" + testTenant(fmt.Sprint("t", i), 240) + ":" + testBlock + ":am9i"
		case 1:
			keys[i] = fmt.Sprintf("app/%d/%s", i, strings.Repeat("x", 260))
		default:
			keys[i] = fmt.Sprintf("odd\x01%d", i)
		}
		u, _, _ := ks.AppendRewrite(nil, []byte(keys[i]))
		ups[string(u)] = append(ups[string(u)], i)
	}
	if len(ups) > n/2 {
		t.Fatalf("only %d of %d keys collide", n-len(ups), n)
	}
	// A client's own plain values under the upstream keys too.
	plain := slices.Sorted(maps.Keys(ups))
	for _, u := range plain {
		lc.do(fmt.Sprintf("set %s 0 0 5\r\nplain\r\n", u))
	}
	val := func(i int) string { return fmt.Sprintf("v%d", i) }
	for round := range 2 {
		for i, k := range keys {
			if r := lc.do(fmt.Sprintf("set %s %d 0 %d\r\n%s\r\n", k, i, len(val(i)), val(i))); r != "STORED\r\n" {
				t.Fatalf("set %d: %q", i, r)
			}
		}
		hits := 0
		for i, k := range keys {
			r := lc.do("get " + k + " " + plain[i%len(plain)] + "\r\n")
			mine := fmt.Sprintf("VALUE %s %d %d\r\n%s\r\n", k, i, len(val(i)), val(i))
			rest, hit := strings.CutPrefix(r, mine)
			if hit {
				hits++
			}
			// Whatever follows is the plain key's own value or nothing.
			if rest != "END\r\n" && !strings.HasPrefix(rest, "VALUE "+plain[i%len(plain)]+" ") {
				t.Fatalf("round %d key %d read %q", round, i, short(r))
			}
			if strings.Count(r, "VALUE ") > 2 || !hit && strings.HasPrefix(r, "VALUE "+k+" ") {
				t.Fatalf("round %d key %d read another key's value: %q", round, i, short(r))
			}
		}
		// Colliding keys were written one after another: the last of
		// each upstream key is a hit.
		if hits < len(ups) {
			t.Fatalf("round %d: %d hits, want at least %d", round, hits, len(ups))
		}
		// Multi-gets of colliding keys answer each from its own value.
		for _, group := range ups {
			if len(group) < 2 {
				continue
			}
			var req strings.Builder
			req.WriteString("get")
			for _, i := range group {
				req.WriteString(" " + keys[i])
			}
			r := lc.do(req.String() + "\r\n")
			for _, i := range group {
				if strings.Contains(r, "VALUE "+keys[i]+" ") && !strings.Contains(r, fmt.Sprintf("VALUE %s %d %d\r\n%s\r\n", keys[i], i, len(val(i)), val(i))) {
					t.Fatalf("multi-get served key %d a wrong value: %q", i, short(r))
				}
			}
			if strings.Count(r, "VALUE ") > 1 {
				t.Fatalf("two colliding keys both hit: %q", short(r))
			}
		}
		// incr and append on colliding keys never touch another's value.
		for i, k := range keys[:30] {
			r := lc.do("append " + k + " 0 0 1\r\n+\r\n")
			if r != "STORED\r\n" && r != "NOT_STORED\r\n" {
				t.Fatalf("append %d: %q", i, r)
			}
			r = lc.do("incr " + k + " 1\r\n")
			if r != "NOT_FOUND\r\n" && r != "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n" {
				t.Fatalf("incr %d: %q", i, r)
			}
		}
	}
}

// TestDifferentialKeyspace runs the differential cases through a proxy with
// key rewriting on, at the default limits. Keys memcached accepts and
// gomemcache can send pass unchanged, so replies are memcached's except
// where a key is over 250 bytes or holds a control byte: those the proxy
// now serves.
func TestDifferentialKeyspace(t *testing.T) {
	runDifferential(t, slices.Concat(diffCases, regressionDiffCases, codecDiffCases), 1, keyspaceConfig, keyspaceWant)
}

func TestDifferentialKeyspaceThreeServers(t *testing.T) {
	runDifferential(t, slices.Concat(diffCases, regressionDiffCases, codecDiffCases), 3, keyspaceConfig, keyspaceWant)
}

// TestMemccapableKeyspace runs libmemcached's compliance checker through
// a proxy with key rewriting on.
func TestMemccapableKeyspace(t *testing.T) { runMemccapable(t, keyspaceConfig) }

// keyspaceWant are the differential cases whose replies differ from
// memcached's on purpose with key rewriting on.
// A 251-byte key is no longer refused: it is rewritten and served like any
// other (SPEC §3).
var keyspaceWant = map[string]string{
	"get with 251-byte key":                                    "END\r\n",
	"get mixing a 251-byte key answers only the error":         "STORED\r\nVALUE a 0 1\r\nv\r\nVALUE a 0 1\r\nv\r\nEND\r\n",
	"set with 251-byte key consumes the block":                 "STORED\r\nEND\r\n",
	"gat with a 251-byte key":                                  "END\r\n",
	"delete with a 251-byte key":                               "NOT_FOUND\r\n",
	"gat with a 251-byte key still touches the keys before it": "STORED\r\nVALUE a 0 1\r\nv\r\nEND\r\nEND\r\n",
}

// TestMemcaslapThroughKeyspace runs memcaslap, whose keys hold control
// bytes, through a proxy with key rewriting on, with its verification on:
// no value may fail verification. The run is bounded in operations and
// time and stays on loopback.
func TestMemcaslapThroughKeyspace(t *testing.T) {
	bin, err := exec.LookPath("memcaslap")
	if err != nil {
		t.Fatalf("memcaslap is not installed (libmemcached-tools; the README's test command installs it): %v", err)
	}
	up := startMemcached(t)
	p, addr := startProxy(t, keyspaceConfig(up))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "-s", addr, "-t", "5s", "-c", "4", "-v", "0.1", "-x", "20000").CombinedOutput()
	if err != nil {
		t.Fatalf("memcaslap: %v\n%s", err, out)
	}
	stat := func(name string) int {
		m := regexp.MustCompile(`(?m)^` + name + `: (\d+)`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("memcaslap printed no %s:\n%s", name, out)
		}
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	if stat("cmd_get") == 0 || stat("verify_failed") != 0 || stat("verify_misses") != 0 || strings.Contains(string(out), "SERVER_ERROR") {
		t.Fatalf("memcaslap reported failures:\n%s", out)
	}
	t.Logf("memcaslap: cmd_get %d, cmd_set %d, get_misses %d", stat("cmd_get"), stat("cmd_set"), stat("get_misses"))
	if exp := scrape(t, p); strings.Contains(exp, `mcsidecar_key_rewrites_total{scheme="none",step="whole"} 0`) {
		t.Errorf("no memcaslap key was rewritten")
	}
}

// TestSharedUpstreamKeyCheckedPerKey checks a get naming two client keys
// that share one upstream key (a rewritten key, and its rewrite named as a
// key of its own): the item is checked against each client key, and one
// key's refusal does not make the other miss.
func TestSharedUpstreamKeyCheckedPerKey(t *testing.T) {
	for _, loops := range []int{1, 2} {
		t.Run(fmt.Sprintf("event-loops=%d", loops), func(t *testing.T) {
			up := startMemcached(t)
			cfg := keyspaceConfig(up)
			cfg.EventLoops = loops
			_, addr := startProxy(t, cfg)
			c, direct := newLineClient(t, addr), newLineClient(t, up)
			ks, err := keyspace.New(*keysConfig())
			if err != nil {
				t.Fatal(err)
			}
			long := mimirLV2Key()
			b, _, _ := ks.AppendRewrite(nil, []byte(long))
			upKey := string(b)
			valueOf := func(key, v string, flags int) string {
				return "VALUE " + key + " " + strconv.Itoa(flags) + " " + strconv.Itoa(len(v)) + "\r\n" + v + "\r\n"
			}
			// A plain item at the upstream key: the long key's miss, the
			// upstream key's own hit.
			rawSet(t, direct, upKey, 0, "plain")
			for _, keys := range []string{upKey + " " + long, long + " " + upKey} {
				want := valueOf(upKey, "plain", 0) + "END\r\n"
				if got := c.do("get " + keys + "\r\n"); got != want {
					t.Errorf("plain item: get %s answered %q, want %q", short(keys), short(got), short(want))
				}
			}
			// The long key's envelope at the upstream key: its hit, the
			// upstream key's miss.
			value := strings.Repeat("postings 1234567 ", 20)
			if r := c.do("set " + long + " 3 0 " + strconv.Itoa(len(value)) + "\r\n" + value + "\r\n"); r != "STORED\r\n" {
				t.Fatalf("set: %q", r)
			}
			for _, keys := range []string{upKey + " " + long, long + " " + upKey} {
				want := valueOf(long, value, 3) + "END\r\n"
				if got := c.do("get " + keys + "\r\n"); got != want {
					t.Errorf("envelope: get %s answered %q, want %q", short(keys), short(got), short(want))
				}
			}
		})
	}
}
