package keyspace

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.txt from the current mapping (only for a deliberate, documented change)")

const goldenFile = "testdata/golden.txt"

// goldenInputs are the keys whose upstream keys are pinned: for every
// built-in scheme at least one key that is rewritten, plus keys that pass
// unchanged and keys no scheme reads.
func goldenInputs() []struct{ name, key string } {
	t150 := tenantID("acme", 150)
	t230 := tenantID("big", 230)
	return []struct{ name, key string }{
		{"mimir-p2 with a 150-byte tenant passes", "P2:" + t150 + ":" + blockA + ":am9iOmFwaQ"},
		{"mimir-p2 with a 230-byte tenant", "P2:" + t230 + ":" + blockA + ":am9iOmFwaQ"},
		{"mimir-p2 with a control byte in the tenant", "P2:acme\x01:" + blockA + ":am9iOmFwaQ"},
		{"mimir-p2 with a ULID-shaped tenant", "P2:" + blockB + ":" + blockA + ":am9iOmFwaQ\x7f"},
		{"mimir-s", "S:" + t230 + ":" + blockA + ":123456789"},
		{"mimir-e2 at its 255-byte maximum", "E2:" + t150 + ":" + blockA + ":" + hash43 + ":worst-case-small-posting-lists"},
		{"mimir-e2 without strategy", "E2:" + t230 + ":" + blockA + ":" + hash43},
		{"mimir-sp2 with a by-label shard", "SP2:" + t150 + ":" + blockA + ":3_of_64_by_cluster,namespace:" + hash43},
		{"mimir-sp2 with a long by-label shard", "SP2:" + t150 + ":" + blockA + ":3_of_64_by_" + strings.Repeat("cluster,namespace,", 11) + "pod:" + hash43},
		{"mimir-ln", "LN:" + t230 + ":" + blockA + ":" + hash43},
		{"mimir-lv2 of 282 bytes", lv2Key(t150, blockA, lv2Label282)},
		{"mimir-lv2 with a 200-byte label name", lv2Key(t150, blockA, strings.Repeat("label_name_", 18)+"xx")},
		{"mimir-c", "C:" + t230 + ":" + blockA + ":1700000000000:12"},
		{"mimir-po", "PO" + t230 + ":" + blockA + ":am9iOmFwaQ"},
		{"mimir-p with a raw label", "P:" + t150 + ":" + blockA + ":pod:" + strings.Repeat("api-server-7d9c8b-", 6)},
		{"mimir-e", "E:" + t230 + ":" + blockA + ":" + hash43},
		{"mimir-ss", "SS:" + t230 + ":" + blockA + ":all:" + hash43},
		{"mimir-lv", "LV:" + t230 + ":" + blockA + ":job:" + hash43},
		{"mimir-sp", "SP:" + t230 + ":" + blockA + ":1_of_4:" + hash43},
		{"thanos-p passes", "P:" + blockA + ":" + hash43 + ":dss"},
		{"thanos-p with a control byte", "P:" + blockA + ":" + hash43[:20] + "\x1b" + hash43[20:] + ":dss"},
		{"thanos-ep with DEL", "EP:" + blockA + ":" + hash43 + "\x7f:dss"},
		{"thanos-s with a tab", "S:" + blockA + ":123\t456"},
		{"bucket subrange under a long tenant", "subrange:" + t230 + "/" + blockA + "/chunks/000001:0:16000"},
		{"bucket content of a Thanos block with a control byte", "content:" + blockA + "/meta.json\x02"},
		{"bucket iter of a tenant directory", "iter:" + tenantID("big", 240) + "/markers/"},
		{"results across tenants, 4 KiB", crossTenantKey(4096)},
		{"results across tenants without version prefix", strings.Join([]string{tenantID("a", 90), tenantID("b", 90), tenantID("c", 90)}, "|") + ":sum(rate(x[5m])):60000:1700000000000"},
		{"memcaslap key with control bytes", "\x01\x02memcaslap\x03key\x7f"},
		{"client key that starts with the marker passes", "~mine"},
		{"300-byte key no scheme reads", "app/" + strings.Repeat("session-0123456789/", 15) + "end"},
		{"short key passes", "foo"},
	}
}

// TestGoldenVectorsPinTheMapping guards the promise that every proxy
// instance and version maps a key to the same upstream key.
func TestGoldenVectorsPinTheMapping(t *testing.T) {
	k := newKeyspace(t, nil)
	if *update {
		var b strings.Builder
		b.WriteString("# name\\tstep\\tscheme\\tclient key\\tupstream key, keys as Go-quoted strings.\n")
		b.WriteString("# Default key flags. Regenerate only for a deliberate change: go test ./keyspace -run Golden -update\n")
		for _, in := range goldenInputs() {
			out, step, scheme := k.AppendRewrite(nil, []byte(in.key))
			fmt.Fprintf(&b, "%s\t%s\t%s\t%s\t%s\n", in.name, step, scheme, strconv.Quote(in.key), strconv.Quote(string(out)))
		}
		if err := os.WriteFile(goldenFile, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	seen := map[string]bool{}
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, "\t")
		if len(fields) != 5 {
			t.Fatalf("bad golden line %q", line)
		}
		key, err1 := strconv.Unquote(fields[3])
		want, err2 := strconv.Unquote(fields[4])
		if err1 != nil || err2 != nil {
			t.Fatalf("bad quoting in golden line %q", line)
		}
		out, step, scheme := k.AppendRewrite(nil, []byte(key))
		if string(out) != want || step.String() != fields[1] || scheme != fields[2] {
			t.Errorf("%s: got %q (step %s, scheme %s), want %q (step %s, scheme %s)", fields[0], out, step, scheme, want, fields[1], fields[2])
		}
		checkUpstreamKey(t, k, []byte(key), out, step)
		seen[fields[2]] = true
		n++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n != len(goldenInputs()) {
		t.Errorf("golden file has %d vectors, goldenInputs %d: regenerate deliberately", n, len(goldenInputs()))
	}
	for _, name := range Presets() {
		if !seen[name] {
			t.Errorf("no golden vector rewrites a key of scheme %s", name)
		}
	}
}
